"""A flax linen training script in the style of flax's lm1b example (run it unchanged): the
``TrainState`` is created by a *jitted* init, the step takes and returns a typed dropout key.
Prints one JSON line: the losses and, per parameter leaf, the devices its sharding spans and its spec."""
import json
import flax.linen as nn
import jax, jax.numpy as jnp, numpy as np, optax
from flax.training import train_state

HIDDEN, BATCH, STEPS = 256, 64, 4

class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, train=True):
        for _ in range(3):
            x = nn.Dropout(0.1, deterministic=not train)(nn.relu(nn.Dense(HIDDEN)(nn.LayerNorm()(x))))
        return nn.Dense(HIDDEN)(x)

model = MLP()

@jax.jit
def create_state(rng, x):
    params = model.init(rng, x, train=False)["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))

@jax.jit
def train_step(state, x, y, rng):
    rng, sub = jax.random.split(rng)
    def loss_fn(params):
        return jnp.mean((state.apply_fn({"params": params}, x, rngs={"dropout": sub}) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss, rng


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    state = create_state(jax.random.key(0), x)
    key, losses = jax.random.key(1), []
    for _ in range(STEPS):
        state, loss, key = train_step(state, x, y, key)
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "params": [{"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))} for l in jax.tree.leaves(state.params)]}))


if __name__ == "__main__":
    main()
