"""Planning speed: a GPT traced with jax.ShapeDtypeStruct (no parameter memory) on a logical mesh.

Prints the time of each phase (trace, extract, build, solve, emit, compile), the ILP size and the
objective, and writes them as JSON to benchmarks/results/. Not a test: never collected by pytest.

    python benchmarks/bench_planning.py                      # 24 layers x hidden 2048 on 2x4
    python benchmarks/bench_planning.py --layers 4 --hidden 512 --no-compile
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=51200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mesh", default="2x4", help="logical mesh shape, e.g. 2x4 or 8x8")
    p.add_argument("--beta", default=None, help="per-axis beta, e.g. 1,0.1 (default 1 per axis)")
    p.add_argument("--untied", action="store_true", help="separate LM head instead of tied embeddings")
    p.add_argument("--no-compile", action="store_true", help="plan only: skip emit + XLA compile")
    p.add_argument("--time-limit", type=float, default=600.0, help="solver time limit (s)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    return p.parse_args(argv)


def _setup_devices(mesh_shape) -> None:
    """Simulate prod(mesh_shape) CPU devices; must run before jax is imported."""
    flag = f"--xla_force_host_platform_device_count={math.prod(mesh_shape)}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.models


def abstract_inputs(config, optimizer):
    """(state, batch) as jax.ShapeDtypeStructs: nothing is allocated."""
    import jax

    from tests.models import gpt, init_state

    state = jax.eval_shape(lambda: init_state(gpt.init(jax.random.key(0), config), optimizer))
    batch = jax.eval_shape(lambda: gpt.make_batch(jax.random.key(1), config))
    return state, batch


def run(args) -> dict:
    mesh_shape = tuple(int(s) for s in args.mesh.split("x"))
    _setup_devices(mesh_shape)
    import jax

    import alpa_pass as ap
    from tests.models import default_optimizer, gpt

    config = gpt.Config(vocab=args.vocab, seq=args.seq, hidden=args.hidden, heads=args.heads,
                        layers=args.layers, batch=args.batch, tied=not args.untied)
    optimizer = default_optimizer()
    state, batch = abstract_inputs(config, optimizer)
    beta = tuple(float(b) for b in args.beta.split(",")) if args.beta else None
    mesh = ap.LogicalMesh(shape=mesh_shape, beta=beta)
    option = ap.AutoShardingOption(solver_time_limit_s=args.time_limit)
    step = ap.parallelize(gpt.make_train_step(optimizer, config),
                          method=ap.ShardParallel(mesh=mesh, option=option), donate_argnums=(0,))
    t = time.perf_counter()
    plan = step.plan(state, batch) if args.no_compile else step.get_executable(state, batch).plan
    wall = time.perf_counter() - t
    num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(state[0]))
    return {
        "model": {"name": "gpt", "params": num_params, **{k: getattr(config, k) for k in
                  ("layers", "hidden", "heads", "seq", "vocab", "batch", "tied")}},
        "mesh": {"shape": list(mesh.shape), "alpha": list(mesh.alpha), "beta": list(mesh.beta)},
        "compiled": not args.no_compile,
        "timings_s": dict(plan.timings),
        "wall_s": wall,
        "ilp_size": dict(plan.ilp_size),
        "objective": plan.objective,
        "predicted": dict(plan.predicted),
        "solver_status": plan.solver_status,
        "mip_gap": plan.mip_gap,
        "fallbacks": dict(plan.fallbacks),
        "jax": jax.__version__,
        "cpus": os.cpu_count(),
    }


def print_report(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    m = result["model"]
    console = Console(width=100)
    console.print(f"GPT {m['layers']} layers x hidden {m['hidden']} ({m['params'] / 1e6:.1f}M params), "
                  f"mesh {'x'.join(map(str, result['mesh']['shape']))}")
    table = Table()
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    for phase, seconds in result["timings_s"].items():
        table.add_row(phase, f"{seconds:.3f}")
    table.add_row("[bold]wall[/bold]", f"[bold]{result['wall_s']:.3f}[/bold]")
    console.print(table)
    size = result["ilp_size"]
    console.print("ILP: " + ", ".join(f"{k} {v}" for k, v in size.items()))
    console.print(f"objective {result['objective']:.6g} ({result['solver_status']}, gap {result['mip_gap']:.2g}); "
                  + ", ".join(f"{k} {v:.4g}" for k, v in result["predicted"].items()))


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_report(result)
    os.makedirs(args.out, exist_ok=True)
    m = result["model"]
    name = f"planning_gpt_L{m['layers']}_H{m['hidden']}_{args.mesh}_{time.strftime('%Y%m%d-%H%M%S')}.json"
    path = os.path.join(args.out, name)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
