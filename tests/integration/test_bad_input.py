"""Bad input gives typed errors that say what to change, or a plan that is still correct."""
from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass import errors
from tests import helpers
from zoo import default_optimizer, init_state, mlp


def _sum_sq(x):
    return jnp.sum(x * x)


def test_mesh_larger_than_device_count():
    step = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(3, 4))))
    with pytest.raises(errors.MeshError, match=r"\(3, 4\)"):
        step.get_executable(np.ones((12, 4), np.float32))


def test_mesh_shape_differs_from_given_devices():
    mesh = ap.LogicalMesh(shape=(2, 2), devices=tuple(jax.devices()[:3]))
    step = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=mesh))
    with pytest.raises(errors.MeshError, match="3 devices"):
        step.get_executable(np.ones((4, 4), np.float32))


def test_mesh_cost_per_axis_must_match_rank():
    with pytest.raises(errors.MeshError, match="beta"):
        ap.LogicalMesh(shape=(2, 4), beta=(1.0,))
    assert issubclass(errors.MeshError, ap.AlpaPassError)


def test_indivisible_batch_is_not_split_on_that_axis():
    # Batch 6 on a 4-device axis: the planner must not split the batch dim by it (a clear
    # ShardingError would also be acceptable, but then this test must be changed on purpose).
    config = mlp.Config(num_layers=2, hidden=32, batch=6)
    optimizer = default_optimizer()
    state = init_state(mlp.init(jax.random.key(0), config), optimizer)
    batch = mlp.make_batch(jax.random.key(1), config)
    step_fn = mlp.make_train_step(optimizer)
    mesh = ap.LogicalMesh(shape=(1, 4), devices=jax.devices()[:4])
    step = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=mesh))
    exe = step.get_executable(state, batch)
    specs = helpers.specs_by_path((state, batch), exe.plan.input_specs)
    for key in ("[1]['x']", "[1]['y']"):
        assert helpers.dim_axes(specs[key], 0, mesh) == (), f"batch dim of {key} split: {specs[key]}"
    leaves = jax.tree.leaves((state, batch))
    for leaf, spec in zip(leaves, exe.plan.input_specs):
        for dim, axes in helpers.split_dims(spec, leaf.ndim, mesh).items():
            assert leaf.shape[dim] % (4 ** len(axes)) == 0, f"{leaf.shape} split by {spec}"
    (_, loss) = step(state, batch)
    _, (want,) = helpers.reference_run(step_fn, state, [batch])
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-5, atol=1e-6)


def test_untraceable_function_raises_trace_error_naming_it():
    def branchy_step(x):
        if jnp.sum(x) > 0:  # Python control flow on a traced value
            return x
        return -x

    step = ap.parallelize(branchy_step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 8))))
    with pytest.raises(errors.TraceError, match="branchy_step"):
        step.get_executable(np.ones((8, 8), np.float32))


def _while_step(w, x):
    """A while_loop on the (undifferentiated) input, then a differentiable loss in ``w``."""
    _, x = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.sin(c[1])), (0, x))
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def _callback_step(w, x):
    """A host callback on the (undifferentiated) input, then a differentiable loss in ``w``."""
    x = jax.pure_callback(lambda a: np.asarray(a) * 2.0, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return jnp.mean(jnp.tanh(x @ w) ** 2)


def _approx_top_k_step(w, x):
    """A custom call without a sharding rule (ApproxTopK of the undifferentiated input; LAPACK's
    calls carry one), then a differentiable loss in ``w``."""
    top = jax.lax.approx_max_k(x, 4)[0]
    return jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.mean(top)


def _grad_step(fn):
    """(w, x, value_and_grad(fn), its ShardParallel on 2x4) for a loss ``fn(w, x)``."""
    w = jax.random.normal(jax.random.key(0), (32, 32), jnp.float32) / 6.0
    x = jax.random.normal(jax.random.key(1), (16, 32), jnp.float32)
    grad_fn = jax.value_and_grad(fn)
    return w, x, grad_fn, ap.parallelize(grad_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4))))


def _assert_matches_jit(step, grad_fn, w, x):
    loss, grad = step(w, x)
    want_loss, want_grad = jax.jit(grad_fn)(w, x)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5, atol=1e-6)


def test_while_loop_is_planned_not_a_fallback():
    """A while_loop's ops are planned like top-level ops (no OPAQUE fallback), numerics equal."""
    w, x, grad_fn, step = _grad_step(_while_step)
    assert step.get_executable(w, x).plan.fallbacks == {}
    _assert_matches_jit(step, grad_fn, w, x)


def test_host_callbacks_are_planned_replicated_without_a_fallback(caplog):
    """``pure_callback`` (and jax.debug.print / callback) run on the host where jax puts them: no
    "no sharding rule" warning, no fallback, same numbers."""
    w, x, grad_fn, step = _grad_step(_callback_step)
    with caplog.at_level(logging.WARNING, logger="alpa_pass"):
        exe = step.get_executable(w, x)
    assert exe.plan.fallbacks == {} and not [r for r in caplog.records if r.name.startswith("alpa_pass")]
    _assert_matches_jit(step, grad_fn, w, x)


def test_ordered_effects_are_a_trace_error():
    """jax runs ordered effects on one device only; the error says to make them unordered."""
    def step(w, x):
        loss = jnp.mean(jnp.tanh(x @ w) ** 2)
        jax.debug.print("loss {}", loss, ordered=True)
        return loss

    f = ap.parallelize(step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4))))
    with pytest.raises(errors.TraceError, match=r"ordered side effects .*ordered=False"):
        f.get_executable(jnp.ones((32, 32)), jnp.ones((16, 32)))


@pytest.mark.parametrize("fn", [_approx_top_k_step], ids=["approx_top_k"])
def test_unknown_op_falls_back_once_and_stays_correct(fn, caplog):
    w, x, grad_fn, step = _grad_step(fn)
    with caplog.at_level(logging.WARNING, logger="alpa_pass"):
        exe = step.get_executable(w, x)
    assert exe.plan.fallbacks, "an op the core does not know must be reported in plan.fallbacks"
    assert all(op.startswith("stablehlo.custom_call @") for op in exe.plan.fallbacks), exe.plan.fallbacks  # named
    logged = [r for r in caplog.records if r.name.startswith("alpa_pass")]
    for op in exe.plan.fallbacks:
        mentions = [r for r in logged if op in r.getMessage()]
        assert len(mentions) == 1, f"fallback for {op} logged {len(mentions)} times: {[r.getMessage() for r in logged]}"
    _assert_matches_jit(step, grad_fn, w, x)


# --- arguments, meshes and options given wrongly: typed errors that say what to change ----------

def _scale(x, n):
    return x * n


def test_negative_static_argnums_count_from_the_end_like_jit():
    x = jnp.arange(32.0).reshape(8, 4)
    got = ap.parallelize(_scale, static_argnums=(-1,))(x, 3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(_scale, static_argnums=(-1,))(x, 3)))
    with pytest.raises(errors.ArgumentError, match=r"static_argnums=\(2,\).*2 positional parameters"):
        ap.parallelize(_scale, static_argnums=(2,))
    with pytest.raises(errors.ArgumentError, match="both donated and static"):
        ap.parallelize(_scale, static_argnums=(1,), donate_argnums=(-1,))


def test_unhashable_static_argument_is_an_argument_error():
    step = ap.parallelize(_scale, static_argnums=(1,))
    with pytest.raises(errors.ArgumentError, match=r"static argument 1 of _scale \(ndarray\) is not hashable"):
        step(jnp.ones((8, 4)), np.ones(2))


def test_mesh_shape_given_as_an_int_is_one_axis():
    mesh = ap.LogicalMesh(shape=8)
    assert mesh.shape == (8,) and mesh.axis_names == ("x",)
    step = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=mesh))
    np.testing.assert_allclose(float(step(jnp.ones((8, 4)))), 32.0)
    with pytest.raises(errors.MeshError, match="positive int or a non-empty tuple"):
        ap.LogicalMesh(shape="2x4")


def test_a_device_twice_in_the_mesh_is_a_mesh_error():
    with pytest.raises(errors.MeshError, match="more than once"):
        ap.LogicalMesh(shape=(2, 2), devices=[jax.devices()[0]] * 2 + list(jax.devices()[1:3]))


def test_mesh_over_fewer_devices_than_the_machine_needs_devices():
    step = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 3))))
    with pytest.raises(errors.MeshError, match=r"6 positions but there are 8 devices.*devices=jax.devices\(\)\[:6\]"):
        step.get_executable(np.ones((6, 6), np.float32))
    mesh = ap.LogicalMesh(shape=(2, 3), devices=jax.devices()[:6])
    step = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=mesh))
    np.testing.assert_allclose(float(step(np.ones((6, 6), np.float32))), 36.0)


def test_memory_budget_as_a_size_string():
    assert ap.AutoShardingOption(memory_budget_per_device="1GiB").memory_budget_per_device == 2**30
    assert ap.AutoShardingOption(memory_budget_per_device="512MB").memory_budget_per_device == 512 * 10**6
    with pytest.raises(errors.OptionError, match=r"memory_budget_per_device='lots' is not a size.*16GiB"):
        ap.AutoShardingOption(memory_budget_per_device="lots")
    with pytest.raises(errors.OptionError, match="memory_budget_per_device"):
        ap.AutoShardingOption(memory_budget_per_device=[1])


# --- saved plans and cache entries that are not what they claim -----------------------------------

X68 = np.ones((6, 8), np.float32)
MESH24 = ap.LogicalMesh(shape=(2, 4))


def _saved(tmp_path, edit):
    """The plan of _sum_sq(X68) on MESH24 saved to a file after ``edit(dict)``."""
    plan = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=MESH24)).plan(X68)
    d = json.loads(plan.to_json())
    edit(d)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    return path


def test_binary_plan_file_is_a_plan_mismatch(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(errors.PlanMismatchError, match="not an alpa_pass plan"):
        ap.ShardParallel(mesh=MESH24, plan=path)


@pytest.mark.parametrize("made_with", ["jax 0.10", ["0.10.2"], {"jax": 10, "alpa_pass": "0.1.0"}])
def test_plan_whose_made_with_has_the_wrong_type_is_a_plan_mismatch(tmp_path, made_with):
    path = _saved(tmp_path, lambda d: d.update(made_with=made_with))
    with pytest.raises(errors.PlanMismatchError, match="corrupt: made_with"):
        ap.ShardParallel(mesh=MESH24, plan=path)


def test_saved_plan_whose_input_spec_does_not_divide_is_a_plan_mismatch(tmp_path):
    path = _saved(tmp_path, lambda d: d.update(input_specs=[[["x", "y"], None]]))
    step = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=MESH24, plan=path))
    with pytest.raises(errors.PlanMismatchError, match=r"argument leaf 0 \(6, 8\): dim 0 split over \('x', 'y'\)"):
        step.get_executable(X68)


def test_cache_entry_edited_to_non_dividing_specs_is_planned_again(tmp_path, caplog):
    option = ap.AutoShardingOption(plan_cache_dir=tmp_path)
    first = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=MESH24, option=option)).plan(X68)
    (entry,) = tmp_path.glob("*.json")
    d = json.loads(entry.read_text())
    d["node_specs"] = [[0, 0] if len(c) == 2 else s for c, s in zip(d["choices"]["shape"], d["node_specs"])]
    entry.write_text(json.dumps(d))
    with caplog.at_level(logging.WARNING, logger="alpa_pass"):
        again = ap.parallelize(_sum_sq, method=ap.ShardParallel(mesh=MESH24, option=option)).plan(X68)
    assert again.origin == "solver" and again.node_specs == first.node_specs
    assert any("ignoring plan cache entry" in r.getMessage() and "does not divide" in r.getMessage()
               for r in caplog.records)
