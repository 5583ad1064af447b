"""A model Keras ships, unchanged: ``keras.applications.MobileNetV3Small`` (random weights, 10
classes, 32x32 inputs: depthwise convolutions, BatchNormalization, hard-swish, squeeze-excite,
Dropout) trained with ``model.fit`` on the JAX backend; the script knows nothing of alpa_pass.
Prints one JSON line: the per-batch losses and, per trainable variable, the devices its value's
sharding spans and its spec."""
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

BATCH, SAMPLES, EPOCHS = 16, 64, 2


class BatchLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def main():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, SAMPLES)
    model = keras.applications.MobileNetV3Small(input_shape=(32, 32, 3), weights=None, classes=10)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="sparse_categorical_crossentropy")
    record = BatchLosses()
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[record])
    print(json.dumps({"losses": record.losses, "params": [
        {"devices": len(v.value.sharding.device_set), "spec": str(getattr(v.value.sharding, "spec", None))}
        for v in model.trainable_variables]}))


if __name__ == "__main__":
    main()
