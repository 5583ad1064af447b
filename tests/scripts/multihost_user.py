"""A multi-host training script as people write one (MaxText / flax style); it knows nothing of
alpa_pass: ``jax.distributed.initialize()`` first, a global mesh from ``jax.make_mesh``, each
process loading only its slice of the batch and assembling the global batch with
``jax.make_array_from_process_local_data``, a flax linen MLP in a ``TrainState`` with adamw and a
plain ``jax.jit`` step. Every rank prints one JSON line: the losses, the first kernel's spec and
device count, and what a second ``jax.distributed.initialize`` asking for 3 processes raised."""
import json

import jax

jax.distributed.initialize()

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax.training import train_state  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

GLOBAL_BATCH, FEATURES, STEPS = 32, 64, 4


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


def main():
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    batch_sharding = NamedSharding(mesh, P("data"))
    model = MLP()
    params = model.init(jax.random.key(0), jnp.ones((1, FEATURES)))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3))
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((STEPS, GLOBAL_BATCH, FEATURES), dtype=np.float32)
    ys = rng.integers(0, 10, (STEPS, GLOBAL_BATCH))
    per_process = GLOBAL_BATCH // jax.process_count()
    mine = slice(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)
    losses = []
    for i in range(STEPS):
        x = jax.make_array_from_process_local_data(batch_sharding, xs[i][mine], (GLOBAL_BATCH, FEATURES))
        y = jax.make_array_from_process_local_data(batch_sharding, ys[i][mine], (GLOBAL_BATCH,))
        state, loss = train_step(state, x, y)
        losses.append(float(loss))
    kernel = state.params["Dense_1"]["kernel"].sharding
    try:
        jax.distributed.initialize(num_processes=3)
        again = "ran"
    except Exception as e:  # noqa: BLE001 (the type is the point)
        again = type(e).__name__
    print(json.dumps({"losses": losses, "kernel_spec": str(kernel.spec), "kernel_devices": len(kernel.device_set),
                      "initialize_again": again}))


if __name__ == "__main__":
    main()
