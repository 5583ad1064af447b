"""Typed errors. Every message says what went wrong *and* what to change."""


class AlpaPassError(Exception):
    """Base class of every error alpa_pass raises on purpose."""


class MeshError(AlpaPassError, ValueError):
    """The logical mesh does not fit the devices (shape, alpha/beta lengths, device count)."""


class OptionError(AlpaPassError, ValueError):
    """An option has a bad value (``AutoShardingOption``, a method's fields); the message names
    the field and the values it takes."""


class ArgumentError(AlpaPassError, ValueError):
    """A parallelized function's arguments do not fit how it was declared (``static_argnums`` or
    ``donate_argnums`` naming no argument, an unhashable static argument)."""


class ShardingError(AlpaPassError, ValueError):
    """A requested or saved sharding cannot be applied (e.g. a dim not divisible by its axis)."""


class PlanMismatchError(ShardingError):
    """A saved plan does not fit: another file format, jax version, function signature or mesh."""


class TraceError(AlpaPassError):
    """JAX could not trace or lower the function being parallelized."""


class ExtractError(AlpaPassError):
    """The StableHLO module holds something the extractor cannot represent (e.g. dynamic shapes)."""


class InfeasibleError(AlpaPassError):
    """The sharding ILP has no solution (e.g. memory budget too small).

    ``smallest_feasible_bytes``: for a memory budget no plan meets, the smallest per-device budget
    the planner estimates feasible (None otherwise); ``lower_bound_bytes``: a proven per-device
    peak below which no plan fits (None when not computed)."""

    smallest_feasible_bytes = None
    lower_bound_bytes = None


class SolverError(AlpaPassError):
    """HiGHS failed or stopped without a usable solution."""


class EmitError(AlpaPassError):
    """A plan could not be written back into the module (module and plan do not match)."""


class CompileError(AlpaPassError):
    """XLA rejected the annotated module."""


class PlanDivergedError(AlpaPassError):
    """The processes of one multi-process job made different plans (their hashes are compared)."""


class LaunchError(AlpaPassError):
    """A multi-process launch failed: MPI or mpirun missing, coordinator unreachable, bad flags."""


class CheckpointError(AlpaPassError):
    """A checkpoint cannot be saved or restored: no checkpoint at the path, a step that was never
    finalized or is truncated, or a target whose layouts do not fit the saved arrays."""
