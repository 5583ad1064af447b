"""``solve.eliminate``: the degree <= 2 reduction keeps the optimum (HiGHS on the full ILP, solved
exactly, is the oracle) and every expanded plan is feasible in the full ILP with the objective
HiGHS reports for the reduced one."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_pass import _core
from alpa_pass.solve import eliminate
from alpa_pass.solve.highs import SolveOptions, solve_ilp

EXACT = SolveOptions(rel_gap=0.0)
TOL = dict(rel=1e-9, abs=1e-9)


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
            equalities.append((0, int(same[0]), np.arange(sizes[0], dtype=np.int64)))
    if rng.random() < 0.5 and (sizes > 1).any():
        g = int(rng.choice(np.flatnonzero(sizes > 1)))
        rows.append((np.array([g], dtype=np.int64), np.array([sizes[g] - 1], dtype=np.int64),
                     np.array([1.0]), -np.inf, 0.0))  # forbid g's last strategy by a row
    return _core.build_ilp(groups, edges, equalities, rows)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_reduced_optimum_equals_full_optimum(seed):
    ilp = _random_ilp(seed)
    full = solve_ilp(ilp, EXACT)
    reduced = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
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
    ilp = _core.build_ilp(groups, edges, [(0, 3, np.arange(3, dtype=np.int64))])  # pins a and d
    red = eliminate.reduce(ilp)
    assert list(red.kept) == [0, 3] and [g for g, _, _ in red.eliminated] == [1, 2]
    assert red.model.num_cols == 3 + 3 + 9  # two groups and one 3x3 edge
    got = solve_ilp(ilp, SolveOptions(rel_gap=0.0, eliminate_chains=True))
    assert got.objective == pytest.approx(solve_ilp(ilp, EXACT).objective, **TOL)


def test_nothing_to_eliminate_is_none():
    """Groups named by an equality (a tie) are kept: with every group tied, nothing is reduced."""
    two = np.array([1.0, 2.0])
    ilp = _core.build_ilp([two, two], [(0, 1, np.ones((2, 2)))], [(0, 1, np.arange(2, dtype=np.int64))])
    assert eliminate.reduce(ilp) is None
    assert eliminate.reduce(_core.min_max_row_problem(_core.build_ilp(
        [two, two], [(0, 1, np.ones((2, 2)))], [], [(np.array([0]), np.array([1]), np.array([1.0]), -np.inf, 1.0)]))) is None
