"""HiGHS on the core's ILP equals brute force on small random instances; evaluate() agrees."""
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alpa_pass import _core
from alpa_pass.errors import InfeasibleError
from alpa_pass.solve.highs import SolveOptions, solve_ilp

EXACT = SolveOptions(rel_gap=0.0)  # no wall-clock limit: an exact, machine-independent answer
REDUCED = SolveOptions(rel_gap=0.0, eliminate_chains=True)  # what the planner solves: solve.eliminate


@st.composite
def instances(draw):
    n = draw(st.integers(1, 8))
    sizes = [draw(st.integers(2, 4)) for _ in range(n)]
    # keep brute force small: at most 4**6 assignments
    while np.prod(sizes) > 4096:
        sizes[int(np.argmax(sizes))] -= 1
    cost = st.floats(0, 100, allow_nan=False, allow_infinity=False)
    group_costs = [np.array(draw(st.lists(cost, min_size=s, max_size=s))) for s in sizes]
    pairs = [(u, v) for u in range(n) for v in range(n) if u <= v]
    chosen = draw(st.lists(st.sampled_from(pairs), max_size=min(10, len(pairs)))) if pairs else []
    edges = []
    for u, v in chosen:
        m = draw(st.lists(cost, min_size=sizes[u] * sizes[v], max_size=sizes[u] * sizes[v]))
        edges.append((u, v, np.array(m).reshape(sizes[u], sizes[v])))
    return sizes, group_costs, edges


def brute_force(sizes, group_costs, edges, equalities=()):
    best = None
    for a in itertools.product(*[range(s) for s in sizes]):
        if any(match[a[u]] != a[v] for u, v, match in equalities):
            continue
        val = sum(c[k] for c, k in zip(group_costs, a))
        val += sum(m[a[u], a[v]] for u, v, m in edges)
        best = val if best is None else min(best, val)
    return best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_highs_matches_brute_force(inst):
    sizes, group_costs, edges = inst
    ilp = _core.build_ilp(group_costs, edges, [])
    sol = solve_ilp(ilp, EXACT)
    expect = brute_force(sizes, group_costs, edges)
    assert sol.optimal
    assert sol.objective == pytest.approx(expect, rel=1e-6, abs=1e-6)
    ev = _core.evaluate(ilp, sol.assignment)
    assert ev.violations == []
    assert ev.objective == pytest.approx(sol.objective, rel=1e-9, abs=1e-9)
    cols = _core.evaluate_columns(ilp, sol.x, 1e-6)
    assert cols.violations == []
    assert cols.objective == pytest.approx(expect, rel=1e-6, abs=1e-6)
    assert solve_ilp(ilp, REDUCED).objective == pytest.approx(expect, rel=1e-6, abs=1e-6)


@settings(max_examples=30, deadline=None)
@given(instances(), st.data())
def test_equalities_match_brute_force(inst, data):
    sizes, group_costs, edges = inst
    if len(sizes) < 2:
        return
    u, v = data.draw(st.permutations(range(len(sizes))))[:2]
    match = np.array([data.draw(st.integers(-1, sizes[v] - 1)) for _ in range(sizes[u])], dtype=np.int64)
    if (match < 0).all():
        match[0] = 0
    eq = [(u, v, match)]
    ilp = _core.build_ilp(group_costs, edges, eq)
    expect = brute_force(sizes, group_costs, edges, eq)
    for options in (EXACT, REDUCED):
        sol = solve_ilp(ilp, options)
        assert sol.objective == pytest.approx(expect, rel=1e-6, abs=1e-6)
        assert match[sol.assignment[u]] == sol.assignment[v]


def test_infeasible_equalities_raise():
    costs = [np.array([1.0, 2.0]), np.array([1.0, 2.0])]
    eq = [(0, 1, np.array([-1, -1], dtype=np.int64))]
    with pytest.raises(InfeasibleError, match="infeasible"):
        solve_ilp(_core.build_ilp(costs, [], eq), EXACT)


def test_log_is_kept_on_request():
    ilp = _core.build_ilp([np.array([3.0, 1.0])], [], [])
    sol = solve_ilp(ilp, SolveOptions(keep_log=True))
    assert "HiGHS" in sol.log
    assert sol.assignment.tolist() == [1] and sol.objective == pytest.approx(1.0)


def test_objective_bound_cuts_off_solves_that_cannot_beat_it():
    from alpa_pass.errors import SolverError

    ilp = _core.build_ilp([np.array([5.0, 7.0]), np.array([1.0, 2.0, 3.0])],
                          [(0, 1, np.array([[1.0, 2, 3], [4, 5, 6]]))], [])
    assert solve_ilp(ilp, SolveOptions(objective_bound=100.0)).objective == pytest.approx(7.0)
    with pytest.raises(SolverError, match="cannot beat objective 3"):
        solve_ilp(ilp, SolveOptions(objective_bound=3.0))
