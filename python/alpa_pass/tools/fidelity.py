"""Does the compiled program do what the plan says? Collectives of compiled HLO, attributed to
the plan's constraints, and XLA's "Involuntary full rematerialization" warnings.

Emission names every inserted ``sdy.sharding_constraint`` ``alpa_pass/value/%<node>`` or
``alpa_pass/use/%<node>/<operand>`` (``emit.constraints.constraint_location``); XLA keeps that
name as the ``op_name`` metadata of the collectives the constraint causes, so a collective can be
traced to the graph node (and operand) whose resharding produced it. Collectives XLA adds while
partitioning an op itself carry that op's jax name (e.g. ``jit(step)/jvp()/add``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tempfile

import numpy as np

KINDS = ("all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-permute")
REMAT_WARNING = "Involuntary full rematerialization"

_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.*?)\s+"
                    r"(?P<kind>" + "|".join(KINDS) + r")(?:-start)?\((?P<rest>.*)$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CONSTRAINT = re.compile(r"alpa_pass/(value|use)/%(\d+)(?:/(\d+))?")


@dataclasses.dataclass(frozen=True)
class HloCollective:
    """One collective instruction (an async ``-start``/``-done`` pair counts once).

    Attributes:
      kind: one of ``KINDS``.
      shapes, dtypes: per tuple element of the result (one entry for a non-tuple result).
      groups: device groups (device ids); ``()`` for one group of all devices; ``None`` where the
        text gives none (collective-permute uses source/target pairs).
      line: the HLO line.
      op_name: the metadata name ("" if none).
      node, operand: the graph node (and operand index, for a use-site constraint) whose inserted
        constraint caused it, or None when XLA attributes it to another op.
    """

    kind: str
    shapes: tuple
    dtypes: tuple
    groups: tuple | None
    line: str
    op_name: str
    node: int | None
    operand: int | None

    @property
    def bytes(self) -> int:
        """Bytes of the result per device (all tuple elements)."""
        return sum(int(np.prod(s)) * _DTYPE_BYTES.get(d, 4) for s, d in zip(self.shapes, self.dtypes))

    @property
    def group_size(self) -> int | None:
        return len(self.groups[0]) if self.groups else None

    @property
    def from_constraint(self) -> bool:
        return self.node is not None


def list_collectives(hlo_text: str) -> list[HloCollective]:
    """Every collective of a compiled (SPMD-partitioned) module's text, in text order.

    Understands what the CPU pipeline prints: tuple-shaped combined collectives, and explicit
    (``replica_groups={{0,4},{1,5}}``), iota (``[2,4]<=[8]``) and mesh-form
    (``mesh['a'=1,'b'=4], device_ids=([2,4]T(1,0)) {'b'}``) replica groups.
    """
    out = []
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        arrays = _ARRAY.findall(m.group("shape"))
        name = _OP_NAME.search(line)
        op_name = name.group(1) if name else ""
        c = _CONSTRAINT.search(op_name)
        out.append(HloCollective(
            m.group("kind"), tuple(tuple(int(d) for d in dims.split(",") if d) for _, dims in arrays),
            tuple(dt for dt, _ in arrays), parse_replica_groups(m.group("rest")), line.strip(), op_name,
            int(c.group(2)) if c else None, int(c.group(3)) if c and c.group(3) else None))
    return out


def summarize(collectives: list[HloCollective]) -> dict:
    """Kind -> {"count", "bytes"} (every kind present)."""
    out = {k: {"count": 0, "bytes": 0} for k in KINDS}
    for c in collectives:
        out[c.kind]["count"] += 1
        out[c.kind]["bytes"] += c.bytes
    return out


def parse_replica_groups(text: str) -> tuple[tuple[int, ...], ...] | None:
    """Device groups from the attribute text after an instruction's operands.

    Handles ``replica_groups={{0,1},{2,3}}``, ``replica_groups={}`` (one group of all devices:
    returned as ``()``), iota ``replica_groups=[2,4]<=[4,2]T(1,0)`` and the mesh form
    ``replica_groups=mesh['a'=2,'b'=4], device_ids=([2,4]T(1,0)) {'b'}``.
    """
    m = re.search(r"replica_groups=\{((?:\{[\d,\s]*\},?\s*)*)\}", text)
    if m:
        return tuple(tuple(int(i) for i in g.split(",") if i.strip()) for g in re.findall(r"\{([\d,\s]*)\}", m.group(1)))
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if m:
        group_shape = _ints(m.group(1))
        ids = _iota(_ints(m.group(2)), m.group(3))
        return tuple(tuple(int(i) for i in row) for row in ids.reshape(group_shape))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]", text)
    if m:
        return _mesh_groups(m.group(1), text[m.end():])
    return None


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _iota(dims: list[int], perm: str | None) -> np.ndarray:
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    return (ids.transpose(_ints(perm)) if perm else ids).reshape(-1)


def _mesh_groups(axes_text: str, rest: str) -> tuple[tuple[int, ...], ...]:
    """Groups of the mesh form: devices that differ only along the braced axes."""
    axes = re.findall(r"'([^']+)'=(\d+)", axes_text)
    names = [a for a, _ in axes]
    sizes = [int(n) for _, n in axes]
    ids_m = re.match(r"\s*,\s*device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\)", rest)
    ids = _iota(_ints(ids_m.group(1)), ids_m.group(2)) if ids_m else np.arange(int(np.prod(sizes)))
    grid = ids.reshape(sizes)
    braces = re.match(r"[^{]*\{([^}]*)\}", rest[ids_m.end():] if ids_m else rest)
    in_group = [names.index(a) for a in re.findall(r"'([^']+)'", braces.group(1))] if braces else list(range(len(sizes)))
    others = [i for i in range(len(sizes)) if i not in in_group]
    grid = grid.transpose(others + in_group).reshape(-1, int(np.prod([sizes[i] for i in in_group])))
    return tuple(tuple(int(i) for i in row) for row in grid)


@contextlib.contextmanager
def capture_stderr():
    """Capture what C++ code (XLA's logging) writes to file descriptor 2 while the block runs.

    Yields a list that holds the captured text once the block exits (also on error).
    """
    captured: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.append(tmp.read().decode(errors="replace"))


def remat_warnings(log_text: str) -> list[str]:
    """The "Involuntary full rematerialization" warnings in XLA's log text, one line each."""
    return [line for line in log_text.splitlines() if REMAT_WARNING in line]
