"""The user's stacked ``[L, ...]`` leaves at a pipeshard step's boundary: cut into the per-piece
leaves the stages hold (``trace.stacked_params``), and the pieces joined back into one array.

**Join** (step outputs). Pieces on the same stage are first concatenated there (a copy inside the
stage's devices; none when each stage holds one piece, as ``compile.pipeshard`` arranges whenever
no piece is read by several stages). When every stage's block has the same
shape, the same layout on a submesh of the same shape, and the stages' devices are disjoint, the
result is one global ``jax.Array`` over the union of the stages' devices: a mesh with a leading
``"stage"`` axis, dim 0 split over it (then as the block was), built from the blocks' buffers with
no copy and no transfer. Otherwise (unequal pieces or submeshes, a piece held replicated on every
stage) the documented fallback: every block is moved to the first block's devices, replicated, and
concatenated there: correct, but it gathers the stack on one stage.

**Cut** (step inputs). An array whose dim 0 is split first over a mesh axis whose slabs are unions
of pieces (what a join returns) is viewed per slab from its own shards, with no copy (a slab
holding several pieces is then sliced on its devices); any other array is sliced (host values on
the host, device arrays by one jitted slice), and the pipeline's transfers place the pieces.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from alpa_pass.pipeline.run.cross_process import settle

STAGE_AXIS = "stage"


def cut_inputs(split, leaves) -> list:
    """The split step's input leaves from the user's ``leaves`` (``split``: a StackSplit)."""
    pieces = {}
    for i, j in split.inputs:
        if j is not None and i not in pieces:
            pieces[i] = cut(leaves[i], split.bounds)
    return [leaves[i] if j is None else pieces[i][j] for i, j in split.inputs]


def join_outputs(split, outs, transfer) -> list:
    """The user's output leaves from the split step's ``outs``; ``transfer(xs, shardings)`` moves
    arrays (the pipeline's transfer, for the fallback)."""
    return [outs[ix[0]] if len(ix) == 1 else join([outs[k] for k in ix], transfer) for ix in split.outputs]


def cut(x, bounds) -> list:
    """``x`` cut along dim 0 at ``bounds`` (see the module docstring)."""
    bounds = tuple(bounds)
    if not isinstance(x, jax.Array):
        x = np.asarray(x)
        return [x[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    views = slab_views(x, bounds)
    if views is not None:
        return views
    return list(settle(_slicer(bounds)(x)))


def slab_views(x, bounds):
    """The pieces of ``x`` from its own shards when dim 0 is split first over a mesh axis whose
    slabs are unions of pieces, else None."""
    sharding = x.sharding
    if not isinstance(sharding, NamedSharding) or not len(sharding.spec) or sharding.spec[0] is None:
        return None
    entry = sharding.spec[0]
    axes = (entry,) if isinstance(entry, str) else tuple(entry)
    mesh, length = sharding.mesh, x.shape[0]
    slabs = mesh.shape[axes[0]]
    if slabs < 2 or length % slabs or any(g * length // slabs not in bounds for g in range(slabs)):
        return None
    pos = mesh.axis_names.index(axes[0])
    rest = tuple(a for a in mesh.axis_names if a != axes[0]) or ("_slab",)
    first = axes[1:]
    spec = PartitionSpec(None if not first else (first[0] if len(first) == 1 else first), *sharding.spec[1:])
    mine = {s.device: s.data for s in x.addressable_shards}
    rows = length // slabs
    out = []
    for g in range(slabs):
        devices = np.take(np.asarray(mesh.devices), g, axis=pos)
        devices = devices.reshape(devices.shape or (1,))
        slab = NamedSharding(Mesh(devices, rest), spec)
        shape = (rows, *x.shape[1:])
        arrays = [mine[d] for d in slab.addressable_devices_indices_map(shape)]
        view = jax.make_array_from_single_device_arrays(shape, slab, arrays, dtype=x.dtype)
        inner = tuple(b - g * rows for b in bounds if g * rows <= b <= (g + 1) * rows)
        out += [view] if len(inner) == 2 else list(settle(_slicer(inner)(view)))
    return out


def join(parts, transfer):
    """One ``[L, ...]`` array from its pieces in order (see the module docstring)."""
    blocks, group = [], [parts[0]]
    for p in parts[1:]:
        if p.sharding.device_set == group[0].sharding.device_set:
            group.append(p)
        else:
            blocks.append(_concat_on(group))
            group = [p]
    blocks.append(_concat_on(group))
    joined = stage_array(blocks)
    if joined is not None:
        return joined
    home = NamedSharding(_mesh_of(blocks[0]), PartitionSpec())
    moved = transfer(blocks, [home] * len(blocks))
    return settle(_concatenator(home)(*moved))


def stage_array(blocks):
    """One global array over the blocks' devices (leading ``"stage"`` mesh axis), or None when the
    blocks differ in shape, layout or submesh shape, or share devices."""
    first = blocks[0].sharding
    if len(blocks) < 2 or not all(isinstance(b.sharding, NamedSharding) for b in blocks):
        return None
    mesh = first.mesh
    spec = _full_spec(first.spec, blocks[0].ndim)
    seen = set()
    for b in blocks:
        s = b.sharding
        if (b.shape != blocks[0].shape or b.dtype != blocks[0].dtype or s.mesh.axis_names != mesh.axis_names
                or s.mesh.devices.shape != mesh.devices.shape or _full_spec(s.spec, b.ndim) != spec
                or seen & s.device_set):
            return None
        seen |= s.device_set
    name = STAGE_AXIS
    while name in mesh.axis_names:
        name = "_" + name
    union = Mesh(np.stack([np.asarray(b.sharding.mesh.devices) for b in blocks]), (name, *mesh.axis_names))
    entry = spec[0]
    lead = (name,) + (() if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry)))
    sharding = NamedSharding(union, PartitionSpec(lead if len(lead) > 1 else name, *spec[1:]))
    shape = (blocks[0].shape[0] * len(blocks), *blocks[0].shape[1:])
    mine = {s.device: s.data for b in blocks for s in b.addressable_shards}
    arrays = [mine[d] for d in sharding.addressable_devices_indices_map(shape)]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays, dtype=blocks[0].dtype)


def _full_spec(spec, ndim: int) -> tuple:
    entries = tuple(spec) + (None,) * (ndim - len(spec))
    return tuple(None if e == () else e for e in entries)


def _mesh_of(x) -> Mesh:
    if isinstance(x.sharding, NamedSharding):
        return x.sharding.mesh
    return Mesh(np.asarray(sorted(x.sharding.device_set, key=lambda d: d.id), dtype=object), ("d",))


def _concat_on(group):
    """The pieces of one stage concatenated on its devices (the piece itself when alone)."""
    if len(group) == 1:
        return group[0]
    sharding = group[0].sharding
    shape = (sum(p.shape[0] for p in group), *group[0].shape[1:])
    if isinstance(sharding, NamedSharding) and _divides(sharding, shape):
        return settle(_concatenator(sharding)(*group))
    return settle(_concatenator(None)(*group))


def _divides(sharding: NamedSharding, shape) -> bool:
    try:
        return sharding.shard_shape(shape) is not None
    except ValueError:
        return False


@functools.lru_cache(maxsize=None)
def _concatenator(sharding):
    """A jitted concatenation along dim 0 with output ``sharding`` (None: XLA's choice)."""
    fn = lambda *xs: jnp.concatenate(xs, axis=0)  # noqa: E731
    return jax.jit(fn) if sharding is None else jax.jit(fn, out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def _slicer(bounds: tuple):
    """A jitted cut of dim 0 at ``bounds`` (one dispatch for all pieces)."""
    return jax.jit(lambda x: tuple(x[a:b] for a, b in zip(bounds[:-1], bounds[1:])))
