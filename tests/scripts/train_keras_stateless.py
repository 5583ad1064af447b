"""Keras 3 custom JAX training loop (the Keras guide's pattern): ``model.stateless_call`` and
``optimizer.stateless_apply`` inside a ``jax.jit`` step over (trainable, non-trainable,
optimizer) variables, BatchNormalization state threaded through. It knows nothing of alpa_pass.
Prints one JSON line: the losses and, per parameter leaf, the devices its sharding spans and its
spec."""
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import jax  # noqa: E402
import numpy as np  # noqa: E402
import keras  # noqa: E402

B, D, STEPS = 64, 128, 4
keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((D,)), keras.layers.Dense(256, activation="relu"), keras.layers.BatchNormalization(),
    keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = keras.optimizers.Adam(1e-3)
optimizer.build(model.trainable_variables)


def compute_loss_and_updates(tv, ntv, x, y):
    y_pred, ntv = model.stateless_call(tv, ntv, x, training=True)
    return loss_obj(y, y_pred), ntv


grad_fn = jax.value_and_grad(compute_loss_and_updates, has_aux=True)


@jax.jit
def train_step(state, data):
    tv, ntv, ov = state
    x, y = data
    (loss, ntv), grads = grad_fn(tv, ntv, x, y)
    tv, ov = optimizer.stateless_apply(ov, grads, tv)
    return loss, (tv, ntv, ov)


def main():
    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(STEPS):
        x = rng.standard_normal((B, D), dtype=np.float32)
        y = rng.integers(0, 10, (B,), dtype=np.int32)
        loss, state = train_step(state, (x, y))
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "params": [
        {"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))}
        for l in jax.tree.leaves(state[0])]}))


if __name__ == "__main__":
    main()
