"""Moving arrays between submeshes with the destination's sharding."""
from __future__ import annotations

import jax


def transfer(x, sharding):
    """``x`` placed with ``sharding`` (no copy when it already is)."""
    return transfer_many([x], [sharding])[0]


def transfer_many(xs, shardings) -> list:
    """Each ``xs[i]`` placed with ``shardings[i]``; the moves are issued as one batched device_put."""
    out = list(xs)
    moves = [i for i, (x, s) in enumerate(zip(xs, shardings))
             if not (isinstance(x, jax.Array) and x.sharding == s)]
    if moves:
        moved = jax.device_put([xs[i] for i in moves], [shardings[i] for i in moves])
        for i, y in zip(moves, moved):
            out[i] = y
    return out
