"""Memory-aware solving: the solve that turns a memory budget no plan meets into an ``InfeasibleError`` naming the smallest budget that is feasible.

The memory model itself (which values XLA materialises, their live ranges, the budget rows) lives
in the C++ core (``cpp/include/alpa/memory.h``, docs/core_api.md "Memory").
"""
from __future__ import annotations

import dataclasses
import math

from alpa_pass import _core
from alpa_pass.errors import InfeasibleError, SolverError
from alpa_pass.solve.highs import Solution, SolveOptions, solve_ilp


def solve_within_budget(problem, budget: int | None, options: SolveOptions, where: str) -> Solution:
    """Solve ``problem.ilp`` (a ``_core.ShardingProblem``, memory rows included when ``budget``).

    Raises:
      InfeasibleError: no plan fits ``budget``; the message names the smallest budget the planner
        estimates feasible (the optimum of ``_core.min_max_row_problem``) in GiB and bytes.
      SolverError / InfeasibleError from ``solve_ilp`` when the budget is not the cause.
    """
    try:
        return solve_ilp(problem.ilp, options)
    except (InfeasibleError, SolverError) as e:
        if budget is None or problem.num_memory_rows == 0:
            raise
        smallest = smallest_feasible_peak(problem, options)
        if smallest is None or (isinstance(e, SolverError) and smallest <= budget):
            raise
        err = InfeasibleError(
            f"no sharding plan on mesh {where} keeps the per-device peak memory under "
            f"memory_budget_per_device = {_gib(budget)} GiB ({int(budget)} bytes); the smallest budget "
            f"the planner estimates feasible is {_gib(smallest)} GiB ({math.ceil(smallest)} bytes); "
            f"raise memory_budget_per_device or use more devices")
        err.smallest_feasible_bytes = math.ceil(smallest)
        raise err from e


def smallest_feasible_peak(problem, options: SolveOptions) -> float | None:
    """The least per-device peak any plan of ``problem`` reaches (None if no plan exists at all,
    e.g. contradictory ties). Solves "minimise M, every memory row <= M" (same one-hot and tie
    constraints, no costs); within the solver's gap of the optimum."""
    try:
        solution = solve_ilp(_core.min_max_row_problem(problem.ilp), options)
    except (InfeasibleError, SolverError):
        return None
    return float(problem.predicted_peak(solution.assignment)[0])


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
