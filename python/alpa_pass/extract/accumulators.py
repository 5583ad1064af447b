"""Gradient accumulators in loops: which dots' partial sums are reduced once per loop, not per trip.

A ``lax.scan`` that sums gradients over micro-batches carries ``acc`` and yields ``acc + g``, ``g``
a weight-gradient dot or a bias gradient's (or the loss's) sum (through a transpose, a reshape, a
convert, a slice, a sum of size-1 dims or a constant factor). When the plan splits the dot's
contracted dim or the sum's reduced dim (the micro-batch) over some mesh axes, its partial sums
need one reduction over those axes; emission (:mod:`alpa_pass.emit.accumulation`) carries them
per shard and reduces once after the loop, as Alpa does (its gradient sync cost divided by the
micro-batch count). So such a dot's own communication cost counts with the weight outside the
loop, not the trip count; its compute and the resharding of its operands still count every trip.

The graph pattern (the one the emission pass matches in the module): a carried slot whose carry
node's only user is an add in the yield's tree of ``stablehlo.add`` nodes (``acc + g``, or
``acc + g1 + g2 ...``: an RK4 step adds its four stages' weight gradients in turn) whose other
leaves are chains of ``stablehlo.transpose`` / ``stablehlo.reshape`` / ``stablehlo.convert`` /
``stablehlo.slice`` nodes (and reduces of size-1 dims, products and quotients with a constant: a
mean's divisor) over a dot or reduce, where every user of the dot and of the chain nodes is in the
chains of the carries it feeds (a fused LSTM kernel's gradient is sliced into its gates'
accumulators). What emission checks besides (the init is zeros, a reduce sums, the partial sums
come from one contracted / reduced dim, every source of a tree split over the same axes) is not in
the graph: a node that matches here but not there is costed as reduced once and is all-reduced
every trip (an optimistic estimate, never wrong numbers).
"""
from __future__ import annotations

import numpy as np

from alpa_pass.extract.graph import OpGraph, OpKind

_CHAIN = ("stablehlo.transpose", "stablehlo.reshape", "stablehlo.convert", "stablehlo.slice")


def accumulated_comm_weights(graph: OpGraph, loops: list) -> np.ndarray | None:
    """float64[N]: ``graph.weights`` with each accumulated dot's entry replaced by the weight
    outside its loop (module docstring); None when there is none. ``loops``: per while that
    emission rewrites (the entry function's top-level ones), (carry nodes, yield nodes, weight
    outside the loop)."""
    users = [[] for _ in range(graph.num_nodes)]
    for v in range(graph.num_nodes):
        for u in graph.operands(v):
            users[u].append(v)
    out = np.asarray(graph.weights, dtype=np.float64).copy()
    found = False
    for carry, yields, outer in loops:
        trees: list[tuple[set, set, set]] = []  # (partial-sum nodes, chain nodes, adds) per tree
        for c, y in zip(carry, yields):
            hit = _accumulated_sources(graph, users, c, y)
            if hit is None:
                continue
            tree = (set(hit[0]), set(hit[1]), {y})
            for other in [t for t in trees if t[0] & tree[0]]:  # slots that share a source: one tree
                trees.remove(other)
                for mine, theirs in zip(tree, other):
                    mine.update(theirs)
            trees.append(tree)
        for sources, chain, adds in trees:
            if all(set(users[v]) <= chain | adds for v in chain | sources):
                out[list(sources)] = outer
                found = True
    return out if found else None


def _accumulated_sources(graph: OpGraph, users: list, c: int, y: int) -> tuple[list[int], list[int]] | None:
    """(partial-sum nodes, chain nodes) for carry ``c`` yielded as a tree of adds ``y`` whose leaves
    are ``c`` (once) and chains over partial-sum nodes: ``c + chain(dot)``, ``c + d1 + d2 ...``
    (the inner adds, read only by their parent add, join the chain nodes)."""
    if graph.op_names[y] != "stablehlo.add" or len(users[c]) != 1:
        return None
    sources: list[int] = []
    chain: list[int] = []
    seen_carry = False
    stack = [y]
    while stack:
        add = stack.pop()
        ops = graph.operands(add)
        if len(ops) != 2:
            return None
        for v in ops:
            if v == c:
                if seen_carry or users[c] != [add]:
                    return None
                seen_carry = True
            elif graph.op_names[v] == "stablehlo.add" and users[v] == [add]:
                chain.append(v)
                stack.append(v)
            else:
                while graph.op_names[v] in _CHAIN or _drops_unit_dims(graph, v) or _scaled(graph, v) is not None:
                    chain.append(v)
                    v = graph.operands(v)[_scaled(graph, v) or 0]
                if OpKind(int(graph.kind[v])) not in (OpKind.DOT, OpKind.REDUCE):
                    return None
                sources.append(v)
    return (sources, chain) if seen_carry else None


def _constant(graph: OpGraph, v: int) -> bool:
    if graph.op_names[v] == "stablehlo.broadcast_in_dim":
        v = graph.operands(v)[0]
    return graph.op_names[v] == "stablehlo.constant"


def _scaled(graph: OpGraph, v: int) -> int | None:
    """For ``x / c``, ``x * c`` or ``c * x`` (``c`` a constant): the operand index of ``x``."""
    ops = graph.operands(v)
    if graph.op_names[v] not in ("stablehlo.divide", "stablehlo.multiply") or len(ops) != 2:
        return None
    k = 1 if graph.op_names[v] == "stablehlo.multiply" and _constant(graph, ops[0]) else 0
    return k if _constant(graph, ops[1 - k]) and not _constant(graph, ops[k]) else None


def _drops_unit_dims(graph: OpGraph, v: int) -> bool:
    """A reduce that only drops size-1 dims (what JAX makes of a bias's broadcast)."""
    return OpKind(int(graph.kind[v])) == OpKind.REDUCE and \
        int(np.prod(graph.shape(v))) == int(np.prod(graph.shape(graph.operands(v)[0])))
