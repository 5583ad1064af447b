"""Planning speed: a GPT traced with jax.ShapeDtypeStruct (no parameter memory) on a logical mesh.

Prints the time of each phase (trace, extract, build, solve, emit, compile), the ILP size, the
objective and what repeated-layer tying did, and writes them as JSON to benchmarks/results/.
Not a test: never collected by pytest.

    python benchmarks/bench_planning.py                      # 24 layers x hidden 2048 on 2x4
    python benchmarks/bench_planning.py --layers 4 --hidden 512 --no-compile
    python benchmarks/bench_planning.py --no-tie-layers      # one ILP group per layer copy
    python benchmarks/bench_planning.py --suite alpa         # Alpa's GPT cases, plan only
    python benchmarks/bench_planning.py --suite alpa --compile   # + compile 39B for 64 CPU devices
    python benchmarks/bench_planning.py --suite alpa --budget 80 # each case under 80 GiB per device
    python benchmarks/bench_planning.py --suite small        # small programs: target <= 2 s each

The ``small`` suite (issue 14: small programs plan fast) plans the 3-layer test MLP and the 2-layer
test GPT (zoo/) on 2x4 and 2x2x2 with the default options and prints, per case, the planning time
(trace to plan) and the deterministic work: ILP columns and rows (built, and solved: after the exact
reduction of solve.eliminate), B&B nodes and simplex iterations of the main solve and of the
unmerged refinement. Timings on a loaded machine are not comparable; the
counts are.

The ``alpa`` suite (Alpa's GPT sizes, seq 1024, vocab 51200, batch 64; benchmarks/models/gpt_sizes):
1.3B on 1x4 and 2x4, 6.7B on 2x8, 39B on 8x8. ``--compile`` then compiles the 39B plan in a
subprocess with 64 fake CPU devices and reports XLA's ``memory_analysis()`` per device.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # zoo, benchmarks.*
from benchmarks.devices import copy_rounds_only, no_frontier, planner_log, simulate_cpu_devices  # noqa: E402
ALPA_SUITE = (("1.3B", "1x4"), ("1.3B", "2x4"), ("6.7B", "2x8"), ("39B", "8x8"))
SMALL_SUITE = (("mlp3", "2x4"), ("mlp3", "2x2x2"), ("gpt2", "2x4"), ("gpt2", "2x2x2"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=("alpa", "small"), default=None, help="run a fixed set of cases")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=51200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mesh", default="2x4", help="logical mesh shape, e.g. 2x4 or 8x8")
    p.add_argument("--beta", default=None, help="per-axis beta, e.g. 1,0.1 (default 1 per axis)")
    p.add_argument("--untied", action="store_true", help="separate LM head instead of tied embeddings")
    p.add_argument("--no-tie-layers", action="store_true",
                   help="AutoShardingOption(tie_repeated_layers=False): solve every layer copy")
    p.add_argument("--no-compile", action="store_true", help="plan only: skip emit + XLA compile")
    p.add_argument("--compile", action="store_true",
                   help="with --suite: also compile the largest case for its fake CPU devices")
    p.add_argument("--compile-timeout", type=float, default=3600.0, help="seconds for --compile")
    p.add_argument("--time-limit", type=float, default=None,
                   help="opt-in solver wall-clock limit (s); default none: solves are bounded by nodes")
    p.add_argument("--budget", type=float, default=None,
                   help="memory_budget_per_device in GiB (default: none); e.g. 80 for an 80 GiB GPU")
    p.add_argument("--json", default=None, help="write the result to this file (single case)")
    p.add_argument("--log", action="store_true", help="print the planner's INFO log (row rounds, bounds)")
    p.add_argument("--copy-rounds-only", action="store_true",
                   help="fit budgeted plans with the reshard-copy rounds only (no exact-copy plan first)")
    p.add_argument("--no-frontier", action="store_true",
                   help="first budgeted plans from the LP with memory rows only (no frontier plan)")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    return p.parse_args(argv)


def _mesh_shape(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split("x"))


def abstract_inputs(config, optimizer):
    """(state, batch) as jax.ShapeDtypeStructs: nothing is allocated."""
    import jax

    from zoo import gpt, init_state

    state = jax.eval_shape(lambda: init_state(gpt.init(jax.random.key(0), config), optimizer))
    batch = jax.eval_shape(lambda: gpt.make_batch(jax.random.key(1), config))
    return state, batch


def tie_stats(graph, mesh, option) -> dict:
    """What repeated-layer tying does to this graph: the core's repeat_stats (groups before and
    after tying, regions, copies, classes), from one extra build of the problem."""
    from alpa_pass import _core
    from alpa_pass.driver.planning import core_graph

    t = time.perf_counter()
    problem = _core.build_sharding_problem(core_graph(graph), option.core_mesh(mesh), option.to_core(), [],
                                           list(graph.donated_args))
    stats = dict(problem.repeat_stats)
    stats["build_s"] = time.perf_counter() - t
    return stats


def run_case(config, mesh_shape, beta=None, tie=True, compile_=False, time_limit=None, budget_gib=None) -> dict:
    """Plan (and with compile_ emit + compile) one GPT train step; the result as a JSON-ready dict."""
    import jax

    import alpa_pass as ap
    from alpa_pass.driver.jit import make_plan
    from zoo import default_optimizer, gpt

    optimizer = default_optimizer()
    state, batch = abstract_inputs(config, optimizer)
    mesh = ap.LogicalMesh(shape=mesh_shape, beta=beta)
    option = ap.AutoShardingOption(solver_time_limit_s=time_limit, tie_repeated_layers=tie,
                                   memory_budget_per_device=None if budget_gib is None else int(budget_gib * 2**30))
    train_step = gpt.make_train_step(optimizer, config)
    t = time.perf_counter()
    plan, graph, _ = make_plan(train_step, (state, batch), mesh, option, donate_argnums=(0,))
    result = {"timings_s": dict(plan.timings)}
    memory = None
    if compile_:
        step = ap.parallelize(train_step, method=ap.ShardParallel(mesh=mesh, option=option, plan=plan),
                              donate_argnums=(0,))
        exe = step.get_executable(state, batch)
        result["timings_s"].update({k: v for k, v in exe.plan.timings.items() if k in ("emit", "compile")})
        from benchmarks.measure import memory_stats

        memory = memory_stats(exe.memory_analysis())
    result["wall_s"] = time.perf_counter() - t
    num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(state[0]))
    return {
        "model": {"name": "gpt", "params": num_params, **{k: getattr(config, k) for k in
                  ("layers", "hidden", "heads", "seq", "vocab", "batch", "tied")}},
        "mesh": {"shape": list(mesh.shape), "alpha": list(mesh.alpha), "beta": list(mesh.beta)},
        "compiled": compile_,
        "budget_gib": budget_gib,
        "predicted_peak_gib": plan.predicted_peak_bytes / 2**30,
        **result,
        "ilp_size": dict(plan.ilp_size),
        "ties": tie_stats(graph, mesh, option) if tie else None,
        "objective": plan.objective,
        "predicted": dict(plan.predicted),
        "solver_status": plan.solver_status,
        "mip_gap": plan.mip_gap,
        "fallbacks": dict(plan.fallbacks),
        "memory_per_device": memory,
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
    if result.get("ties"):
        t = result["ties"]
        console.print(f"ties: {t['groups_before']} -> {t['groups_after']} groups; {t['regions']} repeated "
                      f"regions (up to {t['max_copies']} copies), {t['repeated_nodes']} repeated nodes, "
                      f"{t['classes_tied']} classes tied, {t['classes_skipped']} skipped")
    console.print(f"objective {result['objective']:.6g} ({result['solver_status']}, gap {result['mip_gap']:.2g}); "
                  + ", ".join(f"{k} {v:.4g}" for k, v in result["predicted"].items()))
    budget = result.get("budget_gib")
    console.print(f"predicted peak {result['predicted_peak_gib']:.4g} GiB per device"
                  + ("" if budget is None else f" (budget {budget:g} GiB)"))
    if result.get("memory_per_device"):
        console.print("XLA memory per device (MiB): " + ", ".join(
            f"{k} {v / 2**20:.1f}" for k, v in result["memory_per_device"].items()))


def _write(result, out_dir: str, name: str, path: str | None = None) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = path or os.path.join(out_dir, f"{name}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    return path


def run_single(args) -> int:
    mesh_shape = _mesh_shape(args.mesh)
    simulate_cpu_devices(math.prod(mesh_shape), memory_scheduler=True)
    if args.copy_rounds_only:
        copy_rounds_only()
    if args.no_frontier:
        no_frontier()
    from zoo import gpt

    config = gpt.Config(vocab=args.vocab, seq=args.seq, hidden=args.hidden, heads=args.heads,
                        layers=args.layers, batch=args.batch, tied=not args.untied)
    beta = tuple(float(b) for b in args.beta.split(",")) if args.beta else None
    result = run_case(config, mesh_shape, beta, tie=not args.no_tie_layers, compile_=not args.no_compile,
                      time_limit=args.time_limit, budget_gib=args.budget)
    print_report(result)
    m = result["model"]
    print("wrote " + _write(result, args.out, f"planning_gpt_L{m['layers']}_H{m['hidden']}_{args.mesh}",
                            args.json))
    return 0


def compile_in_subprocess(size: str, mesh: str, args) -> dict:
    """Plan + compile one suite case in a fresh process with prod(mesh) fake CPU devices."""
    from benchmarks.models.gpt_sizes import SIZES

    c = SIZES[size]
    path = os.path.join(args.out, f"compile_gpt_{size}_{mesh}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--layers", str(c.layers), "--hidden", str(c.hidden),
           "--heads", str(c.heads), "--seq", str(c.seq), "--vocab", str(c.vocab), "--batch", str(c.batch),
           "--mesh", mesh, "--json", path, "--out", args.out]
    if args.time_limit is not None:
        cmd += ["--time-limit", str(args.time_limit)]
    if args.budget is not None:
        cmd += ["--budget", str(args.budget)]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.compile_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.compile_timeout:.0f} s"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:],
                "wall_s": time.perf_counter() - t}
    with open(path) as f:
        return json.load(f)


def run_suite(args) -> int:
    simulate_cpu_devices(max(math.prod(_mesh_shape(mesh)) for _, mesh in ALPA_SUITE), memory_scheduler=True)
    from benchmarks.models.gpt_sizes import SIZES

    from alpa_pass.errors import InfeasibleError

    results = []
    for size, mesh in ALPA_SUITE:
        t = time.perf_counter()
        try:
            result = run_case(SIZES[size], _mesh_shape(mesh), tie=not args.no_tie_layers,
                              time_limit=args.time_limit, budget_gib=args.budget)
        except InfeasibleError as e:  # a budget no plan meets: the error (and its figures) is the result
            result = {"case": f"GPT-{size} on {mesh}", "budget_gib": args.budget, "wall_s": time.perf_counter() - t,
                      "infeasible": str(e), "smallest_feasible_gib": None if e.smallest_feasible_bytes is None
                      else e.smallest_feasible_bytes / 2**30}
            print(f"GPT-{size} on {mesh}: InfeasibleError after {result['wall_s']:.1f} s: {e}")
            results.append(result)
            continue
        result["case"] = f"GPT-{size} on {mesh}"
        print_report(result)
        results.append(result)
    suite = {"suite": "alpa", "cases": results}
    if args.compile:
        size, mesh = ALPA_SUITE[-1]
        print(f"compiling GPT-{size} on {mesh} ({math.prod(_mesh_shape(mesh))} fake CPU devices) ...", flush=True)
        suite["compile"] = {"case": f"GPT-{size} on {mesh}", **compile_in_subprocess(size, mesh, args)}
        if "error" in suite["compile"]:
            print(f"compile failed: {suite['compile']['error']}")
        else:
            print_report(suite["compile"])
    print("wrote " + _write(suite, args.out, "planning_suite_alpa"))
    return 0


def _counting_solves():
    """Patch ``solve_ilp`` where the planner calls it to record each solve's deterministic work
    (B&B nodes, simplex iterations) from HiGHS's log; returns the list the records go to."""
    import re

    from alpa_pass.driver import budget, refine
    from alpa_pass.solve import highs

    records = []

    def counted(problem, options=highs.SolveOptions(), start=None, **kwargs):
        import dataclasses

        solution = highs.solve_ilp(problem, dataclasses.replace(options, keep_log=True), start=start, **kwargs)
        nodes = re.search(r"^\s*Nodes\s+(\d+)", solution.log, re.M)
        iters = re.search(r"^\s*LP iterations\s+(\d+)", solution.log, re.M)
        records.append({"columns": int(problem.num_cols), "rows": int(problem.num_rows),
                        "solved_columns": solution.solved_size[0], "solved_rows": solution.solved_size[1],
                        "nodes": int(nodes.group(1)) if nodes else 0,
                        "lp_iterations": int(iters.group(1)) if iters else 0,
                        "status": solution.status, "solve_s": solution.solve_time_s})
        return solution

    budget.solve_ilp = refine.solve_ilp = counted
    return records


def run_small(args) -> int:
    """Plan each SMALL_SUITE case (default options, abstract inputs); print time and work."""
    simulate_cpu_devices(8, memory_scheduler=True)
    import jax

    import alpa_pass as ap
    from zoo import default_optimizer, gpt, init_state, mlp

    records = _counting_solves()
    results = []
    for name, mesh in SMALL_SUITE:
        model, config = (mlp, mlp.Config(num_layers=3)) if name == "mlp3" else (gpt, gpt.Config(layers=2))
        optimizer = default_optimizer()
        step = model.make_train_step(optimizer) if model is mlp else model.make_train_step(optimizer, config)
        state = jax.eval_shape(lambda: init_state(model.init(jax.random.key(0), config), optimizer))
        batch = jax.eval_shape(lambda: model.make_batch(jax.random.key(1), config))
        records.clear()
        method = ap.ShardParallel(mesh=ap.LogicalMesh(shape=_mesh_shape(mesh)), option=ap.AutoShardingOption())
        t = time.perf_counter()
        plan = ap.parallelize(step, method=method).plan(state, batch)
        wall = time.perf_counter() - t
        result = {"case": f"{name} on {mesh}", "plan_s": wall, "objective": plan.objective,
                  "timings_s": dict(plan.timings), "refinement": dict(plan.refinement), "solves": list(records)}
        results.append(result)
        work = "; ".join(f"{r['columns']} cols x {r['rows']} rows (solved {r['solved_columns']} x {r['solved_rows']}): "
                         f"{r['nodes']} nodes, {r['lp_iterations']} LP iterations [{r['status']}]" for r in records)
        print(f"{result['case']:<16} plan {wall:6.2f} s  objective {plan.objective:.6g}  "
              f"({plan.refinement['solve']} plan)  solves: {work}", flush=True)
    print("wrote " + _write({"suite": "small", "cpus": os.cpu_count(), "jax": jax.__version__, "cases": results},
                            args.out, "planning_suite_small"))
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.log:
        planner_log()
    if args.suite == "small":
        return run_small(args)
    return run_suite(args) if args.suite else run_single(args)


if __name__ == "__main__":
    sys.exit(main())
