"""Memory model of the C++ core (cpp/src/memory.cc): liveness of materialised values, maximal
live sets as ILP rows, the peak of an assignment, and budgeted ILPs against brute force."""
import itertools
import math

import numpy as np
import pytest

from alpa_pass import _core
from alpa_pass.errors import InfeasibleError
from alpa_pass.extract.graph import GraphBuilder, OpKind
from alpa_pass.driver.budget import solve_within_budget
from alpa_pass.driver.reshard_copies import ReshardCopies, layout_twins
from alpa_pass.driver.memory_rows import memory_row_matrix, redundant_memory_rows
from alpa_pass.solve.highs import SolveOptions, solve_ilp
from tests.helpers import F32, MESH14, built_graph


def options(budget=0.0):
    opts = _core.CoreOptions()
    opts.memory_cost_per_byte = 0.0
    opts.memory_budget_per_device = budget
    return opts


def mlp():
    """x, w1 -> d1 = dot -> relu (one consumer: fused) ; w2 -> d2 = dot -> output."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [32, 64], F32, attrs=[0])
    w1 = b.add(OpKind.PARAMETER, [64, 128], F32, attrs=[1])
    d1 = b.add(OpKind.DOT, [32, 128], F32, [x, w1], [0, 1, 1, 0])
    relu = b.add(OpKind.ELEMENTWISE, [32, 128], F32, [d1])
    w2 = b.add(OpKind.PARAMETER, [128, 64], F32, attrs=[2])
    d2 = b.add(OpKind.DOT, [32, 64], F32, [relu, w2], [0, 1, 1, 0])
    b.add(OpKind.OUTPUT, [32, 64], F32, [d2], [0])
    return b


def ranges(prob):
    return {int(v): (int(s), int(e)) for v, s, e in zip(prob.live_nodes, prob.live_start, prob.live_end)}


def test_liveness_counts_materialised_values_only():
    prob = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(), [])
    # relu (node 3) has one consumer and is fused into it: d2 reads d1 through relu, so d1 lives
    # until node 5. The output (6) aliases d2.
    assert ranges(prob) == {0: (0, 6), 1: (0, 6), 4: (0, 6), 2: (2, 5), 5: (5, 6)}
    assert list(prob.memory_points) == [5]  # every other live set is contained in the one at 5
    assert prob.num_memory_rows == 0 and prob.ilp.num_linear_rows == 0  # no budget, no rows


def test_donated_parameters_die_at_their_last_use():
    prob = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(), [], donated_args=[0, 2])
    r = ranges(prob)
    assert r[0] == (0, 2) and r[4] == (0, 5) and r[1] == (0, 6)
    with pytest.raises(ValueError, match="donated argument 7"):
        _core.build_sharding_problem(built_graph(mlp()), MESH14, options(), [], donated_args=[7])


def test_multi_consumer_and_output_values_count():
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [8, 8], F32, attrs=[0])
    e1 = b.add(OpKind.ELEMENTWISE, [8, 8], F32, [x])          # two consumers -> counted
    e2 = b.add(OpKind.ELEMENTWISE, [8, 8], F32, [e1, e1])     # one distinct consumer -> fused
    e3 = b.add(OpKind.ELEMENTWISE, [8, 8], F32, [e1, e2])     # read by an output -> counted
    b.add(OpKind.OUTPUT, [8, 8], F32, [e3], [0])
    prob = _core.build_sharding_problem(built_graph(b), MESH14, options(), [])
    assert ranges(prob) == {x: (0, 4), e1: (1, 3), e3: (3, 4)}


def test_constant_expressions_count_only_when_output():
    """A causal mask: iota -> compare -> broadcast to [batch, heads, seq, seq], read by a forward
    and a backward select. XLA recomputes it inside both selects, so it takes no buffer."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [4, 8, 16, 16], F32, attrs=[0])
    iota = b.add(OpKind.GENERATOR, [16, 16], 4)
    mask = b.add(OpKind.ELEMENTWISE, [16, 16], 1, [iota])
    wide = b.add(OpKind.BROADCAST, [4, 8, 16, 16], 1, [mask], [2, 3])  # two consumers, constant
    fwd = b.add(OpKind.ELEMENTWISE, [4, 8, 16, 16], F32, [wide, x])
    red = b.add(OpKind.REDUCE, [4, 8, 16], F32, [fwd], [3])
    bwd = b.add(OpKind.ELEMENTWISE, [4, 8, 16, 16], F32, [wide, x])
    b.add(OpKind.OUTPUT, [4, 8, 16], F32, [red], [0])
    b.add(OpKind.OUTPUT, [4, 8, 16, 16], F32, [bwd], [1])
    b.add(OpKind.OUTPUT, [16, 16], 1, [mask], [2])  # read by an OUTPUT: materialised after all
    prob = _core.build_sharding_problem(built_graph(b), MESH14, options(), [])
    assert ranges(prob) == {x: (0, 9), mask: (2, 9), red: (5, 9), bwd: (6, 9)}
    assert wide not in ranges(prob) and iota not in ranges(prob)


def test_fused_values_keep_their_operands_until_read():
    """A forward value fused into a backward consumer (jvp residuals): its operand, not it, stays."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [32, 64], F32, attrs=[0])
    w = b.add(OpKind.PARAMETER, [64, 64], F32, attrs=[1])
    h = b.add(OpKind.DOT, [32, 64], F32, [x, w], [0, 1, 1, 0])
    act = b.add(OpKind.ELEMENTWISE, [32, 64], F32, [h])                    # read by y only
    resid = b.add(OpKind.ELEMENTWISE, [32, 64], F32, [h])                  # fused into grad
    y = b.add(OpKind.DOT, [32, 64], F32, [act, w], [0, 1, 1, 0])
    scaled = b.add(OpKind.ELEMENTWISE, [32, 64], F32, [resid])             # fused into grad too
    grad = b.add(OpKind.DOT, [64, 64], F32, [x, scaled], [0, 1, 0, 0])
    b.add(OpKind.OUTPUT, [32, 64], F32, [y], [0])
    b.add(OpKind.OUTPUT, [64, 64], F32, [grad], [1])
    prob = _core.build_sharding_problem(built_graph(b), MESH14, options(), [], donated_args=[0])
    r = ranges(prob)
    assert r[h] == (h, grad), "h is read by grad through resid and scaled"
    assert act not in r and resid not in r and scaled not in r
    assert r[x] == (0, grad) and r[y] == (y, 9) and r[grad] == (grad, 9)


def row_activity(ilp, rows, x):
    """Activity of the given matrix rows at column vector x (from the CSC arrays)."""
    act = np.zeros(ilp.num_rows)
    for c in range(ilp.num_cols):
        for k in range(ilp.a_start[c], ilp.a_start[c + 1]):
            act[ilp.a_index[k]] += ilp.a_value[k] * x[c]
    return act[rows]


def s_columns(ilp, assignment):
    x = np.zeros(ilp.num_cols)
    x[ilp.group_var_start[:-1] + assignment] = 1.0
    return x


def rows_peak(prob, assignment):
    """The largest memory-row activity of an assignment of the mlp() problem: values only, the
    reshard copies left out (fit_reshard_copies adds those; these tests are about the rows)."""
    return reference_peak(prob, assignment, 7)


def reference_copies(prob, graph, assignment, mesh_shape):
    """Reshard copies by the definition (memory.h): per (value, layout other than its own) one
    copy from the first consumer reading it so to the last: {(value, layout): (first, last, bytes)}.
    Constant expressions (here: none) are not counted."""
    offsets, group = prob.strategy_offsets, prob.node_group
    row = {v: offsets[v] + assignment[group[v]] for v in range(graph.num_nodes)}
    copies = {}
    for v in range(graph.num_nodes):
        for t, u in enumerate(graph.operands(v)):
            want = tuple(prob.in_specs[prob.in_spec_offsets[row[v]] + t])
            own = tuple(prob.out_specs[row[u]])
            if all(a == b or n == 1 for a, b, n in zip(want, own, mesh_shape)):
                continue
            shards = int(np.prod([n for d, n in zip(want, mesh_shape) if d >= 0]))
            nbytes = int(np.prod(graph.shape(u))) * int(graph.dtype_bytes[u]) / shards
            first = copies.get((u, want), (v,))[0]
            copies[(u, want)] = (first, v, nbytes)
    return copies


def reference_peak(prob, assignment, num_nodes, graph=None, mesh_shape=(1, 4)):
    """Peak by the definition: sum of the chosen strategy's memory of every value live at t, plus
    the reshard copies live at t (``graph``: the OpGraph; None: no copies)."""
    offsets, group, memory = prob.strategy_offsets, prob.node_group, prob.memory
    live = np.zeros(num_nodes)
    for v, (s, e) in ranges(prob).items():
        live[s:e + 1] += memory[offsets[v] + assignment[group[v]]]
    if graph is not None:
        for first, last, nbytes in reference_copies(prob, graph, assignment, mesh_shape).values():
            live[first:last + 1] += nbytes
    return live.max()


def all_assignments(ilp):
    sizes = np.diff(ilp.group_var_start)
    return [np.array(a, dtype=np.int64) for a in itertools.product(*[range(n) for n in sizes])]


def test_memory_rows_bound_the_peak_of_every_assignment():
    prob = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(budget=1e9), [], [0])
    assert prob.ilp.num_linear_rows == 0, "memory rows stay out of the ILP until materialised"
    ilp = prob.ilp_with_memory_rows()
    assert prob.num_memory_rows == ilp.num_linear_rows == 2 and list(prob.memory_row_points) == [2, 5]
    rows = np.arange(ilp.linear_row_start, ilp.num_rows)
    assert np.all(np.isinf(ilp.row_lower[rows])) and np.all(ilp.row_upper[rows] == 1e9)
    graph = mlp().build()
    without_copies = 0
    for a in all_assignments(ilp):
        peak, at = prob.predicted_peak(a)
        assert peak == pytest.approx(reference_peak(prob, a, 7, graph))
        acts = row_activity(ilp, rows, s_columns(ilp, a))
        assert np.allclose(prob.memory_row_activity(a), acts, rtol=1e-12)
        if not reference_copies(prob, graph, a, (1, 4)):
            without_copies += 1
            assert peak == pytest.approx(acts.max()), "the peak is reached at a maximal live set"
            assert at in {2, 5}
        else:
            assert peak >= acts.max() - 1e-6, "rows count values; the peak adds the copies"
    assert without_copies >= 2


def test_budget_plans_match_brute_force():
    free = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(), [])
    assignments = all_assignments(free.ilp)
    peaks = [rows_peak(free, a) for a in assignments]
    cheapest = min(assignments, key=lambda a: _core.evaluate(free.ilp, a).objective)
    assert rows_peak(free, cheapest) > sorted(set(peaks))[1], "the budgets below must bind"
    for budget in sorted(set(peaks))[1::2]:
        prob = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(budget), [])
        feasible = [a for a, p in zip(assignments, peaks) if p <= budget]
        best = min(_core.evaluate(prob.ilp, a).objective for a in feasible)
        ilp = prob.ilp_with_memory_rows()
        sol = solve_ilp(ilp, SolveOptions(rel_gap=0.0))
        assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert rows_peak(prob, sol.assignment) <= budget
        assert not _core.evaluate(ilp, sol.assignment).violations
        assert solve_within_budget(prob, budget, SolveOptions(rel_gap=0.0), "1x4").objective == \
            pytest.approx(best, rel=1e-9, abs=1e-12)


def test_infeasible_budget_names_the_least_peak():
    """Rows below every plan's values: infeasible, naming the peak (reshard copies included) of a
    plan whose values take the least memory: a budget some plan really meets."""
    free = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(), [])
    least = min(rows_peak(free, a) for a in all_assignments(free.ilp))
    named = {math.ceil(free.predicted_peak(a)[0]) for a in all_assignments(free.ilp) if rows_peak(free, a) == least}
    prob = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(least - 1), [])
    with pytest.raises(InfeasibleError, match=r"feasible is [\d.e+-]+ GiB \((\d+) bytes\)") as info:
        solve_within_budget(prob, least - 1, SolveOptions(), "1x4")
    assert info.value.smallest_feasible_bytes in named
    ok = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(least), [])
    assert solve_within_budget(ok, least, SolveOptions(), "1x4").assignment is not None


def test_an_infeasible_round_is_not_explained_when_the_caller_handles_it(monkeypatch):
    """``solve_within_budget(explain=False)`` (the reshard-copy rounds and the finish, which back off
    or keep their last plan): the InfeasibleError comes as found, without the least-memory plan and
    the lower bound the default message names (GPT-39B 8x8 at 80 GiB: ~40 s per dropped message)."""
    from alpa_pass.driver import budget as b

    free = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(), [])
    least = min(rows_peak(free, a) for a in all_assignments(free.ilp))
    prob = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(least - 1), [])
    calls = []
    real = b.least_memory_plan
    monkeypatch.setattr(b, "least_memory_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(InfeasibleError) as info:
        solve_within_budget(prob, least - 1, SolveOptions(), "1x4", explain=False)
    assert calls == [] and getattr(info.value, "smallest_feasible_bytes", None) is None
    with pytest.raises(InfeasibleError) as info:
        solve_within_budget(prob, least - 1, SolveOptions(), "1x4")
    assert calls == [1] and info.value.smallest_feasible_bytes > 0


def test_dropping_dominated_memory_rows_keeps_the_optimum():
    """``redundant_memory_rows``: of four budget rows, the one below another coefficient-wise
    and one of two equal rows are dropped; the optimum is the brute-force one at every budget."""
    groups = [np.array([1.0, 2.0]), np.array([0.0, 1.0, 3.0])]
    edges = [(0, 1, np.array([[0.0, 5.0, 1.0], [2.0, 0.0, 1.0]]))]
    big = (np.array([0, 0, 1, 1]), np.array([0, 1, 0, 2]), np.array([10.0, 4.0, 6.0, 1.0]))
    small = (np.array([0, 0, 1]), np.array([0, 1, 2]), np.array([5.0, 4.0, 1.0]))     # <= big
    other = (np.array([0, 1]), np.array([1, 1]), np.array([9.0, 7.0]))               # not comparable
    for upper in (11.0, 13.0, 20.0):
        rows = [(*small, -np.inf, upper), (*big, -np.inf, upper), (*big, -np.inf, upper), (*other, -np.inf, upper)]
        prob = _core.build_ilp(groups, edges, rows=rows)
        start = prob.linear_row_start
        m = csr_rows(prob, np.arange(start, prob.num_rows))
        assert list(redundant_memory_rows(m)) == [0, 1]  # small, and the first of the equal pair
        plans = [np.array(a) for a in itertools.product(range(2), range(3))]
        feasible = [a for a in plans if not _core.evaluate(prob, a).violations]
        sol = solve_ilp(prob, SolveOptions(rel_gap=0.0), drop_rows=start + redundant_memory_rows(m))
        assert not _core.evaluate(prob, sol.assignment).violations
        assert sol.objective == pytest.approx(min(_core.evaluate(prob, a).objective for a in feasible))


def csr_rows(ilp, rows):
    """Rows ``rows`` of an IlpProblem's matrix as a scipy CSR matrix (from its CSC arrays)."""
    import scipy.sparse

    m = scipy.sparse.csc_matrix((ilp.a_value, ilp.a_index, ilp.a_start), shape=(ilp.num_rows, ilp.num_cols))
    return m.tocsr()[rows]


def reference_row_lower_bound(ilp):
    """max over linear rows of the sum over groups of the group's least coefficient in the row
    (0 unless every strategy of the group appears in it): the definition."""
    gs = np.asarray(ilp.group_var_start)
    m = csr_rows(ilp, np.arange(ilp.linear_row_start, ilp.num_rows)).toarray()
    return max(sum(row[gs[g]:gs[g + 1]].min() for g in range(gs.size - 1)) for row in m)


def test_memory_row_lower_bound_is_each_row_at_its_own_minimum():
    """The closed-form bound (one sweep over the points, values and copies entering and leaving)
    equals the definition over the materialised rows, copies included, and is below every plan's
    rows."""
    free = _core.build_sharding_problem(built_graph(shared_weight()), MESH14, options(), [])
    plans = all_assignments(free.ilp)
    checked = 0
    for a in [None] + [a for a in plans if free.reshard_copies(a)][::5]:
        copies = [] if a is None else [c[:5] for c in free.reshard_copies(a)]
        prob = _core.build_sharding_problem(built_graph(shared_weight()), MESH14, options(1e12), [], copies=copies)
        bound = prob.memory_row_lower_bound()
        assert bound == pytest.approx(reference_row_lower_bound(prob.ilp_with_memory_rows()), rel=1e-12)
        assert 0 < bound <= min(prob.memory_row_activity(p).max() for p in plans) + 1e-6
        checked += 1
    assert checked >= 3
    assert free.memory_row_lower_bound() == 0.0 and free.num_memory_rows == 0


def test_memory_rows_materialise_on_demand():
    """``memory_row_matrix(which)``: the rows ``ilp_with_memory_rows`` gets, any ascending subset;
    its product with a plan's columns is ``memory_row_activity``."""
    free = _core.build_sharding_problem(built_graph(shared_weight()), MESH14, options(), [])
    a = next(a for a in all_assignments(free.ilp) if free.reshard_copies(a))
    prob = _core.build_sharding_problem(built_graph(shared_weight()), MESH14, options(1e12), [],
                                        copies=[c[:5] for c in free.reshard_copies(a)])
    ilp = prob.ilp_with_memory_rows()
    n = prob.num_memory_rows
    assert n == ilp.num_linear_rows >= 2
    full = memory_row_matrix(prob)
    assert abs(full - csr_rows(ilp, np.arange(ilp.linear_row_start, ilp.num_rows))).max() == 0
    which = np.arange(n)[::2]
    assert abs(memory_row_matrix(prob, which) - full[which]).max() == 0
    part = prob.ilp_with_memory_rows(which)
    assert part.num_linear_rows == which.size and part.num_cols == ilp.num_cols
    for p in all_assignments(free.ilp)[::3]:
        assert np.allclose(full @ s_columns(ilp, p), prob.memory_row_activity(p), rtol=1e-12)
    for bad in ([n], [1, 0], [-1]):
        with pytest.raises(ValueError, match="ascending indices"):
            prob.memory_row_matrix(np.asarray(bad, dtype=np.int64))
    with pytest.raises(ValueError, match="one per group"):
        prob.memory_row_activity(np.zeros(1, dtype=np.int64))


@pytest.mark.parametrize("filter_above", [64, 0])
def test_memory_rows_are_added_only_where_a_plan_breaks_them(monkeypatch, filter_above):
    """Row generation: a budget the free optimum meets is one solve with no memory row; at every
    binding budget the result is the brute-force optimum (the free solve first, then with rows;
    with ``filter_above=0`` each round adds only the broken rows no other row dominates)."""
    from alpa_pass.driver import budget as budget_module

    monkeypatch.setattr(budget_module, "FILTER_BROKEN_ROWS", filter_above)

    free = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(), [])
    assignments = all_assignments(free.ilp)
    best = solve_ilp(free.ilp, SolveOptions(rel_gap=0.0))
    peak = rows_peak(free, best.assignment)
    kept_rows = []
    real = budget_module.solve_ilp

    def record(ilp, opts, start=None, drop_rows=None, **kwargs):
        kept_rows.append(ilp.num_linear_rows - len(drop_rows if drop_rows is not None else ()))
        return real(ilp, opts, start=start, drop_rows=drop_rows, **kwargs)

    monkeypatch.setattr(budget_module, "solve_ilp", record)
    prob = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(peak), [])
    sol = solve_within_budget(prob, peak, SolveOptions(rel_gap=0.0), "1x4")
    assert kept_rows == [0] and sol.objective == pytest.approx(best.objective, rel=1e-12)
    peaks = sorted({rows_peak(free, a) for a in assignments})
    binding = [b for b in peaks if b < peak]
    assert binding, "no budget below the free optimum's peak: weak test"
    for budget in binding:
        kept_rows.clear()
        prob = _core.build_sharding_problem(built_graph(mlp()), MESH14, options(budget), [])
        sol = solve_within_budget(prob, budget, SolveOptions(rel_gap=0.0), "1x4")
        want = min(_core.evaluate(prob.ilp, a).objective for a in assignments if rows_peak(free, a) <= budget)
        assert sol.objective == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert rows_peak(prob, sol.assignment) <= budget
        assert kept_rows[0] == 0 and len(kept_rows) >= 2


def chain_with_rows(upper):
    groups = [np.array([1.0, 2.0]), np.array([0.0, 1.0, 3.0])]
    edges = [(0, 1, np.array([[0.0, 5.0, 1.0], [2.0, 0.0, 1.0]]))]
    rows = [(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 2]), np.array([10.0, 4.0, 6.0, 1.0]), -np.inf, upper)]
    return _core.build_ilp(groups, edges, rows=rows)


def test_linear_rows_in_build_and_evaluate():
    ilp = chain_with_rows(12.0)
    assert ilp.num_linear_rows == 1 and ilp.linear_row_start == ilp.num_rows - 1
    r = ilp.linear_row_start
    assert ilp.row_upper[r] == 12.0 and np.isinf(ilp.row_lower[r])
    assert _core.evaluate(ilp, np.array([1, 0])).violations == []           # 4 + 6 = 10
    bad = _core.evaluate(ilp, np.array([0, 0])).violations                   # 10 + 6 = 16
    assert len(bad) == 1 and "linear row 0 = 16" in bad[0]
    x = s_columns(ilp, np.array([0, 0]))
    x[ilp.group_var_start[-1] + 0] = 1.0  # e[0][0]
    assert any("(linear row 0)" in v for v in _core.evaluate_columns(ilp, x).violations)
    sol = solve_ilp(ilp, SolveOptions(rel_gap=0.0))
    best = min((_core.evaluate(ilp, a).objective, tuple(a)) for a in all_assignments(ilp)
               if not _core.evaluate(ilp, a).violations)
    assert sol.objective == pytest.approx(best[0])


def test_min_max_row_problem_finds_the_least_row_maximum():
    ilp = chain_with_rows(12.0)
    q = _core.min_max_row_problem(ilp)
    assert q.num_cols == ilp.num_cols + 1 and q.col_cost[-1] == 1.0 and np.all(q.col_cost[:-1] == 0)
    sol = solve_ilp(q, SolveOptions(rel_gap=0.0))
    row = ilp.linear_row_start
    least = min(row_activity(ilp, [row], s_columns(ilp, a))[0] for a in all_assignments(ilp))
    assert sol.x[-1] == pytest.approx(least)  # 4 + 1 (group 0 picks 1, group 1 picks 2)
    with pytest.raises(ValueError, match="linear rows"):
        _core.min_max_row_problem(_core.build_ilp([np.array([1.0])], []))


@pytest.mark.parametrize("rows,match", [
    ([(np.array([0, 0]), np.array([1, 1]), np.array([1.0, 2.0]), -np.inf, 1.0)], "twice"),
    ([(np.array([2]), np.array([0]), np.array([1.0]), -np.inf, 1.0)], "group 2"),
    ([(np.array([0]), np.array([5]), np.array([1.0]), -np.inf, 1.0)], "out of range"),
    ([(np.array([0]), np.array([0]), np.array([1.0]), 2.0, 1.0)], "bounds"),
    ([(np.array([0]), np.array([0, 1]), np.array([1.0]), 0.0, 1.0)], "differ in length"),
])
def test_bad_linear_rows_are_rejected(rows, match):
    with pytest.raises(ValueError, match=match):
        _core.build_ilp([np.array([1.0, 2.0]), np.array([0.0, 1.0])], [], rows=rows)


def shared_weight():
    """w read by three dots (x @ w, then h @ w twice, the last after a long chain): a layout of w
    the dots want that is not w's own is one copy from the first such reader to the last."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [32, 64], F32, attrs=[0])
    w = b.add(OpKind.PARAMETER, [64, 64], F32, attrs=[1])
    h = b.add(OpKind.DOT, [32, 64], F32, [x, w], [0, 1, 1, 0])
    g = b.add(OpKind.DOT, [32, 64], F32, [h, w], [0, 1, 1, 0])
    r = b.add(OpKind.ELEMENTWISE, [32, 64], F32, [g, h])
    y = b.add(OpKind.DOT, [32, 64], F32, [r, w], [0, 1, 1, 0])
    b.add(OpKind.OUTPUT, [32, 64], F32, [y], [0])
    return b


def test_reshard_copies_live_from_first_to_last_reader():
    graph = shared_weight().build()
    prob = _core.build_sharding_problem(built_graph(shared_weight()), MESH14, options(), [])
    spans = 0
    for a in all_assignments(prob.ilp):
        copies = prob.reshard_copies(a)
        want = reference_copies(prob, graph, a, (1, 4))
        # one entry per reader, each from after the previous reader of that layout to itself
        got = {}
        for consumer, operand, layout, start, end, nbytes in copies:
            u = graph.operands(consumer)[operand]
            first, _, size = got.get((u, tuple(layout)), (start, end, nbytes))
            assert end == consumer and size == nbytes
            got[(u, tuple(layout))] = (first, end, nbytes)
        assert got == want
        spans += any(last > first for first, last, _ in want.values())
        assert prob.predicted_peak(a)[0] == pytest.approx(reference_peak(prob, a, graph.num_nodes, graph))
    assert spans > 0, "no assignment makes a copy that several readers share: weak test"


def test_copies_in_the_rows_bound_the_peak_of_the_plan_they_came_from():
    graph = shared_weight().build()
    free = _core.build_sharding_problem(built_graph(shared_weight()), MESH14, options(), [])
    assignments = all_assignments(free.ilp)
    with_copies = [a for a in assignments if free.reshard_copies(a)]
    assert len(with_copies) > 3
    for a in with_copies[::max(1, len(with_copies) // 4)]:
        copies = free.reshard_copies(a)
        prob = _core.build_sharding_problem(built_graph(shared_weight()), MESH14, options(1e12), [],
                                            copies=[c[:5] for c in copies])
        ilp = prob.ilp_with_memory_rows()
        rows = np.arange(ilp.linear_row_start, ilp.num_rows)
        acts = row_activity(ilp, rows, s_columns(ilp, a))
        assert acts.max() == pytest.approx(prob.predicted_peak(a)[0])  # exact for the plan itself
        for other in assignments[::7]:  # an upper bound on the values of every plan
            assert row_activity(ilp, rows, s_columns(ilp, other)).max() >= rows_peak_of(prob, other, graph) - 1e-6


def rows_peak_of(prob, assignment, graph):
    return reference_peak(prob, assignment, graph.num_nodes)


@pytest.mark.parametrize("copy, match", [
    ((9, 0, [-1, -1], 0, 0), "no such operand"),
    ((2, 5, [-1, -1], 0, 2), "no such operand"),
    ((2, 1, [-1], 0, 2), "layout needs 2 entries"),
    ((2, 1, [-1, -1], 3, 2), "start <= end"),
])
def test_bad_copies_are_rejected(copy, match):
    with pytest.raises(ValueError, match=match):
        _core.build_sharding_problem(built_graph(shared_weight()), MESH14, options(1e9), [], copies=[copy])


@pytest.mark.parametrize("layout, mesh_shape, want", [
    ((0, 2), (8, 8), [(0, 2), (2, 0)]),
    ((0, 2), (2, 4), [(0, 2)]),                       # no two axes of one size: no twin
    ((1, 1), (4, 4), [(1, 1)]),                       # its own mirror
    ((0, -1, 1), (2, 2, 4), [(0, -1, 1), (-1, 0, 1)]),
    ((0, 1, -1), (2, 2, 2), [(0, 1, -1), (0, -1, 1), (1, 0, -1), (-1, 0, 1), (1, -1, 0), (-1, 1, 0)]),
])
def test_layout_twins_mirror_axes_of_equal_size(layout, mesh_shape, want):
    """A copy counted in one layout is counted in its mirrors too: on a square mesh the mirrored
    plan costs the same and makes the mirrored copy (LLaMA-8B 8x8 at 40 GiB flipped between the
    two for every re-solve before)."""
    assert layout_twins(list(layout), mesh_shape) == want


def test_free_plan_copies_that_leave_no_plan_are_dropped():
    """A free plan that nearly fits has its reshard copies (here none) counted before the first
    budgeted solve; copies counted on the consumer side can overcount (no plan left): then the
    budgeted problem is solved without them, as if they had never been counted."""
    graph = built_graph(shared_weight())

    def build(budget):
        return _core.build_sharding_problem(graph, MESH14, options(budget), [])

    free = solve_ilp(build(0.0).ilp, SolveOptions(rel_gap=0.0))
    peak = build(1e12).predicted_peak(free.assignment)[0]
    budget = peak / 1.1  # the free plan breaks it, within FREE_COPIES_WITHIN
    want = solve_within_budget(build(budget), budget, SolveOptions(rel_gap=0.0), "1x4")
    rebuilt = []

    def overcounting(row_budget):  # stands for copy rows no plan meets
        rebuilt.append(row_budget)
        return build(1.0)

    copies = ReshardCopies(overcounting, (1, 4))
    got = solve_within_budget(build(budget), budget, SolveOptions(rel_gap=0.0), "1x4", copies=copies)
    assert rebuilt == [None], "the free plan's copies were not counted: weak test"
    assert len(copies) == 0 and copies.problem is None
    assert got.objective == pytest.approx(want.objective) and list(got.assignment) == list(want.assignment)


def test_a_copy_two_plans_range_differently_is_counted_once_over_both_ranges():
    """A copy's start is the previous consumer reading the same layout, which differs between
    plans: the rows count it once, over the union of its ranges (twice over the overlap before),
    and each mirror of its layout likewise."""

    class Plans:  # reshard_copies of two plans: (consumer, operand, layout, start, end, bytes)
        def __init__(self):
            self.by_plan = {0: [(9, 1, [0, -1], 5, 9, 8.0), (7, 0, [-1, -1], 7, 7, 4.0)],
                            1: [(9, 1, [0, -1], 3, 9, 8.0)]}

        def reshard_copies(self, assignment):
            return self.by_plan[int(assignment[0])]

    built = []
    copies = ReshardCopies(lambda row_budget: built.append(copies.as_list()) or "rebuilt", (2, 2))
    copies.add(Plans(), [0])
    assert copies.add(Plans(), [1]) == "rebuilt"
    assert built[-1] == [(9, 1, [0, -1], 3, 9), (9, 1, [-1, 0], 3, 9), (7, 0, [-1, -1], 7, 7)]
    assert len(copies) == 3


def test_only_the_last_draft_is_finished_and_the_finish_is_kept_only_when_it_fits_and_is_no_dearer(monkeypatch):
    """``driver.budget.finish_draft``: the budgeted rounds solve LP-support drafts (no RENS); the
    plan that fits with its reshard copies is finished (solved again with its copies counted, the
    draft as the candidate) only when it is over ``support_gap``, and the finished plan replaces
    it only when no costlier and within the budget with its own copies (LLaMA-8B 8x8 at 35 GiB: the finished plan 3.744e10 vs
    the draft's 3.833e10, but 35.0x GiB with its copies: the draft stayed)."""
    import types

    from alpa_pass.driver import budget as b
    from alpa_pass.solve.highs import SUPPORT_STATUS

    def sol(objective, gap, status=SUPPORT_STATUS, assignment=(0, 1), support=None):
        return types.SimpleNamespace(objective=objective, mip_gap=gap, status=status, assignment=np.array(assignment),
                                     support=support)

    class Copies:
        def __init__(self, peaks):
            self.peaks, self.added = peaks, []

        def add(self, problem, assignment, row_budget=None):
            self.added.append((tuple(assignment), row_budget))
            return types.SimpleNamespace(memory_row_upper=problem.memory_row_upper, counted=True)

        def seen(self, problem, assignment):
            return self.peaks[tuple(assignment)]

    problem = types.SimpleNamespace(memory_row_upper=100.0)
    options = SolveOptions(support_gap=0.1)
    solves = []
    finished = sol(90.0, 0.05, assignment=(1, 1))
    queue = []  # results of the next solves, before ``finished``

    def solve(p, budget, o, where, hint=None, candidate=None, support=None, explain=True):
        assert not explain  # (an InfeasibleError here only ends the finish: no message to compute)
        solves.append((budget, o.support_draft, tuple(hint), tuple(candidate), support))
        return queue.pop(0) if queue else finished

    monkeypatch.setattr(b, "solve_within_budget", solve)
    draft = sol(100.0, 0.13)
    # within the gap, or not an LP-support plan, or no budget: kept as is, nothing solved
    for s, budget in ((sol(100.0, 0.05), 100), (sol(100.0, 0.3, status="Optimal"), 100), (draft, None)):
        assert b.finish_draft(Copies({}), problem, s, budget, options, "2x2") == (problem, s)
    assert solves == []
    # finished, cheaper and fits with its copies: kept, with the problem that counts the draft's copies
    copies = Copies({(1, 1): 99.0})
    p, s = b.finish_draft(copies, problem, draft, 100, options, "2x2")
    assert s is finished and p.counted and copies.added == [((0, 1), None)]
    assert solves == [(100, False, (0, 1), (0, 1), None)]  # the full options (no draft), hinted by the draft, its candidate
    # no costlier (e.g. the draft itself, now certified by the new LP bound): kept
    finished = sol(100.0, 0.07, assignment=(0, 1))
    assert b.finish_draft(Copies({(0, 1): 99.0}), problem, draft, 100, options, "2x2")[1] is finished
    finished = sol(90.0, 0.05, assignment=(1, 1))
    # over the budget with its own copies, and so after MAX_COPY_ROUNDS rounds counting them: the draft stays
    solves.clear()
    copies = Copies({(1, 1): 100.5})
    assert b.finish_draft(copies, problem, draft, 100, options, "2x2") == (problem, draft)
    assert copies.added == [((0, 1), None)] + [((1, 1), None)] * b.MAX_COPY_ROUNDS
    assert [s[2:4] for s in solves] == [((0, 1), (0, 1))] + [((1, 1), (0, 1))] * b.MAX_COPY_ROUNDS
    # ... unless a round with them counted finds one that fits: kept, solved from the last round's support
    solves.clear()
    queue.append(sol(95.0, 0.05, assignment=(1, 1), support="lp support"))
    finished = sol(97.0, 0.06, assignment=(1, 0))
    copies = Copies({(1, 1): 100.5, (1, 0): 99.0})
    p, s = b.finish_draft(copies, problem, draft, 100, options, "2x2")
    assert s is finished and copies.added == [((0, 1), None), ((1, 1), None)]
    assert solves[1][2:] == ((1, 1), (0, 1), "lp support")
    # dearer than the draft: the draft stays
    finished = sol(120.0, 0.05, assignment=(1, 1))
    assert b.finish_draft(Copies({(1, 1): 50.0}), problem, draft, 100, options, "2x2") == (problem, draft)
    # rows tightened below the budget by the copy rounds: the finish solves at the rows' bound
    solves.clear()
    b.finish_draft(Copies({(1, 1): 50.0}), types.SimpleNamespace(memory_row_upper=80.0), draft, 100, options, "2x2")
    assert solves[0][0] == 80


def test_budgeted_rounds_are_drafts_only_under_a_budget_with_a_support_gap():
    import alpa_pass as ap
    from alpa_pass.driver.budget import draft_options

    assert draft_options(ap.AutoShardingOption(memory_budget_per_device=2**30)).support_draft
    assert not draft_options(ap.AutoShardingOption()).support_draft
    assert not draft_options(ap.AutoShardingOption(memory_budget_per_device=2**30, solver_support_gap=None)).support_draft
