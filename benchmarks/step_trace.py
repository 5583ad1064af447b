"""Where a step's time goes, measured: a ``jax.profiler`` trace of a few steps, each device's
time split into collectives, by kind, and the rest ("compute"), per device per step.

- CPU devices: XLA:CPU names each thunk's trace event after its instruction; an event counts when
  its name is an instruction of the compiled module (``all-reduce.32``, ``fusion.7``), and its
  kind is that instruction's.
- GPU devices (checked on one H200, jax 0.11.2: ``step_trace.py --probe``): the kernels run as one
  CUDA graph whose events all carry ``hlo_op = command_buffer_N``, so an event cannot be traced
  back to its instruction; every kernel event on a ``/device:GPU:N`` lane counts, NCCL kernels
  (``ncclDevKernel_AllReduce_...``) as collectives by the kind their name says (NCCL's send/recv
  kernel carries both all-to-all and collective-permute: "send-recv"), the rest as compute. The
  NCCL names are NCCL's, not seen here yet (one GPU, no collectives). Time between kernels (the
  host launching the step) is in neither.

Other platforms are refused rather than summed wrongly.

The planner predicts a plan's compute and communication separately (``plan.predicted``); the
suite's step times only say whether their sum ranks the plans right. This says which part is
wrong. A collective's time is the time its thunk or kernel ran on that device, waiting for the
other participants included: a collective issued after uneven work absorbs the straggler's lead.

    state, breakdown = step_breakdown(step, state, batch, hlo_text, steps=5)
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# "%name = shape opcode(" in HLO text; shapes may be tuples with spaces, so the opcode is the last
# word before the first "(" that follows "= ".
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([\w\-]+)\(")


def instruction_kinds(hlo_text: str) -> dict[str, str]:
    """Instruction name -> its collective kind (async ``-start``/``-done`` halves included) or
    "compute", for every instruction of the module."""
    out = {}
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        opcode = m.group(3)
        base = re.sub(r"-(start|done|update)$", "", opcode)
        out[m.group(1)] = base if base in COLLECTIVES else "compute"
    return out


def breakdown(events, kinds: dict[str, str], num_devices: int, steps: int) -> dict:
    """Milliseconds per device per step from complete trace events (``ph == "X"``, ``dur`` in us):
    ``compute`` and ``collectives`` (total and ``by_kind``), over the events named after an
    instruction in ``kinds``; ``events_matched`` counts them (0: the trace named nothing of the
    module, and the figures mean nothing)."""
    per_kind = collections.Counter()
    matched = 0
    for e in events:
        if e.get("ph") != "X":
            continue
        kind = kinds.get(e.get("name", ""))
        if kind is None:
            continue
        per_kind[kind] += float(e.get("dur", 0.0))
        matched += 1
    scale = 1e-3 / (num_devices * steps)  # us summed over devices and steps -> ms per device per step
    by_kind = {k: per_kind[k] * scale for k in COLLECTIVES if per_kind[k]}
    return {"compute_ms": per_kind["compute"] * scale, "collectives_ms": sum(by_kind.values()),
            "by_kind": by_kind, "events_matched": matched, "steps": steps, "devices": num_devices}


_NCCL_KINDS = (("AllReduce", "all-reduce"), ("AllGather", "all-gather"), ("ReduceScatter", "reduce-scatter"),
               ("AllToAll", "all-to-all"), ("SendRecv", "send-recv"), ("Send", "send-recv"),
               ("Recv", "send-recv"), ("Broadcast", "broadcast"))
GPU_KINDS = tuple(dict.fromkeys(k for _, k in _NCCL_KINDS))


def nccl_kind(kernel: str) -> str | None:
    """The collective an NCCL kernel's name says (``ncclDevKernel_AllGather_RING_LL`` -> all-gather),
    or None for any other kernel."""
    if not kernel.startswith("nccl"):
        return None
    for word, kind in _NCCL_KINDS:
        if word in kernel:
            return kind
    return "other-nccl"


def gpu_breakdown(events, num_devices: int, steps: int) -> dict:
    """:func:`breakdown`'s figures from a GPU trace: the complete events on the ``/device:GPU:N``
    lanes (processes named so by the trace's metadata), NCCL kernels by :func:`nccl_kind`, every
    other kernel compute."""
    gpu_pids = {e.get("pid") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                and str((e.get("args") or {}).get("name", "")).startswith("/device:GPU")}
    per_kind = collections.Counter()
    matched = 0
    for e in events:
        if e.get("ph") != "X" or e.get("pid") not in gpu_pids:
            continue
        per_kind[nccl_kind(e.get("name", "")) or "compute"] += float(e.get("dur", 0.0))
        matched += 1
    scale = 1e-3 / (num_devices * steps)
    by_kind = {k: v * scale for k, v in per_kind.items() if k != "compute" and v}
    return {"compute_ms": per_kind["compute"] * scale, "collectives_ms": sum(by_kind.values()),
            "by_kind": by_kind, "events_matched": matched, "steps": steps, "devices": num_devices,
            "source": "gpu kernels"}


def read_trace_events(trace_dir: str) -> list:
    """The events of the newest perfetto trace under ``trace_dir`` (``jax.profiler.trace(...,
    create_perfetto_trace=True)``)."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True),
                   key=os.path.getmtime)
    if not files:
        raise RuntimeError(f"jax.profiler wrote no perfetto trace under {trace_dir}")
    with gzip.open(files[-1]) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def step_breakdown(step, state, batch, hlo_text: str, steps: int = 5, warmup: int = 1):
    """Run ``state, loss = step(state, batch)`` ``warmup`` times, then ``steps`` times under the
    profiler; returns the last state (the step may donate it) and :func:`breakdown` of the traced
    steps over all devices of the process."""
    import jax

    platform = jax.devices()[0].platform
    if platform not in ("cpu", "gpu"):  # (see the module doc)
        raise NotImplementedError(f"step_breakdown reads XLA:CPU thunk events and GPU kernel events; "
                                  f"{platform} traces are not supported yet")
    for _ in range(warmup):
        state, loss = step(state, batch)
        jax.block_until_ready((state, loss))
    with tempfile.TemporaryDirectory(prefix="alpa_pass_trace_") as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(steps):
                state, loss = step(state, batch)
                jax.block_until_ready((state, loss))
        events = read_trace_events(d)
    if platform == "gpu":
        return state, gpu_breakdown(events, len(jax.local_devices()), steps)
    return state, breakdown(events, instruction_kinds(hlo_text), len(jax.local_devices()), steps)


def probe_summary(events, hlo_text: str, top: int = 40) -> dict:
    """How a trace names a module's work, for platforms whose naming is unchecked (GPU): per
    process/thread (by their metadata names) the complete events' count and total us, which event
    names and which ``args`` values are instructions of ``hlo_text``, the ``args`` keys seen, and
    the ``top`` names by total duration. What :func:`breakdown` would need to read a GPU trace."""
    kinds = instruction_kinds(hlo_text)
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            key = (e.get("pid"), e.get("tid")) if e["name"] == "thread_name" else (e.get("pid"), None)
            names[key] = (e.get("args") or {}).get("name")
    lanes = collections.defaultdict(lambda: {"events": 0, "dur_us": 0.0, "name_is_instruction": 0,
                                             "arg_is_instruction": collections.Counter()})
    arg_keys = collections.Counter()
    by_name = collections.Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        lane = lanes[f"{names.get((e.get('pid'), None))} / {names.get((e.get('pid'), e.get('tid')))}"]
        lane["events"] += 1
        lane["dur_us"] += float(e.get("dur", 0.0))
        lane["name_is_instruction"] += e.get("name") in kinds
        for k, v in (e.get("args") or {}).items():
            arg_keys[k] += 1
            if isinstance(v, str) and v in kinds:
                lane["arg_is_instruction"][k] += 1
        by_name[e.get("name", "")] += float(e.get("dur", 0.0))
    return {"lanes": {k: {**v, "arg_is_instruction": dict(v["arg_is_instruction"])} for k, v in lanes.items()},
            "arg_keys": dict(arg_keys.most_common(60)), "top_names_us": dict(by_name.most_common(top)),
            "instructions": len(kinds)}


def probe(out_dir: str, steps: int = 3) -> dict:
    """Trace ``steps`` steps of the small GPT's auto plan on this process's devices and write to
    ``out_dir``: the compiled HLO (``probe.hlo.txt``), the perfetto trace (``probe_trace.json.gz``)
    and :func:`probe_summary` (``probe_summary.json``). For checking a platform's trace naming."""
    import shutil
    import sys

    import jax

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import alpa_pass as ap
    from benchmarks import cases

    config = cases.SUITES["gpt"].SIZES["small"]
    loss_fn, optimizer, state, batch = cases.model_inputs("gpt", config, abstract=False)
    step = cases.auto_step(cases.train_step_for(loss_fn, optimizer), ap.LogicalMesh(shape=(1, len(jax.devices()))))
    hlo = step.get_executable(state, batch).hlo_text()
    state, loss = step(state, batch)
    jax.block_until_ready((state, loss))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "probe.hlo.txt"), "w") as f:
        f.write(hlo)
    with tempfile.TemporaryDirectory(prefix="alpa_pass_trace_") as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(steps):
                state, loss = step(state, batch)
                jax.block_until_ready((state, loss))
        files = sorted(glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True))
        shutil.copy(files[-1], os.path.join(out_dir, "probe_trace.json.gz"))
        events = read_trace_events(d)
    summary = {"platform": jax.devices()[0].platform, "device_kind": jax.devices()[0].device_kind,
               "devices": len(jax.devices()), "jax": jax.__version__, "steps": steps,
               **probe_summary(events, hlo)}
    with open(os.path.join(out_dir, "probe_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":  # python benchmarks/step_trace.py --probe OUTDIR
    import argparse

    p = argparse.ArgumentParser(description="Check how this platform's profiler trace names a step's work: "
                                            "trace the small GPT's auto plan and write HLO, trace and summary")
    p.add_argument("--probe", required=True, metavar="OUTDIR")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    s = probe(args.probe, args.steps)
    for lane, v in sorted(s["lanes"].items(), key=lambda kv: -kv[1]["dur_us"]):
        print(f"{lane}: {v['events']} events, {v['dur_us'] / 1e3:.2f} ms, name=instruction "
              f"{v['name_is_instruction']}, args {v['arg_is_instruction']}")
    print("arg keys:", s["arg_keys"])
