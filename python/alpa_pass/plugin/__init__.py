"""``JAX_PLUGINS=alpa_pass``: auto-parallelize plain ``jax.jit`` code, unchanged.

JAX imports this module (entry point group ``jax_plugins``) in every program on a machine where
alpa_pass is installed, and calls :func:`initialize` at its first backend initialisation. So this
module imports nothing heavy, and :func:`initialize` does nothing unless the comma-separated
``JAX_PLUGINS`` names ``alpa_pass``. It never touches devices (``jax.devices()`` would recurse into
backend initialisation). Configuration: the ``ALPA_PASS_*`` variables (see ``plugin/config.py``
and the README section "Unchanged jax.jit code").
"""
from __future__ import annotations

import logging
import os
import re
import sys
import warnings

from alpa_pass.plugin.config import PluginConfigError, load_config, plugin_enabled

log = logging.getLogger("alpa_pass")
_HOOK = None


def initialize() -> None:
    """Install the planning hook when ``JAX_PLUGINS`` names alpa_pass (JAX calls this once).

    On an unsupported jax version: one warning, nothing installed (the program runs as plain JAX).
    A bad ``ALPA_PASS_*`` value is not raised here (JAX would log it and carry on unparallelized):
    the hook raises it at the program's first computation.
    """
    global _HOOK
    if not plugin_enabled(os.environ) or _HOOK is not None:
        return
    from alpa_pass import _compat

    if not _compat.is_supported_jax():
        low, high = (".".join(map(str, v)) for v in _compat.SUPPORTED)
        warnings.warn(f"alpa_pass: JAX_PLUGINS names alpa_pass but jax {_compat.jax.__version__} is not "
                      f"supported (need >={low},<{high}); running as plain JAX", RuntimeWarning,
                      stacklevel=2)
        return
    from alpa_pass.plugin.config import PluginConfig
    from alpa_pass.plugin.hook import LoweringHook

    try:
        config, error = load_config(os.environ), None
    except PluginConfigError as e:
        config, error = PluginConfig(), e
    _configure_logging(config.log_level)
    _one_schedule_on_simulated_devices(os.environ)
    _HOOK = LoweringHook(config, error)
    _compat.install_lowering_hook(_HOOK, owns=_HOOK.owns)
    # JAX initialises its backend (and so this plugin) from inside the lowering of the script's
    # first computation when nothing ran before it: that lowering already runs jax's own function
    _compat.replan_in_flight_lowering(_HOOK.plan_in_flight)
    log.info("alpa_pass: planning jax.jit computations (method %s, mesh %s)", config.method,
             _mesh_text(config.mesh_shape))


# XLA's CPU runtime runs a device's independent ops concurrently by default; simulated devices
# (threads of one process) can then enter a plan's collectives in different orders and wait on
# each other for good (a chunked loss by lax.map: one device in an all-reduce inside the loop,
# the others in an independent all-reduce after it: "Termination timeout" abort, 5 of 5 runs on
# 1x8). The memory-minimising schedule orders them alike, and it is the schedule plans assume.
SERIAL_CPU_SCHEDULE = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _one_schedule_on_simulated_devices(environ) -> None:
    """Add :data:`SERIAL_CPU_SCHEDULE` to ``XLA_FLAGS`` when it simulates several CPU devices and
    names no scheduler itself (read when JAX creates the CPU backend, right after this plugin
    initialises)."""
    flags = environ.get("XLA_FLAGS", "")
    count = re.search(r"--xla_force_host_platform_device_count=(\d+)", flags)
    if count is None or int(count.group(1)) < 2 or "xla_cpu_enable_concurrency_optimized_scheduler" in flags:
        return
    environ["XLA_FLAGS"] = f"{flags} {SERIAL_CPU_SCHEDULE}".strip()
    log.info("alpa_pass: %s simulated CPU devices: XLA_FLAGS += %s (collectives in one order on every "
             "device)", count.group(1), SERIAL_CPU_SCHEDULE)


def _mesh_text(shape) -> str:
    if shape is None:
        return "1 x all devices"
    return shape if isinstance(shape, str) else "x".join(map(str, shape))


def shutdown() -> None:
    """Remove the hook (plans already made stay with their computations)."""
    global _HOOK
    if _HOOK is not None:
        from alpa_pass import _compat

        _compat.uninstall_lowering_hook()
        _HOOK = None


def stats() -> dict:
    """What the plugin did so far: {"enabled", "planned", "reused", "passed", "failed"}."""
    if _HOOK is None:
        return {"enabled": False, "planned": 0, "reused": 0, "passed": 0, "failed": 0}
    return {"enabled": True, **vars(_HOOK.stats)}


def plans() -> list:
    """(computation name, Plan) for every computation planned so far, in order."""
    return [(e.name, e.plan) for e in entries() if e.plan is not None]


def entries() -> list:
    """The hook's cache entries (name, plan, in_shardings over the jaxpr inputs, computation)."""
    return [] if _HOOK is None else _HOOK.entries()


def _configure_logging(level: int | None) -> None:
    if level is None:
        return
    log.setLevel(level)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(handler)
        # our handler prints every alpa_pass line: an application that configured root logging
        # (gemma/kauldron do) would print each one a second time through propagation
        log.propagate = False
