"""Trace and lower a user function to StableHLO with stock ``jax.jit``."""
from __future__ import annotations

import jax

from alpa_pass.errors import TraceError


def fn_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def lower(fn, args, *, in_shardings=None, out_shardings=None, donate_argnums=()):
    """``jax.jit(fn, ...).lower(*args)`` with every argument kept (module args == arg leaves).

    ``args`` may hold arrays or ``jax.ShapeDtypeStruct``s. Raises TraceError naming ``fn`` when JAX
    cannot trace or lower it.
    """
    kwargs = dict(keep_unused=True, donate_argnums=tuple(donate_argnums))
    if in_shardings is not None:
        kwargs["in_shardings"] = in_shardings
    if out_shardings is not None:
        kwargs["out_shardings"] = out_shardings
    try:
        return jax.jit(fn, **kwargs).lower(*args)
    except TraceError:
        raise
    except (TypeError, ValueError, jax.errors.JAXTypeError, jax.errors.ConcretizationTypeError) as e:
        raise TraceError(f"jax could not trace {fn_name(fn)}: {type(e).__name__}: {e}. alpa_pass plans "
                         f"what jax.jit can trace; make {fn_name(fn)} jit-compatible first "
                         f"(check it with jax.jit({fn_name(fn)}).lower(*args))") from e


def output_ties(args, out_tree) -> list[tuple[int, int]]:
    """Pairs (output leaf index, input leaf index) that should share a sharding.

    An output subtree (the whole output, or an element of a tuple/list output) that has the same
    tree structure and leaf shapes/dtypes as a top-level argument is the new value of that argument
    (``state`` in ``train_step(state, batch) -> (state, loss)``); each argument matches at most once.
    """
    arg_trees = [jax.tree.structure(a) for a in args]
    arg_leaves = [jax.tree.leaves(a) for a in args]
    arg_start = _starts([len(leaves) for leaves in arg_leaves])
    out_children = out_tree.children() if out_tree.num_nodes > 1 and out_tree.num_leaves > 0 else []
    candidates = [(out_tree, 0)]
    start = 0
    for child in out_children:
        candidates.append((child, start))
        start += child.num_leaves
    used, ties = set(), []
    for tree, out_start in candidates:
        for j, (atree, leaves) in enumerate(zip(arg_trees, arg_leaves)):
            if j in used or atree != tree or not leaves:
                continue
            used.add(j)
            ties.extend((out_start + k, arg_start[j] + k) for k in range(len(leaves)))
            break
    return ties


def _starts(sizes):
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out
