"""Multi-process (multi-controller) support: one plan on every process, global input arrays, and
host copies of global outputs.

Under ``mpirun -np N python -m alpa_pass.launch`` every process runs the same program and
``jax.devices()`` lists the devices of all processes. Each process plans independently; the plans
must be identical, so :func:`check_same_plan` compares their digests (one small allgather) and
raises :class:`~alpa_pass.errors.PlanDivergedError` naming the ranks that differ, on every rank
at once (never a hang in a later collective with mismatched programs).
"""
from __future__ import annotations

import functools
import hashlib
import json

import jax
import numpy as np

from alpa_pass.errors import PlanDivergedError

_DIGEST_WORDS = 4  # 128 bits of the sha256, gathered as uint32 words (x64 may be off)


def plan_digest(plan) -> str:
    """Hex sha256 of everything that decides what a plan executes: the function fingerprint, the
    mesh (shape, axis names, alpha, beta, device ids if given) and every spec (inputs, outputs,
    nodes, operands). Timings, solver statistics and the summary table do not enter it."""
    mesh = plan.mesh
    body = {
        "fingerprint": getattr(plan, "fingerprint", ""),
        "mesh": [list(mesh.shape), list(mesh.axis_names), list(mesh.alpha), list(mesh.beta),
                 None if mesh.devices is None else [int(d.id) for d in mesh.devices]],
        "input_specs": [str(s) for s in plan.input_specs],
        "output_specs": [str(s) for s in plan.output_specs],
        "node_specs": [[int(a) for a in s] for s in plan.node_specs],
        "operand_specs": [[[int(a) for a in s] for s in ops] for ops in plan.operand_specs],
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def compare_digests(digests: list[str], what: str = "plan") -> None:
    """Raise PlanDivergedError unless every rank's digest equals rank 0's.

    Args:
      digests: one digest per rank, in rank order (as gathered).
      what: what was digested, for the message (e.g. ``"plan of train_step"``).
    """
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if not differ:
        return
    groups: dict[str, list[int]] = {}
    for rank, d in enumerate(digests):
        groups.setdefault(d, []).append(rank)
    listing = "; ".join(f"ranks {ranks}: {d[:12]}" for d, ranks in groups.items())
    raise PlanDivergedError(
        f"the {what} differs across processes: ranks {differ} differ from rank 0 ({listing}). "
        f"Every process must plan the same function with the same argument shapes, mesh and options: "
        f"look for rank-dependent code or environment (ALPA_PASS_* variables, plan_cache_dir "
        f"contents), and give the solver no time limit that can stop it early at different "
        f"incumbents (or save rank 0's plan and pass it to every rank with ShardParallel(plan=...))")


def gather_digests(digest: str) -> list[str]:
    """Every process's ``digest`` (hex, cut to its first 128 bits), in process-index order.

    A collective over all processes (jax.distributed must be initialised)."""
    from jax.experimental import multihost_utils

    words = np.frombuffer(bytes.fromhex(digest)[: 4 * _DIGEST_WORDS], dtype=np.uint32).copy()
    gathered = np.asarray(multihost_utils.process_allgather(words)).reshape(-1, _DIGEST_WORDS)
    return [row.astype(np.uint32).tobytes().hex() for row in gathered]


def broadcast_bytes(data: bytes) -> bytes:
    """Process 0's ``data`` on every process (the others' ``data`` is not read). A collective
    over all processes: its length, then its bytes."""
    from jax.experimental import multihost_utils

    n = int(np.asarray(multihost_utils.broadcast_one_to_all(np.array([len(data)], np.int32)))[0])
    if n == 0:
        return b""
    buf = np.frombuffer(data, np.uint8) if jax.process_index() == 0 else np.zeros(n, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(buf)).astype(np.uint8).tobytes()


def check_same_plan(plan, what: str = "plan") -> None:
    """With more than one process: raise PlanDivergedError (on every rank) unless all processes
    made this same plan. One allgather of 16 bytes; a no-op in a single process."""
    if jax.process_count() == 1:
        return
    compare_digests(gather_digests(plan_digest(plan)), what)


def place_global(x, sharding):
    """``x`` as a jax.Array with ``sharding``, which may span devices of other processes.

    Contract: every process passes the same full value (as in single-program training loops that
    build or load the whole batch on each host). Host values (numpy arrays, and jax arrays held
    by this process alone) are cut with ``jax.make_array_from_callback`` (no communication);
    global arrays are resharded by ``jax.device_put``; scalars and weakly typed arrays also go
    through ``jax.device_put``, which checks that all processes agree.
    """
    if isinstance(x, jax.Array) and (not x.is_fully_addressable or jax.typeof(x).weak_type
                                     or jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended)):
        return jax.device_put(x, sharding)
    if not isinstance(x, (np.ndarray, jax.Array)):
        return jax.device_put(x, sharding)
    host = np.asarray(x, dtype=jax.dtypes.canonicalize_dtype(x.dtype))  # f64 -> f32 unless x64
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def to_host(tree):
    """Full numpy values of every leaf of ``tree``, on every process.

    Arrays that span other processes' devices are all-gathered (a collective: every process must
    call this with the same tree); arrays this process holds entirely are just copied.
    """
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)


def global_to_host(tree):
    """Full numpy values of every leaf of ``tree`` on every process, where each leaf is a *global*
    array: the same logical array on every process, held by the devices of any subset of them
    (e.g. a pipeline step's outputs, which live on the last stage's processes only).

    A collective over all processes: every process must call it with the same tree. (Unlike
    :func:`to_host`, a leaf held by one process is not taken to be a local value.)
    """
    from jax.experimental import multihost_utils

    def one(x):
        if jax.process_count() == 1 or not isinstance(x, jax.Array):
            return np.asarray(x)
        owners = {d.process_index for d in x.sharding.device_set}
        if len(owners) == jax.process_count():
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return broadcast_from_owners(x)

    return jax.tree.map(one, tree)


def broadcast_from_owners(x) -> np.ndarray:
    """The full value of global array ``x`` on every process: gathered on the devices that hold
    it, then broadcast from the lowest process among them (a host round trip). A collective over
    all processes."""
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = sorted(x.sharding.device_set, key=lambda d: d.id)
    owners = sorted({d.process_index for d in devices})
    replicated = NamedSharding(Mesh(np.asarray(devices, dtype=object), ("_all",)), PartitionSpec())
    gathered = identity_onto(replicated)(x)
    here = jax.process_index()
    value = (np.asarray(gathered.addressable_shards[0].data) if here in owners
             else np.zeros(x.shape, x.dtype))
    return np.asarray(multihost_utils.broadcast_one_to_all(value, is_source=here == owners[0]))


@functools.lru_cache(maxsize=None)
def identity_onto(sharding):
    """A jitted identity onto ``sharding``: a reshard inside ``sharding``'s devices (e.g. the
    all-gather to a replicated layout), a collective among their processes. Cached per sharding;
    jax caches its compilations per input shape, dtype and sharding."""
    return jax.jit(lambda v: v, out_shardings=sharding)
