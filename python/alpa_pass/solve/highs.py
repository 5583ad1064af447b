"""Solve an ``IlpProblem`` (the C++ core's named CSC arrays) with HiGHS through highspy."""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import time
from types import SimpleNamespace

import highspy
import numpy as np

from alpa_pass import _core
from alpa_pass.errors import InfeasibleError, SolverError
from alpa_pass.solve import eliminate
from alpa_pass.solve.highs_io import _check_start, _highs, _pass_model, _quiet_stdout, _run, _set_start
from alpa_pass.solve.support import ColumnSpace, Support, groups_of, support_plan

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SolveOptions:
    """Attributes: time_limit_s (wall-clock seconds; ``None``: no limit. A solve stopped by it
    depends on machine speed and load), rel_gap (stop at this relative MIP gap), threads (1 is
    deterministic), log_to_console, keep_log (return HiGHS's log text in the result), seed,
    objective_bound (a cutoff: stop once no better plan can exist), node_limit (branch-and-bound
    nodes, ``None``: no limit; unlike the time limit, a solve stopped by it returns the same plan
    on any machine), sub_mip_heuristics (HiGHS's RINS/RENS sub-MIPs and root restarts; off by
    default: on these ILPs the root LP, cuts and the cheap heuristics find the optimum anyway, and
    the sub-MIPs cost most of the time: the 3-layer MLP's 2x2x2 main solve 2.45 -> 0.58 s, 8164 ->
    1498 simplex iterations, its unmerged refinement 21590 -> 4310; the same optima, and the proof
    of optimality is unchanged (branching and cuts stay on); the 39B GPT 8x8 and the 2-layer GPT 2x4
    main solves: the same iterations),
    eliminate_chains (solve the exact reduction of ``solve.eliminate``: ties substituted, dominated
    strategies dropped, groups of degree <= 2 (e.g. follower chains) folded into their neighbours,
    equal edge-cost rows sharing product columns; same optimum, smaller ILP; the planner's solves
    use it, ``AutoShardingOption.solve_options``),
    presolve and feasibility_jump (HiGHS's MIP presolve and its feasibility-jump heuristic; off by
    default: after the exact reduction presolve removes ~1% of a model and takes half the solve,
    and the root LP is integral or nearly so. Off vs on, the same optima: the 2-layer test GPT
    2x2x2 main solve 3.06 -> 0.84 s, LLaMA-8B 8x8 4.4 -> 0.96 s, GPT-39B 8x8 (alpa suite) wall
    24.7 -> 17.4 s; its 40 GiB row round 7.8 -> 6.8 s),
    support_gap (for a model with memory rows (one-sided linear rows) and no ``start``: first
    solve its LP relaxation, then the MIP restricted to the strategies the LP uses (HiGHS presolve
    on: it removes the rest) and, when that plan is not within this relative gap of the LP bound,
    the MIP with the groups the LP sets integrally fixed and the others free (RENS), stopped at a
    plan within the gap (HiGHS ``objective_target``); a plan within the gap is returned without
    the full MIP (status "LP-support plan", ``mip_gap`` its gap to the LP bound), else the better
    one is the full MIP's first incumbent. ``None``: off. Deterministic (no time involved). Near
    the feasibility edge the full MIP is hopeless: LLaMA-8B 8x8 at 35 GiB, 593 memory rows, the
    support-only plan 13.2% above the LP bound, the full MIP 1.2% after 150 s (8 nodes); RENS
    1.4% in 17 s). A budget makes
    the full MIP hard where the budget binds: GPT-39B 8x8 at 80 GiB, 1351 memory rows, had no
    plan after 150 s and 4.56e11 after 240 s (bound 4.27e11); the LP (5 s, memory rows added as
    broken, ``solve.support.SUPPORT_ROWS_PER_ROUND``) and the restricted MIP (4.6 s) give
    4.553e11, 6.7% above the LP bound; ``solve.support``),
    support_draft (with support_gap: stop after the restricted MIP and return its plan whatever
    its gap: no RENS, no full MIP. For the intermediate plans of a budgeted solve whose reshard
    copies are still being counted (``driver.budget.fit_reshard_copies``): such a plan is replaced
    by the next round's, so only the last one is finished to ``support_gap``),
    start_support_columns (with support_gap and a ``start``: a model (after the exact reduction)
    with more columns than this takes the LP-support path too, the start's strategies joining the
    LP's support; ``None``: a start always goes to the full MIP. For the unmerged refinement
    (``driver.refine``): GPT-175B 16x16's reduced ILP, 82,020 columns, spent 100-190 s in the full
    MIP's root cut rounds for 1.4446e11 (scaled); its LP takes 8 s and the MIP over the LP's
    support and the start 1.1 s, 1.4513e11 (+0.46%)),
    lp_iteration_limit (the LP-support path's LP relaxation stops after this many simplex
    iterations, counted over its rounds, and the solve raises ``solve.support.LpWorkLimitError``
    instead of trying the full MIP: a bound on work that is the same on every machine; ``None``:
    none. The unmerged refinement's, ``driver.refine.REFINE_LP_ITERATIONS``)."""

    time_limit_s: float | None = None
    rel_gap: float = 1e-4
    threads: int = 1
    log_to_console: bool = False
    keep_log: bool = False
    seed: int = 0
    objective_bound: float | None = None
    node_limit: int | None = None
    sub_mip_heuristics: bool = False
    eliminate_chains: bool = False
    presolve: bool = False
    feasibility_jump: bool = False
    support_gap: float | None = None
    support_draft: bool = False
    start_support_columns: int | None = None
    lp_iteration_limit: int | None = None


@dataclasses.dataclass
class Solution:
    assignment: np.ndarray   # strategy index per ILP group
    x: np.ndarray            # full column vector
    objective: float         # c.x + offset
    status: str              # HiGHS model status, e.g. "Optimal", "Time limit reached"
    optimal: bool
    mip_gap: float
    time_limited: bool       # stopped by the time limit: the result depends on machine speed and load
    solve_time_s: float
    log: str = ""
    node_limited: bool = False  # stopped by the node limit: deterministic, but maybe not optimal
    solved_size: tuple = (0, 0)  # (columns, rows) HiGHS solved: the exact reduction's when it applied
    support: Support | None = None  # an LP-support plan's LP support and bound (None: found on a carried one)


def solve_ilp(problem, options: SolveOptions = SolveOptions(), start=None, drop_rows=None, candidate=None,
              support: Support | None = None) -> Solution:
    """Solve ``problem`` (an ``alpa_pass._core.IlpProblem``).

    ``start``: optional strategy index per ILP group, a feasible assignment handed to HiGHS as its
    first incumbent (every group column given; HiGHS completes the edge columns), so the result is
    never worse than ``start`` (ValueError if it has the wrong length or an index out of range).
    ``drop_rows``: indices of rows to leave out (redundant rows, or a relaxation's: memory rows
    added lazily, ``driver.budget``).
    On the LP-support path (``SolveOptions.support_gap``, no ``start``): ``candidate``, a plan (a
    strategy per group) whose strategies join the LP's support in the restricted MIP, its first
    incumbent when it meets the rows (the plan is then never worse than it: a draft finished by
    ``driver.budget.finish_draft`` keeps the draft's plan when the new LP bound already certifies
    it, without RENS); ``support``, the ``Solution.support`` of a solve of a relaxation of
    ``problem``: the MIP restricted to its strategies (with the candidate's and each group's
    least-memory ones) is tried first, stopped at the first plan within ``support_gap`` of
    ``support.bound``; such a plan is returned without an LP (its ``mip_gap`` measured from that
    bound; each MIP at most ``solve.support.CARRIED_NODE_LIMIT`` nodes). The reshard-copy rounds
    of a budgeted solve (``driver.budget.fit_reshard_copies``): GPT 1.3B 2x4 at 14 GiB 20.0 -> 12.0 s of solve,
    2 LPs instead of 4, a 7% cheaper plan; GPT-39B 8x8 at 80 GiB 37.7 -> 32.4 s, 1% cheaper.

    Raises:
      InfeasibleError: HiGHS proved the problem infeasible.
      SolverError: HiGHS stopped without any feasible solution (time limit, error).
    """
    h = _highs(options, presolve=options.presolve)
    log_path = None
    if options.keep_log:
        h.setOptionValue("output_flag", True)
        fd, log_path = tempfile.mkstemp(prefix="alpa_pass_highs_", suffix=".log")
        os.close(fd)
        h.setOptionValue("log_file", log_path)
    full, scale = _prepared(problem, np.unique(np.asarray([] if drop_rows is None else drop_rows, dtype=np.int64)))
    if options.objective_bound is not None:
        h.setOptionValue("objective_bound", float(options.objective_bound) * scale)
    reduced = eliminate.reduce(full) if options.eliminate_chains else None
    model = full if reduced is None else reduced.model
    _pass_model(h, model, highspy)
    t0 = time.perf_counter()
    if start is not None:
        _check_start(problem, start)
    if options.support_gap is not None and options.objective_bound is None and (
            _has_one_sided_rows(model) if start is None else
            options.start_support_columns is not None and model.num_cols > options.start_support_columns):
        space = ColumnSpace(problem, reduced, model)
        candidate = start if start is not None else candidate
        if candidate is not None:
            _check_start(problem, candidate)
        if support is not None and support.columns.size != space.gs[-1] - space.gs[0]:
            raise ValueError(f"support has {support.columns.size} columns, the problem {space.gs[-1] - space.gs[0]} "
                             f"group columns")
        found = support_plan(model, options, None if candidate is None else space.start(candidate),
                              None if support is None else (space.to_model(support.columns), support.bound * scale))
        if found is not None and (found[2] <= options.support_gap or options.support_draft):
            x, bound, gap, used = found
            out = _solution(problem, reduced, model, x, SUPPORT_STATUS, gap <= options.rel_gap, gap,
                            time.perf_counter() - t0, _read_and_remove(log_path))
            # (a plan found on a carried support passes none on: its bound would be two relaxations
            # old; on GPT-175B 16x16 at 80 GiB the second carried round missed after 14 s)
            out.support = None if used is None else Support(space.to_problem(used), bound / scale)
            return out
        if found is not None:
            _set_start(h, model, groups_of(model, found[0]), highspy)
        elif start is not None:
            _set_start(h, model, space.start(start), highspy)
    elif start is not None:
        _set_start(h, model, start if reduced is None else reduced.start(start), highspy)
    _run(h, highspy)
    elapsed = time.perf_counter() - t0
    status = h.getModelStatus()
    status_text = h.modelStatusToString(status)
    log = _read_and_remove(log_path)
    if status == highspy.HighsModelStatus.kInfeasible and options.objective_bound is not None:
        # HiGHS uses the bound as a cutoff and reports a cut-off problem as infeasible.
        raise SolverError(f"cannot beat objective {options.objective_bound:.6g}: HiGHS proved no plan "
                          f"is cheaper (stopped after {elapsed:.1f}s)")
    if status == highspy.HighsModelStatus.kInfeasible:
        raise InfeasibleError(f"the sharding ILP is infeasible (HiGHS: {status_text}); relax the "
                              f"constraints (memory budget, forced shardings) or use a larger mesh")
    info = h.getInfo()
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    if x.size != model.num_cols or info.primal_solution_status != 2:  # 2 = feasible
        raise SolverError(f"HiGHS stopped without a feasible plan ({status_text}) after {elapsed:.1f}s and "
                          f"{info.mip_node_count} nodes; {_raise_which(status, highspy)}")
    gap = float(info.mip_gap) if problem.integrality.any() else 0.0
    return _solution(problem, reduced, model, x, status_text, status == highspy.HighsModelStatus.kOptimal, gap,
                     elapsed, log, time_limited=status == highspy.HighsModelStatus.kTimeLimit,
                     node_limited=status == highspy.HighsModelStatus.kSolutionLimit)


def _solution(problem, reduced, model, x, status, optimal, gap, elapsed, log, time_limited=False,
              node_limited=False) -> Solution:
    """The Solution of ``model``'s column vector ``x`` (expanded to ``problem`` through ``reduced``)."""
    if reduced is None:
        assignment = np.asarray(_core.decode_assignment(problem, x), dtype=np.int64)
    else:
        assignment = reduced.expand(x)
        x = reduced.full_columns(assignment, int(problem.num_cols), problem.group_var_start, x)
    objective = float(_core.evaluate(problem, assignment).objective)
    return Solution(assignment=assignment, x=x, objective=objective, status=status, optimal=optimal,
                    mip_gap=gap, solve_time_s=elapsed, log=log,
                    time_limited=time_limited, node_limited=node_limited,
                    solved_size=(int(model.num_cols), int(model.num_rows)))


def _has_one_sided_rows(model) -> bool:
    lower, upper = np.asarray(model.row_lower), np.asarray(model.row_upper)
    return bool((np.isneginf(lower) & np.isfinite(upper)).any())


# Solution.status of a plan kept by SolveOptions.support_gap (the LP-support MIP's, not the full one's)
SUPPORT_STATUS = "LP-support plan"


# Rows whose largest finite bound exceeds this (memory rows: bytes, ~1e10) are scaled to it before
# HiGHS sees them: the same ILP, and HiGHS no longer reports a badly scaled problem. On the
# LLaMA-8B-shaped step's 40 GiB solve (8x8, 10 memory rows, bench_budget.py) 11.6 -> 6.8 s, the
# same optimum. 1e3 rather than 1: HiGHS drops matrix values below 1e-9 (small_matrix_value), and
# a 4-byte scalar in a 1 TB row is still 4e-6 at this scale.
ROW_SCALE_TARGET = 1e3

# Costs are scaled (by a power of two: exact) so the largest is at most this before HiGHS sees
# them. Unscaled, the GPT-39B step's costs (8x8, 80 GiB) span 8e-6..1.2e12; HiGHS warned of a
# badly scaled objective and, in the first reshard-copy round, its dual simplex stopped with
# status Unknown (dual infeasibilities it could not remove) two rows into the LP-support LP, so
# the full MIP ran instead (still at its root node after 16 minutes). Scaled, the LPs reach their
# optima (bench_planning.py --budget 80 on that step: solve 47.8 s).
COST_SCALE_TARGET = 1e3


def _prepared(problem, rows) -> tuple:
    """(the model HiGHS gets, its objective's scale): ``problem`` without ``rows``, its large-bound
    rows scaled to ``ROW_SCALE_TARGET`` and its costs by the power of two that brings the largest to
    at most ``COST_SCALE_TARGET`` (``problem`` itself and 1.0 when none applies). HiGHS's objective
    values (bounds, targets) are in the model's units: ``scale`` times the problem's."""
    bound = np.maximum(_finite_abs(problem.row_lower), _finite_abs(problem.row_upper))
    largest_cost = float(_finite_abs(problem.col_cost).max(initial=0.0))
    scale = 2.0 ** -math.ceil(math.log2(largest_cost / COST_SCALE_TARGET)) if largest_cost > COST_SCALE_TARGET else 1.0
    if not rows.size and not (bound > ROW_SCALE_TARGET).any() and scale == 1.0:
        return problem, scale
    model = without_rows(problem, rows)
    bound = np.maximum(_finite_abs(model.row_lower), _finite_abs(model.row_upper))
    row_scale = np.where(bound > ROW_SCALE_TARGET, ROW_SCALE_TARGET / np.maximum(bound, 1.0), 1.0)
    model.a_value = model.a_value * row_scale[model.a_index]
    model.row_lower, model.row_upper = model.row_lower * row_scale, model.row_upper * row_scale
    model.col_cost, model.offset = np.asarray(model.col_cost, dtype=np.float64) * scale, model.offset * scale
    return model, scale


def _finite_abs(values) -> np.ndarray:
    values = np.abs(np.asarray(values, dtype=np.float64))
    return np.where(np.isfinite(values), values, 0.0)


def without_rows(problem, rows) -> SimpleNamespace:
    """``problem``'s model (the CSC attributes HiGHS and ``solve.eliminate`` read) with the rows
    ``rows`` (sorted, unique) left out and the others renumbered; the columns are unchanged."""
    num_cols, num_rows = int(problem.num_cols), int(problem.num_rows)
    keep = np.ones(num_rows, dtype=bool)
    keep[rows] = False
    renumber = np.cumsum(keep) - 1
    a_start = np.asarray(problem.a_start, dtype=np.int64)
    a_index = np.asarray(problem.a_index, dtype=np.int64)
    kept = keep[a_index]
    col_of = np.repeat(np.arange(num_cols), np.diff(a_start))
    counts = np.bincount(col_of[kept], minlength=num_cols)
    return SimpleNamespace(
        num_cols=num_cols, num_rows=int(keep.sum()), num_edge_vars=int(problem.num_edge_vars),
        group_var_start=np.asarray(problem.group_var_start, dtype=np.int64), offset=float(problem.offset),
        col_cost=np.asarray(problem.col_cost), col_lower=np.asarray(problem.col_lower),
        col_upper=np.asarray(problem.col_upper), integrality=np.asarray(problem.integrality),
        row_lower=np.asarray(problem.row_lower)[keep], row_upper=np.asarray(problem.row_upper)[keep],
        a_start=np.concatenate([[0], np.cumsum(counts)]), a_index=renumber[a_index[kept]],
        a_value=np.asarray(problem.a_value, dtype=np.float64)[kept])


def _raise_which(status, highspy) -> str:
    """What to change when a solve stopped at a limit without a feasible plan."""
    if status == highspy.HighsModelStatus.kTimeLimit:
        return "raise AutoShardingOption.solver_time_limit_s (or set it to None: no wall-clock limit)"
    if status == highspy.HighsModelStatus.kSolutionLimit:
        return "raise AutoShardingOption.solver_node_limit"
    return "the sharding ILP may be malformed; please report it"


def lp_bound(problem, options: SolveOptions = SolveOptions()) -> float | None:
    """The optimum of ``problem``'s LP relaxation (integrality dropped): a lower bound on every
    integer solution's objective. Deterministic (simplex, no branching); None if HiGHS does not
    reach the LP optimum (a time limit: then nothing is proven)."""
    with _quiet_stdout(not options.log_to_console):
        h = highspy.Highs()
    h.setOptionValue("output_flag", bool(options.log_to_console))
    h.setOptionValue("time_limit", float("inf") if options.time_limit_s is None else float(options.time_limit_s))
    h.setOptionValue("threads", int(options.threads))
    h.setOptionValue("random_seed", int(options.seed))
    h.setOptionValue("solve_relaxation", True)
    _pass_model(h, problem, highspy)
    if h.run() == highspy.HighsStatus.kError and h.getModelStatus() == highspy.HighsModelStatus.kNotset:
        h.resetGlobalScheduler(True)  # see solve_ilp
        h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return float(h.getInfo().objective_function_value)


def _read_and_remove(path):
    if path is None:
        return ""
    try:
        with open(path) as f:
            return f.read()
    finally:
        os.remove(path)


