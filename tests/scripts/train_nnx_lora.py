"""LoRA fine-tuning of a small flax NNX transformer (it knows nothing of alpa_pass): Embed,
MultiHeadAttention, LayerNorm, an MLP of ``nnx.LoRALinear`` and an ``nnx.LoRA`` around an
``nnx.Linear`` head. Only ``nnx.LoRAParam`` is trained (``Optimizer(wrt=LoRAParam)``,
``DiffState``). Prints one JSON line: losses, per parameter leaf the devices and spec, and whether
the base weights stayed put."""
import json

import jax
import numpy as np
import optax
from flax import nnx

V, H, HEADS, T, B, R, STEPS = 256, 128, 4, 16, 32, 8, 4

class Block(nnx.Module):
    def __init__(self, rngs):
        self.ln1 = nnx.LayerNorm(H, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=HEADS, in_features=H, decode=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(H, rngs=rngs)
        self.up = nnx.LoRALinear(H, 2 * H, lora_rank=R, rngs=rngs)
        self.down = nnx.LoRALinear(2 * H, H, lora_rank=R, rngs=rngs)
    def __call__(self, x, mask):
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.down(nnx.gelu(self.up(self.ln2(x))))

class LM(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(V, H, rngs=rngs)
        self.b1 = Block(rngs)
        self.b2 = Block(rngs)
        self.ln = nnx.LayerNorm(H, rngs=rngs)
        base_head = nnx.Linear(H, V, rngs=rngs)
        self.head = nnx.LoRA(H, R, V, base_module=base_head, rngs=rngs)
    def __call__(self, tokens):
        mask = nnx.make_causal_mask(tokens)
        x = self.embed(tokens)
        x = self.b2(self.b1(x, mask), mask)
        return self.head(self.ln(x))

model = LM(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.LoRAParam)

def is_base_param(path, v):
    return isinstance(v, nnx.Param) and not isinstance(v, nnx.LoRAParam)

@nnx.jit
def train_step(model, optimizer, tokens, targets):
    def loss_fn(model):
        logits = model(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
    loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
    optimizer.update(model, grads)
    return loss

def main():
    rng = np.random.default_rng(0)
    data = rng.integers(0, V, (B, T + 1)).astype(np.int32)
    tokens, targets = data[:, :-1], data[:, 1:]
    base_before = [np.asarray(l) for l in jax.tree.leaves(nnx.state(model, is_base_param))]
    lora_before = [np.asarray(l) for l in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))]
    losses = [float(train_step(model, optimizer, tokens, targets)) for _ in range(STEPS)]
    base_after = [np.asarray(l) for l in jax.tree.leaves(nnx.state(model, is_base_param))]
    lora_after = [np.asarray(l) for l in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))]
    params = nnx.state(model, nnx.Param)
    print(json.dumps({"losses": losses,
                      "base_unchanged": all(np.array_equal(a, b) for a, b in zip(base_before, base_after)),
                      "n_base": len(base_before), "n_lora": len(lora_before),
                      "lora_changed": sum(not np.array_equal(a, b) for a, b in zip(lora_before, lora_after)),
                      "params": [{"devices": len(l.sharding.device_set), "spec": str(getattr(l.sharding, "spec", None))} for l in jax.tree.leaves(params)]}))

if __name__ == "__main__":
    main()
