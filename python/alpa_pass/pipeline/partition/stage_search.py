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

from alpa_pass import _core, cost_profile
from alpa_pass.driver.jit import make_plan
from alpa_pass.pipeline.partition import stages as stage_mod
from alpa_pass.pipeline.partition.layers import var_bytes
from alpa_pass.pipeline.programs.stage import StageFunctions, build_programs


def submesh_choices(cluster) -> list[tuple[int, int]]:
    """(1, c) for every c dividing the row length, then (r, cols) for r = 2..rows."""
    rows, cols = stage_mod.cluster_grid(cluster)
    return [(1, c) for c in range(1, cols + 1) if cols % c == 0] + [(r, cols) for r in range(2, rows + 1)]


def logical_choices(physical, mode: str) -> list[tuple[int, int]]:
    n = physical[0] * physical[1]
    if mode == "same":
        return [tuple(physical)]
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


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
    if cost_profile.resolve(method.option.profile) is not None:  # measured: compute is in seconds already
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
    choices = submesh_choices(cluster)
    devices = stage_mod.cluster_devices(cluster)
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
            for shape in logical_choices(phys, option.submesh_logical_shapes):
                mesh = stage_mod.logical_mesh(cluster, phys, shape, devices[:n])
                c = stage_cost(traced, prog, mesh, method)
                if c < cost[i, j, k]:
                    cost[i, j, k], logical[(i, j, k)] = c, shape
    return cost, logical, choices


def auto_stages(traced, layers, cluster, method) -> list:
    """StageSpecs chosen by the stage-submesh DP."""
    cost, logical, choices = cost_table(traced, layers, cluster, method)
    sizes = np.array([p[0] * p[1] for p in choices], np.int64)
    _, _, picked = _core.stage_dp(cost, sizes, cluster.num_devices, method.num_micro_batches)
    return stage_mod.carve(cluster, [(a, b) for a, b, _ in picked], [choices[k] for _, _, k in picked],
                           [logical[(a, b - 1, k)] for a, b, k in picked])
