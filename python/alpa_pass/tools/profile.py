"""``alpa-pass profile``: measure this cluster's costs and write them as a profile JSON.

Per mesh axis of the actual devices (every (size, stride) of a row-major mesh over
``jax.devices()``, see ``alpa_pass.cost_profile``), the time of all-reduce, all-gather,
reduce-scatter, all-to-all and collective-permute over a range of buffer sizes, with alpha and
beta fitted per kind and per axis (least squares); the matmul throughput of one device per dtype
while every device multiplies at once; and the memory bandwidth of one device (a streaming
read + write, every device at once).

How a time is taken: each measurement is one compiled computation (``jax.shard_map`` over all
devices, public API only) running the operation ``k`` times in a loop whose trip count is an
argument; it is timed with ``k = 1`` and ``k = K``, median of ``repeats`` runs each, and the cost
of one operation is ``(t(K) - t(1)) / (K - 1)``: dispatch and loop overhead cancel (K grows
while t(K) - t(1) is too small to stand out of the noise). Buffers start
as zeros built from an argument (no denormals, nothing for XLA to fold).

In a multi-process job run it on every rank (``alpa-pass run -np N .../alpa_pass/tools/profile.py``,
the launcher runs the file as a script): every rank runs every measurement, all take rank 0's
timings (so all choose the same loop lengths and fits), and rank 0 writes the file.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import numpy as np

from alpa_pass import cost_profile
from alpa_pass._version import __version__

# Collective buffer bytes per device: CPU 4 KiB .. 1 MiB (bandwidth-bound from ~256 KiB; larger
# sizes only make the run slower), accelerators 64 KiB .. 64 MiB.
CPU_SIZES = tuple(4096 * 4 ** i for i in range(5))
ACCELERATOR_SIZES = tuple(65536 * 4 ** i for i in range(6))


def _timed(fn, *args, repeats: int) -> float:
    """Median wall time of ``fn(*args)`` (waited for) over ``repeats`` runs, after one warm-up."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _loop(body, init, k):
    import jax

    return jax.lax.fori_loop(0, k, lambda i, x: body(x), init)


def _collective_fn(kind: str, mesh, size: int, nbytes: int):
    """A jitted fn(zero, k) running collective ``kind`` k times over mesh axis "a" on an f32
    buffer of ``nbytes`` per device (the full buffer of the core's cost formulas)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    numel = max(nbytes // 4, size)
    numel -= numel % size
    part = numel // size

    if kind == "all-reduce":
        def body(x):
            return jax.lax.psum(x, "a")
        init_numel = numel
    elif kind == "all-gather":
        def body(x):  # gather B/n per device into B, keep a B/n slice as the next input
            return jax.lax.all_gather(x, "a", tiled=True)[:part]
        init_numel = part
    elif kind == "reduce-scatter":
        def body(x):  # reduce B, scatter B/n to each device, write it back into the B buffer
            return jax.lax.dynamic_update_slice(x, jax.lax.psum_scatter(x, "a", tiled=True), (0,))
        init_numel = numel
    elif kind == "all-to-all":
        def body(x):
            return jax.lax.all_to_all(x, "a", 0, 0, tiled=True)
        init_numel = numel
    elif kind == "collective-permute":
        perm = [(i, (i + 1) % size) for i in range(size)]

        def body(x):
            return jax.lax.ppermute(x, "a", perm)
        init_numel = numel
    else:
        raise ValueError(kind)

    def local(zero, k):
        x = _loop(body, jnp.full((init_numel,), zero[0], jnp.float32), k[0])
        return x[:1]

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), P()), out_specs=P(("o", "a", "i")), check_vma=False)
    return jax.jit(fn)


def _replicated(mesh, value):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    value = np.asarray(value).reshape(1)
    return jax.make_array_from_callback((1,), NamedSharding(mesh, P()), lambda idx: value[idx])


def measure_axis(num_devices: int, size: int, stride: int, sizes, repeats: int, iters: int, kinds) -> dict:
    """One axis's entry of the profile: per kind the samples (bytes, seconds) and their fit, and
    the axis's joint (alpha, beta) under the core's byte factors."""
    import jax
    from jax.sharding import Mesh

    devices = np.array(jax.devices()).reshape(num_devices // (size * stride), size, stride)
    mesh = Mesh(devices, ("o", "a", "i"))
    zero = _replicated(mesh, np.float32(0))
    out = {"size": size, "stride": stride, "kinds": {}}
    for kind in kinds:
        samples = []
        for nbytes in sizes:
            t = _per_op(_collective_fn(kind, mesh, size, nbytes), zero, mesh, repeats, iters)
            samples.append([int(nbytes), t])
        x = [cost_profile.byte_factor(kind, size) * b for b, _ in samples]
        try:
            alpha, beta = cost_profile.fit_alpha_beta(x, [t for _, t in samples])
        except ValueError:  # fewer than two timings above the noise: no fit of this kind
            alpha = beta = None
        out["kinds"][kind] = {"alpha": alpha, "beta": beta, "samples": samples}
    core = [k for k in kinds if k in cost_profile.CORE_KINDS]
    xs = [cost_profile.byte_factor(k, size) * b for k in core for b, _ in out["kinds"][k]["samples"]]
    ts = [t for k in core for _, t in out["kinds"][k]["samples"]]
    try:
        out["alpha"], out["beta"] = cost_profile.fit_alpha_beta(xs, ts)
    except ValueError:
        raise RuntimeError(f"the collective timings of mesh axis (size {size}, stride {stride}) were lost in "
                           f"timing noise; measure larger sizes (--sizes) or more iterations (--iters)") from None
    return out


def _agreed(seconds: float) -> float:
    """Rank 0's timing, on every process of a multi-process job (each process times the same
    computation; what follows from a timing -- the loop length, the fits -- must be the same on
    all, or the ranks would run different collectives and fail in them)."""
    import jax

    if jax.process_count() == 1:
        return seconds
    from jax.experimental import multihost_utils

    return float(multihost_utils.broadcast_one_to_all(np.float32(seconds)))


def _per_op(fn, zero, mesh, repeats: int, iters: int) -> float:
    """Seconds of one loop iteration of ``fn(zero, k)`` (k iterations): the difference of
    k = K and k = 1 over K - 1, overheads cancelled. K starts at ``iters`` and grows 4x (at most
    3 times) while the difference is under half of t(1) (the clock's and the machine's noise
    would dominate it). <= 0 when lost in noise all the same: the fits skip such timings.
    Across processes every timing is rank 0's (:func:`_agreed`)."""
    one = _agreed(_timed(fn, zero, _replicated(mesh, np.int32(1)), repeats=repeats))
    k = iters
    for attempt in range(4):
        many = _agreed(_timed(fn, zero, _replicated(mesh, np.int32(k)), repeats=repeats))
        if many - one >= 0.5 * one or attempt == 3:
            return (many - one) / (k - 1)
        k *= 4


def measure_matmul(dtype: str, n: int, repeats: int, iters: int) -> float:
    """FLOP/s of one device multiplying n x n matrices in ``dtype`` while every device does."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    dt = jnp.dtype(dtype)

    def local(zero, k):
        a = jnp.full((n, n), zero[0], dt)
        x = _loop(lambda x: x @ a, a, k[0])
        return x[:1, 0].astype(jnp.float32)

    jitted = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P()), out_specs=P("d"), check_vma=False))
    t = _per_op(jitted, _replicated(mesh, np.float32(0)), mesh, repeats, iters)
    if t <= 0:
        raise RuntimeError(f"the {dtype} matmul timing was lost in noise; raise --iters or --matmul-n")
    return 2.0 * n ** 3 / t


def measure_memory(nbytes: int, repeats: int, iters: int) -> float:
    """Bytes/s one device streams (read + write of an f32 buffer) while every device does."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("d",))
    numel = nbytes // 4

    def local(zero, k):
        x = _loop(lambda x: x * 0.5 + zero[0], jnp.full((numel,), zero[0], jnp.float32), k[0])
        return x[:1]

    jitted = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P()), out_specs=P("d"), check_vma=False))
    t = _per_op(jitted, _replicated(mesh, np.float32(0)), mesh, repeats, iters)
    if t <= 0:
        raise RuntimeError("the memory bandwidth timing was lost in noise; raise --iters")
    return 2.0 * numel * 4 / t


def profile_cluster(out: str | None = None, *, sizes=None, repeats: int = 5, iters: int = 8,
                    kinds=cost_profile.KINDS, axes=None, matmul_n: int | None = None,
                    memory_bytes: int | None = None, dtypes=("float32", "bfloat16"), progress=None) -> dict:
    """Measure this cluster (all of ``jax.devices()``) and return its profile as a dict.

    Args:
      out: where to write the JSON (rank 0 writes); ``"cache"`` = the cached profile of this
        cluster (``cost_profile.cache_path``, what ``profile="auto"`` reads); None: not written.
      sizes: buffer bytes per device for the collectives (default ``CPU_SIZES`` on CPU, else
        ``ACCELERATOR_SIZES``).
      repeats: runs per timing (median). iters: loop iterations per timed run (see module doc).
      kinds: collectives to measure; ``axes``: (size, stride) pairs, default every axis of a
        row-major mesh over the devices (``cost_profile.axes_of``).
      matmul_n: matrix side of the throughput measurement (default 512 on CPU, else 4096);
        memory_bytes: buffer per device of the bandwidth measurement (default 16 MiB on CPU, else
        256 MiB); dtypes: matmul dtypes (float32 is required by the planner).
      progress: callable taking one line of text, or None.
    """
    import jax

    say = progress or (lambda line: None)
    if iters < 2:
        raise ValueError("iters must be >= 2 (the per-operation time is a difference of two loop lengths)")
    if "float32" not in dtypes:
        raise ValueError("dtypes must include float32 (the planner's compute cost)")
    start = time.perf_counter()
    cluster = cost_profile.current_cluster()
    n = cluster["num_devices"]
    cpu = cluster["platform"] == "cpu"
    sizes = (CPU_SIZES if cpu else ACCELERATOR_SIZES) if sizes is None else sizes
    matmul_n = (512 if cpu else 4096) if matmul_n is None else matmul_n
    memory_bytes = ((16 if cpu else 256) << 20) if memory_bytes is None else memory_bytes
    axes = cost_profile.axes_of(n) if axes is None else [tuple(map(int, a)) for a in axes]
    data = {"format": cost_profile.FORMAT, "format_version": cost_profile.FORMAT_VERSION,
            "key": cost_profile.cluster_key(**cluster), "cluster": cluster,
            "made_with": {"alpa_pass": __version__, "jax": jax.__version__},
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "method": {"sizes": list(map(int, sizes)), "repeats": repeats, "iters": iters,
                       "matmul_n": matmul_n, "memory_bytes": memory_bytes},
            "axes": []}
    for size, stride in axes:
        entry = measure_axis(n, size, stride, sizes, repeats, iters, kinds)
        data["axes"].append(entry)
        say(f"axis size {size} stride {stride}: alpha {entry['alpha']:.3g} s, beta {entry['beta']:.3g} s/B "
            f"({time.perf_counter() - start:.0f} s)")
    flops = {dt: measure_matmul(dt, matmul_n, repeats, iters) for dt in dtypes}
    say("matmul " + ", ".join(f"{dt} {f / 1e9:.3g} GFLOP/s" for dt, f in flops.items()))
    bandwidth = measure_memory(memory_bytes, repeats, iters)
    say(f"memory {bandwidth / 1e9:.3g} GB/s per device")
    data["compute"] = {"matmul_flops_per_s": flops, "memory_bytes_per_s": bandwidth}
    data["elapsed_s"] = round(time.perf_counter() - start, 1)
    cost_profile.ClusterProfile.from_dict(data)  # what we write must load
    if out is not None and jax.process_index() == 0:
        path = cost_profile.cache_path(data["key"]) if out == "cache" else os.path.expanduser(out)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(cost_profile.ClusterProfile(data).to_json())
        os.replace(path + ".tmp", path)
        say(f"wrote {path}")
    return data


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="cache",
                   help="JSON file to write; 'cache' (default) = ~/.cache/alpa_pass/profiles/<cluster key>.json, "
                        "which AutoShardingOption(profile='auto') reads")
    p.add_argument("--sizes", default=None,
                   help="collective buffer sizes in bytes per device, comma-separated (default: CPU 4KiB..1MiB, "
                        "else 64KiB..64MiB, x4 apart)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median)")
    p.add_argument("--iters", type=int, default=8, help="loop iterations per timed run (>= 2)")
    p.add_argument("--matmul-n", type=int, default=None,
                   help="matrix side of the matmul measurement (default 512 on CPU, else 4096)")
    p.add_argument("--cpu-devices", type=int, default=None,
                   help="CPU only: simulate N devices (sets XLA_FLAGS before jax starts)")


def run(ns: argparse.Namespace) -> dict:
    if ns.cpu_devices:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={ns.cpu_devices}").strip()
    sizes = None if ns.sizes is None else tuple(int(s) for s in ns.sizes.split(","))
    return profile_cluster(ns.out, sizes=sizes, repeats=ns.repeats, iters=ns.iters, matmul_n=ns.matmul_n,
                           progress=lambda line: print(line, file=sys.stderr, flush=True))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="alpa-pass profile", description=__doc__.splitlines()[0])
    add_arguments(p)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
