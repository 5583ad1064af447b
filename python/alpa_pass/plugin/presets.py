"""``ALPA_PASS_METHOD=data|zero3`` for plain ``jax.jit`` computations.

The plugin sees flat argument leaves, not the user's pytrees. It takes the *state* to be the
arguments whose new values the computation returns (the output ties: ``params``, ``opt_state`` of
``step(params, opt_state, x, y) -> (params, opt_state, loss)``) and the *batch* to be every other
argument with a leading dim the device count divides. Then, like ``ap.DataParallel()`` /
``ap.Zero3Parallel()``: data pins state replicated and the batch split on dim 0 over all devices;
zero3 pins state leaves with ndim > 1 split on their largest divisible dim (1-D state is left to the
planner) and the batch as for data. ZeRO-2 needs to tell parameters from optimizer state, which
flat leaves do not say: use ``ap.parallelize(step, method=ap.Zero2Parallel())``.
"""
from __future__ import annotations

import dataclasses

from alpa_pass.presets import zero_dim

PRESET_METHODS = ("data", "zero3")


def preset_option(method: str, option):
    """The planner options a preset needs (ZeRO-3's sharded state needs follower merging off)."""
    return dataclasses.replace(option, merge_followers=False) if method == "zero3" else option


def preset_pins(method: str, graph, ties, mesh) -> list[tuple[int, list[int]]]:
    """(parameter node, core spec) pins of ``method`` for an extracted plain-jit graph."""
    n = mesh.num_devices
    state = {param for _, param in ties}
    pins = []
    for v in graph.param_nodes():
        shape = graph.shape(v)
        if v in state:
            dim = -1 if method == "data" else (zero_dim(shape, n) if len(shape) > 1 else None)
        else:
            dim = 0 if shape and shape[0] % n == 0 and n > 1 else None
        if dim is not None:
            pins.append((v, [dim if size > 1 else -1 for size in mesh.shape]))
    return pins
