"""A plain jax + optax training script that knows nothing of alpa_pass (run it unchanged).

An MLP (4 x Dense 256, ReLU) trained with Adam for a few steps on fixed random data; parameters
are initialised eagerly, the step is a bare ``@jax.jit``. Prints one JSON line: the losses and,
per parameter leaf, the number of devices its sharding spans and its spec.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

LAYERS, HIDDEN, BATCH, STEPS = 4, 256, 64, 5


def init_params(key):
    keys = jax.random.split(key, LAYERS)
    return [{"kernel": jax.random.normal(k, (HIDDEN, HIDDEN), jnp.float32) / np.sqrt(HIDDEN),
             "bias": jnp.zeros((HIDDEN,), jnp.float32)} for k in keys]


def loss_fn(params, x, y):
    for i, layer in enumerate(params):
        x = x @ layer["kernel"] + layer["bias"]
        if i + 1 < len(params):
            x = jax.nn.relu(x)
    return jnp.mean((x - y) ** 2)


optimizer = optax.adam(1e-3)


@jax.jit
def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def main():
    params = init_params(jax.random.key(0))
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    losses = []
    for _ in range(STEPS):
        params, opt_state, loss = train_step(params, opt_state, x, y)
        losses.append(float(loss))
    shardings = [{"devices": len(leaf.sharding.device_set),
                  "spec": str(getattr(leaf.sharding, "spec", None))} for leaf in jax.tree.leaves(params)]
    print(json.dumps({"losses": losses, "params": shardings,
                      "num_devices": len(jax.devices())}))


if __name__ == "__main__":
    main()
