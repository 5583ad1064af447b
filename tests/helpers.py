"""Helpers for tests: the single-device reference run and the comparison with it, collectives in
compiled HLO text (the parser is ``alpa_pass.tools.fidelity.list_collectives``; async pairs count
once, at their ``-start``), plan specs by pytree path, and hand-built core graphs and meshes."""
from __future__ import annotations

import os

import jax
import numpy as np

from alpa_pass import _core

from alpa_pass.tools.fidelity import list_collectives as collectives  # noqa: F401  (tests use helpers.collectives)
from alpa_pass.tools.fidelity import summarize

RTOL, ATOL = 1e-5, 1e-6  # a parallel f32 run against the single-device one


def step_outputs(step, state, batches) -> list:
    """Every output of ``step(state, batch)`` over ``batches``, each step fed the previous one's
    output 0 (the new state)."""
    outputs = []
    for batch in batches:
        outputs.append(step(state, batch))
        state = outputs[-1][0]
    return outputs


def run_steps(step, state, batches):
    """``(final state, [float(loss) per step])`` of a ``step(state, batch) -> (state, loss, ...)``."""
    outputs = step_outputs(step, state, batches)
    return outputs[-1][0], [float(out[1]) for out in outputs]


def reference_outputs(step_fn, state, batches) -> list:
    """:func:`step_outputs` of plain ``jax.jit(step_fn)`` with ``state`` and ``batches`` on
    ``jax.devices()[0]``: what a parallel run must reproduce."""
    dev = jax.devices()[0]
    return step_outputs(jax.jit(step_fn), jax.device_put(state, dev), jax.device_put(batches, dev))


def reference_run(step_fn, state, batches):
    """``(final state, losses)`` of plain ``jax.jit(step_fn)`` on ``jax.devices()[0]`` (see :func:`run_steps`)."""
    outputs = reference_outputs(step_fn, state, batches)
    return outputs[-1][0], [float(out[1]) for out in outputs]


def assert_same_run(ref, got, rtol: float = RTOL, atol: float = ATOL) -> None:
    """``got`` equals ``ref`` (both ``(state, losses)``; a state may be a flat list of its leaves):
    the losses, and every state leaf, named by its path in ``ref`` when one differs."""
    (ref_state, ref_losses), (state, losses) = ref, got
    np.testing.assert_allclose(losses, ref_losses, rtol=rtol, atol=atol, err_msg="losses differ")
    assert_same_tree(ref_state, state, rtol, atol, "state leaf ")


def assert_same_tree(want, got, rtol: float = RTOL, atol: float = ATOL, what: str = "") -> None:
    """Every leaf of ``got`` equals the leaf of ``want`` in the same place (``got`` may be a flat list)."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(want)[0]]
    have = jax.tree.leaves(got)
    assert len(have) == len(paths), f"{len(have)} leaves, want {len(paths)}"
    for path, w, g in zip(paths, jax.tree.leaves(want), have):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol, err_msg=f"{what}{path} differs")


def count(hlo_text: str) -> dict[str, int]:
    """Number of instructions of each collective kind (every kind present, 0 if absent)."""
    return {k: v["count"] for k, v in summarize(collectives(hlo_text)).items()}


def total_bytes(hlo_text: str) -> dict[str, int]:
    """Result bytes of all collectives of each kind."""
    return {k: v["bytes"] for k, v in summarize(collectives(hlo_text)).items()}


def communication(plan) -> float:
    """The plan's predicted communication: collectives inside ops plus reshards between them (its
    objective also holds compute, 1e-4 per FLOP with unit costs, and the memory tie-breaker)."""
    return plan.predicted["communication"] + plan.predicted["resharding"]


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


# Hand-built core graphs (the C++ core's unit tests).
F32 = 4  # bytes
MESH14 = _core.Mesh(shape=[1, 4], alpha=[1.0, 1.0], beta=[1.0, 1.0])  # x has size 1: never split
MESH24 = _core.Mesh(shape=[2, 4], alpha=[1.0, 1.0], beta=[1.0, 0.5])


def built_graph(builder):
    """The ``_core.Graph`` of a hand-built ``alpa_pass.extract.graph.GraphBuilder``."""
    g = builder.build()
    return _core.Graph(g.kind, g.dtype_bytes, g.shape_offsets, g.shape_dims, g.operand_offsets,
                       g.operand_ids, g.attr_offsets, g.attrs)


def child_env(strip: tuple[str, ...], **extra) -> dict:
    """``os.environ`` for a child process, without the variables that start with one of ``strip``
    (settings it must not inherit) but with ALPA_PASS_PROFILE_DIR (tests/conftest.py: no profile
    cached on the machine changes what a test plans), and with ``extra``."""
    env = {k: v for k, v in os.environ.items() if k == "ALPA_PASS_PROFILE_DIR" or not k.startswith(strip)}
    env.update(extra)
    return env
