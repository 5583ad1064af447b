"""Weight-update sharding: partial-sum dots and sums rewritten to reduce-scatter explicitly.

XLA's CPU pipeline never turns all-reduce + dynamic-slice into a reduce-scatter (DESIGN.md), so
where the plan reduces a dot's (or a sum's) partial sums we write the reduce-scatter ourselves, as a manual
computation (what ``shard_map(psum_scatter)`` lowers to).

Input IR state: a Shardy module after :func:`alpa_pass.emit.constraints.insert_constraints`.
Output IR state: every rewritten ``stablehlo.dot_general`` ``%d`` (and the value constraint that
followed it) is replaced by

  %m = sdy.manual_computation(%lhs, %rhs) in_shardings=[<plan's operand layouts>]
         out_shardings=[<result split on dim d over A>] manual_axes=A (%l, %r) {
    %p = stablehlo.dot_general %l, %r   // local partial sums
    %s = stablehlo.reduce_scatter(%p) scatter_dimension = d, replica groups along A
    sdy.return %s
  }

whose result feeds the old uses; XLA all-gathers it only where a consumer needs it whole.

A dot is rewritten when, in the plan, both operands are split only on a contracting dim pair
over mesh axes A (the same axes on both sides), the result is not split (its partial sums are
all-reduced over A), and some result dim d is divisible by the devices of A (the largest such
dim). Dots with other splits are left to XLA's all-reduce.

A ``stablehlo.reduce`` (a bias or LayerNorm gradient: a sum over batch dims) is rewritten the same
way, with a local reduce in the manual computation, when it has one result, an add reducer and a
constant zero init, its input is split only on reduced dims over A (the scalar init is never split),
its result is not split, and some result dim is divisible by the devices of A (so scalar sums, such
as a loss, stay all-reduced).
"""
from __future__ import annotations

import math
import re

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from alpa_pass.emit.constraints import sharding_text
from alpa_pass.errors import EmitError
from alpa_pass.extract.graph import OpGraph, OpKind
from alpa_pass.extract.stablehlo import functions
from alpa_pass.mesh import LogicalMesh


def partial_sum_dots(graph: OpGraph, plan, mesh: LogicalMesh) -> dict[int, tuple[tuple[int, ...], int]]:
    """Node -> (mesh axes A its partial sums are reduced over, scatter dim d), for every dot or
    reduce the rewrite may apply to (see the module docstring; a reduce's reducer and init are
    checked later, on the MLIR op, by :func:`locate_partial_sum_dots`)."""
    out = {}
    for v in range(graph.num_nodes):
        axes = _partial_axes(graph, plan, mesh, v)
        if not axes:
            continue
        n = math.prod(mesh.shape[ax] for ax in axes)
        shape = graph.shape(v)
        dims = [d for d in range(len(shape)) if shape[d] % n == 0]
        if dims:
            out[v] = (tuple(axes), max(dims, key=lambda d: (shape[d], -d)))
    return out


def _partial_axes(graph: OpGraph, plan, mesh: LogicalMesh, v: int) -> list[int] | None:
    """The mesh axes over which node ``v`` (a 2-operand dot or a reduce) holds partial sums and
    which split nothing else of it; ``None`` when ``v`` has any other split or another kind."""
    kind = OpKind(int(graph.kind[v]))
    if kind not in (OpKind.DOT, OpKind.REDUCE) or len(graph.operands(v)) != 2:
        return None
    lhs, rhs = (list(s) for s in plan.operand_specs[v])
    a = list(graph.node_attrs(v))
    if kind == OpKind.DOT:
        nb = a[0]
        nc = a[1 + 2 * nb]
        lc, rc = a[2 + 2 * nb:2 + 2 * nb + nc], a[2 + 2 * nb + nc:2 + 2 * nb + 2 * nc]
        reduced = lambda ax: lhs[ax] in lc and rhs[ax] == rc[lc.index(lhs[ax])]
    else:  # rhs is the scalar init: never split
        reduced = lambda ax: lhs[ax] in a and rhs[ax] < 0
    axes = []
    for ax, size in enumerate(mesh.shape):
        if size == 1:
            continue
        if plan.node_specs[v][ax] >= 0:
            return None
        if lhs[ax] < 0 and rhs[ax] < 0:
            continue
        if not reduced(ax):
            return None
        axes.append(ax)
    return axes


def locate_partial_sum_dots(module: ir.Module, graph: OpGraph, plan, mesh: LogicalMesh) -> list:
    """The ops of :func:`partial_sum_dots` in ``module``, less the reduces that are not a
    single-result sum from a zero init: call before ``insert_constraints`` (which shifts op
    positions); hand the result to :func:`rewrite_reduce_scatter` afterwards.

    Raises:
      EmitError: a node's locator does not point at an op of its kind.
    """
    funcs = functions(module)
    out = []
    for v, (axes, dim) in sorted(partial_sum_dots(graph, plan, mesh).items()):
        loc = graph.locators[v]
        op = list(funcs[loc.func].regions[0].blocks[0].operations)[loc.op_index].operation
        want = "stablehlo.dot_general" if OpKind(int(graph.kind[v])) == OpKind.DOT else "stablehlo.reduce"
        if op.name != want:
            raise EmitError(f"node %{v} ({graph.labels[v]}) expects {want} at "
                            f"@{loc.func} op {loc.op_index}, found {op.name}")
        if want == "stablehlo.reduce" and not _is_zero_sum(op):
            continue
        out.append((op, v, axes, dim))
    return out


def _is_zero_sum(op) -> bool:
    """``op`` (a stablehlo.reduce) has one result, an add reducer and a constant zero init, so a
    sum of per-shard reduces equals the whole reduce."""
    if len(op.results) != 1:
        return False
    body = [o.operation.name for o in op.regions[0].blocks[0].operations]
    init = op.operands[1].owner
    if body != ["stablehlo.add", "stablehlo.return"] or not isinstance(init, ir.OpView):
        return False
    if init.operation.name != "stablehlo.constant":
        return False
    value = ir.DenseElementsAttr(init.operation.attributes["value"])
    return value.is_splat and float(np.asarray(value.get_splat_value().value)) == 0.0


def rewrite_reduce_scatter(module: ir.Module, located: list, plan, mesh: LogicalMesh,
                           mesh_name: str = "mesh") -> int:
    """Rewrite the ``located`` dots in ``module`` (in place, then verified); returns how many.

    Raises:
      EmitError: the module does not verify afterwards.
    """
    handle = 1 + max((int(h) for h in re.findall(r"channel_handle<handle = (\d+)",
                                                  str(module.operation))), default=0)
    with module.context, ir.Location.unknown():
        for k, (op, v, axes, dim) in enumerate(located):
            _rewrite(op, plan, mesh, v, axes, dim, handle + k, mesh_name)
    try:
        module.operation.verify()
    except ir.MLIRError as e:
        raise EmitError(f"the module does not verify after the reduce-scatter rewrite: {e}") from e
    return len(located)


def _rewrite(op, plan, mesh: LogicalMesh, v: int, axes, dim: int, handle: int, mesh_name: str):
    """Replace ``op`` (node ``v``: a dot or sum reduce) and its value constraint by the manual
    computation of the module docstring; its uses read the scattered result."""
    names = [mesh.axis_names[a] for a in axes]
    n = math.prod(mesh.shape[a] for a in axes)
    out_t = ir.RankedTensorType(op.results[0].type)
    specs = [list(s) for s in plan.operand_specs[v]]
    ins = [_sharding(mesh, s, len(ir.RankedTensorType(x.type).shape), axes, mesh_name)
           for s, x in zip(specs, op.operands)]
    out_dims = [() for _ in out_t.shape]
    out_dims[dim] = tuple(names)
    attrs = {
        "in_shardings": ir.Attribute.parse(f"#sdy.sharding_per_value<[{', '.join(ins)}]>"),
        "out_shardings": ir.Attribute.parse(f"#sdy.sharding_per_value<[{_strip(sharding_text(out_dims, mesh_name))}]>"),
        "manual_axes": ir.Attribute.parse("#sdy<manual_axes{" + ", ".join(f'"{a}"' for a in names) + "}>"),
    }
    manual = ir.Operation.create("sdy.manual_computation", results=[out_t], operands=list(op.operands),
                                 attributes=attrs, regions=1, ip=ir.InsertionPoint(op))
    local = [_local_type(x.type, s, mesh, axes) for s, x in zip(specs, op.operands)]
    block = manual.regions[0].blocks.append(*local)
    with ir.InsertionPoint(block):
        partial = _local_op(op, out_t, list(block.arguments))
        scattered = _reduce_scatter(partial.results[0], out_t, dim, n, _groups(mesh, axes), handle)
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
    """A copy of ``op`` (a dot, or a sum reduce) on ``operands``, without its Shardy attributes."""
    named = [op.attributes[i] for i in range(len(op.attributes))]
    keep = {a.name: a.attr for a in named if not a.name.startswith("sdy.")}
    is_reduce = op.name == "stablehlo.reduce"
    local = ir.Operation.create(op.name, results=[out_t], operands=operands, attributes=keep,
                                regions=int(is_reduce))
    if is_reduce:
        _add_body(local.regions[0], out_t.element_type)
    return local


def _add_body(region, element_type):
    scalar = ir.RankedTensorType.get([], element_type)
    body = region.blocks.append(scalar, scalar)
    with ir.InsertionPoint(body):
        stablehlo.ReturnOp([stablehlo.AddOp(*body.arguments).result])


def _reduce_scatter(value, full_t, dim: int, n: int, groups: np.ndarray, handle: int):
    shape = list(full_t.shape)
    shape[dim] //= n
    rs = ir.Operation.create(
        "stablehlo.reduce_scatter", results=[ir.RankedTensorType.get(shape, full_t.element_type)],
        operands=[value], regions=1, attributes={
            "channel_handle": ir.Attribute.parse(f"#stablehlo.channel_handle<handle = {handle}, type = 1>"),
            "replica_groups": ir.DenseIntElementsAttr.get(groups.astype(np.int64)),
            "scatter_dimension": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim),
            "use_global_device_ids": ir.UnitAttr.get(),
        })
    _add_body(rs.regions[0], full_t.element_type)
    return rs.results[0]


def _groups(mesh: LogicalMesh, axes) -> np.ndarray:
    """Device groups (global ids in mesh order) that differ only along ``axes``, major to minor."""
    others = [a for a in range(len(mesh.shape)) if a not in axes]
    ids = np.arange(mesh.num_devices).reshape(mesh.shape).transpose(others + list(axes))
    return ids.reshape(-1, math.prod(mesh.shape[a] for a in axes))


def _sharding(mesh: LogicalMesh, spec, rank: int, axes, mesh_name: str) -> str:
    dims = [tuple(n for n in d if mesh.axis_names.index(n) in axes) for d in mesh.dim_axes(spec, rank)]
    return _strip(sharding_text(dims, mesh_name))


def _strip(text: str) -> str:
    return text[len("#sdy.sharding"):]


def _local_type(t, spec, mesh: LogicalMesh, axes) -> ir.RankedTensorType:
    t = ir.RankedTensorType(t)
    shape = list(t.shape)
    for a in axes:
        if spec[a] >= 0:
            shape[spec[a]] //= mesh.shape[a]
    return ir.RankedTensorType.get(shape, t.element_type)
