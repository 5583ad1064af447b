"""An Equinox training step that checks its loss with ``eqx.error_if`` (run it unchanged).

A 2-layer MLP, ``eqx.filter_jit`` step with an SGD update; the loss is checked finite. Two good
steps, then a batch with a NaN: plain jax raises ``EquinoxRuntimeError`` from the step (the check's
callback, in a ``cond`` branch, raises), and the script catches it, as training loops that skip a
bad batch do, then takes one more good step. Prints one JSON line: the losses, the error's type
and message, and the devices of a parameter.
"""
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

BATCH, D = 2048, 64


@eqx.filter_jit
def step(model, x, y):
    loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
    loss = eqx.error_if(loss, ~jnp.isfinite(loss), "non-finite loss")
    return eqx.apply_updates(model, jax.tree.map(lambda g: -1e-3 * g, grads)), loss


def main():
    model = eqx.nn.MLP(D, 1, 256, 2, key=jax.random.key(0))
    rng = np.random.RandomState(0)
    x = rng.randn(BATCH, D).astype(np.float32)
    y = np.sin(x[:, :1]).astype(np.float32)
    losses = []
    for _ in range(2):
        model, loss = step(model, x, y)
        losses.append(float(loss))
    bad = x.copy()
    bad[3, 5] = np.nan
    error = None
    try:
        _, loss = step(model, bad, y)
        float(loss)
    except Exception as e:  # noqa: BLE001  (what the user sees)
        error = [type(e).__name__, "non-finite loss" in str(e)]
    model, loss = step(model, x, y)
    losses.append(float(loss))
    print(json.dumps({"losses": losses, "error": error, "devices": len(model.layers[0].weight.devices())}))


main()
