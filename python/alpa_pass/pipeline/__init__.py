"""Pipeline (inter-op) parallelism: layers, stages on submeshes, pipelined execution."""
from alpa_pass.pipeline.markers import grad, mark_pipeline_boundary, value_and_grad
from alpa_pass.pipeline.options import (AutoLayerOption, AutoStageOption, ManualStageOption, PipeshardParallel,
                                        UniformStageOption)

__all__ = ["AutoLayerOption", "AutoStageOption", "ManualStageOption", "PipeshardParallel", "UniformStageOption",
           "grad", "mark_pipeline_boundary", "value_and_grad"]
