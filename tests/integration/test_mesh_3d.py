"""3-axis meshes (2x2x2) on the test GPT: two-block specs (docs/core_api.md "Spec enumeration")
keep the ILP small, and the plan computes what single-device jax.jit computes."""
from __future__ import annotations

import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass import _core
from alpa_pass.extract.stablehlo import extract_graph
from alpa_pass.driver.planning import core_graph
from alpa_pass.solve import eliminate
from alpa_pass.trace.lower import lower
from tests import helpers
from zoo import gpt, setup


def _gpt_setup(steps=1):
    return setup(gpt, gpt.Config(layers=2), steps)


def test_gpt_ilp_on_2x2x2_is_small():
    """Every spec gave 823,627 columns (64 specs per rank-3 tensor, 124 per attention dot) whose
    root LP did not finish in 60 s; two-block specs give 156,643, of which HiGHS solves the exact
    reduction's 108,891 (ties substituted, chains eliminated, equal cost rows merged). 2x4 is not
    pruned: 50,481. With the vocab-split lookup and embedding gradient (gather.cc, scatter.cc):
    164,136 columns, 107,673 solved; the largest group is the embedding gradient's scatter, 4^3 = 64
    per-axis choices and 27 with the vocabulary split on one axis and the others all used."""
    step_fn, state, (batch,) = _gpt_setup()
    graph = extract_graph(lower(step_fn, (state, batch)).compiler_ir("stablehlo"))
    sizes = {}
    for shape in [(2, 2, 2), (2, 4)]:
        mesh = ap.LogicalMesh(shape=shape).to_core()
        prob = _core.build_sharding_problem(core_graph(graph), mesh, ap.AutoShardingOption().to_core(), [])
        sizes[shape] = (prob.ilp.num_cols, int(np.diff(prob.ilp.group_var_start).max()))
        if shape == (2, 2, 2):  # what HiGHS solves: the exact reduction (solve.eliminate)
            reduced = eliminate.reduce(prob.ilp).model
            sizes["solved"] = (reduced.num_cols, reduced.num_rows)
    assert sizes[(2, 2, 2)][0] < 170_000 and sizes[(2, 2, 2)][1] <= 64 + 27
    assert sizes["solved"][0] < 112_000 and sizes["solved"][1] < 8_400  # 108,891 x 8,085
    assert sizes[(2, 4)][1] <= 24  # 2-D meshes keep every spec: (rank + 1)^2 at most, dots 24


@pytest.mark.slow
def test_gpt_on_2x2x2_matches_single_device():
    step_fn, state, batches = _gpt_setup(steps=2)
    ref = helpers.reference_run(step_fn, state, batches)
    step = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 2, 2))))
    run = helpers.run_steps(step, state, batches)
    plan = step.get_executable(run[0], batches[0]).plan
    assert plan.mesh.shape == (2, 2, 2) and step.num_plans == 1
    # (the unmerged refinement's plan, from its LP-support path: refined on "auto" since session 48)
    assert plan.refinement["solve"] == "unmerged" and plan.solver_status == "LP-support plan", plan.refinement
    used = {a for spec in plan.node_specs for a, d in enumerate(spec) if d >= 0}
    assert used == {0, 1, 2}
    helpers.assert_same_run(ref, run, rtol=1e-5, atol=1e-6)
