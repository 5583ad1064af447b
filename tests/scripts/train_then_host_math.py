"""A planned training step whose outputs feed jitted helpers that run host code (run it unchanged).

A one-layer tanh regression trained by a jitted step; between steps the weights are clipped at
their 90th |w| percentile, computed by numpy in a ``jax.pure_callback``, and a diagnostic takes
the log-determinants of 8 per-group covariances of the weights by a batched Cholesky (a vmapped
LAPACK call). On simulated CPU devices both helpers can hang XLA's CPU runtime when they run on
every device at once (the callback on device 0 while the others wait; jaxlib < 0.11's batched
LAPACK); plain jax runs them on one device. Prints one JSON line: losses, log-determinants, the
clip thresholds, and how many devices the helpers' results and the weights live on.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np

B, D, G = 2048, 64, 8


@jax.jit
def train_step(w, x, y):
    loss, g = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
    return w - 0.5 * g, loss


@jax.jit
def clip(w):
    q = jax.pure_callback(lambda a: np.percentile(np.abs(a), 90).astype(np.float32),
                          jax.ShapeDtypeStruct((), jnp.float32), w)
    return jnp.clip(w, -q, q), q


@jax.jit
def group_logdets(w):
    a = w.reshape(G, D // G, D)
    cov = jnp.einsum("gki,gkj->gij", a, a) + jnp.eye(D)
    return 2 * jnp.log(jnp.diagonal(jax.vmap(jnp.linalg.cholesky)(cov), axis1=1, axis2=2)).sum(-1)


def main():
    rng = np.random.RandomState(0)
    x = rng.randn(B, D).astype(np.float32)
    y = np.tanh(x @ rng.randn(D, D).astype(np.float32) / 8).astype(np.float32)
    w = jnp.asarray(rng.randn(D, D).astype(np.float32) / 8)
    losses, logdets, qs = [], [], []
    for _ in range(3):
        w, loss = train_step(w, x, y)
        losses.append(float(loss))
        ld = group_logdets(w)
        logdets.append([float(v) for v in ld])
        w, q = clip(w)
        qs.append(float(q))
    w, loss = train_step(w, x, y)
    losses.append(float(loss))
    print(json.dumps({"losses": losses, "logdets": logdets, "clip": qs, "devices": {
        "logdets": len(ld.devices()), "clipped": len(q.devices()), "w": len(w.devices())}}))


main()
