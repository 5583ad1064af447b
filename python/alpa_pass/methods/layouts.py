"""Layouts taken from another step's executable: which executable (:func:`train_executable`), and
which argument leaves of a new step correspond to its leaves (:func:`match_leaves`)."""
from __future__ import annotations

import jax

from alpa_pass.errors import ShardingError
from alpa_pass.pipeline.compile.apply import core_spec
from alpa_pass.runtime.executable import Executable
from alpa_pass.trace.lower import leaf_aval


def train_executable(source, args=None) -> Executable:
    """The ``Executable`` of ``source``: itself, or a parallelized function's executable for
    ``args`` (planned now if needed) or, without ``args``, the one signature it has planned.

    Raises:
      ShardingError: ``source`` is neither, or a parallelized function that has planned no or
        several signatures (pass ``get_executable(...)``'s result instead).
    """
    if isinstance(source, Executable):
        return source
    if not hasattr(source, "get_executable"):
        raise ShardingError(f"expected a train step's alpa_pass Executable or its ap.parallelize'd "
                            f"function (ShardParallel or a preset), got {type(source).__name__}")
    if args is not None:
        exe = source.get_executable(*args)
    elif len(source.executables) == 1:
        exe = source.executables[0]
    else:
        raise ShardingError(f"the train step {getattr(source, '__name__', '')} has planned "
                            f"{len(source.executables)} argument signatures; pass the one to follow: "
                            f"train_step.get_executable(state, batch)")
    if not isinstance(exe, Executable):
        raise ShardingError(f"the train step's executable is a {type(exe).__name__}; only intra-op "
                            f"(ShardParallel, preset) executables can be followed")
    return exe


def core_specs(shardings, mesh) -> list[list[int]]:
    """Core specs (tensor dim per mesh axis, -1 = none) on ``mesh`` of ``NamedSharding``s."""
    return [core_spec(s, mesh) for s in shardings]


def match_leaves(reference, args) -> dict[int, int]:
    """Flat leaf index in ``args`` -> flat leaf index in ``reference`` of the leaves that are the
    same value (``reference``: a train step's argument tuple of ShapeDtypeStructs).

    The rule, per positional argument of ``args``:
      1. an argument that is a pytree of several leaves matches the first subtree of
         ``reference`` (depth-first, in flattening order) with the same tree structure and the
         same shape and dtype on every leaf: ``eval_step(params, batch)`` finds ``state[0]`` of
         ``train_step((params, opt_state), batch)``, before the optimizer's moments;
      2. any leaf left matches the leaf of ``reference`` at the same key path with the same
         shape and dtype: ``eval_step(state, batch)`` beside ``train_step(state, batch)``.
    """
    ref_leaves, ref_def = jax.tree.flatten(reference)
    ref_paths = {jax.tree_util.keystr(p): i for i, (p, _) in enumerate(jax.tree_util.tree_flatten_with_path(reference)[0])}
    subtrees = list(_subtrees(ref_def, 0))
    out, offset = {}, 0
    for arg in args:
        leaves, treedef = jax.tree.flatten(arg)
        if len(leaves) > 1:
            for sub, start in subtrees:
                if sub == treedef and all(_same(a, b) for a, b in zip(leaves, ref_leaves[start:])):
                    out.update((offset + k, start + k) for k in range(len(leaves)))
                    break
        offset += len(leaves)
    for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(tuple(args))[0]):
        j = ref_paths.get(jax.tree_util.keystr(path))
        if i not in out and j is not None and _same(leaf, ref_leaves[j]):
            out[i] = j
    return out


def _subtrees(treedef, start):
    """(treedef, first flat leaf index) of every subtree, depth-first in flattening order."""
    yield treedef, start
    for child in treedef.children():
        yield from _subtrees(child, start)
        start += child.num_leaves


def _same(a, b) -> bool:
    a = leaf_aval(a)
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
