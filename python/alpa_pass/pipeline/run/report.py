"""The pipeline plan a person reads: layers -> stages -> submeshes, predicted costs, the schedule."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json

from alpa_pass.runtime.multiprocess import plan_digest


@dataclasses.dataclass
class StageReport:
    """One stage: layers [start, stop), its submesh, and the intra-op plans' predictions."""

    index: int
    layers: tuple
    physical_shape: tuple
    logical_shape: tuple
    devices: tuple
    predicted_fwd: float
    predicted_bwd: float


@dataclasses.dataclass
class ApplyReport:
    """One apply executable: where it runs (``site``: a stage index or "cross" for the
    cross-stage equations on the whole mesh), its phase, devices, how many step equations it
    evaluates, its state inputs (donated, kept), its other inputs and outputs, and its Plan."""

    site: object
    phase: int
    devices: tuple
    num_eqns: int
    donated: int
    kept: int
    num_inputs: int
    num_outputs: int
    plan: object


@dataclasses.dataclass
class PipelinePlan:
    """Attributes: stages (StageReport), num_layers, num_micro_batches, schedule name, ticks (per
    clock tick the (stage, kind, micro) tasks run), apply (ApplyReport per apply executable, in run
    order), timings, digest (hex sha256 of everything that decides what runs where: stages, their
    devices, the schedule and every intra-op plan; equal on every process of a multi-process job),
    stacked (how many stacked ``[L, ...]`` leaves the stages hold in pieces, and the pieces' bounds)."""

    stages: list
    num_layers: int
    num_micro_batches: int
    schedule: str
    ticks: list
    apply: list
    timings: dict
    digest: str = ""
    stacked: tuple = ()  # (user leaves cut into per-stage pieces, piece bounds along dim 0); () = none

    @classmethod
    def from_program(cls, program) -> "PipelinePlan":
        stages = [StageReport(i, tuple(c.spec.layers), c.spec.physical_shape, c.spec.mesh.shape,
                              tuple(d.id for d in c.spec.mesh.devices), c.fwd_plan.objective,
                              c.bwd_plan.objective) for i, c in enumerate(program.stages)]
        apply = [ApplyReport(a.site, a.program.phase, tuple(d.id for d in a.mesh.jax_mesh().devices.flat),
                             len(a.program.eqns), len(a.program.inputs[0]), len(a.program.inputs[1]),
                             len(a.program.inputs[2]), len(a.program.outputs[2]), a.plan) for a in program.apply]
        split = program.split
        stacked = () if split is None else (
            len({i for i, j in split.inputs if j is not None}), tuple(split.bounds))
        return cls(stages, len(program.layers), program.method.num_micro_batches,
                   program.method.pipeline_schedule, program.ticks, apply, program.timings,
                   _digest(program, stages), stacked)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def summary(self) -> str:
        """Tables: per stage its layers, submesh, devices and predicted forward/backward cost; per
        apply executable its site, phase, devices, size, state (donated/kept) and predicted cost."""
        from rich.console import Console
        from rich.table import Table

        console = Console(file=io.StringIO(), width=130, record=True)
        console.print(f"[bold]alpa_pass pipeline plan[/bold]: {self.num_layers} layers, {self.num_stages} stages, "
                      f"{self.num_micro_batches} micro-batches, schedule {self.schedule} ({len(self.ticks)} ticks)")
        console.print("time: " + ", ".join(f"{k} {v:.3f}s" for k, v in self.timings.items()))
        if self.stacked:
            console.print(f"stacked leaves held per piece: {self.stacked[0]} (parameters and the optimizer "
                          f"state updated with them), rows cut at {list(self.stacked[1])}")
        table = Table(title="stages")
        for col in ("stage", "layers", "submesh", "logical mesh", "devices", "fwd cost", "bwd cost"):
            table.add_column(col)
        for s in self.stages:
            table.add_row(str(s.index), f"{s.layers[0]}..{s.layers[-1]}", "x".join(map(str, s.physical_shape)),
                          "x".join(map(str, s.logical_shape)), ",".join(map(str, s.devices)),
                          f"{s.predicted_fwd:.4g}", f"{s.predicted_bwd:.4g}")
        console.print(table)
        console.print(self._apply_table())
        return console.export_text()

    def _apply_table(self):
        from rich.table import Table

        table = Table(title="apply (optimizer update) executables, in run order")
        for col in ("site", "phase", "devices", "eqns", "state donated/kept", "other in/out", "cost"):
            table.add_column(col)
        for a in self.apply:
            site = f"stage {a.site}" if isinstance(a.site, int) else "cross-stage (whole mesh)"
            table.add_row(site, str(a.phase), ",".join(map(str, a.devices)), str(a.num_eqns),
                          f"{a.donated}/{a.kept}", f"{a.num_inputs}/{a.num_outputs}", f"{a.plan.objective:.4g}")
        return table

    def save_timeline(self, path: str) -> str:
        """Write the schedule picture (a timeline per submesh) as a PNG; returns ``path``."""
        return save_timeline(self, path)


def _digest(program, stages) -> str:
    body = {"stages": [[list(s.layers), list(s.physical_shape), list(s.logical_shape), list(s.devices)]
                       for s in stages],
            "schedule": [program.method.pipeline_schedule, program.method.num_micro_batches],
            "plans": [plan_digest(p) for c in program.stages for p in (c.fwd_plan, c.bwd_plan)]
            + [plan_digest(a.plan) for a in program.apply]}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def save_timeline(plan: PipelinePlan, path: str) -> str:
    """Draw the schedule as a PNG: one row per submesh, one box per forward/backward task."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("save_timeline draws with matplotlib: pip install 'alpa-pass[plot]' "
                          "(or matplotlib)") from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(plan.ticks)), 0.6 * plan.num_stages + 1.2))
    for t, tick in enumerate(plan.ticks):
        for task in tick:
            color = "#4c72b0" if task.kind == "fwd" else "#dd8452"
            ax.add_patch(plt.Rectangle((t, task.stage), 1, 0.9, color=color))
            ax.text(t + 0.5, task.stage + 0.45, str(task.micro), ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, len(plan.ticks))
    ax.set_ylim(plan.num_stages, 0)
    ax.set_yticks([s + 0.45 for s in range(plan.num_stages)])
    ax.set_yticklabels([f"stage {s.index}: {'x'.join(map(str, s.physical_shape))} dev "
                        f"{s.devices[0]}-{s.devices[-1]}" for s in plan.stages])
    ax.set_xlabel("tick (blue: forward, orange: backward; number: micro-batch)")
    ax.set_title(f"{plan.schedule}: {plan.num_stages} stages x {plan.num_micro_batches} micro-batches")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
