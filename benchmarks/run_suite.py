"""Benchmark suites: alpa_pass's auto plan against hand-written jax.sharding baselines.

One command per suite; the default size runs on 8 simulated CPU devices (a 2x4 mesh), planned,
compiled and timed. Named sizes (Alpa's) are planned and compiled for 64 simulated devices (8x8)
without running: they take minutes each. Writes one JSON per case to benchmarks/results/ (and
``--report-dir`` copies it where ``benchmarks/report.py`` reads it).

    python benchmarks/run_suite.py gpt                    # small GPT, 2x4, runs and times
    python benchmarks/run_suite.py moe --size 380M        # planned + compiled on 8x8, not run
    python benchmarks/run_suite.py wresnet --size 250M --mesh 8x8
    python benchmarks/run_suite.py gpt --gpu              # all local GPUs; "skipped: no GPU" otherwise
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite", choices=("gpt", "moe", "wresnet"))
    p.add_argument("--size", default="small", help="'small' (default) or one of Alpa's sizes, e.g. 350M")
    p.add_argument("--mesh", default=None, help="logical mesh, e.g. 2x4 (default: 2x4 small, 8x8 large)")
    p.add_argument("--beta", default=None, help="per-axis beta, e.g. 1,0.1 (default 1 per axis)")
    p.add_argument("--batch", type=int, default=None, help="override the preset's batch size")
    p.add_argument("--methods", default=None, help="comma-separated baselines (default: all of the suite)")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per method (median reported)")
    p.add_argument("--no-run", action="store_true", help="plan and compile only (default for large sizes)")
    p.add_argument("--no-unmerged", action="store_true",
                   help="skip the unmerged-ILP evaluation of baselines follower merging cannot express")
    p.add_argument("--time-limit", type=float, default=60.0, help="solver time limit (s)")
    p.add_argument("--gpu", action="store_true", help="run on the local GPUs (throughput, TFLOP/s, MFU)")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--report-dir", default=None, help="also copy the JSON to DIR/data/ for report.py")
    return p.parse_args(argv)


def _setup(args) -> tuple[int, ...]:
    """Mesh shape; simulate its devices on CPU (must run before jax is imported) unless --gpu."""
    large = args.size != "small"
    shape = tuple(int(s) for s in (args.mesh or ("8x8" if large else "2x4")).split("x"))
    if not args.gpu:
        flag = f"--xla_force_host_platform_device_count={math.prod(shape)}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
        os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, os.path.dirname(HERE))  # benchmarks.*, tests.models
    return shape


def main(argv=None) -> int:
    args = parse_args(argv)
    shape = _setup(args)
    import dataclasses

    import jax

    import alpa_pass as ap
    from benchmarks import cases, gpu, summary

    if args.gpu:
        if jax.devices()[0].platform != "gpu":
            print("skipped: no GPU")
            return 0
        shape = (1, len(jax.devices())) if args.mesh is None else shape
    module = cases.SUITES[args.suite]
    if args.size not in module.SIZES:
        print(f"unknown size {args.size!r} for {args.suite}; choose from {', '.join(module.SIZES)}", file=sys.stderr)
        return 2
    if args.batch:
        module.SIZES[args.size] = dataclasses.replace(module.SIZES[args.size], batch=args.batch)
    beta = tuple(float(b) for b in args.beta.split(",")) if args.beta else None
    mesh = ap.LogicalMesh(shape=shape, beta=beta)
    run = not args.no_run and (args.size == "small" or args.gpu)
    result = cases.run_case(args.suite, args.size, mesh, ap.AutoShardingOption(solver_time_limit_s=args.time_limit),
                            methods=args.methods.split(",") if args.methods else None, run=run,
                            repeats=args.repeats, unmerged=not args.no_unmerged and args.size == "small")
    if args.gpu:
        result["gpu"] = gpu.throughput(result, args.suite)
    print(summary.text(result))
    _write(result, args)
    return 0


def _write(result: dict, args) -> None:
    name = (f"suite_{result['suite']}_{result['size']}_{'x'.join(map(str, result['mesh']['shape']))}"
            f"{'_gpu' if args.gpu else ''}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{name}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    text = json.dumps(result, indent=1)
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path}")
    if args.report_dir:
        os.makedirs(os.path.join(args.report_dir, "data"), exist_ok=True)
        with open(os.path.join(args.report_dir, "data", f"{name}.json"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    sys.exit(main())
