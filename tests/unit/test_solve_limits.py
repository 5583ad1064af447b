"""Solves are bounded by deterministic work, not by the clock (issue 14).

By default no HiGHS solve has a wall-clock limit (``solver_time_limit_s=None``); the main solve
stops at ``solver_node_limit`` branch-and-bound nodes, the refinement at ``refine_node_limit``. A
node-limited solve returns its incumbent, the same one on every run.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass import _core
from alpa_pass.errors import OptionError
from alpa_pass.solve.highs import SolveOptions, solve_ilp


def _frustrated_ilp():
    """A complete graph of 8 groups x 3 strategies, random costs: HiGHS cannot finish in one node."""
    rng = np.random.default_rng(0)
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
        SolveOptions(time_limit_s=5.0, node_limit=None, eliminate_chains=True)


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
])
def test_limit_options_are_validated(field, value):
    with pytest.raises(OptionError, match=field):
        ap.AutoShardingOption(**{field: value})
