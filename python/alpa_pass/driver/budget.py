"""Memory-aware solving: the solve that turns a memory budget no plan meets into an ``InfeasibleError`` naming the smallest budget that is feasible.

The memory model itself (which values XLA materialises, their live ranges, the budget rows) lives
in the C++ core (``cpp/include/alpa/memory.h``, docs/core_api.md "Memory"). The budget rows are
not in ``problem.ilp``: each solve gets the rows it needs (``problem.ilp_with_memory_rows``), and
a plan's activity in every row comes from the live ranges (``problem.memory_row_activity``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np

from alpa_pass import _core
from alpa_pass.driver import exact_fit
from alpa_pass.driver.memory_rows import memory_row_matrix, redundant_memory_rows, undominated_memory_rows
from alpa_pass.driver.reshard_copies import ReshardCopies
from alpa_pass.errors import InfeasibleError, SolverError
from alpa_pass.solve.highs import SUPPORT_STATUS, Solution, SolveOptions, Support, lp_bound, solve_ilp
from alpa_pass.solve.support import LpWorkLimitError

log = logging.getLogger("alpa_pass")


# What a user can change when no plan fits: named in every memory InfeasibleError.
LEVERS = ("shard the parameters and optimizer state (ap.Zero3Parallel), split the layers into "
          "pipeline stages (ap.PipeshardParallel), recompute activations in the backward pass "
          "(jax.checkpoint, remat) or use more devices")


# Rounds of memory-row generation after the free solve (round 0) before the budgeted ILP is solved
# with every undominated row (a count, not a time: the plan does not depend on the machine). On the
# LLaMA-8B-shaped step (8x8, 40 GiB, bench_budget.py) the free plan breaks 10 of 3275 rows and
# round 1 with them is the budgeted optimum: 6.8 s, against 54 s for the solve with all 1860
# undominated rows (the same plan). (With an older leader rule, the free plan broke 414 rows and
# round 1 ran past 600 s; this was 0 then.)
MAX_ROW_ROUNDS = 3
# A round that breaks more memory rows than this adds only those no other broken row dominates
# (redundant_memory_rows over the broken rows, materialised: a broken row's dominator is broken
# too). GPT-39B 8x8 at 80 GiB: the free plan breaks 3021 of 5177 rows, 1351 of them undominated.
FILTER_BROKEN_ROWS = 64
# Re-solves with the reshard copies of the plans found so far counted in the memory rows
# (fit_reshard_copies), before the least-memory plan is tried.
MAX_COPY_ROUNDS = 2
# Then re-solves with the memory rows' budget lowered each time by the last plan's excess (its
# copies counted too): each plan makes a few copies no earlier plan made (GPT 2x2 at 0.8 of the
# free peak: 4 plain re-solves never fit, the least-memory plan cost 5.2x).
TIGHTENED_COPY_ROUNDS = 4
# A re-solve with reshard copies counted starts with the memory rows the previous plan fills past
# this fraction of the budget instead of none (LLaMA-8B 8x8 at 40 GiB: ~58 of 3720 rows; the free
# solve it replaces took ~4 s a round and broke ~16).
HINT_ROW_FRACTION = 0.97
# The free plan's reshard copies are counted before the first budgeted solve when its peak with
# them is within this factor of the budget (LLaMA-8B 8x8 at 40 GiB: 42.5 GiB, one re-solve fewer;
# GPT-39B 8x8 at 80 GiB: 207.8 GiB, whose copies are not the budgeted plan's: 28 s more).
FREE_COPIES_WITHIN = 1.25
LEAST_MEMORY_STATUS = "least-memory plan"  # Solution.status of fit_reshard_copies' last resort...
LEAST_PEAK_STATUS = "least-peak plan"  # ...or, when that peaks over the budget, exact_fit.least_peak_plan's
# Re-solves of the least-memory problem with the reshard copies of its last plan counted
# (least_memory_plan, when fit_reshard_copies falls back to it; not for the InfeasibleError's
# estimate: on LLaMA-8B seq 8192 at 80 GiB they took the error from 40 to 190 s).
LEAST_MEMORY_COPY_ROUNDS = 2


def solve_within_budget(problem, budget: int | None, options: SolveOptions, where: str,
                        hint=None, copies: ReshardCopies | None = None, start=None, candidate=None,
                        support: Support | None = None, explain: bool = True) -> Solution:
    """Solve ``problem`` (a ``_core.ShardingProblem``; its memory rows when ``budget``).

    The memory rows stay out of ``problem.ilp`` (``_core`` memory.h MemoryRows: thousands of rows over
    most groups on a large model) and are added lazily (:func:`_solve_with_row_generation`): the
    ILP is solved without them (a plan meeting them all is the optimum: that of a relaxation, and
    feasible), then, for ``MAX_ROW_ROUNDS`` rounds, with the rows the plans broke; then the ILP is
    solved with every memory row no other row dominates. A default budget is often met by the free
    plan (one solve, no rows). When the free plan's peak with its reshard copies is over
    ``exact_fit.FRONTIER_OVER`` times the budget, the exact-copy plan over its frontier strategies
    (``exact_fit.frontier_plan``: no LP) is the first budgeted plan when it has one. ``hint``: a
    plan of a similar problem whose nearly full rows start in the ILP (see
    ``_solve_with_row_generation``). ``copies``: the problem's ``ReshardCopies``: those of a free
    plan that nearly fits are counted before the first budgeted solve (then ``copies.problem`` is
    the problem solved). ``start``: a plan (a strategy per group) meeting every row, each solve's
    first incumbent (and the ``hint`` when none is given): the result is never worse. ``candidate``
    and ``support``: ``solve_ilp``'s, for the LP-support solves (``support``: of a relaxation of
    ``problem``; each row round passes its own on to the next, a restriction of it).
    ``explain=False``: an InfeasibleError is raised as found, without the least-memory plan and the
    lower bound its message would name (the callers that catch it: ``fit_reshard_copies`` backs off
    or falls back to the least-memory plan itself; a GPT-39B 8x8 80 GiB run with two such rounds:
    41 and 39 s each -> 0.6 s, wall 130 -> 55 s).

    When HiGHS stops without a plan and a budget is set, the least-memory plan decides: one under
    the budget is handed to HiGHS as its first incumbent (a plan is returned, never "no feasible
    plan"); none under it is an ``InfeasibleError``.

    Raises:
      InfeasibleError: no plan fits ``budget``; the message names the smallest budget the planner
        estimates feasible (the optimum of ``_core.min_max_row_problem``) in GiB and bytes, a
        lower bound below which no plan fits (its LP relaxation) and the levers (``LEVERS``).
      SolverError / InfeasibleError from ``solve_ilp`` when the budget is not the cause.
    """
    budgeted = budget is not None and problem.num_memory_rows > 0
    kept = None  # the memory rows of the full budgeted ILP once chosen (None: all)
    try:
        if budgeted and problem.memory_row_lower_bound() > budget:
            # some memory row exceeds the budget with every group at its least coefficient in it:
            # no plan fits, proven in closed form (LLaMA-8B seq 8192 at 80 GiB: round 1 with the
            # 2711 rows the free plan broke took 205 s to prove it)
            raise InfeasibleError(f"a memory row's least total exceeds the budget on mesh {where}")
        if not budgeted:
            return solve_ilp(problem.ilp, options, start=start)
        found, problem = _solve_with_row_generation(problem, options, where, start if hint is None else hint,
                                                    copies, start, candidate, support)
        if found is not None:
            return found
        kept = undominated_memory_rows(problem)
        log.info("alpa_pass: mesh %s: %d of %d memory rows dominated by another, dropped", where,
                 problem.num_memory_rows - kept.size, problem.num_memory_rows)
        return solve_ilp(problem.ilp_with_memory_rows(kept), options, start=start)
    except (InfeasibleError, SolverError) as e:
        if not budgeted or (isinstance(e, InfeasibleError) and not explain) or isinstance(e, LpWorkLimitError):
            raise  # (a refinement's work bound: the caller keeps its plan)
        if isinstance(e, SolverError) and options.objective_bound is not None:
            raise  # a mesh search's cutoff (or a stop) on a shape that cannot beat the best one
        options = dataclasses.replace(options, objective_bound=None)
        found = least_memory_plan(problem, options)  # (without copy rounds: LLaMA-8B seq 8192 40 -> 190 s)
        if found is None:
            raise
        smallest, assignment, _ = found
        if smallest <= budget:
            if isinstance(e, InfeasibleError):
                raise  # the budget is not what makes it infeasible
            return solve_ilp(problem.ilp_with_memory_rows(kept), options, start=assignment)  # never worse than it
        if copies is not None:  # (a plan solved on the way, e.g. the free one, may peak lower)
            # (and the least-peak plan, which copies.seen keeps in least_peak when lower)
            exact_fit.least_peak_plan(copies, problem, assignment, options, where)
            smallest = min(smallest, copies.least_peak)
        raise infeasible_error(where, budget, smallest, memory_lower_bound(problem, options, budget)) from e


def fit_budgeted_plan(copies: ReshardCopies, base, problem, solution: Solution, budget: int | None,
                      rounds: SolveOptions, options: SolveOptions, where: str) -> tuple:
    """(problem, solution) whose plan fits ``budget`` with its reshard copies, from the first budgeted
    plan ``solution`` of ``problem`` (``base``: the problem without counted copies).

    The exact-copy plan (``exact_fit.exact_copy_fit``) is kept when it is within
    ``options.support_gap`` of the first LP's bound (what the LP-support path accepts: the copy
    rounds are not run); otherwise the copy rounds (``fit_reshard_copies``, ``rounds``: their
    options) and ``finish_draft`` run and the cheaper of their plan and the exact-copy one is kept.
    (When ``problem`` counts the free plan's copies, ``FREE_COPIES_WITHIN``, that LP's bound is of
    an overcounting problem, not a relaxation.) s24 (2-core VM, solve seconds, rounds only ->
    this): GPT 1.3B 2x4 at 12 / 13 GiB 25 -> 14 s and 13.3% / 17.8% cheaper (the exact plan alone);
    LLaMA-8B 8x8 at 30 GiB 21 -> 27 s, 1.9% cheaper, at 33 GiB 12 -> 17 s, the same plan (both run;
    README "Exact copies")."""
    exact = (exact_fit.exact_copy_fit(copies, base, problem, solution, budget, options, where)
             if exact_fit.EXACT_COPY_PLAN else None)
    if exact is not None and options.support_gap is not None and exact.mip_gap <= options.support_gap:
        log.info("alpa_pass: mesh %s: the exact-copy plan is within %g of the LP bound (%.3g); kept without "
                 "copy rounds", where, options.support_gap, exact.mip_gap)
        return base, exact
    try:
        problem, solution = fit_reshard_copies(copies, problem, solution, budget, rounds, where, base)
    except InfeasibleError:
        if exact is None:
            raise
        log.info("alpa_pass: mesh %s: no copy round's plan fits; the exact-copy plan kept", where)
        return base, exact
    problem, solution = finish_draft(copies, problem, solution, budget, options, where)
    if exact is None:
        return problem, solution
    keep = exact.objective < solution.objective
    log.info("alpa_pass: mesh %s: exact-copy plan %.6g, the copy rounds' %.6g: the %s kept", where, exact.objective,
             solution.objective, "exact-copy plan" if keep else "rounds' plan")
    return (base, exact) if keep else (problem, solution)


def fit_reshard_copies(copies: ReshardCopies, problem, solution: Solution, budget: int | None,
                       options: SolveOptions, where: str, base=None) -> tuple:
    """(problem, solution) whose plan fits ``budget`` with its reshard copies counted.

    Memory rows count values in their own layouts; a consumer reading one in another layout reads
    a copy that XLA keeps from the first consumer wanting that layout to the last (a weight gathered
    for the forward dot and read again by the backward one: ``_core`` memory.h "Reshard copies").
    Which copies a plan makes depends on both ends of each edge, so they are added lazily: while the
    plan's peak with its copies (``problem.predicted_peak``) exceeds the budget, its copies join
    the memory rows (counted whenever their consumer reads the operand in that layout: an upper
    bound) and the ILP is solved again (``copies.add``), ``MAX_COPY_ROUNDS`` times, then
    ``TIGHTENED_COPY_ROUNDS`` times with the rows' bound lowered by the last plan's excess over the
    budget (a deterministic step towards the least-memory plan; halfway back when that admits no
    plan). When no round's plan fits (or the rows with the copies admit no
    plan), the least-memory plan is kept if its peak fits (status ``LEAST_MEMORY_STATUS``), else
    the exact-copy MIP's least-peak plan of ``base`` (``problem`` without counted copies; None:
    ``problem``) if its peak fits (``LEAST_PEAK_STATUS``). Rounds are counted, not timed: the plan
    does not depend on the machine.

    Raises InfeasibleError naming the lower of their peaks (or of a plan seen before) when neither
    fits.
    """
    if budget is None or problem.num_memory_rows == 0:
        return problem, solution
    row_budget = solved_at = budget  # the rows' bound now, and that of the last plan found
    for round_ in range(MAX_COPY_ROUNDS + TIGHTENED_COPY_ROUNDS + 1):
        peak = copies.seen(problem, solution.assignment)
        if peak <= budget * (1 + 1e-9):
            if round_:
                log.info("alpa_pass: mesh %s: the plan fits the budget with its reshard copies after %d "
                         "re-solves (%d copies in the memory rows, rows at %s GiB)", where, round_, len(copies),
                         _gib(row_budget))
            return problem, solution
        if round_ == MAX_COPY_ROUNDS + TIGHTENED_COPY_ROUNDS:
            break
        if round_ >= MAX_COPY_ROUNDS and row_budget == solved_at:  # (not right after backing off)
            row_budget = max(0, int(row_budget - (peak - budget)))  # each plan misses new copies: make room
        log.info("alpa_pass: mesh %s: plan peak %s with its reshard copies exceeds the budget %s; solving again "
                 "with them counted, rows at %s GiB (round %d)", where, _gib(peak), _gib(budget), _gib(row_budget),
                 round_ + 1)
        hint = solution.assignment
        problem = copies.add(problem, hint, None if row_budget == budget else row_budget)
        try:
            # (more copies counted, rows no higher than the last plan's: a restriction of its problem,
            # whose LP support and bound carry over: see solve_ilp's support)
            found = solve_within_budget(problem, row_budget, options, where, hint=hint, copies=copies,
                                        support=solution.support, explain=False)
        except InfeasibleError:
            if row_budget == budget:
                break  # the copies' rows overcount (a copy counted where its producer already has the layout)
            row_budget = (row_budget + solved_at) // 2  # tightened too far: halfway back
            continue
        solution, solved_at = found, row_budget
    log.warning("alpa_pass: mesh %s: no plan fits the budget with its reshard copies after %d re-solves; "
                "keeping the least-memory plan if it fits (its cost can be far higher)", where, round_ + 1)
    return _least_memory_solution(problem, budget, options, where, copies, base)


def draft_options(option) -> SolveOptions:
    """The solve options of a budgeted plan's rounds (the first budgeted solve and
    ``fit_reshard_copies``' re-solves): LP-support drafts (``SolveOptions.support_draft``: the
    restricted MIP's plan, no RENS) when a budget and ``solver_support_gap`` are set, else the
    option's own. Each round's plan is replaced by the next until one fits with its reshard copies,
    and only that one is finished (``finish_draft``): LLaMA-8B 8x8 at 35 GiB spent 20 and 11 s in
    the RENS of two plans the next round replaced."""
    options = option.solve_options()
    if option.memory_budget_per_device is None or options.support_gap is None:
        return options
    return dataclasses.replace(options, support_draft=True)


def finish_draft(copies: ReshardCopies, problem, solution: Solution, budget: int | None, options: SolveOptions,
                 where: str) -> tuple:
    """(problem, solution): ``solution`` when it is no draft or already within
    ``options.support_gap`` of its LP bound; else the problem with the draft's reshard copies
    counted too, solved again with ``options`` (the new LP's support and the draft's strategies,
    the draft the first incumbent when it meets the new rows; then RENS, or the full MIP). A
    finished plan over ``budget`` with its own copies has them counted too and is solved again
    from its LP's support, ``MAX_COPY_ROUNDS`` times (the finished plan's copies are not the
    draft's: LLaMA-8B 8x8 at 35 GiB once finished to 3.744e10 against the draft's 3.833e10 at 35.0x
    GiB, and the draft stayed; drafts taken from a relaxation's support, an experiment, gave GPT
    1.3B 2x4 at 14 GiB a finished 1.05e10 at 15.01 GiB against the draft's 1.28e10, and with these
    rounds 1.127e10 within the budget). The finished plan is kept when no costlier and its plan
    fits ``budget`` with its own copies. Otherwise the draft stays: it fits, its gap is what
    ``plan.mip_gap`` says.
    Deterministic: no clock decides."""
    if (budget is None or solution.status != SUPPORT_STATUS or options.support_gap is None
            or not solution.mip_gap > options.support_gap):
        return problem, solution
    log.info("alpa_pass: mesh %s: the plan that fits its reshard copies is %.3g above its LP bound; finishing it "
             "(solver_support_gap=%g)", where, solution.mip_gap, options.support_gap)
    rows_at = int(problem.memory_row_upper)
    counted, finished, peak, hint = problem, None, math.inf, solution.assignment
    for round_ in range(MAX_COPY_ROUNDS + 1):
        try:
            # (the draft's own copies counted, then the finished plan's: rows it nearly fills start in
            # the ILP, and the finished plan cannot buy its cost back with copies the rows do not see;
            # the draft's strategies join the LP's support, the draft itself the first incumbent when
            # it meets the counted rows: a finished plan no worse than the draft, whose gap the new LP
            # bound may already bring within support_gap without RENS)
            counted = copies.add(counted, hint, None if rows_at == budget else rows_at)
            finished = solve_within_budget(counted, rows_at, options, where, hint=hint, candidate=solution.assignment,
                                           support=None if finished is None else finished.support, explain=False)
        except (InfeasibleError, SolverError):
            break
        peak = copies.seen(counted, finished.assignment)
        if peak <= budget * (1 + 1e-9) or finished.objective > solution.objective:
            break
        log.info("alpa_pass: mesh %s: finished plan peak %s GiB with its copies; counting them (round %d)", where,
                 _gib(peak), round_ + 1)
        hint = finished.assignment
    keep = finished is not None and finished.objective <= solution.objective and peak <= budget * (1 + 1e-9)
    if finished is not None:
        log.info("alpa_pass: mesh %s: finished plan objective %.6g (%s, gap %.3g), peak %s GiB with its copies: %s",
                 where, finished.objective, finished.status, finished.mip_gap, _gib(peak),
                 "kept" if keep else f"the draft's {solution.objective:.6g} stays")
    return (counted, finished) if keep else (problem, solution)


def _least_memory_solution(problem, budget: int, options: SolveOptions, where: str, copies, base=None) -> tuple:
    """(problem, the least-memory plan of ``problem`` (``least_memory_plan``) as a Solution) when
    its peak, reshard copies included, fits ``budget``, else (``base``, the least-peak plan of
    ``base``: ``problem`` without counted copies, ``problem`` if None; ``exact_fit.least_peak_plan``)
    when that fits; else the InfeasibleError naming the lower peak."""
    t = time.perf_counter()
    options = dataclasses.replace(options, objective_bound=None)
    found = least_memory_plan(problem, options, copies)
    if found is None:
        raise InfeasibleError(f"no sharding plan on mesh {where} meets the memory rows")
    peak, assignment, problem = found
    status = LEAST_MEMORY_STATUS
    if peak > budget * (1 + 1e-9):
        base = problem if base is None else base  # (the exact-copy MIP counts every copy itself)
        least = exact_fit.least_peak_plan(copies, base, assignment, options, where)
        if least is None or least[0] > budget * (1 + 1e-9):
            # (an earlier plan, e.g. the free one, may peak lower with its copies than this one)
            raise infeasible_error(where, budget, min(peak, copies.least_peak),
                                   memory_lower_bound(problem, options, budget))
        log.warning("alpa_pass: mesh %s: the least-memory plan peaks at %s GiB with its reshard copies; keeping the "
                    "least-peak plan (%s GiB; its cost is not minimised: exact_fit.least_peak_plan)", where, _gib(peak),
                    _gib(least[0]))
        (peak, assignment), status, problem = least, LEAST_PEAK_STATUS, base
    assignment = np.asarray(assignment, dtype=np.int64)
    x = np.zeros(int(problem.ilp.num_cols))
    x[np.asarray(problem.ilp.group_var_start)[:-1] + assignment] = 1.0  # group columns (edges unset)
    return problem, Solution(assignment=assignment, x=x,
                             objective=float(_core.evaluate(problem.ilp, assignment).objective),
                             status=status, optimal=False, mip_gap=math.nan, time_limited=False,
                             solve_time_s=time.perf_counter() - t)


def _solve_with_row_generation(problem, options: SolveOptions, where: str, hint, copies=None, start=None,
                               candidate=None, support=None) -> tuple:
    """(the budgeted optimum found by adding memory rows lazily, or None: then the caller solves
    with all undominated rows; the problem solved, rebuilt when a free plan that nearly fits had
    its copies counted): round 0 solves without memory rows, or, given a ``hint`` plan (a strategy
    per group: the last plan of fit_reshard_copies), with the rows that plan fills past
    ``HINT_ROW_FRACTION`` of their budget. Each round adds the rows its plan breaks (past
    ``FILTER_BROKEN_ROWS``, only those no other broken row dominates: a broken dominated row's
    dominator is broken too, and implies it) and solves again. A plan that meets every row is the
    budgeted optimum (within the MIP gap): it is optimal for a relaxation (fewer rows) and
    feasible; a relaxation with no plan proves the ILP has none (InfeasibleError). A free plan
    (round 0, no ``hint``, ``start``, ``candidate`` or ``support``) over ``exact_fit.FRONTIER_OVER``
    times the budget with its copies is followed by ``exact_fit.frontier_plan``, whose plan, when it has one, is
    returned instead (it fits with every copy). Only finished
    solves count (a time-limited one or ``MAX_ROW_ROUNDS`` rounds give None), so the result does
    not depend on the machine. ``start``: a plan meeting every row, every solve's first incumbent
    (a solve stopped by a node limit counts as finished: its plan is then not proven optimal).
    ``candidate``, ``support``: ``solve_ilp``'s; each round's support goes to the next."""
    upper = float(problem.memory_row_upper)
    # (the frontier plan replaces a first budgeted solve from scratch only)
    frontier = hint is None and copies is not None and start is None and candidate is None and support is None

    def rows_near(assignment):
        near = problem.memory_row_activity(np.asarray(assignment, dtype=np.int64)) > upper * HINT_ROW_FRACTION
        log.info("alpa_pass: mesh %s: %d memory rows within %g of the budget at the hint plan start in the ILP",
                 where, int(near.sum()), 1 - HINT_ROW_FRACTION)
        return near

    active = np.zeros(problem.num_memory_rows, dtype=bool) if hint is None else rows_near(hint)
    unswapped = None
    for round_ in range(MAX_ROW_ROUNDS + 1):
        try:
            solution = solve_ilp(problem.ilp_with_memory_rows(np.flatnonzero(active)), options, start=start,
                                 candidate=candidate, support=support)
        except SolverError as e:
            if options.objective_bound is not None or isinstance(e, LpWorkLimitError):
                raise  # cut off: the budgeted problem (fewer plans) cannot beat the bound either
            return None, problem
        except InfeasibleError:
            if unswapped is None:
                raise  # a relaxation with no plan proves the full ILP has none
            # the free plan's copies overcount (counted where a producer may have the layout)
            log.info("alpa_pass: mesh %s: no plan with the free plan's reshard copies counted; without them", where)
            copies.clear()
            return _solve_with_row_generation(unswapped, options, where, None)
        if solution.time_limited:
            log.info("alpa_pass: mesh %s: row round %d stopped by the time limit", where, round_)
            return None, problem
        assignment = np.asarray(solution.assignment, dtype=np.int64)
        support = solution.support  # (the next round solves a restriction: more rows or copies)
        free_peak = copies.seen(problem, assignment) if round_ == 0 and hint is None and copies is not None else 0.0
        if frontier and round_ == 0 and free_peak > upper * exact_fit.FRONTIER_OVER:
            found = exact_fit.frontier_plan(copies, problem, solution, options, where)
            if found is not None:
                return found, problem
        if upper < free_peak <= upper * FREE_COPIES_WITHIN:
            # the free plan nearly fits: most of its reshard copies are the budgeted plan's too
            # (counting them now saves fit_reshard_copies a re-solve); its nearly full rows start
            # in the ILP
            unswapped = problem
            problem = copies.add(problem, assignment)
            upper = float(problem.memory_row_upper)
            active = rows_near(assignment)
            continue
        broken = (problem.memory_row_activity(assignment) > upper * (1 + 1e-9) + 1e-6) & ~active
        if not broken.any():
            log.info("alpa_pass: mesh %s: budgeted optimum after %d row rounds with %d of %d memory rows",
                     where, round_, int(active.sum()), active.size)
            return solution, problem
        added = broken
        if broken.sum() > FILTER_BROKEN_ROWS:
            which = np.flatnonzero(broken)
            added = np.zeros_like(broken)
            added[np.delete(which, redundant_memory_rows(memory_row_matrix(problem, which)))] = True
        active |= added
        log.info("alpa_pass: mesh %s: row round %d broke %d memory rows; %d undominated added (%d in the ILP "
                 "now)", where, round_, int(broken.sum()), int(added.sum()), int(active.sum()))
    return None, problem


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


def least_memory_plan(problem, options: SolveOptions, copies: ReshardCopies | None = None) -> tuple | None:
    """(peak bytes, assignment, problem) of the plan of ``problem`` with the least per-device peak
    (None if no plan exists at all, e.g. contradictory ties): "minimise M, every memory row <= M"
    (same one-hot and tie constraints, no costs), within the solver's gap of the optimum. The peak
    counts the plan's reshard copies, which the rows do not: given ``copies``, the problem is
    rebuilt with the copies of each plan found and solved again, ``LEAST_MEMORY_COPY_ROUNDS``
    times, and the plan with the least peak is kept (with the problem it was found in)."""
    best = None
    for round_ in range(LEAST_MEMORY_COPY_ROUNDS + 1):
        try:  # the least peak itself, not an estimate within the support gap
            solution = solve_ilp(_core.min_max_row_problem(problem.ilp_with_memory_rows()),
                                 dataclasses.replace(options, support_gap=None))
        except (InfeasibleError, SolverError):
            break
        peak = float(problem.predicted_peak(solution.assignment)[0])
        if best is None or peak < best[0]:
            best = (peak, solution.assignment, problem)
        rows_peak = float(solution.objective)
        if copies is None or round_ == LEAST_MEMORY_COPY_ROUNDS or peak <= rows_peak * (1 + 1e-9):
            break  # (the last: the rows already count every copy at its peak)
        problem = copies.add(problem, solution.assignment)
    return best


def memory_lower_bound(problem, options: SolveOptions, budget: float | None = None) -> float | None:
    """A proven lower bound on the per-device peak of every plan of ``problem`` (memory rows
    needed): ``problem.memory_row_lower_bound()`` (each row at its
    own minimum, every group free: closed form) and, unless that already exceeds
    ``budget``, the LP relaxation of ``_core.min_max_row_problem`` (the larger of the two).
    Deterministic (no branching, no incumbent); the LP part is left out if it does not solve
    (time limit)."""
    if problem.num_memory_rows == 0:
        return None
    cheap = problem.memory_row_lower_bound()
    if budget is not None and cheap > budget:
        return cheap
    lp = lp_bound(_core.min_max_row_problem(problem.ilp_with_memory_rows()), options)
    return cheap if lp is None else max(cheap, lp)


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
