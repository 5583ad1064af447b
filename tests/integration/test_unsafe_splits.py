"""Programs whose plans once held a split XLA does not partition correctly now equal ``jax.jit``
(cpp/include/alpa/unsafe_splits.h holds the minimal XLA repro).

* A dynamic_slice whose runtime start is out of range (jax clamps it): a plan that read the slice
  split along its rows let XLA fold the shard's slice into the dynamic_slice without the clamp
  (wrong by up to 2.43 in the fuzzer's case).
* A zero-size result split on its non-empty dim could not be read back, or had no plan.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import alpa_pass as ap

MESHES = [(2, 4), (1, 8), (4, 2)]


def _run(fn, args, shape):
    step = ap.parallelize(fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=shape)))
    return jax.tree.map(np.asarray, step(*args)), jax.tree.map(np.asarray, jax.jit(fn)(*args))


def _slice_rows_dot(x, w, i):
    return lax.dynamic_slice(x, (i, 0), (8, 2)) @ w


def _slice_rows_transposed(x, w, i):
    return w.T @ lax.dynamic_slice(x, (i, 0), (8, 2)).T


def _update_rows(x, u, i):
    return jnp.tanh(lax.dynamic_update_slice(x, u, (i, 0))) * 2.0


def _gather_rows(x, w, i):
    return x[jnp.clip(i, 0, 4) + jnp.arange(8)] @ w


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fn", [_slice_rows_dot, _slice_rows_transposed, _gather_rows],
                         ids=["dynamic_slice", "transposed", "gather"])
def test_out_of_range_dynamic_slice_equals_jit(fn, shape):
    x = jax.random.normal(jax.random.key(0), (12, 2), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (2, 4), jnp.float32)
    for i in (6, -3, 2):  # 6 and -3 are clamped by jax (to 4 and 0), 2 is in range
        got, want = _run(fn, (x, w, jnp.int32(i)), shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"start {i}")


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_dynamic_update_slice_equals_jit(shape):
    x = jax.random.normal(jax.random.key(0), (16, 8), jnp.float32)
    u = jnp.full((4, 8), 3.0, jnp.float32)
    got, want = _run(_update_rows, (x, u, jnp.int32(14)), shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("m,k", [(8, 16), (4, 4)], ids=["8x16", "4x4"])
def test_zero_size_result_is_replicated_and_reads_back(shape, m, k):
    # 8x16 @ 16x0 was planned P(('x','y'), None) (unreadable); 4x4 @ 4x0 on 1x8 had no plan at all
    # (InfeasibleError), found by the fuzzer.
    x, w = jnp.ones((m, k), jnp.float32), jnp.ones((k, 0), jnp.float32)
    step = ap.parallelize(lambda x, w: x @ w, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=shape)))
    exe = step.get_executable(x, w)
    assert all(all(e is None for e in spec) for spec in exe.plan.output_specs), exe.plan.output_specs
    assert np.asarray(step(x, w)).shape == (m, 0)


T, B, H, NMB = 16, 64, 128, 4


def _rollout_then_minibatches(w, w2, x):
    """PureJaxRL's shape: a scan writes one [B, H] row per step (a dynamic_update_slice of its
    stacked output), then the rows are one batch cut into minibatches that a second scan trains on."""
    def step(h, _):
        h = jnp.tanh(h @ w)
        return h, h
    _, ys = lax.scan(step, x, None, length=T)
    mbs = ys.reshape(T * B, H).reshape(NMB, T * B // NMB, H)
    return lax.scan(lambda acc, m: (acc + jnp.sum(jnp.tanh(m @ w2) ** 2), None), 0.0, mbs)[0]


@pytest.mark.parametrize("shape", [(1, 8), (2, 4)], ids=lambda s: "x".join(map(str, s)))
def test_rows_a_scan_wrote_are_split_on_batch_after_the_loop(shape):
    """The stacked output's rows were followed as runtime-indexed past the loop: every minibatch
    was replicated and its dots split on hidden (objective 1.38e6 on 1x8, activations all-gathered);
    now they split the minibatch rows (3.7e5) and the gradients equal jax.jit."""
    w = jax.random.normal(jax.random.key(0), (H, H), jnp.float32) / H ** 0.5
    w2 = jax.random.normal(jax.random.key(1), (H, H), jnp.float32) / H ** 0.5
    x = jax.random.normal(jax.random.key(2), (B, H), jnp.float32)
    fn = jax.value_and_grad(_rollout_then_minibatches, argnums=(0, 1))
    step = ap.parallelize(fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=shape)))
    plan = step.get_executable(w, w2, x).plan
    dots = [c for c in plan.choices if c.kind == "DOT" and tuple(c.shape) == (T * B // NMB, H)]
    assert len(dots) == 2 and all(c.spec[0] is not None and c.spec[1] is None for c in dots), \
        [(c.spec, c.strategy) for c in dots]
    got, want = step(w, w2, x), jax.jit(fn)(w, w2, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):  # sums of ~1e3 terms, reordered
        b = np.asarray(b)
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5 * np.abs(b).max())
