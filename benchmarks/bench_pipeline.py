"""Pipeline benchmark (never gates CI): pipelined GPT vs ShardParallel step time on 8 CPU devices,
and the stage-submesh DP's run time for 48 layers x 64 devices (target: under 5 s).

    python benchmarks/bench_pipeline.py [--layers 4] [--hidden 64] [--micro 4] [--steps 5]
Prints a table and saves benchmarks/results/pipeline_*.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import alpa_pass as ap  # noqa: E402
from alpa_pass import _core  # noqa: E402
from zoo import default_optimizer, gpt, init_state  # noqa: E402
from zoo.pipeline import make_gpt_loss, make_step  # noqa: E402


def time_steps(step, state, batch, steps):
    state, loss = step(state, batch)  # plan, compile, warm up
    jax.block_until_ready((state, loss))
    t = time.perf_counter()
    for _ in range(steps):
        state, loss = step(state, batch)
    jax.block_until_ready((state, loss))
    return (time.perf_counter() - t) / steps


def bench_gpt(args):
    config = gpt.Config(layers=args.layers, hidden=args.hidden, heads=4, batch=args.batch, seq=args.seq)
    optimizer = default_optimizer()
    state = init_state(gpt.init(jax.random.key(0), config), optimizer)
    batch = gpt.make_batch(jax.random.key(1), config)
    mesh = ap.LogicalMesh(shape=(2, 4))
    out = {}
    shard = ap.parallelize(make_step(make_gpt_loss(config, boundaries=False), optimizer),
                           method=ap.ShardParallel(mesh=mesh))
    out["shard_parallel_s"] = time_steps(shard, state, batch, args.steps)
    for stages in (2, 4):
        method = ap.PipeshardParallel(mesh=mesh, num_micro_batches=args.micro,
                                      stage_option=ap.UniformStageOption(num_stages=stages))
        pipe = ap.parallelize(make_step(make_gpt_loss(config), optimizer), method=method)
        out[f"pipeshard_{stages}stages_s"] = time_steps(pipe, state, batch, args.steps)
    return out


def bench_stage_dp(layers=48, rows=8, cols=8, micro=16, seed=0):
    """A synthetic cost table: a stage's latency = its FLOPs / devices + a communication term."""
    rng = np.random.default_rng(seed)
    flops = rng.uniform(1.0, 2.0, layers)
    sizes = [c for c in range(1, cols + 1) if cols % c == 0] + [r * cols for r in range(2, rows + 1)]
    cost = np.full((layers, layers, len(sizes)), np.inf)
    prefix = np.concatenate([[0.0], np.cumsum(flops)])
    for i in range(layers):
        for j in range(i, layers):
            for k, n in enumerate(sizes):
                cost[i, j, k] = (prefix[j + 1] - prefix[i]) / n + 0.05 * np.log2(n) * (j - i + 1)
    t = time.perf_counter()
    objective, max_lat, stages = _core.stage_dp(cost, np.array(sizes, np.int64), rows * cols, micro)
    return {"stage_dp_s": time.perf_counter() - t, "layers": layers, "devices": rows * cols,
            "submesh_choices": len(sizes), "objective": objective, "num_stages": len(stages)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--skip-gpt", action="store_true", help="only the stage DP (seconds)")
    parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results"),
                        help="folder of the JSON (created; default benchmarks/results)")
    args = parser.parse_args()
    result = {"config": vars(args), "stage_dp": bench_stage_dp()}
    if not args.skip_gpt:
        result["gpt_step_time"] = bench_gpt(args)
    print(json.dumps(result, indent=2))
    results = pathlib.Path(args.out)
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"pipeline_L{args.layers}_H{args.hidden}_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
