"""Ops XLA's SPMD partitioner replicates whatever their sharding, run per shard in a manual region.

XLA partitions ``stablehlo.fft`` only when it is a complex FFT of rank >= 3 split on its last dim
over every device (``SpmdPartitioningVisitor::HandleFft``); any other sharding, a batch split
included, is replicated: the operand all-gathered, the whole FFT computed on every device, the
result sliced. But an FFT maps its leading (batch) dims elementwise (``extract.op_table``), so
the plan may split them: each such FFT is wrapped in an ``sdy.manual_computation`` over the axes
that split it (what ``shard_map`` lowers to), and every device transforms its own batch shard.

Input IR state: constraints inserted (``emit.constraints``): a planned FFT's result is constrained
(``sdy.sharding_constraint``) to its planned sharding. Output IR state: each FFT whose constraint
splits batch dims only (full axes, evenly) computes inside ``sdy.manual_computation(operand)
in_shardings=[S] out_shardings=[S] manual_axes={its axes}`` with local shapes.
"""
from __future__ import annotations

import math

from jaxlib.mlir import ir

from alpa_pass.emit.accumulation import constraint_dims
from alpa_pass.emit.constraints import mesh_axes

MANUAL_OPS = frozenset({"stablehlo.fft"})


def wrap_manual_ops(module: ir.Module, mesh_name: str) -> int:
    """Wrap every batch-split FFT of ``module`` in a manual computation; returns how many."""
    sizes = mesh_axes(module, mesh_name)
    found = []

    def visit(op):
        if op.name in MANUAL_OPS and len(op.results) == 1:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    with module.context:
        return sum(_wrap(op, sizes, mesh_name) for op in found)


def _split_dims(op):
    """The per-dim axes a sharding constraint on ``op``'s result gives it, or None."""
    for use in op.results[0].uses:
        user = use.owner
        if user.name == "sdy.sharding_constraint":
            return constraint_dims(user)
    return None


def _wrap(op, sizes: dict[str, int], mesh_name: str) -> bool:
    dims = _split_dims(op)
    if not dims or not any(dims):
        return False
    out_type = ir.RankedTensorType(op.results[0].type)
    in_type = ir.RankedTensorType(op.operands[0].type)
    rank = out_type.rank
    transformed = len(ir.DenseI64ArrayAttr(op.attributes["fft_length"]))
    if len(dims) != rank or any(dims[d] for d in range(rank - transformed, rank)):
        return False  # a transformed dim split: XLA's distributed FFT (or its replication) decides
    split = [math.prod(sizes[a] for a in d) for d in dims]
    if any(n % s for n, s in zip(out_type.shape, split)) or any(n % s for n, s in zip(in_type.shape, split)):
        return False
    local = lambda t: ir.RankedTensorType.get([n // s for n, s in zip(t.shape, split)], t.element_type)  # noqa: E731
    used = {a for d in dims for a in d}
    per_value = "[<@{m}, [{body}]>]".format(
        m=mesh_name, body=", ".join("{" + ", ".join(f'"{a}"' for a in d) + "}" for d in dims))
    attrs = {
        "in_shardings": ir.Attribute.parse(f"#sdy.sharding_per_value<{per_value}>"),
        "out_shardings": ir.Attribute.parse(f"#sdy.sharding_per_value<{per_value}>"),
        "manual_axes": ir.Attribute.parse("#sdy<manual_axes{" + ", ".join(
            f'"{a}"' for a in sizes if a in used) + "}>"),
    }
    with op.location:
        manual = ir.Operation.create("sdy.manual_computation", results=[out_type], operands=[op.operands[0]],
                                     attributes=attrs, regions=1, ip=ir.InsertionPoint(op))
        block = manual.regions[0].blocks.append(local(in_type), arg_locs=[op.location])
        op.results[0].replace_all_uses_with(manual.results[0])
        ret = ir.Operation.create("sdy.return", operands=[op.results[0]], ip=ir.InsertionPoint(block))
        op.move_before(ret)
        op.operands[0] = block.arguments[0]
        op.results[0].set_type(local(out_type))
    return True
