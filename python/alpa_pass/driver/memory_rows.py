"""Memory rows as matrices: a problem's budget rows materialised (CSR over the ILP's columns), the
rows another row dominates, which can be left out without changing the feasible plans
(``driver.budget`` adds memory rows lazily and drops dominated ones), the row of any program point
(``value_rows``) and each row's bytes under a plan with its reshard copies (``row_peaks``; both for
``driver.exact_copies``)."""
from __future__ import annotations

import numpy as np
import scipy.sparse


def memory_row_matrix(problem, which=None) -> scipy.sparse.csr_matrix:
    """The memory rows ``which`` (ascending indices; None: all) of a ``_core.ShardingProblem`` as
    a CSR matrix over the ILP's columns, columns ascending per row."""
    indptr, indices, data = problem.memory_row_matrix(None if which is None else np.asarray(which, dtype=np.int64))
    return scipy.sparse.csr_matrix((data, indices, indptr), shape=(indptr.size - 1, int(problem.ilp.num_cols)))


def undominated_memory_rows(problem) -> np.ndarray:
    """Indices of the memory rows of ``problem`` that no other row dominates (all rows
    materialised: the fallback when row generation did not finish)."""
    rows = np.arange(problem.num_memory_rows)
    return np.delete(rows, redundant_memory_rows(memory_row_matrix(problem)))


def redundant_memory_rows(m: scipy.sparse.csr_matrix, window: int = 64, tol: float = 1e-9) -> np.ndarray:
    """Indices of rows of ``m`` (memory rows in program order, one upper bound for all) that another
    row dominates (every coefficient <= the other's), compared within ``window`` rows: dropping
    them leaves the feasible plans, and so the optimum, unchanged. Memory rows are the live bytes
    at schedule points, so neighbouring points mostly hold subsets of each other's tensors.

    A row is dropped only when it is below a row in the strict order "dominated, or equal with a
    lower index"; the maximal rows of that order stay, and every dropped row is below one."""
    n = m.shape[0]
    dropped = np.zeros(n, dtype=bool)
    for k in range(1, min(window, n - 1) + 1):
        d = (_row_range(m, k, n) - _row_range(m, 0, n - k)).tocsr()  # row i: m[i + k] - m[i]
        row_of = np.repeat(np.arange(n - k), np.diff(d.indptr))
        no_neg = np.ones(n - k, dtype=bool)  # m[i] <= m[i + k]
        no_neg[row_of[d.data < -tol]] = False
        no_pos = np.ones(n - k, dtype=bool)  # m[i + k] <= m[i]
        no_pos[row_of[d.data > tol]] = False
        equal = no_neg & no_pos
        dropped[:-k] |= no_neg  # m[i] below m[i + k] (equal: the lower index goes)
        dropped[k:] |= no_pos & ~equal
    return np.flatnonzero(dropped)


def _row_range(m: scipy.sparse.csr_matrix, lo: int, hi: int) -> scipy.sparse.csr_matrix:
    """Rows lo..hi-1 of ``m`` sharing its arrays (scipy's row slicing copies and scans them all)."""
    ptr = m.indptr[lo:hi + 1]
    return scipy.sparse.csr_matrix((m.data[ptr[0]:ptr[-1]], m.indices[ptr[0]:ptr[-1]], ptr - ptr[0]),
                                   shape=(hi - lo, m.shape[1]))


def offsets_within(counts) -> np.ndarray:
    """0..c-1 for each c of ``counts`` (non-negative ints), concatenated: the offsets of the items of
    consecutive runs of these lengths within their run."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def value_rows(problem, points) -> scipy.sparse.csr_matrix:
    """The memory row of each of ``points`` (program points, ascending; any point, not only
    ``problem.memory_row_points``) over the ILP's columns, its values only (no copies): each value
    live there (``problem.live_*``) adds its strategies' bytes to its group's columns (merged nodes
    add up per strategy), as ``_core`` memory.cc materialise_memory_rows does for a row's point."""
    points = np.asarray(points, dtype=np.int64)
    gs = np.asarray(problem.ilp.group_var_start, dtype=np.int64)
    group = np.asarray(problem.node_group, dtype=np.int64)
    off = np.asarray(problem.strategy_offsets, dtype=np.int64)
    memory = np.asarray(problem.memory)
    nodes, start, end = (np.asarray(a, dtype=np.int64) for a in (problem.live_nodes, problem.live_start,
                                                                  problem.live_end))
    rows, cols, data = [], [], []
    for r, t in enumerate(points):
        live = nodes[(start <= t) & (end >= t)]
        counts = off[live + 1] - off[live]
        k = offsets_within(counts)  # (node by node)
        rows.append(np.full(k.size, r))
        cols.append(np.repeat(gs[group[live]], counts) + k)
        data.append(memory[np.repeat(off[live], counts) + k])
    if not rows:
        return scipy.sparse.csr_matrix((points.size, int(problem.ilp.num_cols)))
    out = scipy.sparse.csr_matrix((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))),
                                  shape=(points.size, int(problem.ilp.num_cols)))
    out.sum_duplicates()
    return out


def row_peaks(problem, assignment) -> np.ndarray:
    """Each memory row's bytes under ``assignment`` (a strategy per group), its reshard copies live
    at the row's point included (``problem.reshard_copies``): the largest is ``predicted_peak``."""
    assignment = np.asarray(assignment, dtype=np.int64)
    points = np.asarray(problem.memory_row_points)
    out = np.asarray(problem.memory_row_activity(assignment), dtype=np.float64).copy()
    made = problem.reshard_copies(assignment)
    if made:
        start = np.searchsorted(points, np.asarray([c[3] for c in made]))
        end = np.searchsorted(points, np.asarray([c[4] for c in made]), side="right")
        delta = np.zeros(points.size + 1)
        size = np.asarray([c[5] for c in made], dtype=np.float64)
        np.add.at(delta, start, size)
        np.add.at(delta, end, -size)
        out += np.cumsum(delta)[:-1]
    return out
