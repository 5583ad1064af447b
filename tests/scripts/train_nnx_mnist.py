"""The flax NNX MNIST tutorial's shape: an ``nnx.Conv`` / ``avg_pool`` / ``Linear`` CNN,
``nnx.Optimizer(wrt=nnx.Param)``, an ``nnx.MultiMetric`` (Average loss, Accuracy) updated inside
the ``nnx.jit`` train and eval steps, reset between them. It knows nothing of alpa_pass. Prints
one JSON line: the losses and, per parameter leaf, the devices its sharding spans and its spec."""
import json
from functools import partial

import jax
import numpy as np
import optax
from flax import nnx

class CNN(nnx.Module):
    def __init__(self, *, rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.avg_pool = partial(nnx.avg_pool, window_shape=(2, 2), strides=(2, 2))
        self.linear1 = nnx.Linear(3136, 256, rngs=rngs)
        self.linear2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        x = self.avg_pool(nnx.relu(self.conv1(x)))
        x = self.avg_pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)
        return self.linear2(nnx.relu(self.linear1(x)))


def loss_fn(model, batch):
    logits = model(batch["image"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean(), logits


@nnx.jit
def train_step(model, optimizer, metrics, batch):
    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])
    optimizer.update(model, grads)


@nnx.jit
def eval_step(model, metrics, batch):
    loss, logits = loss_fn(model, batch)
    metrics.update(loss=loss, logits=logits, labels=batch["label"])


def main():
    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3, 0.9), wrt=nnx.Param)
    metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
    rng = np.random.default_rng(0)
    losses, evals = [], []
    for step in range(4):
        batch = {"image": rng.standard_normal((32, 28, 28, 1), dtype=np.float32),
                 "label": rng.integers(0, 10, (32,), dtype=np.int32)}
        train_step(model, optimizer, metrics, batch)
        losses.append(float(metrics.compute()["loss"]))
        if step % 2 == 1:
            metrics.reset()
            eval_step(model, metrics, batch)
            evals.append({"loss": float(metrics.compute()["loss"])})
            metrics.reset()
    print(json.dumps({"losses": losses, "evals": evals, "params": [
        {"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))}
        for l in jax.tree.leaves(nnx.state(model, nnx.Param))]}))


if __name__ == "__main__":
    main()
