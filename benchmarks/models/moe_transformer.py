"""A GShard MoE transformer (Alpa's MoE suite): GPT blocks whose MLP is (in every block by default,
which gives Alpa's parameter counts) a top-2 mixture of experts (``zoo.moe.moe_layer``) over token groups of ``group_size``.

Batch: ``{"tokens": int32[batch, seq], "targets": int32[batch, seq]}``; loss = next-token
cross-entropy + ``aux_weight`` * the GShard load-balancing loss of each MoE block.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from zoo import gpt, moe


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 512
    seq: int = 64
    hidden: int = 128
    heads: int = 4
    layers: int = 2
    experts: int = 8
    group_size: int = 64
    batch: int = 16
    aux_weight: float = 0.01
    moe_every: int = 1   # block i is a MoE block when i % moe_every == moe_every - 1

    def moe_config(self) -> moe.Config:
        return moe.Config(experts=self.experts, hidden=self.hidden, ffn=4 * self.hidden,
                          groups=self.batch * self.seq // self.group_size, group_size=self.group_size,
                          top_k=2, capacity_factor=2.0, aux_weight=self.aux_weight)

    def gpt_config(self) -> gpt.Config:
        return gpt.Config(vocab=self.vocab, seq=self.seq, hidden=self.hidden, heads=self.heads,
                          layers=self.layers, batch=self.batch, tied=True)


def _is_moe(i: int, config: Config) -> bool:
    return i % config.moe_every == config.moe_every - 1


def init(key, config: Config):
    """GPT parameters; in MoE blocks the MLP weights are replaced by ``"moe"`` experts."""
    if (config.batch * config.seq) % config.group_size:
        raise ValueError(f"batch*seq={config.batch * config.seq} must be divisible by group_size {config.group_size}")
    k_gpt, *k_moe = jax.random.split(key, 1 + config.layers)
    params = gpt.init(k_gpt, config.gpt_config())
    for i, block in enumerate(params["blocks"]):
        if _is_moe(i, config):
            for name in ("w1", "b1", "w2", "b2"):
                del block[name]
            block["moe"] = moe.init(k_moe[i], config.moe_config())
    return params


def _block(p, x, config: Config):
    x = x + gpt._attention(p, gpt._layer_norm(p["ln1"], x), config.heads)
    h = gpt._layer_norm(p["ln2"], x)
    if "moe" not in p:
        return x + gpt._mlp(p, h), 0.0
    b, s, d = h.shape
    out, aux = moe.moe_layer(p["moe"], h.reshape(-1, config.group_size, d), config.moe_config())
    return x + out.reshape(b, s, d), aux


def make_loss_fn(config: Config):
    def loss_fn(params, batch):
        tokens = batch["tokens"]
        x = params["wte"][tokens] + params["wpe"][None, : tokens.shape[1]]
        aux_total = 0.0
        for p in params["blocks"]:
            x, aux = _block(p, x, config)
            aux_total = aux_total + aux
        logits = gpt._layer_norm(params["ln_f"], x) @ params["wte"].T
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)
        return jnp.mean(nll) + config.aux_weight * aux_total

    return loss_fn


def make_batch(key, config: Config):
    return gpt.make_batch(key, config.gpt_config())


def _alpa(hidden, layers, experts, batch=128):
    return Config(vocab=32000, seq=1024, hidden=hidden, heads=16, layers=layers, experts=experts,
                  group_size=2048, batch=batch)


SIZES = {
    "small": Config(),
    "380M": _alpa(768, 8, 8),
    "690M": _alpa(768, 8, 16),
    "1.3B": _alpa(768, 16, 16),
    "2.4B": _alpa(1024, 16, 16),
    "10B": _alpa(1536, 16, 32),
    "27B": _alpa(2048, 16, 48),
    "70B": _alpa(2048, 32, 64),
}

_EXPERT = ("['moe']['w1']", "['moe']['b1']", "['moe']['w2']")


def megatron_dim(path: str) -> int | None:
    """Tensor-parallel split of the leaf at ``path``: Megatron for the dense layers; experts split
    their FFN dim (``w1 [E,H,F]`` -> F, ``b1 [E,F]`` -> F, ``w2 [E,F,H]`` -> F); the gate replicated."""
    expert_dims = dict(zip(_EXPERT, (2, 1, 1)))
    for suffix, dim in expert_dims.items():
        if path.endswith(suffix):
            return dim
    if "['moe']" in path:
        return None
    from benchmarks.models.gpt_sizes import megatron_dim as dense_dim

    return dense_dim(path)


def expert_dim(path: str) -> int | None:
    """Expert parallelism: the expert dim (0) of the expert weights; everything else replicated."""
    return 0 if path.endswith(_EXPERT) else None
