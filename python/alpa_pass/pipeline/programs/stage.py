"""Stage programs: which loss equations, inputs and outputs each stage has, and their functions.

A stage's forward ``fwd(*diff_inputs, *nondiff_inputs)`` returns
``(*float_outputs, *int_outputs, *aux_outputs, *residuals)`` (aux: the ``has_aux`` values it computes) (``jax.vjp`` residuals: the backward needs no
recomputation); its backward ``bwd(*residuals, *output_cotangent_parts, *grad_accumulators)``
returns ``(*activation_input_cotangents, *new_grad_accumulators)``: the parts of one output's
cotangent (one per consuming stage, plus 1.0 for the loss) are summed inside, and the gradients of
the parameters are added to the accumulators.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from alpa_pass.pipeline.trace.step import eval_eqns


def _is_float(v) -> bool:
    return jnp.issubdtype(v.aval.dtype, jnp.inexact)


@dataclasses.dataclass
class StageProgram:
    """Stage ``index``'s slice of the loss forward.

    Attributes:
      eqns: its equations, in order.
      diff_inputs: differentiated inputs (float activations, float parameters), then
      nondiff_inputs: the rest (batch leaves, integer values).
      sources: input var -> ("arg", marker input index) or ("act", producing stage).
      float_outputs / int_outputs: values later stages (or the loss) read.
      loss_output: index into float_outputs of the loss, or None.
      consumers: float output var -> stages reading it (in order).
      aux_outputs: indices of the loss's aux leaves this stage computes (not differentiated).
    """

    index: int
    eqns: list
    diff_inputs: list
    nondiff_inputs: list
    sources: dict
    float_outputs: list
    int_outputs: list
    loss_output: int | None
    consumers: dict
    aux_outputs: list = dataclasses.field(default_factory=list)

    @property
    def param_inputs(self) -> list:
        return [v for v in self.diff_inputs if self.sources[v][0] == "arg"]

    @property
    def act_inputs(self) -> list:
        return [v for v in self.diff_inputs if self.sources[v][0] == "act"]

    def ct_parts(self, v) -> int:
        return len(self.consumers[v]) + (self.float_outputs.index(v) == self.loss_output)


def build_programs(loss, layers, ranges, diff_mask) -> list[StageProgram]:
    """Cut ``layers`` (lists of equations) into stages by layer ``ranges``."""
    arg_index = {v: i for i, v in enumerate(loss.jaxpr.invars)}
    stage_eqns = [[e for layer in layers[a:b] for e in layer] for a, b in ranges]
    producer = {}
    for s, eqns in enumerate(stage_eqns):
        for e in eqns:
            producer.update((v, s) for v in e.outvars)
    consts = set(loss.jaxpr.constvars)
    reads = []
    for s, eqns in enumerate(stage_eqns):
        seen = []
        for e in eqns:
            for v in e.invars:
                if not isinstance(v, Literal) and v not in consts and producer.get(v, -1) != s and v not in seen:
                    seen.append(v)
        reads.append(seen)
    loss_var = loss.jaxpr.outvars[0]
    aux_vars = loss.jaxpr.outvars[1:]
    programs = []
    for s, eqns in enumerate(stage_eqns):
        sources = {v: ("arg", arg_index[v]) if v in arg_index else ("act", producer[v]) for v in reads[s]}
        diff = [v for v in reads[s] if _is_float(v) and (sources[v][0] == "act" or diff_mask[sources[v][1]])]
        outs = [v for t in range(s + 1, len(stage_eqns)) for v in reads[t] if producer.get(v) == s]
        if producer.get(loss_var) == s:
            outs.append(loss_var)
        outs = list(dict.fromkeys(outs))
        floats = [v for v in outs if _is_float(v)]
        consumers = {v: [t for t in range(s + 1, len(stage_eqns)) if v in reads[t]] for v in floats}
        programs.append(StageProgram(
            s, eqns, diff, [v for v in reads[s] if v not in diff], sources, floats,
            [v for v in outs if not _is_float(v)], floats.index(loss_var) if loss_var in floats else None,
            consumers, [j for j, v in enumerate(aux_vars) if producer.get(v) == s]))
    return programs


class StageFunctions:
    """The forward and backward functions of one StageProgram (see the module docstring)."""

    def __init__(self, program: StageProgram, consts: dict, aux_vars=()):
        self.program = program
        self.aux_vars = [aux_vars[j] for j in program.aux_outputs]
        self.consts = consts
        self.res_tree = None

    def _run(self, diff, nondiff):
        p = self.program
        env = dict(self.consts)
        env.update(zip(p.diff_inputs, diff))
        env.update(zip(p.nondiff_inputs, nondiff))
        eval_eqns(p.eqns, env)
        return (tuple(env[v] for v in p.float_outputs),
                tuple(env[v] for v in (*p.int_outputs, *self.aux_vars)))

    def forward(self, *flat):
        n = len(self.program.diff_inputs)
        outs, vjp_fn, ints = jax.vjp(lambda *d: self._run(d, flat[n:]), *flat[:n], has_aux=True)
        res, self.res_tree = jax.tree.flatten(vjp_fn)
        return (*outs, *ints, *res)

    def num_outputs(self) -> int:
        return len(self.program.float_outputs) + len(self.program.int_outputs) + len(self.aux_vars)

    def backward(self, *flat):
        p = self.program
        n_res = self.res_tree.num_leaves
        vjp_fn = jax.tree.unflatten(self.res_tree, flat[:n_res])
        at, cts = n_res, []
        for i, v in enumerate(p.float_outputs):
            k = len(p.consumers[v])
            total = sum(flat[at:at + k], jnp.zeros(v.aval.shape, v.aval.dtype))
            if i == p.loss_output:
                total = total + jnp.ones(v.aval.shape, v.aval.dtype)
            cts.append(total)
            at += k
        grads = vjp_fn(tuple(cts))
        acc = flat[at:]
        by_var = dict(zip(p.diff_inputs, grads))
        new_acc = tuple(a + by_var[v] for a, v in zip(acc, p.param_inputs))
        return (*(by_var[v] for v in p.act_inputs), *new_acc)
