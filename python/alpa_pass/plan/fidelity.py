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

KINDS = ("all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-permute")
REMAT_WARNING = "Involuntary full rematerialization"

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.*?)\s+"
                    r"(?P<kind>" + "|".join(KINDS) + r")(?:-start)?\((?P<rest>.*)$")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CONSTRAINT = re.compile(r"alpa_pass/(value|use)/%(\d+)(?:/(\d+))?")


@dataclasses.dataclass(frozen=True)
class HloCollective:
    """One collective instruction (an async ``-start``/``-done`` pair counts once).

    ``shapes``/``dtypes``: per tuple element of the result; ``op_name``: the metadata name ("" if
    none); ``node``/``operand``: the graph node (and operand index, for a use-site constraint)
    whose inserted constraint caused it, or None when XLA attributes it to another op.
    """

    kind: str
    shapes: tuple
    dtypes: tuple
    op_name: str
    node: int | None
    operand: int | None

    @property
    def bytes(self) -> int:
        """Bytes of the result per device (all tuple elements)."""
        total = 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            n = 1
            for d in shape:
                n *= d
            total += n * _DTYPE_BYTES.get(dtype, 4)
        return total

    @property
    def from_constraint(self) -> bool:
        return self.node is not None


def list_collectives(hlo_text: str) -> list[HloCollective]:
    """Every collective of a compiled (SPMD-partitioned) module's text, in text order."""
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
            tuple(dt for dt, _ in arrays), op_name, int(c.group(2)) if c else None,
            int(c.group(3)) if c and c.group(3) else None))
    return out


def summarize(collectives: list[HloCollective]) -> dict:
    """Kind -> {"count", "bytes"} (every kind present)."""
    out = {k: {"count": 0, "bytes": 0} for k in KINDS}
    for c in collectives:
        out[c.kind]["count"] += 1
        out[c.kind]["bytes"] += c.bytes
    return out


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
