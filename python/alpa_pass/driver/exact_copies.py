"""A budgeted plan whose memory rows count every reshard copy exactly: one restricted MIP in place
of the reshard-copy rounds (``driver.budget.fit_reshard_copies``).

The memory rows count values in their own layouts. A consumer reading a value ``u`` in another
layout ``L`` reads a copy that XLA keeps from the first reader of ``L`` to the last (``_core``
memory.h "Reshard copies"), unless ``u`` is produced in ``L``. Between two readers ``a < b`` the
copy exists iff both read ``L`` and the producer does not make it: an AND of three groups' choices,
which rows over strategy columns cannot express; the copy rounds count the copies a solved plan
made (an upper bound on later plans, over the range that plan gave them) and solve again.

Here each candidate copy (u, L) gets continuous columns ``w`` in [0, 1], each counted in the memory
rows of a span of program points at ``bytes(u, L)``. With ``r_i`` = [reader i reads u in L] (a sum
of its strategy columns) and ``q`` = [u is produced in L]:

* a copy with at most ``PAIRWISE`` readers of ``L``: one ``w`` per reader's point and per gap
  between readers, with ``w >= r_a + r_b - 1 - q`` for every pair of readers ``a <= i <= b``
  around it (``w >= r_a - q`` for ``a = b``);
* with more: prefix/suffix columns ``pre_i >= pre_{i-1}, pre_i >= r_i`` and ``suf_i >= suf_{i+1},
  suf_i >= r_i``; ``w >= pre_i + suf_j - 1 - q``.

The memory rows push every ``w`` down, so for a 0/1 plan ``w`` is exactly "the copy is live here"
and the rows' peak is the plan's real peak (to the size cut below). Measured in s23 (the experiment
this module grew from): pairwise rows 8.5-66 s -> 0.5-10 s of MIP against the chain form for the
same plans.

The MIP is restricted (like ``solve.support``'s): the strategies of the first budgeted solve's LP
support and its plan (each group's least-memory strategies too when those admit no plan), or, when
the free plan is far over the budget, ``frontier_columns``: the free plan's, each group's
least-memory ones and those on each group's (bytes, cost) frontier, with no LP solved at all
(``driver.exact_fit.frontier_plan``). It bounds
the memory at program points: first those of the ``START_ROWS`` memory rows that plan fills most;
a plan that breaks another row with its copies, or whose copies make a point no memory row holds
its peak, adds those points and is solved again: first over the plan and its nearby strategies
only (``_nearby_columns``: a small MIP), kept when within ``REL_GAP`` of the last full MIP's
bound. Candidates: every value read in a layout some
kept strategy reads and its producer can avoid, at least ``min_bytes`` per device, whose readers
span a bounded point. The MIP is node-limited (``NODE_LIMIT``) and stops at ``REL_GAP``, never
timed: the plan is a function of the problem.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np
import scipy.sparse

from alpa_pass import _core
from alpa_pass.driver.memory_rows import memory_row_matrix, offsets_within, row_peaks, value_rows
from alpa_pass.solve.highs import Solution
from alpa_pass.solve.highs_io import _highs
from alpa_pass.solve.support import least_memory_columns

log = logging.getLogger("alpa_pass")

START_ROWS = 32          # memory rows the first plan fills most: in the MIP from the start
MAX_ROW_ROUNDS = 6       # re-solves with the rows a plan broke added
PAIRWISE = 4             # copies with at most this many readers of their layout: pairwise rows
NODE_LIMIT = 2000        # branch-and-bound nodes per MIP (s23's cases: 1-339)
# The MIP stops within this relative gap of its own bound (a restriction's: a heuristic plan anyway).
# GPT-39B 8x8 at 80 GiB: 1e-4 -> 0.01: 579 -> 48 nodes, exact-copy step 19.2 -> 12.7 s, objective
# 4.6644e11 -> 4.6756e11 (the rounds' plan: 4.6850e11); GPT 1.3B 2x4 at 12, 13, 15 GiB the same plans.
REL_GAP = 0.01
# HiGHS's RINS sub-MIP on in these MIPs (off in the planner's other solves: ``SolveOptions.sub_mip_heuristics``),
# at this heuristic effort (HiGHS's default 0.05). s27, the dumped MIPs (threads 1), seconds and objective
# off -> on: GPT-39B 8x8 at 80 GiB 26.2 -> 15.0 s (205 -> 60 nodes, the same objective to 1e-6),
# GPT-175B 16x16 18.7 -> 16.7 s (+0.04%), LLaMA-8B 8x8 at 30-35 GiB and GPT 1.3B 2x4 at 12-16 GiB
# within 0.2 s and the same plans (one LLaMA plan 0.05% cheaper), but GPT 1.3B at 15 GiB 4.5 -> 5.7 s.
# RENS too: 39B 14.9 s, 175B +0.6%; effort 0.1: 175B 19.6 s.
RINS_EFFORT = 0.02  # (None: RINS off)
MIN_BYTES_FRACTION = 2.0 ** -13  # copies smaller than this fraction of the budget get no columns
EXACT_STATUS = "exact-copy plan"  # Solution.status of a plan found here


class CopyColumns:
    """The candidate copies' columns and ">=" rows over ``problem.ilp``'s columns (module doc).

    ``used``: a mask over the ILP's columns (the strategies the MIP keeps); ``points``: program
    points (ascending) of which a candidate's readers must span one (``add_spanning`` adds those
    spanning more points later); ``min_bytes``: per device. The candidates are the core's
    ``problem.copy_candidates`` (in Python: 1.6 of LLaMA-8B 8x8's 6.1 s exact-copy step, s25)."""

    def __init__(self, problem, used, points, min_bytes, pairwise=PAIRWISE):
        self.first = int(problem.ilp.num_cols)  # the copy columns follow the ILP's
        self.pairwise = pairwise
        self.count = 0
        # the ">=" rows, flat: their columns and coefficients, where each ends, their lower bounds
        self._cols, self._coefs, self._ends, self._lower = [], [], [], []
        # (first point, last point, column, bytes) of each copy column: counted in the memory rows there
        self._terms = ([], [], [], [])
        self.candidates = 0
        # (reads per reader, has, pre, suf, ws): ws = [(w, first reader, second reader)]; pairwise
        # ones: (reads, has, None, None, [(w, [(reader a, reader b)])])
        self.records = []
        # every candidate (problem.copy_candidates, the core's): per device bytes, readers (CSR),
        # their columns reading the value in the layout (CSR over readers), its producer's columns
        # making it (CSR)
        (_, self._bytes, self._reader_start, self._readers, self._read_start, self._reads, self._has_start,
         self._has) = problem.copy_candidates(np.ascontiguousarray(used, dtype=np.uint8), float(min_bytes))
        self._waiting = np.ones(self._bytes.size, dtype=bool)  # no columns yet
        self.add_spanning(points)

    def add_spanning(self, points) -> int:
        """Give columns to the candidates not added yet whose readers span one of ``points``
        (ascending); how many."""
        spanning = self._waiting & self._spanning(points)
        for c in np.flatnonzero(spanning):
            readers = range(self._reader_start[c], self._reader_start[c + 1])
            self._add(self._readers[readers.start:readers.stop].tolist(),
                      [self._reads[self._read_start[r]:self._read_start[r + 1]].tolist() for r in readers],
                      self._has[self._has_start[c]:self._has_start[c + 1]].tolist(), float(self._bytes[c]))
        self._waiting &= ~spanning
        return int(spanning.sum())

    def _column(self) -> int:
        self.count += 1
        return self.first + self.count - 1

    def _row(self, cols, coefs, lower: float) -> None:
        self._cols += cols
        self._coefs += coefs
        self._ends.append(len(self._cols))
        self._lower.append(lower)

    def _term(self, first: int, last: int, column: int, per_device: float) -> None:
        for where, value in zip(self._terms, (first, last, column, per_device)):
            where.append(value)

    @property
    def num_rows(self) -> int:
        return len(self._lower)

    def _add(self, order, reads, has, per_device):
        self.candidates += 1
        m = len(order)
        q, ones = list(has), [1.0] * len(has)
        if m <= self.pairwise:
            ws = []
            for i in range(m):
                spans = [((order[i], order[i]), [(a, b) for a in range(i + 1) for b in range(i, m)])]
                if i + 1 < m and order[i + 1] > order[i] + 1:
                    spans.append(((order[i] + 1, order[i + 1] - 1),
                                  [(a, b) for a in range(i + 1) for b in range(i + 1, m)]))
                for (first, last), pairs in spans:
                    w = self._column()
                    for a, b in pairs:
                        r = reads[a] if a == b else reads[a] + reads[b]
                        self._row([w] + r + q, [1.0] + [-1.0] * len(r) + ones, 0.0 if a == b else -1.0)
                    self._term(first, last, w, per_device)
                    ws.append((w, pairs))
            self.records.append((reads, has, None, None, ws))
            return
        pre = [self._column() for _ in range(m)]
        suf = [self._column() for _ in range(m)]
        for i in range(m):
            r = [1.0] + [-1.0] * len(reads[i])
            self._row([pre[i]] + reads[i], r, 0.0)
            self._row([suf[i]] + reads[i], r, 0.0)
            if i:
                self._row([pre[i], pre[i - 1]], [1.0, -1.0], 0.0)
                self._row([suf[i - 1], suf[i]], [1.0, -1.0], 0.0)
        ws = []
        for i in range(m):
            w = self._column()
            self._row([w, pre[i], suf[i]] + q, [1.0, -1.0, -1.0] + ones, -1.0)
            self._term(order[i], order[i], w, per_device)
            ws.append((w, i, i))
            if i + 1 < m and order[i + 1] > order[i] + 1:
                w = self._column()
                self._row([w, pre[i], suf[i + 1]] + q, [1.0, -1.0, -1.0] + ones, -1.0)
                self._term(order[i] + 1, order[i + 1] - 1, w, per_device)
                ws.append((w, i, i + 1))
        self.records.append((reads, has, pre, suf, ws))

    def _spanning(self, points) -> np.ndarray:
        """A mask over the candidates: those whose readers span one of ``points``."""
        points = np.sort(np.asarray(points))
        first = self._readers[self._reader_start[:-1]]
        k = np.searchsorted(points, first)
        return (k < points.size) & (points[np.minimum(k, points.size - 1)] <= self._readers[self._reader_start[1:] - 1])

    def row_matrix(self) -> scipy.sparse.csr_matrix:
        """The ">=" rows (their lower bounds: ``row_lower``) over the ILP's and the copy columns."""
        out = scipy.sparse.csr_matrix((np.asarray(self._coefs, dtype=np.float64), np.asarray(self._cols, dtype=np.int64),
                                       np.asarray([0] + self._ends, dtype=np.int64)),
                                      shape=(self.num_rows, self.first + self.count))
        out.sum_duplicates()  # (two readers of one group may share a column: -2 there)
        return out

    @property
    def row_lower(self) -> np.ndarray:
        return np.asarray(self._lower, dtype=np.float64)

    def in_memory_rows(self, points) -> scipy.sparse.csr_matrix:
        """The copy columns' coefficients in the memory rows of ``points`` (ascending: one row each),
        over the ILP's columns and then the copy columns."""
        points = np.asarray(points)
        first, last, col, size = (np.asarray(t, dtype=d) for t, d in zip(self._terms, (np.int64,) * 3 + (np.float64,)))
        start = np.searchsorted(points, first)
        count = np.maximum(np.searchsorted(points, last, side="right") - start, 0)  # (the points each spans)
        rows = np.repeat(start, count) + offsets_within(count)
        return scipy.sparse.csr_matrix((np.repeat(size, count), (rows, np.repeat(col, count))),
                                       shape=(points.size, self.first + self.count))

    def least_values(self, x: np.ndarray) -> np.ndarray:
        """``x`` (the ILP's columns) with the copy columns at the least values their rows allow:
        for a 0/1 plan, 1 exactly where the copy is live."""
        x = np.concatenate([np.asarray(x, dtype=np.float64)[:self.first], np.zeros(self.count)])
        for reads, has, pre, suf, ws in self.records:
            r = [float(x[cols].sum()) for cols in reads]
            q = float(x[has].sum())
            if pre is None:  # pairwise
                for w, pairs in ws:
                    x[w] = max(0.0, max(r[a] - q if a == b else r[a] + r[b] - 1.0 - q for a, b in pairs))
                continue
            x[pre] = np.maximum.accumulate(r)
            x[suf] = np.maximum.accumulate(r[::-1])[::-1]
            for w, i, j in ws:
                x[w] = max(0.0, x[pre[i]] + x[suf[j]] - 1.0 - q)
        return x


def start_points(problem, assignment) -> np.ndarray:
    """The program points (ascending) whose memory the MIP bounds from the start: those of the
    ``START_ROWS`` memory rows ``assignment`` (a strategy per group) fills most."""
    return np.sort(np.asarray(problem.memory_row_points)[_fullest_rows(problem, assignment)])


def _fullest_rows(problem, assignment) -> np.ndarray:
    """The indices of the ``START_ROWS`` memory rows ``assignment`` fills most."""
    fill = problem.memory_row_activity(np.asarray(assignment, dtype=np.int64))
    return np.argsort(-fill, kind="stable")[:START_ROWS]


def frontier_columns(problem, assignment) -> np.ndarray:
    """A mask over ``problem.ilp``'s columns: every non-group column, the plan ``assignment`` (a
    strategy per group: the free plan), each group's least-memory strategies (over every memory
    row), and each group's frontier strategies: sorted by their bytes at ``start_points`` (where
    ``assignment`` peaks), each strategy cheaper than every one with fewer bytes, by three costs in
    turn: its own column cost, and the plan's objective with only this group changed, every other
    group at ``assignment`` or at its strategy with the fewest bytes there
    (``_core.one_group_changed``). (The least-memory strategies over every row as that context: GPT 1.3B 2x4
    at 13 GiB the MIP took 75 nodes instead of 5 for a plan within 0.2%.)

    A stand-in for the budgeted LP's support (``solve.support``) that needs no LP: memory rows
    make that LP 3-10x slower than the free one (s22), while the exact-copy MIP over these
    strategies plans in seconds. s25 (2-core VM), objective against the LP-support path's:
    LLaMA-8B 8x8 at 30/33/35 GiB -3.7, +1.5, -5.5%; GPT 1.3B 2x4 at 12-16 GiB -3.2, -3.2, -4.9,
    -6.3, -4.1%; GPT-39B 8x8 at 80 GiB -0.7%; GPT-175B 16x16 at 80 GiB +10.6% (README "Frontier
    plan"). Without the tie-break by bytes over every row, strategies that hold no bytes at the
    start points collapse to one: the GPT of test_memory_plans' promise test at 0.8 of its free
    peak cost +35% (-0.2% with it)."""
    ilp = problem.ilp
    gs = np.asarray(ilp.group_var_start, dtype=np.int64)
    plan = np.asarray(assignment, dtype=np.int64)
    allowed = np.asarray(ilp.col_upper)[gs[0]:gs[-1]] > 0
    rows = memory_row_matrix(problem)
    # (the memory rows at start_points: value_rows there, without building them again)
    memory = np.asarray(rows[_fullest_rows(problem, plan)].sum(axis=0)).ravel()[gs[0]:gs[-1]]
    starts = gs[:-1] - gs[0]
    fewest = np.where(allowed, memory, np.inf)
    least_plan = np.asarray([int(np.argmin(fewest[a:b])) for a, b in zip(starts, gs[1:] - gs[0])], dtype=np.int64)
    keep = least_memory_columns(rows, gs)[gs[0]:gs[-1]]
    keep[starts + plan] = True
    everywhere = np.asarray(rows.sum(axis=0)).ravel()[gs[0]:gs[-1]]  # (breaks ties in ``memory``)
    for cost in (np.asarray(ilp.col_cost, dtype=np.float64)[gs[0]:gs[-1]], _core.one_group_changed(ilp, plan),
                 _core.one_group_changed(ilp, least_plan)):
        for a, b in zip(starts, gs[1:] - gs[0]):
            cheapest = math.inf
            # fewest bytes at the start points first, then over every row, then the cheaper
            for k in np.lexsort((cost[a:b], everywhere[a:b], memory[a:b])):
                if allowed[a + k] and cost[a + k] < cheapest:
                    keep[a + k] = True
                    cheapest = cost[a + k]
    used = np.ones(int(ilp.num_cols), dtype=bool)
    used[gs[0]:gs[-1]] = keep
    return used


def kept_columns(problem, solution: Solution, least_memory: bool) -> np.ndarray:
    """The mask over ``problem.ilp``'s columns the restricted MIP keeps: every non-group column,
    the strategies of ``solution``'s LP support and its plan, and (``least_memory``) each group's
    least-memory strategies."""
    gs = np.asarray(problem.ilp.group_var_start, dtype=np.int64)
    used = np.zeros(int(problem.ilp.num_cols), dtype=bool)
    used[:gs[0]] = True
    used[gs[-1]:] = True
    if solution.support is not None:
        used[gs[0]:gs[-1]] = solution.support.columns
    used[gs[:-1] + np.asarray(solution.assignment, dtype=np.int64)] = True
    if least_memory:
        used[gs[0]:gs[-1]] |= least_memory_columns(memory_row_matrix(problem), gs)
    return used


def exact_copy_solution(problem, solution: Solution, options, where: str,
                        least_memory: bool = False, min_bytes: float | None = None,
                        used: np.ndarray | None = None, least_peak: bool = False) -> Solution | None:
    """The restricted MIP of ``problem`` (its memory rows at ``problem.memory_row_upper``) with every
    reshard copy of at least ``min_bytes`` per device counted exactly (module doc), around the
    budgeted plan ``solution`` (its LP support and plan: ``kept_columns``). None when it has no plan
    (or stops without one at the node limit, or runs past ``options.time_limit_s``). The Solution's
    ``mip_gap`` is measured from ``solution.support.bound`` (the first budgeted LP's: a relaxation
    of this MIP), NaN without one; its peak may exceed the budget by copies below ``min_bytes``
    (default ``MIN_BYTES_FRACTION`` of it: the caller checks ``predicted_peak``). ``used``: the
    columns kept instead of ``kept_columns``' (``frontier_columns``). ``least_peak``: no budget; the
    plan of least peak with every copy at the bounded points instead of the cheapest (costs ignored;
    a plan breaking another point past that peak adds it, as above)."""
    t0 = time.perf_counter()
    ilp = problem.ilp
    gs = np.asarray(ilp.group_var_start, dtype=np.int64)
    upper = float(problem.memory_row_upper)
    if min_bytes is None:
        min_bytes = upper * MIN_BYTES_FRACTION
    if used is None:
        used = kept_columns(problem, solution, least_memory)
    points = np.asarray(problem.memory_row_points)
    # the program points whose memory the MIP bounds: memory rows' points, and points whose live
    # set of values no row holds when a plan's copies make one of them its peak
    active = start_points(problem, solution.assignment)
    copies = CopyColumns(problem, used, active, min_bytes)
    n0 = int(ilp.num_cols)
    base = scipy.sparse.csc_matrix((np.asarray(ilp.a_value), np.asarray(ilp.a_index), np.asarray(ilp.a_start)),
                                   shape=(int(ilp.num_rows), n0))
    import highspy

    rel_gap = max(options.rel_gap, REL_GAP)
    nodes, nearby, bound = 0, None, -math.inf
    for round_ in range(MAX_ROW_ROUNDS + 1):
        n = n0 + copies.count
        rows = scipy.sparse.vstack([scipy.sparse.hstack([base, scipy.sparse.csc_matrix((base.shape[0], copies.count))]),
                                    copies.row_matrix()]).tocsr()
        row_lower = np.concatenate([np.asarray(ilp.row_lower), copies.row_lower])
        row_upper = np.concatenate([np.asarray(ilp.row_upper), np.full(copies.num_rows, np.inf)])
        cost = np.concatenate([np.asarray(ilp.col_cost), np.zeros(copies.count)])
        scale = 2.0 ** -math.ceil(math.log2(max(float(np.abs(cost).max(initial=0.0)), 1e-300) / 1e3))
        col_upper = np.concatenate([np.asarray(ilp.col_upper), np.ones(copies.count)])
        col_upper[:n0][~used] = 0.0
        integrality = np.concatenate([np.asarray(ilp.integrality), np.zeros(copies.count, dtype=np.int8)])
        # the active points' memory, scaled to 1000 (solve.highs.ROW_SCALE_TARGET; costs by a power of two: exact)
        held = value_rows(problem, active)
        memory = (scipy.sparse.hstack([held, scipy.sparse.csr_matrix((active.size, copies.count))]).tocsr()
                  + copies.in_memory_rows(active)) * (1000.0 / upper)
        if least_peak:  # one more column, the peak P: each bounded point's memory <= P, minimise P
            n += 1
            rows = scipy.sparse.hstack([rows, scipy.sparse.csr_matrix((rows.shape[0], 1))]).tocsr()
            memory = scipy.sparse.hstack([memory, scipy.sparse.csr_matrix(-np.ones((active.size, 1)))]).tocsr()
            cost, scale = np.concatenate([np.zeros(n - 1), [1.0]]), 1.0
            col_upper = np.append(col_upper, np.inf)
        a = scipy.sparse.vstack([rows, memory]).tocsc()
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, a.shape[0]
        lp.col_cost_, lp.col_lower_ = cost * scale, np.zeros(n)
        lp.offset_ = 0.0 if least_peak else float(ilp.offset) * scale
        lp.row_lower_ = np.concatenate([row_lower, np.full(active.size, -np.inf)])
        lp.row_upper_ = np.concatenate([row_upper, np.full(active.size, 0.0 if least_peak else 1000.0)])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in integrality] + [highspy.HighsVarType.kContinuous] * least_peak

        def run(upper_bounds):
            """HiGHS on ``lp`` with these column bounds: (status, x or None, objective, the MIP's
            bound), unscaled."""
            nonlocal nodes
            # (presolve on: it removes the strategies the restriction bounds to 0)
            h = _highs(dataclasses.replace(options, node_limit=NODE_LIMIT, rel_gap=rel_gap), presolve=True)
            if RINS_EFFORT is not None:
                h.setOptionValue("mip_heuristic_run_rins", True)
                h.setOptionValue("mip_heuristic_effort", RINS_EFFORT)
            lp.col_upper_ = upper_bounds
            h.passModel(lp)
            h.run()
            nodes += int(h.getInfo().mip_node_count)
            status, x = h.getModelStatus(), np.asarray(h.getSolution().col_value)
            if (status == highspy.HighsModelStatus.kTimeLimit or x.size != n
                    or h.getInfo().primal_solution_status != 2):
                return h.modelStatusToString(status), None, math.inf, -math.inf
            return "", x, h.getInfo().objective_function_value / scale, h.getInfo().mip_dual_bound / scale

        x = None
        if nearby is not None:
            # first the last plan with only its groups' ``nearby`` strategies allowed: a small MIP,
            # taken when within the gap of the last full MIP's bound (this one has more rows)
            restricted = col_upper.copy()
            restricted[:n0][~nearby] = 0.0
            _, x, value, _ = run(restricted)
            if x is None or value - bound > rel_gap * abs(value):
                log.info("alpa_pass: mesh %s: no plan near the last one within %g of its bound (%d strategies "
                         "nearby)", where, rel_gap, int(nearby[gs[0]:gs[-1]].sum()) - gs.size + 1)
                x = None
        if x is None:
            status, x, _, bound = run(col_upper)
            if x is None:
                log.info("alpa_pass: mesh %s: no exact-copy plan on the restricted strategies (%s, %d memory "
                         "points)", where, status, active.size)
                return None
        assignment = np.asarray([int(np.argmax(x[gs[g]:gs[g + 1]])) for g in range(gs.size - 1)], dtype=np.int64)
        # every row's activity under the plan with all its copies (those without columns too: a row
        # they break joins, and the candidates spanning it get columns)
        limit = x[n - 1] * upper / 1000.0 if least_peak else upper
        over = points[row_peaks(problem, assignment) > limit * (1 + 1e-9) + 1e-6]
        peak, at = problem.predicted_peak(assignment)
        if peak > limit * (1 + 1e-9) + 1e-6:
            over = np.append(over, at)
        over = np.setdiff1d(over, active)
        if not over.size:
            break
        if round_ == MAX_ROW_ROUNDS:
            return None
        if not least_peak:
            nearby = _nearby_columns(problem, assignment, held, used, bound, rel_gap)
        active = np.union1d(active, over)
        added = copies.add_spanning(over)
        log.info("alpa_pass: mesh %s: the exact-copy plan peaks at %.4g GiB with every copy at points %s (bound "
                 "%.4g GiB): solving again with them bounded (%d more candidate copies)", where, peak / 2**30,
                 ",".join(map(str, over[:8])), limit / 2**30, added)
    objective = float(_core.evaluate(ilp, assignment).objective)
    bound = math.nan if solution.support is None else float(solution.support.bound)
    gap = max(0.0, (objective - bound) / abs(objective)) if objective and not math.isnan(bound) else math.nan
    log.info("alpa_pass: mesh %s: exact-copy plan: %d candidate copies (%d columns, %d rows), %d memory points, "
             "%d nodes; objective %.6g (%.3g above the LP bound), %.1f s", where, copies.candidates, copies.count,
             copies.num_rows, active.size, nodes, objective, gap, time.perf_counter() - t0)
    return Solution(assignment=assignment, x=_one_hot(assignment, gs, n0), objective=objective,
                    status=EXACT_STATUS, optimal=False, mip_gap=gap, time_limited=False,
                    solve_time_s=time.perf_counter() - t0, node_limited=nodes >= NODE_LIMIT,
                    solved_size=(n, int(a.shape[0])))


def _nearby_columns(problem, assignment, held, used, bound: float, rel_gap: float) -> np.ndarray:
    """A mask over ``problem.ilp``'s columns for the small MIP tried first when the exact-copy
    MIP's plan ``assignment`` broke the budget with its copies at a point it did not bound: every
    non-group column, the plan's strategies, and each kept strategy (``used``) with no more bytes
    than the plan's strategy of its group at any of the points the MIP bounded (``held``: their
    ``value_rows``) and an objective, with only its group changed, within ``rel_gap`` of ``bound``
    (the MIP's bound: a re-solve is held to that gap too). Measured: GPT 1.3B 2x4 at 15 GiB, the plan broke a point
    between two rows by 2.3 MB (0.014%); a re-solve took the MIP's 4.5 s again, single-group
    repairs broke a tie (equalities) or another point."""
    ilp = problem.ilp
    gs = np.asarray(ilp.group_var_start, dtype=np.int64)
    plan = gs[:-1] + np.asarray(assignment, dtype=np.int64)
    group_of = np.repeat(np.arange(gs.size - 1), np.diff(gs))
    objective = _core.one_group_changed(ilp, assignment)
    held = held[:, gs[0]:gs[-1]].toarray()
    near = (held <= held[:, plan - gs[0]][:, group_of]).all(axis=0)
    near &= (objective - bound) <= rel_gap * np.abs(objective)
    out = used.copy()
    out[gs[0]:gs[-1]] &= near
    out[plan] = True
    return out


def _one_hot(assignment, gs, num_cols) -> np.ndarray:
    """The ILP's column vector of a plan's group columns (edge columns 0)."""
    x = np.zeros(num_cols)
    x[gs[:-1] + np.asarray(assignment, dtype=np.int64)] = 1.0
    return x
