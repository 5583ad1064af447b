"""Exact presolve of a sharding ILP: ties substituted, dominated strategies pruned, groups of
degree <= 2 eliminated (variable elimination), equal edge-cost rows merged.

The ILP (``alpa_pass._core.IlpProblem``, layout in cpp/src/ilp.cc) is a pairwise cost model: one
strategy per group, a cost per strategy and a cost per strategy pair of each edge. First, ties
(equality rows) that make one group a function of another are substituted (``solve.ties``). Then,
to a fixed point, dominated strategies of free groups are dropped and additive edges folded into
per-group costs (``solve.dominance``), and a group ``b`` that no remaining equality or linear
(memory) row names, whose strategies are all allowed, and that has

- no edge: takes its cheapest strategy;
- one edge (to ``a``): is folded into ``a``'s costs, cost_a[i] += min_k (cost_b[k] + R_ab[i, k]);
- two edges (to ``a`` and ``c``): becomes one edge ``a``-``c``,
  R_ac[i, j] += min_k (R_ab[i, k] + cost_b[k] + R_bc[k, j]) (when that edge has no more columns
  than the two it replaces).

Each step leaves an ILP with the same optimum: every plan of the reduced ILP extends (each
eliminated or substituted group recovered from its table, in reverse order) to a plan of the full
ILP with the same objective, and no full plan is cheaper. Finally, on each remaining edge the
strategies with equal cost rows (columns) share one marginal row and their product columns: the
same integer plans and the same LP relaxation (a fractional plan splits proportionally). Follower
chains of the unmerged problem (elementwise ops between two others) are degree-2 groups: on the
3-layer test MLP's refinement ILP (2x4) elimination alone leaves 56 of 243 groups and 4845 of
11039 edge columns.

Memory rows (one-sided linear rows, ``driver.budget``) stay rows: the groups they name are never
eliminated, but may lose dominated strategies when the dominator is also no larger in every such
row. They are kept as one sparse matrix (millions of nonzeros on an 8B-parameter model), rewritten
through the ties' column map. On the LLaMA-8B-shaped step at 40 GiB (bench_budget.py) the solve
with every undominated memory row went 74 -> 21 s (unreduced and unscaled -> reduced, rows
scaled by solve.highs; the same optimum).
"""
from __future__ import annotations

import dataclasses
import hashlib
from types import SimpleNamespace

import numpy as np
import scipy.sparse

from alpa_pass.solve import dominance, ties


@dataclasses.dataclass
class Reduced:
    """The reduced model (``model``: the CSC attributes ``solve.highs`` passes to HiGHS, plus
    ``group_var_start``) and what is needed to expand its plans to the full problem."""

    model: SimpleNamespace
    kept: np.ndarray                 # full group index of each reduced group
    eliminated: list                 # (group, neighbours, argmin table), in elimination order
    edge_cols: tuple                 # (u, i, v, j) arrays: the full problem's edge columns
    num_groups: int
    alive: list                      # full strategy indices of each kept group's reduced columns
    pruned: list                     # (group, strategy, dominator): dominance.prune's events
    extra_cols: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # full indices of the columns past the group and edge columns: the model's last columns

    def start(self, start) -> np.ndarray:
        """A full-problem start (strategy per group) as a reduced one: pruned strategies replaced
        by their dominators (never costlier), restricted to the kept groups."""
        full = dominance.replay(self.pruned, start)
        return np.asarray([int(np.searchsorted(a, full[g])) for g, a in zip(self.kept, self.alive)],
                          dtype=np.int64)

    def expand(self, x_reduced: np.ndarray) -> np.ndarray:
        """The full assignment (strategy per group) of a reduced column vector."""
        gs = self.model.group_var_start
        full = np.full(self.num_groups, -1, dtype=np.int64)
        for r, g in enumerate(self.kept):
            full[g] = int(self.alive[r][np.argmax(x_reduced[gs[r]:gs[r + 1]])])
        for g, nbrs, table in reversed(self.eliminated):
            full[g] = int(table[tuple(full[n] for n in nbrs)])
        return full

    def full_columns(self, assignment: np.ndarray, num_cols: int, group_var_start, x_reduced) -> np.ndarray:
        """The full problem's column vector of ``assignment`` (one-hot s, product e columns; extra
        columns from the reduced solution ``x_reduced``)."""
        x = np.zeros(num_cols)
        gs = np.asarray(group_var_start)
        x[gs[:-1] + assignment] = 1.0
        u, i, v, j = self.edge_cols
        x[gs[-1]:gs[-1] + u.size] = ((assignment[u] == i) & (assignment[v] == j)).astype(np.float64)
        if self.extra_cols.size:
            x[self.extra_cols] = np.asarray(x_reduced)[-self.extra_cols.size:]
        return x


def reduce(problem) -> Reduced | None:
    """The reduced ILP of ``problem``, or None when nothing is reduced. Columns past the group and
    edge columns (e.g. ``_core.min_max_row_problem``'s M) are kept as they are, and the rows
    naming them are kept as linear rows."""
    gs = np.asarray(problem.group_var_start, dtype=np.int64)
    num_s, num_e = int(gs[-1] - gs[0]), int(problem.num_edge_vars)
    num_cols, num_rows = int(problem.num_cols), int(problem.num_rows)
    if gs[0] != 0 or num_cols < num_s + num_e:
        return None
    G = gs.size - 1
    sizes = np.diff(gs)
    a_start = np.asarray(problem.a_start, dtype=np.int64)
    a_index = np.asarray(problem.a_index, dtype=np.int64)
    a_value = np.asarray(problem.a_value, dtype=np.float64)
    cost = np.asarray(problem.col_cost, dtype=np.float64)
    upper = np.asarray(problem.col_upper, dtype=np.float64)
    col_of = np.repeat(np.arange(num_cols), np.diff(a_start))
    is_e = (col_of >= num_s) & (col_of < num_s + num_e)
    is_x = col_of >= num_s + num_e  # extra columns' nonzeros
    marginal = np.zeros(num_rows, dtype=bool)
    marginal[a_index[is_e]] = True
    group_of_col = np.repeat(np.arange(G), sizes)
    # s-column nonzeros: in marginal rows (the -1 of s[g][k]) or in other rows (ties, memory)
    s_nz = (col_of < num_s) & (a_index >= G)
    row_s = np.full(num_rows, -1, dtype=np.int64)
    in_marg = s_nz & marginal[a_index]
    row_s[a_index[in_marg]] = col_of[in_marg]
    forbidden = np.zeros(G, dtype=bool)
    forbidden[group_of_col[upper[:num_s] < 0.5]] = True  # a forbidden strategy: keep it a bound
    other = s_nz & ~marginal[a_index]
    row_lower, row_upper = np.asarray(problem.row_lower), np.asarray(problem.row_upper)
    # rows that may be ties (equalities to 0) go through ties.substitutions one by one; the others
    # (memory rows: up to millions of nonzeros) stay a sparse matrix, rewritten by its column map
    tie_like = (row_lower == 0.0) & (row_upper == 0.0)
    tie_like[a_index[is_x]] = False
    tie_nz, lin_nz = other & tie_like[a_index], other & ~tie_like[a_index]
    subs, rows_left, column_map = _substitutions(col_of[tie_nz], a_index[tie_nz], a_value[tie_nz], row_lower,
                                                 row_upper, group_of_col, gs, forbidden)
    lin_rows = np.unique(np.concatenate([a_index[lin_nz], a_index[is_x]]))
    lin = scipy.sparse.csr_matrix((a_value[lin_nz], (np.searchsorted(lin_rows, a_index[lin_nz]), col_of[lin_nz])),
                                  shape=(lin_rows.size, num_s)) @ column_map
    lin = scipy.sparse.csr_matrix(lin)
    lin.eliminate_zeros()
    pinned = forbidden.copy()
    pinned[[g for e in rows_left.values() for g, _, _ in e]] = True
    pinned[[g for g, _, _ in subs]] = True
    pinned[group_of_col[np.unique(lin.indices)]] = True
    bounds = _one_sided_bounds(lin, row_lower[lin_rows], row_upper[lin_rows], rows_left, forbidden, group_of_col, gs)
    # edge columns: rows (r1 < r2) -> (u, i), (v, j)
    e_nz = np.flatnonzero(is_e)
    rows = a_index[e_nz].reshape(-1, 2)
    rows.sort(axis=1)
    su, sv = row_s[rows[:, 0]], row_s[rows[:, 1]]
    u, v = group_of_col[su], group_of_col[sv]
    i, j = su - gs[u], sv - gs[v]
    e_cost = cost[num_s:num_s + num_e]
    unary = [cost[gs[g]:gs[g + 1]].copy() for g in range(G)]
    adj: list[dict] = [dict() for _ in range(G)]
    for (gu, gv), idx in _group_pairs(u, v).items():
        m = np.zeros((sizes[gu], sizes[gv]))
        np.add.at(m, (i[idx], j[idx]), e_cost[idx])
        _add_edge(adj, gu, gv, m)
    ties.apply(adj, unary, subs, _add_edge)
    eliminated, pruned = [(g, (p,), table) for g, p, table in subs], []
    full_sizes = sizes.copy()
    alive = [np.arange(s) for s in sizes]
    # alternate: pruning lowers degrees and sizes, elimination folds edges that may then be additive
    while dominance.prune(adj, unary, sizes, pinned, alive, pruned, bounds) | _eliminate(
            adj, unary, sizes, pinned, alive, full_sizes, eliminated):
        pass
    gone = np.zeros(G, dtype=bool)
    gone[[g for g, _, _ in eliminated]] = True
    kept = np.flatnonzero(~gone)
    offset = float(problem.offset) + sum(float(t) for g, n, t in eliminated if not n)
    extra = (np.arange(num_s + num_e, num_cols), col_of[is_x], np.searchsorted(lin_rows, a_index[is_x]),
             a_value[is_x])
    model = _model(problem, kept, unary, adj, sizes, gs, offset, G, alive, rows_left, lin, lin_rows, extra)
    if not eliminated and not pruned and model.num_cols == num_cols:
        return None
    return Reduced(model=model, kept=kept, eliminated=eliminated, edge_cols=(u, i, v, j), num_groups=G,
                   alive=[alive[g] for g in kept], pruned=pruned, extra_cols=np.arange(num_s + num_e, num_cols))


# ties.substitutions of the last few distinct tie rows: the solves of one budgeted plan (row rounds,
# reshard copy rounds) differ only in their memory rows, which come after the tie rows (LLaMA-8B
# 8x8: 0.8 s of each solve's 1.4 s presolve). Keyed by the rows' content; the results are read only.
_SUBSTITUTIONS: dict = {}
_SUBSTITUTIONS_KEPT = 4


def _substitutions(cols, rows, values, row_lower, row_upper, group_of_col, gs, forbidden) -> tuple:
    """``ties.substitutions`` of the tie-like rows given as nonzeros (column, row, value), memoised
    by their content (and the groups' layout and forbidden strategies)."""
    key = hashlib.blake2b(digest_size=20)
    for a in (cols, rows, values, gs, forbidden, row_lower[rows], row_upper[rows]):
        a = np.ascontiguousarray(a)
        key.update(str((a.dtype.str, a.shape)).encode())
        key.update(a.tobytes())
    key = key.digest()
    if key not in _SUBSTITUTIONS:
        tie_rows: dict = {}
        for c, r, val in zip(cols, rows, values):
            g = int(group_of_col[c])
            tie_rows.setdefault(int(r), []).append((g, int(c - gs[g]), float(val)))
        while len(_SUBSTITUTIONS) >= _SUBSTITUTIONS_KEPT:
            del _SUBSTITUTIONS[next(iter(_SUBSTITUTIONS))]
        _SUBSTITUTIONS[key] = ties.substitutions(tie_rows, row_lower, row_upper, group_of_col, gs, forbidden)
    return _SUBSTITUTIONS[key]


def _one_sided_bounds(lin, lower, upper, rows_left, forbidden, group_of_col, gs) -> dict:
    """{group: matrix} for the groups that only one-sided linear rows (memory rows: live bytes <=
    budget) pin (``lin``: those rows over the s columns, ``lower``/``upper`` their bounds): one
    column per such row naming the group, each strategy's coefficient (negated for a ``>=`` row),
    so that ``dominance.prune`` drops a strategy only for one that is no worse in every such row
    too (switching to it keeps every row satisfied). Groups also named by an equality or
    two-sided row, or with a forbidden strategy, are left out (not pruned)."""
    frozen = forbidden.copy()
    frozen[[g for e in rows_left.values() for g, _, _ in e]] = True
    le = np.isneginf(lower) & np.isfinite(upper)
    ge = np.isposinf(upper) & np.isfinite(lower)
    sign = np.where(le, 1.0, np.where(ge, -1.0, 0.0))
    both = lin[np.flatnonzero(sign == 0.0)]
    frozen[group_of_col[np.unique(both.indices)]] = True
    signed = scipy.sparse.csr_matrix(scipy.sparse.diags(sign) @ lin)
    signed.eliminate_zeros()
    named_groups = np.unique(group_of_col[signed.indices])  # CSR: indices are columns
    signed = signed.tocsc()
    out = {}
    for g in named_groups:
        g = int(g)
        if frozen[g]:
            continue
        block = signed[:, gs[g]:gs[g + 1]].tocoo()
        named, row = np.unique(block.row, return_inverse=True)
        m = np.zeros((int(gs[g + 1] - gs[g]), named.size))
        m[block.col, row] = block.data
        out[g] = m
    return out


def _group_pairs(u, v) -> dict:
    order = np.lexsort((v, u))
    pairs: dict = {}
    if order.size == 0:
        return pairs
    keys = np.stack([u[order], v[order]], axis=1)
    cut = np.flatnonzero(np.any(np.diff(keys, axis=0) != 0, axis=1)) + 1
    for chunk in np.split(order, cut):
        pairs[(int(u[chunk[0]]), int(v[chunk[0]]))] = chunk
    return pairs


def _add_edge(adj, a: int, b: int, m: np.ndarray) -> None:
    """Add cost matrix m (|S_a| x |S_b|) to edge a-b (stored both ways)."""
    if b in adj[a]:
        adj[a][b] = adj[a][b] + m
    else:
        adj[a][b] = m
    adj[b][a] = adj[a][b].T


def _eliminate(adj, unary, sizes, pinned, strategies, full_sizes, out) -> bool:
    """Eliminate groups of degree <= 2 to a fixed point (in increasing group order each sweep, so
    the result is a function of the problem). Appends (group, neighbours, argmin table) to ``out``;
    tables are indexed by the neighbours' full strategy indices and give full ones
    (``strategies[g]``: the full index of each of g's remaining strategies); for a degree-0 group
    the table is its cheapest cost (a constant) and it is recovered by argmin. True if any."""
    alive = [g for g in range(len(unary)) if not pinned[g]]
    changed, any_change = True, False
    while changed:
        changed = False
        still = []
        for b in alive:
            nbrs = sorted(adj[b])
            if len(out) == len(unary) - 1:  # keep one group: HiGHS needs a non-empty model
                still.append(b)
                continue
            if len(nbrs) == 0:
                k = int(np.argmin(unary[b]))
                out.append((b, (), _Const(int(strategies[b][k]), float(unary[b][k]))))
            elif len(nbrs) == 1:
                a = nbrs[0]
                total = adj[a][b] + unary[b][None, :]
                unary[a] = unary[a] + total.min(axis=1)
                out.append((b, (a,), _full_table(total.argmin(axis=1), b, (a,), strategies, full_sizes)))
                del adj[a][b]
            elif len(nbrs) == 2 and sizes[nbrs[0]] * sizes[nbrs[1]] <= sizes[b] * (sizes[nbrs[0]] + sizes[nbrs[1]]):
                a, c = nbrs
                total = adj[a][b][:, :, None] + unary[b][None, :, None] + adj[b][c][None, :, :]
                del adj[a][b], adj[c][b]
                _add_edge(adj, a, c, total.min(axis=1))
                out.append((b, (a, c), _full_table(total.argmin(axis=1), b, (a, c), strategies, full_sizes)))
            else:
                still.append(b)
                continue
            adj[b] = {}
            pinned[b] = True  # eliminated: no longer free (dominance.prune skips it)
            changed = any_change = True
        alive = still
    return any_change


def _full_table(local, b, nbrs, strategies, full_sizes) -> np.ndarray:
    """An argmin table over the neighbours' remaining strategies as one over their full indices
    (entries of pruned strategies are never read: expansion picks remaining ones only)."""
    table = np.zeros(tuple(int(full_sizes[n]) for n in nbrs), dtype=np.int64)
    table[np.ix_(*(strategies[n] for n in nbrs))] = strategies[b][local]
    return table


class _Const:
    """The 'table' of a degree-0 group: indexing with () gives its strategy; float() its cost."""

    def __init__(self, k: int, cost: float):
        self.k, self.cost = k, cost

    def __getitem__(self, _):
        return self.k

    def __float__(self):
        return self.cost


def _model(problem, kept, unary, adj, sizes, gs, offset, G, alive, rows_left, lin, lin_rows, extra) -> SimpleNamespace:
    """The reduced CSC model: kept groups' s-columns (one-hot rows, bounds and the equality /
    linear rows that substitution left, which name kept groups only: ``rows_left`` and the sparse
    ``lin`` with original row indices ``lin_rows``, in original row order), then one e-block per
    remaining edge between two kept groups with > 1 strategy (one row and column per class of
    equal costs); edges to one-strategy groups fold into costs; last the extra columns as they are
    (``extra``: their full indices, and the full column, lin row and value of each nonzero)."""
    new_of = np.full(G, -1, dtype=np.int64)
    new_of[kept] = np.arange(kept.size)
    ksizes = sizes[kept]
    kgs = np.concatenate([[0], np.cumsum(ksizes)]).astype(np.int64)
    n_s = int(kgs[-1])
    s_cost = np.concatenate([unary[g] for g in kept]) if kept.size else np.zeros(0)
    upper = np.asarray(problem.col_upper)
    s_upper = np.concatenate([upper[gs[g] + alive[g]] for g in kept]) if kept.size else np.zeros(0)
    # COO pieces (row, column, value): one-hot rows first
    ent = [(np.repeat(np.arange(kept.size), ksizes), np.arange(n_s), np.ones(n_s))]
    row_lo, row_up = [np.ones(kept.size)], [np.ones(kept.size)]
    # the full problem's rows past the one-hot and marginal rows (ties, memory) that substitution
    # left, over kept groups (which such rows pin against elimination; a one-sided row's groups
    # may have lost dominated strategies: their coefficients go with them)
    new_col = np.full(int(gs[-1]), -1, dtype=np.int64)
    for g in kept:
        new_col[gs[g] + alive[g]] = kgs[new_of[g]] + np.arange(alive[g].size)
    left = np.asarray(sorted(rows_left), dtype=np.int64)
    order = np.concatenate([left, lin_rows])
    position = kept.size + np.argsort(np.argsort(order, kind="stable"), kind="stable")
    rl, ru = np.asarray(problem.row_lower), np.asarray(problem.row_upper)
    bounds_lo, bounds_up = np.zeros(order.size), np.zeros(order.size)
    bounds_lo[position - kept.size], bounds_up[position - kept.size] = rl[order], ru[order]
    row_lo.append(bounds_lo)
    row_up.append(bounds_up)
    for n, r in enumerate(left):
        e = [(gs[g] + k, val) for g, k, val in rows_left[int(r)]]
        col = new_col[np.asarray([c for c, _ in e], dtype=np.int64)]
        val = np.asarray([v for _, v in e], dtype=np.float64)
        ent.append((np.full(int((col >= 0).sum()), position[n]), col[col >= 0], val[col >= 0]))
    coo = lin.tocoo()
    col = new_col[coo.col]
    ent.append((position[left.size + coo.row[col >= 0]], col[col >= 0], coo.data[col >= 0]))
    n_rows = kept.size + order.size
    e_cost = []
    n_e = 0
    for a in kept:
        for b, m in sorted(adj[a].items()):
            if b < a:
                continue
            ka, kb = kgs[new_of[a]], kgs[new_of[b]]
            if sizes[a] == 1 or sizes[b] == 1:
                if sizes[a] == 1 and sizes[b] == 1:
                    offset += float(m[0, 0])
                elif sizes[a] == 1:
                    s_cost[kb:kb + sizes[b]] += m[0]
                else:
                    s_cost[ka:ka + sizes[a]] += m[:, 0]
                continue
            # one marginal row per class of equal rows (columns) of m: strategies with the same
            # output (operand) spec cost the same on this edge, so their e-columns are one
            rows_a, cls_a = np.unique(m, axis=0, return_inverse=True)
            cols_b, cls_b = np.unique(rows_a, axis=1, return_inverse=True)
            na, nb = cols_b.shape
            ra, rb = n_rows, n_rows + na
            n_rows += na + nb
            ent.append((ra + cls_a.ravel(), ka + np.arange(sizes[a]), -np.ones(sizes[a])))
            ent.append((rb + cls_b.ravel(), kb + np.arange(sizes[b]), -np.ones(sizes[b])))
            e = n_s + n_e + np.arange(na * nb)
            ent.append((ra + np.repeat(np.arange(na), nb), e, np.ones(na * nb)))
            ent.append((rb + np.tile(np.arange(nb), na), e, np.ones(na * nb)))
            e_cost.append(cols_b.ravel())
            n_e += na * nb
    row_lo.append(np.zeros(n_rows - kept.size - order.size))
    row_up.append(np.zeros(n_rows - kept.size - order.size))
    x_full, x_col, x_row, x_val = extra
    n_x = x_full.size
    ent.append((position[left.size + x_row], n_s + n_e + np.searchsorted(x_full, x_col), x_val))
    matrix = scipy.sparse.csc_matrix(
        (np.concatenate([v for _, _, v in ent]),
         (np.concatenate([r for r, _, _ in ent]), np.concatenate([c for _, c, _ in ent]))),
        shape=(n_rows, n_s + n_e + n_x))
    matrix.sort_indices()
    col = lambda name: np.asarray(getattr(problem, name))[x_full]  # noqa: E731
    return SimpleNamespace(
        num_cols=n_s + n_e + n_x, num_rows=n_rows, offset=offset,
        col_cost=np.concatenate([s_cost] + [np.asarray(c, dtype=np.float64) for c in e_cost] + [col("col_cost")]),
        col_lower=np.concatenate([np.zeros(n_s + n_e), col("col_lower")]),
        col_upper=np.concatenate([s_upper, np.ones(n_e), col("col_upper")]),
        row_lower=np.concatenate(row_lo), row_upper=np.concatenate(row_up),
        a_start=matrix.indptr.astype(np.int32), a_index=matrix.indices.astype(np.int32),
        a_value=matrix.data.astype(np.float64), integrality=np.concatenate(
            [np.ones(n_s, dtype=np.int32), np.zeros(n_e, dtype=np.int32), col("integrality").astype(np.int32)]),
        group_var_start=kgs)
