"""Which dim of each value is the batch dim: forward from the batch arguments' dim 0 (Alpa's batch
dim map, which its ``force_batch_dim_to_mesh_dim`` restricts the dots and convolutions by).

A dim follows its value through elementwise ops, broadcasts, transposes, reshapes that keep it
(same size, same product of the dims before it), reduces over other dims, a dot's batch and free
dims and a convolution's batch dim. A value reached with two different batch dims keeps the first
(operands in order); one whose batch dim is reduced, contracted or merged has none.
"""
from __future__ import annotations

import math

from alpa_pass import _core
from alpa_pass.extract.graph import OpGraph, OpKind


def batch_dims(graph: OpGraph, seeds: dict[int, int]) -> dict[int, int]:
    """Node -> its batch dim, for ``seeds`` (node -> batch dim, e.g. the batch arguments' dim 0)
    and every node they reach. Node ids are topological, so one pass in id order suffices."""
    out = dict(seeds)
    for v in range(graph.num_nodes):
        if v in out:
            continue
        for t, u in enumerate(graph.operands(v)):
            if u in out:
                d = _through(graph, v, t, u, out[u])
                if d is not None:
                    out[v] = d
                    break
    return out


def _through(graph: OpGraph, v: int, t: int, u: int, d: int) -> int | None:
    """The dim of node ``v``'s result that operand ``t`` (node ``u``, batch dim ``d``) maps to."""
    kind, src, dst = OpKind(int(graph.kind[v])), graph.shape(u), graph.shape(v)
    attrs = graph.node_attrs(v)
    if kind == OpKind.ELEMENTWISE:
        return d if len(src) == len(dst) and d < len(dst) and src[d] == dst[d] else None
    if kind == OpKind.BROADCAST:
        return attrs[d] if d < len(attrs) else None
    if kind == OpKind.TRANSPOSE:
        return attrs.index(d) if d in attrs else None
    if kind == OpKind.RESHAPE:
        before = math.prod(src[:d])
        for j, size in enumerate(dst):
            if size == src[d] and math.prod(dst[:j]) == before:
                return j
        return None
    if kind == OpKind.REDUCE:
        return None if t != 0 or d in attrs else d - sum(1 for r in attrs if r < d)
    if kind == OpKind.DOT:
        dot = _core.decode_dot_attrs(attrs)
        batch, contract = (dot.lhs_batch, dot.lhs_contracting) if t == 0 else (dot.rhs_batch, dot.rhs_contracting)
        if d in batch:
            return list(batch).index(d)
        if d in contract:
            return None
        free = [i for i in range(len(src)) if i not in batch and i not in contract]
        offset = len(dot.lhs_batch)
        if t == 1:
            lhs = graph.shape(graph.operands(v)[0])
            offset += len(lhs) - len(dot.lhs_batch) - len(dot.lhs_contracting)
        return offset + free.index(d)
    if kind == OpKind.CONVOLUTION:
        conv = _core.decode_conv_attrs(attrs)
        return conv.output_batch if t == 0 and d == conv.input_batch else None
    return None
