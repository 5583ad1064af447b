"""A plain jax + optax MLP trained with ``optax.contrib.muon`` (Newton-Schulz orthogonalisation of
each 2-D update: matmuls of the update with itself inside the optimizer). It knows nothing of
alpa_pass. Prints one JSON line: the losses and, per parameter leaf, the devices its sharding
spans and its spec."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax

LAYERS, HIDDEN, BATCH, STEPS = 3, 256, 64, 4
optimizer = optax.contrib.muon(1e-2)


def loss_fn(params, x, y):
    for i, layer in enumerate(params):
        x = x @ layer["kernel"] + layer["bias"]
        if i + 1 < len(params):
            x = jnp.tanh(x)
    return jnp.mean((x - y) ** 2)


@jax.jit
def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def main():
    keys = jax.random.split(jax.random.key(0), LAYERS)
    params = [{"kernel": jax.random.normal(k, (HIDDEN, HIDDEN), jnp.float32) / np.sqrt(HIDDEN),
               "bias": jnp.zeros((HIDDEN,), jnp.float32)} for k in keys]
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
        y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
        params, opt_state, loss = train_step(params, opt_state, x, y)
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "params": [
        {"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))}
        for l in jax.tree.leaves(params)]}))


if __name__ == "__main__":
    main()
