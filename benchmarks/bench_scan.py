"""Planning and XLA compile time of a GPT whose blocks are one scanned layer stack vs its unrolled twin.

For each layer count, the ``zoo.gpt_scan`` GPT (``lax.scan`` over stacked params, or flax
``nn.scan`` with ``--flax``) and its unrolled twin are traced with ``jax.ShapeDtypeStruct``s
(nothing is allocated or run), planned on a logical mesh of fake CPU devices (8x8 by default) and
compiled for it. Prints one line per case and writes all of them as JSON to ``--out``
(``bench_scan.json``; the folder is created; default a new temporary folder). Not a test.

    python benchmarks/bench_scan.py                                  # 24/48/96 layers, hidden 1024, 8x8
    python benchmarks/bench_scan.py --layers 24 --no-compile --out /tmp/scan
    python benchmarks/bench_scan.py --flax --remat --variants scan

A scanned stack is one loop body: its ILP and its planning time should not grow with the layer
count (only the trip count, a cost factor, does); the unrolled twin's grow with it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # zoo, benchmarks.*
from benchmarks.devices import simulate_cpu_devices  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", default="24,48,96", help="comma-separated layer counts")
    p.add_argument("--variants", default="scan,unrolled",
                   help="comma-separated: scan, scan_unpeeled (AutoShardingOption.peel_layer_scans=False), unrolled")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mesh", default="8x8", help="logical mesh shape; as many fake CPU devices are made")
    p.add_argument("--flax", action="store_true", help="flax linen nn.scan instead of lax.scan")
    p.add_argument("--remat", action="store_true", help="rematerialise each block (nn.remat / jax.checkpoint)")
    p.add_argument("--no-compile", action="store_true", help="plan only: skip emission and XLA compile")
    p.add_argument("--time-limit", type=float, default=600.0, help="solver time limit (s)")
    p.add_argument("--out", default=None, help="output folder (created; default: a new temporary folder)")
    return p.parse_args(argv)


PLAN_PHASES = ("trace", "extract", "build", "solve", "refine")


def run_case(config, mesh_shape, args, peel: bool = True) -> dict:
    """Plan (and unless --no-compile, emit + compile) one model; its timings and ILP size."""
    import jax

    import alpa_pass as ap
    from zoo import default_optimizer, gpt_scan, init_state

    opt = default_optimizer()
    state = jax.eval_shape(lambda: init_state(gpt_scan.init(jax.random.key(0), config), opt))
    batch = jax.eval_shape(lambda: gpt_scan.make_batch(jax.random.key(1), config))
    option = ap.AutoShardingOption(solver_time_limit_s=args.time_limit, peel_layer_scans=peel)
    f = ap.parallelize(gpt_scan.make_train_step(opt, config),
                       method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=mesh_shape), option=option))
    t = time.perf_counter()
    plan = f.plan(state, batch) if args.no_compile else f.get_executable(state, batch).plan
    wall = time.perf_counter() - t
    timings = {k: round(v, 3) for k, v in plan.timings.items()}
    return {"variant": ("scan" if peel else "scan_unpeeled") if config.scan else "unrolled", "layers": config.layers,
            "planning_s": round(sum(plan.timings.get(k, 0.0) for k in PLAN_PHASES), 3),
            "compile_s": timings.get("compile"), "wall_s": round(wall, 3), "timings": timings,
            "objective": plan.objective, "solver_status": plan.solver_status, "ilp": plan.ilp_size,
            "fallbacks": plan.fallbacks}


def main(argv=None) -> int:
    args = parse_args(argv)
    mesh_shape = tuple(int(s) for s in args.mesh.split("x"))
    simulate_cpu_devices(math.prod(mesh_shape))
    from zoo import gpt_scan

    out_dir = args.out or tempfile.mkdtemp(prefix="bench_scan-")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "bench_scan.json")
    result = {"mesh": list(mesh_shape), "hidden": args.hidden, "heads": args.heads, "seq": args.seq,
              "vocab": args.vocab, "batch": args.batch, "flax": args.flax, "remat": args.remat,
              "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "cases": []}
    print(f"{'variant':13s} {'layers':>6s} {'plan s':>8s} {'compile s':>9s} {'ILP cols':>9s} {'objective':>12s}")
    for layers in (int(n) for n in args.layers.split(",")):
        for variant in args.variants.split(","):
            config = gpt_scan.Config(layers=layers, hidden=args.hidden, heads=args.heads, seq=args.seq,
                                     vocab=args.vocab, batch=args.batch, flax=args.flax, remat=args.remat,
                                     scan=variant != "unrolled")
            case = run_case(config, mesh_shape, args, peel=variant != "scan_unpeeled")
            result["cases"].append(case)
            compile_s = "-" if case["compile_s"] is None else f"{case['compile_s']:.1f}"
            print(f"{variant:13s} {layers:6d} {case['planning_s']:8.1f} {compile_s:>9s} "
                  f"{case['ilp']['columns']:9d} {case['objective']:12.5g}", flush=True)
            with open(path, "w") as fh:  # after every case: a killed run keeps what it measured
                json.dump(result, fh, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
