"""Which values and uses emission constrains, and to what: a Plan turned into per-dim mesh axes.

``constraint_targets`` gives the layout of each planned value (``emit.constraints`` inserts one
``sdy.sharding_constraint`` after it); ``operand_targets`` gives use-site layouts, where a consumer
reads an operand resharded. Both are per-dim tuples of mesh axis names (``LogicalMesh.dim_axes``).
"""
from __future__ import annotations

import collections

from alpa_pass import _core
from alpa_pass.emit.constraints import reshard_steps, slice_first
from alpa_pass.extract.graph import CARRY_INDEX, NO_RESULT, OpGraph, OpKind
from alpa_pass.mesh import LogicalMesh

ANCHOR_KINDS = (OpKind.DOT, OpKind.CONVOLUTION, OpKind.REDUCE, OpKind.GATHER, OpKind.SCATTER)
USE_SITE_KINDS = (OpKind.DOT, OpKind.CONVOLUTION, OpKind.REDUCE, OpKind.GATHER, OpKind.SCATTER)


def constraint_targets(graph: OpGraph, plan, mesh: LogicalMesh, emit: str = "all") -> dict:
    """Node id -> per-dim mesh axis names, for every node emission should constrain (``emit``:
    "all" planned values, or only the "anchors": dots, convolutions, reduces, gathers, scatters)."""
    skip = (OpKind.PARAMETER, OpKind.OUTPUT, OpKind.GENERATOR)
    out = {}
    for v in range(graph.num_nodes):
        kind = OpKind(int(graph.kind[v]))
        if kind in skip or (emit == "anchors" and kind not in ANCHOR_KINDS):
            continue
        out[v] = mesh.dim_axes(plan.node_specs[v], len(graph.shape(v)))
    return out


def is_carry(graph: OpGraph, v: int) -> bool:
    """Whether node ``v`` is a while's carried slot: it reads the loop's init operand in the
    layout the loop carries. XLA takes the carry's layout from the init unless the while's
    operand is pinned, and a body that reads the carry in the plan's layout then reshards it on
    every iteration (a MoE layer stack on 2x4, jax 0.10.2: init split ``[1, 1, 8]``, body
    ``[2, 4, 1]``, each of 4 reshards a full rematerialization)."""
    return graph.locators[v].op_index == CARRY_INDEX


def reads_at_use(graph: OpGraph, v: int) -> bool:
    """Whether node ``v`` gets its operands in the plan's layout by a use-site constraint though
    it is no anchor: a while's carry (:func:`is_carry`), or the reads of an op without results
    (a host callback, ``OpLocator.result == NO_RESULT``: unconstrained, XLA moves its operand onto
    the callback's one device by a full rematerialization)."""
    loc = graph.locators[v]
    return loc.op_index == CARRY_INDEX or (loc.op_index >= 0 and loc.result == NO_RESULT)


def operand_targets(graph: OpGraph, plan, mesh: LogicalMesh) -> dict:
    """(node, operand index) -> dims, where an anchor op (dot, convolution, reduce, gather,
    scatter), a while's carry or a result-less op (:func:`reads_at_use`) reads an operand in another layout than its
    producer's: pin the layout the plan
    reshards it to, so XLA does exactly the planned resharding (and never partitions, e.g., a
    gather whose indices and operand disagree on batching dims — XLA 0.10 computes that wrongly on
    CPU; or reduces a whole operand the plan slices first, then all-reduces and slices the result).
    Other nodes get one only where their operand's resharding slices and gathers
    (``_slice_first_targets``), or moves an axis to another dim (``_moving_reshard``: the final
    layout, reached in ``operand_steps``)."""
    out = {}
    for v in range(graph.num_nodes):
        if OpKind(int(graph.kind[v])) not in USE_SITE_KINDS and not reads_at_use(graph, v):
            out.update(_slice_first_targets(graph, plan, mesh, v))
            out.update({(v, t): mesh.dim_axes(plan.operand_specs[v][t], len(graph.shape(u)))
                        for t, u in enumerate(graph.operands(v)) if _moving_reshard(graph, plan, mesh, v, t)})
            continue
        for t, u in enumerate(graph.operands(v)):
            want = plan.operand_specs[v][t]
            if want != plan.node_specs[u] and OpKind(int(graph.kind[u])) != OpKind.GENERATOR:
                out[(v, t)] = mesh.dim_axes(want, len(graph.shape(u)))
    return out


def operand_steps(graph: OpGraph, plan, mesh: LogicalMesh) -> dict:
    """(node, operand index) -> [dims, ...]: for each use-site layout of ``operand_targets`` (on an
    anchor op, or a moving one on another op: ``_moving_reshard``), the layouts its resharding
    passes through first (``emit.constraints.reshard_steps``), where it is more than one step XLA
    does directly."""
    anchor_reads = collections.defaultdict(list)  # node -> the anchors that read it, in its own layout
    for v in range(graph.num_nodes):
        if OpKind(int(graph.kind[v])) in USE_SITE_KINDS:
            for t, u in enumerate(graph.operands(v)):
                if plan.operand_specs[v][t] == plan.node_specs[u]:
                    anchor_reads[u].append(v)
    out = {}
    for v in range(graph.num_nodes):
        anchor = OpKind(int(graph.kind[v])) in USE_SITE_KINDS or reads_at_use(graph, v)
        for t, u in enumerate(graph.operands(v)):
            src, want = plan.node_specs[u], plan.operand_specs[v][t]
            if want == src or OpKind(int(graph.kind[u])) == OpKind.GENERATOR:
                continue
            steps = reshard_steps(src, want, graph.shape(u), mesh.shape, _step_cost(mesh, plan, graph, u))
            if not (anchor or (steps and _moving_reshard(graph, plan, mesh, v, t, steps))):
                continue
            if moves_an_axis(src, (steps or [want])[0]) and any(w != v for w in anchor_reads[u]):
                steps = [src, *steps]
            if steps:
                out[(v, t)] = [mesh.dim_axes(s, len(graph.shape(u))) for s in steps]
    return out


def moves_an_axis(src, dst) -> bool:
    """Whether resharding core spec ``src`` to ``dst`` moves a mesh axis from one tensor dim to
    another (an all-to-all). Where another anchor (a dot, ...) reads the value in ``src``, such a
    use-site chain starts with a copy in ``src`` itself: XLA's partitioner in jax >= 0.11,
    resharding a value that a dot has already read in ``src``, finds no all-to-all ("Involuntary
    full rematerialization": 2x4, ``[R, S(y)] -> [S(y), R]``, a Haiku attention weight read by
    its forward and its backward dots); from a copy that only this use reads, it does (jax 0.10.2
    does either). Not everywhere: XLA shares one reshard of a value between the uses that want
    the same layout, and a private copy makes the other uses reshard again (the MoE on 2x4: one
    more all-to-all)."""
    return any(s != -1 and d != -1 and s != d for s, d in zip(src, dst))


def _step_cost(mesh: LogicalMesh, plan, graph: OpGraph, u: int):
    """``cost(a, b)`` of resharding node ``u``'s value between core specs ``a`` and ``b``: the core's
    ``reshard_cost`` in the plan's axis order, at the mesh's own alpha/beta (a profile's would
    rescale the axes; ``reshard_steps`` only orders its steps by it)."""
    core, shape, nbytes = mesh.to_core(plan.axis_order), list(graph.shape(u)), float(graph.dtype_bytes[u])
    return lambda a, b: _core.reshard_cost(core, shape, nbytes, list(a), list(b))


def _moving_reshard(graph: OpGraph, plan, mesh: LogicalMesh, v: int, t: int, steps=None) -> bool:
    """Whether a non-anchor node ``v`` reads operand ``t`` resharded with an axis moved to another
    dim (steps beyond the slice-first one): XLA 0.10 does not find such moves on its own when they
    also gather or reorder, e.g. a Haiku MLP's ``dot -> add bias`` on 2x4, ``[R, R, S(x,y)] ->
    [S(y), R, R]``: it replicates the whole tensor ("Involuntary full rematerialization"); pinned
    with its steps, it is an all-to-all over y, then an all-gather over x. Only where every step
    splits each dim over one axis at most: a step through a dim split over two axes that later
    loses its major one costs a collective-permute XLA's own way did not (Wide-ResNet 2x4's
    ``conv -> add``, ``[S(x), R, R, S(y)] -> [S(y), R, R, R]`` through ``[S(x,y), ...]``).
    ``steps``: ``reshard_steps`` of this operand, when the caller has them."""
    u = graph.operands(v)[t]
    if OpKind(int(graph.kind[u])) in (OpKind.GENERATOR, OpKind.PARAMETER):
        return False
    src, want, shape = plan.node_specs[u], plan.operand_specs[v][t], graph.shape(u)
    steps = reshard_steps(src, want, shape, mesh.shape, _step_cost(mesh, plan, graph, u)) if steps is None else steps
    if not steps or steps == [slice_first(src, want, shape, mesh.shape)]:
        return False
    return all(len({d for d in step if d != -1}) == sum(d != -1 for d in step) for step in steps)


def _slice_first_targets(graph: OpGraph, plan, mesh: LogicalMesh, v: int) -> dict:
    """Use-site layouts for the operands of a non-anchor node ``v`` whose planned resharding both
    slices and gathers: the slice-first intermediate (``emit.constraints.slice_first``)."""
    out = {}
    for t, u in enumerate(graph.operands(v)):
        if OpKind(int(graph.kind[u])) in (OpKind.GENERATOR, OpKind.PARAMETER):
            continue
        mid = slice_first(plan.node_specs[u], plan.operand_specs[v][t], graph.shape(u), mesh.shape)
        if mid is not None:
            out[(v, t)] = mesh.dim_axes(mid, len(graph.shape(u)))
    return out
