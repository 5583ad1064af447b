"""ShardParallel planning: trace -> extract -> build (C++) -> solve (HiGHS) -> emit -> compile."""
from __future__ import annotations

import hashlib
import dataclasses
import logging
import time

import jax
import numpy as np
from jax.sharding import NamedSharding

from alpa_pass import _compat
from alpa_pass.emit.constraints import insert_constraints, slice_first
from alpa_pass.emit.reduce_scatter import locate_partial_sum_dots, rewrite_reduce_scatter
from alpa_pass.errors import CompileError, ExtractError, InfeasibleError, ShardingError
from alpa_pass.extract.graph import OpGraph, OpKind
from alpa_pass.extract.stablehlo import extract_graph
from alpa_pass.mesh import LogicalMesh
from alpa_pass.options import AutoShardingOption
from alpa_pass.plan.memory import donated_leaves, solve_within_budget
from alpa_pass.plan.obtain import obtain_plan
from alpa_pass.plan.plan import Plan, build_plan
from alpa_pass.plan.progress import planning_progress
from alpa_pass.plan.refine import refine_unmerged
from alpa_pass.plan.serialize import fingerprint, made_with
from alpa_pass.runtime.multiprocess import check_same_plan
from alpa_pass.solve.highs import SolveOptions
from alpa_pass.trace.lower import fn_name, lower, output_ties

log = logging.getLogger("alpa_pass")

_ANCHOR_KINDS = (OpKind.DOT, OpKind.CONVOLUTION, OpKind.REDUCE, OpKind.GATHER, OpKind.SCATTER)
_USE_SITE_KINDS = (OpKind.DOT, OpKind.CONVOLUTION, OpKind.GATHER, OpKind.SCATTER)


def core_graph(graph: OpGraph):
    """The C++ view of an OpGraph (arrays copied once)."""
    from alpa_pass import _core

    return _core.Graph(graph.kind, graph.dtype_bytes, graph.shape_offsets, graph.shape_dims,
                       graph.operand_offsets, graph.operand_ids, graph.attr_offsets, graph.attrs)


def make_plan(fn, args, mesh, option: AutoShardingOption, saved: Plan | None = None,
              donate_argnums=(), pinned_args=None):
    """Trace, extract, build and solve: the Plan for ``fn(*args)`` on ``mesh`` (nothing compiled).

    Returns (plan, graph, out_treedef).
    ``args`` may be arrays or ``jax.ShapeDtypeStruct``s (planning needs no memory).
    ``mesh``: a LogicalMesh, or a sequence of them (``ShardParallel(mesh="auto")``: each is planned,
    the cheapest plan is kept, ``plan.mesh_search`` lists them). ``saved``: a Plan to apply instead
    of solving (PlanMismatchError unless it was made for this function signature, mesh and jax).
    With ``option.plan_cache_dir`` a cached plan replaces the build and solve.
    ``donate_argnums``: positions of ``args`` whose buffers are donated (memory liveness).
    ``pinned_args``: one core spec (tensor dim per mesh axis, -1 = none) or None per flat argument
    leaf: the leaf's layout is forced (presets); part of the plan's fingerprint.
    """
    with planning_progress(option.show_progress) as progress:
        timings = {}
        progress.stage("trace")
        t = time.perf_counter()
        lowered = lower(fn, args)
        timings["trace"] = time.perf_counter() - t

        progress.stage("extract")
        t = time.perf_counter()
        graph = extract_graph(lowered.compiler_ir("stablehlo"))
        leaves = jax.tree.leaves(args)
        if graph.num_args != len(leaves):
            raise ExtractError(f"{fn_name(fn)} lowered to {graph.num_args} module arguments but has "
                               f"{len(leaves)} argument leaves; alpa_pass needs them to correspond")
        graph.donated_args = donated_leaves(args, donate_argnums)
        key = fingerprint(lowered.as_text(debug_info=False), leaves, graph.num_nodes, graph.donated_args)
        pinned = _node_pins(graph, pinned_args)
        if pinned:
            key = hashlib.sha256(f"{key}|pinned={pinned}".encode()).hexdigest()
        timings["extract"] = time.perf_counter() - t

        ties = _node_ties(graph, args, lowered.out_info) if option.tie_outputs_to_inputs else []
        plan = obtain_plan(graph, mesh, option, ties, timings, key, saved=saved, progress=progress,
                           pinned=pinned)
    check_same_plan(plan, f"plan of {fn_name(fn)}")
    return plan, graph, lowered.out_tree


def plan_graph(graph: OpGraph, mesh: LogicalMesh, option: AutoShardingOption,
               ties=(), timings: dict | None = None, progress=None, pinned=()) -> Plan:
    """Build (C++ core) and solve (HiGHS) the sharding ILP of an extracted graph.

    ``ties``: (node, node) pairs whose specs must be equal. ``timings`` gains "build" and "solve".
    ``progress``: a ``plan.progress.PlanningProgress`` told each stage (optional).
    ``pinned``: (node, core spec) pairs the node's result must have (ValueError naming the node
    if it has no such strategy).
    """
    from alpa_pass import _core

    timings = {} if timings is None else timings
    where = "x".join(map(str, mesh.shape))
    if progress is not None:
        progress.stage(f"build ILP (mesh {where}, {graph.num_nodes} ops)")
    t = time.perf_counter()
    def build(opt):
        return _core.build_sharding_problem(core_graph(graph), mesh.to_core(), opt.to_core(), list(ties),
                                            list(graph.donated_args), [(int(v), list(s)) for v, s in pinned])
    problem = build(option)
    timings["build"] = time.perf_counter() - t
    if progress is not None:
        progress.stage(f"solve ILP (mesh {where}, {problem.ilp.num_cols} columns, {problem.ilp.num_rows} rows)")
    try:
        solution = solve_within_budget(problem, option.memory_budget_per_device, SolveOptions(
            time_limit_s=option.solver_time_limit_s, rel_gap=option.solver_rel_gap,
            threads=option.solver_threads, log_to_console=option.solver_log,
            objective_bound=option.solver_objective_bound), where)
    except InfeasibleError:
        if option.memory_budget_per_device is None or not option.tie_repeated_layers:
            raise
        # Ties force every copy of a layer into one layout; a budget may need a mix of layouts.
        log.info("alpa_pass: no tied plan fits the memory budget on mesh %s; planning untied", where)
        return plan_graph(graph, mesh, dataclasses.replace(option, tie_repeated_layers=False), ties,
                          timings, progress, pinned)
    timings["solve"] = solution.solve_time_s
    problem, solution, refinement = refine_unmerged(build, problem, solution, option, graph.num_nodes)
    if "time_s" in refinement:
        timings["refine"] = refinement["time_s"]
    plan = build_plan(graph, problem, solution, mesh, timings)
    plan.refinement = refinement
    plan.made_with = made_with(option)
    check_divisible(graph, plan, mesh)
    return plan


def plan_and_compile(fn, args, mesh, option: AutoShardingOption, donate_argnums=(),
                     saved: Plan | None = None, pinned_args=None) -> tuple[Plan, object]:
    """Plan ``fn(*args)`` on ``mesh`` (or apply ``saved``; see ``make_plan``) and compile it for
    ``plan.mesh``. Returns (plan, jax ``Compiled``)."""
    plan, graph, out_tree = make_plan(fn, args, mesh, option, saved=saved, donate_argnums=donate_argnums,
                                      pinned_args=pinned_args)
    mesh = plan.mesh
    jmesh = mesh.jax_mesh()
    timings = plan.timings
    t = time.perf_counter()
    in_sh = _shardings_like(args, plan.input_specs, jmesh)
    out_sh = [NamedSharding(jmesh, s) for s in plan.output_specs]
    lowered = lower(fn, args, donate_argnums=donate_argnums, in_shardings=in_sh,
                    out_shardings=jax.tree.unflatten(out_tree, out_sh))
    module = _compat.lowered_module(lowered)
    dots = locate_partial_sum_dots(module, graph, plan, mesh) if option.prefer_reduce_scatter else []
    plan.emit_report = insert_constraints(
        module, graph, constraint_targets(graph, plan, mesh, option),
        operand_dim_shardings=operand_targets(graph, plan, mesh))
    if dots:
        log.info("%s: %d partial-sum dots reduce-scattered", fn_name(fn),
                 rewrite_reduce_scatter(module, dots, mesh))
    timings["emit"] = time.perf_counter() - t

    t = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as e:  # XLA raises its own (XlaRuntimeError, ValueError) types
        raise CompileError(f"XLA rejected the plan for {fn_name(fn)} on mesh {mesh.shape}: {e}") from e
    timings["compile"] = time.perf_counter() - t
    return plan, compiled


def _node_pins(graph: OpGraph, pinned_args) -> list[tuple[int, list[int]]]:
    params = graph.param_nodes()
    return [(params[i], list(s)) for i, s in enumerate(pinned_args or ()) if s is not None]


def _node_ties(graph: OpGraph, args, out_info) -> list[tuple[int, int]]:
    params, outputs = graph.param_nodes(), graph.output_nodes()
    return [(outputs[o], params[i]) for o, i in output_ties(args, out_info)]


def _shardings_like(args, specs, jmesh):
    treedef = jax.tree.structure(args)
    return tuple(jax.tree.unflatten(treedef, [NamedSharding(jmesh, s) for s in specs]))


def constraint_targets(graph: OpGraph, plan: Plan, mesh: LogicalMesh, option: AutoShardingOption):
    """Node id -> per-dim mesh axis names, for every node emission should constrain."""
    skip = (OpKind.PARAMETER, OpKind.OUTPUT, OpKind.GENERATOR)
    out = {}
    for v in range(graph.num_nodes):
        kind = OpKind(int(graph.kind[v]))
        if kind in skip or (option.emit == "anchors" and kind not in _ANCHOR_KINDS):
            continue
        out[v] = mesh.dim_axes(plan.node_specs[v], len(graph.shape(v)))
    return out


def operand_targets(graph: OpGraph, plan: Plan, mesh: LogicalMesh) -> dict:
    """(node, operand index) -> dims, where an anchor op (dot, convolution, gather, scatter) reads
    an operand in another layout than its producer's: pin the layout the plan reshards it to, so
    XLA does exactly the planned resharding (and never partitions, e.g., a gather whose indices and
    operand disagree on batching dims — XLA 0.10 computes that wrongly on CPU). Other nodes get
    one only where their operand's resharding slices and gathers (``_slice_first_targets``)."""
    out = {}
    for v in range(graph.num_nodes):
        if OpKind(int(graph.kind[v])) not in _USE_SITE_KINDS:
            out.update(_slice_first_targets(graph, plan, mesh, v))
            continue
        for t, u in enumerate(graph.operands(v)):
            want = plan.operand_specs[v][t]
            if want != plan.node_specs[u] and OpKind(int(graph.kind[u])) != OpKind.GENERATOR:
                out[(v, t)] = mesh.dim_axes(want, len(graph.shape(u)))
    return out


def _slice_first_targets(graph: OpGraph, plan: Plan, mesh: LogicalMesh, v: int) -> dict:
    """Use-site layouts for the operands of a non-anchor node ``v`` whose planned resharding both
    slices and gathers: the slice-first intermediate (``emit.constraints.slice_first``)."""
    out = {}
    for t, u in enumerate(graph.operands(v)):
        if OpKind(int(graph.kind[u])) in (OpKind.GENERATOR, OpKind.PARAMETER):
            continue
        mid = slice_first(plan.node_specs[u], plan.operand_specs[v][t], graph.shape(u), mesh.shape)
        if mid is not None:
            out[(v, t)] = mesh.dim_axes(mid, len(graph.shape(u)))
    return out


def check_divisible(graph: OpGraph, plan: Plan, mesh: LogicalMesh) -> None:
    """Defensive check that every chosen spec divides its tensor (the core guarantees it)."""
    for v in range(graph.num_nodes):
        shape = graph.shape(v)
        for dim, axes in enumerate(mesh.dim_axes(plan.node_specs[v], len(shape))):
            n = int(np.prod([mesh.shape[mesh.axis_names.index(a)] for a in axes])) if axes else 1
            if shape[dim] % n:
                raise ShardingError(f"plan splits dim {dim} of {graph.labels[v]} {shape} over {axes} "
                                    f"({n} devices), which does not divide it")
