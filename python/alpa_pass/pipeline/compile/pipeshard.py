"""Build a pipeshard step: trace, layers, stages, then plan and compile every stage function.

``compile_pipeshard(fn, args, method, donate_argnums)`` returns a ``PipeshardProgram``: per stage
a forward, a backward and an apply executable (the rest of the train step on that stage's
parameters: its optimizer update), each planned by the intra-op planner on the stage's submesh;
and, only when the step mixes values of several stages (global-norm clipping), a cross-stage
apply executable on the whole cluster mesh for those equations (see ``apply_sites``).

A loss whose layers are one scan over stacked ``[L, ...]`` parameters is cut into one scan per
piece (``trace.scan_split``), then the step is rewritten over per-piece leaves
(``trace.stacked_params``): each stage holds, differentiates and updates only its rows of every
stacked parameter and of the optimizer state updated with it. ``PipeshardProgram.split`` says how
the user's leaves map to those pieces; the executable cuts and joins them (``run.stacked``).
"""
from __future__ import annotations

import dataclasses
import time

import jax
from jax.extend.core import Literal

from alpa_pass.driver.jit import plan_and_compile
from alpa_pass.driver.request import donated_leaves
from alpa_pass.errors import ShardingError
from alpa_pass.pipeline.compile.apply import compile_apply, free_sharding, marker_layout
from alpa_pass.pipeline.options import AutoStageOption, ManualStageOption
from alpa_pass.pipeline.partition import layers as layer_mod
from alpa_pass.pipeline.partition import stages as stage_mod
from alpa_pass.pipeline.partition.schedule import clock, stage_orders
from alpa_pass.pipeline.partition.stage_search import auto_stages
from alpa_pass.pipeline.programs.apply import MarkerLayout, build_apply
from alpa_pass.pipeline.programs.stage import StageFunctions, build_programs
from alpa_pass.pipeline.trace.scan_split import check_splittable, layer_stack, piece_bounds, split_layer_stack
from alpa_pass.pipeline.trace.piece_loss import merge_pieces
from alpa_pass.pipeline.trace.stacked_params import StackSplit, split_stacked_params
from alpa_pass.pipeline.trace.step import TracedStep, trace_step
from alpa_pass.trace.lower import leaf_aval, output_ties


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
    """Everything a pipeshard step runs. ``apply``: the CompiledApply executables in run order;
    ``sites``: where each apply equation and value lives (``apply_sites.Sites``); ``free_sharding``:
    where FREE step outputs live (replicated over every stage's devices)."""

    traced: TracedStep
    method: object        # the PipeshardParallel
    layers: list
    stages: list          # CompiledStage
    apply: list           # CompiledApply
    sites: object
    free_sharding: object
    ticks: list
    layout: MarkerLayout
    timings: dict
    split: StackSplit | None = None  # how stacked step leaves are cut per piece (None: not cut)


def micro_avals(traced_args, batch_mask, num_micro: int, fn_name: str, method: str = "PipeshardParallel"):
    """Marker-input avals with the batch leaves cut to one micro-batch (checks divisibility;
    ``method`` names the front door in the error)."""
    out = []
    for x, is_batch in zip(map(leaf_aval, traced_args), batch_mask):
        shape = tuple(x.shape)
        if is_batch:
            if not shape or shape[0] % num_micro:
                raise ShardingError(f"{method}(num_micro_batches={num_micro}): a batch leaf of "
                                    f"{fn_name} has shape {shape}, whose axis 0 is not divisible by "
                                    f"{num_micro}; pick a micro-batch count that divides the batch")
            shape = (shape[0] // num_micro, *shape[1:])
        out.append(jax.ShapeDtypeStruct(shape, x.dtype, weak_type=x.weak_type))
    return out


def compile_pipeshard(fn, args, method, donate_argnums=()) -> PipeshardProgram:
    """Trace, cut into layers and stages, plan and compile (see the module docstring).
    ``donate_argnums``: positions of ``args`` whose parameter/optimizer-state buffers the apply
    executables donate."""
    timings = {}
    t = time.perf_counter()
    leaves = jax.tree.leaves(args)
    traced = trace_step(fn, args, method.batch_argnums, lambda marker_args, mask: micro_avals(
        marker_args, mask, method.num_micro_batches, getattr(fn, "__qualname__", "fn")))
    ties = dict(output_ties(args, jax.tree.unflatten(traced.out_tree, [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in traced.step.jaxpr.outvars])))
    donated = set(donated_leaves(args, donate_argnums))
    base, bounds = _split_layer_stack(traced, method)
    traced, split = (base, None) if bounds is None else split_stacked_params(base, bounds)
    layers = (layer_mod.manual_layers(traced.loss) if method.layer_option == "manual" else
              layer_mod.auto_layers(traced.loss, method.layer_option.layer_num, method.layer_option.eps))
    timings["trace"] = time.perf_counter() - t
    cluster = method.resolved_mesh()
    t = time.perf_counter()
    specs = _stage_specs(traced, layers, cluster, method)
    timings["stage_search"] = time.perf_counter() - t
    t = time.perf_counter()
    if split is not None:
        traced, split, layers = _merge_stage_pieces(base, traced, split, layers, specs)
        ties, donated, leaves = split.map_ties(ties), split.map_leaves(donated), split.split_avals(traced)
    programs = build_programs(traced.loss, layers, [(s.start, s.stop) for s in specs], traced.info.diff_mask)
    consts = dict(zip(traced.loss.jaxpr.constvars, traced.loss.consts))
    marker_avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in traced.loss.jaxpr.invars]
    stages = _compile_stages(programs, specs, consts, marker_avals, method, traced.loss.jaxpr.outvars[1:])
    layout = marker_layout(stages, len(marker_avals), method.num_micro_batches)
    apply_programs, sites = build_apply(traced, layout, donated, ties)
    apply = compile_apply(apply_programs, sites, traced, stages, cluster, method, leaves)
    timings["compile"] = time.perf_counter() - t
    ticks = clock(stage_orders(method.pipeline_schedule, len(stages), method.num_micro_batches))
    return PipeshardProgram(traced, method, layers, stages, apply, sites, free_sharding(stages), ticks, layout,
                            timings, split)


def _split_layer_stack(traced: TracedStep, method) -> tuple[TracedStep, list | None]:
    """``(traced', bounds)``: ``traced`` with the loss's scanned layer stack cut into as many scans
    as the layer and stage options need (``trace.scan_split``) and the pieces' boundaries;
    ``(traced, None)`` when the loss has no top-level scan or already has enough layers."""
    loss, stack = traced.loss, layer_stack(traced.loss)
    length = 0 if stack is None else int(stack.params["length"])
    if method.layer_option != "manual":  # the layer DP clusters the pieces with the other equations
        n = method.layer_option.layer_num
        pieces, wanted = min(n, length), f"AutoLayerOption(layer_num={n})"
    else:
        have, option = len(layer_mod.manual_layers(loss)), method.stage_option
        if isinstance(option, ManualStageOption):
            need, wanted = sum(len(s) for s in option.forward_stage_layer_ids), "ManualStageOption"
        elif isinstance(option, AutoStageOption):  # let the stage DP cut between any iterations
            need, wanted = have - 1 + min(length, method.resolved_mesh().num_devices), "AutoStageOption"
        else:
            need, wanted = option.num_stages or have, f"UniformStageOption(num_stages={option.num_stages})"
        pieces = need - have + 1
    if pieces <= 1:
        return traced, None
    check_splittable(loss, pieces, wanted)
    return dataclasses.replace(traced, loss=split_layer_stack(loss, pieces)), piece_bounds(length, pieces)


def _merge_stage_pieces(base: TracedStep, traced: TracedStep, split: StackSplit, layers, specs):
    """``(traced, split, layers)`` with the stacked pieces each stage holds merged into one per
    stage (one leaf, one update, no concatenation when the step's outputs are joined), cutting
    into the same layers; unchanged when every stage holds at most one piece, or a piece is read
    by several stages or none."""
    groups = _stage_groups(traced, split, layers, specs)
    if groups is None or len(groups) == len(split.ranges):
        return traced, split, layers
    loss = merge_pieces(traced.loss, set(split.marker_pieces), split.ranges, groups, layers)
    merged, merged_split = split_stacked_params(base, [groups[0][0]] + [b for _, b in groups], loss)
    merged_layers = layer_mod.manual_layers(merged.loss)
    if merged_split is None or merged_split.marker_pieces != split.marker_pieces or len(merged_layers) != len(layers):
        return traced, split, layers
    return merged, merged_split, merged_layers


def _stage_groups(traced: TracedStep, split: StackSplit, layers, specs) -> list | None:
    """The pieces' ranges merged per stage holding them (stage order), or None when a piece is
    read by no stage or by several."""
    stage_of = {id(e): s for s, spec in enumerate(specs) for i in spec.layers for e in layers[i]}
    n, invars = len(split.ranges), traced.loss.jaxpr.invars
    readers = {}
    for e in traced.loss.jaxpr.eqns:
        for v in e.invars:
            if not isinstance(v, Literal):
                readers.setdefault(v, set()).add(stage_of.get(id(e)))
    stages = [set() for _ in range(n)]
    pos = 0
    for k in range(len(invars) - (n - 1) * len(split.marker_pieces)):
        width = n if k in split.marker_pieces else 1
        if width == n:
            for j in range(n):
                stages[j] |= readers.get(invars[pos + j], set())
        pos += width
    if any(len(s) != 1 or None in s for s in stages):
        return None
    groups = []
    for j, (a, b) in enumerate(split.ranges):
        if j and stages[j] == stages[j - 1]:
            groups[-1] = (groups[-1][0], b)
        else:
            groups.append((a, b))
    return groups


def _stage_specs(traced, layers, cluster, method):
    option = method.stage_option
    if isinstance(option, ManualStageOption):
        return stage_mod.manual_stages(len(layers), cluster, option)
    if isinstance(option, AutoStageOption):
        return auto_stages(traced, layers, cluster, method)
    return stage_mod.uniform_stages(len(layers), cluster, option.num_stages)


def _compile_stages(programs, specs, consts, marker_avals, method, aux_vars) -> list[CompiledStage]:
    out = []
    for prog, spec in zip(programs, specs):
        fns = StageFunctions(prog, consts, aux_vars)
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
