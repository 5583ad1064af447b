"""alpa_pass._core.build_ilp / evaluate / evaluate_columns / decode_assignment, and a HiGHS solve
of the built arrays checked against brute force."""
import itertools
import math

import highspy
import numpy as np
import pytest

from alpa_pass import _core

F = np.float64


def chain():
    """3 groups (2, 3, 2 strategies), edges 0-1 and 1-2."""
    groups = [np.array([1.0, 2.0]), np.array([0.0, 1.0, 3.0]), np.array([4.0, 0.5])]
    edges = [(0, 1, np.arange(6, dtype=F).reshape(2, 3)),
             (1, 2, np.array([[0.0, 7.0], [2.0, 0.0], [1.0, 1.0]]))]
    return groups, edges


def columns_of(ilp, assignment):
    """The column vector of an assignment: one-hot s, e[i][j] = s_u[i] * s_v[j] (from the rows)."""
    x = np.zeros(ilp.num_cols)
    x[ilp.group_var_start[:-1] + assignment] = 1.0
    # Each e-column has two rows; it is 1 iff both marginal rows contain a chosen s-column.
    chosen_rows = set()
    for c in np.flatnonzero(x):
        rows = ilp.a_index[ilp.a_start[c]:ilp.a_start[c + 1]]
        chosen_rows.update(int(r) for r in rows[ilp.a_value[ilp.a_start[c]:ilp.a_start[c + 1]] < 0])
    for c in range(ilp.group_var_start[-1], ilp.num_cols):
        rows = ilp.a_index[ilp.a_start[c]:ilp.a_start[c + 1]]
        x[c] = float(all(int(r) in chosen_rows for r in rows))
    return x


def test_chain_sizes():
    ilp = _core.build_ilp(*chain())
    assert ilp.num_groups == 3
    assert ilp.num_edge_vars == 2 * 3 + 3 * 2
    assert ilp.num_cols == 7 + 12
    assert ilp.num_rows == 3 + (2 + 3) + (3 + 2)
    assert list(ilp.group_var_start) == [0, 2, 5, 7]
    assert list(ilp.integrality) == [1] * 7 + [0] * 12
    assert np.all(ilp.col_lower == 0) and np.all(ilp.col_upper == 1)
    # s-columns: one-hot + one marginal row per incident edge; e-columns: two marginal rows.
    assert list(np.diff(ilp.a_start)) == [2, 2, 3, 3, 3, 2, 2] + [2] * 12
    assert list(ilp.row_lower[:3]) == [1, 1, 1] and list(ilp.row_upper[:3]) == [1, 1, 1]
    assert np.all(ilp.row_lower[3:] == 0) and np.all(ilp.row_upper[3:] == 0)
    assert list(ilp.col_cost) == [1, 2, 0, 1, 3, 4, 0.5] + list(range(6)) + [0, 7, 2, 0, 1, 1]
    assert ilp.offset == 0.0
    with pytest.raises(ValueError):  # read-only views
        ilp.col_cost[0] = 5.0


def test_columns_sorted_by_row_and_marginals_consistent():
    ilp = _core.build_ilp(*chain())
    for c in range(ilp.num_cols):
        rows = ilp.a_index[ilp.a_start[c]:ilp.a_start[c + 1]]
        assert list(rows) == sorted(set(rows))
    for a in itertools.product(range(2), range(3), range(2)):
        res = _core.evaluate_columns(ilp, columns_of(ilp, np.array(a)))
        assert res.violations == []


def test_evaluate_by_hand():
    groups, edges = chain()
    ilp = _core.build_ilp(groups, edges)
    res = _core.evaluate(ilp, np.array([1, 2, 0]))
    # linear 2 + 3 + 4; edges R01[1][2] = 5, R12[2][0] = 1
    assert res.linear_cost == 9.0 and res.edge_cost == 6.0 and res.objective == 15.0
    assert res.violations == []


def test_evaluate_matches_columns_for_every_assignment():
    ilp = _core.build_ilp(*chain())
    for a in itertools.product(range(2), range(3), range(2)):
        a = np.array(a)
        by_groups = _core.evaluate(ilp, a)
        by_cols = _core.evaluate_columns(ilp, columns_of(ilp, a))
        assert by_cols.objective == pytest.approx(by_groups.objective)
        assert list(_core.decode_assignment(ilp, columns_of(ilp, a))) == list(a)


def test_folding_self_single_and_parallel_edges():
    groups = [np.array([1.0, 2.0]), np.array([3.0]), np.array([0.0, 0.0, 0.0]), np.array([5.0])]
    edges = [
        (0, 0, np.array([[10.0, 99.0], [99.0, 20.0]])),  # u == v: diagonal folds into s[0]
        (0, 1, np.array([[1.0], [2.0]])),                 # v has one strategy: folds into s[0]
        (1, 2, np.array([[4.0, 5.0, 6.0]])),              # u has one strategy: folds into s[2]
        (1, 3, np.array([[7.0]])),                        # both one strategy: offset
        (0, 2, np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])),
        (2, 0, np.array([[10.0, 40.0], [20.0, 50.0], [30.0, 60.0]])),  # parallel, reversed
    ]
    ilp = _core.build_ilp(groups, edges)
    assert ilp.num_edge_vars == 6                      # one merged 2x3 block
    assert ilp.num_rows == 4 + 2 + 3
    assert list(ilp.col_cost[:7]) == [1 + 10 + 1, 2 + 20 + 2, 0, 4, 5, 6, 0]
    assert list(ilp.col_cost[7:]) == [11, 22, 33, 44, 55, 66]
    assert ilp.offset == 3.0 + 5.0 + 7.0
    for a in itertools.product(range(2), [0], range(3), [0]):
        a = np.array(a)
        assert _core.evaluate_columns(ilp, columns_of(ilp, a)).objective == pytest.approx(
            _core.evaluate(ilp, a).objective)


def test_one_group_changed_is_evaluate_with_that_group_changed():
    # self, single-strategy, parallel and reversed edges (the folding case) and the chain
    folding = ([np.array([1.0, 2.0]), np.array([3.0]), np.array([0.0, 0.5, 0.0]), np.array([5.0])],
               [(0, 0, np.array([[10.0, 99.0], [99.0, 20.0]])), (0, 1, np.array([[1.0], [2.0]])),
                (1, 2, np.array([[4.0, 5.0, 6.0]])), (1, 3, np.array([[7.0]])),
                (0, 2, np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])),
                (2, 0, np.array([[10.0, 40.0], [20.0, 50.0], [30.0, 60.0]]))])
    for groups, edges in (chain(), folding):
        ilp = _core.build_ilp(groups, edges)
        gs = np.asarray(ilp.group_var_start)
        for a in itertools.product(*(range(len(c)) for c in groups)):
            a = np.array(a, dtype=np.int64)
            got = _core.one_group_changed(ilp, a)
            assert got.shape == (gs[-1] - gs[0],)
            want = []
            for g, costs in enumerate(groups):
                for k in range(len(costs)):
                    b = a.copy()
                    b[g] = k
                    want.append(_core.evaluate(ilp, b).objective)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError):
        _core.one_group_changed(ilp, np.array([0, 0, 5, 0], dtype=np.int64))


def test_equalities_rows_and_bounds():
    groups = [np.zeros(3), np.zeros(2)]
    ilp = _core.build_ilp(groups, [], [(0, 1, np.array([1, 0, -1]))])
    assert ilp.num_rows == 2 + 2 and ilp.num_edge_vars == 0
    assert list(ilp.col_upper) == [1, 1, 0, 1, 1]     # match -1 becomes a bound
    assert _core.evaluate(ilp, np.array([0, 1])).violations == []
    bad = _core.evaluate(ilp, np.array([0, 0])).violations
    assert len(bad) == 1 and "needs group 1 strategy 1, got 0" in bad[0]
    assert "is not allowed" in _core.evaluate(ilp, np.array([2, 0])).violations[0]
    trivial = _core.build_ilp([np.zeros(2)], [], [(0, 0, np.array([0, 1]))])
    assert trivial.num_rows == 1


def test_evaluate_columns_flags_violations():
    ilp = _core.build_ilp(*chain())
    x = columns_of(ilp, np.array([0, 0, 0]))
    assert _core.evaluate_columns(ilp, x).violations == []
    x[1] = 1.0                                          # group 0 now has two strategies on
    msgs = _core.evaluate_columns(ilp, x).violations
    assert any("one-hot of group 0" in m and "= 2" in m for m in msgs)
    assert any(m.startswith("row 4 = -1") for m in msgs)  # edge 0-1: sum_j e[1][j] - s[0][1]
    y = columns_of(ilp, np.array([0, 0, 0]))
    y[0], y[1] = 0.5, 0.5
    assert any("not integral" in m for m in _core.evaluate_columns(ilp, y).violations)
    z = columns_of(ilp, np.array([0, 0, 0]))
    z[8] = -0.5
    assert any("column 8" in m and "outside" in m for m in _core.evaluate_columns(ilp, z).violations)
    assert _core.evaluate_columns(ilp, z, tol=1.0).violations == []


@pytest.mark.parametrize("groups,edges,equalities,match", [
    ([np.array([1.0, -1.0])], [], [], "group 0 strategy 1 = -1"),
    ([np.array([math.nan])], [], [], "finite"),
    ([np.array([])], [], [], "group 0 has no strategies"),
    ([np.zeros(2)], [(0, 3, np.zeros((2, 2)))], [], "edge 0 names group 3"),
    ([np.zeros(2), np.zeros(3)], [(0, 1, np.zeros(5))], [], "has 5 costs, expected 2 x 3"),
    ([np.zeros(2), np.zeros(3)], [(0, 1, np.zeros((3, 2)))], [], r"shape \(3, 2\), expected \(2, 3\)"),
    ([np.zeros(2), np.zeros(3)], [(0, 1, np.full((2, 3), math.inf))], [], "finite"),
    ([np.zeros(2), np.zeros(3)], [], [(0, 1, np.array([0]))], "1 match entries"),
    ([np.zeros(2), np.zeros(3)], [], [(0, 1, np.array([0, 3]))], "matches strategy 3 of group 1"),
    ([np.zeros(2)], [], [(0, -1, np.array([0, 0]))], "equality 0 names group -1"),
])
def test_build_ilp_rejects_bad_input(groups, edges, equalities, match):
    with pytest.raises(ValueError, match=match):
        _core.build_ilp(groups, edges, equalities)


def test_evaluate_rejects_bad_assignment_and_columns():
    ilp = _core.build_ilp(*chain())
    with pytest.raises(ValueError, match="one per group"):
        _core.evaluate(ilp, np.array([0, 0]))
    with pytest.raises(ValueError, match="strategy 3 of group 1"):
        _core.evaluate(ilp, np.array([0, 3, 0]))
    with pytest.raises(ValueError, match="18 entries but the ILP has 19"):
        _core.evaluate_columns(ilp, np.zeros(18))
    with pytest.raises(ValueError, match="18 entries"):
        _core.decode_assignment(ilp, np.zeros(18))


def solve_with_highs(ilp):
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ilp.num_cols, ilp.num_rows
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = ilp.col_cost, ilp.col_lower, ilp.col_upper
    lp.row_lower_, lp.row_upper_ = ilp.row_lower, ilp.row_upper
    lp.offset_ = ilp.offset
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = ilp.num_cols, ilp.num_rows
    lp.a_matrix_.start_ = ilp.a_start.astype(np.int32)
    lp.a_matrix_.index_ = ilp.a_index
    lp.a_matrix_.value_ = ilp.a_value
    lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                       for i in ilp.integrality]
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    assert h.passModel(lp) == highspy.HighsStatus.kOk
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return h.getInfo().objective_function_value, np.array(h.getSolution().col_value)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_highs_optimum_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    sizes = [3, 2, 3, 1, 2]
    groups = [rng.uniform(0, 10, n) for n in sizes]
    pairs = [(0, 1), (1, 2), (2, 0), (3, 4), (4, 2), (2, 1), (1, 1)]
    edges = [(u, v, rng.uniform(0, 10, (sizes[u], sizes[v]))) for u, v in pairs]
    equalities = [(4, 1, np.array([1, 0]))]
    ilp = _core.build_ilp(groups, edges, equalities)
    best = min(
        r.objective for r in (_core.evaluate(ilp, np.array(a))
                              for a in itertools.product(*(range(n) for n in sizes)))
        if not r.violations)
    objective, x = solve_with_highs(ilp)
    assert objective == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert _core.evaluate_columns(ilp, x).objective == pytest.approx(best)
    decoded = _core.evaluate(ilp, _core.decode_assignment(ilp, x))
    assert decoded.violations == [] and decoded.objective == pytest.approx(best)


def test_build_sizes_for_a_million_columns():
    rng = np.random.default_rng(0)
    n = 10_000
    groups = [rng.uniform(0, 1, 10) for _ in range(n)]
    edges = [(g, g + 1, rng.uniform(0, 1, (10, 10))) for g in range(n - 1)]
    ilp = _core.build_ilp(groups, edges)
    assert ilp.num_cols == 10 * n + 100 * (n - 1)
    assert len(ilp.a_index) == 10 * n + 2 * 10 * (n - 1) + 2 * 100 * (n - 1)
