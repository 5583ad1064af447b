"""The zoo GPT with its blocks as one scanned layer stack, and the unrolled twin of each.

Two ways to write it, as user code does:

* ``Config(flax=True)``: a flax linen GPT whose blocks are one ``nn.scan`` over a ``Block``
  module (params stacked ``[layers, ...]`` under ``params["blocks"]``), optionally
  ``nn.scan(nn.remat(Block))`` (``remat=True``), as MaxText's ``scan_layers`` and T5X write it.
  ``scan=False`` is its unrolled twin: the same ``Block`` called ``layers`` times
  (``params["block_0"]``, ``params["block_1"]``, ...).
* ``Config(flax=False)``: :mod:`zoo.gpt` with ``params["blocks"]`` stacked ``[layers, ...]`` and
  read by ``lax.scan`` (``jax.checkpoint`` around the body with ``remat=True``). ``scan=False`` is
  :mod:`zoo.gpt` itself; both take the same initial values (the scanned params are the unrolled
  ones stacked: :func:`stack_blocks`).

Same protocol as every zoo model (``init``, ``loss_fn``, ``make_train_step``, ``make_batch``,
``Config``); the batch is :func:`zoo.gpt.make_batch`'s.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from zoo import gpt, train_step_for


@dataclasses.dataclass(frozen=True)
class Config(gpt.Config):
    scan: bool = True    # one scan over the blocks (False: the unrolled twin)
    remat: bool = False  # rematerialise each block in the backward pass (nn.remat / jax.checkpoint)
    flax: bool = True    # flax linen modules (False: zoo.gpt's plain-jax functions)

    def twin(self) -> "Config":
        """The same model with its blocks unrolled (``scan=False``)."""
        return dataclasses.replace(self, scan=False)


_INIT = nn.initializers.normal(0.02)


class Block(nn.Module):
    """Pre-LN causal self-attention + GELU MLP; ``(x, _) -> (x, None)`` as ``nn.scan`` calls it."""

    config: Config

    @nn.compact
    def __call__(self, x, _=None):
        c = self.config
        b, s, h = x.shape
        y = nn.LayerNorm(epsilon=1e-5, name="ln1")(x)
        q, k, v = (nn.Dense(h, use_bias=False, kernel_init=_INIT, name=n)(y).reshape(b, s, c.heads, h // c.heads)
                   for n in ("wq", "wk", "wv"))
        scores = jnp.einsum("bqnd,bknd->bnqk", q, k) / jnp.sqrt(jnp.float32(h // c.heads))
        scores = jnp.where(jnp.tril(jnp.ones((s, s), jnp.bool_)), scores, jnp.float32(-1e9))
        out = jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, h)
        x = x + nn.Dense(h, kernel_init=_INIT, name="wo")(out)
        y = nn.LayerNorm(epsilon=1e-5, name="ln2")(x)
        y = nn.Dense(h * c.mlp_ratio, kernel_init=_INIT, name="w1")(y)
        x = x + nn.Dense(h, kernel_init=_INIT, name="w2")(jax.nn.gelu(y))
        return x, None


class GPT(nn.Module):
    """Logits ``f32[batch, seq, vocab]`` of ``tokens`` (tied LM head)."""

    config: Config

    @nn.compact
    def __call__(self, tokens):
        c = self.config
        embed = nn.Embed(c.vocab, c.hidden, embedding_init=_INIT, name="wte")
        wpe = self.param("wpe", _INIT, (c.seq, c.hidden))
        x = embed(tokens) + wpe[None, : tokens.shape[1]]
        block = nn.remat(Block) if c.remat else Block
        if c.scan:
            stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True}, length=c.layers)
            x, _ = stack(c, name="blocks")(x, None)
        else:
            for i in range(c.layers):
                x, _ = block(c, name=f"block_{i}")(x, None)
        return embed.attend(nn.LayerNorm(epsilon=1e-5, name="ln_f")(x))


def stack_blocks(params: dict) -> dict:
    """:mod:`zoo.gpt` params with ``params["blocks"]`` (a list of per-block dicts) stacked into one
    dict of ``[layers, ...]`` arrays."""
    return {**params, "blocks": jax.tree.map(lambda *xs: jnp.stack(xs), *params["blocks"])}


def _lax_scan_logits(params, tokens, config: Config):
    x = params["wte"][tokens] + params["wpe"][None, : tokens.shape[1]]

    def body(x, p):
        x = x + gpt._attention(p, gpt._layer_norm(p["ln1"], x), config.heads)
        return x + gpt._mlp(p, gpt._layer_norm(p["ln2"], x)), None

    x, _ = lax.scan(jax.checkpoint(body) if config.remat else body, x, params["blocks"])
    return gpt._layer_norm(params["ln_f"], x) @ params["wte"].T


def init(key, config: Config = Config()):
    if not config.flax:
        params = gpt.init(key, config)
        return stack_blocks(params) if config.scan else params
    tokens = jnp.zeros((1, config.seq), jnp.int32)
    return GPT(config).init(key, tokens)["params"]


def make_loss_fn(config: Config = Config()):
    """Mean next-token cross-entropy of the model ``config`` describes."""
    if not config.flax and not config.scan:
        return gpt.make_loss_fn(config.heads)

    def loss_fn(params, batch):
        if config.flax:
            logits = GPT(config).apply({"params": params}, batch["tokens"])
        else:
            logits = _lax_scan_logits(params, batch["tokens"], config)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return jnp.mean(-jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1))

    return loss_fn


loss_fn = make_loss_fn()


def make_train_step(optimizer, config: Config = Config()):
    return train_step_for(make_loss_fn(config), optimizer)


make_batch = gpt.make_batch
