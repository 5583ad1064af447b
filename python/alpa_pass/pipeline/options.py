"""The layer and stage options of ``PipeshardParallel`` (frozen dataclasses), its schedules and
transfer modes. ``PipeshardParallel`` itself lives in ``alpa_pass.methods.pipeshard``."""
from __future__ import annotations

import dataclasses
import math

from alpa_pass._aliases import keyword_aliases
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


def _alpa_logical_space(space: str, name: str) -> str:
    if space in ("data_parallel_only", "model_parallel_only"):
        raise OptionError(f"{name}(submesh_logical_shape_space={space!r}) is not supported (Alpa forces the "
                          f"batch dim on every stage there); use 'all', 'single_node_model_parallel' or "
                          f"'same_as_physical'")
    return "same" if space == "same_as_physical" else space


@keyword_aliases(submesh_logical_shape_space=("submesh_logical_shapes", _alpa_logical_space))
@dataclasses.dataclass(frozen=True)
class AutoStageOption:
    """The stage-submesh DP (Alpa's inter-op pass).

    Attributes:
      compute_cost_per_flop: time of one FLOP on one device, in the mesh's alpha/beta units; a
        stage's latency is its per-device FLOPs times this plus the intra-op plan's communication.
      memory_budget_per_device: bytes one device may hold for a stage (``None`` = unlimited).
      submesh_logical_shapes: the logical meshes tried on each submesh: "all" every 2-D
        factorisation, "same" the physical shape only, "single_node_model_parallel" the
        factorisations ``(a, b)`` with ``b`` at most one host's devices.
      submesh_physical_shape_space: the submeshes the DP picks from (Alpa's spaces): "all" (our
        default): ``(1, c)`` for every ``c`` dividing a host's devices and ``(r, cols)`` for every
        row count ``r``; "power_of_two": ``c`` and ``r`` powers of two; "small_power_of_two": also
        ``r <= 4``; "manual": ``manually_specified_submeshes``.
      manually_specified_submeshes: the ``(rows, cols)`` submeshes of the "manual" space.
      stage_imbalance_tolerance: as in Alpa, a layer range is a candidate on a submesh only while
        its share of the forward FLOPs is within a factor ``1 + tolerance`` of the submesh's share
        of the devices (``inf``: every pair).
      submesh_logical_shape_space: Alpa's name of ``submesh_logical_shapes`` ("same_as_physical" =
        "same"); "data_parallel_only" / "model_parallel_only" (Alpa forces the batch dim in them)
        raise OptionError.
      use_hlo_cost_model, layer_profile_mode: Alpa's choice between profiling stages on the
        cluster and its HLO cost model; accepted, and stages are always costed by the intra-op
        planner's model of the whole layer range (with ``AutoShardingOption(profile=...)``, the
        measured collective and compute costs).
      profiling_database_filename, cached_profile_result: Alpa's stage-profiling files; OptionError
        (give ``AutoShardingOption(profile=...)``, a profile ``alpa-pass profile`` measured).
    """

    compute_cost_per_flop: float = 1e-3
    memory_budget_per_device: float | None = None
    submesh_logical_shapes: str = "all"
    submesh_physical_shape_space: str = "all"
    manually_specified_submeshes: tuple | None = None
    stage_imbalance_tolerance: float = math.inf
    use_hlo_cost_model: bool = dataclasses.field(default=False, compare=False, repr=False)
    layer_profile_mode: str = dataclasses.field(default="composition", compare=False, repr=False)
    profiling_database_filename: str | None = dataclasses.field(default=None, compare=False, repr=False)
    cached_profile_result: str | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.compute_cost_per_flop < 0:
            raise ValueError("AutoStageOption.compute_cost_per_flop must be >= 0")
        if self.submesh_logical_shapes not in LOGICAL_SPACES:
            raise ValueError(f"AutoStageOption.submesh_logical_shapes must be one of {LOGICAL_SPACES} (Alpa's name "
                             f"submesh_logical_shape_space= also takes 'same_as_physical'), "
                             f"got {self.submesh_logical_shapes!r}")
        if self.submesh_physical_shape_space not in PHYSICAL_SPACES:
            raise ValueError(f"AutoStageOption.submesh_physical_shape_space must be one of {PHYSICAL_SPACES}, "
                             f"got {self.submesh_physical_shape_space!r}")
        manual = self.manually_specified_submeshes
        if (self.submesh_physical_shape_space == "manual") != (manual is not None):
            raise ValueError("AutoStageOption: manually_specified_submeshes goes with "
                             "submesh_physical_shape_space='manual' (give both or neither)")
        if manual is not None:
            shapes = tuple(tuple(int(d) for d in s) for s in manual)
            if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
                raise ValueError(f"AutoStageOption.manually_specified_submeshes takes (rows, cols) pairs of "
                                 f"positive ints, got {manual!r}")
            object.__setattr__(self, "manually_specified_submeshes", shapes)
        if not self.stage_imbalance_tolerance >= 0:
            raise ValueError(f"AutoStageOption.stage_imbalance_tolerance must be >= 0 (inf: no limit), "
                             f"got {self.stage_imbalance_tolerance!r}")
        if self.layer_profile_mode not in ("composition", "individual"):
            raise ValueError(f"AutoStageOption.layer_profile_mode must be 'composition' or 'individual', "
                             f"got {self.layer_profile_mode!r}")
        for name in ("profiling_database_filename", "cached_profile_result"):
            if getattr(self, name) is not None:
                raise OptionError(f"AutoStageOption({name}=...): Alpa's stage-profiling files are not read; "
                                  f"measure the cluster with `alpa-pass profile` and give "
                                  f"PipeshardParallel(option=AutoShardingOption(profile=...))")


LOGICAL_SPACES = ("all", "same", "single_node_model_parallel")
PHYSICAL_SPACES = ("all", "power_of_two", "small_power_of_two", "manual")
