"""A flax (linen) + optax + orbax training script that knows nothing of alpa_pass (run it unchanged).

A transformer-ish MLP trained with AdamW: a bare ``@jax.jit`` step over a flax TrainState, and
orbax's ``CheckpointManager`` saving the state every 2 steps, as flax's checkpointing guide does.
After 4 steps the script "restarts": a new manager restores the latest checkpoint into an abstract
target made from the live state (its shapes, dtypes and shardings) and trains 2 more steps.
Prints one JSON line: the losses before and after the restart, whether every restored leaf equals
the saved one bit for bit, the device counts the restored parameters span, and per parameter leaf
(after the last step) the number of devices its sharding spans and its spec.
"""
import json
import tempfile

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax.training import train_state

HIDDEN, BATCH, STEPS = 128, 32, 4


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.Dense(4 * HIDDEN)(nn.LayerNorm()(x))
        return x + nn.Dense(HIDDEN)(nn.gelu(h))


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        for _ in range(2):
            x = Block()(x)
        return nn.Dense(HIDDEN)(nn.LayerNorm()(x))


@jax.jit
def train_step(state, x, y):
    def loss_fn(params):
        return jnp.mean((state.apply_fn({"params": params}, x) - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def main(directory):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    model = Model()
    params = model.init(jax.random.key(0), x[:1])["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3))
    options = ocp.CheckpointManagerOptions(max_to_keep=2, save_interval_steps=2)
    losses = []
    with ocp.CheckpointManager(directory, options=options) as mngr:
        for step in range(1, STEPS + 1):
            state, loss = train_step(state, x, y)
            losses.append(float(loss))
            mngr.save(step, args=ocp.args.StandardSave(state))
        mngr.wait_until_finished()
    saved = jax.tree.map(np.asarray, state)
    # the restart: a fresh manager, the latest step, restored into the live state's layouts
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    with ocp.CheckpointManager(directory, options=options) as mngr:
        latest = mngr.latest_step()
        state = mngr.restore(latest, args=ocp.args.StandardRestore(abstract))
    equal = all(np.array_equal(a, np.asarray(b)) for a, b in
                zip(jax.tree.leaves(saved), jax.tree.leaves(state)))
    restored_devices = sorted({len(leaf.sharding.device_set) for leaf in jax.tree.leaves(state.params)})
    resumed = []
    for _ in range(2):
        state, loss = train_step(state, x, y)
        resumed.append(float(loss))
    leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
    shardings = [{"path": jax.tree_util.keystr(path), "devices": len(leaf.sharding.device_set),
                  "spec": str(getattr(leaf.sharding, "spec", None))} for path, leaf in leaves]
    print(json.dumps({"losses": losses, "resumed": resumed, "latest": latest, "restored_equal": equal,
                      "restored_devices": restored_devices,
                      "params": shardings, "num_devices": len(jax.devices())}))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        main(d + "/ckpt")
