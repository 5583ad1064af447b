"""Which planned dots and sums hold partial sums that a reduce-scatter can finish (analysis only).

A node ``v`` (a two-operand dot, a reduce of one input and a scalar init, or a scatter without
batching dims: an embedding gradient) qualifies when every mesh axis ``k`` of size > 1 either

* splits nothing of ``v``'s operands and nothing of its result;
* is a *partial-sum* axis: it splits a contracted pair of dims (a dot: the lhs and the rhs dim of
  one contracting pair), a reduced dim (a reduce) or a scattered dim (a scatter: the updates' dim
  and the matching indices dim), and the result is not split on ``k`` — the plan all-reduces the
  partial sums over ``k``; or
* is a *compute* axis: the operand dims it splits all land on one result dim ``r``, split on
  every operand that has such a dim (a dot's batch dim: both; a free or kept dim: the one operand
  with it; a scatter's window dim that spans its input dim: the input and the updates; an indexed
  dim the update inserts: the input alone, the indices shifted to the device's rows), and the
  result is split on ``r`` over ``k`` too — the op runs locally on its shards along ``k``;

at least one axis is a partial-sum axis, and the result reaches an output of the step through
elementwise, transpose and reshape ops (and reduces or broadcasts of size-1 dims) only: a
parameter gradient and what the optimizer makes of it, the weight update that ZeRO-style sharding
is about. Partial sums of activations (a Megatron row-parallel layer's output, a softmax or
LayerNorm statistic) stay all-reduced: the next op of the layer reads them whole, so a
reduce-scatter would be all-gathered again at once (Megatron-LM's sequence parallelism, which
these plans do not model). Let ``A`` be the partial-sum axes (``n`` devices).
The scatter dim ``d`` is a result dim whose per-device size (after the compute axes' splits) ``n``
divides: the largest, preferring a dim whose splitting axes all come before ``A`` in mesh order
(so the scattered layout ``S + A`` of that dim stays in mesh order). A qualifying op with no such
dim (a scalar sum such as a loss) is left to XLA's all-reduce.
"""
from __future__ import annotations

import dataclasses
import math

from alpa_pass import _core
from alpa_pass.extract.graph import OpGraph, OpKind
from alpa_pass.mesh import LogicalMesh

_CONTRACTED = "contracted"
_PASS_THROUGH = (OpKind.ELEMENTWISE, OpKind.TRANSPOSE, OpKind.RESHAPE)


@dataclasses.dataclass(frozen=True)
class PartialSum:
    """One op to finish with a reduce-scatter.

    Attributes:
      node: the graph node (a DOT, REDUCE or SCATTER).
      axes: the partial-sum mesh axes ``A`` (indices, mesh order).
      dim: the result dim ``d`` the reduce-scatter splits over ``A``.
      operand_dims: per operand, per tensor dim, the mesh axis names splitting it (the plan's
        operand layouts; the manual computation's ``in_shardings``).
      local_dims: per result dim, the mesh axis names splitting the local (pre-scatter) result:
        the plan's result layout.
      out_dims: ``local_dims`` with ``A`` appended on ``dim``: the scattered result's layout.
    """

    node: int
    axes: tuple[int, ...]
    dim: int
    operand_dims: tuple[tuple[tuple[str, ...], ...], ...]
    local_dims: tuple[tuple[str, ...], ...]
    out_dims: tuple[tuple[str, ...], ...]


def partial_sums(graph: OpGraph, plan, mesh: LogicalMesh) -> dict[int, PartialSum]:
    """Node -> :class:`PartialSum` for every dot, reduce or scatter that qualifies (module docstring).

    A reduce's or scatter's combiner and its init / input are not checked here (the graph does not
    record them): the caller checks them on the MLIR op (a sum into zeros).
    """
    out = {}
    feeds = _feeds_outputs(graph)
    users = None
    for v in range(graph.num_nodes):
        axes = _partial_axes(graph, plan, mesh, v) if feeds[v] else None
        if not axes:
            continue
        shape = graph.shape(v)
        local_dims = tuple(mesh.dim_axes(plan.node_specs[v], len(shape), plan.axis_order))
        users = users if users is not None else _users(graph)
        dim = _scatter_dim(shape, local_dims, axes, mesh, _wanted_dim(graph, plan, users, v, axes))
        if dim is None:
            continue
        names = tuple(mesh.axis_names[a] for a in axes)
        out_dims = tuple(d + names if i == dim else d for i, d in enumerate(local_dims))
        operand_dims = tuple(tuple(mesh.dim_axes(s, len(graph.shape(u)), plan.axis_order))
                             for s, u in zip(plan.operand_specs[v], graph.operands(v)))
        out[v] = PartialSum(v, tuple(axes), dim, operand_dims, local_dims, out_dims)
    return out


def _feeds_outputs(graph: OpGraph) -> list[bool]:
    """Per node: its value reaches an OUTPUT node through ELEMENTWISE, TRANSPOSE and RESHAPE nodes
    and through reduces and broadcasts that only drop or add size-1 dims (what JAX makes of a
    bias's broadcast in the backward pass). Operands have lower ids than their users, so one
    backward sweep decides every node."""
    reach = [False] * graph.num_nodes
    for v in range(graph.num_nodes - 1, -1, -1):
        kind = OpKind(int(graph.kind[v]))
        operands = graph.operands(v)
        if kind == OpKind.OUTPUT or (kind in _PASS_THROUGH and reach[v]):
            for u in operands:
                reach[u] = True
        elif kind in (OpKind.REDUCE, OpKind.BROADCAST) and reach[v] and \
                math.prod(graph.shape(v)) == math.prod(graph.shape(operands[0])):
            reach[operands[0]] = True
    return reach


def _scatter_dim(shape, local_dims, axes, mesh: LogicalMesh, wanted: int | None = None) -> int | None:
    """The result dim to reduce-scatter over ``axes`` (module docstring), or ``None``. ``wanted``:
    the dim the value's consumers split over ``axes`` (:func:`_wanted_dim`), chosen first when
    it qualifies."""
    n = math.prod(mesh.shape[a] for a in axes)
    first = min(axes)
    best, best_key = None, None
    for d, size in enumerate(shape):
        splitters = [mesh.axis_names.index(name) for name in local_dims[d]]
        local = size // math.prod(mesh.shape[a] for a in splitters)
        if local % n:
            continue
        key = (d == wanted, all(a < first for a in splitters), local, -d)
        if best_key is None or key > best_key:
            best, best_key = d, key
    return best


def _users(graph: OpGraph) -> list[list[int]]:
    out = [[] for _ in range(graph.num_nodes)]
    for v in range(graph.num_nodes):
        for u in graph.operands(v):
            out[u].append(v)
    return out


def _wanted_dim(graph: OpGraph, plan, users, v: int, axes) -> int | None:
    """The dim of ``v``'s result that the first consumer splitting one dim over all of ``axes``
    splits, followed through elementwise ops and transposes (a weight gradient's dot computes
    ``[out, in]`` and transposes it to the kernel's ``[in, out]``, whose optimizer state is split
    on ``in``: scattering the dot's ``out`` dim would make XLA all-to-all every gradient into the
    state's layout). ``None``: no such consumer along a chain of single users."""
    dims = list(range(len(graph.shape(v))))  # this node's dim i is v's dim dims[i]
    while len(users[v]) == 1:
        u = users[v][0]
        kind = OpKind(int(graph.kind[u]))
        if kind == OpKind.TRANSPOSE:
            dims = [dims[i] for i in graph.node_attrs(u)]
        elif kind not in (OpKind.ELEMENTWISE, OpKind.OUTPUT) or len(graph.shape(u)) != len(dims):
            return None
        spec = plan.node_specs[u]
        split = {spec[a] for a in axes}
        if len(split) == 1 and min(split) >= 0:
            return dims[min(split)]
        v = u
    return None


def _partial_axes(graph: OpGraph, plan, mesh: LogicalMesh, v: int) -> list[int] | None:
    """The partial-sum axes of node ``v``, or ``None`` when ``v`` does not qualify."""
    maps = _dim_maps(graph, v)
    if maps is None:
        return None
    specs = plan.operand_specs[v]
    axes = []
    for k, size in enumerate(mesh.shape):
        if size == 1:
            continue
        split = {t: spec[k] for t, spec in enumerate(specs) if spec[k] >= 0}
        targets = {maps[t][dim] for t, dim in split.items()}
        result = plan.node_specs[v][k]
        if not split:
            if result >= 0:
                return None
            continue
        if len(targets) != 1 or None in targets:
            return None
        target = next(iter(targets))
        if set(split) != {t for t, m in enumerate(maps) if target in m}:
            return None  # a batch dim split on one operand only: not a local computation
        if target[0] == _CONTRACTED:
            if result >= 0:
                return None
            axes.append(k)
        elif result != target[1]:
            return None
    return axes


def _dim_maps(graph: OpGraph, v: int) -> list[list] | None:
    """Per operand of ``v``, per dim: ``("result", r)`` (it becomes result dim ``r``),
    ``("contracted", i)`` (contracting pair / reduced dims / scattered dim ``i``: summed over), or
    ``None`` (a dim no split of which runs locally); ``None`` for other kinds."""
    kind = OpKind(int(graph.kind[v]))
    operands = graph.operands(v)
    if kind == OpKind.SCATTER:
        return _scatter_maps(graph, v, _core.decode_scatter_attrs(graph.node_attrs(v)))
    if kind not in (OpKind.DOT, OpKind.REDUCE) or len(operands) != 2:
        return None
    if kind == OpKind.REDUCE:
        reduced = set(_core.decode_reduce_attrs(graph.node_attrs(v)).reduced_dims)
        kept = [d for d in range(len(graph.shape(operands[0]))) if d not in reduced]
        m = [(_CONTRACTED, 0) if d in reduced else ("result", kept.index(d))
             for d in range(len(graph.shape(operands[0])))]
        return [m, []]
    dot = _core.decode_dot_attrs(graph.node_attrs(v))
    lb, rb, lc, rc = dot.lhs_batch, dot.rhs_batch, dot.lhs_contracting, dot.rhs_contracting
    nb = len(lb)
    lrank, rrank = (len(graph.shape(u)) for u in operands)
    lfree = [d for d in range(lrank) if d not in lb and d not in lc]
    rfree = [d for d in range(rrank) if d not in rb and d not in rc]
    lm, rm = [None] * lrank, [None] * rrank
    for i, (l, r) in enumerate(zip(lb, rb)):
        lm[l], rm[r] = ("result", i), ("result", i)
    for i, (l, r) in enumerate(zip(lc, rc)):
        lm[l], rm[r] = (_CONTRACTED, i), (_CONTRACTED, i)
    for j, d in enumerate(lfree):
        lm[d] = ("result", nb + j)
    for j, d in enumerate(rfree):
        rm[d] = ("result", nb + len(lfree) + j)
    return [lm, rm]


def _scatter_maps(graph: OpGraph, v: int, a: _core.ScatterAttrs) -> list[list] | None:
    """Dim maps of a scatter ``[input, indices, updates]`` without batching dims: the i-th
    scattered dim of the updates and the i-th non-index-vector dim of the indices are summed over
    (``("contracted", i)``); an update window dim is local when it spans its input dim whole. An
    indexed input dim (in ``scatter_dims_to_operand_dims``) is local only when the update inserts
    it (one row per index: the vocab-split embedding gradient), and then only with the indices
    shifted to the device's rows (``reduce_scatter`` does); one with a window is not."""
    ivd, window, inserted = a.index_vector_dim, a.update_window_dims, a.inserted_window_dims
    if a.input_batching_dims:
        return None
    inp, idx, upd = (graph.shape(u) for u in graph.operands(v))
    windowed = set(a.scatter_dims_to_operand_dims) - set(inserted)
    input_map = [None if i in windowed else ("result", i) for i in range(len(inp))]
    window_inputs = [i for i in range(len(inp)) if i not in inserted]
    update_map: list = [None] * len(upd)
    for j, d in enumerate(window):
        if upd[d] == inp[window_inputs[j]]:
            update_map[d] = ("result", window_inputs[j])
    scattered = [d for d in range(len(upd)) if d not in window]
    for i, d in enumerate(scattered):
        update_map[d] = (_CONTRACTED, i)
    index_map: list = [(_CONTRACTED, i) for i in range(len(scattered))]
    if ivd < len(idx):
        index_map.insert(ivd, None)
    if len(index_map) != len(idx):
        return None
    return [input_map, index_map, update_map]
