"""Benchmark suites: alpa_pass's auto plan against hand-written jax.sharding baselines.

One command per suite; the default size runs on 8 simulated CPU devices (a 2x4 mesh), planned,
compiled and timed. Named sizes (Alpa's) are traced from ShapeDtypeStructs and planned + compiled
for 64 simulated devices (8x8) without running. Several sizes (``--size 1.3B,2.6B`` or
``--size large``) run one child process each under ``--case-timeout``; a case that hits it is
recorded as timed out. Writes one JSON per case to benchmarks/results/ (and ``--report-dir``
copies it where ``benchmarks/report.py`` reads it).

    python benchmarks/run_suite.py gpt                      # small GPT, 2x4, runs and times
    python benchmarks/run_suite.py gpt --size 1.3B,2.6B     # planned + compiled on 8x8, not run
    python benchmarks/run_suite.py moe --size large         # every Alpa size, 10 min each at most
    python benchmarks/run_suite.py gpt --mpirun 2           # 2 processes x 4 CPU devices, auto vs dp
    python benchmarks/run_suite.py gpt --gpu                # all local GPUs; "skipped: no GPU" otherwise
    python benchmarks/run_suite.py gpt --size 39B --budget 80   # auto planned under 80 GiB per device
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL_MODULES = {"gpt": "gpt_sizes", "moe": "moe_transformer", "wresnet": "wide_resnet"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("suite", choices=("gpt", "moe", "wresnet"))
    p.add_argument("--size", default="small",
                   help="'small' (default), one or more of Alpa's sizes (comma-separated, e.g. 1.3B,2.6B), "
                        "or 'large' (all of them)")
    p.add_argument("--mesh", default=None, help="logical mesh, e.g. 2x4 (default: 2x4 small, 8x8 large)")
    p.add_argument("--beta", default=None, help="per-axis beta, e.g. 1,0.1 (default 1 per axis)")
    p.add_argument("--batch", type=int, default=None, help="override the preset's batch size")
    p.add_argument("--methods", default=None, help="comma-separated baselines (default: all of the suite)")
    p.add_argument("--repeats", type=int, default=9,
                   help="timed steps per method, in rounds of one step of every method (median reported)")
    p.add_argument("--no-run", action="store_true", help="plan and compile only (always so for large sizes)")
    p.add_argument("--unmerged", choices=("auto", "on", "off"), default="auto",
                   help="evaluate baselines follower merging cannot express in the unmerged ILP "
                        "(auto: small sizes only; the unmerged ILP of a large model is slow)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="opt-in solver wall-clock limit (s); default none: solves are bounded by nodes")
    p.add_argument("--profile", default=None,
                   help="plan and cost with a measured profile (`alpa-pass profile`): a JSON path or 'auto'")
    p.add_argument("--case-timeout", type=float, default=None,
                   help="run each case in a child process killed after this many seconds "
                        "(default: 600 when several sizes are given, else none)")
    p.add_argument("--trace", action="store_true",
                   help="also trace a few steps of every method (jax.profiler): each device's time in compute "
                        "and in collectives, beside the cost model's prediction of each")
    p.add_argument("--gpu", action="store_true", help="run on the local GPUs (throughput, TFLOP/s, MFU)")
    p.add_argument("--mpirun", type=int, default=None, metavar="NP",
                   help="run the case on NP processes under mpirun (CPU: 8/NP simulated devices each)")
    p.add_argument("--budget", type=float, default=None, metavar="GIB",
                   help="auto's memory_budget_per_device in GiB (e.g. 80 for an 80 GiB GPU); the case gets its "
                        "own JSON (_budgetGIB) and, on CPU, XLA's memory-minimising scheduler")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--report-dir", default=None, help="also copy the JSON to DIR/data/ for report.py")
    return p.parse_args(argv)


def mesh_shape(args) -> tuple[int, ...]:
    large = args.size != "small"
    return tuple(int(s) for s in (args.mesh or ("8x8" if large else "2x4")).split("x"))


def _setup(shape, gpu: bool, budgeted: bool = False) -> None:
    """Simulate the mesh's devices on CPU (must run before jax is imported) unless ``gpu``; a
    ``budgeted`` case compiles with XLA's memory-minimising scheduler (the schedule the planner's
    memory model assumes: devices.MEMORY_SCHEDULER_FLAG)."""
    sys.path.insert(0, ROOT)  # benchmarks.*, zoo
    if not gpu:
        from benchmarks.devices import simulate_cpu_devices

        simulate_cpu_devices(math.prod(shape), memory_scheduler=budgeted)
        os.environ["JAX_PLATFORMS"] = "cpu"


def _tag(args) -> str:
    """The case-file tag of a budgeted run (``_budget80``)."""
    return "" if args.budget is None else f"_budget{args.budget:g}"


def expand_sizes(suite_sizes, requested: str) -> list[str]:
    """``requested`` ("small", "large", or comma-separated names) as a list of ``suite_sizes`` keys.
    Raises ValueError naming the unknown size and the choices."""
    if requested == "large":
        return [s for s in suite_sizes if s != "small"]
    names = [s.strip() for s in requested.split(",") if s.strip()]
    for name in names:
        if name not in suite_sizes:
            raise ValueError(f"unknown size {name!r}; choose from {', '.join(suite_sizes)} or 'large'")
    return names


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.trace and args.mpirun:
        print("--trace reads the devices of one process (CPU thunks or GPU kernels); not with --mpirun",
              file=sys.stderr)
        return 2
    if args.gpu and not _has_gpu():
        print("skipped: no GPU")
        return 0
    if args.budget is not None and not args.budget > 0:
        print(f"--budget must be > 0 GiB, got {args.budget:g}", file=sys.stderr)
        return 2
    if args.mpirun:
        if args.budget is not None:
            print("--budget is for one-process cases (the mpirun case plans the small size)", file=sys.stderr)
            return 2
        return run_mpi(args)
    sys.path.insert(0, ROOT)
    import importlib

    module = importlib.import_module(f"benchmarks.models.{MODEL_MODULES[args.suite]}")
    try:
        sizes = expand_sizes(module.SIZES, args.size)
    except ValueError as e:
        print(f"{args.suite}: {e}", file=sys.stderr)
        return 2
    timeout = args.case_timeout or (600.0 if len(sizes) > 1 else None)
    if timeout is None:
        return run_one(args, mesh_shape(args))
    return max(run_child(args, size, timeout) for size in sizes)


def _has_gpu() -> bool:
    """True when jax sees a GPU (probed in a child process: this one may still simulate CPU devices)."""
    probe = "import jax, sys; sys.exit(0 if any(d.platform == 'gpu' for d in jax.devices()) else 1)"
    try:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def run_one(args, shape) -> int:
    """Plan, compile (and for small sizes or --gpu run) one case in this process; write its JSON."""
    _setup(shape, args.gpu, budgeted=args.budget is not None)
    import dataclasses

    import jax

    import alpa_pass as ap
    from benchmarks import cases, gpu, summary

    if args.gpu:
        shape = (1, len(jax.devices())) if args.mesh is None else shape
    module = cases.SUITES[args.suite]
    if args.batch:
        module.SIZES[args.size] = dataclasses.replace(module.SIZES[args.size], batch=args.batch)
    beta = tuple(float(b) for b in args.beta.split(",")) if args.beta else None
    mesh = ap.LogicalMesh(shape=shape, beta=beta)
    run = not args.no_run and (args.size == "small" or args.gpu)
    unmerged = {"on": True, "off": False, "auto": args.size == "small"}[args.unmerged]
    budget = None if args.budget is None else int(args.budget * 2**30)
    option = ap.AutoShardingOption(solver_time_limit_s=args.time_limit, profile=args.profile,
                                   memory_budget_per_device=budget)
    result = cases.run_case(args.suite, args.size, mesh, option,
                            methods=args.methods.split(",") if args.methods else None, run=run,
                            repeats=args.repeats, unmerged=unmerged, interleave=not args.gpu,
                            trace=args.trace and run)
    if args.gpu:
        result["gpu"] = gpu.throughput(result, args.suite, module.SIZES[args.size],
                                       jax.devices()[0].device_kind, len(jax.devices()))
    if args.profile:  # (the objective is in seconds: what predicted-vs-measured ranks)
        result["profile"] = {"path": args.profile, "key": _profile_key(args.profile)}
    if budget is not None:
        result["memory_budget_per_device"] = budget
    print(summary.text(result))
    write(result, case_file(result["suite"], result["size"], shape, args.gpu, _tag(args), bool(args.profile)), args)
    return 0


def _profile_key(path: str):
    """The cluster key a profile JSON names (None for 'auto' or an unreadable file)."""
    try:
        with open(path) as f:
            return json.load(f).get("key")
    except (OSError, ValueError):
        return None


def run_child(args, size: str, timeout: float) -> int:
    """``run_one`` for ``size`` in a child process; past ``timeout`` s it is killed and a JSON
    saying so (with the last lines it printed) is written in its place."""
    argv = [sys.executable, os.path.abspath(__file__), args.suite, "--size", size, "--repeats", str(args.repeats),
            "--unmerged", args.unmerged, "--out", args.out]
    if args.time_limit is not None:
        argv += ["--time-limit", str(args.time_limit)]
    for flag, value in (("--mesh", args.mesh), ("--beta", args.beta), ("--batch", args.batch),
                        ("--methods", args.methods), ("--report-dir", args.report_dir), ("--profile", args.profile),
                        ("--budget", args.budget)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--no-run"] * args.no_run + ["--gpu"] * args.gpu + ["--trace"] * args.trace
    shape = mesh_shape(argparse.Namespace(size=size, mesh=args.mesh))
    os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out, case_file(args.suite, size, shape, args.gpu, _tag(args), bool(args.profile)) + ".log")
    print(f"--- {args.suite} {size} (limit {timeout:.0f} s; progress: tail -f {log})", flush=True)
    t = time.perf_counter()
    with open(log, "w") as err:
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            with open(log) as f:
                tail = _progress_tail(f.read())
            result = {"suite": args.suite, "size": size, "mesh": {"shape": list(shape)}, "timed_out": True,
                      "limit_s": timeout, "last_output": tail}
            if args.budget is not None:
                result["memory_budget_per_device"] = int(args.budget * 2**30)
            print(f"timed out after {timeout:.0f} s; last: {tail[-1:]}")
            write(result, case_file(args.suite, size, shape, args.gpu, _tag(args), bool(args.profile)), args)
            return 0
    print(proc.stdout[-4000:], end="")
    if proc.returncode:
        with open(log) as f:
            print(f.read()[-4000:], file=sys.stderr)
    print(f"({time.perf_counter() - t:.0f} s)")
    return proc.returncode


def run_mpi(args) -> int:
    """The small case on ``args.mpirun`` processes x (8 / NP) simulated CPU devices under
    ``mpirun ... python -m alpa_pass.launch benchmarks/mpi_case.py``: auto vs ``--methods``
    (default dp) on the global mesh, timed; rank 0's JSON is written like any case's."""
    sys.path.insert(0, ROOT)
    from alpa_pass.errors import LaunchError
    from alpa_pass.launch.cli import find_mpirun

    try:
        mpirun = find_mpirun()
    except LaunchError as e:
        print(f"--mpirun: {e}", file=sys.stderr)
        return 2
    shape = mesh_shape(args)
    if args.size != "small" or math.prod(shape) % args.mpirun:
        print(f"--mpirun runs the small size on a mesh whose {math.prod(shape)} devices NP={args.mpirun} "
              f"divides", file=sys.stderr)
        return 2
    per_process = math.prod(shape) // args.mpirun
    os.makedirs(args.out, exist_ok=True)
    out = os.path.join(args.out, f"mpi_{os.getpid()}.json")
    cmd = [mpirun, "-np", str(args.mpirun), "--bind-to", "none", "--oversubscribe",
           *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
           sys.executable, "-m", "alpa_pass.launch", "--cpu-devices-per-process", str(per_process),
           os.path.join(HERE, "mpi_case.py"), out, args.suite, args.size, "x".join(map(str, shape)),
           str(args.repeats), args.methods or "dp", *(["--profile", args.profile] if args.profile else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_FLAGS", "OMPI_", "PMIX_", "PRTE_"))}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p))
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=args.case_timeout or 900)
    if proc.returncode:
        print(proc.stderr[-4000:], file=sys.stderr)
        return proc.returncode
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    tail = cmd[cmd.index(out) + 1:]
    result["command"] = (f"mpirun -np {args.mpirun} python -m alpa_pass.launch --cpu-devices-per-process "
                         f"{per_process} benchmarks/mpi_case.py OUT.json {' '.join(tail)}")
    if args.profile:
        result["profile"] = {"path": args.profile, "key": _profile_key(args.profile)}
    from benchmarks import summary

    print(summary.mpi_text(result))
    write(result, case_file(args.suite, args.size, shape, tag=f"_mpi{args.mpirun}", profiled=bool(args.profile)), args)
    return 0


def _progress_tail(stderr: str, lines: int = 3) -> list[str]:
    """The last planning-progress lines of a child's stderr (XLA's warnings left out)."""
    keep = [ln.strip() for ln in stderr.replace("\r", "\n").splitlines() if ln.startswith("alpa_pass")]
    return keep[-lines:]


def case_file(suite: str, size: str, shape, gpu: bool = False, tag: str = "", profiled: bool = False) -> str:
    """The case's JSON name; a case planned with --profile gets its own (``_profiled``), beside the
    unit-cost one, and so does one planned under --budget (``tag`` ``_budget80``)."""
    return f"suite_{suite}_{size}_{'x'.join(map(str, shape))}{tag}{'_profiled' if profiled else ''}{'_gpu' if gpu else ''}"


def write(result: dict, name: str, args) -> None:
    """``result`` as JSON in ``args.out`` (time-stamped) and, with --report-dir, DIR/data/NAME.json."""
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
