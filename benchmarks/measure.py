"""Figures of one compiled step: collectives and bytes from the partitioned HLO, per-device memory
from ``memory_analysis``, FLOPs from ``cost_analysis``, step time (median of repeats), loss."""
from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from alpa_pass.tools.fidelity import KINDS, list_collectives as collectives


def comm_stats(hlo_text: str) -> dict:
    """Per-device communication of a partitioned module, by collective kind.

    ``count``: instructions; ``result_bytes``: bytes of their results (per device, as the HLO
    states them); ``wire_bytes``: bytes each device sends under ring algorithms for a group of n
    (all-reduce 2(n-1)/n·B, all-gather (n-1)/n·B_out, reduce-scatter (n-1)·B_out,
    all-to-all (n-1)/n·B, collective-permute B). Collectives inside loops count once.
    """
    out = {k: {"count": 0, "result_bytes": 0, "wire_bytes": 0.0} for k in KINDS}
    for c in collectives(hlo_text):
        n = c.group_size or _all_devices(c)
        factor = {"all-reduce": 2 * (n - 1) / n, "all-gather": (n - 1) / n, "reduce-scatter": n - 1,
                  "all-to-all": (n - 1) / n, "collective-permute": 1.0}[c.kind]
        entry = out[c.kind]
        entry["count"] += 1
        entry["result_bytes"] += c.bytes
        entry["wire_bytes"] += factor * c.bytes
    return out


def _all_devices(c) -> int:
    return len(jax.devices()) if c.groups == () or c.groups is None else len(c.groups[0])


def memory_stats(m) -> dict:
    """Per-device bytes from a ``memory_analysis()`` result; ``peak`` = arguments + outputs -
    aliased + temps (what XLA needs live at once, upper bound)."""
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
              "temp_size_in_bytes", "generated_code_size_in_bytes")
    out = {f.replace("_size_in_bytes", ""): int(getattr(m, f)) for f in fields}
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def flops(cost) -> float | None:
    """Per-device FLOPs XLA counts for one step, from a ``cost_analysis()`` result (None where the
    backend gives none)."""
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return float(cost["flops"]) if cost and "flops" in cost else None


def compiled_stats(compiled) -> dict:
    """comm / memory / flops of a jax ``Compiled`` or an alpa_pass ``Executable``."""
    text = compiled.hlo_text() if hasattr(compiled, "hlo_text") else compiled.as_text()
    return {"comm": comm_stats(text), "memory": memory_stats(compiled.memory_analysis()),
            "flops": flops(compiled.cost_analysis())}


def time_steps(step, state, batch, repeats: int, warmup: int = 2) -> dict:
    """Run ``state, loss = step(state, batch)`` warmup + repeats times (state fed back, as in
    training); seconds per step. Returns {"median_s", "min_s", "repeats", "first_loss"}."""
    times, first_loss = [], None
    for i in range(warmup + repeats):
        t = time.perf_counter()
        state, loss = step(state, batch)
        jax.block_until_ready((state, loss))
        if i >= warmup:
            times.append(time.perf_counter() - t)
        if first_loss is None:
            first_loss = float(loss)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats,
            "first_loss": first_loss}


def time_interleaved(runners: dict, repeats: int, warmup: int = 2) -> dict:
    """``time_steps`` for several methods at once, in rounds: each round runs one step of every
    method (``runners``: name -> (step, state, batch); each state fed back to its own step), so a machine
    that slows down or speeds up during the measurement (other jobs, frequency scaling) weighs on
    every method alike instead of on whichever ran then. Per name: {"median_s", "min_s", "repeats",
    "first_loss", "vs_first"}; ``vs_first`` is the median over rounds of the step time over the first
    method's in the same round (a paired ratio)."""
    states = {name: state for name, (_, state, _) in runners.items()}
    times = {name: [] for name in runners}
    first_loss: dict = {}
    for i in range(warmup + repeats):
        for name, (step, _, batch) in runners.items():
            t = time.perf_counter()
            states[name], loss = step(states[name], batch)
            jax.block_until_ready((states[name], loss))
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
            first_loss.setdefault(name, float(loss))
    lead = next(iter(runners))
    return {name: {"median_s": statistics.median(ts), "min_s": min(ts), "repeats": repeats,
                   "first_loss": first_loss[name],
                   "vs_first": statistics.median(t / t0 for t, t0 in zip(ts, times[lead]))}
            for name, ts in times.items()}


def fresh_copy(tree):
    """A copy of every array (donating steps consume their state argument)."""
    return jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else np.array(x), tree)
