"""A flax linen script (run it unchanged) with the loop flax's examples write around a training
step: a *jitted* TrainState init (lm1b style), a jitted ``eval_step(state, x, y)`` before training
and every 2 steps (loss and accuracy from ``state.params``: it returns no new state), and a second
run of the loop from the same initial state (a restart, or the next trial of a sweep).

Prints one JSON line: per run the training losses and the eval metrics, and per parameter leaf
the devices its sharding spans and its spec."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

HIDDEN, CLASSES, BATCH, STEPS = 256, 64, 64, 4


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = nn.relu(nn.Dense(HIDDEN)(nn.LayerNorm()(x)))
        return nn.Dense(CLASSES)(x)


model = MLP()


@jax.jit
def create_state(rng, x):
    params = model.init(rng, x)["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-3))


@jax.jit
def train_step(state, x, y):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


@jax.jit
def eval_step(state, x, y):
    logits = state.apply_fn({"params": state.params}, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return {"loss": loss, "accuracy": jnp.mean(jnp.argmax(logits, -1) == y)}


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.integers(0, CLASSES, BATCH).astype(np.int32)
    xe = rng.standard_normal((4 * BATCH, HIDDEN), dtype=np.float32)
    ye = rng.integers(0, CLASSES, 4 * BATCH).astype(np.int32)
    initial = create_state(jax.random.key(0), x)
    runs = []
    for _ in range(2):
        state, losses = initial, []
        evals = [{k: float(v) for k, v in eval_step(state, xe, ye).items()}]
        for step in range(STEPS):
            state, loss = train_step(state, x, y)
            losses.append(float(loss))
            if step % 2 == 1:
                evals.append({k: float(v) for k, v in eval_step(state, xe, ye).items()})
        runs.append({"losses": losses, "evals": evals})
    print(json.dumps({"runs": runs, "params": [
        {"devices": len(leaf.sharding.device_set), "spec": str(getattr(leaf.sharding, "spec", None))}
        for leaf in jax.tree.leaves(state.params)]}))


if __name__ == "__main__":
    main()
