"""A flax (linen) + optax training script that debugs its step the way people do (run it unchanged).

A 3-layer MLP in a TrainState, ``optax.chain(clip_by_global_norm, adamw)``; inside the ``@jax.jit``
step, ``jax.debug.print`` of the loss and gradient norm and a ``jax.debug.callback`` that records
them (both unordered: jax runs them once per step, on one device, under any sharding). Prints one
JSON line: the losses, what the callback saw and, per parameter leaf, its devices and spec.
"""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

HIDDEN, BATCH, STEPS = 256, 64, 4
SEEN = []


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(3):
            x = nn.gelu(nn.Dense(HIDDEN)(x))
        return nn.Dense(HIDDEN)(x)


@jax.jit
def train_step(state, x, y):
    def loss_fn(params):
        return jnp.mean((state.apply_fn({"params": params}, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    grad_norm = optax.global_norm(grads)
    jax.debug.print("step {step}: loss {loss:.6f}, grad norm {norm:.4f}", step=state.step, loss=loss, norm=grad_norm)
    jax.debug.callback(lambda s, l, g: SEEN.append([int(s), float(l), float(g)]), state.step, loss, grad_norm)
    return state.apply_gradients(grads=grads), loss


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    model = MLP()
    params = model.init(jax.random.key(0), x[:1])["params"]
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    losses = []
    for _ in range(STEPS):
        state, loss = train_step(state, x, y)
        losses.append(float(loss))
    jax.effects_barrier()  # every callback has run (and printed) before the JSON line
    leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
    shardings = [{"path": jax.tree_util.keystr(path), "devices": len(leaf.sharding.device_set),
                  "spec": str(getattr(leaf.sharding, "spec", None))} for path, leaf in leaves]
    print(json.dumps({"losses": losses, "seen": SEEN, "params": shardings}))


if __name__ == "__main__":
    main()
