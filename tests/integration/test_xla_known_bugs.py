"""Failures the fuzzer (tests/property/test_fuzz.py) found outside alpa_pass, reproduced with plain
``jax.jit`` and sharding constraints. Strict xfails: one that starts passing (a fixed XLA) fails
here, so the fuzzer's KNOWN entry and this test can be dropped.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


@pytest.mark.xfail(strict=True, raises=Exception,
                   reason="issue 14: XLA CPU gives an FFT an input in a column-major layout (a "
                          "reduce_window's, through an all-gather) and its fft thunk then fails "
                          "RET_CHECK IsMonotonicWithDim0Major; jax.jit with these constraints fails "
                          "alike, so a plan with them cannot run on CPU")
def test_fft_of_a_sharded_cumsum_fails_in_xla_cpu():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))

    def s(*spec):
        return NamedSharding(mesh, P(*spec))

    wsc = jax.lax.with_sharding_constraint

    def residual(v, w):
        d = wsc(wsc(v, s("y", None)) @ w, s("y", "x"))
        return wsc(v + wsc(jnp.tanh(d), s("y", "x")), s("y", "x"))

    def f(x, w1, w2, w3):
        v = residual(x, w1)
        c = wsc(jnp.cumsum(wsc(v, s(None, "x")), axis=0), s(None, "x"))
        v = wsc(jnp.abs(jnp.fft.fft(c, axis=1)), s())
        return wsc(jnp.sin(residual(residual(v, w2), w3)), s("y", None))

    rng = np.random.RandomState(0)
    args = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(4)]
    step = jax.jit(f, in_shardings=(s("y", None),) + (s(None, "x"),) * 3, out_shardings=s("y", None))
    np.testing.assert_allclose(np.asarray(step(*args)), np.asarray(jax.jit(f)(*args)), rtol=1e-5, atol=1e-5)
