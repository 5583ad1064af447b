"""The LP-support step of a budgeted solve (``solve.highs.SolveOptions.support_gap``): the LP
relaxation with its memory rows added as they break, the MIPs restricted to its support (widened,
then RENS), and the support a solve passes to the next solve of a restriction of its problem
(``Support``: ``driver.budget``'s reshard-copy rounds). ``solve.highs.solve_ilp`` calls it; the
HiGHS plumbing both use is ``solve.highs_io``'s.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from types import SimpleNamespace

import highspy
import numpy as np
import scipy.sparse

from alpa_pass.errors import SolverError
from alpa_pass.solve.highs_io import _highs, _pass_model, _run, _set_start

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Support:
    """What an LP-support solve (``SolveOptions.support_gap``) learnt from its LP relaxation, for
    the next solve of a restriction of the same problem (more memory rows, more reshard copies
    counted, a lower row bound: ``driver.budget``'s rounds): ``columns``, a mask over the problem's
    group columns (``group_var_start[0]:group_var_start[-1]``) of the strategies the LP used
    and the plan's, every strategy of a group the exact reduction left out; ``bound``, the LP's
    optimum in the problem's units (objective with its offset): a lower bound on every plan of any
    restriction."""

    columns: np.ndarray
    bound: float


def groups_of(model, x) -> np.ndarray:
    """The strategy index per group of ``model``'s column vector ``x``."""
    gs = np.asarray(model.group_var_start, dtype=np.int64)
    return np.asarray([int(np.argmax(x[gs[g]:gs[g + 1]])) for g in range(gs.size - 1)], dtype=np.int64)


# Memory rows added per round when the LP-support step (SolveOptions.support_gap) adds its rows
# lazily: the most violated first. GPT-39B 8x8 at 80 GiB: the LP with all 1351 rows took 28 s, with
# rows added 32 at a time 5 s (32 rows: every other row holds), its restricted MIP 15 -> 4.6 s;
# the same LP optimum and plan. A count, so the plan does not depend on the machine.
SUPPORT_ROWS_PER_ROUND = 32


# A group column left out of the LP (its memory rows in) joins when its reduced cost is below
# -PRICING_TOLERANCE (HiGHS's dual feasibility tolerance; costs are scaled to <= 1e3).
PRICING_TOLERANCE = 1e-7


class ColumnSpace:
    """Maps strategy masks and plans between ``problem``'s group columns and those of ``model``,
    the exact reduction's (``reduced``) or ``problem``'s own."""

    def __init__(self, problem, reduced, model):
        self.gs = np.asarray(problem.group_var_start, dtype=np.int64)
        self.reduced, self.model_gs = reduced, np.asarray(model.group_var_start, dtype=np.int64)

    def _columns(self, r: int) -> np.ndarray:
        """The problem's group-column offsets of the model group ``r``'s columns."""
        if self.reduced is None:
            return np.arange(self.gs[r], self.gs[r + 1]) - self.gs[0]
        return self.gs[self.reduced.kept[r]] - self.gs[0] + np.asarray(self.reduced.alive[r], dtype=np.int64)

    def to_model(self, columns: np.ndarray) -> np.ndarray:
        return np.concatenate([columns[self._columns(r)] for r in range(self.model_gs.size - 1)] or [[]]).astype(bool)

    def to_problem(self, used: np.ndarray) -> np.ndarray:
        """``used`` (a mask over the model's group columns) over the problem's: every strategy of a
        group the model leaves out (eliminated or substituted: no mask to keep)."""
        out = np.ones(int(self.gs[-1] - self.gs[0]), dtype=bool)
        for r in range(self.model_gs.size - 1):
            cols = self._columns(r)
            if self.reduced is not None:
                out[self.gs[self.reduced.kept[r]] - self.gs[0]:self.gs[self.reduced.kept[r] + 1] - self.gs[0]] = False
            out[cols] = used[self.model_gs[r] - self.model_gs[0]:self.model_gs[r + 1] - self.model_gs[0]]
        return out

    def start(self, plan) -> np.ndarray:
        return np.asarray(plan, dtype=np.int64) if self.reduced is None else self.reduced.start(plan)


# Branch-and-bound nodes of each MIP restricted to a relaxation's support (``solve_ilp(support=)``).
# Where such a MIP met the gap it did so at the root or within 2 nodes (GPT 1.3B 2x4 at 14 GiB,
# GPT-39B 8x8 and GPT-175B 16x16 at 80 GiB); the misses branched on (35 nodes, 0.9 s; 317 nodes,
# 14 s, a support carried twice, which is no longer done), and the LP runs after a miss anyway.
# A count: no clock decides.
CARRIED_NODE_LIMIT = 10


class LpWorkLimitError(SolverError):
    """The LP relaxation stopped at ``SolveOptions.lp_iteration_limit`` simplex iterations (a
    deterministic bound: the same on any machine): no plan, and no full MIP tried after it."""


def support_plan(model, options, candidate=None, carried=None):
    """(column vector, LP bound, relative gap, strategies used) of a plan of ``model`` found from
    its LP relaxation (``SolveOptions.support_gap``), or None when the LP does not solve or no
    restriction below has a plan within the node limit. First the MIP restricted to the group
    strategies the LP uses (and ``candidate``'s: a plan of ``model``, the MIP's first incumbent);
    when its plan is not within ``support_gap`` of the LP bound (or it has none) and it is no
    draft, the same MIP with each group's least-memory strategies too (``CARRIED_NODE_LIMIT``
    nodes), then, if still not within the gap, the MIP with the groups the LP sets integrally
    fixed and the others free (RENS), started from the best plan so far; both stopped at the
    first plan within ``support_gap`` of the LP bound (HiGHS ``objective_target``: no clock
    involved). Every solve starts without the
    one-sided (memory) rows and adds the ones its solution breaks, ``SUPPORT_ROWS_PER_ROUND`` at a
    time, until none is broken: the LP then has the full LP's optimum, a plan meets every row.
    Given a ``candidate``, the LP with memory rows holds only some group columns at first (those the
    row-free LP uses, the candidate's, each group's least-memory ones) and prices the others in
    when their reduced cost is negative (``PRICING_TOLERANCE``): the same optimum, found faster.
    ``carried``: (a mask over the group columns, a lower bound in the model's units) from the LP
    of a relaxation of ``model`` (``Support``): first the MIP restricted to those strategies, the
    candidate's and each group's least-memory ones (``least_memory_columns``: the rows are
    tighter than the relaxation's, e.g. more reshard copies counted, and the relaxation's support
    alone often has no plan), stopped at a plan within ``support_gap`` of that bound, returned
    without an LP. "Strategies used": the restricted MIP's mask and the plan's strategies (None
    for a plan found on ``carried``). Raises LpWorkLimitError when the LP (over all its rounds)
    stops at ``options.lp_iteration_limit`` simplex iterations."""
    lower, upper_rows = np.asarray(model.row_lower), np.asarray(model.row_upper)
    one_sided = np.isneginf(lower) & np.isfinite(upper_rows)
    matrix = scipy.sparse.csc_matrix((np.asarray(model.a_value, dtype=np.float64), np.asarray(model.a_index),
                                      np.asarray(model.a_start)), shape=(int(model.num_rows), int(model.num_cols)))
    rows = matrix.tocsr()
    memory, bound_of = rows[one_sided], upper_rows[one_sided]
    base = np.flatnonzero(~one_sided)
    active = np.zeros(memory.shape[0], dtype=bool)
    cost = np.asarray(model.col_cost, dtype=np.float64)
    gs = np.asarray(model.group_var_start, dtype=np.int64)
    plan = np.zeros(int(gs[-1] - gs[0]), dtype=bool)
    if candidate is not None:
        plan[gs[:-1] - gs[0] + np.asarray(candidate, dtype=np.int64)] = True
    least_memory = least_memory_columns(memory, gs)

    def broken(x):
        """The memory rows ``x`` breaks that are not in yet, most violated first (at most a round's)."""
        over = memory @ x - bound_of
        found = np.flatnonzero((over > 1e-9 * np.abs(bound_of) + 1e-6) & ~active)
        return found[np.argsort(-over[found], kind="stable")[:SUPPORT_ROWS_PER_ROUND]]

    def gap(x, bound):
        value = float(np.dot(cost, x) + float(model.offset))
        return (value - bound) / max(abs(value), 1e-12)

    def restricted(used, start=None, target=None, bound=None, nodes=None):
        """The MIP with the group strategies outside ``used`` (a mask over the group columns) off,
        stopped at a plan within ``target`` of ``bound`` when given, after ``nodes`` nodes (each
        solve: memory rows it breaks are added and it is solved again) when given."""
        col_upper = np.asarray(model.col_upper, dtype=np.float64).copy()
        col_upper[gs[0]:gs[-1]][~used] = 0.0
        while True:
            sub = with_rows(model, rows, np.sort(np.concatenate([base, np.flatnonzero(one_sided)[active]])))
            sub.col_upper = col_upper
            h = _highs(options, presolve=True)
            if target is not None:
                h.setOptionValue("objective_target", bound / (1 - target))
            if nodes is not None:
                h.setOptionValue("mip_max_nodes", int(nodes))
            _pass_model(h, sub, highspy)
            if start is not None:
                _set_start(h, sub, start, highspy)
            _run(h, highspy)
            x = np.asarray(h.getSolution().col_value, dtype=np.float64)
            if x.size != model.num_cols or h.getInfo().primal_solution_status != 2 or \
                    h.getModelStatus() == highspy.HighsModelStatus.kTimeLimit:  # a time-limited plan: not reproducible
                return None
            add = broken(x)
            if not add.size:
                return x
            active[add] = True
            start = None  # (it may break the new rows)

    target = 0.0 if options.support_gap is None else options.support_gap
    plan_x = np.zeros(int(model.num_cols))
    plan_x[gs[0]:gs[-1]] = plan
    start = candidate if candidate is not None and not broken(plan_x).size else None
    if carried is not None:
        t = time.perf_counter()
        used = carried[0] | plan | least_memory
        x = restricted(used, start, target, carried[1], CARRIED_NODE_LIMIT)
        log.info("alpa_pass: LP-support plan: the MIP restricted to the last LP's support (and the least-memory "
                 "strategies) %s in %.1f s",
                 "has none" if x is None else f"gap {gap(x, carried[1]):.3g}", time.perf_counter() - t)
        if x is not None and gap(x, carried[1]) <= target:
            return x, carried[1], gap(x, carried[1]), None
        active[:] = False  # (the LP below adds the rows it breaks itself)

    t_lp = time.perf_counter()
    lp = _highs(options, presolve=False)
    lp.setOptionValue("solve_relaxation", True)
    _pass_model(lp, with_rows(model, rows, base), highspy)
    priced = None  # the group columns the LP may use once its memory rows start (None: all)
    rounds = entered = iterations = 0
    while True:
        if options.lp_iteration_limit is not None:  # (over all rounds: HiGHS counts each run's)
            lp.setOptionValue("simplex_iteration_limit", max(int(options.lp_iteration_limit) - iterations, 0))
        _run(lp, highspy)
        rounds += 1
        iterations += int(lp.getInfo().simplex_iteration_count)
        status = lp.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible and priced is not None and not priced.all():
            # (the priced columns alone cannot meet the rows: every column in, the plain LP)
            off = np.flatnonzero(~priced)
            _set_bounds(lp, gs[0] + off, model)
            priced[:] = True
            continue
        if status == highspy.HighsModelStatus.kIterationLimit:
            raise LpWorkLimitError(f"its LP relaxation ({int(model.num_cols)} columns, {int(model.num_rows)} rows) "
                                   f"needs over {options.lp_iteration_limit} simplex iterations")
        if status != highspy.HighsModelStatus.kOptimal:
            log.warning("alpa_pass: the LP relaxation of a budgeted solve stopped with status %s after %.1f s "
                        "(%d memory rows added): solving the full ILP instead, which can take far longer",
                        lp.modelStatusToString(status), time.perf_counter() - t_lp, int(active.sum()))
            return None
        x_lp = np.asarray(lp.getSolution().col_value, dtype=np.float64)
        add = broken(x_lp)
        if add.size:
            if priced is None and candidate is not None:
                # the first rows of an LP that certifies a candidate (``driver.budget.finish_draft``):
                # from here on the LP holds only the group columns the row-free LP uses, the
                # candidate's and each group's least-memory ones; the others join when their reduced
                # cost turns negative (below). The same optimum, a different vertex: only where the
                # candidate's strategies join the support anyway (LLaMA-8B 8x8 at 35 GiB, the
                # finish's LP: 4.8 -> 3.3 s, 1107 of 1449 group columns priced in)
                priced = (x_lp[gs[0]:gs[-1]] > 1e-9) | plan | least_memory
                _set_bounds(lp, gs[0] + np.flatnonzero(~priced), 0.0)
            new = memory[add]
            lp.addRows(int(add.size), np.full(add.size, -np.inf), bound_of[add], int(new.nnz),
                       new.indptr[:-1].astype(np.int32), new.indices.astype(np.int32), new.data)
            active[add] = True
            continue
        if priced is None:
            break
        reduced_cost = np.asarray(lp.getSolution().col_dual, dtype=np.float64)[gs[0]:gs[-1]]
        enter = ~priced & (reduced_cost < -PRICING_TOLERANCE)
        if not enter.any():
            break  # no column left out can lower the objective: the full LP's optimum
        _set_bounds(lp, gs[0] + np.flatnonzero(enter), model)
        priced |= enter
        entered += int(enter.sum())
    bound = float(lp.getInfo().objective_function_value)
    log.info("alpa_pass: LP-support LP: %d solves, %d memory rows, %s of %d group columns priced in (%d by "
             "reduced cost)", rounds, int(active.sum()), "all" if priced is None else int(priced.sum()),
             int(gs[-1] - gs[0]), entered)

    lp_groups = x_lp[gs[0]:gs[-1]]
    t = time.perf_counter()
    used = (lp_groups > 1e-6) | plan
    x = restricted(used, start)
    log.info("alpa_pass: LP-support plan: LP bound %.6g after %.1f s; restricted MIP %s in %.1f s",
             bound, t - t_lp, "none" if x is None else f"gap {gap(x, bound):.3g}", time.perf_counter() - t)
    if x is None or (gap(x, bound) > target and not options.support_draft):
        # before RENS (a draft is kept as it is): the LP's support widened by each group's
        # least-memory strategies, at most CARRIED_NODE_LIMIT nodes (LLaMA-8B 8x8 at 35 GiB: the
        # support's plan 13.2% above the bound, the widened MIP's 2.9% at its root in 0.8 s, where
        # RENS took 7.5 s for 8.0%)
        t = time.perf_counter()
        wide = used | least_memory
        better = restricted(wide, start if x is None else groups_of(model, x), target, bound, CARRIED_NODE_LIMIT)
        log.info("alpa_pass: LP-support plan: with the least-memory strategies %s in %.1f s",
                 "none" if better is None else f"gap {gap(better, bound):.3g}", time.perf_counter() - t)
        if better is not None and (x is None or gap(better, bound) < gap(x, bound)):
            x, used = better, wide
    if (x is None or gap(x, bound) > target) and not (options.support_draft and x is not None):
        # RENS: the groups the LP sets integrally keep that strategy, the others get all of theirs
        t = time.perf_counter()
        sizes = np.diff(gs)
        whole = np.repeat(np.maximum.reduceat(lp_groups, gs[:-1] - gs[0]) >= 1 - 1e-6, sizes)
        rens = restricted(~whole | (lp_groups >= 1 - 1e-6), None if x is None else groups_of(model, x), target,
                          bound)
        log.info("alpa_pass: LP-support plan: RENS %s in %.1f s",
                 "none" if rens is None else f"gap {gap(rens, bound):.3g}", time.perf_counter() - t)
        if rens is not None and (x is None or gap(rens, bound) < gap(x, bound)):
            x = rens
    return None if x is None else (x, bound, gap(x, bound), used | (x[gs[0]:gs[-1]] > 0.5))


def _set_bounds(lp, columns, to) -> None:
    """Columns ``columns`` of ``lp`` fixed at ``to`` (a number), or back to the bounds of ``to`` (the
    model ``lp`` relaxes)."""
    columns = np.asarray(columns, dtype=np.int32)
    if np.isscalar(to):
        lower = upper = np.full(columns.size, float(to))
    else:
        lower = np.asarray(to.col_lower, dtype=np.float64)[columns]
        upper = np.asarray(to.col_upper, dtype=np.float64)[columns]
    lp.changeColsBounds(int(columns.size), columns, lower, upper)


def least_memory_columns(memory, gs) -> np.ndarray:
    """A mask over the group columns: each group's strategies with the least total over the memory
    rows ``memory`` (CSR, every column)."""
    total = np.asarray(memory.sum(axis=0)).ravel()[gs[0]:gs[-1]]
    least = np.minimum.reduceat(total, gs[:-1] - gs[0])
    return total <= np.repeat(least, np.diff(gs)) * (1 + 1e-9) + 1e-12


def with_rows(model, rows: scipy.sparse.csr_matrix, keep: np.ndarray) -> SimpleNamespace:
    """``model`` with only the rows ``keep`` (sorted; ``rows``: its matrix as CSR)."""
    out = SimpleNamespace(**{k: getattr(model, k) for k in MODEL_FIELDS})
    sub = rows[keep].tocsc()
    out.num_rows = int(keep.size)
    out.row_lower, out.row_upper = np.asarray(model.row_lower)[keep], np.asarray(model.row_upper)[keep]
    out.a_start, out.a_index, out.a_value = sub.indptr, sub.indices, sub.data
    return out


MODEL_FIELDS = ("num_cols", "num_rows", "offset", "col_cost", "col_lower", "col_upper", "row_lower", "row_upper",
                 "a_start", "a_index", "a_value", "integrality", "group_var_start")

