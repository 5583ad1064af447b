"""Gathers and scatters indexed by an iota over the batch, written with batching dims.

The planner reads ``x[jnp.arange(B), labels]`` as a gather batched over ``B``
(:mod:`alpa_pass.extract.iota_indices`) and may split ``x``'s batch dim with the labels'. XLA's
partitioner, given the op as jax wrote it (the iota a component of the index vector, behind jax's
negative-index wrap), partitioned it as a lookup into a split table: each device gathered, masked,
and the results were all-reduced, or the table was all-gathered (mctx's search: the tree's
[256, 17, 8] children table all-gathered and its embeddings all-reduced in every simulation).

Input IR state: a Shardy module after :func:`alpa_pass.emit.constraints.insert_constraints`.
Output IR state: every ``stablehlo.gather`` / ``stablehlo.scatter`` (one input) with such index
components has them as batching dim pairs (``operand_batching_dims`` /
``start_indices_batching_dims``, ``input_batching_dims`` / ``scatter_indices_batching_dims``, as
``jax.vmap`` writes a batched gather) and reads the other components only (slices of its indices,
concatenated); the same values.
"""
from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from alpa_pass.emit.constraints import verify_module
from alpa_pass.extract.iota_indices import batched_numbers, shape_of


def batch_iota_indexing(module: ir.Module) -> int:
    """Rewrite every matching gather and scatter of ``module`` (module docstring); returns how many.
    Raises EmitError when the module does not verify afterwards."""
    ops = []
    for top in module.body.operations:
        _collect(top.operation, ops)
    count = 0
    with module.context:
        for op in ops:
            with ir.Location.unknown():
                count += _rewrite(op)
    if count:
        verify_module(module, "batching iota-indexed gathers")
    return count


def _collect(op, out: list) -> None:
    if op.name == "stablehlo.gather" or (op.name == "stablehlo.scatter" and len(op.operands) == 3):
        out.append(op)
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                _collect(inner.operation, out)


def _rewrite(op) -> int:
    gather = op.name == "stablehlo.gather"
    key = "dimension_numbers" if gather else "scatter_dimension_numbers"
    dn = (stablehlo.GatherDimensionNumbers if gather else stablehlo.ScatterDimensionNumbers)(op.attributes[key])
    numbers = (dn.start_index_map, dn.collapsed_slice_dims, dn.operand_batching_dims, dn.start_indices_batching_dims) \
        if gather else (dn.scattered_dims_to_operand_dims, dn.inserted_window_dims, dn.input_batching_dims,
                        dn.scatter_indices_batching_dims)
    batched = batched_numbers(op.operands[1], dn.index_vector_dim, *numbers, shape_of(op.operands[0]))
    if batched is None:
        return 0
    kept, picked, index_map, batching, indices_batching = batched
    with ir.InsertionPoint(op):
        op.operands[1] = _components(op.operands[1], dn.index_vector_dim, kept)
    if gather:
        op.attributes[key] = stablehlo.GatherDimensionNumbers.get(
            offset_dims=list(dn.offset_dims), collapsed_slice_dims=picked, operand_batching_dims=batching,
            start_indices_batching_dims=indices_batching, start_index_map=index_map,
            index_vector_dim=dn.index_vector_dim)
    else:
        op.attributes[key] = stablehlo.ScatterDimensionNumbers.get(
            update_window_dims=list(dn.update_window_dims), inserted_window_dims=picked,
            input_batching_dims=batching, scatter_indices_batching_dims=indices_batching,
            scattered_dims_to_operand_dims=index_map, index_vector_dim=dn.index_vector_dim)
    return 1


def _components(indices, dim: int, kept: list[int]):
    """The index components ``kept`` of ``indices`` (along ``dim``), concatenated in order."""
    t = ir.RankedTensorType(indices.type)
    parts = []
    for j in kept:
        start, limit = [0] * t.rank, list(t.shape)
        start[dim], limit[dim] = j, j + 1
        parts.append(stablehlo.SliceOp(indices, ir.DenseI64ArrayAttr.get(start), ir.DenseI64ArrayAttr.get(limit),
                                       ir.DenseI64ArrayAttr.get([1] * t.rank)).result)
    if len(parts) == 1:
        return parts[0]
    return stablehlo.ConcatenateOp(parts, ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim)).result
