"""Checkpoints on orbax-checkpoint: ``save_checkpoint`` and ``restore_checkpoint``.

On disk, ``path/<step>/`` is one step of an orbax ``CheckpointManager`` with two items:
``state``, a flat dict with one array per leaf of the saved pytree (named by its key path,
``0.blocks.1.w1``), and ``meta``, JSON listing the names in leaf order with their key paths,
shapes and dtypes. Leaves are stored flat so that restoring never depends on how orbax encodes
custom pytree nodes (optax states, flax ``TrainState``): the structure comes from the target.

Saving writes only shards: every process writes the shards of its devices (replica 0 of each;
nothing is gathered to one host) into a temporary directory that is renamed into place when all
processes are done (orbax's atomic finalize), so a save killed midway leaves the earlier steps
readable. Restoring reads, on every device, only the slices its target layout needs, so the
target may be another mesh or device count than the one that saved (2x4 -> 1x8, 8 -> 4 devices).
"""
from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, Sharding

from alpa_pass.errors import CheckpointError
from alpa_pass.plan.plan import Plan
from alpa_pass.runtime.executable import Executable

FORMAT = "alpa_pass.checkpoint/1"


def save_checkpoint(path, state, step: int, *, max_to_keep: int | None = None) -> str:
    """Save the pytree ``state`` as step ``step`` of the checkpoint directory ``path``.

    Under ``mpirun`` every process must call it (with the same global arrays); each writes the
    shards its devices hold. Returns when the step is finalized (written and renamed into place).

    Args:
      path: the checkpoint directory (created if missing); the step goes to ``path/<step>``.
      state: a pytree of ``jax.Array`` (any sharding), numpy arrays or Python scalars; typed PRNG
        keys are stored as their key data and restored as keys.
      step: a non-negative int, not saved in ``path`` yet.
      max_to_keep: keep only this many most recent steps (older ones are deleted); None keeps all.

    Returns:
      The step's directory.

    Raises:
      CheckpointError: the step exists already, or orbax failed to write (the message names the
        directory and the cause).
    """
    ocp = _orbax()
    path = _abspath(path)
    step = int(step)
    if step < 0:
        raise CheckpointError(f"save_checkpoint({path!r}, step={step}): the step must be >= 0")
    flat, meta = _flatten(state)
    mgr = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(
        create=True, max_to_keep=max_to_keep, enable_async_checkpointing=False))
    try:
        if step in mgr.all_steps():
            raise CheckpointError(f"{os.path.join(path, str(step))} exists already; save under a new "
                                  f"step or delete that directory first")
        try:
            mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(flat),
                                                   meta=ocp.args.JsonSave(meta)))
            mgr.wait_until_finished()
        except (OSError, ValueError, RuntimeError, TypeError) as e:
            raise CheckpointError(f"saving step {step} to {path} failed: {type(e).__name__}: {e}") from e
    finally:
        mgr.close()
    return os.path.join(path, str(step))


def restore_checkpoint(path, target, step: int | None = None, *, like=None):
    """Restore step ``step`` of ``path`` straight into the layouts ``target`` gives.

    Each device reads only its slices of the saved arrays; no full copy is made on any host or
    device. The saved leaves are matched to the target's leaves in flattening order.

    Args:
      path: the checkpoint directory given to :func:`save_checkpoint`.
      target: where the leaves go, one of
        - an ``alpa_pass.Executable`` (``parallelized.get_executable(state, batch)``): its
          ``input_shardings``. When the checkpoint has as many leaves as the executable's *first
          argument* (``train_step(state, batch)`` saving ``state``), those leaves' layouts and
          that argument's pytree structure are used; when it has as many as all arguments
          together, the whole argument tuple's;
        - a ``Plan``: its ``input_specs`` on ``plan.mesh`` for the *first* leaves (the first
          argument's, as above); the structure is ``like``'s, or a flat list without ``like``;
        - a pytree of ``jax.sharding.Sharding``, ``jax.ShapeDtypeStruct`` with a sharding, or
          ``jax.Array`` (its sharding), with the saved state's structure (e.g.
          ``jax.tree.map(lambda x: x.sharding, state)``).
      step: the step to restore; None: the latest finalized step (unfinished saves are ignored).
      like: with a ``Plan`` target, a pytree of the state's structure (e.g. its
        ``jax.ShapeDtypeStruct``s) to restore into.

    Returns:
      The state: ``jax.Array`` leaves with the target's shardings, in the target's structure.

    Raises:
      CheckpointError: no checkpoint at ``path``, no finalized step (or not ``step``), a truncated
        or unreadable step (the message names its directory), or a target whose leaf count or
        shapes do not match the saved state.
    """
    ocp = _orbax()
    path = _abspath(path)
    if not os.path.isdir(path):
        raise CheckpointError(f"no checkpoint at {path}: the directory does not exist")
    mgr = ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(create=False))
    try:
        step = _pick_step(mgr, path, step)
        where = os.path.join(path, str(step))
        meta = _read(mgr, step, where, ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointError(f"{where} was not written by alpa_pass.save_checkpoint "
                                  f"(its meta item is {str(meta)[:80]!r}); read it with orbax directly")
        shardings, treedef = _layouts(target, meta, like, where)
        abstract = {name: jax.ShapeDtypeStruct(_data_shape(shape, impl), jnp.dtype(dtype), sharding=s)
                    for name, shape, dtype, impl, s in zip(meta["names"], meta["shapes"], meta["dtypes"],
                                                           meta["key_impls"], shardings)}
        flat = _read(mgr, step, where, ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
    finally:
        mgr.close()
    leaves = [_unwrap(flat[name], impl) for name, impl in zip(meta["names"], meta["key_impls"])]
    return leaves if treedef is None else jax.tree.unflatten(treedef, leaves)


def _flatten(state):
    """(flat dict name -> array, meta) of a pytree: names from key paths, in leaf order."""
    paths = jax.tree_util.tree_flatten_with_path(state)[0]
    if not paths:
        raise CheckpointError("save_checkpoint got a state with no array leaves")
    flat, meta = {}, {"format": FORMAT, "names": [], "paths": [], "shapes": [], "dtypes": [], "key_impls": []}
    for i, (key_path, leaf) in enumerate(paths):
        name = re.sub(r"[^\w.\-]", "_", jax.tree_util.keystr(key_path, simple=True, separator=".")) or "leaf"
        if name in flat:
            name = f"{name}~{i}"
        impl = None
        if not isinstance(leaf, jax.Array):
            leaf = jnp.asarray(leaf) if isinstance(leaf, (int, float, bool, complex)) else leaf
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            impl = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        flat[name] = leaf
        meta["names"].append(name)
        meta["paths"].append(jax.tree_util.keystr(key_path))
        meta["shapes"].append(list(leaf.shape[:-1] if impl else leaf.shape))
        meta["dtypes"].append(str(leaf.dtype))
        meta["key_impls"].append(impl)
    return flat, meta


def _layouts(target, meta, like, where):
    """(one Sharding per saved leaf, treedef or None) from a restore target (see restore_checkpoint)."""
    n = len(meta["names"])
    if isinstance(target, Executable):
        treedef = target.in_treedef
        first = treedef.children()[0] if treedef.children() else treedef
        if first.num_leaves == n:
            return target.input_shardings[:n], first
        if treedef.num_leaves == n:
            return list(target.input_shardings), treedef
        raise CheckpointError(f"{where} holds {n} leaves but the target executable's first argument has "
                              f"{first.num_leaves} and all its arguments {treedef.num_leaves}; restore "
                              f"with the executable of the step whose state was saved")
    if isinstance(target, Plan):
        if len(target.input_specs) < n:
            raise CheckpointError(f"{where} holds {n} leaves but the target plan has only "
                                  f"{len(target.input_specs)} argument leaves")
        mesh = target.mesh.jax_mesh()
        treedef = None if like is None else jax.tree.structure(like)
        if treedef is not None and treedef.num_leaves != n:
            raise CheckpointError(f"{where} holds {n} leaves but like= has {treedef.num_leaves}")
        return [NamedSharding(mesh, s) for s in target.input_specs[:n]], treedef
    leaves, treedef = jax.tree.flatten(target)
    if len(leaves) != n:
        raise CheckpointError(f"{where} holds {n} leaves ({', '.join(meta['paths'][:4])}, ...) but the "
                              f"target pytree has {len(leaves)}; give one sharding per saved leaf")
    return [_leaf_sharding(x, shape, p, where) for x, shape, p in zip(leaves, meta["shapes"], meta["paths"])], treedef


def _leaf_sharding(x, shape, key_path, where) -> Sharding:
    if isinstance(x, Sharding):
        return x
    if isinstance(x, (jax.ShapeDtypeStruct, jax.Array)) and x.sharding is not None:
        if tuple(x.shape) != tuple(shape):
            raise CheckpointError(f"{where}: leaf {key_path} was saved with shape {tuple(shape)} but the "
                                  f"target has {tuple(x.shape)}")
        return x.sharding
    raise CheckpointError(f"restore target leaf {key_path} is {type(x).__name__}; give a "
                          f"jax.sharding.Sharding, a jax.ShapeDtypeStruct with sharding= or a jax.Array")


def _pick_step(mgr, path, step):
    steps = list(mgr.all_steps())
    if not steps:
        unfinished = sorted(e for e in os.listdir(path) if "tmp" in e)
        raise CheckpointError(f"no finalized checkpoint step in {path}"
                              + (f" (unfinished saves: {', '.join(unfinished)})" if unfinished else ""))
    if step is None:
        return max(steps)
    if int(step) not in steps:
        raise CheckpointError(f"no step {step} in {path}; finalized steps: {sorted(steps)}")
    return int(step)


def _read(mgr, step, where, args):
    try:
        return mgr.restore(step, args=args)
    except CheckpointError:
        raise
    except Exception as e:  # orbax and tensorstore raise their own (ValueError, OSError, XlaRuntimeError)
        raise CheckpointError(f"cannot read the checkpoint at {where} (truncated or damaged?): "
                              f"{type(e).__name__}: {str(e)[:500]}") from e


def _data_shape(shape, impl):
    return tuple(shape) if impl is None else tuple(shape) + jax.random.key_data(
        jax.random.key(0, impl=impl)).shape


def _unwrap(leaf, impl):
    return leaf if impl is None else jax.random.wrap_key_data(leaf, impl=impl)


def _abspath(path) -> str:
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise CheckpointError(f"checkpoints need orbax-checkpoint ({e}); pip install 'alpa-pass[checkpoint]'") from e
    return ocp
