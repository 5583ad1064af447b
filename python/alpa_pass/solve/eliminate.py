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
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np

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

    def full_columns(self, assignment: np.ndarray, num_cols: int, group_var_start) -> np.ndarray:
        """The full problem's column vector of ``assignment`` (one-hot s, product e columns)."""
        x = np.zeros(num_cols)
        gs = np.asarray(group_var_start)
        x[gs[:-1] + assignment] = 1.0
        u, i, v, j = self.edge_cols
        x[gs[-1]:] = ((assignment[u] == i) & (assignment[v] == j)).astype(np.float64)
        return x


def reduce(problem) -> Reduced | None:
    """The reduced ILP of ``problem``, or None when nothing is eliminated or the problem has
    columns beyond the group and edge columns (e.g. ``_core.min_max_row_problem``'s M)."""
    gs = np.asarray(problem.group_var_start, dtype=np.int64)
    num_s = int(gs[-1] - gs[0])
    num_cols, num_rows = int(problem.num_cols), int(problem.num_rows)
    if gs[0] != 0 or num_cols != num_s + int(problem.num_edge_vars):
        return None
    G = gs.size - 1
    sizes = np.diff(gs)
    a_start = np.asarray(problem.a_start, dtype=np.int64)
    a_index = np.asarray(problem.a_index, dtype=np.int64)
    a_value = np.asarray(problem.a_value, dtype=np.float64)
    cost = np.asarray(problem.col_cost, dtype=np.float64)
    upper = np.asarray(problem.col_upper, dtype=np.float64)
    col_of = np.repeat(np.arange(num_cols), np.diff(a_start))
    is_e = col_of >= num_s
    marginal = np.zeros(num_rows, dtype=bool)
    marginal[a_index[is_e]] = True
    group_of_col = np.repeat(np.arange(G), sizes)
    # s-column nonzeros: in marginal rows (the -1 of s[g][k]) or in other rows (ties, memory)
    s_nz = ~is_e & (a_index >= G)
    row_s = np.full(num_rows, -1, dtype=np.int64)
    in_marg = s_nz & marginal[a_index]
    row_s[a_index[in_marg]] = col_of[in_marg]
    forbidden = np.zeros(G, dtype=bool)
    forbidden[group_of_col[upper[:num_s] < 0.5]] = True  # a forbidden strategy: keep it a bound
    other = s_nz & ~marginal[a_index]
    other_rows: dict = {}
    for c, r, val in zip(col_of[other], a_index[other], a_value[other]):
        g = int(group_of_col[c])
        other_rows.setdefault(int(r), []).append((g, int(c - gs[g]), float(val)))
    subs, rows_left = ties.substitutions(other_rows, np.asarray(problem.row_lower), np.asarray(problem.row_upper),
                                         group_of_col, gs, forbidden)
    pinned = forbidden.copy()
    pinned[[g for e in rows_left.values() for g, _, _ in e]] = True
    pinned[[g for g, _, _ in subs]] = True
    # edge columns: rows (r1 < r2) -> (u, i), (v, j)
    e_nz = np.flatnonzero(is_e)
    rows = a_index[e_nz].reshape(-1, 2)
    rows.sort(axis=1)
    su, sv = row_s[rows[:, 0]], row_s[rows[:, 1]]
    u, v = group_of_col[su], group_of_col[sv]
    i, j = su - gs[u], sv - gs[v]
    e_cost = cost[num_s:]
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
    while dominance.prune(adj, unary, sizes, pinned, alive, pruned) | _eliminate(
            adj, unary, sizes, pinned, alive, full_sizes, eliminated):
        pass
    gone = np.zeros(G, dtype=bool)
    gone[[g for g, _, _ in eliminated]] = True
    kept = np.flatnonzero(~gone)
    offset = float(problem.offset) + sum(float(t) for g, n, t in eliminated if not n)
    model = _model(problem, kept, unary, adj, sizes, gs, offset, G, alive, rows_left)
    if not eliminated and not pruned and model.num_cols == num_cols:
        return None
    return Reduced(model=model, kept=kept, eliminated=eliminated, edge_cols=(u, i, v, j), num_groups=G,
                   alive=[alive[g] for g in kept], pruned=pruned)


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


def _model(problem, kept, unary, adj, sizes, gs, offset, G, alive, rows_left) -> SimpleNamespace:
    """The reduced CSC model: kept groups' s-columns (one-hot rows, bounds and the equality /
    linear rows that substitution left, which name kept groups only), then one e-block per
    remaining edge between two kept groups with > 1 strategy (one row and column per class of
    equal costs); edges to one-strategy groups fold into costs."""
    new_of = np.full(G, -1, dtype=np.int64)
    new_of[kept] = np.arange(kept.size)
    ksizes = sizes[kept]
    kgs = np.concatenate([[0], np.cumsum(ksizes)])
    s_cost = np.concatenate([unary[g] for g in kept]) if kept.size else np.zeros(0)
    upper = np.asarray(problem.col_upper)
    s_upper = np.concatenate([upper[gs[g] + alive[g]] for g in kept]) if kept.size else np.zeros(0)
    cols: list[list] = [[(r, 1.0)] for r, g in enumerate(kept) for _ in range(sizes[g])]
    row_lo, row_up = [1.0] * kept.size, [1.0] * kept.size
    # the full problem's rows past the one-hot and marginal rows (ties, memory) that substitution
    # left, over kept groups (which such rows pin: all their strategies remain)
    rl, ru = np.asarray(problem.row_lower), np.asarray(problem.row_upper)
    for r, entries in sorted(rows_left.items()):
        row = len(row_lo)
        row_lo.append(float(rl[r]))
        row_up.append(float(ru[r]))
        for g, k, val in entries:
            cols[kgs[new_of[g]] + k].append((row, val))
    e_cost, e_cols = [], []
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
            ra, rb = len(row_lo), len(row_lo) + na
            row_lo += [0.0] * (na + nb)
            row_up += [0.0] * (na + nb)
            for x in range(sizes[a]):
                cols[ka + x].append((ra + int(cls_a.ravel()[x]), -1.0))
            for y in range(sizes[b]):
                cols[kb + y].append((rb + int(cls_b.ravel()[y]), -1.0))
            for x in range(na):
                for y in range(nb):
                    e_cost.append(float(cols_b[x, y]))
                    e_cols.append([(ra + x, 1.0), (rb + y, 1.0)])
    all_cols = cols + e_cols
    nnz = np.array([len(c) for c in all_cols], dtype=np.int64)
    index = np.array([r for c in all_cols for r, _ in c], dtype=np.int32)
    value = np.array([val for c in all_cols for _, val in c], dtype=np.float64)
    n_s, n_e = len(cols), len(e_cols)
    return SimpleNamespace(
        num_cols=n_s + n_e, num_rows=len(row_lo), offset=offset,
        col_cost=np.concatenate([s_cost, np.asarray(e_cost, dtype=np.float64)]),
        col_lower=np.zeros(n_s + n_e), col_upper=np.concatenate([s_upper, np.ones(n_e)]),
        row_lower=np.asarray(row_lo), row_upper=np.asarray(row_up),
        a_start=np.concatenate([[0], np.cumsum(nnz)]).astype(np.int32), a_index=index, a_value=value,
        integrality=np.concatenate([np.ones(n_s, dtype=np.int32), np.zeros(n_e, dtype=np.int32)]),
        group_var_start=kgs)
