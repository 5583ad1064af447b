"""alpa_pass: automatic data, operator and pipeline parallelism for JAX on stock jax/jaxlib.

The public names below are loaded on first use: JAX imports ``alpa_pass.plugin`` (and with it this
package) in every program on a machine where alpa_pass is installed, so importing the package must
not load the C++ core, highspy or the MLIR walkers (``ap.parallelize`` loads them).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from alpa_pass._version import __version__

# public name -> the module that defines it
_EXPORTS = {
    "ParallelizedFunction": "alpa_pass.api", "parallelize": "alpa_pass.api",
    "AlpaPassError": "alpa_pass.errors", "ArgumentError": "alpa_pass.errors", "CompileError": "alpa_pass.errors", "EmitError": "alpa_pass.errors",
    "ExtractError": "alpa_pass.errors", "InfeasibleError": "alpa_pass.errors", "MeshError": "alpa_pass.errors",
    "OptionError": "alpa_pass.errors", "PlanMismatchError": "alpa_pass.errors", "ShardingError": "alpa_pass.errors",
    "SolverError": "alpa_pass.errors", "TraceError": "alpa_pass.errors",
    "LogicalMesh": "alpa_pass.mesh",
    "AutoShardingOption": "alpa_pass.options",
    "ShardParallel": "alpa_pass.methods.shard",
    "DataParallel": "alpa_pass.methods.presets", "Zero2Parallel": "alpa_pass.methods.presets",
    "Zero3Parallel": "alpa_pass.methods.presets",
    "PipeshardParallel": "alpa_pass.methods.pipeshard",
    "FollowParallel": "alpa_pass.methods.follow", "CreateStateParallel": "alpa_pass.methods.create_state",
    "AutoLayerOption": "alpa_pass.pipeline.options", "AutoStageOption": "alpa_pass.pipeline.options",
    "ManualStageOption": "alpa_pass.pipeline.options", "UniformStageOption": "alpa_pass.pipeline.options",
    "grad": "alpa_pass.pipeline.trace.markers", "mark_pipeline_boundary": "alpa_pass.pipeline.trace.markers",
    "value_and_grad": "alpa_pass.pipeline.trace.markers",
    "Plan": "alpa_pass.plan.plan",
    "Executable": "alpa_pass.runtime.executable",
    "save_checkpoint": "alpa_pass.checkpoint", "restore_checkpoint": "alpa_pass.checkpoint",
    "CheckpointError": "alpa_pass.errors",
    "profile_cluster": "alpa_pass.tools.profile",
    "init": "alpa_pass.cluster", "shutdown": "alpa_pass.cluster",
    "DeviceCluster": "alpa_pass.cluster", "get_global_cluster": "alpa_pass.cluster",
    "get_global_physical_mesh": "alpa_pass.cluster", "get_global_virtual_physical_mesh": "alpa_pass.cluster",
    "get_global_num_devices": "alpa_pass.cluster", "prefetch": "alpa_pass.cluster",
    "global_config": "alpa_pass.global_env",
    "PhysicalDeviceMesh": "alpa_pass.physical_mesh", "LocalPhysicalDeviceMesh": "alpa_pass.physical_mesh",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in ("testing", "util", "model"):  # Alpa's submodules: alpa.testing.assert_allclose, alpa.util.benchmark_func,
        # alpa.model.model_util.TrainState
        return importlib.import_module(f"alpa_pass.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'alpa_pass' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # static analysers and IDEs see the names directly
    from alpa_pass.api import ParallelizedFunction, parallelize  # noqa: F401
    from alpa_pass.checkpoint import restore_checkpoint, save_checkpoint  # noqa: F401
    from alpa_pass.cluster import (DeviceCluster, get_global_cluster, get_global_num_devices,  # noqa: F401
                                   get_global_physical_mesh, get_global_virtual_physical_mesh, init, prefetch,
                                   shutdown)
    from alpa_pass.global_env import global_config  # noqa: F401
    from alpa_pass.physical_mesh import LocalPhysicalDeviceMesh, PhysicalDeviceMesh  # noqa: F401
    from alpa_pass.errors import (AlpaPassError, ArgumentError, CheckpointError, CompileError,  # noqa: F401
                                  EmitError, ExtractError, InfeasibleError, MeshError, OptionError,
                                  PlanMismatchError, ShardingError, SolverError, TraceError)
    from alpa_pass.mesh import LogicalMesh  # noqa: F401
    from alpa_pass.tools.profile import profile_cluster  # noqa: F401
    from alpa_pass.methods.create_state import CreateStateParallel  # noqa: F401
    from alpa_pass.methods.follow import FollowParallel  # noqa: F401
    from alpa_pass.methods.pipeshard import PipeshardParallel  # noqa: F401
    from alpa_pass.methods.presets import DataParallel, Zero2Parallel, Zero3Parallel  # noqa: F401
    from alpa_pass.methods.shard import ShardParallel  # noqa: F401
    from alpa_pass.options import AutoShardingOption  # noqa: F401
    from alpa_pass.pipeline.options import (AutoLayerOption, AutoStageOption, ManualStageOption,  # noqa: F401
                                            UniformStageOption)
    from alpa_pass.pipeline.trace.markers import grad, mark_pipeline_boundary, value_and_grad  # noqa: F401
    from alpa_pass.plan.plan import Plan  # noqa: F401
    from alpa_pass.runtime.executable import Executable  # noqa: F401
