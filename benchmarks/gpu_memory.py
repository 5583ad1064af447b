"""Memory by default on the devices at hand (issue #15): the budget a plan gets when none is given,
the planner's predicted peak against XLA's compiled figures and the allocator's measured peak, and
the error a model too large for the devices ends in. Not a test: run it on a GPU host (the device
check, ``scripts/gpu_check.sh``); on CPU there is no device budget, so ``--budget-gib`` stands in.

Case "fits": a GPT train step (``--size``, batch ``--batch``) with real arrays on the local devices,
planned with the default ``AutoShardingOption()`` (GPU: ``device_memory_fraction`` x
``memory_stats()["bytes_limit"]``), compiled, run ``--steps`` steps; reported: the plan's budget
line, predicted peak per device, the compiled module's argument/output/temp bytes
(``memory_analysis``), and ``memory_stats()["peak_bytes_in_use"]`` after the steps (GPU; the
process's whole peak: state, batch and the step). Run it in a fresh process so that peak is this
case's alone.

Case "too big": the same step at ``--big-size`` traced with ShapeDtypeStructs (nothing allocated)
and planned under the same default budget: a model whose state alone exceeds the devices' memory
must end in ``InfeasibleError`` naming the smallest feasible budget and the levers.

    python benchmarks/gpu_memory.py --out OUTDIR                       # GPU host
    python benchmarks/gpu_memory.py --size small --budget-gib 0.5 --big-size 1.3B --out /tmp/m
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # zoo, benchmarks.*


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1.3B", help="GPT size (benchmarks/models/gpt_sizes.py) that should fit")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--big-size", default="39B", help="GPT size whose state exceeds the devices' memory")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--budget-gib", type=float, default=None,
                   help="plan under this budget instead of the device default (CPU has none)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    return p.parse_args(argv)


def _gpt_step(config, abstract: bool, budget_gib):
    """(the auto-planned GPT train step on all local devices as 1xN, state, batch, parameter count)
    under the default option or ``budget_gib``; ShapeDtypeStructs when ``abstract``."""
    import jax

    import alpa_pass as ap
    from benchmarks import cases

    loss_fn, optimizer, state, data = cases.model_inputs("gpt", config, abstract=abstract)
    option = ap.AutoShardingOption(memory_budget_per_device=None if budget_gib is None else int(budget_gib * 2**30))
    step = cases.auto_step(cases.train_step_for(loss_fn, optimizer), ap.LogicalMesh(shape=(1, len(jax.devices()))),
                           option)
    return step, state, data, sum(math.prod(x.shape) for x in jax.tree.leaves(state[0]))


def fits_case(size: str, batch: int, steps: int, budget_gib) -> dict:
    import dataclasses

    import jax

    from alpa_pass.plan.plan import budget_line
    from benchmarks import measure
    from benchmarks.models import gpt_sizes

    step, state, data, params = _gpt_step(dataclasses.replace(gpt_sizes.SIZES[size], batch=batch), False, budget_gib)
    t = time.perf_counter()
    exe = step.get_executable(state, data)
    out = {"size": size, "batch": batch, "params": params,
           "plan_and_compile_s": time.perf_counter() - t, "memory_budget": dict(exe.plan.memory_budget),
           "budget_line": budget_line(exe.plan.memory_budget),
           "predicted_peak_bytes": exe.plan.predicted_peak_bytes,
           "compiled": measure.memory_stats(exe.memory_analysis())}
    losses = []
    for _ in range(steps):
        state, loss = step(state, data)
        losses.append(float(loss))
    out["losses"] = losses
    stats = jax.devices()[0].memory_stats() or {}
    out["measured"] = {k: stats.get(k) for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")}
    if stats.get("peak_bytes_in_use"):
        out["measured_over_predicted"] = stats["peak_bytes_in_use"] / out["predicted_peak_bytes"]
    return out


def too_big_case(size: str, budget_gib) -> dict:
    from alpa_pass.errors import InfeasibleError
    from benchmarks.models import gpt_sizes

    step, state, data, params = _gpt_step(gpt_sizes.SIZES[size], True, budget_gib)
    out = {"size": size, "params": params}
    t = time.perf_counter()
    try:
        plan = step.get_executable(state, data).plan  # (compiled too when it fits)
    except InfeasibleError as e:
        out.update(wall_s=time.perf_counter() - t, error="InfeasibleError", message=str(e),
                   smallest_feasible_bytes=e.smallest_feasible_bytes, lower_bound_bytes=e.lower_bound_bytes)
        return out
    except Exception as e:  # what the user would see instead: recorded, not hidden
        out.update(wall_s=time.perf_counter() - t, error=type(e).__name__, message=str(e)[:2000])
        return out
    out.update(wall_s=time.perf_counter() - t, error=None, memory_budget=dict(plan.memory_budget),
               predicted_peak_bytes=plan.predicted_peak_bytes)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    devices = jax.devices()
    result = {"jax": jax.__version__, "devices": f"{len(devices)} x {devices[0].device_kind}",
              "platform": devices[0].platform, "budget_gib_given": args.budget_gib}
    result["fits"] = fits_case(args.size, args.batch, args.steps, args.budget_gib)
    f = result["fits"]
    print(f"fits: GPT {args.size} ({f['params'] / 1e9:.2f}B params, batch {args.batch}): {f['budget_line']}")
    print(f"  predicted peak {f['predicted_peak_bytes'] / 2**30:.2f} GiB; compiled {f['compiled']}; "
          f"measured {f['measured']}; losses {f['losses']}", flush=True)
    result["too_big"] = too_big_case(args.big_size, args.budget_gib)
    b = result["too_big"]
    print(f"too big: GPT {args.big_size} ({b['params'] / 1e9:.1f}B params): {b['error']} after "
          f"{b['wall_s']:.1f}s: {b.get('message', '')[:600]}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"gpu_memory_{devices[0].platform}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    print("wrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
