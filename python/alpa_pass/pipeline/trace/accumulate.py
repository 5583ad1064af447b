"""Gradient accumulation inside one intra-op plan: ``ShardParallel(num_micro_batches=k)``.

Contract: ``accumulating_step(fn, batch_argnums, k)`` returns a function computing ``fn(*args)``
with its one ``alpa_pass.value_and_grad`` / ``alpa_pass.grad`` call evaluated as Alpa's
``ShardParallel(num_micro_batches=k)`` does: the call's batch inputs (leaves of the step's
``batch_argnums`` arguments) are cut along axis 0 into ``k`` equal micro-batches, strided:
micro-batch ``i`` holds rows ``i, i + k, i + 2k, ...`` (``x.reshape(-1, k, ...)``, then axis 1 is
scanned). A batch split on axis 0 over the devices then gives every device its share of every
micro-batch, each device accumulating over its own rows as data parallelism does, with no
communication; contiguous micro-batches (``x.reshape(k, -1, ...)``, how PipeshardParallel cuts
them between stages) would put micro-batch ``i`` on ``1/k`` of the devices, so a data-parallel
plan would all-gather the batch first. Equal-sized micro-batches average to the same loss and
gradients either way (exact for losses that are means over the batch). The loss and the
gradients are computed per micro-batch in one ``lax.scan``, the gradients summed over
the micro-batches and divided by ``k``, the loss the mean over them, and aux leaves (``has_aux``)
combined like PipeshardParallel does (:func:`~alpa_pass.pipeline.programs.apply.aux_rule`).
Everything outside the call (the optimizer update) runs once per step on the whole batch's
results. The returned function is an ordinary JAX function: it is planned, emitted and compiled
like any train step (``driver.planning``, ``emit.plan_emission``), so the accumulation loop's
gradient partial sums get the same treatment as a hand-written ``lax.scan`` accumulation.

The marker is found with the pipeline's tracer (:func:`~alpa_pass.pipeline.trace.step.trace_step`),
so the same rules hold: one call at the top level of the step, its inputs arguments of the step
(or values the loss closes over, hoisted), the loss a float scalar.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Literal, jaxpr_as_fun

from alpa_pass.pipeline.compile.pipeshard import micro_avals
from alpa_pass.pipeline.programs.apply import aux_rule
from alpa_pass.pipeline.trace.step import eval_eqns, num_aux, trace_step
from alpa_pass.trace.lower import fn_name


def accumulating_step(fn, batch_argnums: tuple, num_micro: int):
    """``fn`` with its gradient call run as a ``lax.scan`` over ``num_micro`` micro-batches
    (module docstring). Raises TraceError (no or several gradient calls, a marker input computed
    in the step) and ShardingError (a batch leaf whose axis 0 ``num_micro`` does not divide) when
    the returned function is traced."""

    @functools.wraps(fn)
    def step(*args):
        traced = trace_step(fn, args, batch_argnums,
                            lambda avals, mask: micro_avals(avals, mask, num_micro, fn_name(fn),
                                                                    method="ShardParallel"))
        leaves, _ = jax.tree.flatten(args)
        jaxpr = traced.step.jaxpr
        env = dict(zip(jaxpr.constvars, traced.step.consts))
        env.update(zip(jaxpr.invars, leaves))
        for eqn in jaxpr.eqns:
            if eqn is traced.marker:
                inputs = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
                env.update(zip(eqn.outvars, _accumulate(traced, inputs, num_micro)))
            else:
                eval_eqns([eqn], env)
        outs = [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]
        return jax.tree.unflatten(traced.out_tree, outs)

    return step


def _accumulate(traced, inputs: list, num_micro: int) -> list:
    """The marker's outputs (loss, aux leaves, gradients) from a ``lax.scan`` over micro-batches."""
    info, loss_fn = traced.info, jaxpr_as_fun(traced.loss)
    mask, diff = traced.batch_mask, info.diff_mask
    n_aux = num_aux(info)
    micro_out = [v.aval for v in traced.loss.jaxpr.outvars]
    rules = [aux_rule(micro_out[1 + j], info.out_avals[1 + j], num_micro) for j in range(n_aux)]
    stacked = [jnp.swapaxes(x.reshape(x.shape[0] // num_micro, num_micro, *x.shape[1:]), 0, 1)
               for x, b in zip(inputs, mask) if b]  # [k, B/k, ...]: micro-batch i = rows i::k

    def micro_step(carry, xs):
        it = iter(xs)
        full = [next(it) if b else x for x, b in zip(inputs, mask)]
        d_idx = [i for i, d in enumerate(diff) if d]

        def loss_of(d_vals):
            vals = list(full)
            for i, v in zip(d_idx, d_vals):
                vals[i] = v
            out = loss_fn(*vals)
            return out[0], out[1:]

        (loss, aux), grads = jax.value_and_grad(loss_of, has_aux=True)([full[i] for i in d_idx])
        loss_sum, aux_sums, grad_sums = carry
        aux_sums = [s + a for s, a, r in zip(aux_sums, aux, rules) if r != "concat"]
        grad_sums = [s + g for s, g in zip(grad_sums, grads)]
        return (loss_sum + loss, aux_sums, grad_sums), [a for a, r in zip(aux, rules) if r == "concat"]

    grad_avals = info.out_avals[1 + n_aux:]
    init = (jnp.zeros((), micro_out[0].dtype),
            [jnp.zeros(a.shape, a.dtype) for a, r in zip(micro_out[1:], rules) if r != "concat"],
            [jnp.zeros(a.shape, a.dtype) for a in grad_avals])
    (loss_sum, aux_sums, grad_sums), ys = jax.lax.scan(micro_step, init, stacked)
    sums, cats = iter(aux_sums), iter(ys)
    aux_out = []
    for r in rules:
        if r == "concat":
            y = next(cats)
            aux_out.append(jnp.swapaxes(y, 0, 1).reshape(y.shape[0] * y.shape[1], *y.shape[2:]))  # rows back in order
        else:
            s = next(sums)
            aux_out.append(s / num_micro if r == "mean" else s)
    return [loss_sum / num_micro, *aux_out, *(g / num_micro for g in grad_sums)]
