"""A flax linen language model written with flax's own layers (run it unchanged): ``nn.Embed`` with
its tied output head ``Embed.attend``, pre-LayerNorm blocks of ``nn.SelfAttention`` and ``nn.Dense``,
a jitted init, ``TrainState`` with ``optax.adamw`` and ``softmax_cross_entropy_with_integer_labels``.
Prints one JSON line: the losses, each parameter's device count and the embedding table's sharding
(devices, spec)."""
import json

import flax.linen as nn
import jax, numpy as np, optax
from flax.training import train_state

VOCAB, HIDDEN, SEQ, BATCH, STEPS = 8192, 64, 32, 16, 4


class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(VOCAB, HIDDEN)
        x = embed(tokens)
        for _ in range(2):
            x = x + nn.SelfAttention(num_heads=4, deterministic=True)(nn.LayerNorm()(x))
            x = x + nn.Dense(HIDDEN)(nn.gelu(nn.Dense(4 * HIDDEN)(nn.LayerNorm()(x))))
        return embed.attend(nn.LayerNorm()(x))


model = LM()


@jax.jit
def create_state(rng, tokens):
    params = model.init(rng, tokens)["params"]
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adamw(1e-3))


@jax.jit
def train_step(state, tokens):
    def loss_fn(params):
        logits = state.apply_fn({"params": params}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


def main():
    tokens = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ + 1)).astype(np.int32)
    state, losses = create_state(jax.random.key(0), tokens[:, :-1]), []
    for _ in range(STEPS):
        state, loss = train_step(state, tokens)
        losses.append(float(loss))
    table = state.params["Embed_0"]["embedding"]
    params = [{"path": jax.tree_util.keystr(path), "devices": len(leaf.sharding.device_set)}
              for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)]
    print(json.dumps({"losses": losses, "params": params,
                      "embedding": {"devices": len(table.sharding.device_set),
                                    "spec": str(getattr(table.sharding, "spec", None))}}))


if __name__ == "__main__":
    main()
