"""Build a pipeshard step: trace, layers, stages, then plan and compile every stage function.

``compile_pipeshard(fn, args, method)`` returns a ``PipeshardProgram``: per stage a forward and a
backward executable (planned by the intra-op planner on the stage's submesh), and one apply
executable (the rest of the train step, e.g. the optimizer, on the accumulated gradients) planned
on the whole cluster mesh.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal

from alpa_pass.errors import ShardingError
from alpa_pass.pipeline import layers as layer_mod
from alpa_pass.pipeline import stages as stage_mod
from alpa_pass.pipeline.options import AutoStageOption, ManualStageOption, PipeshardParallel
from alpa_pass.pipeline.program import StageFunctions, build_programs
from alpa_pass.pipeline.schedule import clock, stage_orders
from alpa_pass.pipeline.trace import TracedStep, eval_eqns, trace_step
from alpa_pass.plan.planner import plan_and_compile


@dataclasses.dataclass
class CompiledStage:
    """One stage: its spec, program, functions and executables (with flat in/out shardings)."""

    spec: object
    program: object
    functions: StageFunctions
    fwd: object
    bwd: object
    fwd_plan: object
    bwd_plan: object

    def in_shardings(self, which: str) -> list:
        return list(jax.tree.leaves(getattr(self, which).input_shardings[0]))


@dataclasses.dataclass
class PipeshardProgram:
    traced: TracedStep
    method: PipeshardParallel
    layers: list
    stages: list          # CompiledStage
    apply: object
    apply_plan: object
    ticks: list
    grad_users: list      # per marker input: stages reading it as a parameter
    timings: dict


def micro_avals(traced_args, batch_mask, num_micro: int, fn_name: str):
    """Marker-input avals with the batch leaves cut to one micro-batch (checks divisibility)."""
    out = []
    for x, is_batch in zip(traced_args, batch_mask):
        shape = tuple(np.shape(x))
        if is_batch:
            if not shape or shape[0] % num_micro:
                raise ShardingError(f"PipeshardParallel(num_micro_batches={num_micro}): a batch leaf of "
                                    f"{fn_name} has shape {shape}, whose axis 0 is not divisible by "
                                    f"{num_micro}; pick a micro-batch count that divides the batch")
            shape = (shape[0] // num_micro, *shape[1:])
        out.append(jax.ShapeDtypeStruct(shape, x.dtype))
    return out


def compile_pipeshard(fn, args, method: PipeshardParallel) -> PipeshardProgram:
    """Trace, cut into layers and stages, plan and compile (see the module docstring)."""
    timings = {}
    t = time.perf_counter()
    leaves = jax.tree.leaves(args)
    traced = trace_step(fn, args, method.batch_argnums, lambda marker_args, mask: micro_avals(
        marker_args, mask, method.num_micro_batches, getattr(fn, "__qualname__", "fn")))
    layers = (layer_mod.manual_layers(traced.loss) if method.layer_option == "manual" else
              layer_mod.auto_layers(traced.loss, method.layer_option.layer_num, method.layer_option.eps))
    timings["trace"] = time.perf_counter() - t
    cluster = method.resolved_mesh()
    t = time.perf_counter()
    specs = _stage_specs(traced, layers, cluster, method)
    timings["stage_search"] = time.perf_counter() - t
    t = time.perf_counter()
    programs = build_programs(traced.loss, layers, [(s.start, s.stop) for s in specs], traced.info.diff_mask)
    consts = dict(zip(traced.loss.jaxpr.constvars, traced.loss.consts))
    marker_avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in traced.loss.jaxpr.invars]
    stages = _compile_stages(programs, specs, consts, marker_avals, method)
    grad_users = [[i for i, c in enumerate(stages)
                   if any(c.program.sources[v] == ("arg", k) for v in c.program.param_inputs)]
                  for k in range(len(marker_avals))]
    apply_fn = _apply_fn(traced, grad_users, method.num_micro_batches)
    apply_args = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves]
    loss_aval = traced.loss.jaxpr.outvars[0].aval
    apply_args += [jax.ShapeDtypeStruct((), loss_aval.dtype)] * method.num_micro_batches
    for k, users in enumerate(grad_users):
        aval = traced.step.jaxpr.invars[traced.marker_arg[k]].aval
        apply_args += [jax.ShapeDtypeStruct(aval.shape, aval.dtype)] * len(users)
    apply_plan, apply = plan_and_compile(apply_fn, tuple(apply_args), cluster, method.option)
    timings["compile"] = time.perf_counter() - t
    ticks = clock(stage_orders(method.pipeline_schedule, len(stages), method.num_micro_batches))
    return PipeshardProgram(traced, method, layers, stages, apply, apply_plan, ticks, grad_users, timings)


def _stage_specs(traced, layers, cluster, method):
    option = method.stage_option
    if isinstance(option, ManualStageOption):
        return stage_mod.manual_stages(len(layers), cluster, option)
    if isinstance(option, AutoStageOption):
        from alpa_pass.pipeline.stage_search import auto_stages

        return auto_stages(traced, layers, cluster, method)
    return stage_mod.uniform_stages(len(layers), cluster, option.num_stages)


def _compile_stages(programs, specs, consts, marker_avals, method) -> list[CompiledStage]:
    out = []
    for prog, spec in zip(programs, specs):
        fns = StageFunctions(prog, consts)
        ins = [_aval(v, prog, marker_avals) for v in (*prog.diff_inputs, *prog.nondiff_inputs)]
        fwd_plan, fwd = plan_and_compile(fns.forward, tuple(ins), spec.mesh, method.option)
        fwd_outs = jax.eval_shape(fns.forward, *ins)
        res = list(fwd_outs[fns.num_outputs():])
        cts = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)
               for v in prog.float_outputs for _ in range(len(prog.consumers[v]))]
        acc = [_aval(v, prog, marker_avals) for v in prog.param_inputs]
        bwd_plan, bwd = plan_and_compile(fns.backward, tuple(res + cts + acc), spec.mesh, method.option)
        out.append(CompiledStage(spec, prog, fns, fwd, bwd, fwd_plan, bwd_plan))
    return out


def _aval(v, prog, marker_avals):
    src = prog.sources[v]
    if src[0] == "arg":
        return marker_avals[src[1]]
    return jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype)


def _apply_fn(traced: TracedStep, grad_users, num_micro: int):
    """apply(*step_leaves, *micro_losses, *grad_parts) -> step output leaves: the train step with
    its gradient marker replaced by the mean loss and the mean accumulated gradients."""
    step = traced.step
    n_in = len(step.jaxpr.invars)
    marker = traced.marker
    diff = [k for k, d in enumerate(traced.info.diff_mask) if d]

    def apply(*flat):
        losses = flat[n_in:n_in + num_micro]
        parts = list(flat[n_in + num_micro:])
        grads = []
        for k, users in enumerate(grad_users):
            mine, parts = parts[:len(users)], parts[len(users):]
            if k in diff:
                aval = marker.invars[k].aval
                total = sum(mine, jnp.zeros(aval.shape, aval.dtype))
                grads.append(total / num_micro)
        env = dict(zip(step.jaxpr.constvars, step.consts))
        env.update(zip(step.jaxpr.invars, flat[:n_in]))
        at = step.jaxpr.eqns.index(marker)
        eval_eqns(step.jaxpr.eqns[:at], env)
        env.update(zip(marker.outvars, [sum(losses[1:], losses[0]) / num_micro, *grads]))
        eval_eqns(step.jaxpr.eqns[at + 1:], env)
        return tuple(v.val if isinstance(v, Literal) else env[v] for v in step.jaxpr.outvars)

    return apply
