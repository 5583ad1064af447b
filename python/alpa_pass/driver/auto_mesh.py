"""``ShardParallel(mesh="auto")``: plan every logical shape of the device count, keep the cheapest.

The shapes of ``n`` devices (:func:`logical_shapes`) are the 2-axis shapes ``a x n/a`` for every
divisor ``a`` (``1 x n`` first, ``n x 1`` included), then the 3-axis shapes whose factors are all
> 1 (for 8: 1x8, 2x4, 4x2, 8x1, 2x2x2). The 1-axis mesh ``(n,)`` is left out: a size-1 axis adds no
strategy and no cost, so ``(n,)`` plans exactly like ``1 x n`` and would only repeat its solve.

Meshes with three or more axes of size > 1 are planned over a pruned spec space (a heuristic:
only "two-block" specs, see docs/core_api.md "Spec enumeration"), which keeps their ILP a few
times the size of a 2-axis one.

For the same reason as ``(n,)``, shapes whose non-trivial axes have the same (size, alpha, beta),
most major first, as an earlier shape's (the costs the core plans with: a measured profile's when
one is given) — ``8x1`` of ``1x8`` — pose the same ILP up to relabelling mesh axes: they are
recorded with the earlier shape's objective (``"same_as"``) instead of being solved again. ``4x2``
is not ``2x4`` relabelled: a dim split over both axes tiles major to minor, so the two price
different collective-permutes (the core's ``reshard_cost``), and both are solved. Ties keep the
earlier shape.
"""
from __future__ import annotations

import time

from alpa_pass.errors import InfeasibleError, SolverError
from alpa_pass.mesh import LogicalMesh

_TIE_RTOL = 1e-9


def logical_shapes(n: int) -> list[tuple[int, ...]]:
    """The mesh shapes tried for ``n`` devices, in search order (see the module docstring)."""
    if n < 1:
        raise ValueError(f"need at least one device, got {n}")
    divisors = [a for a in range(1, n + 1) if n % a == 0]
    two = [(a, n // a) for a in divisors]
    three = [(a, b, n // (a * b)) for a in divisors if a > 1 for b in divisors
             if b > 1 and (n // a) % b == 0 and n // (a * b) > 1]
    return two + three


def candidate_meshes(n: int, devices=None) -> tuple[LogicalMesh, ...]:
    """One default-cost LogicalMesh per logical shape of ``n`` devices (over ``devices`` if given)."""
    return tuple(LogicalMesh(shape=s, devices=None if devices is None else tuple(devices))
                 for s in logical_shapes(n))


def search_meshes(meshes, plan_one, core_mesh=None):
    """Plan each mesh with ``plan_one(mesh, bound) -> Plan`` and return the cheapest plan.

    ``core_mesh``: LogicalMesh -> the core's Mesh it is planned with (``AutoShardingOption.core_mesh``:
    a measured profile's alpha/beta per axis); the symmetry test compares those costs. Default:
    the LogicalMesh's own alpha/beta.

    ``bound`` is the best objective so far (None for the first mesh): a solve may stop with a
    SolverError once it proves it cannot beat it (recorded like a mesh with no plan).

    The returned plan's ``mesh_search`` lists every mesh in order as {"shape", "objective",
    "solve_s", "origin"} ("same_as": [shape] for a symmetric repeat, "error" for a mesh with no
    feasible plan, whose objective is None) and its timings gain "mesh_search" (total seconds).
    A solved mesh also records "mip_gap" and "cut_off": True when its objective is no better than
    ``bound``. HiGHS then stops as soon as it proves that no plan beats the bound and returns the
    best plan it found so far (status "Optimal", a large gap), so such an objective is only an upper
    bound of that mesh's optimum (the optimum lies within "mip_gap" of it, relative).
    Raises the last InfeasibleError/SolverError when no mesh has a plan.
    """
    start = time.perf_counter()
    best, tried, solved, error = None, [], {}, None
    for mesh in meshes:
        key = _symmetry_key(mesh if core_mesh is None else core_mesh(mesh))
        if key in solved:
            twin = solved[key]
            tried.append({"shape": list(mesh.shape), "objective": twin["objective"], "solve_s": 0.0,
                          "origin": twin["origin"], "same_as": twin["shape"]})
            continue
        t = time.perf_counter()
        bound = None if best is None else best.objective
        try:
            plan = plan_one(mesh, bound)
        except (InfeasibleError, SolverError) as e:
            error = e
            solved[key] = {"shape": list(mesh.shape), "objective": None, "solve_s": time.perf_counter() - t,
                           "origin": "solver", "error": str(e)}
            tried.append(solved[key])
            continue
        solved[key] = {"shape": list(mesh.shape), "objective": plan.objective,
                       "solve_s": float(plan.timings.get("solve", 0.0)), "origin": plan.origin,
                       "mip_gap": float(plan.mip_gap), "cut_off": bound is not None and plan.objective >= bound}
        tried.append(solved[key])
        if best is None or plan.objective < best.objective - _TIE_RTOL * max(1.0, abs(best.objective)):
            best = plan
    if best is None:
        raise error
    best.mesh_search = tried
    best.timings["mesh_search"] = time.perf_counter() - start
    return best


def _symmetry_key(mesh):
    """(size, alpha, beta) of the axes of size > 1, most major first (a LogicalMesh: mesh order;
    a core Mesh: its axis order)."""
    order = list(getattr(mesh, "axis_order", None) or range(len(mesh.shape)))
    return tuple((mesh.shape[i], mesh.alpha[i], mesh.beta[i]) for i in order if mesh.shape[i] > 1)
