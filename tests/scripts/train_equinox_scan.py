"""Equinox's scan-over-layers pattern, unchanged (it knows nothing of alpa_pass): layers built
stacked with ``eqx.filter_vmap``, ``lax.scan`` over them with ``eqx.partition`` / ``combine``, each
layer under ``jax.checkpoint``, ``optax.inject_hyperparams(adamw)``. Prints one JSON line: the
losses and, per parameter leaf, the devices its sharding spans and its spec."""
import json
import equinox as eqx, jax, jax.numpy as jnp, numpy as np, optax

H, L, B = 256, 4, 64

class Layer(eqx.Module):
    lin1: eqx.nn.Linear
    lin2: eqx.nn.Linear
    norm: eqx.nn.LayerNorm
    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.lin1 = eqx.nn.Linear(H, 2 * H, key=k1); self.lin2 = eqx.nn.Linear(2 * H, H, key=k2)
        self.norm = eqx.nn.LayerNorm(H)
    def __call__(self, x):
        return x + self.lin2(jax.nn.gelu(self.lin1(self.norm(x))))

class Net(eqx.Module):
    layers: Layer
    head: eqx.nn.Linear
    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.layers = eqx.filter_vmap(Layer)(jax.random.split(k1, L))
        self.head = eqx.nn.Linear(H, H, key=k2)
    def __call__(self, x):
        dyn, static = eqx.partition(self.layers, eqx.is_array)
        @jax.checkpoint
        def f(x, d):
            return eqx.combine(d, static)(x), None
        x, _ = jax.lax.scan(f, x, dyn)
        return self.head(x)

opt = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3, weight_decay=1e-2)

@eqx.filter_jit
def train_step(model, opt_state, x, y):
    def loss(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)
    l, g = eqx.filter_value_and_grad(loss)(model)
    u, opt_state = opt.update(g, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, u), opt_state, l

def main():
    model = Net(jax.random.key(0))
    opt_state = opt.init(eqx.filter(model, eqx.is_array))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, H), dtype=np.float32); y = rng.standard_normal((B, H), dtype=np.float32)
    losses = []
    for _ in range(4):
        model, opt_state, l = train_step(model, opt_state, x, y)
        losses.append(float(l))
    leaves = jax.tree.leaves(eqx.filter(model, eqx.is_array))
    print(json.dumps({"losses": losses, "params": [{"devices": len(a.sharding.device_set), "spec": str(getattr(a.sharding, "spec", None))} for a in leaves]}))

if __name__ == "__main__":
    main()
