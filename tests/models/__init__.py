"""Small test models in plain jax + optax (no flax).

Every model module exposes the same four functions:

  ``init(key, config) -> params``        a pytree of f32 arrays
  ``loss_fn(params, batch) -> scalar``   f32 loss
  ``make_train_step(optimizer)``         ``train_step(state, batch) -> (state, loss)`` with
                                         ``state = (params, opt_state)``
  ``make_batch(key, config) -> batch``   a dict of arrays

and a frozen ``Config`` dataclass with small defaults.
"""
from __future__ import annotations

from typing import Callable

import jax
import optax


def train_step_for(loss_fn: Callable, optimizer: optax.GradientTransformation) -> Callable:
    """One optimizer step of ``loss_fn``: ``train_step((params, opt_state), batch) -> (state, loss)``."""

    def train_step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), loss

    return train_step


def init_state(params, optimizer: optax.GradientTransformation):
    """``(params, optimizer.init(params))``: the ``state`` argument of a train step."""
    return params, optimizer.init(params)


def default_optimizer() -> optax.GradientTransformation:
    """Adam whose update is insensitive to round-off in near-zero gradients.

    Adam's first step is ``lr * g / (|g| + eps)``: with the default ``eps=1e-8`` a gradient that is
    round-off noise (~1e-9) becomes a full ``lr``-sized step of random sign, so a sharded run (other
    summation order) can never match a single-device run to 1e-6. ``eps=1e-3`` bounds the
    sensitivity ``d update / d g <= lr / eps`` to 1.
    """
    return optax.adam(learning_rate=1e-3, eps=1e-3)
