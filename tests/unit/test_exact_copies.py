"""benchmarks/exact_copies.py (issue #15's experiment): its copy columns count every reshard copy
exactly, row by row, for any plan, and its restricted MIP's plan meets the budget with every copy
(the rows' peak is the plan's real peak)."""
import numpy as np
import pytest
import scipy.sparse as sp

from benchmarks import exact_copies
from benchmarks.bench_planning import abstract_inputs
from zoo import default_optimizer, gpt

CONFIG = gpt.Config(vocab=512, seq=64, hidden=64, heads=4, layers=2, batch=8, tied=False)
MESH = (2, 4)


@pytest.fixture(scope="module")
def captured():
    optimizer = default_optimizer()
    step, args = gpt.make_train_step(optimizer, CONFIG), abstract_inputs(CONFIG, optimizer)
    free, _ = exact_copies.plan_and_capture(step, args, MESH, None)
    budget = int(free.predicted_peak_bytes * 0.6)
    plan, seen = exact_copies.plan_and_capture(step, args, MESH, budget)
    assert "problem" in seen, "the free plan met the budget: no budgeted solve to capture"
    assert seen["counted"] == 0  # (the free plan is too far over the budget to have its copies counted)
    return seen["graph"], seen["problem"], seen["solution"], budget, plan


@pytest.mark.parametrize("pairwise", [0, 3])  # prefix/suffix columns for all; pairwise rows up to 3 readers
def test_copy_columns_count_each_plans_reshard_copies_exactly(captured, pairwise):
    graph, problem, solution, _, _ = captured
    gs = np.asarray(problem.ilp.group_var_start)
    points = np.asarray(problem.memory_row_points)
    copies = exact_copies.CopyColumns(problem, graph, MESH, np.ones(int(gs[-1]), dtype=bool), points, 0.0,
                                      pairwise)
    assert any(r[2] is None for r in copies.records) == bool(pairwise)
    assert copies.candidates > 0
    indptr, indices, data = problem.memory_row_matrix(None)
    rows = sp.csr_matrix((data, indices, indptr), shape=(points.size, copies.first))
    rows = sp.hstack([rows, sp.csr_matrix((points.size, copies.count))]).tocsr() + copies.in_memory_rows(points)
    r_, c_, v_ = zip(*[(i, col, x) for i, (terms, _) in enumerate(copies.rows) for col, x in terms])
    defining = sp.csr_matrix((v_, (r_, c_)), shape=(len(copies.rows), copies.first + copies.count))
    lower = np.asarray([b for _, b in copies.rows])
    by_column = defining.tocsc()
    plus_one = [by_column.indices[by_column.indptr[c]:by_column.indptr[c + 1]][
        by_column.data[by_column.indptr[c]:by_column.indptr[c + 1]] == 1.0]
        for c in range(copies.first, copies.first + copies.count)]
    rng = np.random.default_rng(0)
    plans = [np.asarray(solution.assignment, dtype=np.int64)] + [
        np.asarray([rng.integers(0, gs[g + 1] - gs[g]) for g in range(gs.size - 1)], dtype=np.int64)
        for _ in range(5)]
    with_copies = 0
    for plan in plans:
        x = np.zeros(copies.first)
        x[gs[:-1] + plan] = 1.0
        made = problem.reshard_copies(plan)
        with_copies += bool(made)
        want = problem.memory_row_activity(plan) + np.asarray(
            [sum(b for _, _, _, a, e, b in made if a <= t <= e) for t in points])
        least = copies.least_values(x)
        np.testing.assert_allclose(rows @ least, want, rtol=1e-12, atol=0)
        # and those values are what the copy rows allow: each copy column at the largest lower
        # bound the rows with +1 on it give (0 if none)
        slack = defining @ least - lower
        assert slack.min() >= -1e-12
        for c in range(copies.first, copies.first + copies.count):
            at = plus_one[c - copies.first]
            assert least[c] == pytest.approx(max(0.0, least[c] - slack[at].min()) if at.size else 0.0, abs=1e-12)
    assert with_copies >= 5  # the check is about copies: most of these plans make some


@pytest.mark.parametrize("pairwise", [0, 4])
def test_the_exact_copy_mip_meets_the_budget_with_every_copy(captured, pairwise):
    graph, problem, solution, budget, _ = captured
    found = exact_copies.exact_copy_plan(problem, graph, solution, budget, MESH, 0.0, least_memory=True,
                                         pairwise=pairwise)
    assert "objective" in found, found
    # the rows' peak is the plan's real peak, every reshard copy included
    assert found["rows_peak"] == pytest.approx(found["peak"], rel=1e-9)
    assert found["peak"] <= budget * (1 + 1e-9)
    # a plan of the problem whose LP (memory rows, no copies) is a relaxation: never below its bound
    assert solution.support is not None
    assert found["objective"] >= solution.support.bound * (1 - 1e-9)
