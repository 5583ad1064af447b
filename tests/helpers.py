"""Helpers for tests: collectives in compiled HLO text (the parser is
``alpa_pass.tools.fidelity.list_collectives``; async pairs count once, at their ``-start``), and
plan specs by pytree path."""
from __future__ import annotations

import jax

from alpa_pass.tools.fidelity import list_collectives as collectives  # noqa: F401  (tests use helpers.collectives)
from alpa_pass.tools.fidelity import summarize


def count(hlo_text: str) -> dict[str, int]:
    """Number of instructions of each collective kind (every kind present, 0 if absent)."""
    return {k: v["count"] for k, v in summarize(collectives(hlo_text)).items()}


def total_bytes(hlo_text: str) -> dict[str, int]:
    """Result bytes of all collectives of each kind."""
    return {k: v["bytes"] for k, v in summarize(collectives(hlo_text)).items()}


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
