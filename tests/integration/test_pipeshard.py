"""PipeshardParallel training steps equal plain ``jax.jit`` on one device (f32, 3 Adam steps).

Models: the 4-layer MLP and 4-layer GPT of zoo (zoo.pipeline) with ``mark_pipeline_boundary()`` after
each layer (or automatic layers); stages uniform, manual or auto; schedules 1F1B and GPipe.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import alpa_pass as ap
from tests.helpers import assert_same_run, reference_run, run_steps
from zoo import default_optimizer, gpt, mlp, setup as model_setup
from zoo.pipeline import make_gpt_loss, make_heavy_layer_loss, make_mlp_loss, make_step, mlp_loss

STEPS = 3


def setup(name, boundaries=True, optimizer=None):
    """``(pipelined train step, state, batches)`` of the 4-layer MLP or GPT (``name``)."""
    optimizer = default_optimizer() if optimizer is None else optimizer
    if name == "mlp":
        config = mlp.Config(num_layers=4, hidden=32, batch=16)
        loss_fn, model = make_mlp_loss(boundaries), mlp
    else:
        config = gpt.Config(layers=4, hidden=32, heads=4, batch=8, seq=8)
        loss_fn, model = make_gpt_loss(config, boundaries), gpt
    _, state, batches = model_setup(model, config, STEPS, optimizer)
    return make_step(loss_fn, optimizer), state, batches


def assert_on_owner_stages(exe, state):
    """Every parameter and its Adam mu/nu live on the submesh of the stage that owns it (a tied
    embedding: its first user); the apply runs one executable per stage, on that stage's devices."""
    params, (adam, *_) = state
    for k, leaves in enumerate(zip(*(jax.tree.leaves(t) for t in (params, adam.mu, adam.nu)))):
        devices = set(exe.plan.stages[exe.program.layout.owner[k]].devices)
        assert all({d.id for d in x.sharding.device_set} == devices for x in leaves), f"parameter leaf {k}"
    assert [a.site for a in exe.plan.apply] == list(range(exe.plan.num_stages))
    assert [a.devices for a in exe.plan.apply] == [s.devices for s in exe.plan.stages]


CASES = [
    pytest.param("mlp", 2, "1f1b", 4, id="mlp-2stages-1f1b"),
    pytest.param("mlp", 4, "gpipe", 2, id="mlp-4stages-gpipe"),
    pytest.param("gpt", 4, "1f1b", 4, id="gpt-4stages-1f1b", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def uniform_steps():
    """(model, stages, schedule, micro) -> (parallelized step, its step_fn, state, batches), shared
    by the tests of this module so each configuration compiles once."""
    cache = {}

    def get(model, num_stages, schedule, micro):
        key = (model, num_stages, schedule, micro)
        if key not in cache:
            step_fn, state, batches = setup(model)
            method = ap.PipeshardParallel(mesh=ap.LogicalMesh(shape=(2, 4)), num_micro_batches=micro,
                                          stage_option=ap.UniformStageOption(num_stages=num_stages),
                                          pipeline_schedule=schedule)
            cache[key] = (ap.parallelize(step_fn, method=method), step_fn, state, batches)
        return cache[key]

    return get


@pytest.mark.parametrize("model,num_stages,schedule,micro", CASES)
def test_manual_layers_uniform_stages_match_single_device(uniform_steps, model, num_stages, schedule, micro):
    step, step_fn, state, batches = uniform_steps(model, num_stages, schedule, micro)
    got = run_steps(step, state, batches)
    assert_same_run(reference_run(step_fn, state, batches), got)
    exe = step.get_executable(state, batches[0])
    plan = exe.plan
    assert_on_owner_stages(exe, got[0])
    assert plan.num_stages == num_stages and plan.num_layers == 4
    devices = [d for s in plan.stages for d in s.devices]
    assert sorted(devices) == list(range(8)), "uniform stages must use disjoint submeshes covering the mesh"
    assert step.num_plans == 1


def test_auto_layers_auto_stages_match_single_device():
    step_fn, state, batches = setup("mlp", boundaries=False)
    method = ap.PipeshardParallel(mesh=ap.LogicalMesh(shape=(1, 4), devices=jax.devices()[:4]), num_micro_batches=2,
                                  layer_option=ap.AutoLayerOption(layer_num=2),
                                  stage_option=ap.AutoStageOption(submesh_logical_shapes="same"))
    step = ap.parallelize(step_fn, method=method)
    assert_same_run(reference_run(step_fn, state, batches), run_steps(step, state, batches))
    plan = step.get_executable(state, batches[0]).plan
    assert plan.num_layers == 2
    assert sum(len(s.devices) for s in plan.stages) <= 4


def test_auto_stages_give_a_heavy_layer_more_devices():
    from alpa_pass.pipeline.compile.pipeshard import micro_avals
    from alpa_pass.pipeline.partition.layers import manual_layers
    from alpa_pass.pipeline.partition.stage_search import auto_stages
    from alpa_pass.pipeline.partition.stages import uniform_stages
    from alpa_pass.pipeline.trace.step import trace_step

    reps = (1, 4, 1, 1)  # layer 1 applies its kernel 4 times: 4x the FLOPs of the others
    loss_fn = make_heavy_layer_loss(reps)

    hidden, batch = 64, 16384
    params = [{"kernel": jax.ShapeDtypeStruct((hidden, hidden), jnp.float32)} for _ in reps]
    data = {"x": jax.ShapeDtypeStruct((batch, hidden), jnp.float32),
            "y": jax.ShapeDtypeStruct((batch, hidden), jnp.float32)}
    step = lambda p, b: ap.grad(loss_fn)(p, b)  # noqa: E731
    cluster = ap.LogicalMesh(shape=(1, 8))
    method = ap.PipeshardParallel(mesh=cluster, num_micro_batches=8,
                                  stage_option=ap.AutoStageOption(submesh_logical_shapes="same"))
    traced = trace_step(step, (params, data), (1,), lambda a, m: micro_avals(a, m, 8, "step"))
    layers = manual_layers(traced.loss)
    auto = auto_stages(traced, layers, cluster, method)
    uniform = uniform_stages(len(layers), cluster, 4)

    def devices_of_layer(specs, layer):
        return next(s.mesh.num_devices for s in specs if layer in s.layers)

    assert devices_of_layer(auto, 1) > devices_of_layer(uniform, 1)
    light = [devices_of_layer(auto, i) / sum(1 for s in auto if i in s.layers) for i in (0, 2, 3)]
    assert devices_of_layer(auto, 1) >= max(light)


def _mlp_method(**kw):
    return ap.PipeshardParallel(mesh=ap.LogicalMesh(shape=(2, 4)), **kw)


def test_more_stages_than_devices():
    step_fn, state, batches = setup("mlp")
    step = ap.parallelize(step_fn, method=_mlp_method(stage_option=ap.UniformStageOption(num_stages=9)))
    with pytest.raises(ap.MeshError, match="9 pipeline stages need at least 9 devices"):
        step.get_executable(state, batches[0])


def test_batch_not_divisible_by_micro_batches():
    step_fn, state, batches = setup("mlp")
    step = ap.parallelize(step_fn, method=_mlp_method(num_micro_batches=3))
    with pytest.raises(ap.ShardingError, match="not divisible by 3"):
        step.get_executable(state, batches[0])


def test_boundary_inside_a_nested_jit():
    def loss_fn(params, batch):
        def inner(x):
            ap.mark_pipeline_boundary()
            return x @ params[0]["kernel"]
        return jnp.mean(jax.jit(inner)(batch["x"]) ** 2)

    _, state, batches = setup("mlp")
    step = ap.parallelize(make_step(loss_fn, default_optimizer()), method=_mlp_method())
    with pytest.raises(ap.TraceError, match="must not nest"):
        step.get_executable(state, batches[0])


def test_manual_stage_layers_must_be_consecutive():
    step_fn, state, batches = setup("mlp")
    option = ap.ManualStageOption(forward_stage_layer_ids=((0, 2), (1, 3)),
                                  submesh_physical_shapes=((1, 4), (1, 4)))
    step = ap.parallelize(step_fn, method=_mlp_method(stage_option=option))
    with pytest.raises(ap.MeshError, match="consecutive"):
        step.get_executable(state, batches[0])


def test_plain_jax_grad_is_rejected():
    def train_step(state, batch):
        loss, grads = jax.value_and_grad(mlp_loss)(state[0], batch)
        return state, loss

    _, state, batches = setup("mlp")
    step = ap.parallelize(train_step, method=_mlp_method())
    with pytest.raises(ap.TraceError, match="exactly one alpa_pass.value_and_grad"):
        step.get_executable(state, batches[0])


def test_plan_summary_and_timeline(uniform_steps, tmp_path):
    step, _, state, batches = uniform_steps("mlp", 2, "1f1b", 4)
    plan = step.get_executable(state, batches[0]).plan
    text = plan.summary()
    assert "4 layers, 2 stages, 4 micro-batches, schedule 1f1b" in text
    assert "0..1" in text and "2..3" in text
    assert [s.devices for s in plan.stages] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all(s.predicted_bwd >= 0 and s.predicted_fwd >= 0 for s in plan.stages)
    assert len(plan.ticks) == 2 * (4 + 2 - 1)
    assert "apply (optimizer update) executables" in text
    assert "stage 0" in text and "stage 1" in text and "cross-stage" not in text
    png = plan.save_timeline(str(tmp_path / "timeline.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
