"""Pure host callbacks on a branch (an error path) run on every device of the plan's mesh.

jax lowers a ``jax.pure_callback`` with a maximal sharding: device 0 runs it and XLA's partitioner
hands its result to the other devices in a collective. Inside a ``cond`` / ``case`` branch that
runs only when something went wrong (Equinox's ``error_if``, in every diffrax solve and many
training steps), the callback raises: device 0 stops and the other devices wait in that collective
for ever (XLA's CPU runtime aborts the process after 40 s; NCCL waits). Plain ``jax.jit`` on one
device raised the error. A pure callback may run any number of times (jax's contract), so such a
callback is made replicated over the plan's mesh: every device runs it on its own copy of the
operands (read replicated: the plan's OPAQUE node), with no collective, and every device raises.

Callbacks with side effects (``jax.debug.callback``, ``io_callback``: ``has_side_effect``) keep
jax's one device, as do pure callbacks outside branches (a step runs them every time; one call
per step, as plain ``jax.jit``).

Input IR state: the planned module (constraints inserted). Output IR state: each such callback's
``sdy.sharding`` is replicated on ``@mesh_name`` (one per result).
"""
from __future__ import annotations

from jaxlib.mlir import ir

from alpa_pass.extract.stablehlo import HOST_CALLBACK

BRANCH_OPS = ("stablehlo.case", "stablehlo.if")


def replicate_branch_callbacks(module: ir.Module, mesh_name: str) -> int:
    """Make every pure host callback inside a ``case`` / ``if`` branch of ``module`` replicated
    on ``@mesh_name``; returns how many."""
    found = []

    def visit(op):
        if op.name == "stablehlo.custom_call" and _is_pure_callback(op) and _in_branch(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    with module.context:
        for op in found:
            per_value = ", ".join(f"<@{mesh_name}, [{', '.join('{}' for _ in _shape(r))}]>" for r in op.results)
            op.attributes["sdy.sharding"] = ir.Attribute.parse(f"#sdy.sharding_per_value<[{per_value}]>")
    return len(found)


def _is_pure_callback(op) -> bool:
    target = ir.StringAttr(op.attributes["call_target_name"]).value if "call_target_name" in op.attributes else ""
    effects = "has_side_effect" in op.attributes and ir.BoolAttr(op.attributes["has_side_effect"]).value
    return bool(HOST_CALLBACK.search(target)) and not effects and len(op.results) > 0


def _in_branch(op) -> bool:
    parent = op.parent
    while parent is not None and parent.name not in ("func.func", "builtin.module"):
        if parent.name in BRANCH_OPS:
            return True
        parent = parent.parent
    return False


def _shape(value) -> list:
    try:
        return list(ir.RankedTensorType(value.type).shape)
    except ValueError:  # (a token)
        return []
