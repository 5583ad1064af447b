"""Index components that count along a dim: ``x[jnp.arange(B), labels]`` is a batched gather.

jax lowers ``x[jnp.arange(B), labels]`` (RL's ``q[jnp.arange(B), actions]``, mctx's
``tree.embeddings[batch_range, node]``, jax 0.10's ``take_along_axis``) and the scatter of its
gradient to ops whose index vectors concatenate an ``iota`` over the batch with the labels: row b
reads row b of ``x``. Read literally, ``x``'s batch dim is indexed at run time, so the sharding
rules could not split it with the batch (the gather ran vocab-parallel or replicated, and a
model's whole per-example state with it). Such a component is a batching pair, as ``jax.vmap``
writes it (``operand_batching_dims`` / ``start_indices_batching_dims``): operand dim ``o`` (one
index picked, slice size 1, as long as the iota) with indices dim ``d``. The planner reads it so;
emission writes it so (``emit.batched_indexing``: XLA's partitioner did not see the iota through
jax's negative-index wrap and all-gathered or all-reduced such gathers inside mctx's search loops).
"""
from __future__ import annotations

from jaxlib.mlir import ir


def batched_numbers(indices, index_vector_dim: int, index_map, picked, batching, indices_batching,
                    operand_shape):
    """The dimension numbers of a gather (scatter) with its iota components as batching pairs:
    ``(kept components, picked dims left, index map of the kept components, operand batching dims,
    indices batching dims)`` (pairs sorted by operand dim), or None when there is no such
    component or no other (``picked``: the collapsed or inserted operand dims)."""
    found = batching_components(indices, index_vector_dim, index_map, picked, operand_shape)
    kept = [j for j in range(len(index_map)) if j not in {j for j, _, _ in found}]
    if not found or not kept:
        return None
    pairs = sorted([*zip(batching, indices_batching), *((o, d) for _, o, d in found)])
    return (kept, [int(d) for d in picked if d not in {o for _, o, _ in found}], [int(index_map[j]) for j in kept],
            [int(o) for o, _ in pairs], [int(d) for _, d in pairs])


def batching_components(indices, index_vector_dim: int, index_map, picked,
                        operand_shape) -> list[tuple[int, int, int]]:
    """``(component j, operand dim o, indices dim d)`` for each index component that is an iota
    along indices dim ``d`` and picks one element (``o = index_map[j]`` in ``picked``: collapsed or
    inserted) of an operand dim as long as ``d``."""
    ishape = shape_of(indices)
    out = []
    for j, d in _iota_components(indices, index_vector_dim).items():
        o = int(index_map[j]) if j < len(index_map) else -1
        if o in picked and operand_shape[o] == ishape[d] > 1:
            out.append((j, o, d))
    return out


def _iota_components(indices, index_vector_dim: int) -> dict[int, int]:
    """{component j: indices dim d} for the index components that are an iota along ``d``."""
    shape = shape_of(indices)
    if index_vector_dim == len(shape):  # scalar indices: one component, the tensor itself
        d = iota_dim(indices)
        return {} if d is None else {0: d}
    owner = defining_op(_unconstrained(indices))
    parts = [indices]
    if owner is not None and owner.name == "stablehlo.concatenate" and \
            int(ir.IntegerAttr(owner.attributes["dimension"]).value) == index_vector_dim:
        parts = list(owner.operands)
    out, j = {}, 0
    for part in parts:
        n = shape_of(part)[index_vector_dim]
        d = iota_dim(part) if n == 1 else None
        if d is not None and d != index_vector_dim:
            out[j] = d
        j += n
    return out


def iota_dim(value) -> int | None:
    """The dim ``d`` along which ``value`` holds its own index (``value[..., i_d, ...] == i_d``):
    an ``iota`` seen through converts, broadcasts, size-1 reshapes and jax's negative-index wrap
    ``select(x < 0, x + n, x)``; else None."""
    o = defining_op(_unconstrained(value))
    if o is None:
        return None
    name = o.name
    if name == "stablehlo.iota":
        return int(ir.IntegerAttr(o.attributes["iota_dimension"]).value)
    if name == "stablehlo.convert":
        return iota_dim(o.operands[0]) if _integer(o.operands[0]) and _integer(o.results[0]) else None
    if name == "stablehlo.broadcast_in_dim":
        k = iota_dim(o.operands[0])
        if k is None:
            return None
        dims = [int(x) for x in o.attributes["broadcast_dimensions"]]
        return dims[k] if shape_of(o.operands[0])[k] == shape_of(o.results[0])[dims[k]] else None
    if name == "stablehlo.reshape":
        k = iota_dim(o.operands[0])
        src, dst = shape_of(o.operands[0]), shape_of(o.results[0])
        big_src = [i for i, n in enumerate(src) if n != 1]
        big_dst = [i for i, n in enumerate(dst) if n != 1]
        if k is None or k not in big_src or [src[i] for i in big_src] != [dst[i] for i in big_dst]:
            return None
        return big_dst[big_src.index(k)]
    if name == "stablehlo.select" and _wraps_negative(o):
        return iota_dim(o.operands[2])
    return None


def _wraps_negative(select) -> bool:
    """``select(compare(LT, x, 0), add(x, c), x)``: what jax makes of an index that may be negative
    (an iota never is, so the select is ``x``)."""
    pred, _, x = select.operands
    cmp = defining_op(_unconstrained(pred))
    if cmp is None or cmp.name != "stablehlo.compare" or "LT" not in str(cmp.attributes["comparison_direction"]):
        return False
    return _unconstrained(cmp.operands[0]) == _unconstrained(x) and _is_zero(cmp.operands[1])


def _unconstrained(value):
    """``value`` before the sharding constraints emission put on it."""
    while (o := defining_op(value)) is not None and o.name == "sdy.sharding_constraint":
        value = o.operands[0]
    return value


def _is_zero(value) -> bool:
    o = defining_op(_unconstrained(value))
    if o is not None and o.name == "stablehlo.broadcast_in_dim":
        o = defining_op(_unconstrained(o.operands[0]))
    if o is None or o.name != "stablehlo.constant":
        return False
    attr = ir.DenseElementsAttr(o.attributes["value"])
    return _integer(o.results[0]) and attr.is_splat and int(ir.IntegerAttr(attr.get_splat_value()).value) == 0


def shape_of(value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(value.type).shape)


def _integer(value) -> bool:
    return isinstance(ir.RankedTensorType(value.type).element_type, ir.IntegerType)


def defining_op(value):
    """The op that defines ``value``, or None for a block argument."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.OpView) else owner if isinstance(owner, ir.Operation) else None
