"""``global_config``: Alpa's process-wide settings object (``alpa.global_config.X = ...``), kept so
that scripts written for Alpa run.

Alpa's settings tuned its Ray runtime (timers' syncs, remote-array deletion, NCCL and resharding
modes, the stage profiler) and its own model zoo (fp16 embeddings). alpa_pass has no such runtime:
every setting is accepted and read back, none changes a plan or a result (plans are functions of
the program, mesh and options only), and a changed one is logged once at info level saying so. A
name Alpa did not have raises AttributeError; ``overwrite_submesh_choices``, which chose Alpa's
pipeline submeshes, raises OptionError naming the option that does it here.
"""
from __future__ import annotations

import logging

from alpa_pass.errors import OptionError

log = logging.getLogger("alpa_pass")

# Alpa's GlobalConfig fields (alpa/global_env.py) and their defaults.
ALPA_DEFAULTS = {
    "backend": "gpu", "has_cuda": False, "xla_client_mem_fraction": 0.9, "xla_client_client_preallocate": "false",
    "delete_remote_arrays_threshold": 50, "compile_random_seed": 42, "runtime_random_seed": 42,
    "xla_server_port_start": 20000, "xla_server_port_end": 25000, "xla_gpu_autotune_level": 4,
    "use_aws_efa": False, "shard_parallel_sync_for_timer": False, "debug_with_pipeshard_runtime": False,
    "profile_with_whole_ray_cluster": True, "profile_timeout": 500, "profile_maximum_retry": 2,
    "overwrite_submesh_choices": None, "always_donate_micro_batch_vars": True, "pipeline_sync_for_timer": False,
    "pipeline_distributed_compile": True, "eagerly_create_communicators": True, "pipeline_check_alive": False,
    "pipeline_use_signal_send_recv": False, "use_local_allgather": True, "resharding_mode": "send_recv",
    "nccl_mode": "cupy", "enable_overlapping": False, "resharding_loadbalance_mode": "normal",
    "loadbalance_order_algo": "greedy", "use_dummy_value_for_benchmarking": False,
    "flax_always_use_fp16_embedding": False, "print_compilation_time": False, "print_auto_layer_stats": False,
    "collect_trace": False,
}


class GlobalConfig:
    """Alpa's settings, accepted and read back; none has an effect in alpa_pass (module docstring)."""

    def __init__(self):
        object.__setattr__(self, "_values", dict(ALPA_DEFAULTS))
        object.__setattr__(self, "_noted", set())

    def __getattr__(self, name: str):
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"global_config has no setting {name!r} (Alpa's settings: {', '.join(sorted(values))})")

    def __setattr__(self, name: str, value) -> None:
        if name not in self._values:
            raise AttributeError(f"global_config has no setting {name!r}; alpa_pass's own settings are "
                                 f"AutoShardingOption fields and ALPA_PASS_* environment variables")
        if name == "overwrite_submesh_choices" and value is not None:
            raise OptionError("global_config.overwrite_submesh_choices: give the submeshes to the stage DP as "
                              "AutoStageOption(submesh_physical_shape_space='manual', "
                              "manually_specified_submeshes=[(rows, cols), ...])")
        if value != ALPA_DEFAULTS[name] and name not in self._noted:
            self._noted.add(name)
            log.info("alpa_pass: global_config.%s = %r has no effect here (it tuned Alpa's Ray runtime or "
                     "model zoo); plans and results do not depend on it", name, value)
        self._values[name] = value

    def update_with_dict(self, value_dict: dict) -> None:
        """Alpa's ``update_with_dict``: set several settings."""
        for name, value in value_dict.items():
            setattr(self, name, value)


global_config = GlobalConfig()
