"""Alpa's ``alpa.util`` helpers that scripts written for Alpa call: ``benchmark_func`` (its timing
loop: it only measures, no plan depends on it), ``count_communication_primitives``,
``get_metrics`` and ``map_to_nparray`` (metrics and parameters brought to the host)."""
from __future__ import annotations

import math
import time

import jax
import numpy as np


def benchmark_func(run_func, sync_func=None, warmup: int = 1, repeat: int = 3, number: int = 5,
                   min_repeat_second: float | None = None) -> np.ndarray:
    """Seconds per call of ``run_func``: ``warmup`` untimed calls, then ``repeat`` rounds of
    ``number`` calls each, ``sync_func`` (e.g. waiting for the devices) ending each round inside
    its time. With ``min_repeat_second``, ``number`` grows so that a round lasts about that long
    (measured on one more round). Returns the ``repeat`` per-call times."""
    if repeat < 1 or number < 1 or warmup < 0:
        raise ValueError(f"benchmark_func needs repeat >= 1, number >= 1, warmup >= 0 "
                         f"(got {repeat}, {number}, {warmup})")

    def round_time(n):
        tic = time.perf_counter()
        for _ in range(n):
            run_func()
        if sync_func is not None:
            sync_func()
        return time.perf_counter() - tic

    for _ in range(warmup):
        run_func()
    if sync_func is not None:
        sync_func()
    if min_repeat_second:
        number = max(number, math.ceil(min_repeat_second / max(round_time(number) / number, 1e-9)))
    return np.array([round_time(number) / number for _ in range(repeat)])


def count_communication_primitives(hlo_text: str, ignore_scalar_all_reduce: bool = False) -> tuple[int, ...]:
    """Alpa's counts of a compiled module's collectives (``exe.get_hlo_text()``): ``(total,
    all-reduce, all-gather, reduce-scatter, all-to-all)``. ``total`` also counts
    collective-permutes (which Alpa's does not list). ``ignore_scalar_all_reduce``: leave out
    all-reduces of scalars only (a loss, a gradient norm)."""
    from alpa_pass.tools.fidelity import list_collectives

    kinds = [c.kind for c in list_collectives(hlo_text)
             if not (ignore_scalar_all_reduce and c.kind == "all-reduce" and all(s == () for s in c.shapes))]
    return (len(kinds), kinds.count("all-reduce"), kinds.count("all-gather"), kinds.count("reduce-scatter"),
            kinds.count("all-to-all"))


def map_to_nparray(tree):
    """Alpa's ``map_to_nparray``: ``tree`` with every array leaf as a numpy array on the host
    (a sharded one gathered); other leaves as they are."""
    return jax.tree.map(lambda x: np.asarray(x) if hasattr(x, "__array__") else x, tree)


def get_metrics(device_metrics):
    """Alpa's (and flax's ``common_utils``) ``get_metrics``: a list of per-step metric pytrees as one
    pytree of numpy arrays stacked along a new leading axis (one row per step)."""
    from alpa_pass.cluster import prefetch

    prefetch(device_metrics)
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *device_metrics)

