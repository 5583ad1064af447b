"""The one emission path: a Plan written into the module that will be compiled.

Input IR state: a Shardy module with the same ops as the one the plan's graph was extracted from,
lowered with the plan's input/output shardings (or given them by ``emit.entry_shardings``).
Output IR state: every call path with its own callee (``emit.calls``), every planned value
constrained (``emit.constraints``), resharded uses pinned
(``emit.targets.operand_targets``), gathers and scatters indexed by an iota over the batch given
batching dims (``emit.batched_indexing``), with ``prefer_reduce_scatter``, parameter-gradient partial
sums rewritten to explicit reduce-scatters (``emit.reduce_scatter``), and gradient accumulators of
top-level loops carried as per-shard partial sums, reduced once after the loop
(``emit.accumulation``). Every front door (the jit
adapter, the plugin's lowering hook, ``alpa-pass-opt --auto-shard``) calls :func:`emit_plan`.
"""
from __future__ import annotations

import logging

from jaxlib.mlir import ir

from alpa_pass.emit.accumulation import rewrite_accumulations
from alpa_pass.emit.batched_indexing import batch_iota_indexing
from alpa_pass.emit.calls import specialize_callees
from alpa_pass.emit.callbacks import replicate_branch_callbacks
from alpa_pass.emit.constraints import EmitReport, insert_constraints
from alpa_pass.emit.manual_ops import wrap_manual_ops
from alpa_pass.emit.reduce_scatter import locate_partial_sum_dots, rewrite_reduce_scatter
from alpa_pass.emit.targets import constraint_targets, operand_steps, operand_targets
from alpa_pass.extract.graph import OpGraph
from alpa_pass.options import AutoShardingOption

log = logging.getLogger("alpa_pass")


def emit_plan(module: ir.Module, graph: OpGraph, plan, option: AutoShardingOption, *,
              mesh_name: str = "mesh", name: str = "fn") -> EmitReport:
    """Write ``plan`` (for ``graph``, on ``plan.mesh``) into ``module`` in place; returns the
    report (``reduce_scattered``: how many partial sums became reduce-scatters; ``accumulators``:
    how many loop accumulators are reduced after their loop)."""
    mesh = plan.mesh
    graph = specialize_callees(module, graph)  # a shared callee's values differ per call path
    located = locate_partial_sum_dots(module, graph, plan, mesh) if option.prefer_reduce_scatter else []
    report = insert_constraints(module, graph, constraint_targets(graph, plan, mesh, option.emit), mesh_name,
                                operand_dim_shardings=operand_targets(graph, plan, mesh),
                                axis_order=tuple(plan.axis_order) or None,
                                operand_steps=operand_steps(graph, plan, mesh))
    report.batched_indexing = batch_iota_indexing(module)  # (x[arange(B), labels]: as planned, batched)
    report.manual_ops = wrap_manual_ops(module, mesh_name)  # (batch-split FFTs XLA would replicate)
    report.branch_callbacks = replicate_branch_callbacks(module, mesh_name)  # (an error path raises on all)
    if located:
        report.reduce_scattered = rewrite_reduce_scatter(module, located, mesh, mesh_name)
        log.info("%s: %d partial-sum dots reduce-scattered", name, report.reduce_scattered)
    if option.emit == "all":
        report.accumulators = rewrite_accumulations(module, mesh, mesh_name)
        if report.accumulators:
            log.info("%s: %d loop accumulators reduced after their loop", name, report.accumulators)
    return report
