"""The plugin's configuration: every ``ALPA_PASS_*`` variable is read and validated here, once.

Pure string parsing (no jax, no devices), so it runs inside ``initialize()`` and in unit tests.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Mapping

from alpa_pass import _sizes
from alpa_pass.errors import AlpaPassError

PLUGIN_NAME = "alpa_pass"
METHODS = ("shard", "data", "zero2", "zero3")
DEFAULT_MIN_BYTES = 1 << 20
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class PluginConfigError(AlpaPassError, ValueError):
    """An ``ALPA_PASS_*`` environment variable has a bad or not-yet-supported value."""


@dataclasses.dataclass(frozen=True)
class PluginConfig:
    """What ``JAX_PLUGINS=alpa_pass`` does, from the environment.

    Attributes:
      method: "shard" (ShardParallel), "data", "zero2" or "zero3" (presets: see methods/presets.py).
      mesh_shape: logical mesh shape, e.g. ``(2, 4)``; ``"auto"`` = search the shapes of the device
        count and keep the cheapest plan; ``None`` = all devices as ``1 x N``.
      memory_budget_bytes: per-device memory budget the plans must fit, or ``None``.
      cache_dir: on-disk plan cache directory (a second run of the script skips the solver), or None.
      report_dir: directory that receives each plan's summary and JSON, or ``None``.
      log_level: level of the ``alpa_pass`` logger (a ``logging`` int), or ``None`` = untouched.
      min_bytes: computations whose arguments + results total fewer bytes, with no value inside
        as large, run untouched.
      reduce_scatter: ``AutoShardingOption.prefer_reduce_scatter`` (parameter-gradient partial
        sums emitted as reduce-scatters).
      peel_scans: ``AutoShardingOption.peel_layer_scans`` (a scanned layer stack's backward loop
        runs its last iteration outside the loop; ``ALPA_PASS_PEEL_SCANS=0`` turns it off).
      strict: an unexpected error while planning (a bug of alpa_pass's or XLA's) is raised; by
        default it is logged with its traceback and the computation runs as plain ``jax.jit``.
      profile: ``AutoShardingOption.profile``: a measured cluster profile's JSON path (``alpa-pass
        profile --out PATH``), ``"auto"`` (the default: this cluster's cached one if there is one),
        or ``None`` (unit costs; ``ALPA_PASS_PROFILE=none``).
    """

    method: str = "shard"
    mesh_shape: tuple[int, ...] | str | None = None
    memory_budget_bytes: int | None = None
    cache_dir: str | None = None
    report_dir: str | None = None
    log_level: int | None = None
    min_bytes: int = DEFAULT_MIN_BYTES
    reduce_scatter: bool = False
    peel_scans: bool = True
    strict: bool = False
    profile: str | None = "auto"


def plugin_enabled(environ: Mapping[str, str]) -> bool:
    """True when the comma-separated ``JAX_PLUGINS`` names ``alpa_pass``."""
    names = (n.strip() for n in environ.get("JAX_PLUGINS", "").split(","))
    return PLUGIN_NAME in names


def load_config(environ: Mapping[str, str]) -> PluginConfig:
    """Parse every ``ALPA_PASS_*`` variable; PluginConfigError names the variable and the fix."""
    method = _get(environ, "ALPA_PASS_METHOD") or "shard"
    method = method.lower()
    if method not in METHODS:
        raise PluginConfigError(f"ALPA_PASS_METHOD={method!r} is not one of {', '.join(METHODS)}")
    mesh_shape = parse_mesh(_get(environ, "ALPA_PASS_MESH"))
    if method != "shard" and mesh_shape == "auto":
        raise PluginConfigError(f"ALPA_PASS_MESH='auto' works with ALPA_PASS_METHOD=shard only; give "
                                f"a shape such as '2x4' for ALPA_PASS_METHOD={method!r}")
    budget = _get(environ, "ALPA_PASS_MEMORY_BUDGET")
    budget_bytes = parse_bytes(budget, "ALPA_PASS_MEMORY_BUDGET") if budget else None
    if budget_bytes is not None and budget_bytes <= 0:
        raise PluginConfigError(f"ALPA_PASS_MEMORY_BUDGET={budget!r} must be a positive size")
    min_bytes = _get(environ, "ALPA_PASS_MIN_BYTES")
    return PluginConfig(
        method=method,
        mesh_shape=mesh_shape,
        memory_budget_bytes=budget_bytes,
        cache_dir=_get(environ, "ALPA_PASS_CACHE") or None,
        report_dir=_get(environ, "ALPA_PASS_REPORT") or None,
        log_level=parse_log_level(_get(environ, "ALPA_PASS_LOG")),
        min_bytes=parse_bytes(min_bytes, "ALPA_PASS_MIN_BYTES") if min_bytes else DEFAULT_MIN_BYTES,
        reduce_scatter=parse_flag(environ, "ALPA_PASS_REDUCE_SCATTER", False),
        peel_scans=parse_flag(environ, "ALPA_PASS_PEEL_SCANS", True),
        strict=parse_flag(environ, "ALPA_PASS_STRICT", False),
        profile=parse_profile(_get(environ, "ALPA_PASS_PROFILE")))


def parse_profile(text: str) -> str | None:
    """``"auto"`` (any case; also unset or empty) or a path to a profile JSON that exists (``~``
    expanded); ``none`` / ``unit`` / ``off`` / ``0`` -> None (unit costs)."""
    if not text or text.lower() == "auto":
        return "auto"
    if text.lower() in ("none", "unit", "off", "0"):
        return None
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise PluginConfigError(f"ALPA_PASS_PROFILE={text!r} is no file; give a profile JSON (`alpa-pass profile "
                                f"--out PATH` writes one), 'auto' for this cluster's cached profile (the "
                                f"default) or 'none' for unit costs")
    return path


def parse_flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """A 0/1 variable (unset or empty: ``default``); PluginConfigError for anything else."""
    text = _get(environ, name)
    if not text:
        return default
    if text not in ("0", "1"):
        raise PluginConfigError(f"{name}={text!r} must be 0 or 1")
    return text == "1"


def parse_mesh(text: str | None) -> tuple[int, ...] | None:
    """``"2x4"`` -> ``(2, 4)``; ``"8"`` -> ``(8,)``; ``"auto"`` -> ``"auto"``; empty -> ``None``."""
    if not text:
        return None
    if text.lower() == "auto":
        return "auto"
    parts = text.lower().replace("*", "x").split("x")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise PluginConfigError(f"ALPA_PASS_MESH={text!r} is not a mesh shape; write positive device "
                                f"counts per axis joined by 'x', e.g. '8', '2x4' or '2x2x2'")
    return tuple(int(p) for p in parts)


def parse_bytes(text: str, name: str) -> int:
    """``"16GiB"``, ``"512MB"``, ``"1.5G"``, ``"1048576"`` -> bytes (``alpa_pass._sizes``)."""
    return _sizes.parse_bytes(text, name, PluginConfigError)


def parse_log_level(text: str | None) -> int | None:
    """``"info"`` (any case) -> ``logging.INFO``; empty -> ``None``."""
    if not text:
        return None
    if text.lower() not in _LOG_LEVELS:
        raise PluginConfigError(f"ALPA_PASS_LOG={text!r} is not a log level; use one of "
                                f"{', '.join(_LOG_LEVELS)}")
    return getattr(logging, text.upper())


def _get(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()
