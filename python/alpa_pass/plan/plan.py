"""The Plan: what the planner chose, what it predicts, and a table a person can read."""
from __future__ import annotations

import dataclasses
import io
import os

import numpy as np

from rich.console import Console
from rich.table import Table

from alpa_pass.extract.graph import OpGraph, OpKind
from alpa_pass.mesh import LogicalMesh
from alpa_pass.plan import serialize


@dataclasses.dataclass
class NodeChoice:
    """One planned value: its label, shape, chosen strategy and that strategy's own cost."""

    node: int
    kind: str
    label: str
    shape: tuple[int, ...]
    dtype_bytes: int
    spec: object          # jax PartitionSpec of the value
    strategy: str
    cost: float           # compute + communication of the strategy (resharding into it excluded)

    @property
    def bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype_bytes


@dataclasses.dataclass
class Plan:
    """A sharding plan for one function signature on one logical mesh.

    Attributes:
      mesh: the LogicalMesh planned for.
      objective: the ILP objective (predicted cost, in the mesh's alpha/beta units).
      predicted: {"compute", "communication", "resharding"} parts of the objective, and
        "peak_bytes": the predicted per-device peak memory (also ``predicted_peak_bytes``).
      input_specs / output_specs: one ``PartitionSpec`` per argument / output leaf.
      axis_order: the mesh axis names, most major first, in which a dim split over several mesh
        axes lists them, in ``input_specs`` / ``output_specs`` and in every constraint emission
        writes: the order the planner priced its reshards in (``driver.planning.solve_graph``'s
        ``axis_order``; empty: mesh order). Set with :meth:`order_axes`.
      node_specs: core spec (tensor dim per mesh axis, -1 = none) of every graph node.
      operand_specs: per node, the core spec each operand must have for the chosen strategy.
      choices: a NodeChoice per graph node.
      ilp_size: {"columns", "rows", "nonzeros", "groups", "edge_columns", "nodes", "memory_rows",
        "groups_untied" (groups before repeated layers were tied)}.
      solve_time_s, solver_status, mip_gap: how the solve went.
      timings: seconds per phase ("trace", "extract", "build", "solve", "emit", "compile").
      fallbacks: op name -> count of ops planned as replicated because the core does not know them.
      emit_report: what emission inserted and skipped.
      fingerprint: the planned request's identity (see ``driver.request.fingerprint``).
      made_with: {"alpa_pass", "jax"} versions and "options" (the planning options used).
      origin: "solver" (solved now), "cache" (read from ``plan_cache_dir``) or "saved"
        (``ShardParallel(plan=...)``).
      mesh_search: with ``mesh="auto"``, one {"shape", "objective", "solve_s", ...} per shape tried.
      refinement: which solve produced the plan and both objectives (``driver.refine.refine_unmerged``:
        {"solve": "merged" | "unmerged", "merged_objective", "unmerged_objective", "skipped", ...}).
      memory_budget: the per-device budget planned under: {"bytes" (None: no budget), "source":
        "given" (memory_budget_per_device), "device" (a fraction of the device's memory) or "none"}.
    """

    mesh: LogicalMesh
    objective: float
    predicted: dict
    input_specs: list
    output_specs: list
    node_specs: list
    operand_specs: list
    choices: list
    ilp_size: dict
    solve_time_s: float
    solver_status: str
    mip_gap: float
    timings: dict
    fallbacks: dict
    emit_report: object = None
    fingerprint: str = ""
    made_with: dict = dataclasses.field(default_factory=dict)
    origin: str = "solver"
    mesh_search: list = dataclasses.field(default_factory=list)
    refinement: dict = dataclasses.field(default_factory=dict)
    memory_budget: dict = dataclasses.field(default_factory=dict)
    axis_order: list = dataclasses.field(default_factory=list)

    def partition_spec(self, spec, rank: int):
        """A core spec (tensor dim per mesh axis, -1 = none) as a ``PartitionSpec`` in this plan's
        axis order."""
        return self.mesh.spec_to_partition_spec(spec, rank, self.axis_order)

    def order_axes(self, order, graph: OpGraph) -> None:
        """Set ``axis_order`` (mesh axis names, most major first) and rewrite the argument, output
        and per-node ``PartitionSpec``s of ``graph``'s nodes in it."""
        self.axis_order = list(order)
        for c in self.choices:
            c.spec = self.partition_spec(self.node_specs[c.node], len(c.shape))
        self.input_specs = [self.choices[v].spec for v in graph.param_nodes()]
        self.output_specs = [self.choices[v].spec for v in graph.output_nodes()]

    def summary(self, max_rows: int = 20) -> str:
        """A text report: mesh, ILP size and timings, predicted costs, largest tensors first."""
        console = Console(file=io.StringIO(), width=130, record=True)
        axes = ", ".join(f"{n}={s} (a={a:g}, b={b:g})" for n, s, a, b in
                         zip(self.mesh.axis_names, self.mesh.shape, self.mesh.alpha, self.mesh.beta))
        console.print(f"[bold]alpa_pass plan[/bold] on mesh {axes}")
        console.print(f"objective {self.objective:.6g} = compute {self.predicted['compute']:.4g} + "
                      f"communication {self.predicted['communication']:.4g} + "
                      f"resharding {self.predicted['resharding']:.4g}   "
                      f"[{self.solver_status}, gap {self.mip_gap:.2g}]")
        console.print(f"predicted peak memory per device {self.predicted_peak_bytes / 2**20:.4g} MiB "
                      f"({int(self.predicted_peak_bytes)} bytes)")
        if self.memory_budget:
            console.print(budget_line(self.memory_budget))
        size = self.ilp_size
        tied = (f" ({size['groups_untied']} before tying repeated layers)"
                if size.get("groups_untied", size["groups"]) != size["groups"] else "")
        console.print(f"ILP: {size['nodes']} ops -> {size['groups']} groups{tied}, {size['columns']} columns "
                      f"({size['edge_columns']} edge), {size['rows']} rows, {size['nonzeros']} nonzeros")
        if self.refinement:
            console.print(self._refinement_line())
        console.print("time: " + ", ".join(f"{k} {v:.3f}s" for k, v in self.timings.items()) +
                      ("" if self.origin == "solver" else f"   (plan from {self.origin}, not solved)"))
        if self.mesh_search:
            console.print(search_summary(self.mesh_search, self.mesh.shape))
        if self.fallbacks:
            console.print("replicated (unknown to the core): " +
                          ", ".join(f"{k} x{v}" for k, v in sorted(self.fallbacks.items())))
        table = Table(title=f"largest tensors (top {max_rows})")
        for col in ("tensor", "kind", "shape", "MiB", "sharding", "strategy", "cost"):
            table.add_column(col)
        for c in self.largest(max_rows):
            table.add_row(c.label, c.kind, "x".join(map(str, c.shape)) or "()", f"{c.bytes / 2**20:.3f}",
                          str(c.spec), c.strategy, f"{c.cost:.4g}")
        console.print(table)
        return console.export_text()

    def _refinement_line(self) -> str:
        r = self.refinement
        merged = f"merged ILP objective {r['merged_objective']:.6g}"
        if "unmerged_objective" not in r:
            return f"solve: {merged}; unmerged refinement skipped ({r.get('skipped', 'not run')})"
        change = r["unmerged_objective"] / r["merged_objective"] - 1 if r["merged_objective"] else 0.0
        return (f"solve: {r['solve']} ILP kept; {merged}, unmerged ILP ({r['unmerged_columns']} columns{', untied' if r.get('untied') else ''}) "
                f"{r['unmerged_objective']:.6g} ({change:+.1%}) [{r['unmerged_status']}, {r['time_s']:.2f}s]")

    @property
    def predicted_peak_bytes(self) -> float:
        """Predicted per-device peak memory in bytes: live arguments, optimizer state and the
        activations XLA materialises (docs/core_api.md "Memory")."""
        return self.predicted["peak_bytes"]

    def largest(self, n: int) -> list[NodeChoice]:
        """Parameters, outputs, dots/convolutions/gathers/scatters, largest first."""
        keep = {"PARAMETER", "OUTPUT", "DOT", "CONVOLUTION", "GATHER", "SCATTER"}
        rows = [c for c in self.choices if c.kind in keep]
        return sorted(rows, key=lambda c: (-c.bytes, c.node))[:n]

    def to_json(self) -> str:
        """The plan as JSON text (``Plan.from_json`` reads it back; layout in ``plan.serialize``)."""
        return serialize.plan_to_json(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        """Rebuild a plan from ``plan.serialize.plan_to_dict``'s dict (PlanMismatchError if it is
        not one)."""
        return serialize.plan_from_dict(d, cls, NodeChoice)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Plan":
        """Read a plan from ``to_json`` text (or its bytes). Raises PlanMismatchError for what is
        not a plan of this format version; ``ShardParallel(plan=...)`` checks jax version,
        function, mesh and that the specs fit."""
        return serialize.plan_from_json(text, cls, NodeChoice)

    def save(self, path) -> None:
        """Write ``to_json()`` to ``path`` (``~`` expanded; atomically: a half-written file never
        appears)."""
        serialize.write_atomic(os.path.expanduser(os.fspath(path)), self.to_json())

    @classmethod
    def load(cls, path) -> "Plan":
        """``from_json`` of the file at ``path`` (``~`` expanded); PlanMismatchError for a file
        that is not a plan (e.g. a binary file)."""
        with open(os.path.expanduser(os.fspath(path)), "rb") as f:
            return cls.from_json(f.read())

    def __repr__(self):
        return (f"Plan(mesh={self.mesh.shape}, objective={self.objective:.6g}, "
                f"inputs={len(self.input_specs)}, outputs={len(self.output_specs)}, "
                f"status={self.solver_status!r})")


def search_summary(mesh_search: list, chosen: tuple | None = None) -> str:
    """One line: each shape tried with its objective; ``chosen`` (a shape) and cut-off solves are
    marked."""
    parts = []
    for e in mesh_search:
        name = "x".join(map(str, e["shape"]))
        if e.get("same_as"):
            parts.append(f"{name} = {'x'.join(map(str, e['same_as']))}")
        elif e["objective"] is None:
            parts.append(f"{name} infeasible")
        else:
            mark = " (chosen)" if chosen is not None and tuple(e["shape"]) == tuple(chosen) else ""
            mark += " (cut off)" if e.get("cut_off") else ""
            parts.append(f"{name} {e['objective']:.6g}{mark}")
    return "mesh search: " + ", ".join(parts)


def build_plan(graph: OpGraph, problem, solution, mesh: LogicalMesh, timings: dict) -> Plan:
    """Decode a solved ShardingProblem into a Plan."""
    ilp = problem.ilp
    rows = np.asarray(problem.strategy_offsets)[:-1] + np.asarray(solution.assignment)[np.asarray(problem.node_group)]
    out_specs = np.asarray(problem.out_specs)
    weights = np.ones(graph.num_nodes) if graph.weights is None else np.asarray(graph.weights)
    compute = np.asarray(problem.compute_cost)[rows] * weights  # a loop body's ops: x trip count
    comm = np.asarray(problem.comm_cost)[rows] * (weights if graph.comm_weights is None else
                                                  np.asarray(graph.comm_weights))
    names = problem.strategy_names
    in_offsets, in_specs = np.asarray(problem.in_spec_offsets), np.asarray(problem.in_specs)
    operand_specs = [[[int(a) for a in row] for row in in_specs[in_offsets[r]:in_offsets[r + 1]]]
                     for r in rows]
    node_specs, choices = [], []
    for v in range(graph.num_nodes):
        spec = [int(a) for a in out_specs[rows[v]]]
        shape = graph.shape(v)
        node_specs.append(spec)
        choices.append(NodeChoice(node=v, kind=OpKind(int(graph.kind[v])).name, label=graph.labels[v],
                                  shape=shape, dtype_bytes=int(graph.dtype_bytes[v]),
                                  spec=mesh.spec_to_partition_spec(spec, len(shape)),
                                  strategy=names[rows[v]], cost=float(compute[v] + comm[v])))
    predicted = {"compute": float(compute.sum()), "communication": float(comm.sum())}
    resharding = float(solution.objective - predicted["compute"] - predicted["communication"])
    predicted["resharding"] = 0.0 if abs(resharding) <= 1e-9 * max(1.0, abs(solution.objective)) else resharding
    predicted["peak_bytes"] = float(problem.predicted_peak(np.asarray(solution.assignment, dtype=np.int64))[0])
    ilp_size = {"nodes": graph.num_nodes, "groups": int(ilp.num_groups), "columns": int(ilp.num_cols),
                "edge_columns": int(ilp.num_edge_vars), "rows": int(ilp.num_rows),
                "nonzeros": int(len(ilp.a_value)), "memory_rows": int(problem.num_memory_rows),
                "groups_untied": int(problem.repeat_stats["groups_before"]) or int(ilp.num_groups)}
    return Plan(mesh=mesh, objective=float(solution.objective), predicted=predicted,
                input_specs=[choices[v].spec for v in graph.param_nodes()],
                output_specs=[choices[v].spec for v in graph.output_nodes()],
                node_specs=node_specs, operand_specs=operand_specs, choices=choices, ilp_size=ilp_size,
                solve_time_s=solution.solve_time_s, solver_status=solution.status,
                mip_gap=solution.mip_gap, timings=timings, fallbacks=dict(graph.fallbacks))


def budget_line(budget: dict) -> str:
    """The summary's line saying which memory budget the plan was made under."""
    if budget.get("bytes") is None:
        return "memory budget: none (CPU devices, or device_memory_fraction=None: give memory_budget_per_device)"
    gib = budget["bytes"] / 2**30
    if budget["source"] == "device":
        return (f"memory budget: {gib:.4g} GiB per device = {budget['fraction']:g} x the device's "
                f"{budget['bytes_limit'] / 2**30:.4g} GiB (memory_stats bytes_limit)")
    return f"memory budget: {gib:.4g} GiB per device (memory_budget_per_device)"
