"""Bad input gives typed errors that say what to change, or a plan that is still correct."""
from __future__ import annotations

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
    mesh = ap.LogicalMesh(shape=(1, 4))
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


def test_while_loop_is_planned_not_a_fallback():
    """A while_loop's ops are planned like top-level ops (no OPAQUE fallback), numerics equal."""
    w = jax.random.normal(jax.random.key(0), (32, 32), jnp.float32) / 6.0
    x = jax.random.normal(jax.random.key(1), (16, 32), jnp.float32)
    grad_fn = jax.value_and_grad(_while_step)
    step = ap.parallelize(grad_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4))))
    assert step.get_executable(w, x).plan.fallbacks == {}
    loss, grad = step(w, x)
    want_loss, want_grad = jax.jit(grad_fn)(w, x)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [_callback_step], ids=["pure_callback"])
def test_unknown_op_falls_back_once_and_stays_correct(fn, caplog):
    w = jax.random.normal(jax.random.key(0), (32, 32), jnp.float32) / 6.0
    x = jax.random.normal(jax.random.key(1), (16, 32), jnp.float32)
    grad_fn = jax.value_and_grad(fn)
    step = ap.parallelize(grad_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4))))
    with caplog.at_level(logging.WARNING, logger="alpa_pass"):
        exe = step.get_executable(w, x)
    assert exe.plan.fallbacks, "an op the core does not know must be reported in plan.fallbacks"
    logged = [r for r in caplog.records if r.name.startswith("alpa_pass")]
    for op in exe.plan.fallbacks:
        mentions = [r for r in logged if op in r.getMessage()]
        assert len(mentions) == 1, f"fallback for {op} logged {len(mentions)} times: {[r.getMessage() for r in logged]}"
    loss, grad = step(w, x)
    want_loss, want_grad = jax.jit(grad_fn)(w, x)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5, atol=1e-6)
