"""A script written for Alpa runs with ``import alpa_pass as alpa``: the calls of Alpa's quickstart
(``alpa.init``, bare ``@alpa.parallelize``, ``alpa.testing.assert_allclose``,
``preshard_dynamic_args``, ``alpa.util.benchmark_func``, ``get_total_allocation_size``)."""
from __future__ import annotations

import dataclasses
import functools

import logging
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

import alpa_pass as alpa
from tests import helpers


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(4):
            x = nn.relu(nn.Dense(256 if i % 2 == 0 else 64)(x))
        return x


def train_step(state, batch):
    def loss_func(params):
        return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss_func)(state.params))


@pytest.fixture(scope="module")
def setup():
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (64, 64))
    batch = {"x": x, "y": x @ jax.random.normal(k2, (64, 64)) / 8}
    model = MLP()
    state = TrainState.create(apply_fn=model.apply, params=model.init(k1, x), tx=optax.adam(1e-3))
    return state, batch


def test_alpa_quickstart_calls(setup, caplog):
    state, batch = setup
    with caplog.at_level(logging.INFO, logger="alpa_pass"):
        assert alpa.init(cluster="ray") is None
    assert "without Ray" in caplog.text
    expected = jax.jit(train_step)(state, batch)
    step = alpa.parallelize(train_step)
    actual = step(state, batch)
    # (adam scales each update to ~lr: a gradient summed in another order moves it by ~1e-6)
    alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)
    assert any(len(leaf.sharding.device_set) == 8 for leaf in jax.tree.leaves(actual.params))
    # the leaves placed where the step reads them; calling with them moves nothing
    exe = step.get_executable(state, batch)
    placed = step.preshard_dynamic_args(state, batch)
    assert jax.tree.structure(placed) == jax.tree.structure((state, batch))
    for leaf, sharding in zip(jax.tree.leaves(placed), exe.input_shardings):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    assert all(a is b for a, b in zip(jax.tree.leaves(step.preshard_dynamic_args(*placed)), jax.tree.leaves(placed)))
    alpa.testing.assert_allclose(step(*placed).params, actual.params, rtol=0, atol=0)
    m = exe.memory_analysis()
    assert exe.get_total_allocation_size() == (m.argument_size_in_bytes + m.output_size_in_bytes
                                               + m.temp_size_in_bytes - m.alias_size_in_bytes) > 0
    assert exe.get_hlo_text() == exe.hlo_text()
    assert alpa.shutdown() is None


def test_assert_allclose_names_the_leaf_and_checks_structure():
    alpa.testing.assert_allclose({"a": [1.0, np.ones(3)]}, {"a": [1.0 + 1e-6, np.ones(3)]})
    with pytest.raises(AssertionError, match=r"\['a'\]\[1\]"):
        alpa.testing.assert_allclose({"a": [1.0, np.ones(3)]}, {"a": [1.0, np.ones(3) * 1.1]})
    with pytest.raises(AssertionError, match="pytrees differ"):
        alpa.testing.assert_allclose({"a": 1.0}, {"b": 1.0})


def test_benchmark_func_calls_and_returns_per_call_times():
    calls, syncs = [], []
    costs = alpa.util.benchmark_func(lambda: calls.append(1), lambda: syncs.append(1),
                                     warmup=2, repeat=3, number=4)
    assert len(calls) == 2 + 3 * 4 and len(syncs) == 1 + 3
    assert costs.shape == (3,) and (costs >= 0).all()
    with pytest.raises(ValueError, match="repeat >= 1"):
        alpa.util.benchmark_func(lambda: None, repeat=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"cluster": "slurm"}, "cluster is one of"),
    ({"num_nodes": 2}, "mpirun -np 2 python -m alpa_pass.launch"),
    ({"num_devices_per_node": 3}, r"devices=jax.devices\(\)\[:3\]"),
])
def test_init_says_how_to_get_what_the_script_asks_for(kwargs, match):
    with pytest.raises(alpa.OptionError, match=match):
        alpa.init(**kwargs)
    alpa.init(cluster="local", num_nodes=1, num_devices_per_node=8)  # what this run has


def _alpa_mlp_step(method, num_layers, batch_size, hidden):
    """Alpa's test_mlp.py flow: a flax MLP in a TrainState, a step that returns only the new state,
    ``train_step.get_last_executable()``; returns (new state, jit's new state, executable)."""
    train_step, state, batch = _alpa_mlp(num_layers, batch_size, hidden)
    step = alpa.parallelize(train_step, method=method)
    actual = step(state, batch)
    return actual, jax.jit(train_step)(state, batch), step.get_last_executable()


def _alpa_mlp(num_layers, batch_size, hidden):
    """(train_step, state, batch) of Alpa's test_mlp.py MLP."""
    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(num_layers - 1):
                x = nn.relu(nn.Dense(hidden)(x))
            return nn.Dense(hidden)(x)

    def train_step(state, batch):
        def loss_func(params):
            return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)
        return state.apply_gradients(grads=jax.grad(loss_func)(state.params))

    k1, k2 = jax.random.split(jax.random.key(3))
    batch = {"x": jax.random.normal(k1, (batch_size, hidden)), "y": jax.random.normal(k2, (batch_size, hidden))}
    model = Model()
    # (Alpa's test uses Adam; its update m / sqrt(v) turns a gradient's last-bit rounding into up
    # to 2% of the learning rate where the gradient is tiny: SGD with momentum keeps the
    # comparison with jit at 1e-5)
    tx = optax.sgd(0.1, momentum=0.9)
    state = TrainState.create(apply_fn=model.apply, params=model.init(k1, batch["x"]), tx=tx)
    return train_step, state, batch


def _spec(leaf) -> tuple:
    spec = tuple(leaf.sharding.spec)
    return spec + (None,) * (leaf.ndim - len(spec))


def _four_device_mesh(shape, beta):
    return alpa.LocalPhysicalDeviceMesh(jax.local_devices()[:4]).get_logical_mesh(shape, [1, 1], beta)


def test_alpa_2d_mlp_without_gathers_compiles_to_alpas_six_all_reduces():
    # Alpa's test_n_layer_mlp_2d_mesh, with its option names: all-gathers and all-to-alls priced
    # out (Alpa's INFINITY_COST), the plan is Alpa's: batch on x, Megatron on y; 5 activation
    # all-reduces on y and one combined gradient all-reduce on x, nothing else.
    L, B, H = 6, 256, 32
    option = alpa.AutoShardingOption(allow_all_gather=False, allow_all_to_all=False)
    method = alpa.ShardParallel(devices=_four_device_mesh([2, 2], [1, 0.1]), auto_sharding_option=option)
    assert method.as_option is method.option is option and method.devices is method.mesh
    actual, expected, exe = _alpa_mlp_step(method, L, B, H)
    assert alpa.util.count_communication_primitives(exe.get_hlo_text()) == (L, L, 0, 0, 0)
    alpa_objective = L * ((1 + H * H * 4 / 2) + (1 + H * 4)) + (L - 1) * (1 + 0.1 * B * H * 4 / 2)
    # Below Alpa's figure: the column-parallel layers keep their biases split on y like their
    # kernels' columns (Alpa replicates them), so their gradients all-reduce 64 B, not 128 B, over
    # x; and the gradient all-reduces pay a share of alpha (XLA combines them into one).
    ours = alpa_objective - (L // 2) * H * 4 / 2
    assert ours - 2 * L <= helpers.communication(exe.plan) <= ours
    for k in range(L):
        layer = actual.params["params"][f"Dense_{k}"]
        assert _spec(layer["kernel"]) == ((None, "y") if k % 2 == 0 else ("y", None))
        assert _spec(layer["bias"]) == (("y",) if k % 2 == 0 else (None,))
    alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)


def test_alpa_force_data_parallel_on_a_2d_mesh_is_one_gradient_all_reduce():
    # Alpa's test_n_layer_mlp_force_data_parallel on 2x2: batch 32, hidden 256. Unforced, the
    # planner gathers the small activations rather than reduce the large weight gradients; forced,
    # the plan is data parallelism over all 4 devices: one combined all-reduce of every gradient.
    L, B, H = 6, 32, 256
    option = alpa.AutoShardingOption(force_data_parallel=True)
    actual, expected, exe = _alpa_mlp_step(alpa.ShardParallel(devices=_four_device_mesh([2, 2], [1, 1]),
                                                              auto_sharding_option=option), L, B, H)
    assert alpa.util.count_communication_primitives(exe.get_hlo_text()) == (1, 1, 0, 0, 0)
    grad_bytes = L * (H * H + H) * 4
    assert helpers.communication(exe.plan) == pytest.approx(1 + 2 * 3 / 4 * grad_bytes, rel=1e-5)
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(actual.params))
    alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)


def test_alpa_force_batch_dim_on_a_size_one_axis_leaves_model_parallelism():
    # Alpa's test_n_layer_mlp_force_batch_dim_mapping, model-parallel half: on 1x4 the batch is
    # "split" over the size-1 axis 0, so the plan is Megatron's: 5 activation all-reduces.
    L, B, H = 6, 32, 256
    option = alpa.AutoShardingOption(force_batch_dim_to_mesh_dim=0)
    actual, expected, exe = _alpa_mlp_step(alpa.ShardParallel(devices=_four_device_mesh([1, 4], [1, 1]),
                                                              auto_sharding_option=option), L, B, H)
    assert helpers.communication(exe.plan) == pytest.approx((L - 1) * (1 + 1.5 * B * H * 4), rel=1e-5)
    assert alpa.util.count_communication_primitives(exe.get_hlo_text()) == (L - 1, L - 1, 0, 0, 0)
    alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)


def test_force_batch_dim_pins_the_batch_on_that_axis():
    # batch 256 on 2x2 with the batch forced onto the fast axis y: the step reads x and y split
    # on dim 0 over y only (the planner alone puts the batch on x: test above)
    option = alpa.AutoShardingOption(force_batch_dim_to_mesh_dim=1, allow_mixed_mesh_shape=False)
    actual, expected, exe = _alpa_mlp_step(alpa.ShardParallel(devices=_four_device_mesh([2, 2], [1, 0.1]),
                                                              auto_sharding_option=option), 4, 256, 32)
    for sharding in exe.input_shardings[-2:]:  # batch["x"], batch["y"]
        assert tuple(sharding.spec)[:1] == ("y",) and set(tuple(sharding.spec)[1:]) <= {None}
    alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)
    with pytest.raises(alpa.OptionError, match="has axes 0..1"):
        _alpa_mlp_step(alpa.ShardParallel(devices=_four_device_mesh([2, 2], [1, 1]),
                                          auto_sharding_option=alpa.AutoShardingOption(force_batch_dim_to_mesh_dim=2)),
                       2, 8, 8)


def test_force_batch_dim_splits_every_dots_batch_dim_on_that_axis():
    """As Alpa restricts its dots' and convolutions' strategies: on 2x2 with the batch forced onto
    x, every dot whose result has a batch dim (followed from the batch's dim 0) splits it over x,
    y left to the planner; the weight-gradient dots (batch contracted) are free. Unforced, the
    planner puts no dot's batch on x alone."""
    from alpa_pass.driver.jit import make_plan
    from alpa_pass.extract.batch_dims import batch_dims
    from alpa_pass.extract.graph import OpKind

    train_step, state, batch = _alpa_mlp(4, 32, 64)
    mesh = _four_device_mesh([2, 2], [1, 1])
    for forced in (None, 0):
        method = alpa.ShardParallel(devices=mesh, auto_sharding_option=alpa.AutoShardingOption(
            force_batch_dim_to_mesh_dim=forced))
        plan, graph, _ = make_plan(train_step, (state, batch), mesh, method.planning_option(),
                                   pin_policy=method.pin_policy(mesh))
        seeds = {graph.param_nodes()[i]: 0 for i in range(len(jax.tree.leaves(state)), graph.num_args)}
        dims = batch_dims(graph, seeds)
        dots = [v for v in range(graph.num_nodes) if graph.kind[v] == OpKind.DOT]
        batched = [v for v in dots if v in dims]
        assert len(batched) == 4 + 3 and len(dots) == 4 + 3 + 4  # forward, input-gradient, weight-gradient
        on_x = [plan.node_specs[v][0] == dims[v] for v in batched]
        assert all(on_x) if forced == 0 else not all(on_x)
    actual, expected, _ = _alpa_mlp_step(method, 4, 32, 64)  # (the forced plan)
    alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)


def test_alpa_cluster_calls_and_keyword_names():
    pm = alpa.get_global_physical_mesh(create_if_not_exist=True)
    assert (pm.num_hosts, pm.num_devices_per_host, pm.num_devices) == (1, 8, 8) and pm.shape == (1, 8)
    assert alpa.get_global_cluster().get_virtual_physical_mesh().devices == tuple(jax.devices())
    logical = pm.get_logical_mesh([2, 4], [1, 1], [1, 0.1])
    assert (logical.shape, logical.beta, logical.devices) == ((2, 4), (1.0, 0.1), tuple(jax.devices()))
    assert pm.get_logical_mesh().shape == (1, 8)
    assert alpa.ShardParallel(devices=pm).mesh == alpa.LogicalMesh((1, 8), devices=tuple(jax.devices()))
    assert alpa.ShardParallel(devices=jax.devices()[:2]).mesh.shape == (1, 2)
    dp = alpa.DataParallel(devices=logical, num_micro_batches=2)
    assert dp.mesh is logical and dp.num_micro_batches == 2
    option = alpa.AutoShardingOption(prefer_reduce_scatter=True)
    pipe = alpa.PipeshardParallel(devices=logical, default_auto_sharding_option=option, num_micro_batches=2)
    assert pipe.mesh is logical and pipe.option is option and pipe.as_option is option
    assert pipe.devices is logical and pipe.default_auto_sharding_option is option
    # Alpa's names are not fields: replace() changes ours without a "both names" error
    plain = alpa.AutoShardingOption()
    assert dataclasses.replace(pipe, option=plain).option is plain
    assert dataclasses.replace(dp, mesh=None).mesh is None
    zero2 = dataclasses.replace(alpa.Zero2Parallel(auto_sharding_option=option), batch_argnums=(2,))
    assert zero2.option is option and zero2.batch_argnums == (2,)
    assert alpa.AutoShardingOption(allow_recompute_heavy_op=True).allow_replicated_heavy_ops
    with pytest.raises(TypeError, match="not both"):
        alpa.ShardParallel(mesh=alpa.LogicalMesh((2, 4)), devices=logical)
    with pytest.raises(TypeError, match="devices=...\\) takes"):
        alpa.ShardParallel(devices="gpu")
    with pytest.raises(alpa.OptionError, match="not supported for pipeline stages"):
        alpa.PipeshardParallel(default_auto_sharding_option=alpa.AutoShardingOption(force_batch_dim_to_mesh_dim=0))
    with pytest.raises(alpa.OptionError, match="Zero3Parallel"):
        alpa.AutoShardingOption(allow_replicated_parameters=False)
    with pytest.raises(alpa.OptionError, match="jax.checkpoint"):
        alpa.AutoLayerOption(layer_num=2, remat_layer=True)
    with pytest.warns(UserWarning, match="all_reduce_threshold is not used"):
        alpa.AutoShardingOption(all_reduce_threshold=1 << 20)
    with pytest.raises(RuntimeError, match="not been called"):
        alpa.parallelize(lambda x: x).get_last_executable()


def test_alpa_zero2_mlp_scatters_gradients_in_the_optimizer_states_layout():
    # Alpa's test_n_layer_mlp_data_parallel_reduce_scatter (Zero2Parallel, batch 256, hidden 32,
    # 4x1). flax's kernel gradient is a dot giving [out, in], transposed to the kernel's [in, out];
    # the optimizer state is split on dim 0 (in). Each gradient is reduce-scattered on the dim its
    # consumer splits (emit.partial_sums._wanted_dim); scattered on the dot's own largest dim
    # (out), XLA all-to-all'ed every square kernel's gradient into the state's layout (4 of them).
    L, B, H = 6, 256, 32
    actual, expected, exe = _alpa_mlp_step(alpa.Zero2Parallel(devices=_four_device_mesh([4, 1], [1, 1])), L, B, H)
    total, ar, ag, rs, a2a = alpa.util.count_communication_primitives(exe.get_hlo_text(), ignore_scalar_all_reduce=True)
    assert (ar, rs, a2a) == (0, 2 * L, 0), (total, ar, ag, rs, a2a)  # one reduce-scatter per parameter
    assert all(_spec(leaf)[0] == "x" for leaf in jax.tree.leaves(actual.opt_state) if leaf.ndim)
    alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)


def test_alpa_2d_mlp_with_the_measured_profile_compiles_to_all_reduces_only():
    # The same MLP planned with this repository's measured profile of an 8-CPU-device host (2x4):
    # a collective's measured latency dwarfs 128 B, so the bias gradients' split reduction and
    # gather that unit costs price below Alpa's all-reduce (3 extra all-gathers with Alpa's
    # option names, allow_mixed_mesh_shape=False) are priced out: Alpa's 6 all-reduces only.
    L, B, H = 6, 256, 32
    profile = str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks/report/profile_cpu-cpu-8dev-2x4.json")
    mesh = alpa.get_global_physical_mesh().get_logical_mesh([2, 4])
    counts = {}
    for name, option in (("unit", alpa.AutoShardingOption(allow_mixed_mesh_shape=False)),
                         ("measured", alpa.AutoShardingOption(allow_mixed_mesh_shape=False, profile=profile))):
        actual, expected, exe = _alpa_mlp_step(alpa.ShardParallel(devices=mesh, auto_sharding_option=option), L, B, H)
        counts[name] = alpa.util.count_communication_primitives(exe.get_hlo_text())
        alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)
    assert counts == {"unit": (L + 3, L, 3, 0, 0), "measured": (L, L, 0, 0, 0)}, counts


def _clm_train_step(state, batch):
    """Alpa's examples/gpt2/run_clm_flax.py step, its loss a regression: dynamic loss scaling and
    a skipped update where the gradients are not finite."""
    def loss_fn(params):
        return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

    dynamic_scale = state.dynamic_scale
    if dynamic_scale:
        dynamic_scale, is_fin, loss, grads = dynamic_scale.value_and_grad(loss_fn)(state.params)
    else:
        loss, grads = alpa.value_and_grad(loss_fn)(state.params)
    new_state = state.apply_gradients(grads=grads)
    if dynamic_scale:
        keep = functools.partial(jnp.where, is_fin)
        new_state = new_state.replace(opt_state=jax.tree.map(keep, new_state.opt_state, state.opt_state),
                                      params=jax.tree.map(keep, new_state.params, state.params),
                                      dynamic_scale=dynamic_scale)
    return new_state, {"loss": loss}


def test_alpa_example_training_loop_helpers(setup):
    """What Alpa's training examples (gpt2 run_clm_flax, imagenet, ViT) call around the step:
    ``alpa.model.model_util.TrainState`` / ``DynamicScale``, ``get_global_num_devices``,
    ``alpa.util.get_metrics``, ``prefetch`` + ``util.map_to_nparray``, ``global_config``."""
    from alpa_pass.model.model_util import DynamicScale, TrainState as AlpaTrainState

    flax_state, batch = setup
    assert alpa.get_global_num_devices() == jax.device_count() == 8
    state = AlpaTrainState.create(apply_fn=flax_state.apply_fn, params=flax_state.params, tx=optax.adam(1e-3),
                                  dynamic_scale=DynamicScale(growth_interval=2, scale=2.0 ** 10))
    assert alpa.model.model_util.TrainState is AlpaTrainState
    step, plain = alpa.parallelize(_clm_train_step), jax.jit(_clm_train_step)
    metrics, s, ref = [], state, state
    for _ in range(3):
        s, m = step(s, batch)
        ref, m_ref = plain(ref, batch)
        metrics.append(m)
        assert float(m["loss"]) == pytest.approx(float(m_ref["loss"]), rel=1e-5)
    # the scale grew after 2 finite steps (powers of two: the scaled gradients are exact)
    assert float(s.dynamic_scale.scale) == float(ref.dynamic_scale.scale) == 2.0 ** 11
    assert int(s.step) == 3 and any(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(s.params))
    stacked = alpa.util.get_metrics(metrics)
    assert isinstance(stacked["loss"], np.ndarray) and stacked["loss"].shape == (3,)
    alpa.prefetch(s.params)
    host = alpa.util.map_to_nparray(s.params)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(host))
    alpa.testing.assert_allclose(host, jax.device_get(ref.params), rtol=1e-5, atol=1e-5)
    # mixed precision: float16 parameters, the optimizer on a float32 master copy
    mixed = AlpaTrainState.create(apply_fn=flax_state.apply_fn, params=flax_state.params, tx=optax.adam(1e-3),
                                  use_master_copy=True)
    assert {x.dtype for x in jax.tree.leaves(mixed.params)} == {jnp.dtype(jnp.float16)}
    after = mixed.apply_gradients(grads=jax.tree.map(jnp.ones_like, mixed.master_copy))
    assert {x.dtype for x in jax.tree.leaves(after.master_copy)} == {jnp.dtype(jnp.float32)}
    np.testing.assert_allclose(jax.tree.leaves(after.params)[0], jax.tree.leaves(after.master_copy)[0], rtol=1e-3)
    # Alpa's settings are accepted and read back; a name Alpa did not have is an AttributeError
    alpa.global_config.flax_always_use_fp16_embedding = True
    assert alpa.global_config.flax_always_use_fp16_embedding is True
    alpa.global_config.flax_always_use_fp16_embedding = False
    with pytest.raises(AttributeError, match="no setting 'use_tpu'"):
        alpa.global_config.use_tpu = True
    with pytest.raises(alpa.OptionError, match="manually_specified_submeshes"):
        alpa.global_config.overwrite_submesh_choices = [(1, 4)]
    with pytest.raises(ValueError, match="drop axis_name"):
        DynamicScale().value_and_grad(lambda p: p, axis_name="batch")
