"""Alpa's ``alpa.model.model_util``: ``TrainState`` (flax's, with an optional float32 master copy
of float16 parameters and a ``dynamic_scale`` slot) and ``DynamicScale`` (flax's dynamic loss
scaling, differentiating through ``alpa_pass.value_and_grad`` so that pipelines and gradient
accumulation see where the gradients are complete). Needs flax."""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.training import train_state

from alpa_pass.pipeline.trace.markers import value_and_grad


class TrainState(train_state.TrainState):
    """flax's TrainState; with ``create(..., use_master_copy=True)`` the parameters are float16 and
    the optimizer updates a float32 ``master_copy`` of them (Alpa's mixed precision)."""

    master_copy: Any = None
    dynamic_scale: Any = None

    def apply_gradients(self, *, grads, **kwargs):
        master = self.params if self.master_copy is None else self.master_copy
        updates, opt_state = self.tx.update(grads, self.opt_state, master)
        new_master = optax.apply_updates(master, updates)
        if self.master_copy is None:
            params, master_copy = new_master, None
        else:
            params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float16), new_master)
            master_copy = new_master
        return self.replace(step=self.step + 1, params=params, master_copy=master_copy, opt_state=opt_state,
                            **kwargs)

    @classmethod
    def create(cls, *, apply_fn, params, tx, use_master_copy: bool = False, **kwargs):
        master_copy = None
        if use_master_copy:
            master_copy = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
            params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float16), params)
        opt_state = tx.init(params if master_copy is None else master_copy)
        return cls(step=np.array(0, np.int32), apply_fn=apply_fn, params=params, master_copy=master_copy,
                   tx=tx, opt_state=opt_state, **kwargs)


class DynamicScaleResult(NamedTuple):
    dynamic_scale: "DynamicScale"
    finite: jax.Array
    aux: Any
    grad: Any


class DynamicScale(struct.PyTreeNode):
    """Dynamic loss scaling (flax's ``DynamicScale``): the loss is multiplied by ``scale`` before
    differentiation and the gradients divided by it; after ``growth_interval`` finite steps the
    scale grows by ``growth_factor``, after a non-finite one it shrinks by ``backoff_factor``.
    ``value_and_grad(fun)(*args)`` returns ``(new dynamic_scale, finite, value, grads)``."""

    growth_factor: float = struct.field(pytree_node=False, default=2.0)
    backoff_factor: float = struct.field(pytree_node=False, default=0.5)
    growth_interval: int = struct.field(pytree_node=False, default=2000)
    fin_steps: Any = 0
    scale: Any = 65536.0

    def value_and_grad(self, fun, argnums=0, has_aux: bool = False, axis_name=None):
        if axis_name is not None:
            raise ValueError("DynamicScale.value_and_grad(axis_name=...): alpa_pass averages gradients over "
                             "the devices itself (no pmap axis); drop axis_name")

        @functools.wraps(fun)
        def scaled(*args):
            out = fun(*args)
            return (self.scale * out[0], out[1]) if has_aux else self.scale * out

        grad_fn = value_and_grad(scaled, argnums, has_aux)

        def wrapper(*args):
            value, grads = grad_fn(*args)
            value = (value[0] / self.scale, value[1]) if has_aux else value / self.scale
            grads = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32) / self.scale, grads)
            finite = jnp.array(True)
            for g in jax.tree.leaves(grads):
                finite &= jnp.all(jax.lax.is_finite(g))
            grow = self.fin_steps == self.growth_interval
            fin_scale = jnp.where(grow & finite, self.scale * self.growth_factor, self.scale)
            new_scale = jnp.where(finite, fin_scale, self.scale * self.backoff_factor)
            new_fin_steps = jnp.where(grow | ~finite, 0, self.fin_steps + 1)
            return DynamicScaleResult(self.replace(fin_steps=new_fin_steps, scale=new_scale), finite, value, grads)

        return wrapper
