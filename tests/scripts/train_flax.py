"""A flax (linen) + optax training script that knows nothing of alpa_pass (run it unchanged).

A 3-layer MLP with LayerNorm trained with Adam on fixed random data; the step is a bare
``@jax.jit`` over a flax TrainState. Prints one JSON line: the losses and, per parameter leaf, its
path, the number of devices its sharding spans and its spec.
"""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

HIDDEN, BATCH, STEPS = 256, 64, 4


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = nn.relu(nn.Dense(HIDDEN)(nn.LayerNorm()(x)))
        return nn.Dense(HIDDEN)(x)


@jax.jit
def train_step(state, x, y):
    def loss_fn(params):
        return jnp.mean((state.apply_fn({"params": params}, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    model = MLP()
    params = model.init(jax.random.key(0), x[:1])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    losses = []
    for _ in range(STEPS):
        state, loss = train_step(state, x, y)
        losses.append(float(loss))
    leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
    shardings = [{"path": jax.tree_util.keystr(path), "devices": len(leaf.sharding.device_set),
                  "spec": str(getattr(leaf.sharding, "spec", None))} for path, leaf in leaves]
    print(json.dumps({"losses": losses, "params": shardings, "num_devices": len(jax.devices())}))


if __name__ == "__main__":
    main()
