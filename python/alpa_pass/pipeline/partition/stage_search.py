"""Auto stages: cost every (layer range, submesh, logical mesh) with the intra-op planner, then run
the C++ stage-submesh DP (minimise sum of stage latencies + (micro-batches - 1) * the largest).

Latency of a candidate stage = ``compute_cost_per_flop`` x the per-device FLOPs of its forward and
backward (as the intra-op plan splits them) + the plan's communication and resharding; with a
measured profile (``AutoShardingOption.profile``) the plan's compute, communication and
resharding, all in seconds (``AutoStageOption.compute_cost_per_flop`` is then not used). Memory per
device = (4 x parameter bytes + micro-batches x activation bytes) / devices (parameters, gradients,
two optimizer moments; activations of every micro-batch in flight, GPipe's worst case).
"""
from __future__ import annotations

import itertools

import jax
import numpy as np

from alpa_pass import _core
from alpa_pass.driver.jit import make_plan
from alpa_pass.pipeline.partition import stages as stage_mod
from alpa_pass.errors import InfeasibleError, MeshError
from alpa_pass.pipeline.partition.layers import eqn_flops, var_bytes
from alpa_pass.pipeline.programs.stage import StageFunctions, build_programs


def submesh_choices(cluster, option=None) -> list[tuple[int, int]]:
    """The submeshes of ``option.submesh_physical_shape_space`` (default "all": ``(1, c)`` for
    every ``c`` dividing the row length, then ``(r, cols)`` for r = 2..rows)."""
    rows, cols = stage_mod.cluster_grid(cluster)
    space = "all" if option is None else option.submesh_physical_shape_space
    if space == "manual":
        for shape in option.manually_specified_submeshes:
            if shape != stage_mod.submesh_shape(cluster, shape[0] * shape[1]):  # (MeshError if none fits)
                raise MeshError(f"AutoStageOption.manually_specified_submeshes: {shape} is not a submesh of the "
                                f"{rows} x {cols} cluster; use (1, c) with c dividing {cols}, or (r, {cols})")
        return list(option.manually_specified_submeshes)
    if space == "all":
        return [(1, c) for c in range(1, cols + 1) if cols % c == 0] + [(r, cols) for r in range(2, rows + 1)]
    top = rows if space == "power_of_two" else min(rows, 4)
    return [(1, c) for c in _powers_of_two(cols) if cols % c == 0] + [(r, cols) for r in _powers_of_two(top) if r > 1]


def _powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if 1 << k <= limit]


def logical_choices(physical, mode: str, host_devices: int | None = None) -> list[tuple[int, int]]:
    """The logical shapes tried on a submesh: every factorisation ``(a, n / a)`` ("all"), those
    with ``n / a <= host_devices`` ("single_node_model_parallel"), or the physical shape."""
    n = physical[0] * physical[1]
    if mode == "same":
        return [tuple(physical)]
    limit = n if mode == "all" or host_devices is None else host_devices
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0 and n // a <= limit]


def balanced(layer_flops, i: int, j: int, devices: int, total_devices: int, tolerance: float) -> bool:
    """Alpa's ``stage_imbalance_tolerance``: whether layers [i, j]'s share of the FLOPs is within a
    factor ``1 + tolerance`` of the submesh's share of the devices."""
    if tolerance == float("inf"):
        return True
    total = float(sum(layer_flops)) or 1.0
    flops, share = float(sum(layer_flops[i:j + 1])) / total, devices / total_devices
    return flops / (1 + tolerance) <= share <= flops * (1 + tolerance)


def candidate_program(loss, layers, i: int, j: int, diff_mask):
    """The StageProgram of layers [i, j] (inclusive) as one stage between the others."""
    ranges = [r for r in ((0, i), (i, j + 1), (j + 1, len(layers))) if r[0] < r[1]]
    return build_programs(loss, layers, ranges, diff_mask)[ranges.index((i, j + 1))]


def stage_cost(traced, program, mesh, method) -> float:
    """Predicted latency of one candidate stage (forward + backward) on ``mesh``."""
    fns = StageFunctions(program, dict(zip(traced.loss.jaxpr.constvars, traced.loss.consts)))
    marker = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in traced.loss.jaxpr.invars]
    ins = [marker[program.sources[v][1]] if program.sources[v][0] == "arg" else
           jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in (*program.diff_inputs, *program.nondiff_inputs)]
    n = len(program.diff_inputs)

    def train(*flat):
        outs, vjp_fn, ints = jax.vjp(lambda *d: fns._run(d, flat[n:len(ins)]), *flat[:n], has_aux=True)
        return outs, ints, vjp_fn(tuple(flat[len(ins):]))

    cts = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in program.float_outputs]
    plan, _, _ = make_plan(train, tuple(ins + cts), mesh, method.option)
    comm = plan.predicted["communication"] + plan.predicted["resharding"]
    if plan.made_with["options"]["profile"] is not None:  # measured: compute is in seconds already
        return plan.predicted["compute"] + comm
    flops = plan.predicted["compute"] / max(method.option.compute_cost_per_flop, 1e-30)
    return method.stage_option.compute_cost_per_flop * flops + comm


def stage_memory(program, num_micro: int, devices: int) -> float:
    params = sum(var_bytes(v) for v in program.param_inputs)
    acts = sum(var_bytes(v) for e in program.eqns for v in e.outvars)
    return (4 * params + num_micro * acts) / devices


def cost_table(traced, layers, cluster, method):
    """cost[i, j, k] (+inf where infeasible), the best logical shape per entry, and the choices."""
    option = method.stage_option
    choices = submesh_choices(cluster, option)
    devices = stage_mod.cluster_devices(cluster)
    host_devices = stage_mod.cluster_grid(cluster)[1]
    layer_flops = [sum(eqn_flops(e) for e in layer) for layer in layers]
    L = len(layers)
    cost = np.full((L, L, len(choices)), np.inf)
    logical = {}
    for i, j in itertools.combinations_with_replacement(range(L), 2):
        prog = candidate_program(traced.loss, layers, i, j, traced.info.diff_mask)
        for k, phys in enumerate(choices):
            n = phys[0] * phys[1]
            budget = option.memory_budget_per_device
            if budget is not None and stage_memory(prog, method.num_micro_batches, n) > budget:
                continue
            if not balanced(layer_flops, i, j, n, len(devices), option.stage_imbalance_tolerance):
                continue
            for shape in logical_choices(phys, option.submesh_logical_shapes, host_devices):
                mesh = stage_mod.logical_mesh(cluster, phys, shape, devices[:n])
                c = stage_cost(traced, prog, mesh, method)
                if c < cost[i, j, k]:
                    cost[i, j, k], logical[(i, j, k)] = c, shape
    return cost, logical, choices


def auto_stages(traced, layers, cluster, method) -> list:
    """StageSpecs chosen by the stage-submesh DP."""
    cost, logical, choices = cost_table(traced, layers, cluster, method)
    sizes = np.array([p[0] * p[1] for p in choices], np.int64)
    try:
        _, _, picked = _core.stage_dp(cost, sizes, cluster.num_devices, method.num_micro_batches)
    except ValueError as e:
        option = method.stage_option
        raise InfeasibleError(
            f"AutoStageOption: no stages cover the {len(layers)} layers on the {cluster.num_devices} devices with "
            f"submeshes {choices} (memory_budget_per_device={option.memory_budget_per_device}, "
            f"stage_imbalance_tolerance={option.stage_imbalance_tolerance}); raise the budget or the "
            f"tolerance, or widen submesh_physical_shape_space ({e})") from e
    return stage_mod.carve(cluster, [(a, b) for a, b, _ in picked], [choices[k] for _, _, k in picked],
                           [logical[(a, b - 1, k)] for a, b, k in picked])
