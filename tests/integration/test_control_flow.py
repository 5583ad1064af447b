"""Planning inside control flow: ``lax.scan`` / ``fori_loop`` / ``while_loop`` bodies and ``lax.cond``
branches are planned like top-level ops (no OPAQUE fallback), their carried values keep one layout,
and the results equal single-device ``jax.jit``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

import alpa_pass as ap

MESH = ap.LogicalMesh(shape=(2, 4))
L, D, B = 4, 128, 64


def _data(seed=0):
    rng = np.random.default_rng(seed)
    ws = rng.standard_normal((L, D, D)).astype(np.float32) / np.sqrt(D)
    return ws, rng.standard_normal((B, D)).astype(np.float32), rng.standard_normal((B, D)).astype(np.float32)


def _scan_loss(ws, x, y):
    h, _ = lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
    return jnp.mean((h - y) ** 2)


def _check(fn, *args, mesh=MESH):
    step = ap.parallelize(fn, method=ap.ShardParallel(mesh=mesh))
    exe = step.get_executable(*args)
    assert not {"stablehlo.while", "stablehlo.case"} & set(exe.plan.fallbacks), exe.plan.fallbacks
    got, want = step(*args), jax.jit(fn)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    return exe


@pytest.mark.parametrize("shape", [(2, 4), (1, 8)])
def test_scan_over_stacked_layers_trains_like_jit(shape):
    """A layer stack as lax.scan over stacked [L, D, D] weights, 3 SGD-momentum steps (Adam's
    g / sqrt(v) turns summation-order noise in near-zero gradients into lr-sized steps): same
    losses and weights as jax.jit; the loop body's dots run on per-device shards (the compiled
    step's per-device FLOPs are well under the single-device step's)."""
    opt = optax.sgd(0.1, momentum=0.9)

    def step(ws, s, x, y):
        loss, g = jax.value_and_grad(_scan_loss)(ws, x, y)
        u, s = opt.update(g, s, ws)
        return optax.apply_updates(ws, u), s, loss

    ws, x, y = _data()
    state, ref = (ws, opt.init(ws)), (ws, opt.init(ws))
    f = ap.parallelize(step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=shape)))
    exe = f.get_executable(*state, x, y)
    assert exe.plan.fallbacks == {}
    for _ in range(3):
        *state, loss = f(*state, x, y)
        *ref, ref_loss = jax.jit(step)(*ref, x, y)
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(state[0]), np.asarray(ref[0]), rtol=1e-5, atol=1e-6)
    def flops(compiled):
        cost = compiled.cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    single = flops(jax.jit(step).lower(ws, opt.init(ws), x, y).compile())
    assert any("while/body" in ln for ln in exe.hlo_text().splitlines() if " dot(" in ln)
    assert flops(exe) < 0.5 * single, (flops(exe), single)  # the loop's dots run on shards


def test_fori_loop_with_a_matmul_body():
    def f(w, x):
        return lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), x)

    ws, x, _ = _data(1)
    _check(f, ws[0], x)


def test_while_with_a_data_dependent_trip_count():
    def f(w, x):
        def cond(c):
            return (c[0] < 5) & (jnp.abs(c[1]).sum() < 1e6)

        return lax.while_loop(cond, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w) * 3.0), (0, x))[1]

    ws, x, _ = _data(2)
    _check(f, ws[0], x)


def test_cond_with_a_matmul_in_each_branch():
    def f(w, x, p):
        return lax.cond(p > 0, lambda h: jnp.tanh(h @ w), lambda h: (h @ w.T) * 0.5, x).sum(axis=0)

    ws, x, _ = _data(3)
    for p in (1.0, -1.0):
        _check(f, ws[0], x, np.float32(p))


def test_nested_scans_and_their_gradient():
    def f(ws, x):
        def outer(h, w):
            h, _ = lax.scan(lambda g, k: (jnp.tanh(g @ w) + k, None), h, jnp.arange(2.0))
            return h, None

        return jnp.mean(lax.scan(outer, x, ws)[0] ** 2)

    ws, x, _ = _data(4)
    _check(jax.value_and_grad(f), ws, x)


def test_loop_costs_scale_with_the_trip_count():
    """A body's compute and communication count once per iteration: a static trip count is read
    from the loop (``i < N`` from a constant start), so the cost is c + N * (one iteration):
    going from 4 to 8 iterations adds twice what going from 2 to 4 adds."""
    ws, x, _ = _data(5)

    def looped(n):
        return lambda w, x: lax.fori_loop(0, n, lambda i, h: jnp.tanh(h @ w), x)

    plans = {n: ap.parallelize(looped(n), method=ap.ShardParallel(mesh=MESH)).plan(ws[0], x) for n in (2, 4, 8)}
    p2, p4, p8 = (plans[n].predicted["compute"] for n in (2, 4, 8))
    assert p4 > p2 and p8 - p4 == pytest.approx(2 * (p4 - p2), rel=0.05), (p2, p4, p8)
    o2, o4, o8 = (plans[n].objective for n in (2, 4, 8))
    assert o8 - o4 == pytest.approx(2 * (o4 - o2), rel=0.05), (o2, o4, o8)


def test_resharding_edges_sum_to_the_predicted_resharding():
    """``plan.edges.resharding_edges`` lists what the ILP charged: the scan's gradient on 2x4
    reshards inside its loop bodies (each such edge weighted by its loop's trip count: L for the
    forward loop, L - 1 for the backward one, whose last iteration runs peeled,
    ``trace.scan_peel``), and the edges' costs add up to ``plan.predicted["resharding"]``."""
    from alpa_pass.driver.jit import make_plan
    from alpa_pass.plan.edges import resharding_edges

    ws, x, y = _data(0)
    fn = jax.value_and_grad(_scan_loss)
    plan, graph, _ = make_plan(fn, (ws, x, y), MESH, ap.ShardParallel(mesh=MESH).planning_option())
    edges = resharding_edges(plan, graph)
    assert plan.predicted["resharding"] > 0
    assert sum(e.cost for e in edges) == pytest.approx(plan.predicted["resharding"], rel=1e-9)
    assert [e.cost for e in edges] == sorted((e.cost for e in edges), reverse=True)
    assert {e.weight for e in edges} <= {1.0, float(L - 1), float(L)} and any(e.weight == L - 1 for e in edges)
    for e in edges:
        assert e.cost == e.weight * ap._core.reshard_cost(MESH.to_core(), graph.shape(e.producer), 4.0, e.src, e.dst) > 0
        assert graph.operands(e.consumer)[e.operand] == e.producer
