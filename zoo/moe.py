"""A GShard-style mixture-of-experts layer with an MSE loss.

Tokens come in groups: ``x: f32[groups, group_size, hidden]``. A linear gate picks the top-1 or
top-2 experts per token; each expert takes at most ``capacity`` tokens per group (the rest are
dropped). Dispatch and combine are einsums with one-hot masks ``[groups, group_size, experts,
capacity]``; expert FFN weights have a leading expert dim (``w1: [E, H, F]``, ``w2: [E, F, H]``).
Output = ``x + moe(x)``; loss = MSE to ``y`` + ``aux_weight`` * GShard load-balancing loss.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from zoo import train_step_for


@dataclasses.dataclass(frozen=True)
class Config:
    experts: int = 8
    hidden: int = 32
    ffn: int = 64
    groups: int = 8
    group_size: int = 16
    top_k: int = 2
    capacity_factor: float = 1.25
    aux_weight: float = 0.01

    @property
    def capacity(self) -> int:
        """Tokens per expert per group: ``ceil(capacity_factor * top_k * group_size / experts)``."""
        return max(1, math.ceil(self.capacity_factor * self.top_k * self.group_size / self.experts))


def init(key, config: Config):
    kg, k1, k2 = jax.random.split(key, 3)
    e, h, f = config.experts, config.hidden, config.ffn
    return {
        "gate": jax.random.normal(kg, (h, e), jnp.float32) / math.sqrt(h),
        "w1": jax.random.normal(k1, (e, h, f), jnp.float32) / math.sqrt(h),
        "b1": jnp.zeros((e, f), jnp.float32),
        "w2": jax.random.normal(k2, (e, f, h), jnp.float32) / math.sqrt(f),
    }


def route(gates, top_k: int, capacity: int):
    """GShard routing.

    Args:
      gates: ``f32[G, S, E]`` softmax gate probabilities.
    Returns:
      ``(combine f32[G, S, E, C], dispatch f32[G, S, E, C], aux_loss f32[])``. ``dispatch`` is the
      one-hot mask (token s goes to slot c of expert e); ``combine`` weighs it by the gate value.
    """
    num_experts = gates.shape[-1]
    remaining = gates
    filled = jnp.zeros(gates.shape[:1] + (1, num_experts), gates.dtype)  # [G, 1, E] slots used
    masks, values, positions = [], [], []
    for _ in range(top_k):
        choice = jax.nn.one_hot(jnp.argmax(remaining, axis=-1), num_experts, dtype=gates.dtype)
        pos = (jnp.cumsum(choice, axis=1) - 1.0 + filled) * choice  # slot index inside the expert
        mask = choice * (pos < capacity)
        filled = filled + jnp.sum(mask, axis=1, keepdims=True)
        masks.append(mask)
        values.append(jnp.sum(gates * mask, axis=-1))
        positions.append(jnp.sum(pos * mask, axis=-1).astype(jnp.int32))
        remaining = remaining * (1.0 - choice)
    denom = sum(values) + 1e-9 if top_k > 1 else 1.0
    combine = sum(
        (v / denom)[..., None, None] * m[..., None] * jax.nn.one_hot(p, capacity, dtype=gates.dtype)[..., None, :]
        for v, m, p in zip(values, masks, positions)
    )
    dispatch = (combine > 0).astype(gates.dtype)
    density = jnp.mean(masks[0], axis=1)            # [G, E] fraction routed (top-1)
    density_proxy = jnp.mean(gates, axis=1)         # [G, E] mean gate probability
    aux_loss = jnp.mean(density * density_proxy) * num_experts**2
    return combine, dispatch, aux_loss


def moe_layer(params, x, config: Config):
    """``x: f32[G, S, H] -> (f32[G, S, H], aux_loss)``."""
    gates = jax.nn.softmax(jnp.einsum("gsh,he->gse", x, params["gate"]), axis=-1)
    combine, dispatch, aux_loss = route(gates, config.top_k, config.capacity)
    expert_in = jnp.einsum("gsec,gsh->egch", dispatch, x)
    hidden = jax.nn.relu(jnp.einsum("egch,ehf->egcf", expert_in, params["w1"]) + params["b1"][:, None, None, :])
    expert_out = jnp.einsum("egcf,efh->egch", hidden, params["w2"])
    return jnp.einsum("gsec,egch->gsh", combine, expert_out), aux_loss


def make_loss_fn(config: Config):
    def loss_fn(params, batch):
        out, aux = moe_layer(params, batch["x"], config)
        return jnp.mean((batch["x"] + out - batch["y"]) ** 2) + config.aux_weight * aux

    return loss_fn


loss_fn = make_loss_fn(Config())


def make_train_step(optimizer, config: Config = Config()):
    return train_step_for(make_loss_fn(config), optimizer)


def make_batch(key, config: Config):
    kx, ky = jax.random.split(key)
    shape = (config.groups, config.group_size, config.hidden)
    return {"x": jax.random.normal(kx, shape, jnp.float32), "y": jax.random.normal(ky, shape, jnp.float32)}
