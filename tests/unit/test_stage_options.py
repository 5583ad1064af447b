"""Alpa's ``AutoStageOption`` names: the submesh and logical-shape spaces the stage DP picks from,
``stage_imbalance_tolerance``, and the option names it takes and refuses."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import alpa_pass as ap
from alpa_pass.errors import InfeasibleError, MeshError, OptionError
from alpa_pass.pipeline.partition.stage_search import balanced, logical_choices, submesh_choices
from zoo.pipeline import make_heavy_layer_loss


@pytest.mark.parametrize("shape,space,expected", [
    ((2, 8), "all", [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8)]),
    ((3, 6), "all", [(1, 1), (1, 2), (1, 3), (1, 6), (2, 6), (3, 6)]),
    ((3, 6), "power_of_two", [(1, 1), (1, 2), (2, 6)]),
    ((8, 8), "power_of_two", [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8)]),
    ((8, 8), "small_power_of_two", [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]),
])
def test_submesh_spaces(shape, space, expected):
    option = ap.AutoStageOption(submesh_physical_shape_space=space)
    assert submesh_choices(ap.LogicalMesh(shape=shape), option) == expected


def test_manual_submeshes_are_checked_against_the_cluster():
    cluster = ap.LogicalMesh(shape=(2, 4))
    option = ap.AutoStageOption(submesh_physical_shape_space="manual", manually_specified_submeshes=[[1, 4], (2, 4)])
    assert submesh_choices(cluster, option) == [(1, 4), (2, 4)]
    with pytest.raises(MeshError, match=r"\(2, 2\) is not a submesh of the 2 x 4 cluster"):
        submesh_choices(cluster, dataclasses.replace(option, manually_specified_submeshes=((2, 2),)))
    with pytest.raises(ValueError, match="give both or neither"):
        ap.AutoStageOption(submesh_physical_shape_space="manual")


def test_logical_spaces():
    assert logical_choices((2, 8), "all", 8) == [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)]
    assert logical_choices((2, 8), "single_node_model_parallel", 8) == [(2, 8), (4, 4), (8, 2), (16, 1)]
    assert logical_choices((2, 8), "same", 8) == [(2, 8)]


def test_imbalance_tolerance_compares_flop_and_device_shares():
    flops = [1.0, 4.0, 1.0, 2.0]  # shares 1/8, 4/8, 1/8, 2/8
    assert balanced(flops, 1, 1, 4, 8, 0.0) and not balanced(flops, 0, 0, 4, 8, 0.0)
    assert balanced(flops, 0, 0, 2, 8, 1.0) and not balanced(flops, 0, 0, 4, 8, 1.0)  # 1/4 vs 1/8, 1/2 vs 1/8
    assert balanced(flops, 0, 0, 8, 8, float("inf"))


def test_alpa_option_names():
    same = ap.AutoStageOption(submesh_logical_shape_space="same_as_physical")
    assert same.submesh_logical_shapes == same.submesh_logical_shape_space == "same"
    assert same == ap.AutoStageOption(submesh_logical_shapes="same")
    # replace passes the fields, not Alpa's name of one of them: no "both names" error
    assert dataclasses.replace(same, submesh_logical_shapes="all").submesh_logical_shapes == "all"
    with pytest.raises(TypeError, match="not both"):
        ap.AutoStageOption(submesh_logical_shapes="same", submesh_logical_shape_space="all")
    for space in ("data_parallel_only", "model_parallel_only"):
        with pytest.raises(OptionError, match="forces the batch dim"):
            ap.AutoStageOption(submesh_logical_shape_space=space)
    for name in ("profiling_database_filename", "cached_profile_result"):
        with pytest.raises(OptionError, match="alpa-pass profile"):
            ap.AutoStageOption(**{name: "prof.pkl"})
    with pytest.raises(ValueError, match="submesh_physical_shape_space must be one of"):
        ap.AutoStageOption(submesh_physical_shape_space="powers")
    alpa_auto = ap.AutoStageOption(submesh_physical_shape_space="power_of_two", use_hlo_cost_model=False,
                                   submesh_logical_shape_space="single_node_model_parallel",
                                   stage_imbalance_tolerance=float("inf"), layer_profile_mode="composition")
    assert alpa_auto.submesh_logical_shapes == "single_node_model_parallel"
    assert isinstance(ap.PipeshardParallel(stage_option="uniform").stage_option, ap.UniformStageOption)


def _heavy_layer_stages(tolerance):
    from alpa_pass.pipeline.compile.pipeshard import micro_avals
    from alpa_pass.pipeline.partition.layers import manual_layers
    from alpa_pass.pipeline.partition.stage_search import auto_stages
    from alpa_pass.pipeline.trace.step import trace_step

    reps = (1, 4, 1, 1)  # layer 1: 4x the FLOPs of each other layer
    hidden, batch = 64, 4096
    params = [{"kernel": jax.ShapeDtypeStruct((hidden, hidden), jnp.float32)} for _ in reps]
    data = {"x": jax.ShapeDtypeStruct((batch, hidden), jnp.float32),
            "y": jax.ShapeDtypeStruct((batch, hidden), jnp.float32)}
    loss_fn = make_heavy_layer_loss(reps)
    step = lambda p, b: ap.grad(loss_fn)(p, b)  # noqa: E731
    cluster = ap.LogicalMesh(shape=(1, 8))
    method = ap.PipeshardParallel(mesh=cluster, num_micro_batches=8, stage_option=ap.AutoStageOption(
        submesh_logical_shapes="same", stage_imbalance_tolerance=tolerance))
    traced = trace_step(step, (params, data), (1,), lambda a, m: micro_avals(a, m, 8, "step"))
    return auto_stages(traced, manual_layers(traced.loss), cluster, method)


def test_zero_imbalance_tolerance_leaves_only_exact_shares():
    """A heavy layer between light ones on 8 devices: with tolerance 0 only the whole model on all 8
    devices has a FLOP share equal to its device share, so one stage; with tolerance 1 a split."""
    exact = _heavy_layer_stages(0.0)
    assert len(exact) == 1 and exact[0].mesh.num_devices == 8 and list(exact[0].layers) == list(range(5))
    loose = _heavy_layer_stages(1.0)
    assert len(loose) > 1 and sum(s.mesh.num_devices for s in loose) <= 8


def test_no_stage_fitting_the_budget_is_an_infeasible_error():
    with pytest.raises(InfeasibleError, match="raise the budget or the tolerance"):
        _infeasible()


def _infeasible():
    from alpa_pass.pipeline.compile.pipeshard import micro_avals
    from alpa_pass.pipeline.partition.layers import manual_layers
    from alpa_pass.pipeline.partition.stage_search import auto_stages
    from alpa_pass.pipeline.trace.step import trace_step

    params = [{"kernel": jax.ShapeDtypeStruct((64, 64), jnp.float32)} for _ in range(2)]
    data = {"x": jax.ShapeDtypeStruct((64, 64), jnp.float32), "y": jax.ShapeDtypeStruct((64, 64), jnp.float32)}
    loss_fn = make_heavy_layer_loss((1, 1))
    cluster = ap.LogicalMesh(shape=(1, 4), devices=tuple(jax.devices()[:4]))
    method = ap.PipeshardParallel(mesh=cluster, num_micro_batches=2, stage_option=ap.AutoStageOption(
        submesh_logical_shapes="same", memory_budget_per_device=1.0))
    traced = trace_step(lambda p, b: ap.grad(loss_fn)(p, b), (params, data), (1,),
                        lambda a, m: micro_avals(a, m, 2, "step"))
    auto_stages(traced, manual_layers(traced.loss), cluster, method)
