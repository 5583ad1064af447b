"""Sharded creation at scale: a GPT's training state created by ``CreateStateParallel`` directly in
its train step's layouts, traced from ``jax.ShapeDtypeStruct``s only (nothing is allocated).

Plans the train step, then plans and compiles the init for the same mesh, and prints per device:
the init's argument, output and temporary bytes (XLA ``memory_analysis``) beside the train step's
per-device argument bytes (its plan's input shardings applied to the argument shapes: exactly the
shard sizes the compiled step would take) and the whole state's bytes. Issue 15's target: init
argument + output within 10% of the train step's argument bytes, never the whole model.
Not a test: never collected by pytest.

    python benchmarks/bench_create_state.py                       # GPT-39B on 8x8 (64 CPU devices)
    python benchmarks/bench_create_state.py --size 1.3B --mesh 2x4 --method zero3
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
from benchmarks.devices import simulate_cpu_devices  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="39B", help="benchmarks/models/gpt_sizes.SIZES key (default 39B)")
    p.add_argument("--mesh", default="8x8", help="logical mesh, e.g. 8x8 (its product of CPU devices is simulated)")
    p.add_argument("--method", default="shard", choices=("shard", "zero3"), help="how the train step is planned")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results"))
    return p.parse_args(argv)


def shard_bytes(avals, shardings) -> int:
    """Per-device bytes of ``avals`` laid out by ``shardings`` (one device's shard of each)."""
    return sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize for a, s in zip(avals, shardings))


def run(size: str, mesh_shape: tuple, method: str) -> dict:
    import jax
    from jax.sharding import NamedSharding

    import alpa_pass as ap
    from benchmarks.models import gpt_sizes
    from zoo import default_optimizer, gpt, init_state

    config, optimizer = gpt_sizes.SIZES[size], default_optimizer()

    def init_fn(key):
        return init_state(gpt.init(key, config), optimizer)

    mesh = ap.LogicalMesh(shape=mesh_shape)
    train_method = ap.Zero3Parallel(mesh=mesh) if method == "zero3" else ap.ShardParallel(mesh=mesh)
    key = jax.eval_shape(lambda: jax.random.key(0))
    batch = jax.eval_shape(lambda k: gpt.make_batch(k, config), key)
    state = jax.eval_shape(init_fn, key)
    train_step = gpt.make_train_step(optimizer, config)

    t = time.perf_counter()
    plan = ap.parallelize(train_step, method=train_method).plan(state, batch)
    plan_s = time.perf_counter() - t
    jmesh = plan.mesh.jax_mesh()
    avals = jax.tree.leaves((state, batch))
    train_args = shard_bytes(avals, [NamedSharding(jmesh, s) for s in plan.input_specs])

    t = time.perf_counter()
    exe = ap.parallelize(init_fn, method=ap.CreateStateParallel(train_step, batch, method=train_method)).get_executable(key)
    init_s = time.perf_counter() - t
    mem = exe.memory_analysis()
    whole = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state))
    init_io = mem.argument_size_in_bytes + mem.output_size_in_bytes
    return {
        "size": size, "mesh": list(mesh_shape), "method": method,
        "params": sum(math.prod(x.shape) for x in jax.tree.leaves(state[0])),
        "state_bytes": whole,
        "train_step_argument_bytes_per_device": train_args,
        "init_argument_bytes_per_device": mem.argument_size_in_bytes,
        "init_output_bytes_per_device": mem.output_size_in_bytes,
        "init_temp_bytes_per_device": mem.temp_size_in_bytes,
        "init_io_over_train_args": init_io / train_args,
        "init_peak_over_whole_state": (init_io + mem.temp_size_in_bytes) / whole,
        "train_plan_s": plan_s, "init_plan_and_compile_s": init_s,
        "init_timings_s": dict(exe.plan.timings),
        "init_ilp_size": dict(exe.plan.ilp_size),
        "jax": jax.__version__, "cpus": os.cpu_count(),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    shape = tuple(int(s) for s in args.mesh.split("x"))
    simulate_cpu_devices(math.prod(shape))
    result = run(args.size, shape, args.method)
    gib = 2**30
    print(f"GPT-{args.size} on {args.mesh} ({args.method}): state {result['state_bytes'] / gib:.2f} GiB, "
          f"train step arguments {result['train_step_argument_bytes_per_device'] / gib:.3f} GiB/device")
    print(f"init per device: arguments {result['init_argument_bytes_per_device'] / gib:.3f} GiB, outputs "
          f"{result['init_output_bytes_per_device'] / gib:.3f} GiB, temporaries {result['init_temp_bytes_per_device'] / gib:.3f} GiB; "
          f"(arguments + outputs) / train step arguments = {result['init_io_over_train_args']:.3f}; "
          f"init peak / whole state = {result['init_peak_over_whole_state']:.4f}")
    print(f"train step planned in {result['train_plan_s']:.1f} s; init planned and compiled in "
          f"{result['init_plan_and_compile_s']:.1f} s")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"create_state_{args.size}_{args.mesh}_{args.method}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
