"""Small models in plain jax + optax (``zoo.gpt_scan`` also in flax linen), shared by tests/, benchmarks/
and examples/.

Every model module (``zoo.gpt``, ``zoo.gpt_scan``, ``zoo.mlp``, ``zoo.moe``) exposes the same four functions:

  ``init(key, config) -> params``                      a pytree of f32 arrays
  ``loss_fn(params, batch) -> scalar``                 f32 loss (default config)
  ``make_train_step(optimizer, config=Config())``      ``train_step(state, batch) -> (state, loss)``
                                                       with ``state = (params, opt_state)``
  ``make_batch(key, config) -> batch``                 a dict of arrays

and a frozen ``Config`` dataclass with small defaults. ``zoo.pipeline`` has the same GPT and MLP
with ``alpa_pass.mark_pipeline_boundary()`` between layers, for PipeshardParallel.
"""
from __future__ import annotations

from typing import Callable

import jax
import optax


def train_step_for(loss_fn: Callable, optimizer: optax.GradientTransformation,
                   value_and_grad: Callable = jax.value_and_grad) -> Callable:
    """One optimizer step of ``loss_fn``: ``train_step((params, opt_state), batch) -> (state, loss)``.

    ``value_and_grad``: ``jax.value_and_grad``, or ``alpa_pass.value_and_grad`` for a step that
    PipeshardParallel pipelines (``zoo.pipeline.make_step``).
    """

    def train_step(state, batch):
        params, opt_state = state
        loss, grads = value_and_grad(loss_fn)(params, batch)
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


def setup(model, config, steps: int, optimizer: optax.GradientTransformation | None = None):
    """``(train_step, state, batches)`` of ``model`` (a zoo module) at ``config``, with the keys every
    test and script uses: parameters from key 0, batch ``i`` from key ``100 + i`` (``steps`` of them).

    ``optimizer`` defaults to :func:`default_optimizer`.
    """
    optimizer = default_optimizer() if optimizer is None else optimizer
    state = init_state(model.init(jax.random.key(0), config), optimizer)
    batches = [model.make_batch(jax.random.key(100 + i), config) for i in range(steps)]
    return model.make_train_step(optimizer, config), state, batches
