"""A flax linen residual MLP trained with ``optax.contrib.muon`` through a ``TrainState``: Muon
orthogonalises each 2-D update by Newton-Schulz iterations (matmuls of the update with itself
inside the optimizer), the LayerNorm scales and biases get its Adam fallback. It knows nothing of
alpa_pass. Prints one JSON line: the losses and, per parameter leaf, the devices its sharding
spans and its spec."""
import json

import flax.linen as nn
import jax
import numpy as np
import optax
from flax.training import train_state

WIDTH, BLOCKS, BATCH, STEPS = 256, 2, 64, 4


class ResidualMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(BLOCKS):
            x = x + nn.Dense(WIDTH)(nn.gelu(nn.Dense(2 * WIDTH)(nn.LayerNorm()(x))))
        return nn.Dense(1)(x)[:, 0]


@jax.jit
def train_step(state, x, y):
    def loss_fn(params):
        return ((state.apply_fn({"params": params}, x) - y) ** 2).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def main():
    model = ResidualMLP()
    params = model.init(jax.random.key(0), np.zeros((BATCH, WIDTH), np.float32))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                          tx=optax.contrib.muon(learning_rate=1e-2))
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(STEPS):
        x = rng.standard_normal((BATCH, WIDTH), dtype=np.float32)
        state, loss = train_step(state, x, np.tanh(x[:, :8].sum(-1)))
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "params": [
        {"devices": len(leaf.sharding.device_set), "spec": str(getattr(leaf.sharding, "spec", None))}
        for leaf in jax.tree.leaves(state.params)]}))


if __name__ == "__main__":
    main()
