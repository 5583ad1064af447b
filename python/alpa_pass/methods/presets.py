"""Classic parallel methods as presets: points of the sharding search space, forced.

A preset pins the layout of every argument leaf (batch, parameters, optimizer state) and lets the
sharding ILP plan everything in between; the step's outputs are tied to its inputs as usual.

  DataParallel   batch split on dim 0 over all mesh axes; parameters and optimizer state
                 replicated: the gradients are all-reduced.
  Zero2Parallel  batch split; parameters replicated; optimizer state sharded. Gradients are
                 reduce-scattered (``prefer_reduce_scatter``), the update runs sharded and the new
                 parameters are all-gathered.
  Zero3Parallel  as Zero2, and every parameter with ndim > 1 sharded at rest too.

"Sharded" means split on the leaf's largest dim that the device count divides (ties: the first),
over all mesh axes; a leaf with no such dim stays replicated.

The arguments follow Alpa's training-step convention ``train_step(state, batch)`` with
``state = (params, opt_state)``: ``batch_argnums`` says which arguments are batches and
``params_at`` where the parameter pytree sits inside the arguments; every other leaf of the
non-batch arguments is optimizer (or other) state.

The plugin (``ALPA_PASS_METHOD=data|zero3``) sees flat argument leaves, not pytrees: there
:meth:`PresetParallel.pins_from_ties` takes the *state* to be the arguments whose new values the
computation returns (the output ties) and the *batch* to be every other argument with a leading
dim the device count divides; state is pinned as the preset pins parameters, except that ZeRO-3
leaves 1-D state to the planner. ZeRO-2 needs to tell parameters from optimizer state, which flat
leaves do not say.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from alpa_pass.driver.meshes import resolve_mesh
from alpa_pass.errors import ShardingError
from alpa_pass.mesh import LogicalMesh
from alpa_pass.methods.shard import IntraOpMethod
from alpa_pass.options import AutoShardingOption


@dataclasses.dataclass(frozen=True)
class PresetParallel(IntraOpMethod):
    """Shared fields of the presets.

    Attributes:
      mesh: the logical mesh; ``None`` = all of ``jax.devices()`` as a 1 x N mesh.
      option: planner options for the unpinned values (the preset overrides what it must).
      batch_argnums: positions of the batch arguments (split on dim 0 over all mesh axes).
      params_at: path of the parameter pytree inside the positional arguments: sequence
        indices, dict keys or attribute names (``(0, 0)``: ``state[0]`` of
        ``train_step((params, opt_state), batch)``; ``(0, "params")``: ``state.params`` of a
        flax ``TrainState``).
    """

    mesh: LogicalMesh | None = None
    option: AutoShardingOption = dataclasses.field(default_factory=AutoShardingOption)
    batch_argnums: tuple[int, ...] = (1,)
    params_at: tuple[int, ...] = (0, 0)

    def __post_init__(self):
        if self.mesh is not None and not isinstance(self.mesh, LogicalMesh):
            raise TypeError(f"{type(self).__name__}(mesh=...) takes an alpa_pass.LogicalMesh or None, "
                            f"got {self.mesh!r}")
        if not isinstance(self.option, AutoShardingOption):
            raise TypeError(f"{type(self).__name__}(option=...) takes an AutoShardingOption, "
                            f"got {type(self.option).__name__}")
        object.__setattr__(self, "batch_argnums", tuple(int(i) for i in self.batch_argnums))
        object.__setattr__(self, "params_at", tuple(i if isinstance(i, str) else int(i) for i in self.params_at))

    def resolved_mesh(self) -> LogicalMesh:
        """The mesh (``None``: all devices as 1 x N)."""
        return resolve_mesh(self.mesh)

    def planning_option(self) -> AutoShardingOption:
        """The planner options for the unpinned values (with the preset's changes)."""
        return self.option

    def _param_spec(self, shape, n: int):
        raise NotImplementedError  # each preset defines it

    def _state_spec(self, shape, n: int):
        return zero_dim(shape, n)

    def pinned_args(self, args, mesh: LogicalMesh) -> list[list[int]]:
        """One core spec (tensor dim per mesh axis, -1 = none) per flat leaf of ``args``.

        Raises:
          ShardingError: a batch leaf whose dim 0 the device count does not divide, or an
            argument position / ``params_at`` path the arguments do not have.
        """
        n = mesh.num_devices
        out = []
        params = _params_leaf_ids(args, self.params_at)
        for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(tuple(args))[0]):
            shape = tuple(np.shape(leaf))
            if path[0].idx in self.batch_argnums:
                dim = _batch_dim(path, shape, n)
            elif i in params:
                dim = self._param_spec(shape, n)
            else:
                dim = self._state_spec(shape, n)
            out.append([dim if size > 1 else -1 for size in mesh.shape])
        return out

    def pins_from_ties(self, graph, ties, mesh: LogicalMesh) -> list[tuple[int, list[int]]]:
        """(parameter node, core spec) pins for an extracted plain-jit graph (the plugin): the tied
        parameters are the state, every other parameter with a divisible dim 0 is the batch."""
        n = mesh.num_devices
        state = {param for _, param in ties}
        pins = []
        for v in graph.param_nodes():
            shape = graph.shape(v)
            if v in state:
                dim = self._flat_state_spec(shape, n)
            else:
                dim = 0 if shape and shape[0] % n == 0 and n > 1 else None
            if dim is not None:
                pins.append((v, [dim if size > 1 else -1 for size in mesh.shape]))
        return pins

    def _flat_state_spec(self, shape, n: int):
        """The state dim under ``pins_from_ties`` (None: left to the planner)."""
        return self._param_spec(shape, n)


@dataclasses.dataclass(frozen=True)
class DataParallel(PresetParallel):
    """Data parallelism: batch split over all devices, parameters and optimizer state replicated,
    one (combined) all-reduce of the gradients. Fields: see ``PresetParallel``."""

    def _param_spec(self, shape, n):
        return -1

    def _state_spec(self, shape, n):
        return -1


@dataclasses.dataclass(frozen=True)
class Zero2Parallel(PresetParallel):
    """ZeRO-2: parameters replicated, optimizer state sharded, gradients reduce-scattered and the
    updated parameters all-gathered (``prefer_reduce_scatter`` is forced on; follower merging is
    turned off so that the sharded update can feed replicated parameters). Fields: see ``PresetParallel``."""

    def _param_spec(self, shape, n):
        return -1

    def planning_option(self):
        return dataclasses.replace(self.option, merge_followers=False, prefer_reduce_scatter=True)

    def pins_from_ties(self, graph, ties, mesh):
        raise ShardingError("Zero2Parallel needs to tell parameters from optimizer state, which the flat "
                            "arguments of a plain jax.jit do not say; use "
                            "ap.parallelize(step, method=ap.Zero2Parallel())")


@dataclasses.dataclass(frozen=True)
class Zero3Parallel(PresetParallel):
    """ZeRO-3 / FSDP: every parameter with ndim > 1 and all optimizer state sharded at rest;
    parameters are all-gathered where the plan needs them whole. Fields: see ``PresetParallel``."""

    def _param_spec(self, shape, n):
        return zero_dim(shape, n) if len(shape) > 1 else -1

    def planning_option(self):
        return dataclasses.replace(self.option, merge_followers=False)

    def _flat_state_spec(self, shape, n):
        return self._param_spec(shape, n) if len(shape) > 1 else None


def zero_dim(shape: tuple[int, ...], n: int) -> int:
    """The largest dim of ``shape`` that ``n`` divides (the first among equals), or -1."""
    best = -1
    for dim, size in enumerate(shape):
        if size % n == 0 and (best < 0 or size > shape[best]):
            best = dim
    return best if n > 1 else -1


def _batch_dim(path, shape, n: int) -> int:
    if not shape or shape[0] % n:
        raise ShardingError(f"batch leaf {jax.tree_util.keystr(path)} {shape}: data parallelism splits "
                            f"dim 0 over all {n} devices, which does not divide it; use a batch size "
                            f"divisible by {n} or fix batch_argnums")
    return 0


def _params_leaf_ids(args, params_at) -> set[int]:
    """Flat leaf indices (in ``args``) of the parameter pytree at index path ``params_at``."""
    paths = jax.tree_util.tree_flatten_with_path(tuple(args))[0]
    ids = {i for i, (path, _) in enumerate(paths) if _index_path(path)[:len(params_at)] == params_at}
    if not ids:
        raise ShardingError(f"params_at={params_at} names no argument leaves; point it at the parameter "
                            f"pytree (e.g. (0, 0) for train_step((params, opt_state), batch), (0, \"params\") for a "
                            f"flax TrainState)")
    return ids


def _index_path(path) -> tuple:
    """A key path as plain values: sequence index, dict key or attribute name per level."""
    return tuple(getattr(k, "idx", getattr(k, "key", getattr(k, "name", None))) for k in path)
