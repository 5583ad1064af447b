"""A planned training step, then a batch the user commits to one device (run it unchanged).

A data loader that places each batch with ``jax.device_put(x, jax.devices()[k])`` (a common idiom)
hands the step that batch beside weights a planned step left on all devices. Plain jax's outputs
are uncommitted and follow the batch to device k; the step then runs there, and so do the steps
after it (their weights are committed to device k now). An eval step on a batch committed to
another device, beside the planned weights, runs on that device likewise.
Prints one JSON line: the losses, the eval error, and where the weights and predictions live.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np

B, D, H = 2048, 64, 128


@jax.jit
def train_step(params, x, y):
    def loss_fn(p):
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)
    loss, g = jax.value_and_grad(loss_fn)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss


@jax.jit
def eval_step(params, x, y):
    pred = jnp.tanh(x @ params["w1"]) @ params["w2"]
    return pred, jnp.mean(jnp.abs(pred - y))


def main():
    rng = np.random.default_rng(0)
    params = {"w1": jnp.asarray(rng.standard_normal((D, H), dtype=np.float32) / 8),
              "w2": jnp.asarray(rng.standard_normal((H, 1), dtype=np.float32) / 8)}
    data = [(rng.standard_normal((B, D), dtype=np.float32), rng.standard_normal((B, 1), dtype=np.float32))
            for _ in range(5)]
    losses, placed = [], {}
    for i, (x, y) in enumerate(data):
        if i == 2:  # an eval batch the loader committed to device 5, beside the planned step's weights
            pred, err = eval_step(params, *(jax.device_put(a, jax.devices()[5]) for a in data[0]))
            placed["pred"] = sorted(d.id for d in pred.devices())
        if i >= 2:  # from here on the loader commits training batches to device 3
            x, y = jax.device_put(x, jax.devices()[3]), jax.device_put(y, jax.devices()[3])
        params, loss = train_step(params, x, y)
        losses.append(float(loss))
        placed[f"w1_after_{i}"] = sorted(d.id for d in params["w1"].devices())
    print(json.dumps({"losses": losses, "eval_error": float(err), "devices": placed}))


if __name__ == "__main__":
    main()
