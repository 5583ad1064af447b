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
