"""Exact strategy pruning for ``solve.eliminate``: dominated strategies and additive edges.

Both work on eliminate's pairwise model (per group a cost vector ``unary[g]``, per edge a cost
matrix ``adj[a][b]``) and keep its optimum:

- A strategy ``k`` of a free group (no equality or linear row names it) is *dominated* by ``k'``
  when its own cost and every cost it has on every incident edge is >= ``k'``'s (the row of ``k``
  is componentwise >= the row of ``k'``; equal rows: the higher index is the dominated one). In any
  plan, switching the group from ``k`` to ``k'`` costs nothing more, so ``k`` can be dropped. A
  group that one-sided linear rows name (memory rows: live bytes <= budget) is compared on its
  coefficients in them too: switching then also keeps every such row satisfied. The
  2x2x2 "two-block" specs make many such strategies (specs whose costs on every neighbour equal
  another spec's).
- An edge whose matrix is ``R[i, j] = x[i] + y[j]`` (e.g. all zero) is two per-group costs, not a
  block of product columns.

A start (strategy per group) is carried through by replaying the prunings in order: each replaces
the start's strategy by its dominator while every neighbour's start strategy is still allowed, so
the start's cost never rises.
"""
from __future__ import annotations

import numpy as np

_ADDITIVE_TOL = 1e-9  # relative to the matrix's largest cost: float sums of the same terms


def prune(adj, unary, sizes, pinned, alive, events, bounds=None) -> bool:
    """One pass: fold additive edges, then drop dominated strategies of free groups (in group
    order) and of the pinned groups in ``bounds`` ({group: matrix, a row per remaining strategy}:
    its coefficients in the one-sided rows that pin it, compared like costs). Mutates the model;
    ``alive[g]``: the full indices of group g's remaining strategies; ``events`` gains (group,
    pruned full index, dominator full index). True if anything changed."""
    bounds = {} if bounds is None else bounds
    changed = _fold_additive(adj, unary)
    for g in range(len(unary)):
        if (pinned[g] and g not in bounds) or sizes[g] <= 1:
            continue
        rows = _rows(adj, unary, g)
        keep, dominator = _undominated(rows if g not in bounds else np.concatenate([rows, bounds[g]], axis=1))
        if keep.all():
            continue
        for k in np.flatnonzero(~keep):
            events.append((g, int(alive[g][k]), int(alive[g][dominator[k]])))
        _restrict(adj, unary, g, keep)
        if g in bounds:
            bounds[g] = bounds[g][keep]
        alive[g] = alive[g][keep]
        sizes[g] = int(keep.sum())
        changed = True
    return changed


def replay(events, start) -> np.ndarray:
    """``start`` (full strategy per group) with each pruned strategy replaced by its dominator."""
    out = np.asarray(start, dtype=np.int64).copy()
    for g, k, d in events:
        if out[g] == k:
            out[g] = d
    return out


def _fold_additive(adj, unary) -> bool:
    changed = False
    for a in range(len(unary)):
        for b in sorted(adj[a]):
            if b < a:
                continue
            m = adj[a][b]
            x, y = m[:, 0], m[0, :] - m[0, 0]
            if np.abs(m - x[:, None] - y[None, :]).max(initial=0.0) <= _ADDITIVE_TOL * (1.0 + np.abs(m).max()):
                unary[a] = unary[a] + x
                unary[b] = unary[b] + y
                del adj[a][b], adj[b][a]
                changed = True
    return changed


def _rows(adj, unary, g) -> np.ndarray:
    """Group g's strategies as rows: own cost, then its costs on each edge (neighbours in order)."""
    return np.concatenate([unary[g][:, None]] + [adj[g][n] for n in sorted(adj[g])], axis=1)


def _undominated(rows: np.ndarray):
    """(keep mask, dominator index per row): a row is dropped when another row is <= it everywhere
    (and differs, or is equal with a lower index); its dominator is a kept row <= it."""
    n = rows.shape[0]
    le = (rows[:, None, :] <= rows[None, :, :]).all(axis=2)  # le[p, q]: row p <= row q everywhere
    eq = le & le.T
    lower = np.tri(n, k=-1, dtype=bool)  # lower[q, p]: p < q
    dominated_by = (le.T & ~eq) | (eq & lower)  # [q, p]: p dominates q
    keep = ~dominated_by.any(axis=1)
    kept = np.flatnonzero(keep)
    dominator = np.arange(n)
    for q in np.flatnonzero(~keep):
        dominator[q] = kept[np.argmax(le[kept, q])]  # transitivity: some kept row is <= row q
    return keep, dominator


def _restrict(adj, unary, g, keep) -> None:
    unary[g] = unary[g][keep]
    for n in adj[g]:
        adj[g][n] = adj[g][n][keep]
        adj[n][g] = adj[g][n].T
