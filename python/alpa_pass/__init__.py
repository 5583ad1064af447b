"""alpa_pass: automatic data, operator and pipeline parallelism for JAX on stock jax/jaxlib."""
from alpa_pass.api import ParallelizedFunction, parallelize
from alpa_pass.errors import (AlpaPassError, CompileError, EmitError, ExtractError, InfeasibleError,
                              MeshError, PlanMismatchError, ShardingError, SolverError, TraceError)
from alpa_pass.mesh import LogicalMesh
from alpa_pass.options import AutoShardingOption, ShardParallel
from alpa_pass.pipeline import (AutoLayerOption, AutoStageOption, ManualStageOption, PipeshardParallel,
                                UniformStageOption, grad, mark_pipeline_boundary, value_and_grad)
from alpa_pass.plan.plan import Plan
from alpa_pass.presets import DataParallel, Zero2Parallel, Zero3Parallel
from alpa_pass.runtime.executable import Executable

__version__ = "0.1.0"

__all__ = [
    "AlpaPassError", "AutoShardingOption", "CompileError", "EmitError", "Executable", "ExtractError",
    "InfeasibleError", "LogicalMesh", "MeshError", "ParallelizedFunction", "Plan", "PlanMismatchError", "ShardParallel",
    "ShardingError", "SolverError", "TraceError", "parallelize",
    "AutoLayerOption", "AutoStageOption", "ManualStageOption", "PipeshardParallel", "UniformStageOption",
    "grad", "mark_pipeline_boundary", "value_and_grad",
    "DataParallel", "Zero2Parallel", "Zero3Parallel",
]
