"""Solves are bounded by deterministic work, not by the clock (issue 14).

By default no HiGHS solve has a wall-clock limit (``solver_time_limit_s=None``); the main solve
stops at ``solver_node_limit`` branch-and-bound nodes, the refinement at ``refine_node_limit``. A
node-limited solve returns its incumbent, the same one on every run.
"""
from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass import _core
from alpa_pass.errors import OptionError, SolverError
from alpa_pass.solve import highs, support
from alpa_pass.solve.highs import SolveOptions, solve_ilp


def _frustrated_ilp(seed: int = 0):
    """A complete graph of 8 groups x 3 strategies, random costs: HiGHS cannot finish in one node."""
    rng = np.random.default_rng(seed)
    groups = [rng.uniform(0, 1, 3) for _ in range(8)]
    edges = [(u, v, rng.uniform(0, 10, (3, 3))) for u, v in itertools.combinations(range(8), 2)]
    return _core.build_ilp(groups, edges)


def test_default_solves_have_no_wall_clock_limit():
    option = ap.AutoShardingOption()
    assert option.solver_time_limit_s is None
    solve = option.solve_options()
    assert solve.time_limit_s is None and solve.node_limit == option.solver_node_limit == 10_000
    assert solve.threads == 1 and solve.seed == 0
    assert SolveOptions().time_limit_s is None and SolveOptions().node_limit is None
    assert solve.eliminate_chains  # the main solve is reduced exactly (AutoShardingOption.solve_options)
    assert ap.AutoShardingOption(solver_time_limit_s=5.0, solver_node_limit=None).solve_options() == \
        SolveOptions(time_limit_s=5.0, node_limit=None, eliminate_chains=True, support_gap=0.1)


def test_node_limited_solve_is_deterministic_and_says_so():
    ilp = _frustrated_ilp()
    exact = solve_ilp(ilp)
    assert exact.optimal and not exact.node_limited and not exact.time_limited
    limited = [solve_ilp(ilp, SolveOptions(node_limit=1)) for _ in range(2)]
    for s in limited:
        assert s.node_limited and not s.optimal and not s.time_limited
        assert s.status == "Solution limit reached"
        assert s.objective >= exact.objective - 1e-9 and s.mip_gap >= 0
    assert np.array_equal(limited[0].assignment, limited[1].assignment)
    assert limited[0].objective == limited[1].objective


@pytest.mark.parametrize("field,value", [
    ("solver_time_limit_s", 0), ("solver_time_limit_s", -1.0),
    ("solver_node_limit", 0), ("solver_node_limit", 2.5), ("solver_node_limit", True),
    ("solver_support_gap", -0.1), ("solver_support_gap", 1.0),
])
def test_limit_options_are_validated(field, value):
    with pytest.raises(OptionError, match=field):
        ap.AutoShardingOption(**{field: value})


def _budgeted_frustrated_ilp(upper: float, seed: int = 0, cost_scale: float = 1.0):
    """``_frustrated_ilp`` plus one budget row (a random size per strategy, sum <= ``upper``), its
    costs times ``cost_scale``."""
    rng = np.random.default_rng(seed)
    groups = [cost_scale * rng.uniform(0, 1, 3) for _ in range(8)]
    edges = [(u, v, cost_scale * rng.uniform(0, 10, (3, 3))) for u, v in itertools.combinations(range(8), 2)]
    sizes = rng.uniform(1, 4, (8, 3))
    row = (np.repeat(np.arange(8), 3), np.tile(np.arange(3), 8), sizes.ravel(), -np.inf, upper)
    return _core.build_ilp(groups, edges, rows=[row]), sizes


def test_support_plan_is_feasible_and_its_gap_bounds_the_optimum():
    """``SolveOptions.support_gap``: with a budget row, the plan of the MIP restricted to the LP
    relaxation's strategies is kept when within the gap of the LP bound (status says so); its
    ``mip_gap`` is measured from a lower bound, so the optimum (brute force) is within it. With
    ``support_gap=0`` or ``None`` the full solve returns the optimum."""
    ilp, sizes = _budgeted_frustrated_ilp(upper=16.9)
    plans = [np.array(a) for a in itertools.product(range(3), repeat=8)]
    feasible = [a for a in plans if sizes[np.arange(8), a].sum() <= 16.9]
    assert 0 < len(feasible) < len(plans) / 100, "the budget must bind"
    best = min(_core.evaluate(ilp, a).objective for a in feasible)
    free = min(_core.evaluate(ilp, a).objective for a in plans)
    assert best > free * 1.05, "the budget must change the optimum"
    kept = solve_ilp(ilp, SolveOptions(support_gap=0.5, eliminate_chains=True))
    assert kept.status == "LP-support plan" and 0 < kept.mip_gap <= 0.5 and not kept.optimal
    assert sizes[np.arange(8), kept.assignment].sum() <= 16.9 + 1e-9
    assert not _core.evaluate(ilp, kept.assignment).violations
    assert kept.objective > best + 1e-6  # this case: the support's plan is not the optimum
    assert kept.objective * (1 - kept.mip_gap) <= best + 1e-9  # the gap is to a lower bound
    for gap in (0.0, None):
        full = solve_ilp(ilp, SolveOptions(support_gap=gap, rel_gap=0.0, eliminate_chains=True))
        assert full.status == "Optimal" and full.objective == pytest.approx(best, rel=1e-9)
    again = solve_ilp(ilp, SolveOptions(support_gap=0.5, eliminate_chains=True))
    assert np.array_equal(again.assignment, kept.assignment) and again.objective == kept.objective


def test_support_step_adds_memory_rows_as_they_break(monkeypatch):
    """The LP-support step adds memory rows lazily (``SUPPORT_ROWS_PER_ROUND``): one per round
    here, on 4 budget rows; its LP bound is the LP bound with every row, and its plan meets them
    all."""
    rng = np.random.default_rng(1)
    groups = [rng.uniform(0, 1, 3) for _ in range(8)]
    edges = [(u, v, rng.uniform(0, 10, (3, 3))) for u, v in itertools.combinations(range(8), 2)]
    sizes = rng.uniform(1, 4, (4, 8, 3))
    rows = [(np.repeat(np.arange(8), 3), np.tile(np.arange(3), 8), sizes[r].ravel(), -np.inf, 18.0)
            for r in range(4)]
    ilp = _core.build_ilp(groups, edges, rows=rows)
    model = highs.without_rows(ilp, np.zeros(0, dtype=np.int64))
    monkeypatch.setattr(support, "SUPPORT_ROWS_PER_ROUND", 1)
    found = support.support_plan(model, SolveOptions())
    assert found is not None
    x, bound, gap, _ = found
    assert bound == pytest.approx(highs.lp_bound(ilp), rel=1e-9)
    assignment = np.asarray(_core.decode_assignment(ilp, x))
    loads = sizes[:, np.arange(8), assignment].sum(axis=1)
    assert (loads <= 18.0 + 1e-9).all() and not _core.evaluate(ilp, assignment).violations
    plans = [np.array(a) for a in itertools.product(range(3), repeat=8)]
    best = min(_core.evaluate(ilp, a).objective for a in plans
               if (sizes[:, np.arange(8), a].sum(axis=1) <= 18.0).all())
    assert bound <= best + 1e-9 <= _core.evaluate(ilp, assignment).objective + 2e-9


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_an_lp_certifying_a_candidate_prices_its_columns_in(seed, caplog):
    """Given a candidate (``driver.budget.finish_draft``), the LP with memory rows starts from some
    group columns (the row-free LP's, the candidate's, each group's least-memory ones) and prices
    the others in by reduced cost: its bound is the full LP's with every row, its plan meets the
    rows and is no dearer than the candidate (10 groups x 6 strategies, 3 budget rows)."""
    groups_n, strategies = 10, 6
    rng = np.random.default_rng(seed)
    groups = [rng.uniform(0, 1, strategies) for _ in range(groups_n)]
    edges = [(u, v, rng.uniform(0, 10, (strategies, strategies)))
             for u, v in itertools.combinations(range(groups_n), 2) if rng.uniform() < 0.5]
    sizes = rng.uniform(1, 4, (3, groups_n, strategies))
    candidate = np.argmin(sizes.sum(axis=0), axis=1)
    upper = sizes[:, np.arange(groups_n), candidate].sum(axis=1).max() * 1.10
    rows = [(np.repeat(np.arange(groups_n), strategies), np.tile(np.arange(strategies), groups_n), sizes[r].ravel(),
             -np.inf, upper) for r in range(3)]
    ilp = _core.build_ilp(groups, edges, rows=rows)
    model = highs.without_rows(ilp, np.zeros(0, dtype=np.int64))
    with caplog.at_level("INFO", logger="alpa_pass.solve.support"):
        x, bound, _, _ = support.support_plan(model, SolveOptions(), candidate=candidate)
    priced = [r.getMessage() for r in caplog.records if "priced in" in r.getMessage()]
    assert len(priced) == 1
    held, entered = (int(v) for v in re.search(r"(\d+) of 60 group columns priced in \((\d+) by", priced[0]).groups())
    assert held < 60 and entered > 0  # columns left out, some needed: the pricing decided the bound
    assert bound == pytest.approx(highs.lp_bound(ilp), rel=1e-9)
    assignment = np.asarray(_core.decode_assignment(ilp, x))
    assert (sizes[:, np.arange(groups_n), assignment].sum(axis=1) <= upper + 1e-9).all()
    assert _core.evaluate(ilp, assignment).objective <= _core.evaluate(ilp, candidate).objective + 1e-9


def test_a_priced_lp_that_cannot_meet_the_rows_takes_every_column(caplog):
    """3 groups x 3 strategies: rows A and B hold only with strategy 2 in every group, a row C makes
    strategy 2 the largest in total (so not a least-memory one), and the candidate (all 0) breaks
    row B: the columns first held (0 and 1) admit no LP solution, every column joins, and the bound
    is the full LP's (a fractional mix: below the one plan's 15)."""
    groups = [np.array([0.0, 1.0, 5.0]) for _ in range(3)]
    edges = [(u, v, np.zeros((3, 3))) for u, v in itertools.combinations(range(3), 2)]
    cols = (np.repeat(np.arange(3), 3), np.tile(np.arange(3), 3))
    rows = [(*cols, np.tile(values, 3), -np.inf, upper)
            for values, upper in (([1.0, 10.0, 3.0], 10.0), ([10.0, 1.0, 3.0], 10.0), ([0.0, 0.0, 20.0], 60.0))]
    ilp = _core.build_ilp(groups, edges, rows=rows)
    model = highs.without_rows(ilp, np.zeros(0, dtype=np.int64))
    with caplog.at_level("INFO", logger="alpa_pass.solve.support"):
        x, bound, _, _ = support.support_plan(model, SolveOptions(), candidate=np.zeros(3, dtype=np.int64))
    assert any("9 of 9 group columns priced in (0 by reduced cost)" in r.getMessage() for r in caplog.records)
    assert bound == pytest.approx(highs.lp_bound(ilp), rel=1e-9)
    assert list(_core.decode_assignment(ilp, x)) == [2, 2, 2]  # the one plan that meets rows A and B


def _far_support_case():
    """(ilp, sizes, LP bound, best feasible objective, best feasible objective on the LP's
    support, that support: the strategies per group), brute force: seed 3 at budget 18, where the
    support's best plan is far from the LP bound."""
    ilp, sizes = _budgeted_frustrated_ilp(upper=18.0, seed=3)
    model = highs.without_rows(ilp, np.zeros(0, dtype=np.int64))
    lp = highs._highs(SolveOptions(), presolve=False)
    lp.setOptionValue("solve_relaxation", True)
    highs._pass_model(lp, model, highs.highspy)
    lp.run()
    x_lp, starts = np.asarray(lp.getSolution().col_value), np.asarray(ilp.group_var_start)
    support = [[s for s in range(3) if x_lp[starts[g] + s] > 1e-6] for g in range(8)]
    plans = [np.array(a) for a in itertools.product(range(3), repeat=8)]
    feasible = [a for a in plans if sizes[np.arange(8), a].sum() <= 18.0]
    best = min(_core.evaluate(ilp, a).objective for a in feasible)
    on_support = min(_core.evaluate(ilp, a).objective for a in feasible if all(a[g] in support[g] for g in range(8)))
    return ilp, sizes, lp.getInfo().objective_function_value, best, on_support, support


def test_support_step_frees_the_fractional_groups_when_the_support_plan_is_far():
    """Where the best plan on the LP's strategies is not within ``support_gap`` of the LP bound,
    the support step solves the MIP with the groups the LP sets integrally fixed and the others
    free (RENS), stopped at that gap: here it finds a plan no support-only restriction has (the
    optimum, brute force), and its gap to the LP bound is within ``support_gap``. (LLaMA-8B 8x8 at
    35 GiB: support-only plan 13.2% above the LP bound, the full MIP 1.2% after 150 s; RENS 1.4%
    in 17 s.)"""
    ilp, sizes, bound, best, on_support, _ = _far_support_case()
    assert (on_support - bound) / on_support > 0.12 > (best - bound) / best, "the support plan must miss the gap"
    kept = solve_ilp(ilp, SolveOptions(support_gap=0.12, eliminate_chains=True))
    assert kept.status == highs.SUPPORT_STATUS and kept.mip_gap <= 0.12
    assert sizes[np.arange(8), kept.assignment].sum() <= 18.0 + 1e-9
    assert kept.objective < on_support - 1e-6 and kept.objective == pytest.approx(best, rel=1e-9)
    assert kept.mip_gap == pytest.approx((kept.objective - bound) / kept.objective, rel=1e-6)


def test_large_costs_are_scaled_for_highs_and_plans_do_not_change():
    """Costs of a large model reach 1e12 (bytes times beta): HiGHS gets them scaled by a power of
    two (the largest at most ``COST_SCALE_TARGET``; unscaled, its dual simplex stopped with status
    Unknown on GPT-39B's budgeted LP). The plans, objectives, LP-support gaps and an
    ``objective_bound`` cutoff are those of the same ILP at unit scale."""
    small, sizes = _budgeted_frustrated_ilp(upper=16.9)
    large, _ = _budgeted_frustrated_ilp(upper=16.9, cost_scale=3e11)
    model, scale = highs._prepared(large, np.zeros(0, dtype=np.int64))
    costs = np.abs(np.asarray(model.col_cost))
    assert np.log2(scale) == int(np.log2(scale)) < 0
    assert highs.COST_SCALE_TARGET / 2 < costs.max() <= highs.COST_SCALE_TARGET
    assert highs._prepared(small, np.zeros(0, dtype=np.int64))[1] == 1.0  # (its row bound is 16.9 too)
    for options in (SolveOptions(rel_gap=0.0, eliminate_chains=True),
                    SolveOptions(support_gap=0.5, eliminate_chains=True)):
        a, b = solve_ilp(small, options), solve_ilp(large, options)
        assert b.status == a.status and np.array_equal(b.assignment, a.assignment)
        assert b.objective == pytest.approx(3e11 * a.objective, rel=1e-9)
        assert b.mip_gap == pytest.approx(a.mip_gap, rel=1e-6, abs=1e-9)
    best = solve_ilp(large, SolveOptions(rel_gap=0.0)).objective
    with pytest.raises(SolverError, match="cannot beat"):
        solve_ilp(large, SolveOptions(objective_bound=best * 0.999))
    assert solve_ilp(large, SolveOptions(objective_bound=best * 1.001)).objective == pytest.approx(best, rel=1e-9)


def test_a_support_draft_stops_at_the_plan_on_the_lp_support():
    """``SolveOptions.support_draft``: the budgeted rounds whose plans the next round replaces
    (``driver.budget.draft_options``) keep the restricted MIP's plan whatever its gap: no
    widening, no RENS and no full MIP. The same ILP as above: the draft is the best plan on the
    LP's support (brute force), feasible, with its true gap (over ``support_gap``) reported, never
    called optimal."""
    ilp, sizes, _, _, on_support, _ = _far_support_case()
    draft = solve_ilp(ilp, SolveOptions(support_gap=0.12, support_draft=True, eliminate_chains=True))
    assert draft.status == highs.SUPPORT_STATUS and not draft.optimal
    assert draft.objective == pytest.approx(on_support, rel=1e-9) and draft.mip_gap > 0.12
    assert sizes[np.arange(8), draft.assignment].sum() <= 18.0 + 1e-9
    finished = solve_ilp(ilp, SolveOptions(support_gap=0.12, eliminate_chains=True))
    assert finished.objective < draft.objective - 1e-6  # what finishing it buys (finish_draft)


def test_the_lp_support_is_widened_by_the_least_memory_strategies_before_rens():
    """When the best plan on the LP's support misses ``support_gap`` (and it is no draft), the MIP
    on the support widened by each group's least-memory strategy comes before RENS; its plan is
    kept when within the gap. Here (brute force) the support's best plan is 14.3% above the LP
    bound, the widened support's 13.8%: at ``support_gap=0.14`` the widened plan is the result."""
    ilp, sizes, bound, _, on_support, support = _far_support_case()
    wide = [sorted(set(support[g]) | {int(np.argmin(sizes[g]))}) for g in range(8)]
    on_wide = min(_core.evaluate(ilp, np.array(a)).objective for a in itertools.product(*wide)
                  if sizes[np.arange(8), np.array(a)].sum() <= 18.0)
    assert (on_support - bound) / on_support > 0.14 >= (on_wide - bound) / on_wide
    kept = solve_ilp(ilp, SolveOptions(support_gap=0.14, eliminate_chains=True))
    assert kept.status == highs.SUPPORT_STATUS and kept.objective == pytest.approx(on_wide, rel=1e-9)
    assert kept.mip_gap == pytest.approx((on_wide - bound) / on_wide, rel=1e-6)
    assert sizes[np.arange(8), kept.assignment].sum() <= 18.0 + 1e-9


def test_a_restriction_starts_from_the_relaxations_lp_support():
    """``solve_ilp(support=...)``: a budgeted round solves a restriction of the last round's problem
    (more reshard copies counted, a lower row bound): the MIP restricted to the last LP's
    strategies (with the candidate's and each group's least-memory ones) comes first, and its plan
    is kept without an LP when within ``support_gap`` of the last LP's bound, a lower bound here
    too (brute force). With no plan within the gap there, the problem's own LP decides. A plan
    given as ``candidate`` is never beaten by a worse one."""
    relaxed, sizes = _budgeted_frustrated_ilp(upper=18.0, seed=3)
    tight, _ = _budgeted_frustrated_ilp(upper=16.5, seed=3)
    plans = [np.array(a) for a in itertools.product(range(3), repeat=8)]
    loads = np.array([sizes[np.arange(8), a].sum() for a in plans])
    costs = np.array([_core.evaluate(tight, a).objective for a in plans])
    best = costs[loads <= 16.5].min()
    options = SolveOptions(support_gap=0.5, eliminate_chains=True)
    first = solve_ilp(relaxed, options)
    assert first.status == highs.SUPPORT_STATUS and first.support is not None
    assert first.support.bound == pytest.approx(highs.lp_bound(relaxed), rel=1e-9)
    assert first.support.columns.shape == (24,) and first.support.columns[np.arange(8) * 3 + first.assignment].all()
    carried = solve_ilp(tight, options, support=first.support)
    assert carried.support is None  # found on the carried support (no LP of its own): passes none on
    assert loads[np.flatnonzero([np.array_equal(a, carried.assignment) for a in plans])[0]] <= 16.5 + 1e-9
    # its gap is measured from the relaxation's LP bound (the restriction's own is higher: no new LP ran)
    assert carried.mip_gap == pytest.approx((carried.objective - first.support.bound) / carried.objective, rel=1e-6)
    assert first.support.bound <= best + 1e-9 and carried.mip_gap <= 0.5
    own = solve_ilp(tight, dataclasses.replace(options, support_gap=1e-6), support=first.support)
    assert own.support is None or own.support.bound == pytest.approx(highs.lp_bound(tight), rel=1e-9)
    assert highs.lp_bound(tight) > first.support.bound + 1e-6  # the restriction's own LP bound is higher
    feasible = [a for a, load in zip(plans, loads) if load <= 16.5]
    worst = max(feasible, key=lambda a: _core.evaluate(tight, a).objective)
    given = solve_ilp(tight, options, candidate=worst)
    assert given.objective <= _core.evaluate(tight, worst).objective + 1e-9
    with pytest.raises(ValueError, match="support has 5 columns"):
        solve_ilp(tight, options, support=highs.Support(np.ones(5, dtype=bool), 0.0))


def test_a_large_warm_started_solve_takes_the_lp_support_path():
    """``SolveOptions.start_support_columns`` (the unmerged refinement's large ILPs): past it, a
    solve with a ``start`` is the LP relaxation, then the MIP over the LP's support and the start's
    strategies, warm-started: its plan is the best one there (brute force), never worse than the
    start, with its gap to the LP bound; at or under it (or with ``support_gap=None``) the full MIP."""
    ilp = _frustrated_ilp(seed=9)  # (seeds 0-8: the optimum is on the support)
    start = np.zeros(8, dtype=np.int64)
    lp = highs._highs(SolveOptions(), presolve=False)
    lp.setOptionValue("solve_relaxation", True)
    highs._pass_model(lp, ilp, highs.highspy)
    lp.run()
    x_lp, starts = np.asarray(lp.getSolution().col_value), np.asarray(ilp.group_var_start)
    allowed = [{s for s in range(3) if x_lp[starts[g] + s] > 1e-6} | {0} for g in range(8)]
    plans = [np.array(a) for a in itertools.product(range(3), repeat=8)]
    on_support = min(_core.evaluate(ilp, a).objective for a in plans if all(a[g] in allowed[g] for g in range(8)))
    best = min(_core.evaluate(ilp, a).objective for a in plans)
    options = SolveOptions(support_gap=0.99, start_support_columns=0)
    refined = solve_ilp(ilp, options, start=start)
    assert refined.status == highs.SUPPORT_STATUS
    assert refined.objective == pytest.approx(on_support, rel=1e-9)
    assert refined.objective <= _core.evaluate(ilp, start).objective
    bound = lp.getInfo().objective_function_value
    assert refined.mip_gap == pytest.approx((refined.objective - bound) / refined.objective, rel=1e-6)
    for full_options in (dataclasses.replace(options, start_support_columns=int(ilp.num_cols)),
                         dataclasses.replace(options, support_gap=None)):
        full = solve_ilp(ilp, dataclasses.replace(full_options, rel_gap=0.0), start=start)
        assert full.status == "Optimal" and full.objective == pytest.approx(best, rel=1e-9)
    assert on_support > best + 1e-9, "the case must tell the two paths apart"
