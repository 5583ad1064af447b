"""An Equinox + optax training script that knows nothing of alpa_pass (run it unchanged): an
``eqx.nn.MLP`` with ``eqx.nn.Dropout`` driven by typed keys, the step an ``eqx.filter_jit`` over the
model's array leaves. Prints one JSON line: the losses and, per parameter leaf, the devices its
sharding spans and its spec."""
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

HIDDEN, BATCH, STEPS = 256, 64, 4


class Net(eqx.Module):
    mlp: eqx.nn.MLP
    dropout: eqx.nn.Dropout

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(HIDDEN, HIDDEN, HIDDEN, depth=3, activation=jax.nn.relu, key=key)
        self.dropout = eqx.nn.Dropout(0.1)

    def __call__(self, x, key):
        return self.dropout(self.mlp(x), key=key)


optimizer = optax.adam(1e-3)


@eqx.filter_jit
def train_step(model, opt_state, x, y, key):
    def loss_fn(model):
        keys = jax.random.split(key, x.shape[0])
        return jnp.mean((jax.vmap(model)(x, keys) - y) ** 2)

    loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


def main():
    model = Net(jax.random.key(0))
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    key, losses = jax.random.key(1), []
    for _ in range(STEPS):
        key, sub = jax.random.split(key)
        model, opt_state, loss = train_step(model, opt_state, x, y, sub)
        losses.append(float(loss))
    leaves = jax.tree.leaves(eqx.filter(model, eqx.is_array))
    print(json.dumps({"losses": losses, "params": [
        {"devices": len(leaf.sharding.device_set), "spec": str(getattr(leaf.sharding, "spec", None))}
        for leaf in leaves]}))


if __name__ == "__main__":
    main()
