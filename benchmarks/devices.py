"""Set-up the benchmark scripts do before jax loads (standard library only): simulated CPU
devices, the planner's log."""
from __future__ import annotations

import logging
import os


# XLA's memory-minimising CPU scheduler: the schedule alpa_pass's memory model assumes (the default
# concurrency-optimised one starts collectives as early as it can: driver/jit.py
# CPU_MEMORY_SCHEDULER_FLAG, the same flag).
MEMORY_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def simulate_cpu_devices(num_devices: int, memory_scheduler: bool = False) -> None:
    """Make jax see ``num_devices`` CPU devices (with ``memory_scheduler``, compiled with XLA's
    memory-minimising scheduler); must run before jax is imported."""
    flags = [f"--xla_force_host_platform_device_count={num_devices}"]
    if memory_scheduler and "xla_cpu_enable_concurrency_optimized_scheduler" not in os.environ.get("XLA_FLAGS", ""):
        flags.append(MEMORY_SCHEDULER_FLAG)
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def planner_log() -> None:
    """Print the planner's INFO log (row rounds, LP-support bounds and times) with timestamps."""
    logging.basicConfig(format="%(asctime)s %(message)s")
    logging.getLogger("alpa_pass").setLevel(logging.INFO)


def copy_rounds_only() -> None:
    """Fit budgeted plans with the reshard-copy rounds only, without the exact-copy plan first
    (``alpa_pass.driver.exact_fit.EXACT_COPY_PLAN``; ``--copy-rounds-only``: the figures before it)."""
    from alpa_pass.driver import exact_fit

    exact_fit.EXACT_COPY_PLAN = False


def no_frontier() -> None:
    """Take every first budgeted plan from the LP with memory rows (its support's restricted MIP),
    never from the exact-copy MIP over the free plan's frontier strategies
    (``alpa_pass.driver.exact_fit.FRONTIER_PLAN``; ``--no-frontier``: the figures before it)."""
    from alpa_pass.driver import exact_fit

    exact_fit.FRONTIER_PLAN = False
