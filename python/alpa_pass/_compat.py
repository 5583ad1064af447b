"""Every use of JAX internals lives here, checked against the supported versions.

Supported: ``jax>=0.10.2,<0.13`` (0.10.2 on Python 3.11; 0.11/0.12 on Python >= 3.12).
"""
from __future__ import annotations

import jax

SUPPORTED = ((0, 10, 2), (0, 13, 0))  # [low, high)


def jax_version() -> tuple[int, ...]:
    parts = []
    for p in jax.__version__.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def is_supported_jax() -> bool:
    return SUPPORTED[0] <= jax_version() < SUPPORTED[1]


def lowered_module(lowered):
    """The mutable StableHLO ``ir.Module`` that ``lowered.compile()`` will compile.

    ``jax.stages.Lowered.compiler_ir()`` returns a *copy* on some versions; the module held by the
    private ``MeshComputation`` is the one compiled, so passes that annotate it must edit that one.
    """
    lowering = getattr(lowered, "_lowering", None)
    module = getattr(lowering, "_hlo", None)
    if module is None:
        raise RuntimeError(
            f"alpa_pass cannot reach the module of a jax.stages.Lowered on jax {jax.__version__}; "
            f"supported versions are >={'.'.join(map(str, SUPPORTED[0]))},<{'.'.join(map(str, SUPPORTED[1]))}")
    return module


def make_ir_context():
    """An MLIR context with every dialect jax modules use (func, stablehlo, chlo, sdy, mhlo).

    jaxlib's public bindings register stablehlo/chlo/sdy but not ``func``; jax's own factory does.
    """
    from jax._src.interpreters import mlir as jax_mlir

    return jax_mlir.make_ir_context()
