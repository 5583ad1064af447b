"""Gradient accumulation: partial sums carried through the loop, reduced once after it.

A ``lax.scan`` that accumulates gradients over micro-batches (``acc + grad(loss)(params, mb)``)
lowers to a ``stablehlo.while`` whose body adds a weight-gradient dot to a carried accumulator. When
the plan splits the micro-batch (the dot's contracted dim) over mesh axes ``A``, XLA all-reduces
the dot's partial sums over ``A`` inside the loop: once per micro-batch. Alpa reduces once per step.
This pass keeps one partial sum per shard of ``A`` in the carry and reduces after the loop, with no
manual computation: the contracted dim ``K`` (split over ``A``, ``n`` devices) is reshaped to
``[n, K/n]`` with ``A`` on the ``n`` dim and made a *batch* dim of the dot, so every device
computes its own partial sum locally; the accumulator carries ``[n, ...]`` split over ``A`` on the
new dim; after the loop a ``reduce`` over that dim (the one all-reduce, or a reduce-scatter where
the result is split) gives the sum. Numerically it is the same sum in another order.

Input IR state: a Shardy module after :func:`alpa_pass.emit.constraints.insert_constraints` (every
planned value constrained, ``emit="all"``). Output IR state: the calls inside top-level while
loops inlined (jax puts a scan's body in ``@closed_call``), and for every
carried slot ``s`` of a top-level while that matches

  init_s = zeros                                   (a splat 0 constant, or its broadcast)
  body:  y = add(arg_s, chain(dot(l, r)))          (chain: transpose / reshape / convert / slice /
                                                    sharding constraints / sums of size-1 dims /
                                                    products and quotients with a splat constant;
                                                    a tree: one dot may feed several slots through
                                                    slices, as a fused LSTM kernel's gradient feeds
                                                    its gates', when every use of the dot and of
                                                    the chain lies inside the tree)
         or y = add(add(arg_s, chain(dot_1)), chain(dot_2)) ... (several sources added into one
                                                    slot, in any tree of adds, all split over the
                                                    same axes: an RK4 step's four stages)
         with l, r read in layouts that split one contracted pair over exactly the axes A
         (or y = add(arg_s, chain(reduce_sum(x))), x split over A on one reduced dim)

the rewrite above (the carry and the chain keep their planned layouts less A, which now splits
the leading dim; where the plan split the carry over A, the sum after the loop is constrained to
that layout: an all-reduce and a local slice, a reduce-scatter on GPU) (a dot read from
unconstrained operands, a chain through other ops, a value read outside the tree, sub-axis
shardings: left alone, i.e. all-reduced in the loop as before).
"""
from __future__ import annotations

import math
import re

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from alpa_pass.emit.calls import inline_calls
from alpa_pass.emit.constraints import sharding_text, verify_module
from alpa_pass.extract.stablehlo import functions
from alpa_pass.mesh import LogicalMesh

_CHAIN = ("sdy.sharding_constraint", "stablehlo.transpose", "stablehlo.reshape", "stablehlo.convert",
          "stablehlo.slice")
_DIM = re.compile(r"\{([^{}]*)\}")
_AXIS = re.compile(r'^"([^"]+)"$')


def rewrite_accumulations(module: ir.Module, mesh: LogicalMesh, mesh_name: str = "mesh",
                          entry: str = "main") -> int:
    """Rewrite every matching accumulator of the top-level while loops of ``entry`` (module
    docstring); returns how many carried slots were rewritten. Raises EmitError when the module
    does not verify afterwards."""
    func = functions(module).get(entry)
    if func is None:
        return 0
    whiles = _top_whiles(func)
    if not whiles:
        return 0
    count = 0
    with module.context:
        funcs = functions(module)
        for w in whiles:
            for region in w.regions:
                inline_calls(region.blocks[0], funcs)
        for w in whiles:
            for group in _match_groups(w, mesh):
                with w.location:
                    _rewrite(w, group, mesh, mesh_name)
                count += len(group.slots)
    if count:
        verify_module(module, "the accumulation rewrite")
    return count


def _top_whiles(func) -> list:
    return [op.operation for op in func.regions[0].blocks[0].operations if op.operation.name == "stablehlo.while"]


class _Slot:
    """One matched carried slot: its index, the add, the carry's constraints (arg and yield side)."""

    def __init__(self, index, add, arg_side, yield_side):
        self.index, self.add, self.arg_side, self.yield_side = index, add, arg_side, yield_side


class _Group:
    """Partial-sum ops (``sources``: (op, kind, dims); ``kind`` "dot" with contracted pair ``dims``
    = (lhs dim, rhs dim), or "reduce" with ``dims`` = (the split reduced dim,)) split over the same
    partial-sum ``axes``, the linear ops between them and the slots' adds (a tree: slices fan one
    result out to several accumulators, as a fused LSTM kernel's gradient is sliced into its gates'
    kernels; adds join several sources into one accumulator, as the four stages of an RK4 step add
    their weight gradients), and the slots they feed."""

    def __init__(self, axes):
        self.axes = axes
        self.sources: list = []
        self.chain: list = []
        self.slots: list[_Slot] = []

    def take(self, sources, chain, slots) -> None:
        self.sources.extend(s for s in sources if not any(s[0] == t[0] for t in self.sources))
        self.chain.extend(c for c in chain if not any(c == o for o in self.chain))
        self.slots.extend(slots)


def _owner(value):
    owner = value.owner
    return owner.operation if isinstance(owner, ir.OpView) else owner if isinstance(owner, ir.Operation) else None


def _single_use(value) -> bool:
    return len(list(value.uses)) == 1


def constraint_dims(op) -> list[tuple[str, ...]] | None:
    """Per-dim axis names of a ``sdy.sharding_constraint`` (None: open dims, sub-axes, extras)."""
    text = str(op.attributes["sharding"])
    if "[" not in text or not text.rstrip(">").rstrip().endswith("]"):  # replicated={...} and the like
        return None
    inner = text[text.index("[") + 1:text.rindex("]")]
    out = []
    for d in _DIM.findall(inner):
        names = [a.strip() for a in d.split(",") if a.strip()]
        if any(not _AXIS.match(a) for a in names):
            return None  # "?" (open) or a sub-axis "x":(1)2
        out.append(tuple(_AXIS.match(a).group(1) for a in names))
    return out


def _strip_constraints(value, ops: list):
    """Follow ``value`` back through single-use sharding constraints (appended to ``ops``)."""
    while (o := _owner(value)) is not None and o.name == "sdy.sharding_constraint":
        ops.append(o)
        value = o.operands[0]
    return value


def _is_zero(value) -> bool:
    o = _owner(_strip_constraints(value, []))
    if o is not None and o.name == "stablehlo.broadcast_in_dim":
        o = _owner(o.operands[0])
    if o is None or o.name != "stablehlo.constant":
        return False
    attr = ir.DenseElementsAttr(o.attributes["value"])
    return attr.is_splat and float(np.asarray(attr.get_splat_value().value)) == 0.0


def _match_groups(w, mesh: LogicalMesh) -> list[_Group]:
    """The accumulator trees of while ``w``: slots grouped by their partial-sum ops (slots that share
    one are one group), kept where every use of the ops and of the ops between them and the adds
    lies inside the tree."""
    groups: list[_Group] = []
    for s in range(len(w.results)):
        found = _match_slot(w, s)
        if found is None:
            continue
        slot, ops, chain = found
        splits = [_dot_split(o, mesh) if o.name == "stablehlo.dot_general" else _reduce_split(o, mesh) for o in ops]
        if any(x is None for x in splits) or len({x[2] for x in splits}) != 1:
            continue
        group = _Group(splits[0][2])
        for g in [g for g in groups if any(o == t[0] for o in ops for t in g.sources)]:
            groups.remove(g)  # a shared source has one split: the same axes
            group.take(g.sources, g.chain, g.slots)
        group.take([(o, kind, dims) for o, (kind, dims, _) in zip(ops, splits)], chain, [slot])
        groups.append(group)
    return [g for g in groups if _closed(g)]


def _closed(g: _Group) -> bool:
    """Every result use of the sources and of the chain ops is a chain op or one of the adds."""
    inside = g.chain + [slot.add for slot in g.slots]
    for op in [*(t[0] for t in g.sources), *g.chain]:
        for use in op.results[0].uses:
            if not any(_owner_op(use.owner) == o for o in inside):
                return False
    return True


def _owner_op(owner):
    return owner.operation if isinstance(owner, ir.OpView) else owner


def _match_slot(w, s: int):
    """``(slot, sources, chain)`` when carried slot ``s`` yields an add tree of ``arg_s`` and chains
    over partial-sum ops (module docstring, ``_AddTree``) with a zero init; else None."""
    body, cond = w.regions[1].blocks[0], w.regions[0].blocks[0]
    arg, ret = body.arguments[s], list(body.operations)[-1]
    t = ir.RankedTensorType(arg.type)
    if not isinstance(t.element_type, ir.FloatType) or list(cond.arguments[s].uses) or not _is_zero(w.operands[s]):
        return None
    yield_side = []
    y = _strip_constraints(ret.operands[s], yield_side)
    add = _owner(y)
    if add is None or add.name != "stablehlo.add" or not _single_use(y) or \
            any(not _single_use(o.results[0]) for o in yield_side):
        return None
    tree = _AddTree(arg)
    if not tree.walk(add) or tree.arg_side is None or not tree.sources or \
            any(constraint_dims(o) is None for o in tree.arg_side + yield_side):
        return None
    return _Slot(s, add, tree.arg_side, yield_side), tree.sources, tree.chain


class _AddTree:
    """The adds under a slot's yield: exactly one leaf is the carried ``arg`` (through single-use
    constraints, ``arg_side``), every other leaf a chain over a partial-sum op (``sources``); the
    inner adds and the constraints between adds join ``chain``. ``acc + d1 + d2`` and
    ``acc + (d1 + d2)`` are both trees (an RK4 step's weight gradient is four dots added in turn)."""

    def __init__(self, arg):
        self.arg, self.arg_side = arg, None
        self.sources: list = []
        self.chain: list = []

    def walk(self, add) -> bool:
        for v in add.operands:
            cons = []
            u = _strip_constraints(v, cons)
            inner = _owner(u)
            if u == self.arg:
                if self.arg_side is not None or not _single_use(u) or any(not _single_use(o.results[0]) for o in cons):
                    return False
                self.arg_side = cons
            elif inner is not None and inner.name == "stablehlo.add" and _single_use(u) and \
                    all(_single_use(o.results[0]) and constraint_dims(o) is not None for o in cons):
                self.chain.extend([inner, *cons])
                if not self.walk(inner):
                    return False
            else:
                found = _match_source(v)
                if found is None:
                    return False
                self.sources.append(found[0])
                self.chain.extend(found[1])
        return True


def _match_source(value):
    """``(op, chain)`` when ``value`` is a chain of linear ops (``_CHAIN``, slices, sums of size-1
    dims, products and quotients with a splat constant) over a dot or a sum (uses outside the
    tree are checked per group, ``_closed``); else None."""
    chain = []
    while (o := _owner(value)) is not None and \
            (o.name in _CHAIN or _scales(o) or (_is_sum(o) and all(
                ir.RankedTensorType(o.operands[0].type).shape[d] == 1 for d in _reduced(o)))):
        chain.append(o)
        value = o.operands[_scaled_operand(o)]
    o = _owner(value)
    if o is None or not (o.name == "stablehlo.dot_general" or _is_sum(o)):
        return None
    if any(c.name == "sdy.sharding_constraint" and constraint_dims(c) is None for c in chain):
        return None
    return o, list(reversed(chain))


def _constant(value) -> bool:
    """``value`` is a splat constant (maybe broadcast and constrained)."""
    o = _owner(_strip_constraints(value, []))
    if o is not None and o.name == "stablehlo.broadcast_in_dim":
        o = _owner(o.operands[0])
    return o is not None and o.name == "stablehlo.constant" and \
        ir.DenseElementsAttr(o.attributes["value"]).is_splat


def _scaled_operand(o) -> int:
    """Which operand of a chain op carries the partial sums (1 for ``c * x``, else 0)."""
    return 1 if o.name == "stablehlo.multiply" and _constant(o.operands[0]) else 0


def _scales(o) -> bool:
    """``o`` is ``x / c``, ``x * c`` or ``c * x`` for a splat constant ``c`` and the partial sums
    ``x`` (linear: a mean's divisor, a loss scale)."""
    if o.name not in ("stablehlo.divide", "stablehlo.multiply") or len(o.operands) != 2:
        return False
    k = _scaled_operand(o)
    return _constant(o.operands[1 - k]) and not _constant(o.operands[k])


def _operand_dims(value):
    o = _owner(value)
    return constraint_dims(o) if o is not None and o.name == "sdy.sharding_constraint" else None


def _dot_split(o, mesh: LogicalMesh):
    """("dot", (kl, kr), A) for a dot whose operands' constraints split exactly one contracted
    pair, alike, over the axes A; else None."""
    if len(o.operands) != 2:
        return None
    ld, rd = _operand_dims(o.operands[0]), _operand_dims(o.operands[1])
    if ld is None or rd is None:
        return None
    dn = stablehlo.DotDimensionNumbers(o.attributes["dot_dimension_numbers"])
    split = [(kl, kr) for kl, kr in zip(dn.lhs_contracting_dimensions, dn.rhs_contracting_dimensions)
             if ld[kl] or rd[kr]]
    if len(split) != 1:
        return None
    kl, kr = split[0]
    axes = ld[kl]
    if not axes or rd[kr] != axes or any(a not in mesh.axis_names for a in axes):
        return None
    return "dot", (kl, kr), axes


def _is_sum(o) -> bool:
    """A one-input ``stablehlo.reduce`` with an add body summing into a zero init."""
    if o.name != "stablehlo.reduce" or len(o.operands) != 2 or len(o.results) != 1:
        return False
    body = [x.operation.name for x in o.regions[0].blocks[0].operations]
    return body == ["stablehlo.add", "stablehlo.return"] and _is_zero(o.operands[1])


def _reduced(o) -> list[int]:
    return list(ir.DenseI64ArrayAttr(o.attributes["dimensions"]))


def _reduce_split(o, mesh: LogicalMesh):
    """("reduce", (k,), A) for a sum whose input constraint splits exactly one reduced dim k over
    the axes A; else None."""
    dims = _operand_dims(o.operands[0])
    if dims is None:
        return None
    split = [d for d in _reduced(o) if dims[d]]
    if len(split) != 1 or any(a not in mesh.axis_names for a in dims[split[0]]):
        return None
    return "reduce", (split[0],), dims[split[0]]


def _moved(dims, k: int) -> list[int]:
    """Dim numbers after dim ``k`` is split into ``[n, size/n]`` (``k`` itself: the ``size/n`` dim)."""
    return [k + 1 if d == k else d + (d > k) for d in dims]


def _split_dot(dot, pair, n: int, axes, mesh_name: str):
    """The dot with its contracted pair split into ``[n, K/n]`` and ``n`` made a leading batch dim:
    per-shard partial sums ``[n, ...result]``."""
    kl, kr = pair
    dn = stablehlo.DotDimensionNumbers(dot.attributes["dot_dimension_numbers"])
    lhs = _split_operand(dot.operands[0], kl, n, _operand_dims(dot.operands[0]), axes, mesh_name)
    rhs = _split_operand(dot.operands[1], kr, n, _operand_dims(dot.operands[1]), axes, mesh_name)
    attrs = {a.name: a.attr for a in (dot.attributes[i] for i in range(len(dot.attributes)))
             if not a.name.startswith("sdy.")}
    attrs["dot_dimension_numbers"] = stablehlo.DotDimensionNumbers.get(
        lhs_batching_dimensions=[kl, *_moved(dn.lhs_batching_dimensions, kl)],
        rhs_batching_dimensions=[kr, *_moved(dn.rhs_batching_dimensions, kr)],
        lhs_contracting_dimensions=_moved(dn.lhs_contracting_dimensions, kl),
        rhs_contracting_dimensions=_moved(dn.rhs_contracting_dimensions, kr))
    return ir.Operation.create("stablehlo.dot_general", results=[_prefixed(dot.results[0].type, n)],
                               operands=[lhs, rhs], attributes=attrs).results[0]


def _split_reduce(red, dims, n: int, axes, mesh_name: str):
    """The sum with its split reduced dim ``k`` split into ``[n, K/n]``, ``n`` kept and moved to the
    front: per-shard partial sums ``[n, ...result]``."""
    (k,) = dims
    x = _split_operand(red.operands[0], k, n, _operand_dims(red.operands[0]), axes, mesh_name)
    reduced = _moved(_reduced(red), k)
    xt = ir.RankedTensorType(x.type)
    kept = [d for d in range(xt.rank) if d not in reduced]
    t = ir.RankedTensorType.get([xt.shape[d] for d in kept], xt.element_type)
    new = stablehlo.ReduceOp([t], [x], [red.operands[1]], ir.DenseI64ArrayAttr.get(reduced))
    scalar = ir.RankedTensorType.get([], xt.element_type)
    block = new.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        stablehlo.ReturnOp([stablehlo.AddOp(*block.arguments).result])
    out, p = new.results[0], kept.index(k)
    if p:
        perm = [p, *(i for i in range(len(kept)) if i != p)]
        out = stablehlo.TransposeOp(out, ir.DenseI64ArrayAttr.get(perm)).result
    return out


def _prefixed(t, n: int) -> ir.RankedTensorType:
    t = ir.RankedTensorType(t)
    return ir.RankedTensorType.get([n, *t.shape], t.element_type)


def _sharding(dims, mesh_name: str) -> ir.Attribute:
    return ir.Attribute.parse(sharding_text(dims, mesh_name))


def _constrain(value, dims, mesh_name: str):
    return ir.Operation.create("sdy.sharding_constraint", results=[value.type], operands=[value],
                               attributes={"sharding": _sharding(dims, mesh_name)}).results[0]


def _without(dims, axes) -> list[tuple[str, ...]]:
    """``dims`` with the partial-sum ``axes`` taken out (they split the new leading dim)."""
    return [tuple(a for a in d if a not in axes) for d in dims]


def _retype(op, n: int, axes, mesh_name: str) -> None:
    """Give ``op`` (a chain op, the add, a carry constraint) a leading ``[n]`` dim split over ``axes``."""
    res = op.results[0]
    res.set_type(_prefixed(res.type, n))
    if op.name == "sdy.sharding_constraint":
        op.attributes["sharding"] = _sharding([axes, *_without(constraint_dims(op), axes)], mesh_name)
    elif op.name == "stablehlo.transpose":
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        op.attributes["permutation"] = ir.DenseI64ArrayAttr.get([0, *(p + 1 for p in perm)])
    elif op.name == "stablehlo.slice":  # the whole leading dim
        for name, first in (("start_indices", 0), ("limit_indices", n), ("strides", 1)):
            op.attributes[name] = ir.DenseI64ArrayAttr.get([first, *ir.DenseI64ArrayAttr(op.attributes[name])])
    elif op.name == "stablehlo.reduce":
        op.attributes["dimensions"] = ir.DenseI64ArrayAttr.get([d + 1 for d in _reduced(op)])
    elif op.name in ("stablehlo.divide", "stablehlo.multiply"):  # the constant, broadcast along
        c = 1 - _scaled_operand(op)
        t = ir.RankedTensorType(op.operands[c].type)
        with ir.InsertionPoint(op), op.location:
            op.operands[c] = stablehlo.BroadcastInDimOp(
                _prefixed(t, n), op.operands[c], ir.DenseI64ArrayAttr.get(list(range(1, t.rank + 1)))).result


def _split_operand(value, k: int, n: int, dims, axes, mesh_name: str):
    """``value`` with dim ``k`` reshaped to ``[n, size/n]``, ``axes`` on the ``n`` dim."""
    t = ir.RankedTensorType(value.type)
    shape = list(t.shape)
    shape[k:k + 1] = [n, shape[k] // n]
    r = stablehlo.ReshapeOp(ir.RankedTensorType.get(shape, t.element_type), value).result
    return _constrain(r, [*dims[:k], axes, (), *dims[k + 1:]], mesh_name)


def _rewrite(w, g: _Group, mesh: LogicalMesh, mesh_name: str) -> None:
    n = math.prod(mesh.shape[mesh.axis_names.index(a)] for a in g.axes)
    for src, kind, dims in g.sources:
        with ir.InsertionPoint(src):
            new = (_split_dot if kind == "dot" else _split_reduce)(src, dims, n, g.axes, mesh_name)
        src.results[0].replace_all_uses_with(new)
        src.erase()
    for op in g.chain:
        _retype(op, n, g.axes, mesh_name)
    body, cond = w.regions[1].blocks[0], w.regions[0].blocks[0]
    for f in g.slots:
        s = f.index
        old_t = ir.RankedTensorType(body.arguments[s].type)
        carry_dims = _without(constraint_dims(f.yield_side[0]), g.axes) if f.yield_side else [()] * old_t.rank
        for op in [f.add, *reversed(f.yield_side), *f.arg_side]:
            _retype(op, n, g.axes, mesh_name)
        for block in (body, cond):
            block.arguments[s].set_type(_prefixed(old_t, n))
        out = w.results[s]
        out.set_type(_prefixed(old_t, n))
        with ir.InsertionPoint(w):
            zero = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
                ir.RankedTensorType.get([], old_t.element_type), ir.FloatAttr.get(old_t.element_type, 0.0))).result
            init = stablehlo.BroadcastInDimOp(_prefixed(old_t, n), zero, ir.DenseI64ArrayAttr.get([])).result
            w.operands[s] = _constrain(init, [g.axes, *carry_dims], mesh_name)
        with ir.InsertionPoint(_next_op(w)):
            total = _sum_leading(out, old_t)
        out.replace_all_uses_except(total, _owner(total))


def _next_op(op):
    block_ops = [o.operation for o in op.block.operations]
    return block_ops[next(k for k, o in enumerate(block_ops) if o == op) + 1]


def _sum_leading(value, t) -> ir.Value:
    """``reduce(value, add, dims=[0])`` of type ``t``."""
    zero = stablehlo.ConstantOp(ir.DenseElementsAttr.get_splat(
        ir.RankedTensorType.get([], t.element_type), ir.FloatAttr.get(t.element_type, 0.0))).result
    red = stablehlo.ReduceOp([t], [value], [zero], ir.DenseI64ArrayAttr.get([0]))
    scalar = ir.RankedTensorType.get([], t.element_type)
    block = red.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        stablehlo.ReturnOp([stablehlo.AddOp(*block.arguments).result])
    return red.results[0]
