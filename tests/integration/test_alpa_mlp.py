"""Alpa's own MLP cases (alpa tests/shard_parallel/test_mlp.py): a 6-layer Dense+ReLU MLP, MSE
loss, Adam, a train step that returns only the new state, on 4 devices. The compiled step's
collectives are the ones Alpa's test counts and the numerics equal single-device ``jax.jit``.

All-reduce cost on 2 devices in the alpha-beta model: ``AR(bytes, axis) = alpha + beta * bytes``;
on 4: ``alpha + beta * 1.5 * bytes``.
"""
from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import alpa_pass as ap
from alpa_pass.driver.jit import plan_and_compile
from alpa_pass.tools.fidelity import list_collectives, summarize
from tests import helpers
from zoo import default_optimizer, init_state, mlp

LAYERS = 6


def _step_for(optimizer):
    def step(state, batch):  # Alpa's train_step: no loss output (no scalar all-reduce)
        params, opt_state = state
        grads = jax.grad(mlp.loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state
    return step


def _compile(batch, hidden, mesh, **option):
    config = mlp.Config(num_layers=LAYERS, hidden=hidden, batch=batch)
    optimizer = default_optimizer()
    state = init_state(mlp.init(jax.random.key(0), config), optimizer)
    data = mlp.make_batch(jax.random.key(1), config)
    step = _step_for(optimizer)
    plan, compiled = plan_and_compile(step, (state, data), mesh, ap.AutoShardingOption(**option))
    return plan, compiled, step, (state, data)


def _counts(compiled):
    found = list_collectives(compiled.as_text())
    return found, {k: v["count"] for k, v in summarize(found).items()}


def _assert_matches_jit(plan, compiled, step, args):
    mesh = plan.mesh.jax_mesh()
    placed = jax.tree.unflatten(jax.tree.structure(args), [
        jax.device_put(x, jax.sharding.NamedSharding(mesh, s))
        for x, s in zip(jax.tree.leaves(args), plan.input_specs)])
    got, want = compiled(*placed), jax.jit(step)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def _mesh(shape, beta):
    return ap.LogicalMesh(shape=shape, alpha=(1.0, 1.0), beta=beta, devices=jax.devices()[:4])


def test_2d_mesh_batch_on_slow_axis_megatron_on_fast_axis():
    # Alpa's test_n_layer_mlp_2d_mesh: batch 256, hidden 32 on 2x2, beta (1, 0.1), Alpa's default
    # allow_mixed_mesh_shape=False. Alpa expects 6 all-reduces: 5 activation all-reduces on y
    # (3 forward after the row-parallel layers, 2 backward before the column-parallel ones) and
    # one combined gradient all-reduce on x; its objective:
    B, H = 256, 32
    alpa_objective = (LAYERS * ((1 + H * H * 4 / 2) + (1 + H * 4)) + (LAYERS - 1) * (1 + 0.1 * B * H * 4 / 2))
    plan, compiled, step, args = _compile(B, H, _mesh((2, 2), (1.0, 0.1)), allow_mixed_mesh_shape=False)
    found, counts = _counts(compiled)
    assert counts["all-reduce"] == LAYERS, counts
    assert counts["all-to-all"] == counts["collective-permute"] == counts["reduce-scatter"] == 0, counts
    # The plan also all-reduces every bias gradient split on y: the row-parallel layers' biases
    # are replicated, so it reduces half of the bias gradient over x (alpha + 1 * 64 B instead of
    # alpha + 1 * 128 B) and gathers the 32 floats on y (alpha + 0.1 * 64): cheaper than Alpa's
    # plan under the same model. The reduce reads its operand sliced on y (a use-site constraint),
    # so XLA reduces the slice; it used to all-reduce all 32 floats, slice and gather them back.
    gathers = [c for c in found if c.kind == "all-gather"]
    assert len(gathers) == LAYERS // 2 and all(int(np.prod(s)) == H for c in gathers for s in c.shapes), gathers
    reduced = sorted(int(np.prod(s)) for c in found if c.kind == "all-reduce" for s in c.shapes)
    assert reduced == sorted([B // 2 * H] * (LAYERS - 1) + [H // 2, H * H // 2] * LAYERS), reduced
    assert plan.objective <= alpa_objective
    kernels = plan.input_specs[1:2 * LAYERS:2]  # state[0][i]["kernel"]: leaves are (bias, kernel)
    assert kernels == [jax.sharding.PartitionSpec(*(((None, "y"), ("y", None))[i % 2])) for i in range(LAYERS)], kernels
    _assert_matches_jit(plan, compiled, step, args)


def test_shared_relu_gets_each_layers_layout():
    # The same case with mixed layouts allowed: the plan moves activations [x, y] -> [(x, y), R]
    # by all-to-all. jax.nn.relu is one func.func called by every layer; emission used to leave
    # its result unconstrained (its call paths want different layouts), Shardy picked one, and the
    # weight-gradient dots gathered the whole batch instead (6 all-gathers of 256x32, 3 over the
    # slow axis). Each call now gets its own callee and constraint.
    B, H = 256, 32
    plan, compiled, step, args = _compile(B, H, _mesh((2, 2), (1.0, 0.1)))
    assert "call_path_conflict" not in plan.emit_report.skipped, plan.emit_report.skipped
    found, counts = _counts(compiled)
    assert counts["all-reduce"] == 1 and counts["collective-permute"] == 0, counts
    assert not [c for c in found if any(s and s[0] == B for s in c.shapes)], "a full batch was gathered"
    _assert_matches_jit(plan, compiled, step, args)


@pytest.mark.parametrize("shape,beta,expected", [
    ((1, 4), (1.0, 1.0), LAYERS - 1),  # Alpa's test_n_layer_mlp_model_parallel
    pytest.param((2, 2), (1.0, 0.1), 2 * LAYERS - 1, marks=pytest.mark.slow),
])
def test_model_parallel_reduces_activations_only(shape, beta, expected):
    # Batch 32, hidden 256: every kernel is split, only activations are all-reduced. On 1x4 Alpa
    # expects 5 (Megatron: 3 forward, 2 backward) and objective 5 * AR(32 * 256 * 4 B over 4).
    # On 2x2 kernels are split over both axes, so every dot contracts over a split axis: 6 forward,
    # 5 backward.
    B, H = 32, 256
    plan, compiled, step, args = _compile(B, H, _mesh(shape, beta))
    _, counts = _counts(compiled)
    assert counts["all-reduce"] == expected and sum(counts.values()) == expected, counts
    if shape == (1, 4):
        assert helpers.communication(plan) == pytest.approx((LAYERS - 1) * (1 + 1.5 * B * H * 4), rel=1e-6)
    _assert_matches_jit(plan, compiled, step, args)
