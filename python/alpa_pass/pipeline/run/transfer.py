"""Moving arrays between submeshes with the destination's sharding.

Two modes (``PipeshardParallel(transfer=...)``):

* ``"direct"``: one batched ``jax.device_put`` to the destination sharding; a tensor the destination
  replicates over a mesh axis is copied in full to every device of that axis.
* ``"send_once_gather"`` (Alpa's cross-mesh resharding optimisation): a tensor replicated over
  destination mesh axes is first sent *split* over those axes (``split_sharding``: each destination
  device receives 1/n of its replica), then an all-gather inside the destination mesh (a cached
  jitted identity whose ``out_shardings`` is the destination sharding) rebuilds the replicas.
  Only axes whose size divides some tensor dimension are split; a tensor with none keeps the direct
  path, and so does a value already on the destination's devices (a local reshard).

In both modes a value whose sharding is equivalent to the destination's is not moved, and a fully
replicated value whose devices include all of the destination's is *viewed*, not copied: its
per-device buffers on the destination devices become the result (FREE values such as the step
counter live replicated on every stage, and each stage reads its own replicas).
``assemble_replicas`` is the converse: per-stage replicated copies of one value become one array
replicated over all their devices, again without a copy.
"""
from __future__ import annotations

import functools

import jax
from jax.sharding import NamedSharding, PartitionSpec

from alpa_pass.pipeline.options import TRANSFER_MODES
from alpa_pass.pipeline.run.cross_process import device_put_many, settle
from alpa_pass.runtime.multiprocess import identity_onto

def transfer(x, sharding, mode: str = "send_once_gather"):
    """``x`` placed with ``sharding`` (no copy when it already is)."""
    return transfer_many([x], [sharding], mode)[0]


def transfer_many(xs, shardings, mode: str = "send_once_gather") -> list:
    """Each ``xs[i]`` placed with exactly ``shardings[i]``.

    All sends are issued as one batched device_put; under ``"send_once_gather"`` the split sends
    are then all-gathered to their destination shardings inside the destination meshes.
    """
    if mode not in TRANSFER_MODES:
        raise ValueError(f"transfer mode must be one of {TRANSFER_MODES}, got {mode!r}")
    out = list(xs)
    moves = []
    for i, (x, s) in enumerate(zip(xs, shardings)):
        if isinstance(x, jax.Array) and (x.sharding == s or x.sharding.is_equivalent_to(s, x.ndim)):
            continue
        view = replica_view(x, s)
        if view is None:
            moves.append(i)
        else:
            out[i] = view
    if not moves:
        return out
    sends = [shardings[i] for i in moves]
    gathers = {}
    if mode == "send_once_gather":
        for j, i in enumerate(moves):
            split = _send_split(xs[i], shardings[i])
            if split is not None:
                sends[j] = split
                gathers[j] = identity_onto(shardings[i])
    sent = device_put_many([xs[i] for i in moves], sends)
    for j, (i, y) in enumerate(zip(moves, sent)):
        out[i] = settle(gathers[j](y)) if j in gathers else y
    return out


def replica_view(x, dest):
    """``x`` as an array with sharding ``dest`` sharing ``x``'s buffers, when ``x`` and ``dest``
    are fully replicated and ``x`` has a replica on every device of ``dest``; else ``None``."""
    if not (isinstance(x, jax.Array) and x.is_fully_replicated and dest.is_fully_replicated):
        return None
    if not dest.device_set <= x.sharding.device_set:
        return None
    mine = {s.device: s.data for s in x.addressable_shards}
    devices = list(dest.addressable_devices_indices_map(x.shape))
    return jax.make_array_from_single_device_arrays(x.shape, dest, [mine[d] for d in devices], dtype=x.dtype)


def assemble_replicas(parts, sharding):
    """One array with (fully replicated) ``sharding`` from ``parts``: replicated copies of the same
    value whose devices together are exactly ``sharding``'s (no copy; buffers are shared)."""
    mine = {}
    for part in parts:
        if not part.is_fully_replicated:
            part = device_put_many([part], [NamedSharding(part.sharding.mesh, PartitionSpec())])[0]
        mine.update((s.device, s.data) for s in part.addressable_shards)
    devices = list(sharding.addressable_devices_indices_map(parts[0].shape))
    return jax.make_array_from_single_device_arrays(parts[0].shape, sharding, [mine[d] for d in devices],
                                                    dtype=parts[0].dtype)


def _send_split(x, dest):
    """The split sharding to send ``x`` with before gathering to ``dest``; ``None`` = send directly."""
    if isinstance(x, jax.Array) and x.sharding.device_set == dest.device_set:
        return None
    shape = getattr(x, "shape", None)
    if shape is None or not isinstance(dest, NamedSharding):
        return None
    return split_sharding(tuple(shape), dest)


@functools.lru_cache(maxsize=None)
def split_sharding(shape: tuple, dest: NamedSharding) -> NamedSharding | None:
    """``dest`` with each mesh axis it replicates over also splitting some tensor dimension.

    Each replicated mesh axis (size > 1, in mesh order) is appended to the first dimension whose
    current per-device extent it divides (preferring the largest such extent). Returns ``None`` when
    no axis can be split, i.e. when the direct send is already the cheapest. The result lives on the
    same mesh, so its all-gather back to ``dest`` stays inside the destination devices.
    """
    mesh = dest.mesh
    spec = list(dest.spec) + [None] * (len(shape) - len(dest.spec))
    entries = [() if e is None else ((e,) if isinstance(e, str) else tuple(e)) for e in spec]
    used = {a for e in entries for a in e}
    local = list(dest.shard_shape(shape))
    changed = False
    for axis in mesh.axis_names:
        n = mesh.shape[axis]
        if axis in used or n == 1:
            continue
        fits = [d for d in range(len(shape)) if local[d] % n == 0 and local[d] > 0]
        if not fits:
            continue
        d = max(fits, key=lambda k: local[k])
        entries[d] = entries[d] + (axis,)
        local[d] //= n
        changed = True
    if not changed:
        return None
    new_spec = [None if not e else (e[0] if len(e) == 1 else e) for e in entries]
    while new_spec and new_spec[-1] is None:
        new_spec.pop()
    return NamedSharding(mesh, PartitionSpec(*new_spec), memory_kind=dest.memory_kind)
