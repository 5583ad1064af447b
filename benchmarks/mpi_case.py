"""One benchmark case on several processes; run under ``mpirun ... python -m alpa_pass.launch``.

    mpirun -np 2 python -m alpa_pass.launch --cpu-devices-per-process 4 \
        benchmarks/mpi_case.py OUT.json gpt small 2x4 [REPEATS] [METHODS]

(``benchmarks/run_suite.py gpt --mpirun 2`` builds that command.) Every process builds the same
state and batch (fixed keys); the auto plan (``ShardParallel`` on the global mesh) and each
hand-written baseline (default: ``dp``) are compiled and timed on all processes' devices, state
fed back, and each baseline's layouts are evaluated in the planner's ILP (``cost_model``, as in
``cases.run_case``). Rank 0 writes OUT.json: per method the compiled figures (comm, memory,
FLOPs), the median step time and the first loss against single-device ``jax.jit`` on rank 0's
first device.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks.*, zoo

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

import alpa_pass as ap  # noqa: E402
from alpa_pass.runtime.multiprocess import gather_digests, place_global, plan_digest  # noqa: E402
from benchmarks import baselines, cases, measure  # noqa: E402
from zoo import train_step_for  # noqa: E402


def place(tree, specs, jmesh):
    """Every leaf of ``tree`` as a global array with its PartitionSpec in ``specs``."""
    shardings = jax.tree.map(lambda s: NamedSharding(jmesh, s), specs,
                             is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return jax.tree.map(place_global, tree, shardings)


def run(suite: str, size: str, shape: tuple[int, ...], repeats: int, methods: list[str],
        profile: str | None = None) -> dict:
    """Plan, compile and time auto and ``methods`` on the global mesh ``shape``; the result dict.
    ``profile``: plan auto with this measured profile (``AutoShardingOption.profile``)."""
    mod = cases.SUITES[suite]
    config = mod.SIZES[size]
    loss_fn, optimizer, state, batch = cases.model_inputs(suite, config, abstract=False)
    fn = train_step_for(loss_fn, optimizer)
    mesh = ap.LogicalMesh(shape=shape)
    jmesh = mesh.jax_mesh()
    result = {"suite": suite, "size": size, "config": cases._asdict(config), "mesh": {"shape": list(shape)}, "ran": True,
              "processes": jax.process_count(), "devices": jax.device_count(),
              "local_devices": jax.local_device_count(), "jax": jax.__version__, "methods": {}}
    first = jax.local_devices()[0]
    result["reference_loss"] = float(jax.jit(fn)(jax.device_put(measure.fresh_copy(state), first),
                                                 jax.device_put(batch, first))[1])
    option = ap.AutoShardingOption(profile=profile)  # (profile None: unit costs)
    step = cases.auto_step(fn, mesh, option)
    t = time.perf_counter()
    exe = step.get_executable(state, batch)
    result["digests"] = gather_digests(plan_digest(exe.plan))
    result["methods"]["auto"] = {"wall_s": time.perf_counter() - t, "objective": exe.plan.objective,
                                 "predicted": dict(exe.plan.predicted), "timings_s": dict(exe.plan.timings),
                                 **measure.compiled_stats(exe)}
    runners = {"auto": (step, measure.fresh_copy(state), batch)}  # timed in rounds once all compiled
    for name in methods:
        rule = getattr(mod, "megatron_dim" if name == "megatron" else "expert_dim", None)
        base = baselines.make_baseline(name, state, batch, mesh.axis_names, mesh.shape, rule)
        jitted = baselines.jit_baseline(baselines.make_train_step(loss_fn, optimizer, base, jmesh), base, jmesh)
        g_state, g_batch = place(state, base.state_specs, jmesh), place(batch, base.batch_specs, jmesh)
        t = time.perf_counter()
        compiled = jitted.lower(g_state, g_batch).compile()
        result["methods"][name] = {"compile_s": time.perf_counter() - t, "baseline": base,
                                   **measure.compiled_stats(compiled)}
        runners[name] = (jitted, g_state, g_batch)
    # each baseline's layouts in the planner's ILP under the costs auto was planned with (every rank
    # evaluates the same deterministic ILPs): predicted against measured under mpirun
    t = time.perf_counter()
    result["cost_model"] = cases.evaluate_baselines(fn, (state, batch), mesh, option,
                                                    result["methods"])
    result["cost_model"]["wall_s"] = time.perf_counter() - t
    for entry in result["methods"].values():
        entry.pop("baseline", None)
    timings = measure.time_interleaved(runners, repeats)
    for name, entry in result["methods"].items():
        entry["timing"] = timings[name]
        entry["loss_error"] = abs(entry["timing"]["first_loss"] - result["reference_loss"])
    return result


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="JSON file rank 0 writes (its folder is created)")
    p.add_argument("suite", choices=("gpt", "moe", "wresnet"))
    p.add_argument("size", help="'small' or one of Alpa's sizes")
    p.add_argument("mesh", help="global mesh, e.g. 2x4")
    p.add_argument("repeats", nargs="?", type=int, default=9, help="timed steps per method, in rounds (median)")
    p.add_argument("methods", nargs="?", default="dp", help="comma-separated baselines")
    p.add_argument("--profile", default=None, help="plan auto with this profile JSON (or 'auto')")
    args = p.parse_args(argv)
    result = run(args.suite, args.size, tuple(int(n) for n in args.mesh.split("x")), args.repeats,
                 args.methods.split(","), args.profile)
    if jax.process_index() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
