"""Op name -> (OpKind, operands, attrs) rules, one small function per op family.

Each rule takes the MLIR operation and the node ids of its operands and returns one
``(kind, operand_ids, attrs)`` triple per result of the op (the attrs layouts are documented in
:mod:`alpa_pass.extract.graph`).  A rule returns ``None`` when the op is outside what its kind can
express (e.g. a bitcast_convert that changes the shape); the caller then makes it OPAQUE.

``RULES`` maps full op names to rules.  Op names absent from ``RULES`` (and rules returning
``None``) become OPAQUE nodes that the extractor counts as fallbacks.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Optional

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from alpa_pass.extract import iota_indices
from alpa_pass.extract.graph import OpKind

NodeSpec = tuple  # (OpKind, list[int] operand node ids, list[int] attrs)
Rule = Callable[[ir.Operation, list], Optional[list]]


def shape_of(value) -> tuple[int, ...]:
    """Static shape of a ranked tensor value (rank-0 -> ``()``)."""
    return tuple(ir.RankedTensorType(value.type).shape)


def _i64s(op, name: str) -> list[int]:
    """A DenseI64ArrayAttr / dense int elements attribute as a list; [] when absent."""
    if name not in op.attributes:
        return []
    return [int(x) for x in op.attributes[name]]


def _int(op, name: str, default: int = 0) -> int:
    return int(ir.IntegerAttr(op.attributes[name]).value) if name in op.attributes else default


def _each_result(kind: OpKind, operands: list, attrs: list, n: int) -> list:
    return [(kind, list(operands), list(attrs)) for _ in range(n)]


# ---- elementwise family -------------------------------------------------------------------


def _size_mismatch_dims(op) -> set:
    """Dims where an operand of the result's rank differs in size from result 0."""
    out = shape_of(op.results[0])
    dims = set()
    for v in op.operands:
        s = shape_of(v)
        if len(s) == len(out):
            dims.update(d for d in range(len(out)) if s[d] != out[d])
    return dims


def _elementwise_with(extra: Callable[[ir.Operation], set]) -> Rule:
    """Elementwise rule whose unshardable dims are size mismatches plus ``extra(op)``."""

    def rule(op, ins):
        dims = sorted(_size_mismatch_dims(op) | extra(op))
        return _each_result(OpKind.ELEMENTWISE, ins, dims, len(op.results))

    return rule


_elementwise = _elementwise_with(lambda op: set())


def _bitcast_convert(op, ins):
    if shape_of(op.operands[0]) != shape_of(op.results[0]):
        return None
    return [(OpKind.ELEMENTWISE, ins, [])]


def _pass_through(op, ins):
    """optimization_barrier and friends: result k follows operand k."""
    return [(OpKind.ELEMENTWISE, [ins[k]], []) for k in range(len(op.results))]


def _runtime_indexed(sliced_operand: int) -> Rule:
    """dynamic_slice (``sliced_operand`` 0: the result is the slice) and dynamic_update_slice (1:
    the update is the slice): ELEMENTWISE whose dims where the slice is smaller than operand 0
    are unshardable and runtime-indexed (``[-1, dims...]``; see cpp/include/alpa/unsafe_splits.h)."""

    def rule(op, ins):
        full = shape_of(op.operands[0])
        part = shape_of(op.results[0] if sliced_operand == 0 else op.operands[1])
        dims = [d for d in range(len(full)) if part[d] < full[d]]
        starts = [constant_ints(v) for v in op.operands[1 + sliced_operand:]]
        if all(s is not None and s.size == 1 for s in starts) and _in_range(
                [int(s.reshape(-1)[0]) for s in starts], full, part):
            return _each_result(OpKind.ELEMENTWISE, ins, dims, len(op.results))  # a static slice
        return _each_result(OpKind.ELEMENTWISE, ins, [-1] + dims if dims else [], len(op.results))

    return rule


def _pad_dims(op) -> set:
    lo, hi, interior = (_i64s(op, n) for n in ("edge_padding_low", "edge_padding_high",
                                               "interior_padding"))
    return {d for d in range(len(lo)) if lo[d] or hi[d] or interior[d]}


def _fft_dims(op) -> set:
    """An FFT transforms its trailing ``len(fft_length)`` dims; the leading (batch) dims are elementwise."""
    rank = len(shape_of(op.results[0]))
    return set(range(rank - len(_i64s(op, "fft_length")), rank))


def _window_dims(op) -> set:
    """Dims of a windowed op with a window, stride, dilation or padding other than trivial."""
    sizes = _i64s(op, "window_dimensions")
    dims = {d for d, s in enumerate(sizes) if s != 1}
    for name in ("window_strides", "base_dilations", "window_dilations"):
        dims |= {d for d, s in enumerate(_i64s(op, name)) if s != 1}
    pad = _i64s(op, "padding")
    dims |= {d for d in range(len(pad) // 2) if pad[2 * d] or pad[2 * d + 1]}
    return dims


def _reduce_window(op, ins):
    """Multi-input reduce_window: result k reads ``[input_k, init_k]``."""
    n = len(op.results)
    dims = sorted(_window_dims(op) | _size_mismatch_dims(op))
    return [(OpKind.ELEMENTWISE, [ins[k], ins[n + k]], dims) for k in range(n)]


def operand_index(op, result: int, t: int) -> int:
    """Which operand of ``op`` is graph operand ``t`` of the node of its result ``result``: of a
    multi-input reduce or reduce_window, result k reads ``[input_k, init_k]`` (a reduce's iota
    input: ``input_0``, see ``_reduce``); of other ops, operand ``t``."""
    if op.name not in ("stablehlo.reduce", "stablehlo.reduce_window"):
        return t
    if t == 1:
        return len(op.results) + result
    return 0 if op.name == "stablehlo.reduce" and result and _is_iota(op.operands[result]) else result


_SDY_RULE = re.compile(r"#sdy\.op_sharding_rule<\((.*?)\)->\((.*?)\)\s*\{[^}]*\}(.*)>$", re.S)
_SDY_FACTOR = re.compile(r"[a-z](_\d+)?")  # sdy names factors i, j, ..., z, z_1, ...; "ij": compound
_SDY_SPECIAL = re.compile(r"(?:reduction|need_replication|permutation|blocked_propagation)=\{([^}]*)\}")


def _sdy_rule(op):
    """(operand dims, result dims, special factors) of the ``sdy.sharding_rule`` jax attaches to a
    custom call (LAPACK / cuSOLVER calls, ``custom_partitioning`` ops with a ``sharding_rule``: jax's
    cuDNN attention): per tensor, per dim, its factor name (None: a compound dim); or None."""
    if "sdy.sharding_rule" not in op.attributes:
        return None
    m = _SDY_RULE.match(str(op.attributes["sdy.sharding_rule"]))
    if m is None:
        return None

    def tensors(text):
        return [[t if _SDY_FACTOR.fullmatch(t) else None for t in (x.strip() for x in body.split(",")) if t]
                for body in re.findall(r"\[([^\]]*)\]", text)]

    special = {f.strip() for group in _SDY_SPECIAL.findall(m.group(3)) for f in group.split(",") if f.strip()}
    return tensors(m.group(1)), tensors(m.group(2)), special


# Moves between memory spaces (remat's host-offload policies, ``jax.device_put`` to
# ``pinned_host``): the value itself, in whatever layout it has, on another memory.
_PLACEMENT_TARGETS = frozenset({"annotate_device_placement", "MoveToHost", "MoveToDevice"})


def _custom_call(op, ins):
    """A custom call whose factors jax declares (``sdy.sharding_rule``: its LAPACK / cuSOLVER calls,
    ``custom_partitioning`` ops with a rule), which XLA's partitioner runs per shard of them.
    ELEMENTWISE per result: the leading dims where every operand and result carries the same
    factor are batch dims (``-2, k``: shared with operands of any rank); a later dim is splittable
    where some operand carries its factor, every operand of the result's rank carries it there
    too, and it is no reduction / replication / permutation factor. A memory-space move: its
    operand's layout. Other custom calls: None."""
    target = op.attributes["call_target_name"] if "call_target_name" in op.attributes else None
    if target is not None and ir.StringAttr(target).value in _PLACEMENT_TARGETS and \
            [shape_of(v) for v in op.operands] == [shape_of(v) for v in op.results]:
        return _pass_through(op, ins)
    rule = _sdy_rule(op)
    if rule is None:
        return None
    operands, results, special = rule
    if len(operands) != len(op.operands) or len(results) != len(op.results):
        return None
    tensors = operands + results
    k = 0
    while all(len(t) > k and t[k] is not None and t[k] == tensors[0][k] and t[k] not in special for t in tensors):
        k += 1
    out = []
    for dims in results:
        rank = len(dims)
        whole = [d for d in range(k, rank) if dims[d] is None or dims[d] in special
                 or not any(dims[d] in t for t in operands)  # (computed whole, then sliced)
                 or any(len(t) == rank and t[d] != dims[d] for t in operands)]
        out.append((OpKind.ELEMENTWISE, list(ins), whole + ([-2, k] if k else [])))
    return out


# ---- shape-changing single-kind ops -------------------------------------------------------


def _broadcast_in_dim(op, ins):
    return [(OpKind.BROADCAST, ins, _i64s(op, "broadcast_dimensions"))]


def _broadcast_legacy(op, ins):
    """stablehlo.broadcast prepends ``broadcast_sizes`` dims to the operand."""
    k = len(_i64s(op, "broadcast_sizes"))
    rank = len(shape_of(op.operands[0]))
    return [(OpKind.BROADCAST, ins, [k + i for i in range(rank)])]


def _transpose(op, ins):
    return [(OpKind.TRANSPOSE, ins, _i64s(op, "permutation"))]


def _reshape(op, ins):
    return [(OpKind.RESHAPE, ins, [])]


def _reduce(op, ins):
    """Multi-input reduce: result k reads ``[input_k, init_k]``, or ``[input_0, init_k]`` where
    input_k is an iota: an argmax's indices are reduced with its values, in one layout (read
    apart, a plan could keep the indices whole beside split values at no cost, and XLA, which
    partitions the op once, gathers the indices it computes split)."""
    dims = _i64s(op, "dimensions")
    return [(OpKind.REDUCE, [ins[operand_index(op, k, 0)], ins[operand_index(op, k, 1)]], dims)
            for k in range(len(op.results))]


def _is_iota(value) -> bool:
    owner = iota_indices.defining_op(value)
    return owner is not None and owner.name == "stablehlo.iota"


def _generator(op, ins):
    return _each_result(OpKind.GENERATOR, [], [], len(op.results))


# ---- contractions and indexing ------------------------------------------------------------


def _counted(*lists) -> list[int]:
    out = []
    for xs in lists:
        out.append(len(xs))
        out.extend(int(x) for x in xs)
    return out


def _dot_general(op, ins):
    dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lb, rb = list(dn.lhs_batching_dimensions), list(dn.rhs_batching_dimensions)
    lc, rc = list(dn.lhs_contracting_dimensions), list(dn.rhs_contracting_dimensions)
    return [(OpKind.DOT, ins, [len(lb)] + lb + rb + [len(lc)] + lc + rc)]


def _dot_legacy(op, ins):
    """stablehlo.dot: contracts the lhs's last dim with the rhs's first dim, no batch dims."""
    lhs_rank = len(shape_of(op.operands[0]))
    return [(OpKind.DOT, ins, [0, 1, lhs_rank - 1, 0])]


def _convolution(op, ins):
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    isp, ksp, osp = (list(dn.input_spatial_dimensions), list(dn.kernel_spatial_dimensions),
                     list(dn.output_spatial_dimensions))
    attrs = ([dn.input_batch_dimension, dn.input_feature_dimension, len(isp)] + isp
             + [dn.kernel_input_feature_dimension, dn.kernel_output_feature_dimension] + ksp
             + [dn.output_batch_dimension, dn.output_feature_dimension] + osp
             + [_int(op, "feature_group_count", 1), _int(op, "batch_group_count", 1)])
    return [(OpKind.CONVOLUTION, ins[:2], attrs)]


def constant_ints(value) -> "np.ndarray | None":
    """The integers ``value`` holds when a constant expression computes it (a constant, and
    broadcast_in_dim / reshape / convert / concatenate of such: how jax builds the start indices
    of a static slice's gather or scatter), else None."""
    owner = value.owner
    name = getattr(owner, "name", None)
    if name == "stablehlo.constant":
        try:
            attr = ir.DenseIntElementsAttr(owner.attributes["value"])
        except ValueError:
            return None
        shape = shape_of(value)
        if attr.is_splat:
            return np.full(shape, int(attr.get_splat_value().value), dtype=np.int64)
        return np.array([int(v) for v in attr], dtype=np.int64).reshape(shape)
    if name not in ("stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.convert",
                    "stablehlo.concatenate") or len(shape_of(value)) > 1 or math.prod(shape_of(value)) > 64:
        return None
    parts = [constant_ints(v) for v in owner.operands]
    if any(p is None for p in parts):
        return None
    if name == "stablehlo.concatenate":
        return np.concatenate([p.reshape(shape_of(v)) for p, v in zip(parts, owner.operands)],
                              axis=_int(owner, "dimension"))
    if name == "stablehlo.broadcast_in_dim" and parts[0].size != 1:
        return None  # (only a scalar's broadcast: enough for the index vectors above)
    return np.broadcast_to(parts[0].reshape(-1)[0] if parts[0].size == 1 else parts[0], shape_of(value)).copy()


def _in_range(starts, full, part) -> bool:
    """Whether every start keeps its slice inside the operand (no clamping: the op is a slice)."""
    return len(starts) == len(full) and all(0 <= s <= f - p for s, f, p in zip(starts, full, part))


def _static_slice_gather(op, dn) -> bool:
    """A gather that is a static slice: one index vector, constant and in range, and every
    operand dim an offset dim in order (jax's ``x[:, :4]`` transposed from a scatter's update)."""
    operand, result, sizes = shape_of(op.operands[0]), shape_of(op.results[0]), _i64s(op, "slice_sizes")
    if (len(operand) != len(result) or list(dn.offset_dims) != list(range(len(result))) or dn.collapsed_slice_dims
            or dn.operand_batching_dims or len(shape_of(op.operands[1])) != 1 or dn.index_vector_dim != 0):
        return False
    idx = constant_ints(op.operands[1])
    if idx is None:
        return False
    starts = [0] * len(operand)
    for j, d in enumerate(dn.start_index_map):
        starts[d] = int(idx[j])
    return _in_range(starts, operand, sizes)


def _gather(op, ins):
    dn = stablehlo.GatherDimensionNumbers(op.attributes["dimension_numbers"])
    if _static_slice_gather(op, dn):
        full, part = shape_of(op.operands[0]), shape_of(op.results[0])
        return [(OpKind.ELEMENTWISE, ins[:1], [d for d in range(len(full)) if part[d] < full[d]])]
    numbers = (dn.start_index_map, dn.collapsed_slice_dims, dn.operand_batching_dims, dn.start_indices_batching_dims)
    batched = iota_indices.batched_numbers(op.operands[1], dn.index_vector_dim, *numbers, shape_of(op.operands[0]))
    index_map, collapsed, batching, indices_batching = numbers if batched is None else (
        batched[2], batched[1], batched[3], batched[4])
    attrs = [dn.index_vector_dim] + _counted(
        dn.offset_dims, collapsed, index_map, batching, indices_batching, _i64s(op, "slice_sizes"))
    return [(OpKind.GATHER, ins[:2], attrs)]


def _scatter(op, ins):
    if len(op.results) != 1:
        return None
    dn = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    numbers = (dn.scattered_dims_to_operand_dims, dn.inserted_window_dims, dn.input_batching_dims,
               dn.scatter_indices_batching_dims)
    batched = iota_indices.batched_numbers(op.operands[1], dn.index_vector_dim, *numbers, shape_of(op.operands[0]))
    index_map, inserted, batching, indices_batching = numbers if batched is None else (
        batched[2], batched[1], batched[3], batched[4])
    attrs = [dn.index_vector_dim] + _counted(dn.update_window_dims, inserted, index_map, batching, indices_batching)
    return [(OpKind.SCATTER, ins[:3], attrs)]


def opaque(op, ins):
    """Every result reads every operand (the OPAQUE fallback)."""
    return _each_result(OpKind.OPAQUE, ins, [], len(op.results))


# ---- the table ----------------------------------------------------------------------------

_ELEMENTWISE_OPS = """
abs cbrt ceil count_leading_zeros convert cosine exponential exponential_minus_one floor imag
is_finite log log_plus_one logistic not negate popcnt real round_nearest_afz round_nearest_even
rsqrt sign sine sqrt tan tanh reduce_precision add atan2 complex divide maximum minimum multiply
or and xor power remainder shift_left shift_right_arithmetic shift_right_logical subtract compare
select clamp slice fma
""".split()

_CHLO_ELEMENTWISE_OPS = """
acos acosh asin asinh atan atanh bessel_i1e conj cosh digamma erf erf_inv erfc is_inf
is_neg_inf is_pos_inf lgamma mulhi next_after polygamma sinh square tan zeta
""".split()

RULES: dict[str, Rule] = {
    **{f"stablehlo.{n}": _elementwise for n in _ELEMENTWISE_OPS},
    **{f"chlo.{n}": _elementwise for n in _CHLO_ELEMENTWISE_OPS},
    "sdy.sharding_constraint": _elementwise,
    "sdy.reshard": _elementwise,
    "sdy.propagation_barrier": _elementwise,
    "stablehlo.dynamic_slice": _runtime_indexed(0),
    "stablehlo.dynamic_update_slice": _runtime_indexed(1),
    "stablehlo.bitcast_convert": _bitcast_convert,
    "stablehlo.optimization_barrier": _pass_through,
    "stablehlo.pad": _elementwise_with(_pad_dims),
    "stablehlo.concatenate": _elementwise_with(lambda op: {_int(op, "dimension")}),
    "stablehlo.reverse": _elementwise_with(lambda op: set(_i64s(op, "dimensions"))),
    "stablehlo.sort": _elementwise_with(lambda op: {_int(op, "dimension", -1)
                                                    % len(shape_of(op.results[0]))}),
    "stablehlo.fft": _elementwise_with(_fft_dims),
    "chlo.top_k": _elementwise_with(lambda op: {len(shape_of(op.results[0])) - 1}),  # (along the last dim)
    "stablehlo.reduce_window": _reduce_window,
    "stablehlo.select_and_scatter": _elementwise_with(_window_dims),
    "stablehlo.broadcast_in_dim": _broadcast_in_dim,
    "stablehlo.broadcast": _broadcast_legacy,
    "stablehlo.transpose": _transpose,
    "stablehlo.reshape": _reshape,
    "stablehlo.reduce": _reduce,
    "stablehlo.constant": _generator,
    "stablehlo.iota": _generator,
    # (XLA's partitioner makes every device generate the whole bits and slice its part, so the
    # bits equal one device's under any sharding: a replicated value, split by its readers)
    "stablehlo.rng_bit_generator": _generator,
    "chlo.constant": _generator,
    "sdy.constant": _generator,
    "stablehlo.dot_general": _dot_general,
    "stablehlo.dot": _dot_legacy,
    "stablehlo.convolution": _convolution,
    "stablehlo.gather": _gather,
    "stablehlo.scatter": _scatter,
    "stablehlo.custom_call": _custom_call,
}

# Ops whose regions the extractor may skip because the rule above covers the whole op.
REGION_OK = frozenset({"stablehlo.reduce", "stablehlo.sort", "stablehlo.reduce_window",
                       "stablehlo.scatter", "stablehlo.select_and_scatter"})


def lookup(op_name: str, has_regions: bool) -> Optional[Rule]:
    """The rule for ``op_name``; ``None`` means OPAQUE (also for region ops outside REGION_OK)."""
    if has_regions and op_name not in REGION_OK:
        return None
    return RULES.get(op_name)

