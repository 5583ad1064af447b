"""A GPT: token + position embeddings, pre-LN causal multi-head attention + GELU MLP blocks,
final LayerNorm, tied or untied LM head, softmax cross-entropy.

Batch: ``{"tokens": int32[batch, seq], "targets": int32[batch, seq]}``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from zoo import train_step_for


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 64
    seq: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4
    batch: int = 8
    tied: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _dense(key, shape, scale=0.02):
    return scale * jax.random.normal(key, shape, jnp.float32)


def _ln_params(hidden):
    return {"scale": jnp.ones((hidden,), jnp.float32), "bias": jnp.zeros((hidden,), jnp.float32)}


def _block_params(key, c: Config):
    kq, kk, kv, ko, k1, k2 = jax.random.split(key, 6)
    h, f = c.hidden, c.hidden * c.mlp_ratio
    return {
        "ln1": _ln_params(h),
        "wq": _dense(kq, (h, h)), "wk": _dense(kk, (h, h)), "wv": _dense(kv, (h, h)),
        "wo": _dense(ko, (h, h)), "bo": jnp.zeros((h,), jnp.float32),
        "ln2": _ln_params(h),
        "w1": _dense(k1, (h, f)), "b1": jnp.zeros((f,), jnp.float32),
        "w2": _dense(k2, (f, h)), "b2": jnp.zeros((h,), jnp.float32),
    }


def init(key, config: Config):
    if config.hidden % config.heads:
        raise ValueError(f"hidden {config.hidden} must be divisible by heads {config.heads}")
    k_tok, k_pos, k_head, *k_blocks = jax.random.split(key, 3 + config.layers)
    params = {
        "wte": _dense(k_tok, (config.vocab, config.hidden)),
        "wpe": _dense(k_pos, (config.seq, config.hidden)),
        "blocks": [_block_params(k, config) for k in k_blocks],
        "ln_f": _ln_params(config.hidden),
    }
    if not config.tied:
        params["lm_head"] = _dense(k_head, (config.hidden, config.vocab))
    return params


def _layer_norm(p, x, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def _attention(p, x, heads):
    b, s, h = x.shape
    split = lambda t: t.reshape(b, s, heads, h // heads)  # noqa: E731
    q, k, v = split(x @ p["wq"]), split(x @ p["wk"]), split(x @ p["wv"])
    scores = jnp.einsum("bqnd,bknd->bnqk", q, k) / jnp.sqrt(jnp.float32(h // heads))
    causal = jnp.tril(jnp.ones((s, s), jnp.bool_))
    scores = jnp.where(causal, scores, jnp.float32(-1e9))
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bnqk,bknd->bqnd", probs, v).reshape(b, s, h)
    return out @ p["wo"] + p["bo"]


def _mlp(p, x):
    return jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def apply(params, tokens, heads, boundary: Callable[[], None] | None = None):
    """Logits ``f32[batch, seq, vocab]`` of ``tokens`` (``int32[batch, seq]``).

    ``boundary``: called between consecutive blocks (``alpa_pass.mark_pipeline_boundary``).
    """
    x = params["wte"][tokens] + params["wpe"][None, : tokens.shape[1]]
    for i, p in enumerate(params["blocks"]):
        x = x + _attention(p, _layer_norm(p["ln1"], x), heads)
        x = x + _mlp(p, _layer_norm(p["ln2"], x))
        if boundary is not None and i + 1 < len(params["blocks"]):
            boundary()
    x = _layer_norm(params["ln_f"], x)
    head = params["lm_head"] if "lm_head" in params else params["wte"].T
    return x @ head


def make_loss_fn(heads: int, boundary: Callable[[], None] | None = None):
    """Mean next-token cross-entropy for a model with ``heads`` attention heads (``boundary``: see
    :func:`apply`)."""

    def loss_fn(params, batch):
        logits = apply(params, batch["tokens"], heads, boundary)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)
        return jnp.mean(nll)

    return loss_fn


loss_fn = make_loss_fn(Config().heads)


def make_train_step(optimizer, config: Config = Config()):
    return train_step_for(make_loss_fn(config.heads), optimizer)


def make_batch(key, config: Config):
    tokens = jax.random.randint(key, (config.batch, config.seq + 1), 0, config.vocab, jnp.int32)
    return {"tokens": tokens[:, :-1], "targets": tokens[:, 1:]}
