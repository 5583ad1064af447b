"""Moving arrays between submeshes that belong to different processes (multi-controller runs).

Under ``mpirun`` each process drives only its own devices, and ``jax.device_put`` cannot move an
array to devices of another process on CPU or GPU backends without DCN transfer support. A
pipeline whose stages sit on different processes still has to hand activations forward and
cotangents back, so such moves are written as collectives every process issues in the same order
(the pipeline runtime walks the same schedule on every process; a process that holds none of the
devices of a collective runs it as a no-op):

* **permute** (source and destination hold the same number of devices, no device in both): the value
  is first laid out on the source devices exactly as the destination wants it (a reshard inside
  the source devices), then one ``ppermute`` over a two-row union mesh (row 0 the source devices,
  row 1 the destination devices) hands every block to its destination device. Each device sends
  only its own block: what ``jax.device_put`` would send within one process.
* **broadcast** (anything else, e.g. a whole-cluster array moved to one stage): the value is
  gathered on its own devices, broadcast from the lowest process that holds it to all processes
  (``multihost_utils.broadcast_one_to_all``: a host round trip), then placed on the destination.
  Correct for any layout but slow: it is the fallback, never the path of a planned pipeline
  whose stages have equal submeshes.

**Ordering.** Cross-process collectives must run in the same order on every process, but the CPU
runtime may run independently dispatched computations in any order. Letting computations stay in
flight across a cross-process collective was seen to deadlock (1 run in 3 of the 2-process GPipe
test) even when only the cross-process ones were waited for; waiting for every computation the
pipeline issues (:func:`settle`) made 4 of 4 runs pass. So under several processes each process
runs its own tasks one after another; stages on different processes still run at the same time.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpa_pass.runtime.multiprocess import broadcast_from_owners, identity_onto

_PP = "_alpa_pp"  # the union mesh's stage axis; a name no user mesh uses


def device_put_many(xs, dests) -> list:
    """``jax.device_put(xs, dests)``, also where a move involves devices of other processes.

    Host values (numpy arrays, Python scalars) are placed by every process for its own devices, as
    ``jax.device_put`` does. An array move that involves devices of one process only runs there
    (other processes get an array with no addressable shards); one that involves devices of several
    processes is a collective (:func:`put`). Every process must call this with the same global
    arrays and destinations, in the same order.
    """
    out = [None] * len(xs)
    local = []
    here = jax.process_index()
    for i, (x, dest) in enumerate(zip(xs, dests)):
        owners = involved_processes(x, dest)
        if owners is None or owners == {here}:
            local.append(i)
        elif len(owners) > 1:
            out[i] = put(x, dest)
        else:
            out[i] = jax.make_array_from_single_device_arrays(x.shape, dest, [], dtype=x.dtype)
    placed = settle(jax.device_put([xs[i] for i in local], [dests[i] for i in local]))
    for i, y in zip(local, placed):
        out[i] = y
    return out


def settle(result):
    """Under several processes, wait for ``result`` (a pytree of arrays; see "Ordering" above);
    returns ``result``. A no-op in a single process, where dispatch stays asynchronous."""
    if jax.process_count() > 1:
        jax.block_until_ready(result)
    return result


def involved_processes(x, dest) -> set[int] | None:
    """The processes whose devices take part in placing ``x`` with ``dest``; ``None`` for a host
    value (placed by every process on its own devices)."""
    if not isinstance(x, jax.Array):
        return None
    return {d.process_index for d in (*x.sharding.device_set, *dest.device_set)}


def crosses_processes(x, dest) -> bool:
    """Whether placing array ``x`` with ``dest`` needs a collective across processes (the same
    answer on every process)."""
    owners = involved_processes(x, dest)
    return owners is not None and len(owners) > 1 and x.sharding.device_set != dest.device_set


def put(x, dest):
    """``x`` placed with ``dest`` across processes (see the module docstring).

    Every process must call this with the same (global) ``x`` and ``dest``, in the same order
    relative to its other collectives. Returns a global array with sharding ``dest``; on a process
    that holds none of ``dest``'s devices it has no addressable shards.
    """
    src_devices = _device_list(x.sharding)
    if (isinstance(dest, NamedSharding) and src_devices is not None
            and len(src_devices) == len(dest.device_set)
            and not set(src_devices) & dest.device_set):
        return _permute_put(x, dest, src_devices)
    return _broadcast_put(x, dest)


def _device_list(sharding):
    if isinstance(sharding, NamedSharding):
        return list(sharding.mesh.devices.flat)
    return sorted(sharding.device_set, key=lambda d: d.id)


def _permute_put(x, dest: NamedSharding, src_devices):
    shape, dtype = tuple(x.shape), x.dtype
    dst_devices = np.asarray(dest.mesh.devices)
    src_mesh = Mesh(np.asarray(src_devices, dtype=object).reshape(dst_devices.shape),
                    dest.mesh.axis_names)
    staged = settle(identity_onto(NamedSharding(src_mesh, dest.spec))(x))
    union = NamedSharding(Mesh(np.stack([np.asarray(src_mesh.devices), dst_devices]),
                               (_PP, *dest.mesh.axis_names)), PartitionSpec(_PP, *dest.spec))
    local_src = {s.device: s.data for s in staged.addressable_shards}
    block = dest.shard_shape(shape)
    pieces = []
    for device in union.addressable_devices:
        if device in local_src:
            pieces.append(local_src[device].reshape((1, *block)))
        else:
            pieces.append(jnp.zeros((1, *block), dtype, device=device))
    stacked = jax.make_array_from_single_device_arrays((2, *shape), union, pieces, dtype=dtype)
    moved = settle(_permute_fn(union)(stacked))
    mine = [s.data.reshape(block) for s in moved.addressable_shards if s.device in dest.device_set]
    return jax.make_array_from_single_device_arrays(shape, dest, mine, dtype=dtype)


def _broadcast_put(x, dest):
    full = broadcast_from_owners(x)
    return jax.make_array_from_callback(full.shape, dest, lambda index: full[index], dtype=full.dtype)


@functools.lru_cache(maxsize=None)
def _permute_fn(union: NamedSharding):
    """Row 0 of the union mesh sends each block to the same position in row 1."""
    spec = union.spec
    move = jax.shard_map(lambda v: jax.lax.ppermute(v, _PP, [(0, 1)]), mesh=union.mesh,
                         in_specs=spec, out_specs=spec)
    return jax.jit(move, out_shardings=union)
