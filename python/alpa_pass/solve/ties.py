"""Exact substitution of ties (equalities) for ``solve.eliminate``.

An equality ``(u, v, match)`` is one row per strategy ``j`` of ``v``:
``sum_{i: match[i] = j} s[u][i] - s[v][j] = 0``. When every strategy of ``u`` is matched, ``v`` is
a function of ``u`` (``v = match[u]``; the strategies of ``v`` no ``i`` matches are then 0 by its
one-hot row): its costs and edges are moved onto ``u`` (rows indexed through ``match``), it is
recovered as ``match[u's strategy]``, and its rows are dropped, so ``u`` may become free for
elimination and dominance pruning. Other rows naming ``v`` are rewritten over ``u``'s columns
(``s[v][j] = sum_{i: match[i] = j} s[u][i]``). One-to-one matches between groups (a parameter and
its updated value, repeated layer copies) are merged first, in chains (union-find), then each
remaining group that exactly one equality makes a function of a group that is not itself
substituted. On the 2-layer test GPT's 2x2x2 ILP, 113 of the 148 groups left by the degree <= 2
reduction were kept only by such rows.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse


def substitutions(rows, row_lower, row_upper, group_of_col, gs, forbidden):
    """(subs, rows left, column map): ``rows``: {row: [(group, strategy, coeff)]}, the non-marginal
    rows past the one-hot rows that may be ties (the others, e.g. memory rows, are rewritten with
    the column map). ``subs``: (group, parent, table) with the group's full strategy for each of the
    parent's; parents are never substituted. ``rows left``: the rows still needed, rewritten over
    the remaining groups (consumed rows are gone). ``column map``: the sparse 0/1 matrix P (s
    columns x s columns) that rewrites any row the same way (``row @ P``)."""
    links = {r: _link(e, row_lower[r], row_upper[r], forbidden) for r, e in rows.items()}
    expr, subs, consumed = {}, [], set()
    _merge_bijections(links, gs, expr, subs, consumed)
    first = dict(expr)
    rows = {r: _rewrite(e, expr) for r, e in rows.items() if r not in consumed}
    links = {r: _link(e, row_lower[r], row_upper[r], forbidden) for r, e in rows.items()}
    _substitute_functions(links, rows, row_lower, row_upper, gs, expr, subs, consumed)
    left = {r: _rewrite(e, expr) for r, e in rows.items() if r not in consumed}
    second = {g: f for g, f in expr.items() if g not in first}
    return subs, left, _column_map(first, gs) @ _column_map(second, gs)


def _column_map(expr, gs) -> scipy.sparse.csr_matrix:
    """P with P[(g, k), (g', k')] = 1 for each (g', k') in expr[g](k), identity elsewhere."""
    n = int(gs[-1])
    src, dst = [], []
    for g, f in sorted(expr.items()):
        for k in range(int(gs[g + 1] - gs[g])):
            for g2, k2 in f(k):
                src.append(int(gs[g]) + k)
                dst.append(int(gs[g2]) + k2)
    mapped = np.zeros(n, dtype=bool)
    mapped[src] = True
    same = np.flatnonzero(~mapped)
    src = np.concatenate([np.asarray(src, dtype=np.int64), same])
    dst = np.concatenate([np.asarray(dst, dtype=np.int64), same])
    return scipy.sparse.csr_matrix((np.ones(src.size), (src, dst)), shape=(n, n))


def apply(adj, unary, subs, add_edge) -> None:
    """Move each substituted group's costs and edges onto its parent (in place)."""
    for g, p, table in subs:
        unary[p] = unary[p] + unary[g][table]
        for n, m in sorted(adj[g].items()):
            moved = m[table]  # |S_p| x |S_n|
            del adj[n][g]
            if n == p:
                unary[p] = unary[p] + np.diagonal(moved)
            else:
                add_edge(adj, p, n, moved)
        adj[g] = {}


def _link(entries, lower, upper, forbidden):
    """(v, j, u, [i]) if the row is sum_i s[u][i] - s[v][j] = 0 (u != v, neither with forbidden
    strategies), else None."""
    if lower != 0.0 or upper != 0.0 or len(entries) < 2:
        return None
    minus = [(g, k) for g, k, c in entries if c == -1.0]
    plus = [(g, k) for g, k, c in entries if c == 1.0]
    if len(minus) != 1 or len(plus) != len(entries) - 1 or len({g for g, _ in plus}) != 1:
        return None
    (v, j), u = minus[0], plus[0][0]
    if u == v or forbidden[u] or forbidden[v]:
        return None
    return v, j, u, sorted(k for _, k in plus)


def _pairs(links, gs) -> dict:
    """{(u, v): f} for the pairs whose link rows match every strategy of u once (f[i] = j)."""
    by_pair: dict = {}
    for r, link in sorted(links.items()):
        if link is not None:
            v, j, u, ks = link
            by_pair.setdefault((u, v), []).append((r, j, ks))
    out = {}
    for (u, v), items in sorted(by_pair.items()):
        f = np.full(int(gs[u + 1] - gs[u]), -1, dtype=np.int64)
        ok = len({j for _, j, _ in items}) == len(items)
        for _, j, ks in items:
            ok = ok and (f[ks] < 0).all()
            f[ks] = j
        if ok and (f >= 0).all():
            out[(u, v)] = (f, [r for r, _, _ in items])
    return out


def _merge_bijections(links, gs, expr, subs, consumed) -> None:
    """Union-find over the one-to-one pairs; each merged group becomes its root renamed."""
    root, to_root = {}, {}  # to_root[g][k]: g's strategy when its root picks k
    for (a, b), (f, rows) in _pairs(links, gs).items():
        if int(gs[b + 1] - gs[b]) != f.size or np.unique(f).size != f.size:
            continue
        for g in (a, b):
            if g not in root:
                root[g], to_root[g] = g, np.arange(int(gs[g + 1] - gs[g]))
        ra, rb = root[a], root[b]
        via_a = f[to_root[a]]  # b's strategy as a function of a's root's strategy
        if ra == rb:
            if not np.array_equal(to_root[b], via_a):
                continue  # a tie that contradicts the others: its rows stay
        else:
            keep, drop = min(ra, rb), max(ra, rb)
            rb_of_ra = np.argsort(to_root[b])[via_a]
            step = rb_of_ra if drop == rb else np.argsort(rb_of_ra)  # drop's strategy per keep's
            for g in [g for g in root if root[g] == drop]:
                root[g], to_root[g] = keep, to_root[g][step]
        consumed.update(rows)
    for g in sorted(root):
        if root[g] != g:
            subs.append((g, root[g], to_root[g]))
            inverse = np.argsort(to_root[g])
            expr[g] = lambda k, r=root[g], inv=inverse: [(r, int(inv[k]))]


def _substitute_functions(links, rows, row_lower, row_upper, gs, expr, subs, consumed) -> None:
    """Each group that exactly one pair makes a function of an unsubstituted group."""
    pairs = _pairs(links, gs)
    targets: dict = {}
    for (u, v) in pairs:
        targets.setdefault(v, []).append(u)
    chosen = {v: us[0] for v, us in sorted(targets.items()) if len(us) == 1}
    chosen = {v: u for v, u in chosen.items() if u not in chosen}
    zero_rows: dict = {}  # group -> [(row, strategy)]: the rows s[g][k] = 0
    for r, e in rows.items():
        if len(e) == 1 and e[0][2] != 0.0 and row_lower[r] == 0.0 and row_upper[r] == 0.0:
            zero_rows.setdefault(e[0][0], []).append((r, e[0][1]))
    for v, u in sorted(chosen.items()):
        f, pair_rows = pairs[(u, v)]
        subs.append((v, u, f))
        consumed.update(pair_rows)
        # s_v[j] = 0 for a j that no strategy of u matches: implied by v's one-hot row
        consumed.update(r for r, k in zero_rows.get(v, ()) if k not in f)
        expr[v] = lambda k, p=u, fv=f: [(p, int(i)) for i in np.flatnonzero(fv == k)]


def _rewrite(entries, expr) -> list:
    """A row's entries over the groups that stay (coefficients of equal columns summed)."""
    acc: dict = {}
    for g, k, c in entries:
        for key in (expr[g](k) if g in expr else [(g, k)]):
            acc[key] = acc.get(key, 0.0) + c
    return [(g, k, c) for (g, k), c in sorted(acc.items()) if c != 0.0]
