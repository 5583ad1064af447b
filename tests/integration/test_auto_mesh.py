"""``ShardParallel(mesh="auto")``: every logical shape of the 8 devices is planned, the cheapest kept
(the 3-axis shape too: tests/integration/test_mesh_3d.py has its ILP size and numerics)."""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import alpa_pass as ap
from tests import helpers
from zoo import default_optimizer, gpt, init_state, mlp

SHAPES = [[1, 8], [2, 4], [4, 2], [8, 1], [2, 2, 2]]


def _mlp_args(config):
    state = init_state(mlp.init(jax.random.key(0), config), default_optimizer())
    return state, mlp.make_batch(jax.random.key(1), config)


def _plan(step_fn, args, mesh, option=ap.AutoShardingOption()):
    return ap.parallelize(step_fn, method=ap.ShardParallel(mesh=mesh, option=option)).plan(*args)


@pytest.fixture(scope="module")
def mlp_auto():
    config = mlp.Config(num_layers=2, hidden=256, batch=16)
    step_fn, args = mlp.make_train_step(default_optimizer()), _mlp_args(config)
    exe = ap.parallelize(step_fn, method=ap.ShardParallel(mesh="auto")).get_executable(*args)
    return step_fn, args, exe


def _gpt_step_and_args():
    config, optimizer = gpt.Config(layers=2), default_optimizer()
    state = init_state(gpt.init(jax.random.key(0), config), optimizer)
    return gpt.make_train_step(optimizer, config), (state, gpt.make_batch(jax.random.key(1), config))


def test_auto_keeps_the_cheapest_shape_and_records_all(mlp_auto):
    _, _, exe = mlp_auto
    plan = exe.plan
    search = plan.mesh_search
    assert [e["shape"] for e in search] == SHAPES
    objectives = [e["objective"] for e in search]
    assert plan.objective == min(objectives)
    first_best = SHAPES[objectives.index(min(objectives))]
    assert list(plan.mesh.shape) == first_best
    # 8x1 is 1x8 relabelled; 4x2 is not 2x4 relabelled (a dim split over both axes tiles the other
    # way round, other collective-permutes), so it is solved
    assert [e.get("same_as") for e in search] == [None, None, None, [1, 8], None]
    assert all(e["solve_s"] > 0 for e in search if not e.get("same_as"))
    assert [e.get("cut_off") for e in search] == [False, search[1]["objective"] >= search[0]["objective"],
                                                  search[2]["objective"] >= min(objectives[:2]), None,
                                                  search[4]["objective"] >= min(objectives[:4])]
    assert "mesh_search" in plan.timings and "mesh search: 1x8" in plan.summary()
    assert exe.input_shardings[0].mesh.devices.shape == plan.mesh.shape


def test_search_objectives_match_plans_made_for_each_shape(mlp_auto):
    """Each shape's recorded objective is what planning that mesh alone gives; the permuted shape
    the search does not solve (8x1) really poses the same ILP as 1x8."""
    step_fn, args, exe = mlp_auto
    for entry in exe.plan.mesh_search:
        alone = _plan(step_fn, args, ap.LogicalMesh(shape=tuple(entry["shape"])))
        assert alone.objective == pytest.approx(entry["objective"], rel=1e-6), entry["shape"]


def test_auto_executable_computes_the_step(mlp_auto):
    step_fn, args, exe = mlp_auto
    (state, loss), (ref_state, (ref_loss,)) = exe(*args), helpers.reference_run(step_fn, args[0], [args[1]])
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref_state)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_auto_search_reads_every_shape_from_the_cache(mlp_auto, tmp_path):
    step_fn, args, exe = mlp_auto
    option = ap.AutoShardingOption(plan_cache_dir=str(tmp_path))
    first = _plan(step_fn, args, "auto", option)
    assert [e["origin"] for e in first.mesh_search] == ["solver"] * 5
    # 1x8, 2x4, 4x2, 2x2x2 are solved (8x1 is not); a solve cut off by the bound is no optimum
    # and is not cached, so it is solved (and cut off) again
    solved = [e for e in first.mesh_search if "same_as" not in e]
    cut = [bool(e.get("cut_off")) for e in first.mesh_search]
    assert len(solved) == 4 and len(list(tmp_path.iterdir())) == sum(not e.get("cut_off") for e in solved)
    second = _plan(step_fn, args, "auto", option)
    assert [e["origin"] for e in second.mesh_search] == [
        "solver" if c or (e.get("same_as") and _cut_twin(first, e)) else "cache"
        for e, c in zip(first.mesh_search, cut)]
    assert second.mesh.shape == first.mesh.shape == exe.plan.mesh.shape
    assert second.node_specs == first.node_specs
    assert [e["objective"] for e in second.mesh_search] == [e["objective"] for e in first.mesh_search]


def _cut_twin(plan, entry) -> bool:
    """Whether the solved shape a "same_as" entry repeats was cut off."""
    return any(e.get("cut_off") for e in plan.mesh_search if e["shape"] == entry["same_as"])


@pytest.mark.slow
def test_gpt_auto_search_records_a_finite_objective_for_2x2x2():
    step_fn, args = _gpt_step_and_args()
    plan = _plan(step_fn, args, "auto")
    search = plan.mesh_search
    assert [e["shape"] for e in search] == SHAPES
    cube = search[4]
    assert cube.get("error") is None and math.isfinite(cube["objective"]) and cube["mip_gap"] >= 0
    assert plan.objective == min(e["objective"] for e in search)
    # With the vocab-parallel lookup and loss (gather.cc), 2x4 plans at 145,570 and 2x2x2 at 145,699
    # of communication, 145,983 and 146,111 with their compute (1e-4 per FLOP: 413 each)
    # (its own optimum: planned alone on 2x2x2 the same), so the cube's solve is cut off by 2x4's
    # bound and still records that finite objective. (Before them 2x2x2's 147,944 was below 2x4's
    # 148,196 and the search kept the cube; while a residual add followed the residual stream,
    # ``pick_leader``, 2x2x2's optimum was 184,156 against 2x4's 150,521.)
    # Since session 48 each shape's plan is refined unmerged (262k columns, above the old 200k cap):
    # 2x4 145,983 -> 136,980, 4x2 -> 136,206 (chosen), 1x8 193,926; the cube, bounded by 4x2's, is
    # cut off at 4x2's objective.
    assert cube["cut_off"] and cube["objective"] >= search[2]["objective"] * (1 - 1e-9)
    assert plan.mesh.shape == (4, 2) and plan.objective == search[2]["objective"] < search[1]["objective"]
    assert plan.refinement["solve"] == "unmerged"
    assert "4x2 136206 (chosen)" in plan.summary() and "2x2x2 136206 (cut off)" in plan.summary(), plan.summary()
