"""Evaluate hand-written layouts with alpa_pass's own cost model.

A baseline fixes the layout of every argument (parameters, optimizer state, batch; the step's
outputs are tied to them). ``CostModel.pinned(specs)`` solves alpa_pass's sharding ILP with those
argument layouts forced and the rest free: the cheapest way, in the model, to run the step with the
baseline's layouts. That is a lower bound of what the baseline costs in the model (XLA may choose
worse intermediates), so ``auto objective <= pinned objective`` must hold for an optimal solve; a
violation means the solver stopped early or the planner has a bug.

With a memory budget (``AutoShardingOption.memory_budget_per_device``) the pinned solve still
ignores the memory rows (with every row in, a 39B step's MIP would not finish); a baseline whose
cheapest plan peaks over the budget (``predicted_peak``, reshard copies included) is reported
``OVER_BUDGET`` with no objective: auto, which must fit, is not compared with it. The status says
whether no plan with those layouts can fit at all (``least_peak``: every memory row at its least
total over the strategies the pins allow, a proven lower bound) or only the cheapest one does not.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from alpa_pass import _core
from alpa_pass.extract.stablehlo import extract_graph
from alpa_pass.mesh import LogicalMesh
from alpa_pass.options import AutoShardingOption
from alpa_pass.plan.plan import build_plan
from alpa_pass.driver.memory_rows import memory_row_matrix
from alpa_pass.driver.planning import core_graph
from alpa_pass.driver.request import node_ties
from alpa_pass.solve.highs import Solution, _pass_model
from alpa_pass.trace.lower import lower
from benchmarks.summary import OVER_BUDGET


@dataclasses.dataclass
class Evaluation:
    """The cost model's view of one layout: objective and its parts, plus arguments it could not pin
    (a spec the core does not enumerate for that tensor)."""

    objective: float
    predicted: dict
    unpinned: list
    status: str


class CostModel:
    """The sharding problem of ``fn(*args)`` on ``mesh`` (built once, solved per layout)."""

    def __init__(self, fn, args, mesh: LogicalMesh, option: AutoShardingOption):
        lowered = lower(fn, args)
        self.graph = extract_graph(lowered.compiler_ir("stablehlo"))
        ties = node_ties(self.graph, args, lowered.out_info) if option.tie_outputs_to_inputs else []
        self.problem = _core.build_sharding_problem(core_graph(self.graph), option.core_mesh(mesh),
                                                    option.to_core(), list(ties))
        self.mesh, self.option = mesh, option

    def free(self) -> Evaluation:
        """The unconstrained optimum of this problem (what the planner finds with these options)."""
        return self.pinned([None] * len(self.graph.param_nodes()))

    def pinned(self, arg_specs: list) -> Evaluation:
        """Solve with argument ``i`` forced to ``arg_specs[i]`` (a PartitionSpec, or None = free;
        flat argument order). Status "Infeasible" (objective inf) when no plan has those layouts."""
        params = self.graph.param_nodes()
        if len(arg_specs) != len(params):
            raise ValueError(f"{len(arg_specs)} specs for {len(params)} arguments")
        upper = np.array(self.problem.ilp.col_upper, dtype=np.float64)
        unpinned = []
        for v, spec in zip(params, arg_specs):
            if spec is not None and not self._pin(v, self._core_spec(spec, len(self.graph.shape(v))), upper):
                unpinned.append(f"{self.graph.labels[v]} {self.graph.shape(v)} -> {spec}")
        solution = _solve(self.problem.ilp, upper, self.option.solver_time_limit_s)
        if solution is None:
            return Evaluation(float("inf"), {}, unpinned, "Infeasible")
        plan = build_plan(self.graph, self.problem, solution, self.mesh, {})
        budget = self.option.memory_budget_per_device
        peak = float(self.problem.predicted_peak(solution.assignment)[0])
        if budget is not None and peak > budget * (1 + 1e-9):
            least = self.least_peak(upper)
            why = (f"no plan with these layouts fits: every one peaks at {least / 2**30:.4g} GiB or more"
                   if least > budget * (1 + 1e-9) else "a costlier plan with these layouts might fit (not solved)")
            return Evaluation(float("inf"), plan.predicted, unpinned,
                              f"{OVER_BUDGET} ({budget / 2**30:.4g} GiB): its cheapest plan peaks at "
                              f"{peak / 2**30:.4g} GiB; {why}")
        return Evaluation(plan.objective, plan.predicted, unpinned, solution.status)

    def least_peak(self, upper: np.ndarray) -> float:
        """A lower bound on the peak (reshard copies left out) of every plan whose strategies
        ``upper`` (column upper bounds) allows: the largest memory row with each group at its least
        coefficient among its allowed strategies (a strategy absent from a row adds 0; coefficients
        are bytes, >= 0). With nothing pinned, the core's ``memory_row_lower_bound``."""
        m = memory_row_matrix(self.problem)
        indptr, indices, data = m.indptr, m.indices, m.data
        num_rows = m.shape[0]
        if not num_rows:
            return 0.0
        gs = np.asarray(self.problem.ilp.group_var_start, dtype=np.int64)
        allowed_cols = np.asarray(upper[:gs[-1]]) > 0
        allowed_per_group = np.add.reduceat(allowed_cols.astype(np.int64), gs[:-1])
        row = np.repeat(np.arange(num_rows), np.diff(indptr))
        keep = (indices < gs[-1]) & (np.asarray(upper)[indices] > 0)
        row, col, value = row[keep], indices[keep], data[keep]
        group = np.searchsorted(gs, col, side="right") - 1
        key = row * (gs.size - 1) + group
        order = np.lexsort((value, key))
        key, value = key[order], value[order]
        first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        count = np.diff(np.r_[first, key.size])
        k = key[first]
        full = count == allowed_per_group[k % (gs.size - 1)]  # else an allowed strategy adds 0 to the row
        totals = np.bincount(k[full] // (gs.size - 1), weights=value[first][full], minlength=num_rows)
        return float(totals.max())

    def _core_spec(self, spec, rank: int) -> list[int]:
        out = [-1] * len(self.mesh.shape)
        for dim, entry in enumerate(tuple(spec)[:rank]):
            for name in (() if entry is None else (entry,) if isinstance(entry, str) else entry):
                out[self.mesh.axis_names.index(name)] = dim
        return out

    def _pin(self, v: int, want: list[int], upper: np.ndarray) -> bool:
        """Forbid every strategy of node v whose output spec is not ``want`` (size-1 mesh axes split
        nothing and are ignored); False if no strategy matches."""
        off = np.asarray(self.problem.strategy_offsets)
        outs = np.asarray(self.problem.out_specs)[off[v]:off[v + 1]]
        real = [i for i, s in enumerate(self.mesh.shape) if s > 1]
        match = [bool(np.array_equal(o[real], np.asarray(want)[real])) for o in outs]
        if not any(match):
            return False
        g = int(np.asarray(self.problem.node_group)[v])
        start, stop = (int(x) for x in np.asarray(self.problem.ilp.group_var_start)[g:g + 2])
        if stop - start == len(match):
            for s, ok in enumerate(match):
                if not ok:
                    upper[start + s] = 0.0
        return True


class _Bounds:
    """The ILP with other column upper bounds (everything else read through)."""

    def __init__(self, ilp, col_upper):
        self._ilp, self.col_upper = ilp, col_upper

    def __getattr__(self, name):
        return getattr(self._ilp, name)


def _solve(ilp, col_upper: np.ndarray, time_limit_s: float | None) -> Solution | None:
    """HiGHS on ``ilp`` with ``col_upper``; None when it finds no feasible assignment."""
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float("inf") if time_limit_s is None else float(time_limit_s))
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    _pass_model(h, _Bounds(ilp, col_upper), highspy)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    if x.size != ilp.num_cols or h.getInfo().primal_solution_status != 2:
        return None
    assignment = np.asarray(_core.decode_assignment(ilp, x), dtype=np.int64)
    result = _core.evaluate(ilp, assignment)
    return Solution(assignment=assignment, x=x, objective=float(result.objective), status=status,
                    optimal=status == "Optimal", mip_gap=float(h.getInfo().mip_gap),
                    time_limited=status == "Time limit reached", solve_time_s=0.0)


def flat_arg_specs(specs_tree) -> list:
    """PartitionSpec leaves of a pytree of specs, in argument order."""
    from jax.sharding import PartitionSpec

    return jax.tree.leaves(specs_tree, is_leaf=lambda x: isinstance(x, PartitionSpec))
