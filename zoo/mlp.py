"""A stack of Dense+ReLU layers with an MSE loss.

Params: a list of ``{"kernel": [in, out], "bias": [out]}``, one per layer; ReLU after every layer
but the last. Batch: ``{"x": [batch, in_dim], "y": [batch, out_dim]}``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from zoo import train_step_for


@dataclasses.dataclass(frozen=True)
class Config:
    num_layers: int = 4
    hidden: int = 64
    batch: int = 16
    in_dim: int | None = None   # default: hidden
    out_dim: int | None = None  # default: hidden

    @property
    def dims(self) -> list[int]:
        """Feature sizes at each layer boundary (num_layers + 1 entries)."""
        inner = [self.hidden] * (self.num_layers - 1)
        return [self.in_dim or self.hidden, *inner, self.out_dim or self.hidden]


def init(key, config: Config):
    dims = config.dims
    keys = jax.random.split(key, config.num_layers)
    return [
        {
            "kernel": jax.random.normal(k, (d_in, d_out), jnp.float32) / jnp.sqrt(d_in),
            "bias": jnp.full((d_out,), 0.01, jnp.float32),
        }
        for k, d_in, d_out in zip(keys, dims[:-1], dims[1:])
    ]


def apply(params, x, boundary: Callable[[], None] | None = None):
    """``boundary``: called after every hidden layer's ReLU (``alpa_pass.mark_pipeline_boundary``)."""
    for i, layer in enumerate(params):
        x = x @ layer["kernel"] + layer["bias"]
        if i + 1 < len(params):
            x = jax.nn.relu(x)
            if boundary is not None:
                boundary()
    return x


def make_loss_fn(boundary: Callable[[], None] | None = None):
    def loss_fn(params, batch):
        pred = apply(params, batch["x"], boundary)
        return jnp.mean((pred - batch["y"]) ** 2)

    return loss_fn


loss_fn = make_loss_fn()


def make_train_step(optimizer, config: Config | None = None):
    """``config`` is accepted for a signature like the other models' (the loss does not depend on it)."""
    return train_step_for(loss_fn, optimizer)


def make_batch(key, config: Config):
    kx, ky = jax.random.split(key)
    dims = config.dims
    return {
        "x": jax.random.normal(kx, (config.batch, dims[0]), jnp.float32),
        "y": jax.random.normal(ky, (config.batch, dims[-1]), jnp.float32),
    }
