"""Helpers for tests: collectives in compiled HLO text, and plan specs by pytree path.

``collectives(hlo_text)`` parses the SPMD-partitioned, optimized HLO that
``exe.hlo_text()`` returns. It understands what the CPU pipeline prints:

  %all-reduce.3 = (f32[32,64]{1,0}, f32[64,32]{1,0}) all-reduce(%a, %b), replica_groups={{0,4},{1,5}}, ...
  %all-reduce = f32[8,64]{1,0} all-reduce(%x), replica_groups=[2,4]<=[8], ...
  %all-to-all.1 = (...) all-to-all(...), replica_groups=mesh['a'=1,'b'=4,'c'=2], device_ids=([2,4]T(1,0)) {'b'}

(tuple-shaped combined collectives; explicit, iota and mesh-form replica groups). Async pairs count
once, at their ``-start``; ``-done`` is skipped.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

KINDS = ("all-reduce", "all-gather", "all-to-all", "reduce-scatter", "collective-permute")

_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.*?)\s+"
    r"(?P<kind>" + "|".join(KINDS) + r")(?P<start>-start)?\((?P<rest>.*)$"
)
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction of the compiled module.

    Attributes:
      kind: one of ``KINDS``.
      shapes: result shape of each tuple element (one entry for a non-tuple result).
      dtypes: element type of each tuple element (e.g. ``"f32"``).
      groups: device groups (lists of device ids); ``None`` where the text gives none we parse
        (collective-permute uses source/target pairs).
      line: the HLO line.
    """

    kind: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...] | None
    line: str

    @property
    def bytes(self) -> int:
        """Bytes of the result (all tuple elements)."""
        return sum(int(np.prod(s)) * _DTYPE_BYTES[d] for s, d in zip(self.shapes, self.dtypes))

    @property
    def group_size(self) -> int | None:
        return len(self.groups[0]) if self.groups else None


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective instruction in ``hlo_text``, in text order."""
    found = []
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        arrays = _ARRAY.findall(m.group("shape"))
        shapes = tuple(tuple(int(d) for d in dims.split(",") if d) for _, dims in arrays)
        dtypes = tuple(dt for dt, _ in arrays)
        found.append(Collective(m.group("kind"), shapes, dtypes, parse_replica_groups(m.group("rest")), line.strip()))
    return found


def count(hlo_text: str) -> dict[str, int]:
    """Number of instructions of each collective kind (every kind present, 0 if absent)."""
    out = dict.fromkeys(KINDS, 0)
    for c in collectives(hlo_text):
        out[c.kind] += 1
    return out


def total_bytes(hlo_text: str) -> dict[str, int]:
    """Result bytes of all collectives of each kind."""
    out = dict.fromkeys(KINDS, 0)
    for c in collectives(hlo_text):
        out[c.kind] += c.bytes
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


def specs_by_path(tree, specs) -> dict[str, object]:
    """Map ``jax.tree_util.keystr`` of each leaf of ``tree`` to the matching entry of ``specs``.

    ``specs`` is a flat list in ``jax.tree.leaves(tree)`` order (e.g. ``plan.input_specs`` with
    ``tree = (state, batch)``).
    """
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if len(paths) != len(specs):
        raise AssertionError(f"{len(specs)} specs for a tree with {len(paths)} leaves")
    return dict(zip(paths, specs))


def dim_axes(spec, dim: int, mesh) -> tuple[str, ...]:
    """Mesh axes of size > 1 that split tensor dim ``dim`` under PartitionSpec ``spec``."""
    entries = tuple(spec)
    entry = entries[dim] if dim < len(entries) else None
    axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    return tuple(a for a in axes if sizes[a] > 1)


def split_dims(spec, rank: int, mesh) -> dict[int, tuple[str, ...]]:
    """``{dim: axes}`` for every dim of a rank-``rank`` value that ``spec`` splits (size-1 axes ignored)."""
    return {d: dim_axes(spec, d, mesh) for d in range(rank) if dim_axes(spec, d, mesh)}
