"""Where a plan's predicted resharding goes: the cost of every graph edge it reshards.

The ILP charges each operand edge ``u -> v`` the resharding of ``u``'s chosen spec into the spec
``v``'s strategy reads, times ``v``'s cost weight (a loop body's trip count: the reshard runs every
iteration; a while's carry node reads its init once). Summed over the edges this is
``plan.predicted["resharding"]``; listing them says which values a plan moves and how often, e.g.
to compare a scanned layer stack with its unrolled twin edge by edge.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from alpa_pass.extract.graph import OpGraph


@dataclasses.dataclass(frozen=True)
class EdgeCost:
    """One resharded operand edge: ``producer`` read by operand ``operand`` of ``consumer``."""

    cost: float         # weighted: the reshard's alpha-beta cost x the consumer's weight
    weight: float       # the consumer's cost factor (1 outside loops, the trip count inside)
    producer: int
    consumer: int
    operand: int
    src: tuple          # core specs (tensor dim per mesh axis, -1 = none)
    dst: tuple


def resharding_edges(plan, graph: OpGraph) -> list[EdgeCost]:
    """Every edge of ``graph`` whose resharding costs something under ``plan`` (the plan of that
    graph, e.g. ``driver.jit.make_plan``'s pair), most expensive first; their costs sum to
    ``plan.predicted["resharding"]``."""
    from alpa_pass import _core  # the C++ core only when asked (plan/ is imported without it)

    mesh = plan.mesh.to_core(plan.axis_order)
    weights = np.ones(graph.num_nodes) if graph.weights is None else np.asarray(graph.weights)
    out = []
    for v in range(graph.num_nodes):
        for t, u in enumerate(graph.operands(v)):
            src, dst = plan.node_specs[u], plan.operand_specs[v][t]
            cost = _core.reshard_cost(mesh, graph.shape(u), float(graph.dtype_bytes[u]), src, dst)
            if cost > 0:
                out.append(EdgeCost(float(weights[v] * cost), float(weights[v]), int(u), v, t,
                                    tuple(src), tuple(dst)))
    return sorted(out, key=lambda e: (-e.cost, e.consumer, e.operand))
