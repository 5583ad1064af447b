"""Simulated CPU devices for the benchmark scripts (standard library only: used before jax loads)."""
from __future__ import annotations

import os


def simulate_cpu_devices(num_devices: int) -> None:
    """Make jax see ``num_devices`` CPU devices; must run before jax is imported."""
    flag = f"--xla_force_host_platform_device_count={num_devices}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
