"""Memory-aware solving: the solve that turns a memory budget no plan meets into an ``InfeasibleError`` naming the smallest budget that is feasible.

The memory model itself (which values XLA materialises, their live ranges, the budget rows) lives
in the C++ core (``cpp/include/alpa/memory.h``, docs/core_api.md "Memory").
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.sparse

from alpa_pass import _core
from alpa_pass.errors import InfeasibleError, SolverError
from alpa_pass.solve.highs import Solution, SolveOptions, lp_bound, solve_ilp


# What a user can change when no plan fits: named in every memory InfeasibleError.
LEVERS = ("shard the parameters and optimizer state (ap.Zero3Parallel), split the layers into "
          "pipeline stages (ap.PipeshardParallel), recompute activations in the backward pass "
          "(jax.checkpoint, remat) or use more devices")


def solve_within_budget(problem, budget: int | None, options: SolveOptions, where: str) -> Solution:
    """Solve ``problem.ilp`` (a ``_core.ShardingProblem``, memory rows included when ``budget``).

    When HiGHS stops without a plan and a budget is set, the least-memory plan decides: one under
    the budget is handed to HiGHS as its first incumbent (a plan is returned, never "no feasible
    plan"); none under it is an ``InfeasibleError``.

    Raises:
      InfeasibleError: no plan fits ``budget``; the message names the smallest budget the planner
        estimates feasible (the optimum of ``_core.min_max_row_problem``) in GiB and bytes, a
        lower bound below which no plan fits (its LP relaxation) and the levers (``LEVERS``).
      SolverError / InfeasibleError from ``solve_ilp`` when the budget is not the cause.
    """
    if budget is not None and problem.num_memory_rows > 0:
        free = _solve_unbudgeted(problem, budget, options)
        if free is not None:
            return free
    redundant = redundant_memory_rows(problem.ilp) if budget is not None and problem.num_memory_rows else None
    try:
        return solve_ilp(problem.ilp, options, drop_rows=redundant)
    except (InfeasibleError, SolverError) as e:
        if budget is None or problem.num_memory_rows == 0:
            raise
        if isinstance(e, SolverError) and options.objective_bound is not None:
            raise  # a mesh search's cutoff (or a stop) on a shape that cannot beat the best one
        options = dataclasses.replace(options, objective_bound=None)
        found = least_memory_plan(problem, options)
        if found is None:
            raise
        smallest, assignment = found
        if smallest <= budget:
            if isinstance(e, InfeasibleError):
                raise  # the budget is not what makes it infeasible
            return solve_ilp(problem.ilp, options, start=assignment, drop_rows=redundant)  # never worse than it
        raise infeasible_error(where, budget, smallest, memory_lower_bound(problem, options)) from e


def _solve_unbudgeted(problem, budget: int, options: SolveOptions) -> Solution | None:
    """The optimum of ``problem`` without its memory rows if that plan meets ``budget`` (then it
    is the budgeted optimum too: a relaxation's optimum that satisfies the dropped rows), else
    None. Memory rows make HiGHS's LP much harder (LLaMA-8B on 8x8: ...), and a default budget
    (``device_memory_fraction``) is often met by the free plan. Only a solve HiGHS finished
    counts (a time-limited one is left to the budgeted solve), and the plan's peak is checked by
    the same liveness model (``predicted_peak``, every schedule point) the rows come from."""
    try:
        free = solve_ilp(problem.ilp, options, drop_linear_rows=True)
    except SolverError:
        if options.objective_bound is not None:
            raise  # cut off: the budgeted problem (fewer plans) cannot beat the bound either
        return None
    except InfeasibleError:
        return None  # the budgeted solve says why
    if free.time_limited or problem.predicted_peak(free.assignment)[0] > budget:
        return None
    return free


def redundant_memory_rows(ilp, window: int = 64, tol: float = 1e-9) -> np.ndarray:
    """Indices of memory rows that another memory row dominates (every coefficient <= the
    other's, same upper bound), compared within ``window`` schedule points: dropping them leaves
    the feasible plans, and so the optimum, unchanged. Memory rows are the live bytes at
    schedule points, so neighbouring points mostly hold subsets of each other's tensors.

    A row is dropped only when it is below a row in the strict order "dominated, or equal with a
    lower index"; the maximal rows of that order stay, and every dropped row is below one."""
    start = int(ilp.linear_row_start)
    if start >= ilp.num_rows:
        return np.zeros(0, dtype=np.int64)
    a = scipy.sparse.csc_matrix((np.asarray(ilp.a_value), np.asarray(ilp.a_index), np.asarray(ilp.a_start)),
                                shape=(int(ilp.num_rows), int(ilp.num_cols)))
    m = a[start:, :].tocsr()
    upper = np.asarray(ilp.row_upper)[start:]
    n = m.shape[0]
    dropped = np.zeros(n, dtype=bool)
    for k in range(1, min(window, n - 1) + 1):
        d = (m[k:] - m[:-k]).tocsr()  # row i: m[i + k] - m[i]
        d.sum_duplicates()
        neg = d.copy()
        neg.data = (neg.data < -tol).astype(np.int8)
        pos = d.copy()
        pos.data = (pos.data > tol).astype(np.int8)
        no_neg = np.asarray(neg.sum(axis=1)).ravel() == 0  # m[i] <= m[i + k]
        no_pos = np.asarray(pos.sum(axis=1)).ravel() == 0  # m[i + k] <= m[i]
        same_bound = upper[k:] == upper[:-k]
        equal = no_neg & no_pos
        dropped[:-k] |= same_bound & no_neg  # m[i] below m[i + k] (equal: the lower index goes)
        dropped[k:] |= same_bound & no_pos & ~equal
    return np.flatnonzero(dropped) + start


def infeasible_error(where: str, budget: float, smallest: float, lower: float | None = None,
                     which: str = "") -> InfeasibleError:
    """The InfeasibleError for a budget no plan meets: ``smallest`` = the least peak of a plan the
    planner found (its ``smallest_feasible_bytes``), ``lower`` = a proven lower bound on every
    plan's peak (``lower_bound_bytes``; ``which``: which plans it bounds, e.g. untied ones)."""
    bound = "" if lower is None else \
        f"; no plan{which} fits under {_gib(lower)} GiB ({math.floor(lower)} bytes, a lower bound)"
    err = InfeasibleError(
        f"no sharding plan on mesh {where} keeps the per-device peak memory under "
        f"memory_budget_per_device = {_gib(budget)} GiB ({int(budget)} bytes); the smallest budget "
        f"the planner estimates feasible is {_gib(smallest)} GiB ({math.ceil(smallest)} bytes){bound}; "
        f"raise memory_budget_per_device, or {LEVERS}")
    err.smallest_feasible_bytes = math.ceil(smallest)
    err.lower_bound_bytes = None if lower is None else math.floor(lower)
    return err


def least_memory_plan(problem, options: SolveOptions) -> tuple | None:
    """(peak bytes, assignment) of the plan of ``problem`` with the least per-device peak (None if
    no plan exists at all, e.g. contradictory ties): "minimise M, every memory row <= M" (same
    one-hot and tie constraints, no costs), within the solver's gap of the optimum."""
    try:
        solution = solve_ilp(_core.min_max_row_problem(problem.ilp), options)
    except (InfeasibleError, SolverError):
        return None
    return float(problem.predicted_peak(solution.assignment)[0]), solution.assignment


def smallest_feasible_peak(problem, options: SolveOptions) -> float | None:
    """The least per-device peak any plan of ``problem`` reaches (``least_memory_plan``)."""
    found = least_memory_plan(problem, options)
    return None if found is None else found[0]


def memory_lower_bound(problem, options: SolveOptions) -> float | None:
    """A proven lower bound on the per-device peak of every plan of ``problem`` (memory rows
    needed): the LP relaxation of ``_core.min_max_row_problem``. Deterministic (no branching, no
    incumbent); None if the LP does not solve (time limit)."""
    if problem.num_memory_rows == 0:
        return None
    return lp_bound(_core.min_max_row_problem(problem.ilp), options)


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.4g}"


def resolve_budget(option, devices) -> tuple:
    """(option with the memory budget to plan under, {"bytes", "source"} describing it).

    A given ``memory_budget_per_device`` is kept ("given"). Otherwise, on GPU/TPU devices whose
    ``memory_stats()`` report a ``bytes_limit``, the budget is ``device_memory_fraction`` of the
    smallest such limit ("device"); on CPU, with ``device_memory_fraction=None`` or without
    memory stats there is none ("none").
    """
    if option.memory_budget_per_device is not None:
        return option, {"bytes": int(option.memory_budget_per_device), "source": "given"}
    limits = [_bytes_limit(d) for d in devices if getattr(d, "platform", "cpu") != "cpu"]
    if option.device_memory_fraction is None or not limits or None in limits:
        return option, {"bytes": None, "source": "none"}
    budget = int(min(limits) * option.device_memory_fraction)
    return (dataclasses.replace(option, memory_budget_per_device=budget),
            {"bytes": budget, "source": "device", "fraction": option.device_memory_fraction,
             "bytes_limit": min(limits)})


def _bytes_limit(device):
    try:
        stats = device.memory_stats()
    except Exception:  # backends without memory stats raise (e.g. NotImplementedError, XlaRuntimeError)
        return None
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None
