"""A script whose very first jax computation is the jitted training step (numpy data, no jax call
before it), so the step's own lowering starts JAX's backend; it knows nothing of alpa_pass.
Prints one JSON line: the losses and the devices the weights' sharding spans."""
import json

import jax
import jax.numpy as jnp
import numpy as np


@jax.jit
def train_step(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.5 * grad, loss


def main():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 512), dtype=np.float32) / 16
    x = rng.standard_normal((256, 512), dtype=np.float32)
    losses = []
    for _ in range(3):
        w, loss = train_step(w, x)
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "params": [{"devices": len(w.sharding.device_set),
                                                    "spec": str(getattr(w.sharding, "spec", None))}]}))


if __name__ == "__main__":
    main()
