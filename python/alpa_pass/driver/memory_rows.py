"""Memory rows as matrices: a problem's budget rows materialised (CSR over the ILP's columns) and
the rows another row dominates, which can be left out without changing the feasible plans
(``driver.budget`` adds memory rows lazily and drops dominated ones)."""
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
