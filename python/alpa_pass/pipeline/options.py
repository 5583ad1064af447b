"""The layer and stage options of ``PipeshardParallel`` (frozen dataclasses), its schedules and
transfer modes. ``PipeshardParallel`` itself lives in ``alpa_pass.methods.pipeshard``."""
from __future__ import annotations

import dataclasses

from alpa_pass.errors import OptionError

SCHEDULES = ("1f1b", "gpipe")
# How values cross submeshes (``pipeline.run.transfer``): a value the destination replicates is
# sent split over the replicating axes and all-gathered on arrival, or sent whole to every device.
TRANSFER_MODES = ("send_once_gather", "direct")


@dataclasses.dataclass(frozen=True)
class AutoLayerOption:
    """Cluster the loss function's operators into ``layer_num`` layers automatically.

    Attributes:
      layer_num: how many layers (a DP balances their FLOPs and keeps the bytes cut between
        consecutive layers small).
      eps: a layer may hold up to ``(1 + eps) * total_flops / layer_num`` FLOPs; among cuts that
        respect it the DP minimises the largest number of bytes crossing a cut.
      remat_mode, remat_layer, fine_grained_remat_layer_num: Alpa's rematerialisation of the
        layers; only "none" / False / None (OptionError otherwise: wrap the layer's code in
        ``jax.checkpoint`` or flax ``nn.remat`` instead, which the pipeline keeps).
    """

    layer_num: int
    eps: float = 0.6
    remat_mode: str = "none"
    remat_layer: bool = False
    fine_grained_remat_layer_num: int | None = None

    def __post_init__(self):
        if self.remat_mode != "none" or self.remat_layer or self.fine_grained_remat_layer_num is not None:
            raise OptionError("AutoLayerOption: rematerialising the layers (remat_mode / remat_layer) is not "
                              "supported; wrap the layer's code in jax.checkpoint (flax nn.remat) instead")
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
      submesh_autosharding_option_dicts: Alpa's per-stage option overrides; only empty dicts
        (OptionError otherwise: every stage plans with ``PipeshardParallel.option``).
    """

    forward_stage_layer_ids: tuple
    submesh_physical_shapes: tuple
    submesh_logical_shapes: tuple | None = None
    submesh_autosharding_option_dicts: tuple | None = None

    def __post_init__(self):
        if any(self.submesh_autosharding_option_dicts or ()):
            raise OptionError("ManualStageOption(submesh_autosharding_option_dicts=...): per-stage planner "
                              "options are not supported; every stage plans with PipeshardParallel(option=...)")
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
