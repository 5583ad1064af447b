"""A script that shards by hand: ``jax.jit(..., in_shardings=...)`` on a 2x4 mesh.

Prints one JSON line: the updated weight's spec and device count, and the loss.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def step(w, x):
    loss = jnp.mean(jnp.tanh(x @ w) ** 2)
    return w - 0.1 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w), loss


def main():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    w_sh, x_sh = NamedSharding(mesh, P(None, "model")), NamedSharding(mesh, P("data", None))
    f = jax.jit(step, in_shardings=(w_sh, x_sh))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 512), dtype=np.float32) / 16
    x = rng.standard_normal((256, 512), dtype=np.float32)
    w, loss = f(w, x)
    w, loss = f(w, x)
    print(json.dumps({"w_spec": str(w.sharding.spec), "w_devices": len(w.sharding.device_set),
                      "loss": float(loss)}))


if __name__ == "__main__":
    main()
