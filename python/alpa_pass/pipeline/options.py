"""Pipeline options: ``PipeshardParallel`` and its layer/stage options (frozen dataclasses)."""
from __future__ import annotations

import dataclasses

from alpa_pass.mesh import LogicalMesh
from alpa_pass.options import AutoShardingOption, ParallelMethod
from alpa_pass.pipeline.transfer import TRANSFER_MODES

SCHEDULES = ("1f1b", "gpipe")


@dataclasses.dataclass(frozen=True)
class AutoLayerOption:
    """Cluster the loss function's operators into ``layer_num`` layers automatically.

    Attributes:
      layer_num: how many layers (a DP balances their FLOPs and keeps the bytes cut between
        consecutive layers small).
      eps: a layer may hold up to ``(1 + eps) * total_flops / layer_num`` FLOPs; among cuts that
        respect it the DP minimises the largest number of bytes crossing a cut.
    """

    layer_num: int
    eps: float = 0.6

    def __post_init__(self):
        if int(self.layer_num) < 1:
            raise ValueError(f"AutoLayerOption.layer_num must be >= 1, got {self.layer_num}")
        if self.eps < 0:
            raise ValueError(f"AutoLayerOption.eps must be >= 0, got {self.eps}")


@dataclasses.dataclass(frozen=True)
class UniformStageOption:
    """``num_stages`` stages of (nearly) equal layer counts, each on an equal share of the devices.

    ``None`` = one stage per layer.
    """

    num_stages: int | None = None

    def __post_init__(self):
        if self.num_stages is not None and int(self.num_stages) < 1:
            raise ValueError(f"UniformStageOption.num_stages must be >= 1, got {self.num_stages}")


@dataclasses.dataclass(frozen=True)
class ManualStageOption:
    """Stages given by hand (Alpa's names).

    Attributes:
      forward_stage_layer_ids: per stage, the consecutive layer ids it runs, e.g. ``((0, 1), (2, 3))``.
      submesh_physical_shapes: per stage, its submesh ``(rows, devices per row)`` of the cluster mesh;
        submeshes are carved from the cluster's devices in order.
      submesh_logical_shapes: per stage, the logical mesh the intra-op planner uses on that submesh
        (same device count); ``None`` = the physical shape.
    """

    forward_stage_layer_ids: tuple
    submesh_physical_shapes: tuple
    submesh_logical_shapes: tuple | None = None

    def __post_init__(self):
        ids = tuple(tuple(int(i) for i in s) for s in self.forward_stage_layer_ids)
        phys = tuple(tuple(int(d) for d in s) for s in self.submesh_physical_shapes)
        logical = None if self.submesh_logical_shapes is None else tuple(
            tuple(int(d) for d in s) for s in self.submesh_logical_shapes)
        if len(phys) != len(ids) or (logical is not None and len(logical) != len(ids)):
            raise ValueError(f"ManualStageOption: {len(ids)} stages but {len(phys)} physical shapes"
                             f"{'' if logical is None else f' and {len(logical)} logical shapes'}; give one per stage")
        object.__setattr__(self, "forward_stage_layer_ids", ids)
        object.__setattr__(self, "submesh_physical_shapes", phys)
        object.__setattr__(self, "submesh_logical_shapes", logical)


@dataclasses.dataclass(frozen=True)
class AutoStageOption:
    """The stage-submesh DP (Alpa's inter-op pass).

    Attributes:
      compute_cost_per_flop: time of one FLOP on one device, in the mesh's alpha/beta units; a
        stage's latency is its per-device FLOPs times this plus the intra-op plan's communication.
      memory_budget_per_device: bytes one device may hold for a stage (``None`` = unlimited).
      submesh_logical_shapes: "all" tries every 2-D factorisation of each submesh as the logical
        mesh; "same" uses the physical shape only.
    """

    compute_cost_per_flop: float = 1e-3
    memory_budget_per_device: float | None = None
    submesh_logical_shapes: str = "all"

    def __post_init__(self):
        if self.compute_cost_per_flop < 0:
            raise ValueError("AutoStageOption.compute_cost_per_flop must be >= 0")
        if self.submesh_logical_shapes not in ("all", "same"):
            raise ValueError(f"AutoStageOption.submesh_logical_shapes must be 'all' or 'same', "
                             f"got {self.submesh_logical_shapes!r}")


@dataclasses.dataclass(frozen=True)
class PipeshardParallel(ParallelMethod):
    """Pipeline (inter-op) parallelism over submeshes, each stage sharded by the intra-op planner.

    Attributes:
      mesh: the whole cluster; stages get submeshes of it (``None`` = all devices as 1 x N).
      num_micro_batches: the batch arguments are split into this many micro-batches along axis 0;
        gradients are averaged over them (exact for losses that are means over the batch).
      layer_option: ``"manual"`` (``mark_pipeline_boundary()`` in the loss) or ``AutoLayerOption``.
      stage_option: ``"auto"`` (= ``AutoStageOption()``), ``AutoStageOption``,
        ``UniformStageOption`` or ``ManualStageOption``.
      pipeline_schedule: ``"1f1b"`` or ``"gpipe"``.
      batch_argnums: positions of the train step's arguments that hold the batch.
      option: intra-op planner options for every stage.
      transfer: how values cross submeshes: ``"send_once_gather"`` (a tensor the destination
        replicates is sent split over the replicating axes, then all-gathered inside the
        destination mesh) or ``"direct"`` (one device_put of the full replicas).
    """

    mesh: LogicalMesh | None = None
    num_micro_batches: int = 1
    layer_option: object = "manual"
    stage_option: object = dataclasses.field(default_factory=UniformStageOption)
    pipeline_schedule: str = "1f1b"
    batch_argnums: tuple = (1,)
    option: AutoShardingOption = dataclasses.field(default_factory=AutoShardingOption)
    transfer: str = "send_once_gather"

    def __post_init__(self):
        if self.mesh is not None and not isinstance(self.mesh, LogicalMesh):
            raise TypeError(f"PipeshardParallel(mesh=...) takes an alpa_pass.LogicalMesh, got {type(self.mesh).__name__}")
        if int(self.num_micro_batches) < 1:
            raise ValueError(f"PipeshardParallel.num_micro_batches must be >= 1, got {self.num_micro_batches}")
        if self.layer_option != "manual" and not isinstance(self.layer_option, AutoLayerOption):
            raise TypeError(f"PipeshardParallel(layer_option=...) takes 'manual' or AutoLayerOption, "
                            f"got {self.layer_option!r}")
        stage = AutoStageOption() if self.stage_option == "auto" else self.stage_option
        if not isinstance(stage, (AutoStageOption, UniformStageOption, ManualStageOption)):
            raise TypeError(f"PipeshardParallel(stage_option=...) takes 'auto', AutoStageOption, "
                            f"UniformStageOption or ManualStageOption, got {self.stage_option!r}")
        object.__setattr__(self, "stage_option", stage)
        if self.pipeline_schedule not in SCHEDULES:
            raise ValueError(f"PipeshardParallel.pipeline_schedule must be one of {SCHEDULES}, "
                             f"got {self.pipeline_schedule!r}")
        if self.transfer not in TRANSFER_MODES:
            raise ValueError(f"PipeshardParallel.transfer must be one of {TRANSFER_MODES}, "
                             f"got {self.transfer!r}")
        argnums = (self.batch_argnums,) if isinstance(self.batch_argnums, int) else self.batch_argnums
        object.__setattr__(self, "batch_argnums", tuple(int(i) for i in argnums))

    def resolved_mesh(self) -> LogicalMesh:
        if self.mesh is not None:
            return self.mesh
        import jax

        return LogicalMesh(shape=(1, len(jax.devices())))
