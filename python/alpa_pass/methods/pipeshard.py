"""``PipeshardParallel``: pipeline (inter-op) parallelism with an intra-op plan per stage."""
from __future__ import annotations

import dataclasses

from alpa_pass.driver.meshes import resolve_mesh
from alpa_pass.mesh import LogicalMesh
from alpa_pass.errors import OptionError
from alpa_pass.methods.base import ParallelMethod, alpa_names
from alpa_pass.options import AutoShardingOption
from alpa_pass.pipeline.options import (SCHEDULES, TRANSFER_MODES, AutoLayerOption, AutoStageOption,
                                        ManualStageOption, UniformStageOption)
from alpa_pass.pipeline.run.executable import build_pipeshard


@alpa_names("default_auto_sharding_option")
@dataclasses.dataclass(frozen=True)
class PipeshardParallel(ParallelMethod):
    """Pipeline (inter-op) parallelism over submeshes, each stage sharded by the intra-op planner.

    Attributes:
      mesh: the whole cluster; stages get submeshes of it (``None`` = all devices as 1 x N).
      num_micro_batches: the batch arguments are split into this many micro-batches along axis 0;
        gradients are averaged over them (exact for losses that are means over the batch).
      layer_option: ``"manual"`` (``mark_pipeline_boundary()`` in the loss) or ``AutoLayerOption``.
      stage_option: ``"auto"`` (= ``AutoStageOption()``), ``"uniform"`` (= ``UniformStageOption()``),
        ``AutoStageOption``, ``UniformStageOption`` or ``ManualStageOption``.
      pipeline_schedule: ``"1f1b"`` or ``"gpipe"``.
      batch_argnums: positions of the train step's arguments that hold the batch.
      option: intra-op planner options for every stage.
      transfer: how values cross submeshes: ``"send_once_gather"`` (a tensor the destination
        replicates is sent split over the replicating axes, then all-gathered inside the
        destination mesh) or ``"direct"`` (one device_put of the full replicas).
      devices, default_auto_sharding_option: Alpa's names of ``mesh`` (also a
        ``PhysicalDeviceMesh`` or a list of devices) and ``option``.
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
        forced = [f for f in ("force_batch_dim_to_mesh_dim", "force_data_parallel", "force_zero_stage_3")
                  if getattr(self.option, f) is not None and getattr(self.option, f) is not False]
        if forced:
            raise OptionError(f"PipeshardParallel: AutoShardingOption({forced[0]}=...) is not supported for "
                              f"pipeline stages (a stage's inputs are not the step's batch); drop it, or use "
                              f"ShardParallel / DataParallel / Zero3Parallel without a pipeline")
        if self.mesh is not None and not isinstance(self.mesh, LogicalMesh):
            raise TypeError(f"PipeshardParallel(mesh=...) takes an alpa_pass.LogicalMesh, got {type(self.mesh).__name__}")
        if int(self.num_micro_batches) < 1:
            raise ValueError(f"PipeshardParallel.num_micro_batches must be >= 1, got {self.num_micro_batches}")
        if self.layer_option != "manual" and not isinstance(self.layer_option, AutoLayerOption):
            raise TypeError(f"PipeshardParallel(layer_option=...) takes 'manual' or AutoLayerOption, "
                            f"got {self.layer_option!r}")
        stage = self.stage_option
        if isinstance(stage, str) and stage in ("auto", "uniform"):
            stage = AutoStageOption() if stage == "auto" else UniformStageOption()
        if not isinstance(stage, (AutoStageOption, UniformStageOption, ManualStageOption)):
            raise TypeError(f"PipeshardParallel(stage_option=...) takes 'auto', 'uniform', AutoStageOption, "
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
        """The cluster mesh (``None``: all devices as 1 x N)."""
        return resolve_mesh(self.mesh)

    def build_executable(self, fn, args, donate_argnums):
        return build_pipeshard(fn, args, self, donate_argnums)
