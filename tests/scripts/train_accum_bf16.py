"""MaxText-style flax linen LM step: bf16 compute over f32 parameters, ``nn.remat`` with a
checkpoint policy, ``MultiHeadDotProductAttention`` with a causal mask, gradient accumulation
inside the step (``lax.scan`` over microbatches), ``optax.chain(clip_by_global_norm,
adamw(warmup_cosine_decay_schedule))``, ``TrainState``, a jitted init. It knows nothing of
alpa_pass. Prints one JSON line: the losses and, per parameter leaf, the devices its sharding
spans and its spec."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

V, D, H, L, T, B, MICRO, STEPS = 256, 128, 4, 2, 32, 32, 4, 4


POLICY = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
        h = nn.MultiHeadDotProductAttention(num_heads=H, dtype=jnp.bfloat16)(h, h, mask=mask)
        x = x + h
        h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
        h = nn.Dense(4 * D, dtype=jnp.bfloat16)(h)
        h = nn.gelu(h)
        return x + nn.Dense(D, dtype=jnp.bfloat16)(h)


class LM(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        emb = nn.Embed(V, D, dtype=jnp.bfloat16)
        x = emb(tokens)
        for _ in range(L):
            x = nn.remat(Block, policy=POLICY)()(x)
        x = nn.LayerNorm(dtype=jnp.bfloat16)(x)
        return nn.Dense(V, dtype=jnp.float32)(x)


model = LM()


def loss_fn(params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


@jax.jit
def train_step(state, tokens):
    micro = tokens.reshape(MICRO, B // MICRO, *tokens.shape[1:])

    def body(acc, mb):
        loss, g = jax.value_and_grad(loss_fn)(state.params, mb)
        return (acc[0] + loss, jax.tree.map(jnp.add, acc[1], g)), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (loss, grads), _ = jax.lax.scan(body, (jnp.float32(0), zeros), micro)
    grads = jax.tree.map(lambda g: g / MICRO, grads)
    return state.apply_gradients(grads=grads), loss / MICRO


def main():
    tokens0 = jnp.zeros((B, T + 1), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(0), tokens0[:, :-1])["params"]
    sched = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 2, 10)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.1))
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(STEPS):
        tokens = rng.integers(0, V, (B, T + 1), dtype=np.int32)
        state, loss = train_step(state, tokens)
        losses.append(float(loss))
    print(json.dumps({"losses": losses, "params": [
        {"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))}
        for l in jax.tree.leaves(state.params)]}))


if __name__ == "__main__":
    main()
