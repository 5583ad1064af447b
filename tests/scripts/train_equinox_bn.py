"""A stateful Equinox CNN: ``eqx.nn.make_with_state``, ``BatchNorm`` (its running statistics in an
``eqx.nn.State``, batch axis named by a ``vmap``), ``Conv2d``, ``filter_jit``,
``filter_value_and_grad(has_aux=True)``, optax adam. It knows nothing of alpa_pass. Prints one
JSON line: the losses and, per parameter leaf, the devices its sharding spans and its spec."""
import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

class Net(eqx.Module):
    conv: eqx.nn.Conv2d
    bn: eqx.nn.BatchNorm
    conv2: eqx.nn.Conv2d
    lin: eqx.nn.Linear

    def __init__(self, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv = eqx.nn.Conv2d(3, 32, 3, padding=1, key=k1)
        self.bn = eqx.nn.BatchNorm(32, axis_name="batch", mode="batch")
        self.conv2 = eqx.nn.Conv2d(32, 32, 3, padding=1, key=k2)
        self.lin = eqx.nn.Linear(32 * 16 * 16, 10, key=k3)

    def __call__(self, x, state):
        x = self.conv(x)
        x, state = self.bn(x, state)
        x = jax.nn.relu(self.conv2(jax.nn.relu(x)))
        return self.lin(x.reshape(-1)), state


optim = optax.adam(1e-3)


@eqx.filter_jit
def train_step(model, state, opt_state, x, y):
    def loss_fn(m, s):
        logits, s = jax.vmap(m, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, s)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), s
    (loss, state), grads = eqx.filter_value_and_grad(loss_fn, has_aux=True)(model, state)
    updates, opt_state = optim.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), state, opt_state, loss


def main():
    model, state = eqx.nn.make_with_state(Net)(jax.random.key(0))
    opt_state = optim.init(eqx.filter(model, eqx.is_array))
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(4):
        x = jnp.asarray(rng.standard_normal((32, 3, 16, 16), dtype=np.float32))
        y = jnp.asarray(rng.integers(0, 10, (32,), dtype=np.int32))
        model, state, opt_state, loss = train_step(model, state, opt_state, x, y)
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "params": [
        {"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))}
        for l in jax.tree.leaves(eqx.filter(model, eqx.is_array))]}))


if __name__ == "__main__":
    main()
