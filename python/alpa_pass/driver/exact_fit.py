"""Which exact-copy plan (``driver.exact_copies``) a budgeted solve takes: the first budgeted plan
over the free plan's frontier strategies when the free plan is far over the budget
(``frontier_plan``, no LP), or one around the first budgeted LP's plan when that does not fit
with its reshard copies (``exact_copy_fit``; ``driver.budget.fit_budgeted_plan`` keeps it or
the copy rounds' plan); and the plan of least peak with every copy (``least_peak_plan``: the
smallest budget an InfeasibleError names, and the copy rounds' last resort). The module constants
switch them off (benchmarks' ``--no-frontier``, ``--copy-rounds-only``)."""
from __future__ import annotations

import logging
import math

import numpy as np

from alpa_pass.driver.exact_copies import exact_copy_solution, frontier_columns
from alpa_pass.driver.reshard_copies import ReshardCopies
from alpa_pass.solve.highs import Solution, SolveOptions

log = logging.getLogger("alpa_pass")


# A budgeted plan over the budget with its reshard copies first gets exact_copy_fit's plan (False:
# the copy rounds only, fit_reshard_copies and finish_draft).
EXACT_COPY_PLAN = True


def exact_copy_fit(copies: ReshardCopies, base, problem, solution: Solution, budget: int | None,
                   options: SolveOptions, where: str) -> Solution | None:
    """The plan of ``driver.exact_copies.exact_copy_solution`` around ``solution`` (a budgeted plan
    of ``problem``) when ``solution`` does not fit ``budget`` with its reshard copies and that plan
    does (its peak with every copy, ``predicted_peak``); else None. ``base``: the problem without
    counted copies (``problem`` may count the free plan's). The restricted MIP keeps the LP
    support's strategies and the plan's, then, when they admit no plan, each group's least-memory
    strategies too."""
    if budget is None or base.num_memory_rows == 0 or copies.graph is None or solution.support is None:
        return None
    if copies.seen(problem, solution.assignment) <= budget * (1 + 1e-9):
        return None
    # (least-memory strategies first: GPT 1.3B 13 GiB 5 -> 31 s, 3% cheaper)
    return _exact_plan_that_fits(copies, base, solution, budget, options, where,
                                 (dict(least_memory=False), dict(least_memory=True)))


# The first budgeted plan is the exact-copy plan over the free plan's frontier strategies
# (frontier_plan) when that has one (False: the LP-support path of solve_within_budget always)...
FRONTIER_PLAN = True
# ...and the free plan's peak with its reshard copies exceeds the budget by more than this factor.
# Nearer, the LP-support path's first plan mostly fits with its copies at once, and is as fast and
# no costlier (s25, solve s, LP path vs frontier: LLaMA-8B 8x8 at 40 GiB (free 1.06x) 3.7 vs 5.8 s,
# +0.05% with the frontier; at 37 GiB (1.15x) 5.2 vs 8.5 s, -0.8%; the MoE of
# test_refine_unmerged at 0.95 of its free peak: +14% with the frontier). Further, the LP path
# runs copy rounds (GPT 1.3B 2x4 at 16 GiB (1.16x) 22.6 vs 10.6 s, -3.2%).
FRONTIER_OVER = 1.15


def frontier_plan(copies: ReshardCopies, problem, solution: Solution, options: SolveOptions,
                  where: str) -> Solution | None:
    """The exact-copy plan (``driver.exact_copies``) of ``problem`` (no copies counted; its memory
    rows at the budget) over ``frontier_columns`` of the free plan ``solution``, when it fits the
    budget with every copy; else None. No LP with memory rows is solved (3-10x the free LP: s22),
    so the plan has no bound (``mip_gap`` NaN). Not tried when ``options`` want proven plans
    (``support_gap`` None) or without the graph; under a cutoff (``objective_bound``, a mesh
    search) only a plan below it is returned."""
    if not (EXACT_COPY_PLAN and FRONTIER_PLAN) or options.support_gap is None or copies.graph is None:
        return None
    found = _exact_plan_that_fits(copies, problem, solution, float(problem.memory_row_upper), options, where,
                                  (dict(used=frontier_columns(problem, solution.assignment)),))
    if found is not None and options.objective_bound is not None and found.objective >= options.objective_bound:
        return None
    return found


def _exact_plan_that_fits(copies: ReshardCopies, base, solution: Solution, budget: float, options: SolveOptions,
                          where: str, attempts) -> Solution | None:
    """The first plan ``exact_copy_solution`` finds around ``solution`` with each of ``attempts``
    (its keyword arguments) in turn, when it fits ``budget`` with every copy (``predicted_peak``);
    else that MIP once more with columns for every copy (no size cut); else None."""
    for attempt in attempts:
        found = exact_copy_solution(base, solution, options, where, **attempt)
        if found is not None:
            break
    if found is None:
        return None
    peak = copies.seen(base, found.assignment)
    if peak > budget * (1 + 1e-9):  # (at a point the MIP bounds: copies below its size cut)
        log.info("alpa_pass: mesh %s: the exact-copy plan peaks at %.4g GiB with every copy; solving again with "
                 "columns for the small ones too", where, peak / 2**30)
        found = exact_copy_solution(base, solution, options, where, **attempt,
                                    min_bytes=0.0)
        if found is None or copies.seen(base, found.assignment) > budget * (1 + 1e-9):
            return None
    return found


# Rounds of the least-peak MIP, each over the frontier around the last one's plan, while the peak
# falls: the least-memory plan's frontier depends on the costs (the tiny GPT of test_exact_copies
# on 2x4, once collective-permutes were priced: 2.72 MB from it, 1.98 MB one round later; the
# proven bound 1.90 MB).
LEAST_PEAK_ROUNDS = 3


def least_peak_plan(copies: ReshardCopies, problem, assignment, options: SolveOptions, where: str):
    """(peak with every copy, assignment) of the exact-copy MIP's least-peak plan of ``problem`` over
    ``frontier_columns`` around ``assignment`` (a plan: the least-memory one), then around that
    plan while its peak falls (``LEAST_PEAK_ROUNDS``), or None without one.
    Its peak is a budget some plan meets: the InfeasibleError names it when lower than the
    least-memory plan's (whose rows count no copies: s25, a flax transformer on 2x4 named 0.1023
    GiB while a plan at 0.0935 GiB fit; LLaMA-8B seq 8192 on 8x8: 238.1 -> 167.2 GiB, the proven
    bound 160.4), and the budgeted solve falls back to it when the least-memory plan does not fit."""
    if not EXACT_COPY_PLAN or copies.graph is None or problem.num_memory_rows == 0:
        return None
    best = None
    for _ in range(LEAST_PEAK_ROUNDS):
        assignment = np.asarray(assignment, dtype=np.int64)
        seed = Solution(assignment=assignment, x=np.zeros(0), objective=math.nan, status="", optimal=False,
                        mip_gap=math.nan, time_limited=False, solve_time_s=0.0)
        found = exact_copy_solution(problem, seed, options, where, used=frontier_columns(problem, assignment),
                                    min_bytes=0.0, least_peak=True)
        if found is None:
            break
        peak = copies.seen(problem, found.assignment)
        if best is not None and peak >= best[0]:
            break
        best, assignment = (peak, found.assignment), found.assignment
    return best
