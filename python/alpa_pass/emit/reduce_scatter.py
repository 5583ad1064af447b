"""Weight-update sharding: partial-sum dots and sums rewritten to reduce-scatter explicitly.

XLA's CPU pipeline never turns all-reduce + dynamic-slice into a reduce-scatter (DESIGN.md), so
where the plan reduces a dot's (or a sum's) partial sums we write the reduce-scatter ourselves, as a
manual computation (what ``shard_map(psum_scatter)`` lowers to).

Input IR state: a Shardy module after :func:`alpa_pass.emit.constraints.insert_constraints`.
Output IR state: every rewritten ``stablehlo.dot_general`` ``%d`` (and the value constraint that
followed it) is replaced by

  %m = sdy.manual_computation(%lhs, %rhs) in_shardings=[<plan's operand layouts>]
         out_shardings=[<plan's result layout, with A added on dim d>] manual_axes=<all axes> (%l, %r) {
    %p = stablehlo.dot_general %l, %r   // local partial sums (local on the other axes' splits)
    %s = stablehlo.reduce_scatter(%p) scatter_dimension = d, replica groups along A
    sdy.return %s
  }

whose result feeds the old uses; XLA all-gathers it only where a consumer needs it whole.

Which ops qualify, the partial-sum axes A and the scatter dim d: :mod:`alpa_pass.emit.partial_sums`
(in short: the dot's or sum's operands are split on contracted/reduced dims over A and, on every
other mesh axis, split so that the op runs locally on its shards, as in 2-D data + tensor-parallel
plans; and its result is a parameter gradient: it reaches a step output through elementwise ops).
A ``stablehlo.reduce`` or ``stablehlo.scatter`` must moreover have one result and an add combiner,
and sum into zeros (its init / input a zero constant or a broadcast of one).
The region is manual over every mesh axis: the other axes' splits are spelled out in its
in/out shardings. A region manual over A only, the other axes left automatic inside, is what
``shard_map(axis_names=A)`` makes; XLA 0.10.2's CPU partitioner replicates a reduce-scatter's
operand on the automatic axes there (a [32, 128] weight gradient split on "x" and reduce-scattered
over "y" on a 2x4 mesh compiles to an all-gather over "x" and a reduce-scatter of the whole
[8, 128]), while the fully manual region compiles to one reduce-scatter of the local [8, 64].
"""
from __future__ import annotations

import math
import re

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from alpa_pass.emit.constraints import sharding_text, verify_module
from alpa_pass.emit.partial_sums import PartialSum, partial_sums
from alpa_pass.errors import EmitError
from alpa_pass.extract.graph import OpGraph, OpKind
from alpa_pass.extract.stablehlo import functions
from alpa_pass.mesh import LogicalMesh


def locate_partial_sum_dots(module: ir.Module, graph: OpGraph, plan, mesh: LogicalMesh) -> list:
    """The ops of :func:`~alpa_pass.emit.partial_sums.partial_sums` in ``module``, less the reduces
    and scatters that are not a single-result sum into zeros, as ``(op, PartialSum)`` pairs: call before
    ``insert_constraints`` (which shifts op positions); hand the result to
    :func:`rewrite_reduce_scatter` afterwards.

    Raises:
      EmitError: a node's locator does not point at an op of its kind.
    """
    funcs = functions(module)
    out = []
    for v, found in sorted(partial_sums(graph, plan, mesh).items()):
        loc = graph.locators[v]
        if loc.nest:  # inside a loop body or branch: left to XLA's all-reduce
            continue
        op = list(funcs[loc.func].regions[0].blocks[0].operations)[loc.op_index].operation
        want = _OP_NAMES[OpKind(int(graph.kind[v]))]
        if op.name not in want:
            raise EmitError(f"node %{v} ({graph.labels[v]}) expects {want[0]} at "
                            f"@{loc.func} op {loc.op_index}, found {op.name}")
        if op.name in _INIT_OPERAND and not _is_zero_sum(op):
            continue
        out.append((op, found))
    return out


_OP_NAMES = {OpKind.DOT: ("stablehlo.dot_general", "stablehlo.dot"),
             OpKind.REDUCE: ("stablehlo.reduce",), OpKind.SCATTER: ("stablehlo.scatter",)}
_INIT_OPERAND = {"stablehlo.reduce": 1, "stablehlo.scatter": 0}  # the value summed into


def _is_zero_sum(op) -> bool:
    """``op`` (a stablehlo.reduce or scatter) has one result, an add combiner and sums into zeros
    (a zero constant, or a broadcast of one), so a sum of per-shard results equals the whole."""
    if len(op.results) != 1:
        return False
    body = [o.operation.name for o in op.regions[0].blocks[0].operations]
    if body != ["stablehlo.add", "stablehlo.return"]:
        return False
    init = op.operands[_INIT_OPERAND[op.name]].owner
    if isinstance(init, ir.OpView) and init.operation.name == "stablehlo.broadcast_in_dim":
        init = init.operation.operands[0].owner
    if not isinstance(init, ir.OpView) or init.operation.name != "stablehlo.constant":
        return False
    value = ir.DenseElementsAttr(init.operation.attributes["value"])
    return value.is_splat and float(np.asarray(value.get_splat_value().value)) == 0.0


def rewrite_reduce_scatter(module: ir.Module, located: list, mesh: LogicalMesh,
                           mesh_name: str = "mesh") -> int:
    """Rewrite the ``located`` ops in ``module`` (in place, then verified); returns how many.

    Raises:
      EmitError: the module does not verify afterwards.
    """
    handle = 1 + max((int(h) for h in re.findall(r"channel_handle<handle = (\d+)",
                                                  str(module.operation))), default=0)
    with module.context, ir.Location.unknown():
        for k, (op, found) in enumerate(located):
            with op.location:  # the new ops keep the op's name and source line (HLO metadata)
                _rewrite(op, found, mesh, handle + k, mesh_name)
    verify_module(module, "the reduce-scatter rewrite")
    return len(located)


def _rewrite(op, found: PartialSum, mesh: LogicalMesh, handle: int, mesh_name: str):
    """Replace ``op`` (a dot, or a sum reduce or scatter) and its value constraint by the manual
    computation of the module docstring; its uses read the scattered result."""
    n = math.prod(mesh.shape[a] for a in found.axes)
    out_t = ir.RankedTensorType(op.results[0].type)
    ins = [_strip(sharding_text(dims, mesh_name)) for dims in found.operand_dims]
    attrs = {
        "in_shardings": ir.Attribute.parse(f"#sdy.sharding_per_value<[{', '.join(ins)}]>"),
        "out_shardings": ir.Attribute.parse(
            f"#sdy.sharding_per_value<[{_strip(sharding_text(found.out_dims, mesh_name))}]>"),
        "manual_axes": ir.Attribute.parse(
            "#sdy<manual_axes{" + ", ".join(f'"{a}"' for a in mesh.axis_names) + "}>"),
    }
    manual = ir.Operation.create("sdy.manual_computation", results=[out_t], operands=list(op.operands),
                                 attributes=attrs, regions=1, ip=ir.InsertionPoint(op))
    local = [_local_type(x.type, dims, mesh) for dims, x in zip(found.operand_dims, op.operands)]
    block = manual.regions[0].blocks.append(*local)
    with ir.InsertionPoint(block):
        operands = list(block.arguments)
        if op.name == "stablehlo.scatter":
            operands[1] = _indices_to_local_rows(op, operands[1], found.operand_dims[0], mesh)
        partial = _local_op(op, _local_type(out_t, found.local_dims, mesh), operands)
        scattered = _reduce_scatter(partial.results[0], found.dim, n, _groups(mesh, found.axes), handle)
        ir.Operation.create("sdy.return", operands=[scattered])
    result = op.results[0]
    for use in list(result.uses):
        owner = use.owner
        if owner.name == "sdy.sharding_constraint":
            owner.results[0].replace_all_uses_with(manual.results[0])
            owner.erase()
    result.replace_all_uses_with(manual.results[0])
    op.erase()


def _local_op(op, out_t, operands):
    """A copy of ``op`` (a dot, or a sum reduce or scatter) on ``operands``, without its Shardy
    attributes."""
    named = [op.attributes[i] for i in range(len(op.attributes))]
    keep = {a.name: a.attr for a in named if not a.name.startswith("sdy.")}
    sums = op.name in _INIT_OPERAND
    local = ir.Operation.create(op.name, results=[out_t], operands=operands, attributes=keep,
                                regions=int(sums))
    if sums:
        _add_body(local.regions[0], out_t.element_type)
    return local


def _indices_to_local_rows(op, indices, input_dims, mesh: LogicalMesh):
    """``indices`` of the scatter ``op``, less the first global row of this device's shard on each
    indexed input dim that ``input_dims`` splits (one the update inserts: ``partial_sums``): the
    local scatter then adds the rows this device holds, and skips the others as out of bounds (XLA
    drops an update whose index is out of range). The device's shard index along the splitting
    axes comes from its partition id (a mesh position: the groups of :func:`_groups` assume it too).
    Returns ``indices`` itself when no indexed dim is split."""
    numbers = stablehlo.ScatterDimensionNumbers(op.attributes["scatter_dimension_numbers"])
    indexed = list(numbers.scattered_dims_to_operand_dims)
    idx_t = ir.RankedTensorType(indices.type)
    ivd = numbers.index_vector_dim
    shift = None
    for k, d in enumerate(indexed):
        if not input_dims[d]:
            continue
        rows = ir.RankedTensorType(op.operands[0].type).shape[d] // \
            math.prod(mesh.shape[mesh.axis_names.index(a)] for a in input_dims[d])
        first = _mul(_shard_index(input_dims[d], mesh, idx_t.element_type), rows, idx_t.element_type)
        if ivd < idx_t.rank:  # only component k of the index vectors
            one_hot = np.zeros(idx_t.shape[ivd], dtype=np.int64)
            one_hot[k] = 1
            mask = stablehlo.constant(ir.DenseElementsAttr.get(
                one_hot.astype(_NP_INT[str(idx_t.element_type)]),
                type=ir.RankedTensorType.get([len(one_hot)], idx_t.element_type)))
            part = stablehlo.multiply(stablehlo.broadcast_in_dim(idx_t, first, []),
                                      stablehlo.broadcast_in_dim(idx_t, mask, [ivd]))
        else:
            part = stablehlo.broadcast_in_dim(idx_t, first, [])
        shift = part if shift is None else stablehlo.add(shift, part)
    return indices if shift is None else stablehlo.subtract(indices, shift)


_NP_INT = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
           "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64}


def _shard_index(axes, mesh: LogicalMesh, element_type):
    """This device's shard index (a 0-d tensor of ``element_type``) along the mesh ``axes``, major
    to minor, from its partition id (row-major mesh position)."""
    pid = stablehlo.convert(ir.RankedTensorType.get([], element_type), stablehlo.partition_id())
    index = None
    for name in axes:
        a = mesh.axis_names.index(name)
        stride = math.prod(mesh.shape[a + 1:])
        coord = stablehlo.remainder(_div(pid, stride, element_type), _const(mesh.shape[a], element_type))
        index = coord if index is None else stablehlo.add(_mul(index, mesh.shape[a], element_type), coord)
    return index


def _const(value: int, element_type):
    t = ir.RankedTensorType.get([], element_type)
    return stablehlo.constant(ir.DenseElementsAttr.get(np.array(value, dtype=_NP_INT[str(element_type)]), type=t))


def _mul(x, k: int, element_type):
    return stablehlo.multiply(x, _const(k, element_type))


def _div(x, k: int, element_type):
    return stablehlo.divide(x, _const(k, element_type))


def _add_body(region, element_type):
    scalar = ir.RankedTensorType.get([], element_type)
    body = region.blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        stablehlo.ReturnOp([stablehlo.AddOp(*body.arguments).result])


def _reduce_scatter(value, dim: int, n: int, groups: np.ndarray, handle: int):
    """``value`` reduce-scattered on ``dim`` over the device ``groups`` (``n`` devices each)."""
    local_t = ir.RankedTensorType(value.type)
    shape = list(local_t.shape)
    shape[dim] //= n
    rs = ir.Operation.create(
        "stablehlo.reduce_scatter", results=[ir.RankedTensorType.get(shape, local_t.element_type)],
        operands=[value], regions=1, attributes={
            "channel_handle": ir.Attribute.parse(f"#stablehlo.channel_handle<handle = {handle}, type = 1>"),
            "replica_groups": ir.DenseIntElementsAttr.get(groups),
            "scatter_dimension": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim),
            "use_global_device_ids": ir.UnitAttr.get(),
        })
    _add_body(rs.regions[0], local_t.element_type)
    return rs.results[0]


def _groups(mesh: LogicalMesh, axes) -> np.ndarray:
    """Device groups (global ids in mesh order) that differ only along ``axes``, major to minor:
    int64[num groups, devices per group], C-contiguous."""
    others = [a for a in range(len(mesh.shape)) if a not in axes]
    ids = np.arange(mesh.num_devices).reshape(mesh.shape).transpose(others + list(axes))
    return np.ascontiguousarray(ids.reshape(-1, math.prod(mesh.shape[a] for a in axes)), dtype=np.int64)


def _strip(text: str) -> str:
    return text[len("#sdy.sharding"):]


def _local_type(t, dims, mesh: LogicalMesh) -> ir.RankedTensorType:
    """``t`` divided, dim by dim, by the devices of the mesh axes named in ``dims``."""
    t = ir.RankedTensorType(t)
    shape = [size // math.prod(mesh.shape[mesh.axis_names.index(a)] for a in d)
             for size, d in zip(t.shape, dims)]
    return ir.RankedTensorType.get(shape, t.element_type)
