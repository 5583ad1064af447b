"""``assert_allclose`` over pytrees, as Alpa's ``alpa.testing`` offers it to compare a
parallelized step's results with ``jax.jit``'s."""
from __future__ import annotations

import jax
import numpy as np


def assert_allclose(actual, desired, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    """Raise AssertionError unless ``actual`` and ``desired`` have the same pytree structure and
    every pair of leaves (arrays, sharded or not, or numbers) is close (``numpy.testing``'s rule:
    ``|a - d| <= atol + rtol * |d|``); the message names the first leaf that is not."""
    a_leaves, a_tree = jax.tree_util.tree_flatten_with_path(actual)
    d_leaves, d_tree = jax.tree.flatten(desired)
    if a_tree != d_tree:
        raise AssertionError(f"the pytrees differ: {a_tree} vs {d_tree}")
    for (path, a), d in zip(a_leaves, d_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(d), rtol=rtol, atol=atol,
                                   err_msg=f"leaf {jax.tree_util.keystr(path) or '(root)'}")
