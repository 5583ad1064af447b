"""Budgeted planning speed: a LLaMA-3-8B-shaped train step planned without a memory budget and
with per-device budgets (issue #15: a default budget makes every GPU plan a budgeted one).

The model is ``zoo.gpt`` at LLaMA-3-8B's shape (32 layers, hidden 4096, 32 heads, vocab 128256,
untied LM head; the MLP is GPT's 4x = 16384 rather than SwiGLU's 3 x 14336), traced with
``jax.ShapeDtypeStruct``s (no memory), seq 2048, batch 16, on 8x8 fake CPU devices. Each case is
planned in this process (trace + extract once per case: make_plan) and reports the phases'
seconds, the ILP size (memory rows included), the objective, the predicted peak and whether an
infeasible budget ended in ``InfeasibleError`` (its message and named budgets). Not a test.

    python benchmarks/bench_budget.py --out benchmarks/results/budget
    python benchmarks/bench_budget.py --budgets none,80 --seq 8192     # the infeasible case of #15
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
from benchmarks.devices import copy_rounds_only, no_frontier, planner_log, simulate_cpu_devices  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budgets", default="none,80,40", help="GiB per device, comma-separated; 'none' = unbudgeted")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mesh", default="8x8")
    p.add_argument("--time-limit", type=float, default=600.0, help="solver time limit (s)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "budget"))
    p.add_argument("--log", action="store_true", help="print the planner's INFO log (row rounds, bounds)")
    p.add_argument("--copy-rounds-only", action="store_true",
                   help="fit budgeted plans with the reshard-copy rounds only (no exact-copy plan first)")
    p.add_argument("--no-frontier", action="store_true",
                   help="first budgeted plans from the LP with memory rows only (no frontier plan)")
    return p.parse_args(argv)


def run_case(config, mesh_shape, budget_gib, time_limit) -> dict:
    import jax

    import alpa_pass as ap
    from alpa_pass.driver.jit import make_plan
    from alpa_pass.errors import InfeasibleError
    from benchmarks.bench_planning import abstract_inputs
    from zoo import default_optimizer, gpt

    optimizer = default_optimizer()
    state, batch = abstract_inputs(config, optimizer)
    budget = None if budget_gib is None else int(budget_gib * 2**30)
    option = ap.AutoShardingOption(memory_budget_per_device=budget, solver_time_limit_s=time_limit)
    t = time.perf_counter()
    out = {"budget_gib": budget_gib}
    try:
        plan, _, _ = make_plan(gpt.make_train_step(optimizer, config), (state, batch),
                               ap.LogicalMesh(shape=mesh_shape), option, donate_argnums=(0,))
    except InfeasibleError as e:
        out.update(wall_s=time.perf_counter() - t, infeasible=str(e),
                   smallest_feasible_gib=getattr(e, "smallest_feasible_bytes", 0) / 2**30,
                   lower_bound_gib=(getattr(e, "lower_bound_bytes", None) or 0) / 2**30)
        return out
    out.update(wall_s=time.perf_counter() - t, timings_s=dict(plan.timings), ilp_size=dict(plan.ilp_size),
               objective=plan.objective, solver_status=plan.solver_status, mip_gap=plan.mip_gap,
               predicted_peak_gib=plan.predicted_peak_bytes / 2**30,
               refinement={k: v for k, v in plan.refinement.items() if not isinstance(v, (list, dict))},
               params=sum(math.prod(x.shape) for x in jax.tree.leaves(state[0])))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    mesh_shape = tuple(int(s) for s in args.mesh.split("x"))
    simulate_cpu_devices(math.prod(mesh_shape), memory_scheduler=True)
    if args.log:
        planner_log()
    if args.copy_rounds_only:
        copy_rounds_only()
    if args.no_frontier:
        no_frontier()
    import jax

    from zoo import gpt

    config = gpt.Config(vocab=args.vocab, seq=args.seq, hidden=args.hidden, heads=args.heads,
                        layers=args.layers, batch=args.batch, tied=False)
    cases = []
    for b in args.budgets.split(","):
        gib = None if b.strip() == "none" else float(b)
        r = run_case(config, mesh_shape, gib, args.time_limit)
        cases.append(r)
        what = "unbudgeted" if gib is None else f"budget {gib:g} GiB"
        if "infeasible" in r:
            print(f"{what}: InfeasibleError after {r['wall_s']:.1f}s: {r['infeasible']}", flush=True)
        else:
            phases = ", ".join(f"{k} {v:.2f}s" for k, v in r["timings_s"].items())
            print(f"{what}: {r['wall_s']:.1f}s ({phases}); {r['ilp_size']['columns']} columns, "
                  f"{r['ilp_size']['rows']} rows ({r['ilp_size']['memory_rows']} memory); objective "
                  f"{r['objective']:.6g} [{r['solver_status']}]; predicted peak {r['predicted_peak_gib']:.2f} GiB",
                  flush=True)
    base = next((c["wall_s"] for c in cases if c["budget_gib"] is None), None)
    if base:
        for c in cases:
            c["x_unbudgeted"] = c["wall_s"] / base
        print("wall / unbudgeted: " + ", ".join(f"{c['budget_gib'] or 'none'}: {c['x_unbudgeted']:.2f}x"
                                                 for c in cases))
    result = {"model": {"name": "gpt (LLaMA-3-8B-shaped)", **{k: getattr(config, k) for k in
                        ("layers", "hidden", "heads", "seq", "vocab", "batch", "tied", "mlp_ratio")}},
              "mesh": list(mesh_shape), "cases": cases, "jax": jax.__version__, "cpus": os.cpu_count(),
              "load_avg": os.getloadavg()}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"budget_gpt_seq{args.seq}_{args.mesh}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print("wrote " + path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
