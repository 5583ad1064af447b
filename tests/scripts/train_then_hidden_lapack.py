"""Batched LAPACK the jaxpr does not show (run it unchanged).

lineax's GMRES runs its QR inside Equinox's own primitive, lowered by ``mlir.lower_fun``: the
jaxpr shows that primitive, not the QR, which appears only in the lowered module. Here a
primitive of ours does the same: ``orthonormal(a)`` is the Q of a batched QR. A jitted training
step (a tanh regression) feeds its weights to a jitted helper that orthonormalises them in
groups, and a jitted evaluation fits the orthonormalised per-example systems (its own QR). On
simulated CPU devices jaxlib < 0.11's batched LAPACK can deadlock when every device runs it at
once; plain jax runs both on one device. Prints one JSON line: losses, the helper's checksums,
the evaluation's losses, and how many devices their results and the weights live on.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

B, N, D = 2048, 16, 64

orthonormal_p = Primitive("orthonormal")
orthonormal_p.def_abstract_eval(lambda a: jax.core.ShapedArray(a.shape, a.dtype))
orthonormal_p.def_impl(lambda a: jnp.linalg.qr(a)[0])
mlir.register_lowering(orthonormal_p, mlir.lower_fun(lambda a: jnp.linalg.qr(a)[0], multiple_results=False))


@jax.jit
def train_step(w, x, y):
    loss, g = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
    return w - 0.5 * g, loss


@jax.jit
def group_basis(w):
    return orthonormal_p.bind(w.reshape(N, N, D)).sum((1, 2))


@jax.jit
def basis_fit(w, systems, y):
    q = orthonormal_p.bind(systems).reshape(B, N * N)
    return jnp.mean((jnp.tanh(q @ w) - y) ** 2)


def main():
    rng = np.random.RandomState(0)
    systems = (rng.randn(B, N, N) + 3 * np.eye(N)).astype(np.float32)
    x, y = systems.reshape(B, N * N) / 4, rng.randn(B, D).astype(np.float32) / 4
    w = jnp.zeros((N * N, D), jnp.float32)
    losses, sums, fits = [], [], []
    for _ in range(3):
        w, loss = train_step(w, x, y)
        losses.append(float(loss))
        s = group_basis(w + 1.0)
        sums.append([float(v) for v in s])
        fit = basis_fit(w, systems, y)
        fits.append(float(fit))
    print(json.dumps({"losses": losses, "sums": sums, "fits": fits, "devices": {
        "sums": len(s.devices()), "fit": len(fit.devices()), "w": len(w.devices())}}))


main()
