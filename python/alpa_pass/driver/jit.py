"""The front door for Python functions: ``fn(*args)`` traced, planned, emitted and compiled.

``ShardParallel``, the presets and every pipeline stage (forward, backward, apply) go through
:func:`plan_and_compile`; ``ParallelizedFunction.plan`` and the stage search through
:func:`make_plan`. Both build one ``PlanRequest`` (``driver.request``) for
``driver.planning.plan_request`` and emit with ``emit.plan_emission.emit_plan``.
"""
from __future__ import annotations

import functools
import logging
import os
import time

import jax
from jax.sharding import NamedSharding

from alpa_pass import _compat
from alpa_pass.driver.progress import planning_progress
from alpa_pass.driver.planning import plan_request
from alpa_pass.driver.request import PlanRequest, donated_leaves, node_pins, node_ties
from alpa_pass.emit.plan_emission import emit_plan
from alpa_pass.errors import CompileError, ExtractError
from alpa_pass.extract.stablehlo import extract_graph
from alpa_pass.options import AutoShardingOption
from alpa_pass.plan.plan import Plan
from alpa_pass.trace.lower import fn_name, leaf_aval, lower

log = logging.getLogger("alpa_pass")


def make_plan(fn, args, meshes, option: AutoShardingOption, saved: Plan | None = None,
              donate_argnums=(), pinned_args=None, pin_policy=None, pin_uses: bool = False, axis_order=()):
    """Trace, extract, build and solve: the Plan for ``fn(*args)`` (nothing compiled).

    Returns (plan, graph, out_treedef).
    ``args`` may be arrays or ``jax.ShapeDtypeStruct``s (planning needs no memory).
    ``meshes``: a LogicalMesh, or a tuple of candidates (the cheapest plan is kept,
    ``plan.mesh_search`` lists them). ``saved``: a Plan to apply instead of solving
    (PlanMismatchError unless it was made for this function signature, mesh and jax).
    ``donate_argnums``: positions of ``args`` whose buffers are donated (memory liveness).
    ``pinned_args``: one core spec (tensor dim per mesh axis, -1 = none) or None per flat argument
    leaf: the leaf's layout is forced (pipeline apply programs); part of the plan's fingerprint.
    ``pin_policy``: ``policy(graph, ties, args) -> [(node, core spec)]``, more forced layouts
    decided on the extracted step (presets: ``methods.presets.PresetParallel.pins``).
    ``pin_uses``: the ops reading a pinned value read it in its pinned layout too (nothing
    reshards it; ``FollowParallel``).
    ``axis_order``: the plan's axis order for multi-axis dims (``PlanRequest.axis_order``), when
    its layouts must match another plan's; empty: the planner's own.
    Arguments are traced abstractly: one committed to another sharding (another plan's output,
    a ``device_put``) is planned like an uncommitted one and resharded on entry.
    """
    args = jax.tree.map(leaf_aval, args)
    with planning_progress(option.show_progress) as progress:
        timings = {}
        progress.stage("trace")
        t = time.perf_counter()
        lowered = lower(fn, args, peel_scans=option.peel_layer_scans,
                        mesh=meshes[0] if isinstance(meshes, tuple) else meshes)
        timings["trace"] = time.perf_counter() - t

        progress.stage("extract")
        t = time.perf_counter()
        graph = extract_graph(lowered.compiler_ir("stablehlo"))
        leaves = jax.tree.leaves(args)
        if graph.num_args != len(leaves):
            raise ExtractError(f"{fn_name(fn)} lowered to {graph.num_args} module arguments but has "
                               f"{len(leaves)} argument leaves; alpa_pass needs them to correspond")
        graph.donated_args = donated_leaves(args, donate_argnums)
        timings["extract"] = time.perf_counter() - t
        ties = node_ties(graph, args, lowered.out_info) if option.tie_outputs_to_inputs else []
        pins = node_pins(graph, pinned_args)
        if pin_policy is not None:
            pins += pin_policy(graph, ties, args)
        request = PlanRequest.create(graph, lowered.as_text(debug_info=False), leaves, meshes, option,
                                     out_avals=jax.tree.leaves(lowered.out_info), ties=ties,
                                     pins=pins, name=fn_name(fn), saved=saved,
                                     timings=timings, pinned_uses=[v for v, _ in pins] if pin_uses else (),
                                     axis_order=axis_order)
        plan = plan_request(request, progress)
    return plan, graph, lowered.out_tree


def plan_and_compile(fn, args, meshes, option: AutoShardingOption, donate_argnums=(),
                     saved: Plan | None = None, pinned_args=None, pin_policy=None,
                     pin_uses: bool = False, axis_order=()) -> tuple[Plan, object]:
    """Plan ``fn(*args)`` (see :func:`make_plan`) and compile it for ``plan.mesh``.
    Returns (plan, jax ``Compiled``)."""
    args = jax.tree.map(leaf_aval, args)
    plan, graph, out_tree = make_plan(fn, args, meshes, option, saved=saved, donate_argnums=donate_argnums,
                                      pinned_args=pinned_args, pin_policy=pin_policy, pin_uses=pin_uses,
                                      axis_order=axis_order)
    return plan, compile_plan(fn, args, plan, graph, out_tree, option, donate_argnums)


def compile_plan(fn, args, plan: Plan, graph, out_tree, option: AutoShardingOption, donate_argnums=()):
    """Lower ``fn(*args)`` with ``plan``'s input/output specs as its shardings, emit the plan into
    the module and compile it (``make_plan``'s graph and output treedef). Returns jax ``Compiled``;
    ``plan.emit_report`` and ``plan.timings`` ("emit", "compile") are set."""
    args = jax.tree.map(leaf_aval, args)
    jmesh = plan.mesh.jax_mesh()
    t = time.perf_counter()
    treedef = jax.tree.structure(args)
    in_sh = tuple(jax.tree.unflatten(treedef, [NamedSharding(jmesh, s) for s in plan.input_specs]))
    out_sh = jax.tree.unflatten(out_tree, [NamedSharding(jmesh, s) for s in plan.output_specs])
    lowered = lower(_with_tree(fn, out_tree), args, donate_argnums=donate_argnums, in_shardings=in_sh,
                    out_shardings=out_sh, peel_scans=option.peel_layer_scans)
    plan.emit_report = emit_plan(_compat.lowered_module(lowered), graph, plan, option, name=fn_name(fn))
    plan.timings["emit"] = time.perf_counter() - t

    t = time.perf_counter()
    try:
        warn_if_concurrent_cpu_schedule(plan)
        compiled = lowered.compile()
    except Exception as e:  # XLA raises its own (XlaRuntimeError, ValueError) types
        raise CompileError(f"XLA rejected the plan for {fn_name(fn)} on mesh {plan.mesh.shape}: {e}") from e
    plan.timings["compile"] = time.perf_counter() - t
    return compiled


# XLA's CPU scheduler by default favours concurrency and starts collectives as soon as their inputs
# exist: an activation gathered for its backward dot is gathered right after the forward op that
# made it (GPT-39B 8x8 at an 80 GiB budget: 96 such 1 GiB copies live at once). The memory model
# assumes a memory-minimising schedule, which this flag selects. It is read when the CPU backend
# starts (XLA_FLAGS); jax's per-compile compiler_options do not reach the CPU scheduler.
CPU_MEMORY_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
_warned_cpu_schedule = []


def warn_if_concurrent_cpu_schedule(plan: Plan) -> None:
    """Warn once per process when a plan made under a memory budget is compiled for CPU devices
    with XLA's concurrency-optimised scheduler (the default), whose peak can exceed the plan's."""
    budgeted = (plan.memory_budget or {}).get("bytes") is not None
    if not budgeted or _warned_cpu_schedule or plan.mesh.jax_mesh().devices.flat[0].platform != "cpu":
        return
    if "xla_cpu_enable_concurrency_optimized_scheduler" in os.environ.get("XLA_FLAGS", ""):
        return
    _warned_cpu_schedule.append(True)
    log.warning("alpa_pass: compiling a plan made under a memory budget for CPU devices with XLA's "
                "concurrency-optimised scheduler, which can keep far more alive than the plan predicts "
                "(GPT-39B 8x8: 173 GiB against 78.6); start the process with XLA_FLAGS=%s for the "
                "memory-minimising schedule the plan assumes", CPU_MEMORY_SCHEDULER_FLAG)


def _with_tree(fn, out_tree):
    """``fn`` returning its output leaves in ``out_tree`` (the planning trace's output structure).

    Each trace of ``fn`` may build its output's static pytree metadata anew: flax's
    ``TrainState.create(..., tx=optax.adam(1e-3))`` inside an init makes a new optimizer (new
    closures, unequal to the last trace's) every time, and jax then rejects ``out_shardings`` built
    on the planning trace's treedef for the compiling trace's output. Same leaves, same program."""
    @functools.wraps(fn)
    def same_tree(*args):
        return jax.tree.unflatten(out_tree, jax.tree.leaves(fn(*args)))
    return same_tree
