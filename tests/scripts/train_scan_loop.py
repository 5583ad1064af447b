"""The whole training loop in one jit (PureJaxRL style): ``lax.scan`` over the steps of a flax
linen MLP with optax adam, each batch drawn inside from a carried PRNG key; the jit's program is
that one scan. It knows nothing of alpa_pass. Prints one JSON line: the losses and, per parameter
leaf, the devices its sharding spans and its spec."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

D, B, INNER, OUTER = 256, 64, 5, 3


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = nn.tanh(nn.Dense(D)(x))
        return nn.Dense(D)(x)


model = MLP()
tx = optax.adam(1e-3)


@jax.jit
def train_step(params, opt_state, key, w_true):
    def body(carry, _):
        params, opt_state, key = carry
        key, k = jax.random.split(key)
        x = jax.random.normal(k, (B, D))
        y = jnp.tanh(x @ w_true)
        loss, g = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        u, opt_state = tx.update(g, opt_state, params)
        return (optax.apply_updates(params, u), opt_state, key), loss
    (params, opt_state, key), losses = jax.lax.scan(body, (params, opt_state, key), None, length=INNER)
    return params, opt_state, key, losses


def main():
    params = model.init(jax.random.key(0), jnp.zeros((B, D)))
    opt_state = tx.init(params)
    key = jax.random.key(1)
    w_true = jnp.asarray(np.random.default_rng(0).standard_normal((D, D), dtype=np.float32) / 16)
    losses = []
    for _ in range(OUTER):
        params, opt_state, key, l = train_step(params, opt_state, key, w_true)
        losses.extend(float(v) for v in l)
    print(json.dumps({"losses": losses, "params": [
        {"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))}
        for l in jax.tree.leaves(params)]}))


if __name__ == "__main__":
    main()
