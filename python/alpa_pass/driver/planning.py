"""The one planning entry: a ``PlanRequest`` in, a ``Plan`` out.

``plan_request`` decides where the plan comes from — a saved plan (checked), the on-disk cache,
or the solver; over one mesh or, for a tuple of candidate meshes, the cheapest of them — and makes
every process of a multi-process job agree on it. ``solve_graph`` is the solver path: build the
ILP in the C++ core, solve it under the memory budget (HiGHS), refine it unmerged, decode it.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time

import jax
from jax.sharding import PartitionSpec

from alpa_pass import _core
from alpa_pass.driver import cache
from alpa_pass.driver.auto_mesh import search_meshes
from alpa_pass.driver.budget import (draft_options, fit_budgeted_plan, infeasible_error, memory_lower_bound,
                                     resolve_budget, solve_within_budget)
from alpa_pass.driver.exact_copies import EXACT_STATUS
from alpa_pass.driver.progress import planning_progress
from alpa_pass.driver.reshard_copies import ReshardCopies
from alpa_pass.driver.refine import refine_unmerged
from alpa_pass.driver.request import PlanRequest
from alpa_pass.errors import InfeasibleError, PlanMismatchError, ShardingError, SolverError
from alpa_pass.extract.graph import OpGraph
from alpa_pass.mesh import LogicalMesh
from alpa_pass.options import AutoShardingOption
from alpa_pass.plan import serialize
from alpa_pass.plan.plan import Plan, build_plan
from alpa_pass.solve import highs
from alpa_pass.runtime.multiprocess import check_same_plan

log = logging.getLogger("alpa_pass")


def plan_request(request: PlanRequest, progress=None) -> Plan:
    """The Plan for ``request``; every process of the job gets the same one (PlanDivergedError).

    The plan's ``mesh`` is the mesh to compile for (the chosen one of several candidates), its
    ``origin`` says where it came from ("saved", "cache" or "solver"), its ``fingerprint`` is the
    request's and its ``timings`` start from a copy of ``request.timings``.
    ``progress``: a ``driver.progress.PlanningProgress`` already showing earlier phases (else one
    is opened for the build and solve).
    """
    if progress is None:
        with planning_progress(request.option.show_progress) as progress:
            return plan_request(request, progress)
    if request.saved is not None:
        plan = _apply_saved(request)
    elif isinstance(request.meshes, LogicalMesh):
        plan = _plan_one(request, request.meshes, request.option, progress)
    else:
        def bounded(mesh, bound):  # a mesh that cannot beat the best so far is cut off early
            option = request.option if bound is None else \
                dataclasses.replace(request.option, solver_objective_bound=bound)
            return _plan_one(request, mesh, option, progress)

        plan = search_meshes(tuple(request.meshes), bounded, request.option.core_mesh)
    if request.axis_order and list(request.axis_order) != list(plan.axis_order):
        plan.order_axes(request.axis_order, request.graph)  # layouts shared with another plan
    for i in request.key_inputs:  # a key array's spec, not its key data's (planned replicated)
        plan.input_specs[i] = PartitionSpec()
    for i in request.key_outputs:
        plan.output_specs[i] = PartitionSpec()
    check_same_plan(plan, f"plan of {request.name}")
    return plan


def _plan_one(request: PlanRequest, mesh: LogicalMesh, option: AutoShardingOption, progress) -> Plan:
    """The cached plan for (fingerprint, mesh, option) if ``option.plan_cache_dir`` holds a valid
    one (timings gain "cache"), else a solved plan (stored in the cache when it is enabled, unless
    the solve was cut off by ``option.solver_objective_bound``: then it is no optimum)."""
    timings = dict(request.timings)
    option, budget = resolve_budget(option, mesh.devices if mesh.devices is not None else jax.devices()[:mesh.num_devices])
    if option.plan_cache_dir is not None:
        t = time.perf_counter()
        plan = cache.load_cached(option.plan_cache_dir, request.fingerprint, mesh, option, request.graph)
        if plan is not None:
            timings["cache"] = time.perf_counter() - t
            plan.timings = timings
            plan.memory_budget = budget
            return plan
    plan = solve_graph(request.graph, mesh, option, request.ties, timings, progress, request.pins,
                       request.pinned_uses, axis_order=request.axis_order)
    plan.fingerprint = request.fingerprint
    plan.memory_budget = budget
    bound = option.solver_objective_bound
    if option.plan_cache_dir is not None and (bound is None or plan.objective < bound):
        cache.store_cached(option.plan_cache_dir, plan, option)
    return plan


def _apply_saved(request: PlanRequest) -> Plan:
    """A copy of ``request.saved`` for the request's mesh (its devices), after checking jax
    version, fingerprint and mesh (PlanMismatchError) and that every spec divides its tensor."""
    mesh = request.meshes
    if not isinstance(mesh, LogicalMesh):
        raise TypeError("a saved plan is applied to one LogicalMesh, not a mesh search")
    serialize.check_applicable(request.saved, fingerprint=request.fingerprint, mesh=mesh,
                               num_nodes=request.graph.num_nodes)
    plan = dataclasses.replace(request.saved, mesh=mesh, timings=dict(request.timings), origin="saved",
                               emit_report=None)
    problems = serialize.fit_problems(plan, request.graph)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PlanMismatchError(f"the saved plan does not fit {request.name} on mesh {mesh.shape}: {problems[0]}"
                                f"{more}; it was edited or corrupted: re-plan (drop ShardParallel(plan=...)) "
                                f"and save it again")
    return plan


def core_graph(graph: OpGraph):
    """The C++ view of an OpGraph (arrays copied once)."""
    return _core.Graph(graph.kind, graph.dtype_bytes, graph.shape_offsets, graph.shape_dims,
                       graph.operand_offsets, graph.operand_ids, graph.attr_offsets, graph.attrs)


def solve_graph(graph: OpGraph, mesh: LogicalMesh, option: AutoShardingOption,
                ties=(), timings: dict | None = None, progress=None, pins=(), pinned_uses=(),
                tied_infeasible: InfeasibleError | None = None, axis_order=()) -> Plan:
    """Build (C++ core) and solve (HiGHS) the sharding ILP of an extracted graph.

    ``ties``: (node, node) pairs whose specs must be equal. ``timings`` gains "build" and "solve".
    ``progress``: a ``driver.progress.PlanningProgress`` told each stage (optional).
    ``pins``: (node, core spec) pairs the node's result must have (an empty spec: replicated;
    ValueError naming the node if it has no such strategy). ``pinned_uses``: pinned nodes that
    their users must read as pinned (a user that cannot is left free and logged).
    ``tied_infeasible``: the InfeasibleError of the same graph planned with repeated layers tied
    (this call plans them untied): raised again, with the untied plans' lower bound, when that
    bound already exceeds the budget.
    ``axis_order``: mesh axis names, most major first, in which a dim split over several axes
    lists them (empty: mesh order). The ILP prices its reshards in that order (the
    collective-permutes another order implies, see the core's ``reshard_cost``) and the plan's
    ``axis_order``, which emission writes, is that order.
    """
    timings = {} if timings is None else timings
    where = "x".join(map(str, mesh.shape))
    if progress is not None:
        progress.stage(f"build ILP (mesh {where}, {graph.num_nodes} ops)")
    t = time.perf_counter()

    def build(opt):
        return _core.build_sharding_problem(core_graph(graph), opt.core_mesh(mesh, axis_order), opt.to_core(), list(ties),
                                            list(graph.donated_args),
                                            [(int(v), list(s) or [-1] * len(mesh.shape)) for v, s in pins],
                                            list(pinned_uses),
                                            [] if graph.weights is None else list(graph.weights),
                                            [] if graph.comm_weights is None else list(graph.comm_weights),
                                            copies.as_list())

    copies = ReshardCopies(  # the copies the memory rows count; rebuilt with rows at another budget
        lambda budget: build(option if budget is None else dataclasses.replace(option, memory_budget_per_device=budget)),
        mesh.shape, graph)
    problem = base = build(option)
    if len(problem.unpinned_uses):
        log.warning("alpa_pass: %d ops cannot read their pinned operands as pinned and may reshard them: %s",
                    len(problem.unpinned_uses), ", ".join(graph.labels[v] for v in problem.unpinned_uses[:8]))
    timings["build"] = time.perf_counter() - t
    if tied_infeasible is not None and option.memory_budget_per_device is not None and \
            _bound_exceeds_budget(problem, option, where, tied_infeasible):
        return _solve_relaxed(graph, mesh, _relaxed(option), ties, timings, progress, pins, pinned_uses,
                              tied_infeasible, axis_order)
    if progress is not None:
        progress.stage(f"solve ILP (mesh {where}, {problem.ilp.num_cols} columns, {problem.ilp.num_rows} rows)")
    t = time.perf_counter()
    rounds = draft_options(option)  # (intermediate plans of the reshard-copy rounds: see finish_draft)
    try:
        solution = solve_within_budget(problem, option.memory_budget_per_device, rounds, where, copies=copies)
        problem = copies.problem or problem  # the free plan's copies may be counted now
    except InfeasibleError as e:
        loop_ties = set(map(tuple, graph.ties)) & set(map(tuple, ties))
        if loop_ties:
            # A loop's carried slot may have no layout that both its carry and its yield can take
            # (e.g. a yield computed from runtime-indexed dims); XLA reshards a carried value whose
            # layouts differ, so plan with the carries untied rather than fail.
            log.info("alpa_pass: no plan keeps every loop-carried value in one layout on mesh %s; "
                     "planning with the %d loop ties dropped", where, len(loop_ties))
            return solve_graph(graph, mesh, option, [t for t in ties if tuple(t) not in loop_ties], timings,
                               progress, pins, pinned_uses, axis_order=axis_order)
        relaxed = _relaxed(option)
        if relaxed is None or (option.memory_budget_per_device is None and not pins):
            raise
        # (without a budget only pins can leave no plan: arguments kept in the layouts they
        # arrive in, which a restriction can contradict -- repeated layers tied to one layout
        # while their parameters arrive in two, as an FNO's eval step read its train step's)
        log.info("alpa_pass: no plan %s on mesh %s with %s; planning without",
                 "keeps the pinned layouts" if option.memory_budget_per_device is None else "fits the memory budget",
                 where, _restriction(option))
        return _solve_relaxed(graph, mesh, relaxed, ties, timings, progress, pins, pinned_uses,
                              tied_infeasible or e, axis_order)
    problem, solution = fit_budgeted_plan(copies, base, problem, solution, option.memory_budget_per_device, rounds,
                                          option.solve_options(), where)
    timings["solve"] = time.perf_counter() - t  # every budgeted round and its rebuilds
    _warn_if_limited(solution, option, where)
    problem, solution, refinement = refine_unmerged(build, problem, solution, option, graph.num_nodes, where)
    if "time_s" in refinement:
        timings["refine"] = refinement["time_s"]
    plan = build_plan(graph, problem, solution, mesh, timings)
    plan.order_axes(axis_order or mesh.axis_names, graph)
    plan.refinement = refinement
    plan.made_with = serialize.made_with(option)
    check_divisible(graph, plan, mesh)
    return plan


def _relaxed(option: AutoShardingOption) -> AutoShardingOption | None:
    """The next, less restricted problem to try when no plan meets the memory budget: repeated
    layers untied (each copy of a layer may take its own layout), then followers unmerged (each
    elementwise op its own layout); None when ``option`` has neither restriction left."""
    if option.tie_repeated_layers:
        return dataclasses.replace(option, tie_repeated_layers=False)
    if option.merge_followers:
        return dataclasses.replace(option, merge_followers=False)
    return None


def _restriction(option: AutoShardingOption) -> str:
    return "repeated layers tied" if option.tie_repeated_layers else "followers merged into their producers"


def _solve_relaxed(graph, mesh, option, ties, timings, progress, pins, pinned_uses, infeasible,
                   axis_order=()) -> Plan:
    """``solve_graph`` on a relaxed problem; a relaxed ILP that stops without a plan (a limit, not
    a proof) re-raises the restricted problem's InfeasibleError, whose least-memory plan is still
    the smallest budget known to be feasible."""
    try:
        return solve_graph(graph, mesh, option, ties, timings, progress, pins, pinned_uses,
                           tied_infeasible=infeasible, axis_order=axis_order)
    except SolverError as stopped:
        smallest = getattr(infeasible, "smallest_feasible_bytes", None)
        if smallest is None:
            raise
        where = "x".join(map(str, mesh.shape))
        raise infeasible_error(where, option.memory_budget_per_device, smallest, None) from stopped


def _bound_exceeds_budget(problem, option: AutoShardingOption, where: str, restricted: InfeasibleError) -> bool:
    """Whether no plan of the relaxed ``problem`` can meet the budget, by its memory lower bound
    (``driver.budget.memory_lower_bound``: every row at its own minimum, else the LP relaxation of
    the min-max-memory problem), proven without solving the relaxed ILP (on LLaMA-8B the untied ILP
    has 1.07M columns). The bound holds for every plan of this problem only: while a restriction
    is left (followers merged), the next relaxation may still fit, so True means "skip to it";
    with none left, the bound holds for every plan and ``restricted`` is raised with it.
    """
    budget = option.memory_budget_per_device
    lower = memory_lower_bound(problem, option.solve_options(), budget)
    log.info("alpa_pass: %s plans' memory lower bound on mesh %s: %s bytes (budget %d)",
             "unmerged" if _relaxed(option) is None else "untied", where, lower, budget)
    if lower is None or lower <= budget:
        return False
    smallest = getattr(restricted, "smallest_feasible_bytes", None)
    if _relaxed(option) is None and smallest is not None:
        raise infeasible_error(where, budget, smallest, lower, " (with or without layer ties or follower "
                               "merging)") from restricted
    return _relaxed(option) is not None


def _warn_if_limited(solution, option: AutoShardingOption, where: str) -> None:
    """Say when a solve stopped before proving its plan optimal, and whether the clock chose it."""
    if solution.time_limited:
        log.warning("alpa_pass: the ILP solve on mesh %s hit solver_time_limit_s=%g (gap %.2g): the plan "
                    "depends on this machine's speed and load; set AutoShardingOption(solver_time_limit_s=None) "
                    "for a plan that does not", where, option.solver_time_limit_s, solution.mip_gap)
    elif solution.status == highs.SUPPORT_STATUS and not solution.optimal:
        log.info("alpa_pass: the budgeted solve on mesh %s kept the plan of its LP support (gap %.2g to the LP "
                 "bound, solver_support_gap=%g); AutoShardingOption(solver_support_gap=None) solves the full ILP",
                 where, solution.mip_gap, option.solver_support_gap)
    elif solution.status == EXACT_STATUS and math.isnan(solution.mip_gap):
        log.info("alpa_pass: the budgeted solve on mesh %s kept the exact-copy plan over the free plan's frontier "
                 "strategies (no LP bound computed: its gap is unknown; driver/exact_copies.py frontier_columns)",
                 where)
    elif solution.status == EXACT_STATUS:
        log.info("alpa_pass: the budgeted solve on mesh %s kept the exact-copy plan (gap %.2g to the first LP "
                 "bound, which counts no reshard copies; driver/exact_copies.py)", where, solution.mip_gap)
    elif solution.node_limited:
        log.info("alpa_pass: the ILP solve on mesh %s stopped at solver_node_limit=%d (gap %.2g)",
                 where, option.solver_node_limit, solution.mip_gap)


def check_divisible(graph: OpGraph, plan: Plan, mesh: LogicalMesh) -> None:
    """Defensive check that every chosen spec fits its tensor (the core guarantees it)."""
    problems = serialize.fit_problems(plan, graph)
    if problems:
        raise ShardingError(f"the plan on mesh {mesh.shape} does not fit: {problems[0]}")
