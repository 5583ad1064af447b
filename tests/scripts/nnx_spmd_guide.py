"""flax NNX's guide to scaling up on several devices, as written there for flax 0.12: a model whose
parameters carry partitioning metadata (``nnx.with_partitioning``, ``sharding=``), created sharded
by an ``nnx.jit`` init under ``jax.set_mesh`` (``get_partition_spec`` + ``with_sharding_constraint``),
an ``nnx.Optimizer`` made there too, a batch ``jax.device_put`` with ``P('data', None)`` and an
``nnx.jit`` train step called outside the mesh context. It knows nothing of alpa_pass. Prints one
JSON line: the losses and, per parameter, the blocks its devices hold (device id -> index)."""
import json

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))


class DotReluDot(nnx.Module):
    def __init__(self, depth: int, rngs: nnx.Rngs):
        init_fn = nnx.initializers.lecun_normal()
        self.dot1 = nnx.Linear(depth, depth, kernel_init=nnx.with_partitioning(init_fn, (None, "model")),
                               use_bias=False, rngs=rngs)
        self.w2 = nnx.Param(init_fn(rngs.params(), (depth, depth)), sharding=("model", None))

    def __call__(self, x):
        return jnp.dot(jax.nn.relu(self.dot1(x)), self.w2[...])


@nnx.jit
def create_sharded_model():
    model = DotReluDot(512, rngs=nnx.Rngs(0))
    state = nnx.state(model)
    nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
    return model


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return ((model(x) - y) ** 2).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def blocks(a):
    return {str(d.id): [[s.start or 0, s.stop or n] for s, n in zip(idx, a.shape)]
            for d, idx in sorted(a.sharding.devices_indices_map(a.shape).items(), key=lambda t: t[0].id)}


def main():
    with jax.set_mesh(mesh):
        model = create_sharded_model()
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    data = NamedSharding(mesh, P("data", None))
    x = jax.device_put(jax.random.normal(jax.random.key(1), (16, 512)), data)
    y = jax.device_put(jax.random.normal(jax.random.key(2), (16, 512)), data)
    losses = [float(train_step(model, optimizer, x, y)) for _ in range(4)]
    print(json.dumps({"losses": losses, "blocks": {"dot1": blocks(model.dot1.kernel[...]),
                                                   "w2": blocks(model.w2[...])}}))


if __name__ == "__main__":
    main()
