"""A Keras 3 training script on the JAX backend that knows nothing of alpa_pass (run it unchanged):
Dense layers with Dropout and LayerNormalization, ``model.compile(optimizer="adam")`` and
``model.fit`` over 3 epochs with ``validation_data`` (Keras's jitted ``test_step`` after each
epoch), then ``model.evaluate`` and ``model.predict``. Prints one JSON line: the per-batch
losses, the validation losses, the evaluate loss, the sum of |predictions| and, per trainable
variable, the devices its value's sharding spans and its spec."""
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

HIDDEN, BATCH, SAMPLES, EPOCHS = 256, 64, 256, 3


class BatchLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def main():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SAMPLES, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((SAMPLES, HIDDEN), dtype=np.float32)
    model = keras.Sequential([keras.Input((HIDDEN,)),
                              keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.LayerNormalization(),
                              keras.layers.Dropout(0.1),
                              keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(HIDDEN)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    record = BatchLosses()
    xv = rng.standard_normal((SAMPLES, HIDDEN), dtype=np.float32)
    yv = rng.standard_normal((SAMPLES, HIDDEN), dtype=np.float32)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[record],
                        validation_data=(xv, yv))
    evaluated = model.evaluate(xv, yv, batch_size=BATCH, verbose=0)
    predicted = model.predict(xv, batch_size=BATCH, verbose=0)
    print(json.dumps({"losses": record.losses, "val_losses": [float(v) for v in history.history["val_loss"]],
                      "evaluate": float(evaluated), "predict_abs_sum": float(np.abs(predicted).sum()), "params": [
        {"devices": len(v.value.sharding.device_set), "spec": str(getattr(v.value.sharding, "spec", None))}
        for v in model.trainable_variables]}))


if __name__ == "__main__":
    main()
