"""Where a step's time goes, measured: a ``jax.profiler`` trace of a few steps, each device's
thunk time split into collectives, by kind, and the rest ("compute"), per device per step. CPU
devices only: XLA:CPU names each thunk's trace event after its instruction; how a GPU trace names
its kernels was not checked, so other platforms are refused rather than summed wrongly.

The planner predicts a plan's compute and communication separately (``plan.predicted``); the
suite's step times only say whether their sum ranks the plans right. This says which part is
wrong. An event of the trace counts when its name is an instruction of the compiled module
(``all-reduce.32``, ``fusion.7``); a collective's time is the time its thunk ran on that device,
waiting for the other participants included: a collective issued after uneven work absorbs the
straggler's lead.

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
    if platform != "cpu":  # (see the module doc)
        raise NotImplementedError(f"step_breakdown reads XLA:CPU thunk events; {platform} traces are not "
                                  f"supported yet")
    for _ in range(warmup):
        state, loss = step(state, batch)
        jax.block_until_ready((state, loss))
    with tempfile.TemporaryDirectory(prefix="alpa_pass_trace_") as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for _ in range(steps):
                state, loss = step(state, batch)
                jax.block_until_ready((state, loss))
        events = read_trace_events(d)
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
    step = ap.parallelize(cases.train_step_for(loss_fn, optimizer),
                          method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, len(jax.devices())))),
                          donate_argnums=(0,))
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
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "--probe":
        sys.exit("usage: python benchmarks/step_trace.py --probe OUTDIR")
    s = probe(sys.argv[2])
    for lane, v in sorted(s["lanes"].items(), key=lambda kv: -kv[1]["dur_us"]):
        print(f"{lane}: {v['events']} events, {v['dur_us'] / 1e3:.2f} ms, name=instruction "
              f"{v['name_is_instruction']}, args {v['arg_is_instruction']}")
    print("arg keys:", s["arg_keys"])
