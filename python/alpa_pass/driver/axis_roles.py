"""Which strategies of a plan's groups differ from the plan's on one mesh axis only.

A strategy of a node says, per mesh axis, which dim of its result and of each operand that axis
splits (``ShardingProblem.out_specs``, ``in_specs``: per row, the dim each axis splits or -1): the
axis's *role*. A budget often moves one axis's role across a whole layer at once: GPT-175B on
16x16 at 80 GiB, the LP with memory rows moved the second axis of every dot of a layer from the
activations (``c0@x lfree1@y``) to the weights (``c0@x rfree0@y``, Megatron's split) together
with the weights' own layouts. No such strategy is on a group's own (bytes, cost) frontier (each
costs more than the activation split and holds as many bytes where the free plan peaks); only the
whole move pays (``driver.exact_copies.frontier_columns`` keeps these neighbours for that).
"""
from __future__ import annotations

import numpy as np


def one_axis_neighbours(problem, assignment) -> np.ndarray:
    """A mask over ``problem.ilp``'s group columns (``group_var_start[0]`` on): each group's
    strategies whose leader node's role on every mesh axis but one equals that of the group's
    strategy in ``assignment`` (the plan's own strategy included). Only axes some strategy splits
    count (a mesh axis of size 1 splits nothing); all False with fewer than two: on one axis every
    strategy is such a neighbour."""
    ilp = problem.ilp
    gs = np.asarray(ilp.group_var_start, dtype=np.int64)
    mask = np.zeros(int(gs[-1] - gs[0]), dtype=bool)
    out = np.asarray(problem.out_specs, dtype=np.int64)
    ins = np.asarray(problem.in_specs, dtype=np.int64)
    axes = np.flatnonzero((out >= 0).any(axis=0) | (ins >= 0).any(axis=0))
    if axes.size < 2:
        return mask
    out, ins = out[:, axes], ins[:, axes]
    node_group = np.asarray(problem.node_group, dtype=np.int64)
    groups, leader = np.unique(node_group, return_index=True)  # a group's first node: its leader
    leader, groups = leader[groups >= 0], groups[groups >= 0]
    sizes = np.diff(gs)[groups]
    offsets = np.asarray(problem.strategy_offsets, dtype=np.int64)
    column = np.repeat(gs[groups] - gs[0], sizes) + _ranges(sizes)
    row = np.repeat(offsets[leader], sizes) + _ranges(sizes)  # each group column's leader row
    plan_row = np.repeat(offsets[leader] + np.asarray(assignment, dtype=np.int64)[groups], sizes)
    differs = out[row] != out[plan_row]  # [group column, axis]
    in_offsets = np.asarray(problem.in_spec_offsets, dtype=np.int64)
    operands = in_offsets[row + 1] - in_offsets[row]  # (a node's strategies read as many operands)
    which = np.repeat(np.arange(row.size), operands)
    k = _ranges(operands)
    np.logical_or.at(differs, which, ins[in_offsets[row][which] + k] != ins[in_offsets[plan_row][which] + k])
    mask[column] = differs.sum(axis=1) <= 1
    return mask


def _ranges(sizes: np.ndarray) -> np.ndarray:
    """0..n-1 for each n of ``sizes``, concatenated."""
    sizes = np.asarray(sizes, dtype=np.int64)
    return np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
