"""The plugin's planning adapter: a computation jax is lowering, planned and emitted through
the same path as ``ap.parallelize`` (``driver.request`` -> ``driver.planning`` ->
``emit.plan_emission``), with the method ``ALPA_PASS_METHOD`` names.

Imported by ``plugin.hook`` at the first eligible computation (it is heavy: the C++ core, highspy,
the MLIR walkers).
"""
from __future__ import annotations

import itertools
import logging
import math
import time

import jax
from jax.sharding import NamedSharding, PartitionSpec

from alpa_pass import _compat
from alpa_pass.driver.meshes import resolve_mesh
from alpa_pass.driver.planning import plan_request
from alpa_pass.driver.request import PlanRequest
from alpa_pass.emit.plan_emission import emit_plan
from alpa_pass.errors import ExtractError, ShardingError
from alpa_pass.extract.graph import OpKind
from alpa_pass.extract.stablehlo import extract_graph
from alpa_pass.mesh import LogicalMesh
from alpa_pass.methods.follow import with_unit_dim_views
from alpa_pass.methods.layouts import core_spec
from alpa_pass.methods.presets import DataParallel, Zero2Parallel, Zero3Parallel
from alpa_pass.methods.shard import ShardParallel
from alpa_pass.options import AutoShardingOption
from alpa_pass.plugin.config import PluginConfig, PluginConfigError
from alpa_pass.plugin.hook import mesh_identity
from alpa_pass.plugin.report import write_report
from alpa_pass.trace.lower import output_ties
from alpa_pass.trace.scan_peel import peel_layer_scans

log = logging.getLogger("alpa_pass")

# ALPA_PASS_METHOD -> the method whose planning option and pins the plugin uses.
PLUGIN_METHODS = {"shard": ShardParallel, "data": DataParallel, "zero2": Zero2Parallel, "zero3": Zero3Parallel}


class PluginPlanner:
    """Plans computations for ``plugin.hook.LoweringHook`` under one ``PluginConfig``."""

    def __init__(self, config: PluginConfig):
        self.config = config
        self._method = None

    def plan(self, probe, original, args, kwargs, index: int, owns=lambda sharding: False):
        """Plan the probe's module (jax's lowering of the computation without shardings), lower
        again with the plan's shardings (``original``: jax's own lowering function, ``args`` /
        ``kwargs``: its arguments) and emit the plan into that lowering's module.
        ``index``: how many computations were planned before (names the report files); ``owns``:
        whether a sharding is one of our plans' (the others committed are the user's: :func:`user_pins`).
        Returns (plan, in_shardings over all jaxpr inputs, the lowered computation, the jaxpr input
        positions that keep an earlier plan's layouts when they arrive in one: :func:`followable`)."""
        closed_jaxpr, _, name, _, _, _, _, donated = args
        users = {i: s for i, s in enumerate(args[3]) if not _compat.is_unspecified(s) and not owns(s)}
        method, meshes = self.method()
        option = method.planning_option()
        t = time.perf_counter()
        peeled = peel_layer_scans(closed_jaxpr) if option.peel_layer_scans else None
        if peeled is not None:  # the same program with its layer stacks peeled, as ap.parallelize lowers it
            args = (peeled, *args[1:])
            probe = original(*args[:3], tuple(_compat.unspecified() for _ in args[3]), *args[4:], **kwargs)
        if "custom_partitioning" in _compat.jaxpr_primitive_names(args[0]):
            # (lowered inline on one partition, as a CustomSPMDPartitioning call on several: the
            # module to plan is the one for the mesh's devices, as trace.lower does for the API)
            mesh = meshes if isinstance(meshes, LogicalMesh) else meshes[0]
            replicated = NamedSharding(mesh.jax_mesh(), PartitionSpec())
            probe = original(*args[:3], tuple(replicated for _ in args[3]), *args[4:], **kwargs)
        if _compat.const_args(probe):
            raise ExtractError("the lowering hoisted constants into arguments; not supported yet")
        kept = _compat.kept_var_idx(probe)
        module = _compat.computation_module(probe)
        graph = extract_graph(module)
        graph.donated_args = [k for k, i in enumerate(kept) if donated[i]]
        timings = {"extract": time.perf_counter() - t}
        in_avals = [closed_jaxpr.in_avals[i] for i in kept]
        returned = _node_ties(graph, in_avals, closed_jaxpr.out_avals)
        ties = returned if option.tie_outputs_to_inputs else []
        pins, follow, positions, order = [], [], [], ()
        if not isinstance(meshes, LogicalMesh):  # ALPA_PASS_MESH=auto: the mesh followed arguments lie on
            meshes = arrival_mesh(meshes, [args[3][i] for i, _ in followable(graph, kept, returned)]) or meshes
        if users:
            meshes = mesh_for_user_layouts(meshes, users, graph, kept, closed_jaxpr.in_avals,
                                           adopt=self.config.mesh_shape is None)
        if isinstance(meshes, LogicalMesh):
            user = user_pins(graph, kept, users, meshes, closed_jaxpr.in_avals)
            pins = [(v, s) for v, s in method.pins(graph, ties, meshes) if int(v) not in user] + list(user.items())
            positions = followable(graph, kept, returned, {int(v) for v, _ in pins})
            follow = arrival_pins(positions, args[3], meshes)
            if follow:
                order = arrival_axis_order([args[3][i] for i, _ in positions], meshes)
                log.info("alpa_pass: %s reads %d argument(s) where an earlier plan's outputs lie (it returns no "
                         "new value of them): their layouts are kept", name, len(follow))
                follow = with_unit_dim_views(graph, follow)
        request = PlanRequest.create(graph, module.operation.get_asm(enable_debug_info=False), in_avals, meshes,
                                     option, out_avals=closed_jaxpr.out_avals, ties=ties, pins=pins + follow,
                                     name=name, timings=timings, axis_order=order)
        plan = plan_request(request)
        timings = plan.timings
        t = time.perf_counter()
        in_sh, out_sh = _entry_shardings(plan, kept, len(closed_jaxpr.in_avals))
        computation = original(*args[:3], in_sh, out_sh, *args[5:], **kwargs)
        plan.emit_report = emit_plan(_compat.computation_module(computation), graph, plan, option, name=name)
        timings["emit"] = time.perf_counter() - t
        log.info("alpa_pass: planned %s on mesh %s in %.3f s (objective %.6g, %d constraints)",
                 name, "x".join(map(str, plan.mesh.shape)), sum(timings.values()), plan.objective,
                 plan.emit_report.inserted)
        if self.config.report_dir:
            write_report(self.config.report_dir, index, name, plan)
        return plan, in_sh, computation, tuple(i for i, _ in positions)

    def method(self):
        """(the IntraOpMethod ``ALPA_PASS_METHOD`` names, its resolved mesh or candidate meshes),
        built once (``ALPA_PASS_MESH``: a shape over all devices, ``auto``, or ``1 x N``)."""
        if self._method is None:
            option = AutoShardingOption(memory_budget_per_device=self.config.memory_budget_bytes,
                                        plan_cache_dir=self.config.cache_dir,
                                        prefer_reduce_scatter=self.config.reduce_scatter,
                                        peel_layer_scans=self.config.peel_scans,
                                        profile=self.config.profile)
            shape, n = self.config.mesh_shape, len(jax.devices())
            if isinstance(shape, tuple) and math.prod(shape) != n:
                raise PluginConfigError(
                    f"ALPA_PASS_MESH={'x'.join(map(str, shape))} has {math.prod(shape)} positions but there "
                    f"are {n} devices; give a shape whose product is {n} (e.g. 1x{n}) or unset it")
            mesh = resolve_mesh(shape)
            cls = PLUGIN_METHODS[self.config.method]
            method = cls(mesh="auto", option=option) if shape == "auto" else cls(mesh=mesh, option=option)
            self._method = (method, mesh)
        return self._method


def followable(graph, kept, returned, pinned=()) -> list[tuple[int, int]]:
    """(jaxpr input position, parameter node) of each argument the computation reads and returns no
    new value of (``returned``: (output node, parameter node) pairs; an argument returned as it
    came in, as Keras's ``test_step`` hands back its variables, counts as not returned) and that
    the method does not pin (``pinned``): the arguments that keep the layout they arrive in when
    an earlier plan left them in one (:func:`arrival_pins`)."""
    # (an OUTPUT node whose operand is the parameter node: the argument returned as it came in)
    skip = {int(p) for o, p in returned if graph.operands(int(o)) != [int(p)]} | set(pinned)
    params = graph.param_nodes()
    return [(i, params[k]) for k, i in enumerate(kept) if params[k] >= 0 and params[k] not in skip]


def user_pins(graph, kept, users, mesh: LogicalMesh, in_avals) -> dict[int, list[int]]:
    """Parameter node -> core spec on ``mesh`` for each argument the computation reads that arrives
    committed to a sharding of the user's (``users``: jaxpr input position -> that sharding, for
    the arguments not in a plan's layout): the batch a multi-host script
    assembles with ``jax.make_array_from_process_local_data``, or arrays it ``jax.device_put`` on
    its own mesh. The plan reads them as they are (no reshard on entry, and the user's layout is
    kept); the rest of the computation is planned around them.

    Raises ShardingError when one has no equal layout on ``mesh`` (another device order, or splits
    that ``mesh``'s axes cannot make): the computation then runs as the user wrote it."""
    params = graph.param_nodes()
    out = {}
    for k, i in enumerate(kept):
        s = users.get(i)
        if params[k] < 0 or s is None:
            continue
        spec = equal_spec(s, len(in_avals[i].shape), mesh)
        if spec is None:
            raise ShardingError(f"argument {i} is committed to {s}, which no layout on mesh "
                                f"{'x'.join(map(str, mesh.shape))} {tuple(mesh.axis_names)} equals; set ALPA_PASS_MESH "
                                f"to the shape of that sharding's mesh, or pass the array uncommitted")
        out[int(params[k])] = spec
    return out


def _user_meshes(shardings) -> list[LogicalMesh]:
    """The meshes over all devices that the user's committed arrays lie on, as LogicalMeshes."""
    out, n = {}, len(jax.devices())
    for s in shardings:
        mesh = getattr(s, "mesh", None)
        if isinstance(s, NamedSharding) and mesh.devices.size == n:
            # (named as the user's: the module may name its axes, as flax NNX's Linear does in its dot)
            out.setdefault(mesh_identity(mesh), LogicalMesh(shape=tuple(mesh.devices.shape), axis_names=mesh.axis_names,
                                                            devices=tuple(mesh.devices.flat)))
    return list(out.values())


def mesh_for_user_layouts(meshes, users, graph, kept, in_avals, adopt: bool):
    """The mesh to plan on when arguments arrive in the user's layouts (``users``, as for
    :func:`user_pins`): the first of ``meshes`` (one, or ALPA_PASS_MESH=auto's candidates) that
    holds them as they are, then, with ``adopt`` (no ALPA_PASS_MESH), the user's own mesh (1 x N
    cannot hold a 2x4 ``('data', 'model')`` mesh's ``P(None, 'model')``); none holds them: the
    first of ``meshes`` (``user_pins`` then says why the step runs untouched)."""
    candidates = [meshes] if isinstance(meshes, LogicalMesh) else list(meshes)
    if adopt:
        candidates += _user_meshes(users.values())
    return next((m for m in candidates if _holds(graph, kept, users, m, in_avals)), candidates[0])


def _holds(graph, kept, users, mesh, in_avals) -> bool:
    try:
        user_pins(graph, kept, users, mesh, in_avals)
    except ShardingError:
        return False
    return True


def equal_spec(sharding, ndim: int, mesh: LogicalMesh) -> list[int] | None:
    """The core spec (tensor dim per mesh axis, -1 = none) of the layout on ``mesh`` that places
    the same blocks on the same devices as ``sharding`` (an array of rank ``ndim``), or None. Axes
    that split one dim are tried in mesh order (the plan's default axis order)."""
    jmesh = mesh.jax_mesh()
    axes = [a for a, n in zip(mesh.axis_names, mesh.shape) if n > 1]
    for dims in itertools.product(range(-1, ndim), repeat=len(axes)):
        spec = PartitionSpec(*(tuple(a for a, d in zip(axes, dims) if d == t) or None for t in range(ndim)))
        if NamedSharding(jmesh, spec).is_equivalent_to(sharding, ndim):
            names = list(mesh.axis_names)
            return [dims[axes.index(a)] if a in axes else -1 for a in names]
    return None


def arrival_mesh(candidates, shardings) -> LogicalMesh | None:
    """The candidate mesh (``ALPA_PASS_MESH=auto``) one of these arriving shardings lies on, or None:
    an eval step is planned on the mesh the train step chose, where its parameters are."""
    on = {mesh_identity(s.mesh) for s in shardings if isinstance(s, NamedSharding)}
    return next((m for m in candidates if mesh_identity(m.jax_mesh()) in on), None)


def arrival_pins(follow, in_shardings, mesh: LogicalMesh) -> list[tuple[int, list[int]]]:
    """(parameter node, core spec) for each of the ``follow`` arguments (:func:`followable`) that
    arrives committed to a layout on ``mesh`` (the hook plans only computations whose committed
    arguments are in layouts of ours): it keeps that layout, as under ``FollowParallel``. An eval
    step reads the parameters where the train step keeps them, with no reshard on entry at every
    call; a train step's state (its new value feeds the next call) is planned freely and
    resharded once."""
    where = mesh_identity(mesh.jax_mesh())
    return [(v, core_spec(in_shardings[i], mesh)) for i, v in follow
            if isinstance(in_shardings[i], NamedSharding) and mesh_identity(in_shardings[i].mesh) == where]


def arrival_axis_order(shardings, mesh: LogicalMesh) -> tuple:
    """The mesh axis names, most major first, in the order the arriving ``shardings`` list the
    axes of a dim split over several (the earlier plan's ``Plan.axis_order``), the others in mesh
    order; () when none splits a dim over several axes, or they disagree. A core spec says which
    axes split a dim, not in which order: without this a followed ``P(('y', 'z'))`` could be read
    as ``P(('z', 'y'))``, a reshard of every parameter at every call."""
    names = list(mesh.axis_names)
    before = set()
    for s in shardings:
        for entry in (s.spec if isinstance(s, NamedSharding) else ()):
            if isinstance(entry, tuple):
                before |= {(a, b) for i, a in enumerate(entry) for b in entry[i + 1:]}
    if not before:
        return ()
    order, left = [], names
    while left:
        first = [a for a in left if not any((b, a) in before for b in left)]
        if not first:
            return ()
        order.append(first[0])
        left = [a for a in left if a != first[0]]
    return tuple(order)


def _entry_shardings(plan, kept, num_inputs):
    """(in_shardings over all jaxpr inputs, out_shardings) as NamedShardings on the plan's mesh.

    Inputs dropped as unused get a replicated sharding (jax drops it again)."""
    jmesh = plan.mesh.jax_mesh()
    by_input = dict(zip(kept, plan.input_specs))
    in_sh = tuple(NamedSharding(jmesh, by_input.get(i, PartitionSpec())) for i in range(num_inputs))
    out_sh = tuple(NamedSharding(jmesh, s) for s in plan.output_specs)
    return in_sh, out_sh


def _node_ties(graph, in_avals, out_avals) -> list[tuple[int, int]]:
    """Output/input node pairs to give one sharding (the new ``state`` of a training step), from
    flat leaves (the plugin sees no pytrees). First by dataflow (:func:`_dataflow_ties`: the new
    weight ``w - lr * u`` is computed elementwise from ``w``), then each remaining output leaf ties
    to the first unused input leaf of the same shape and dtype, in order (a new PRNG key, a flag
    set to a constant). Dataflow first: by shapes alone, a batch ``(512, 128)`` in front of a
    weight ``(512, 128)`` took the weight's tie, and the weight, fed back, was read as an
    argument that keeps an arriving layout (:func:`followable`): a second, worse plan."""
    def sds(avals):
        return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]

    params, outs = graph.param_nodes(), graph.output_nodes()
    ins, res = sds(in_avals), sds(out_avals)
    flow = [(o, i) for o, i in _dataflow_ties(graph) if res[o] == ins[i]]
    flow_in, flow_out = {i for _, i in flow}, {o for o, _ in flow}
    rest_in = [i for i in range(len(ins)) if i not in flow_in]
    rest_out = [o for o in range(len(res)) if o not in flow_out]
    rest = output_ties(tuple(ins[i] for i in rest_in), tuple(res[o] for o in rest_out))
    pairs = flow + [(rest_out[o], rest_in[i]) for o, i in rest]
    return [(outs[o], params[i]) for o, i in pairs]


def _dataflow_ties(graph, max_depth: int = 8) -> list[tuple[int, int]]:
    """(output index, argument index) pairs where the output is computed from the argument by
    elementwise ops of the output's shape (an update ``w + u``, an average ``b * m + (1 - b) * g``,
    an argument returned as it came): for each output the arguments so reached within
    ``max_depth`` ops, nearest first; pairs are taken nearest first overall, each output and each
    argument once (ties in depth: lower output, then lower argument index)."""
    param_index = {v: i for i, v in enumerate(graph.param_nodes()) if v >= 0}
    found = []
    for o, out in enumerate(graph.output_nodes()):
        if out < 0:
            continue
        shape, seen = graph.shape(out), set()
        frontier = graph.operands(out)
        for depth in range(max_depth + 1):
            nxt = []
            for v in frontier:
                if v in seen or graph.shape(v) != shape:
                    continue
                seen.add(v)
                if v in param_index:
                    found.append((depth, o, param_index[v]))
                elif graph.kind[v] == OpKind.ELEMENTWISE:
                    nxt.extend(graph.operands(v))
            frontier = nxt
    pairs, used_out, used_in = [], set(), set()
    for _, o, i in sorted(found):
        if o not in used_out and i not in used_in:
            pairs.append((o, i))
            used_out.add(o)
            used_in.add(i)
    return pairs
