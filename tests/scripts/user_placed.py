"""Arrays placed by hand, as flax's guide to scaling up does: parameters ``jax.device_put`` on the
user's 2x4 mesh ``('data', 'model')`` (Megatron-style column / row splits), each batch put with
``P('data')``, and a plain ``jax.jit`` step (no in_shardings); a flax linen MLP in a ``TrainState``
with adamw. It knows nothing of alpa_pass. Prints one JSON line: the losses and, per parameter,
the blocks its devices hold (device id -> index), which say the layout whatever mesh it is on."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

STEPS = 4


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(512)(x))
        x = nn.relu(nn.Dense(512)(x))
        return nn.Dense(10)(x)


@jax.jit
def train_step(state, x, y):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def layout(path, leaf, mesh):
    name = jax.tree_util.keystr(path)
    if leaf.ndim == 1:
        return NamedSharding(mesh, P("model") if "Dense_2" not in name else P())
    return NamedSharding(mesh, P(None, "model") if "Dense_2" not in name else P("model", None))


def blocks(a):
    return {str(d.id): [[s.start or 0, s.stop or n] for s, n in zip(idx, a.shape)]
            for d, idx in sorted(a.sharding.devices_indices_map(a.shape).items(), key=lambda t: t[0].id)}


def main():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    model = MLP()
    params = model.init(jax.random.key(0), jnp.ones((1, 64)))["params"]
    params = jax.device_put(params, jax.tree_util.tree_map_with_path(lambda p, a: layout(p, a, mesh), params))
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3))
    rng = np.random.default_rng(0)
    data = NamedSharding(mesh, P("data"))
    losses = []
    for _ in range(STEPS):
        x = jax.device_put(rng.standard_normal((32, 64), dtype=np.float32), data)
        y = jax.device_put(rng.integers(0, 10, (32,)), data)
        state, loss = train_step(state, x, y)
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "blocks": {jax.tree_util.keystr(p): blocks(a) for p, a in
                                                   jax.tree_util.tree_flatten_with_path(state.params)[0]}}))


if __name__ == "__main__":
    main()
