"""The reshard copies a budgeted problem's memory rows count, gathered from the plans solved so far
(``driver.budget.fit_reshard_copies`` adds each plan's; ``_core`` memory.h "Reshard copies")."""
from __future__ import annotations

import itertools
import math

import numpy as np


def layout_twins(layout, mesh_shape) -> list:
    """``layout`` (a tensor dim or -1 per mesh axis) and its images under every permutation of
    mesh axes of equal size, distinct, ``layout`` first: on a square mesh a plan and its mirror
    (axes swapped) cost the same, so a copy counted in one layout only moves the solver to its
    mirror, which makes the same copy in the twin layout."""
    layout = tuple(int(d) for d in layout)
    out = [layout]
    by_size: dict = {}
    for axis, size in enumerate(mesh_shape):
        by_size.setdefault(size, []).append(axis)
    for axes in by_size.values():
        if len(axes) < 2:
            continue
        for base in list(out):
            for perm in itertools.permutations(axes):
                twin = list(base)
                for src, dst in zip(axes, perm):
                    twin[dst] = base[src]
                if tuple(twin) not in out:
                    out.append(tuple(twin))
    return out


class ReshardCopies:
    """The reshard copies a problem's memory rows count (``build_sharding_problem(copies=...)``),
    gathered from the plans solved so far, each with its ``layout_twins``; ``add`` rebuilds the
    problem with those of one more plan (``rebuild(row_budget)``: the problem built with
    ``as_list()``, its memory rows bounded by ``row_budget`` or, if None, the option's budget)."""

    def __init__(self, rebuild, mesh_shape, graph=None):
        self._rebuild = rebuild
        self.mesh_shape = tuple(mesh_shape)
        self.graph = graph  # the OpGraph the problems are built from (exact_copies' candidates)
        # (consumer, operand, layout) -> [start, end]: the union of the ranges plans gave that copy
        # (its start depends on which earlier consumers read the same layout), in insertion order;
        # one entry per copy, so a copy two plans gave different ranges is not counted twice
        self._counted: dict = {}
        self.problem = None  # the last problem rebuilt
        self.least_peak = math.inf  # the least peak, copies included, of a plan solved so far (see seen)

    def __len__(self) -> int:
        return len(self._counted)

    def clear(self) -> None:
        self._counted.clear()
        self.problem = None

    def seen(self, problem, assignment) -> float:
        """The peak of ``assignment`` (reshard copies included; every problem of one graph agrees),
        kept in ``least_peak`` when it is the least so far: a budget that plan meets, named by an
        InfeasibleError when the least-memory plan (whose rows ignore copies) peaks higher."""
        peak = float(problem.predicted_peak(np.asarray(assignment, dtype=np.int64))[0])
        self.least_peak = min(self.least_peak, peak)
        return peak

    def as_list(self) -> list:
        return [(c, t, list(w), a, b) for (c, t, w), (a, b) in self._counted.items()]

    def add(self, problem, assignment, row_budget=None):
        """``problem`` rebuilt with the reshard copies of ``assignment`` (a strategy per group) counted
        too, its memory rows bounded by ``row_budget`` (None: the option's budget)."""
        for consumer, operand, layout, start, end, _ in problem.reshard_copies(np.asarray(assignment, dtype=np.int64)):
            for twin in layout_twins(layout, self.mesh_shape):
                span = self._counted.setdefault((int(consumer), int(operand), twin), [int(start), int(end)])
                span[0], span[1] = min(span[0], int(start)), max(span[1], int(end))
        self.problem = self._rebuild(row_budget)
        return self.problem
