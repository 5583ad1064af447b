"""Batched linear algebra (jax's LAPACK custom calls, batched by their ``sdy.sharding_rule``) in a
training step: planned along the batch dims, each device decomposing its own matrices (XLA's
partitioner runs such a call per batch shard); before, an opaque fallback, every device
decomposed all of them after an all-gather."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass.driver.jit import plan_and_compile
from alpa_pass.tools.fidelity import list_collectives, summarize

LAYERS, DIM, BATCH = 8, 64, 32


def shampoo_like_step(w, x):
    """Per-layer (stacked) preconditioners from an eigendecomposition of each layer's gradient
    statistics, and a QR of each layer's weight (an orthogonality regulariser)."""
    def loss(w):
        return jnp.mean(jnp.tanh(jnp.einsum("lij,bj->lbi", w, x)) ** 2)

    g = jax.grad(loss)(w)
    stats = jnp.einsum("lij,lkj->lik", g, g) + 1e-3 * jnp.eye(DIM)
    evals, evecs = jnp.linalg.eigh(stats)
    pre = jnp.einsum("lij,lj,lkj->lik", evecs, jax.lax.rsqrt(evals + 1e-6), evecs)
    q, r = jnp.linalg.qr(w)
    ortho = jnp.einsum("lij,lik->ljk", q, q) - jnp.eye(DIM)
    return w - 0.1 * jnp.einsum("lij,ljk->lik", pre, g) - 1e-3 * jnp.einsum("lij,ljk->lik", w, ortho), r


@pytest.mark.parametrize("shape", [(1, 8), (2, 4)])
def test_batched_eigh_and_qr_run_on_each_devices_layers(shape):
    w = jax.random.normal(jax.random.key(0), (LAYERS, DIM, DIM)) * 0.1
    x = jax.random.normal(jax.random.key(1), (BATCH, DIM))
    plan, compiled = plan_and_compile(shampoo_like_step, (w, x), ap.LogicalMesh(shape=shape),
                                      ap.AutoShardingOption())
    assert plan.fallbacks == {}
    hlo = compiled.as_text()
    calls = [line for line in hlo.splitlines() if "custom-call(" in line and "lapack_" in line]
    assert len(calls) == 3, calls  # syevd, geqrf, orgqr
    for line in calls:  # each on its own layers: leading dim LAYERS / 8 = 1
        out_shape = line.split("=", 1)[1].split("custom-call(")[0]
        assert re.search(rf"f32\[1,{DIM},{DIM}\]", out_shape), line[:200]
    counts = {k: v["count"] for k, v in summarize(list_collectives(hlo)).items()}
    assert counts["all-gather"] == 0 and counts["collective-permute"] == 0, counts
    out, r = compiled(w, x)
    ref, ref_r = jax.jit(shampoo_like_step)(w, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.abs(np.asarray(r)), np.abs(np.asarray(ref_r)), rtol=1e-5, atol=1e-6)
