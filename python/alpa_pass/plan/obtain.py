"""Where a graph's plan comes from: a saved plan, the on-disk cache, or the solver; over one mesh
or, with ``mesh="auto"``, the cheapest of several."""
from __future__ import annotations

import dataclasses
import time

from alpa_pass.mesh import LogicalMesh
from alpa_pass.plan import cache, serialize
from alpa_pass.plan.auto_mesh import search_meshes


def obtain_plan(graph, mesh, option, ties, timings: dict, fingerprint: str, *, saved=None,
                progress=None, pinned=()):
    """The Plan for an extracted graph.

    Args:
      graph: the OpGraph of the first (unsharded) lowering.
      mesh: a LogicalMesh, or a sequence of them (each is planned; the cheapest plan is kept).
      option: the AutoShardingOption (``plan_cache_dir`` enables the cache).
      ties: (node, node) pairs whose specs must be equal.
      pinned: (node, core spec) pairs forced on the solver (see ``plan_graph``).
      timings: the phases so far ("trace", "extract"); the plan's timings start from a copy.
      fingerprint: :func:`serialize.fingerprint` of this function signature.
      saved: a Plan to apply instead of planning; it must fit (PlanMismatchError otherwise) and
        ``mesh`` must be one LogicalMesh.
    Returns a Plan whose ``mesh`` is the mesh to compile for and whose ``origin`` says where it
    came from ("saved", "cache" or "solver").
    """
    if saved is not None:
        return apply_saved(saved, graph, mesh, fingerprint, dict(timings))
    if isinstance(mesh, LogicalMesh):
        return plan_one(graph, mesh, option, ties, dict(timings), fingerprint, progress, pinned)
    def plan_bounded(m, bound):  # a mesh that cannot beat the best so far is cut off early
        bounded = option if bound is None else dataclasses.replace(option, solver_objective_bound=bound)
        return plan_one(graph, m, bounded, ties, dict(timings), fingerprint, progress, pinned)

    return search_meshes(tuple(mesh), plan_bounded)


def plan_one(graph, mesh: LogicalMesh, option, ties, timings: dict, fingerprint: str, progress=None,
             pinned=()):
    """The cached plan for (fingerprint, mesh, option) if ``option.plan_cache_dir`` holds a valid
    one (timings gain "cache"), else a solved plan (stored in the cache when it is enabled, unless
    the solve was cut off by ``option.solver_objective_bound``: then it is no optimum)."""
    from alpa_pass.plan.planner import plan_graph

    if option.plan_cache_dir is not None:
        t = time.perf_counter()
        plan = cache.load_cached(option.plan_cache_dir, fingerprint, mesh, option, graph.num_nodes)
        if plan is not None:
            timings["cache"] = time.perf_counter() - t
            plan.timings = timings
            return plan
    plan = plan_graph(graph, mesh, option, ties, timings, progress=progress, pinned=pinned)
    plan.fingerprint = fingerprint
    bound = option.solver_objective_bound
    # a solve cut off by the bound returns its first incumbent, not the optimum: never cache that
    if option.plan_cache_dir is not None and (bound is None or plan.objective < bound):
        cache.store_cached(option.plan_cache_dir, plan, option)
    return plan


def apply_saved(saved, graph, mesh: LogicalMesh, fingerprint: str, timings: dict):
    """A copy of ``saved`` for ``mesh`` (its devices), after checking jax version, fingerprint and
    mesh (PlanMismatchError) and that every spec divides its tensor (ShardingError)."""
    from alpa_pass.plan.planner import check_divisible

    if not isinstance(mesh, LogicalMesh):
        raise TypeError("a saved plan is applied to one LogicalMesh, not a mesh search")
    serialize.check_applicable(saved, fingerprint=fingerprint, mesh=mesh, num_nodes=graph.num_nodes)
    plan = dataclasses.replace(saved, mesh=mesh, timings=timings, origin="saved", emit_report=None)
    check_divisible(graph, plan, mesh)
    return plan
