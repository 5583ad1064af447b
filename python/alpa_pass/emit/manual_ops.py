"""Ops XLA's SPMD partitioner replicates whatever their sharding, run per shard in a manual region.

XLA partitions ``stablehlo.fft`` only when it is a complex FFT of rank >= 3 split on its last dim
over every device (``SpmdPartitioningVisitor::HandleFft``); any other sharding, a batch split
included, is replicated: the operand all-gathered, the whole FFT computed on every device, the
result sliced. ``chlo.top_k`` (``jax.lax.top_k``, an MoE router's) becomes XLA's ``TopK`` custom
call, replicated the same way (a 512-token router on 2x4: the TopK on all 512 rows after an
all-gather). Both map their leading (batch) dims elementwise (``extract.op_table``), so the plan
may split them: each such op is wrapped in an ``sdy.manual_computation`` over the axes that split
it (what ``shard_map`` lowers to), and every device computes its own batch shard.

Input IR state: constraints inserted (``emit.constraints``): a planned op's first result is
constrained (``sdy.sharding_constraint``) to its planned sharding. Output IR state: each such op
whose constraint splits batch dims only (full axes, evenly, on every operand and result) computes
inside ``sdy.manual_computation(operands) in_shardings=[S, ...] out_shardings=[S, ...]
manual_axes={its axes}`` with local shapes.
"""
from __future__ import annotations

import math

from jaxlib.mlir import ir

from alpa_pass.emit.accumulation import constraint_dims
from alpa_pass.emit.constraints import mesh_axes

def _fft_whole(op) -> int:
    return len(ir.DenseI64ArrayAttr(op.attributes["fft_length"]))


# op name -> how many trailing dims it computes over (they stay whole; the leading ones are batch)
MANUAL_OPS = {"stablehlo.fft": _fft_whole, "chlo.top_k": lambda op: 1}


def wrap_manual_ops(module: ir.Module, mesh_name: str) -> int:
    """Wrap every batch-split op of ``MANUAL_OPS`` in ``module`` in a manual computation; returns
    how many."""
    sizes = mesh_axes(module, mesh_name)
    found = []

    def visit(op):
        if op.name in MANUAL_OPS and len(op.results) >= 1:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    with module.context:
        return sum(_wrap(op, sizes, mesh_name) for op in found)


def _split_dims(op):
    """The per-dim axes a sharding constraint on ``op``'s first result gives it, or None."""
    for use in op.results[0].uses:
        user = use.owner
        if user.name == "sdy.sharding_constraint":
            return constraint_dims(user)
    return None


def _wrap(op, sizes: dict[str, int], mesh_name: str) -> bool:
    dims = _split_dims(op)
    if not dims or not any(dims):
        return False
    types = [ir.RankedTensorType(v.type) for v in (*op.operands, *op.results)]
    rank = len(dims)
    whole = MANUAL_OPS[op.name](op)
    if any(t.rank != rank for t in types) or any(dims[d] for d in range(rank - whole, rank)):
        return False  # a computed-over dim split: XLA's own handling (or its replication) decides
    split = [math.prod(sizes[a] for a in d) for d in dims]
    if any(n % s for t in types for n, s in zip(t.shape, split)):
        return False
    local = lambda t: ir.RankedTensorType.get([n // s for n, s in zip(t.shape, split)], t.element_type)  # noqa: E731
    used = {a for d in dims for a in d}
    one = "<@{m}, [{body}]>".format(m=mesh_name, body=", ".join("{" + ", ".join(f'"{a}"' for a in d) + "}"
                                                                 for d in dims))
    attrs = {
        "in_shardings": ir.Attribute.parse(f"#sdy.sharding_per_value<[{', '.join([one] * len(op.operands))}]>"),
        "out_shardings": ir.Attribute.parse(f"#sdy.sharding_per_value<[{', '.join([one] * len(op.results))}]>"),
        "manual_axes": ir.Attribute.parse("#sdy<manual_axes{" + ", ".join(
            f'"{a}"' for a in sizes if a in used) + "}>"),
    }
    results = list(op.results)
    with op.location:
        manual = ir.Operation.create("sdy.manual_computation", results=[r.type for r in results],
                                     operands=list(op.operands), attributes=attrs, regions=1,
                                     ip=ir.InsertionPoint(op))
        block = manual.regions[0].blocks.append(*(local(ir.RankedTensorType(v.type)) for v in op.operands),
                                                arg_locs=[op.location] * len(op.operands))
        for r, m in zip(results, manual.results):
            r.replace_all_uses_with(m)
        ret = ir.Operation.create("sdy.return", operands=results, ip=ir.InsertionPoint(block))
        op.move_before(ret)
        for i, arg in enumerate(block.arguments):
            op.operands[i] = arg
        for r in results:
            r.set_type(local(ir.RankedTensorType(r.type)))
    return True
