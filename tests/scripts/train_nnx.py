"""A flax NNX training script that knows nothing of alpa_pass (run it unchanged): ``nnx.jit``,
``nnx.Optimizer``, ``nnx.Rngs`` (typed keys), Dropout and BatchNorm. Prints one JSON line: the
losses and, per parameter leaf, the devices its sharding spans and its spec."""
import json
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx

HIDDEN, BATCH, STEPS = 256, 64, 4

class MLP(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(HIDDEN, HIDDEN, rngs=rngs)
        self.bn = nnx.BatchNorm(HIDDEN, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.l2 = nnx.Linear(HIDDEN, HIDDEN, rngs=rngs)
    def __call__(self, x):
        return self.l2(self.drop(nnx.relu(self.bn(self.l1(x)))))

model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

@nnx.jit
def train_step(model, optimizer, x, y):
    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    y = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    losses = [float(train_step(model, optimizer, x, y)) for _ in range(STEPS)]
    params = nnx.state(model, nnx.Param)
    print(json.dumps({"losses": losses, "params": [{"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))} for l in jax.tree.leaves(params)]}))


if __name__ == "__main__":
    main()
