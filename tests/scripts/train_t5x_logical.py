"""A flax linen transformer LM written MaxText/T5X style: every parameter carries logical-axis
metadata (``nn.with_logical_partitioning``, rules from ``nn.logical_axis_rules``, no mesh), the
boxed ``nn.LogicallyPartitioned`` parameters stay in the TrainState, which a ``jax.jit``-ed init
makes. It knows nothing of alpa_pass. Prints one JSON line: the losses and, per parameter leaf,
its path, the devices its sharding spans and its spec."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

VOCAB, EMBED, MLP_DIM, HEADS, SEQ, BATCH, LAYERS, STEPS = 512, 128, 256, 4, 32, 32, 2, 4
RULES = (("batch", "data"), ("vocab", "model"), ("embed", None), ("mlp", "model"),
         ("heads", "model"), ("kv", None), ("length", None))

dense_init = nn.initializers.lecun_normal()


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm(scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                         bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(x)
        h = nn.MultiHeadDotProductAttention(
            num_heads=HEADS,
            kernel_init=nn.with_logical_partitioning(dense_init, ("embed", "heads", "kv")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("heads", "kv")),
            out_kernel_init=nn.with_logical_partitioning(dense_init, ("heads", "kv", "embed")),
            out_bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        )(h, h, mask=nn.make_causal_mask(jnp.ones(x.shape[:2])))
        x = x + h
        h = nn.LayerNorm(scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                         bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(x)
        h = nn.Dense(MLP_DIM, kernel_init=nn.with_logical_partitioning(dense_init, ("embed", "mlp")),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)))(h)
        h = nn.gelu(h)
        h = nn.Dense(EMBED, kernel_init=nn.with_logical_partitioning(dense_init, ("mlp", "embed")),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(h)
        return x + h


class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        emb = nn.Embed(VOCAB, EMBED, embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(0.02), ("vocab", "embed")))
        x = emb(tokens)
        for _ in range(LAYERS):
            x = Block()(x)
        x = nn.LayerNorm(scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
                         bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)))(x)
        return nn.Dense(VOCAB, kernel_init=nn.with_logical_partitioning(dense_init, ("embed", "vocab")),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)))(x)


@jax.jit
def train_step(state, tokens):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def main():
    rng = np.random.default_rng(0)
    model = LM()
    tx = optax.adamw(1e-3, weight_decay=0.01)

    @jax.jit
    def init_state(key):
        params = model.init(key, jnp.ones((1, SEQ), jnp.int32))["params"]  # boxed: kept so
        return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)

    with nn.logical_axis_rules(RULES):
        state = init_state(jax.random.key(0))
    losses = []
    for _ in range(STEPS):
        tokens = rng.integers(0, VOCAB, (BATCH, SEQ + 1), dtype=np.int32)
        state, loss = train_step(state, tokens)
        losses.append(float(loss))
    leaves = jax.tree_util.tree_flatten_with_path(state.params)[0]
    print(json.dumps({"losses": losses, "params": [
        {"path": jax.tree_util.keystr(path), "devices": len(leaf.sharding.device_set),
         "spec": str(getattr(leaf.sharding, "spec", None))} for path, leaf in leaves]}))


if __name__ == "__main__":
    main()
