"""``solve.eliminate``: the degree <= 2 reduction keeps the optimum (HiGHS on the full ILP, solved
exactly, is the oracle) and every expanded plan is feasible in the full ILP with the objective
HiGHS reports for the reduced one."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_pass import _core
from alpa_pass.errors import InfeasibleError
from alpa_pass.solve import eliminate
from alpa_pass.solve.highs import SolveOptions, solve_ilp

EXACT = SolveOptions(rel_gap=0.0)
TOL = dict(rel=1e-9, abs=1e-9)


def _keep(*groups):
    """A two-sided linear row naming strategy 0 of ``groups`` that every plan meets: they are kept
    whole (not eliminated, no strategy pruned: only one-sided rows allow pruning)."""
    return [(np.array(groups, dtype=np.int64), np.zeros(len(groups), dtype=np.int64), np.ones(len(groups)),
             -1.0, float(len(groups)))]


def _random_ilp(seed: int):
    """Random groups (1-3 strategies) on a path with chords, leaves and isolated groups, and some
    ties (equalities) and a linear row: the kinds of groups that are and are not eliminated."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 12))
    sizes = rng.integers(1, 4, n)
    groups = [rng.integers(0, 5, s).astype(np.float64) for s in sizes]
    pairs = {(a, a + 1) for a in range(n - 1) if rng.random() < 0.8}
    pairs |= {tuple(sorted(rng.choice(n, 2, replace=False))) for _ in range(int(rng.integers(0, 4)))}
    edges = [(int(u), int(v), rng.integers(0, 6, (sizes[u], sizes[v])).astype(np.float64)) for u, v in sorted(pairs)]
    equalities, rows = [], []
    if rng.random() < 0.5:
        same = [g for g in range(n) if sizes[g] == sizes[0] and g != 0]
        if same:
            equalities.append((0, int(same[0]), rng.permutation(sizes[0]).astype(np.int64)))
    if rng.random() < 0.5:  # a many-to-one tie (v a function of u), some strategies of u forbidden (-1)
        a, b = (int(x) for x in rng.choice(n, 2, replace=False))
        match = rng.integers(-1 if rng.random() < 0.3 else 0, sizes[b], sizes[a])
        match[0] = max(match[0], 0)
        equalities.append((a, b, match.astype(np.int64)))
    if rng.random() < 0.5 and (sizes > 1).any():
        g = int(rng.choice(np.flatnonzero(sizes > 1)))
        rows.append((np.array([g], dtype=np.int64), np.array([sizes[g] - 1], dtype=np.int64),
                     np.array([1.0]), -np.inf, 0.0))  # forbid g's last strategy by a row
    for _ in range(int(rng.integers(0, 4)) if rng.random() < 0.5 else 0):
        rows.append(_memory_row(rng, sizes))
    return _core.build_ilp(groups, edges, equalities, rows)


def _memory_row(rng, sizes):
    """A budget row like the planner's memory rows: bytes per strategy of some groups <= a budget
    between the least and the largest sum (tight, so it decides plans)."""
    named = np.flatnonzero(rng.random(sizes.size) < 0.6)
    g = np.repeat(named, sizes[named])
    k = np.concatenate([np.arange(sizes[x]) for x in named]) if named.size else np.zeros(0, dtype=np.int64)
    coeff = rng.integers(0, 8, g.size).astype(np.float64)
    least = sum(coeff[g == x].min() for x in named)
    most = sum(coeff[g == x].max() for x in named)
    budget = float(least + rng.random() * (most - least))
    return (g.astype(np.int64), k.astype(np.int64), coeff, -np.inf, budget)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_reduced_optimum_equals_full_optimum(seed):
    ilp = _random_ilp(seed)
    try:
        full = solve_ilp(ilp, EXACT)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
        return
    reduced = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
    if int(ilp.num_rows) > int(ilp.linear_row_start):  # the least-peak problem (an extra column M)
        mm = _core.min_max_row_problem(ilp)
        least = solve_ilp(mm, SolveOptions(rel_gap=0.0, eliminate_chains=True))
        assert least.x[-1] == pytest.approx(solve_ilp(mm, EXACT).x[-1], **TOL)
        assert not _core.evaluate_columns(mm, least.x).violations
    assert reduced.optimal
    assert reduced.objective == pytest.approx(full.objective, **TOL)
    check = _core.evaluate(ilp, reduced.assignment)
    assert not check.violations
    assert check.objective == pytest.approx(reduced.objective, **TOL)
    assert not _core.evaluate_columns(ilp, reduced.x).violations  # the expanded columns too


def test_chain_is_eliminated_to_its_ends():
    """a - b - c - d with b, c free: b and c are folded into one a-d edge (min over the middle)."""
    r = np.random.default_rng(1)
    groups = [r.integers(0, 9, 3).astype(np.float64) for _ in range(4)]
    edges = [(k, k + 1, r.integers(0, 9, (3, 3)).astype(np.float64)) for k in range(3)]
    ilp = _core.build_ilp(groups, edges, [], _keep(0, 3))  # pins a and d
    red = eliminate.reduce(ilp)
    assert list(red.kept) == [0, 3] and [g for g, _, _ in red.eliminated] == [1, 2]
    assert red.model.num_cols == 3 + 3 + 9  # two groups and one 3x3 edge
    got = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
    assert got.objective == pytest.approx(solve_ilp(ilp, EXACT).objective, **TOL)


def test_one_to_one_tie_is_substituted():
    """A tie whose match is a permutation makes its second group a renamed first one: its costs and
    edges move onto the first, the tie's rows go, and the plan keeps the tie."""
    r = np.random.default_rng(3)
    groups = [r.integers(0, 9, 3).astype(np.float64) for _ in range(4)]
    edges = [(0, 1, r.integers(0, 9, (3, 3)).astype(np.float64)), (1, 2, r.integers(0, 9, (3, 3)).astype(np.float64)),
             (2, 3, r.integers(0, 9, (3, 3)).astype(np.float64)), (3, 0, r.integers(0, 9, (3, 3)).astype(np.float64))]
    match = np.array([2, 0, 1], dtype=np.int64)
    ilp = _core.build_ilp(groups, edges, [(0, 2, match)], _keep(1, 3))
    red = eliminate.reduce(ilp)
    assert red.eliminated[0][:2] == (2, (0,)) and 2 not in red.kept
    got = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
    assert got.assignment[2] == match[got.assignment[0]]
    assert got.objective == pytest.approx(solve_ilp(ilp, EXACT).objective, **TOL)
    assert not _core.evaluate_columns(ilp, got.x).violations


def test_nothing_to_eliminate_is_none():
    """Groups named by a linear row are kept: with every group named and an edge that is not
    additive and has no equal rows or columns, nothing is reduced."""
    two, swap = np.array([1.0, 2.0]), np.array([[0.0, 1.0], [1.0, 0.0]])
    ilp = _core.build_ilp([two, two], [(0, 1, swap)], [], _keep(0, 1))
    assert eliminate.reduce(ilp) is None


def test_min_max_memory_problem_is_reduced():
    """``_core.min_max_row_problem`` (no costs; minimise M with every memory row <= M): its M column
    is kept, the zero edges fold away and each group keeps only strategies no larger than another
    in every row, with the same least peak as the unreduced problem."""
    two, swap = np.array([1.0, 2.0]), np.array([[0.0, 1.0], [1.0, 0.0]])
    rows = [(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), np.array([3.0, 1.0, 2.0, 5.0]), -np.inf, 9.0),
            (np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), np.array([3.0, 2.0, 1.0, 4.0]), -np.inf, 9.0)]
    mm = _core.min_max_row_problem(_core.build_ilp([two, two], [(0, 1, swap)], [], rows))
    red = eliminate.reduce(mm)
    assert sorted(red.pruned) == [(0, 0, 1), (1, 1, 0)]  # 1 <= 3 and 2 <= 3; 2 <= 5 and 1 <= 4
    assert red.model.num_cols == 2 + 1  # one strategy per group, and M
    got = solve_ilp(mm, SolveOptions(rel_gap=0.0, eliminate_chains=True))
    want = solve_ilp(mm, EXACT)
    assert list(got.assignment) == [1, 0] and got.x[-1] == pytest.approx(want.x[-1]) == pytest.approx(3.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_start_maps_to_a_no_costlier_reduced_start(seed):
    """A full start whose strategies are pruned (dominated) becomes a reduced start that is never
    costlier: the warm-started reduced solve still reaches the full optimum."""
    ilp = _random_ilp(seed)
    try:
        full = solve_ilp(ilp, EXACT)
    except InfeasibleError:
        return
    start = np.random.default_rng(seed).integers(0, np.diff(np.asarray(ilp.group_var_start)))
    red = eliminate.reduce(ilp)
    if red is not None:
        mapped = red.start(start)
        assert mapped.shape == red.kept.shape
        assert ((mapped >= 0) & (mapped < np.diff(red.model.group_var_start))).all()
    if _core.evaluate(ilp, start).violations:
        return  # HiGHS would reject an infeasible start
    warm = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True), start=start)
    assert warm.objective == pytest.approx(full.objective, **TOL)


def test_dominated_and_duplicate_strategies_are_pruned():
    """Group 1's strategy 2 costs more than strategy 0 everywhere (dominated) and strategy 1 equals
    strategy 0 (a duplicate): only strategy 0 remains, and the plan picks it."""
    groups = [np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 3.0]), np.array([0.0, 0.0, 5.0])]
    r01 = np.array([[0.0, 0.0, 1.0], [2.0, 2.0, 3.0], [1.0, 1.0, 2.0]])  # rows: group 0
    r12 = np.array([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0], [4.0, 3.0, 9.0]])  # rows: group 1
    ilp = _core.build_ilp(groups, [(0, 1, r01), (1, 2, r12)], [], _keep(0, 2))
    red = eliminate.reduce(ilp)
    assert sorted(red.pruned) == [(1, 1, 0), (1, 2, 0)]
    got = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
    assert got.assignment[1] == 0
    assert got.objective == pytest.approx(solve_ilp(ilp, EXACT).objective, **TOL)


def test_equal_rows_share_edge_columns():
    """An edge whose 4 x 3 matrix has 2 distinct rows and 2 distinct columns gets 2 x 2 product
    columns (strategies with equal costs on the edge are one class), with the same optimum."""
    m = np.array([[0.0, 5.0, 5.0], [3.0, 1.0, 1.0], [0.0, 5.0, 5.0], [3.0, 1.0, 1.0]])
    groups = [np.array([0.0, 1.0, 0.5, 2.0]), np.array([2.0, 0.0, 0.5])]
    ilp = _core.build_ilp(groups, [(0, 1, m)], [], _keep(0, 1))
    red = eliminate.reduce(ilp)
    assert red.model.num_cols == 4 + 3 + 2 * 2
    got = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
    assert got.objective == pytest.approx(solve_ilp(ilp, EXACT).objective, **TOL)
    assert not _core.evaluate_columns(ilp, got.x).violations


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_dropped_rows_reduced_equal_full(seed):
    """``drop_rows`` (the memory rows a row-generation round leaves out) with the exact reduction:
    the optimum of the full ILP without those rows, and a plan feasible in it."""
    ilp = _random_ilp(seed)
    start, n = int(ilp.linear_row_start), int(ilp.num_rows)
    if n == start:
        return
    drop = np.arange(start, n)[np.random.default_rng(seed).random(n - start) < 0.5]
    try:
        full = solve_ilp(ilp, EXACT, drop_rows=drop)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True), drop_rows=drop)
        return
    reduced = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True), drop_rows=drop)
    assert reduced.objective == pytest.approx(full.objective, **TOL)
    a = scipy.sparse.csc_matrix((np.asarray(ilp.a_value), np.asarray(ilp.a_index), np.asarray(ilp.a_start)),
                                shape=(n, int(ilp.num_cols)))
    activity = a @ reduced.x
    kept = np.setdiff1d(np.arange(n), drop)
    assert (activity[kept] <= np.asarray(ilp.row_upper)[kept] + 1e-9).all()
    assert (activity[kept] >= np.asarray(ilp.row_lower)[kept] - 1e-9).all()


def test_memory_row_prunes_only_no_larger_strategies():
    """A group named by a budget row loses a strategy only to one that is no costlier AND no larger
    in the row: strategy 1 (cost 1, 5 bytes) is dominated by strategy 0 (cost 0, 4 bytes); strategy
    2 (cost 0, 9 bytes) is as cheap as 0 but larger (and not its edge costs); strategy 3 (cost 2,
    1 byte) is costlier but smaller: both stay, and under a 3-byte budget the plan is strategy 3.
    (Group 1 is kept whole, so the edge is not folded into group 0's costs.)"""
    groups = [np.array([0.0, 1.0, 0.0, 2.0]), np.array([0.0, 1.0])]
    edge = np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [2.0, 0.0]])
    row = (np.array([0, 0, 0, 0]), np.arange(4), np.array([4.0, 5.0, 9.0, 1.0]), -np.inf, 3.0)
    ilp = _core.build_ilp(groups, [(0, 1, edge)], [], [row] + _keep(1))
    red = eliminate.reduce(ilp)
    assert [e for e in red.pruned if e[0] == 0] == [(0, 1, 0)]
    got = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
    assert got.assignment[0] == 3
    assert got.objective == pytest.approx(solve_ilp(ilp, EXACT).objective, **TOL)
