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

``batch_argnums`` says which arguments are batches (default: ``train_step(state, batch)``).
The parameters are found from the step itself (:func:`find_params`: the leaves whose new values
the step returns and that its scalar loss depends on), so a flax ``TrainState``, an NNX
``nnx.split`` state, an Equinox ``eqx.partition`` or ``(params, opt_state)`` need no path;
``params_at`` names them explicitly instead. Every other non-batch leaf is optimizer (or other)
state.

The plugin (``ALPA_PASS_METHOD=data|zero2|zero3``) sees flat argument leaves, not pytrees: there
the batch is every leaf the step does not return a new value of whose dim 0 the device count
divides (:meth:`PresetParallel.pins` with ``args=None``).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from alpa_pass.driver.meshes import resolve_mesh
from alpa_pass.errors import OptionError, ShardingError
from alpa_pass.extract.batch_dims import batch_dims
from alpa_pass.extract.graph import OpKind
from alpa_pass.mesh import LogicalMesh
from alpa_pass.methods.base import alpa_names
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
        flax ``TrainState``). ``None`` (default): found from the step (:func:`find_params`).
      num_micro_batches: as ``ShardParallel``'s (gradient accumulation over ``k`` micro-batches).
      devices: Alpa's name of ``mesh`` (also a ``PhysicalDeviceMesh`` or a list of devices).
    """

    mesh: LogicalMesh | None = None
    option: AutoShardingOption = dataclasses.field(default_factory=AutoShardingOption)
    batch_argnums: tuple[int, ...] = (1,)
    params_at: tuple | None = None
    num_micro_batches: int | None = None

    def __post_init__(self):
        if self.num_micro_batches is not None and (isinstance(self.num_micro_batches, bool) or
                                                   not isinstance(self.num_micro_batches, int) or
                                                   self.num_micro_batches < 1):
            raise ValueError(f"{type(self).__name__}(num_micro_batches=...) takes None or an int >= 1, "
                             f"got {self.num_micro_batches!r}")
        if self.mesh is not None and not isinstance(self.mesh, LogicalMesh):
            raise TypeError(f"{type(self).__name__}(mesh=...) takes an alpa_pass.LogicalMesh or None, "
                            f"got {self.mesh!r}")
        if not isinstance(self.option, AutoShardingOption):
            raise TypeError(f"{type(self).__name__}(option=...) takes an AutoShardingOption, "
                            f"got {type(self.option).__name__}")
        object.__setattr__(self, "batch_argnums", tuple(int(i) for i in self.batch_argnums))
        if self.params_at is not None:
            object.__setattr__(self, "params_at",
                               tuple(i if isinstance(i, str) else int(i) for i in self.params_at))

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

    def pin_policy(self, mesh: LogicalMesh):
        return lambda graph, ties, args: self.pins(graph, ties, mesh, args)

    def pins(self, graph, ties, mesh: LogicalMesh, args=None) -> list[tuple[int, list[int]]]:
        """(parameter node, core spec) pins of the preset for an extracted step.

        ``args``: the step's positional arguments (``ap.parallelize``): batches are the leaves of
        ``batch_argnums``, every other leaf is a parameter or state. ``None`` (the plugin, which
        sees flat leaves): batches are the leaves the step does not return a new value of (no
        tie) whose dim 0 the device count divides; other untied leaves are left to the planner.
        Parameters are the leaves at ``params_at``, or else :func:`find_params`'s.

        Raises:
          ShardingError: a batch leaf whose dim 0 the device count does not divide, a
            ``params_at`` path the arguments do not have, or no parameters found.
        """
        n, nodes = mesh.num_devices, graph.param_nodes()
        tied = {p for _, p in ties}
        if args is not None:
            paths = jax.tree_util.tree_flatten_with_path(tuple(args))[0]
            shapes = [tuple(np.shape(leaf)) for _, leaf in paths]
            batch = {i for i, (path, _) in enumerate(paths) if path[0].idx in self.batch_argnums}
            for i in batch:
                _batch_dim(paths[i][0], shapes[i], n)
        else:
            shapes = [graph.shape(v) for v in nodes]
            batch = {i for i, v in enumerate(nodes) if v not in tied and shapes[i] and shapes[i][0] % n == 0 and n > 1}
        params = _params_leaf_ids(args, self.params_at) if self.params_at is not None else find_params(graph, ties)
        pins = []
        for i, v in enumerate(nodes):
            if i in batch:
                dim = 0
            elif i in params:
                dim = self._param_spec(shapes[i], n)
            elif args is not None or v in tied:
                dim = self._state_spec(shapes[i], n)
            else:
                continue
            pins.append((v, [dim if size > 1 else -1 for size in mesh.shape]))
        return pins


def find_params(graph, ties) -> set[int]:
    """Flat argument indices of the step's parameters: the leaves the step returns new values of
    (tied to an output) that its loss depends on. The loss is an output the step returns that is
    a scalar and no argument's new value; optimizer state (Adam's moments, a step counter) is tied
    too but the loss does not read it. A step that returns no loss (``return
    state.apply_gradients(grads=...)``): the tied leaves that a matmul or convolution reads,
    directly or not (the forward pass reads the parameters; the optimizer state feeds no matmul).

    Raises ShardingError when no tied leaf is found either way.
    """
    tied_outputs, tied = {o for o, _ in ties}, {p for _, p in ties}
    roots = [o for o in graph.output_nodes() if o not in tied_outputs and graph.shape(o) == ()]
    if not roots:
        heavy = (OpKind.DOT, OpKind.CONVOLUTION)
        roots = [v for v in range(graph.num_nodes) if graph.kind[v] in heavy]
    carried = {}  # a loop's carried value <-> its initial and yielded values (graph.ties)
    for a, b in graph.ties:
        carried.setdefault(a, []).append(b)
        carried.setdefault(b, []).append(a)
    seen, stack = set(), list(roots)
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            stack.extend(graph.operands(v))
            stack.extend(carried.get(v, ()))
    params = {i for i, v in enumerate(graph.param_nodes()) if v in tied and v in seen}
    if not params:
        raise ShardingError("could not find the parameters: the step must return new values of its "
                            "parameters, and a scalar loss computed from them or matmuls that read them; "
                            "otherwise say where they are with params_at= (e.g. (0, 0) for "
                            "train_step((params, opt_state), batch))")
    return params


@alpa_names("auto_sharding_option")
@dataclasses.dataclass(frozen=True)
class DataParallel(PresetParallel):
    """Data parallelism: batch split over all devices, parameters and optimizer state replicated,
    one (combined) all-reduce of the gradients. As in Alpa's ``force_data_parallel``, the plan
    between the arguments may not all-gather or all-to-all (``allow_all_gather`` /
    ``allow_all_to_all`` off): with a small batch and large weights, gathering the activations
    to compute replicated weight gradients is cheaper in the model than all-reducing them, and
    would not be data parallelism. Fields: see ``PresetParallel``."""

    def planning_option(self):
        return dataclasses.replace(self.option, allow_all_gather=False, allow_all_to_all=False)

    def _param_spec(self, shape, n):
        return -1

    def _state_spec(self, shape, n):
        return -1


@alpa_names("auto_sharding_option")
@dataclasses.dataclass(frozen=True)
class Zero2Parallel(PresetParallel):
    """ZeRO-2: parameters replicated, optimizer state sharded, gradients reduce-scattered and the
    updated parameters all-gathered (``prefer_reduce_scatter`` is forced on; follower merging is
    turned off so that the sharded update can feed replicated parameters). Fields: see ``PresetParallel``."""

    def _param_spec(self, shape, n):
        return -1

    def planning_option(self):
        return dataclasses.replace(self.option, merge_followers=False, prefer_reduce_scatter=True)



@alpa_names("auto_sharding_option")
@dataclasses.dataclass(frozen=True)
class Zero3Parallel(PresetParallel):
    """ZeRO-3 / FSDP: every parameter with ndim > 1 and all optimizer state sharded at rest;
    parameters are all-gathered where the plan needs them whole. Fields: see ``PresetParallel``."""

    def _param_spec(self, shape, n):
        return zero_dim(shape, n) if len(shape) > 1 else -1

    def planning_option(self):
        return dataclasses.replace(self.option, merge_followers=False)


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


def batch_axis_pins(graph, mesh: LogicalMesh, args, batch_argnums, axis: int) -> list[tuple[int, list[int]]]:
    """Pins of Alpa's ``force_batch_dim_to_mesh_dim=axis``: each batch leaf (of ``batch_argnums``)
    with a dim 0 split on dim 0 over mesh ``axis`` and replicated over the others; and, as Alpa
    restricts its dots' and convolutions' strategies, every dot and convolution whose result has
    a batch dim (``extract.batch_dims``: followed from the batch leaves' dim 0) that the axis
    divides splits it over mesh ``axis``, the other axes free (a partial pin). ``args`` None (the
    plugin's flat leaves: no batch_argnums): none.

    Raises OptionError for an axis the mesh lacks, ShardingError for a batch leaf whose dim 0
    the axis's size does not divide."""
    if axis >= len(mesh.shape):
        raise OptionError(f"force_batch_dim_to_mesh_dim={axis}, but the mesh {mesh.shape} has axes "
                          f"0..{len(mesh.shape) - 1}")
    if args is None:
        return []
    n, nodes, pins = mesh.shape[axis], graph.param_nodes(), []
    for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(tuple(args))[0]):
        shape = tuple(np.shape(leaf))
        if path[0].idx not in batch_argnums or not shape:
            continue
        if shape[0] % n:
            raise ShardingError(f"batch leaf {jax.tree_util.keystr(path)} {shape}: force_batch_dim_to_mesh_dim="
                                f"{axis} splits dim 0 over that axis's {n} devices, which does not divide it")
        pins.append((nodes[i], [0 if a == axis and n > 1 else -1 for a in range(len(mesh.shape))]))
    if n == 1:  # (a size-1 axis splits nothing: Alpa's plan is free there too)
        return pins
    dims = batch_dims(graph, {v: 0 for v, _ in pins})
    for v, d in sorted(dims.items()):
        if OpKind(int(graph.kind[v])) in (OpKind.DOT, OpKind.CONVOLUTION) and graph.shape(v)[d] % n == 0:
            pins.append((v, [d if a == axis else ANY_DIM for a in range(len(mesh.shape))]))
    return pins


ANY_DIM = -2  # a pin entry that leaves its mesh axis free (the core's kAnyDim)


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
