"""A plain jax + optax training script with dropout driven by a typed PRNG key
(``jax.random.key``) that the jitted step takes and returns; it knows nothing of alpa_pass.
Prints one JSON line: the losses and, per parameter leaf, the devices its sharding spans."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

LAYERS, HIDDEN, BATCH, STEPS = 3, 256, 64, 4
optimizer = optax.adam(1e-3)


def loss_fn(params, x, y, key):
    for i, layer in enumerate(params):
        x = x @ layer["kernel"] + layer["bias"]
        if i + 1 < len(params):
            key, sub = jax.random.split(key)
            x = jnp.where(jax.random.bernoulli(sub, 0.9, x.shape), jax.nn.relu(x) / 0.9, 0.0)
    return jnp.mean((x - y) ** 2)


@jax.jit
def train_step(params, opt_state, x, y, key):
    key, sub = jax.random.split(key)
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y, sub)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, key


def main():
    keys = jax.random.split(jax.random.key(0), LAYERS)
    params = [{"kernel": jax.random.normal(k, (HIDDEN, HIDDEN), jnp.float32) / np.sqrt(HIDDEN),
               "bias": jnp.zeros((HIDDEN,), jnp.float32)} for k in keys]
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    key, losses = jax.random.key(1), []
    for _ in range(STEPS):
        params, opt_state, loss, key = train_step(params, opt_state, x, y, key)
        losses.append(float(loss))
    shardings = [{"devices": len(leaf.sharding.device_set), "spec": str(getattr(leaf.sharding, "spec", None))}
                 for leaf in jax.tree.leaves(params)]
    print(json.dumps({"losses": losses, "params": shardings, "key_dtype": str(key.dtype),
                      "key_data": np.asarray(jax.random.key_data(key)).tolist()}))


if __name__ == "__main__":
    main()
