"""flax NNX scan over layers, unchanged (it knows nothing of alpa_pass): the stack created with
``nnx.split_rngs`` + ``nnx.vmap``, run with ``nnx.scan`` over ``nnx.remat`` blocks, trained with
``nnx.jit`` and ``nnx.Optimizer``. Prints one JSON line: the losses and, per parameter leaf, the
devices its sharding spans and its spec."""
import json
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx

H, L, B = 256, 4, 64

class Block(nnx.Module):
    def __init__(self, rngs):
        self.lin1 = nnx.Linear(H, 2 * H, rngs=rngs)
        self.lin2 = nnx.Linear(2 * H, H, rngs=rngs)
        self.norm = nnx.LayerNorm(H, rngs=rngs)
    def __call__(self, x):
        return x + self.lin2(nnx.gelu(self.lin1(self.norm(x))))

class Net(nnx.Module):
    def __init__(self, rngs):
        @nnx.split_rngs(splits=L)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block(rngs)
        self.blocks = make(rngs)
        self.head = nnx.Linear(H, H, rngs=rngs)
    def __call__(self, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        @nnx.remat
        def body(block, x):
            return block(x)
        return self.head(body(self.blocks, x))

model = Net(nnx.Rngs(0))
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
    x = rng.standard_normal((B, H), dtype=np.float32); y = rng.standard_normal((B, H), dtype=np.float32)
    losses = [float(train_step(model, optimizer, x, y)) for _ in range(4)]
    params = nnx.state(model, nnx.Param)
    print(json.dumps({"losses": losses, "params": [{"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))} for l in jax.tree.leaves(params)]}))

if __name__ == "__main__":
    main()
