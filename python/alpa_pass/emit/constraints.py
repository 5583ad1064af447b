"""Write chosen shardings back into a StableHLO module as ``sdy.sharding_constraint`` ops.

Input IR state: a Shardy module (``sdy.mesh @<mesh_name>`` at the top, e.g. from lowering with
``in_shardings``/``out_shardings`` on a ``jax.sharding.Mesh``) whose functions have the same ops
as the module the :class:`OpGraph` was extracted from.  Output IR state: the same module where each
constrained value ``%v`` is followed by ``%c = sdy.sharding_constraint %v <@mesh, [...]>`` and
every other use of ``%v`` reads ``%c``.  The module is modified in place and verified.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy

from alpa_pass.errors import EmitError, ShardingError
from alpa_pass.extract import op_table
from alpa_pass.extract.graph import CARRY_INDEX, NO_RESULT, OpGraph, OpKind
from alpa_pass.extract.stablehlo import functions

DimSharding = tuple  # mesh axis names of one tensor dim; () = replicated

SKIP_GENERATOR = "generator"            # constants/iotas are never constrained
SKIP_PARAM_OUTPUT = "parameter_or_output"  # entry arguments/results: use in/out shardings
SKIP_CALL_PATHS = "call_path_conflict"  # a callee value whose call paths disagree
CONSTRAINT_NAME_PREFIX = "alpa_pass"    # op_name metadata of inserted constraints (see below)


@dataclasses.dataclass
class EmitReport:
    """``inserted``: constraint ops added (one per MLIR value); ``skipped``: reason -> number of
    requested nodes left unconstrained (reasons are the ``SKIP_*`` constants);
    ``reduce_scattered``: partial sums rewritten to reduce-scatters (``emit.plan_emission``);
    ``accumulators``: loop-carried gradient sums kept per shard and reduced once after their loop
    (``emit.accumulation``); ``manual_ops``: batch-split FFTs run per shard (``emit.manual_ops``);
    ``branch_callbacks``: pure host callbacks on a branch run on every device (``emit.callbacks``);
    ``batched_indexing``: iota-indexed gathers / scatters given batching dims (``emit.batched_indexing``)."""

    inserted: int = 0
    skipped: dict = dataclasses.field(default_factory=dict)
    reduce_scattered: int = 0
    accumulators: int = 0
    manual_ops: int = 0
    branch_callbacks: int = 0
    batched_indexing: int = 0

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())


def mesh_axes(module: ir.Module, mesh_name: str) -> dict[str, int]:
    """Axis name -> size of the module's ``sdy.mesh @mesh_name``."""
    for op in module.body.operations:
        if op.operation.name == "sdy.mesh" and \
                ir.StringAttr(op.attributes["sym_name"]).value == mesh_name:
            axes = (sdy.MeshAxisAttr(a) for a in sdy.MeshAttr(op.attributes["mesh"]).axes)
            return {a.name: a.size for a in axes}
    raise EmitError(f"the module has no 'sdy.mesh @{mesh_name}'; lower the function with "
                    f"in_shardings/out_shardings on a jax.sharding.Mesh (or pass mesh_name=)")


def sharding_text(dims, mesh_name: str) -> str:
    """``#sdy.sharding<@mesh, [{"x"}, {}]>`` for a per-dim tuple of axis names."""
    body = ", ".join("{" + ", ".join(f'"{a}"' for a in d) + "}" for d in dims)
    return f"#sdy.sharding<@{mesh_name}, [{body}]>"


def constraint_location(node: int, operand: int | None = None) -> ir.Location:
    """The location of an inserted constraint: a name XLA keeps as the HLO ``op_name`` metadata
    of the constraint and of the collectives it causes (``tools.fidelity`` parses it back).

    ``alpa_pass/value/%<node>`` for a value constraint, ``alpa_pass/use/%<node>/<operand>`` for a
    use-site constraint on operand ``operand`` of ``node``. Needs an active MLIR context.
    """
    if operand is None:
        return ir.Location.name(f"{CONSTRAINT_NAME_PREFIX}/value/%{node}")
    return ir.Location.name(f"{CONSTRAINT_NAME_PREFIX}/use/%{node}/{operand}")


def slice_first(src, dst, shape, mesh_shape) -> list | None:
    """The core spec between ``src`` and ``dst`` (tensor dim per mesh axis, -1 = none) that does
    ``dst``'s local slices first (axes replicated in ``src``), or None where that is no separate
    step (no slice, nothing after it, or it would not divide ``shape``).

    XLA 0.10's partitioner reshards one step at a time: from ``[R, S(y)]`` to ``[S(x), R]`` it
    finds no direct way and replicates the whole tensor before slicing ("Involuntary full
    rematerialization", twice the bytes the plan's all-gather moves). Constraining the value to
    ``[S(x), S(y)]`` first makes it a free slice followed by the planned all-gather.
    """
    mid = [d if s == -1 else s for s, d in zip(src, dst)]
    if list(mid) in (list(src), list(dst)) or not _divides(mid, shape, mesh_shape):
        return None
    return mid


def _divides(spec, shape, mesh_shape) -> bool:
    """Whether each dim of ``shape`` splits evenly over the mesh axes ``spec`` puts on it."""
    for dim, size in enumerate(shape):
        n = 1
        for axis, d in enumerate(spec):
            n *= mesh_shape[axis] if d == dim else 1
        if size % n:
            return False
    return True


def reshard_steps(src, dst, shape, mesh_shape, cost=None) -> list:
    """The intermediate core specs (tensor dim per mesh axis, -1 = none) of a resharding from
    ``src`` to ``dst`` done as steps XLA's partitioner does directly, neither end included:
    first the local slices ``dst`` adds on axes ``src`` leaves replicated (:func:`slice_first`),
    then each axis that splits another dim in ``dst`` moved there (an all-to-all), one axis at a
    time; the gathers of the axes ``dst`` drops are the last step (to ``dst`` itself). Steps that
    change nothing or do not divide ``shape`` are left out.

    XLA 0.10 finds no direct way for, e.g., ``[S(x,y), R, R] -> [R, R, S(y)]`` (the batch dim of
    a GPT's hidden states split over both axes of 8x8, read by a dot that wants the hidden dim
    split over y): it replicates the whole tensor, then slices ("Involuntary full
    rematerialization": the full tensor's bytes live on every device); as an all-to-all over y,
    then an all-gather over x, it moves what the plan prices.

    ``cost``: ``cost(a, b)`` of one step (the core's ``reshard_cost`` in the plan's axis order);
    given, the axes move in the order whose steps cost least (first such in mesh order): moved in
    mesh order, an axis can land in a dim in front of one that is still to leave it, and XLA
    permutes the tiles (flax's attention on 2x4, ``[S(y), R, S(x), R] -> [S(x), S(y), R, R]``:
    x first lands in front of y, a permute; y first, two all-to-alls).
    """
    head, cur = [], list(src)
    mid = [d if s == -1 else s for s, d in zip(src, dst)]
    if mid != cur and mid != list(dst) and _divides(mid, shape, mesh_shape):
        head.append(mid)
        cur = mid
    if _whole_dim_moves(cur, dst):
        return head  # one all-to-all over every axis of the dim (then the gathers, to dst)
    moved = [axis for axis, (s, d) in enumerate(zip(src, dst)) if s != -1 and d != -1 and s != d]
    orders = itertools.permutations(moved) if cost is not None else [moved]
    best = None
    for order in orders:
        steps, at = [], list(cur)
        for axis in order:
            nxt = list(at)
            nxt[axis] = dst[axis]
            if nxt != list(dst) and _divides(nxt, shape, mesh_shape):
                steps.append(nxt)
                at = nxt
        if cost is None:
            return head + steps
        path = [cur] + steps + [list(dst)]
        total = sum(cost(a, b) for a, b in zip(path, path[1:]))
        if best is None or total < best[0] - 1e-9 * max(1.0, abs(best[0])):
            best = (total, steps)
    return head + best[1]


def _whole_dim_moves(cur, dst) -> bool:
    """Whether the axes that split another dim in ``dst`` than in ``cur`` all move from one dim,
    which they split alone, to one dim that no other axis splits in either layout: XLA does that as
    one all-to-all over all of them (2x4: ``[R, S(x,y)] -> [S(x,y), R]``, a (8, 16, ..) tensor of
    the MoE's expert dispatch). One axis at a time, the second move lands it minor to the first, the
    device order of the dim comes out transposed, and XLA adds a collective-permute of the whole
    shard (the MoE on 2x4: 12 of them, 3 MB per device, that the plan does not price)."""
    moved = [a for a, (c, d) in enumerate(zip(cur, dst)) if c != -1 and d != -1 and c != d]
    if len(moved) < 2 or len({(cur[a], dst[a]) for a in moved}) != 1:
        return False
    source, target = cur[moved[0]], dst[moved[0]]
    return ([a for a, c in enumerate(cur) if c == source] == moved and target not in cur
            and [a for a, d in enumerate(dst) if d == target] == moved)


def _check_spec(graph: OpGraph, v: int, dims: tuple, axes: dict) -> None:
    shape = graph.shape(v)
    if len(dims) != len(shape):
        raise ShardingError(f"node %{v} ({graph.labels[v]}) has shape {shape} but its sharding "
                            f"{dims} names {len(dims)} dims; give one tuple of axes per dim")
    used = [a for d in dims for a in d]
    for a in used:
        if a not in axes:
            raise ShardingError(f"node %{v} ({graph.labels[v]}): mesh axis '{a}' is not in the "
                                f"mesh (axes {sorted(axes)})")
    if len(set(used)) != len(used):
        raise ShardingError(f"node %{v} ({graph.labels[v]}): sharding {dims} uses a mesh axis "
                            f"twice; each axis may split at most one dim")


def _block_key(loc) -> tuple:
    """The block a located op lives in: (function name, nest)."""
    return (loc.func, loc.nest)


def _value_groups(graph: OpGraph, specs: dict, report: EmitReport) -> dict:
    """((func, nest), op_index, result) -> the one spec all of the value's nodes want (others
    skipped)."""
    wanted = collections.defaultdict(dict)
    for v, dims in specs.items():
        kind = graph.kind[v]
        if kind == OpKind.GENERATOR:
            report.skip(SKIP_GENERATOR)
        elif graph.locators[v].op_index == CARRY_INDEX:
            continue  # a while's carried slot: its regions' block arguments (_carry_groups)
        elif kind in (OpKind.PARAMETER, OpKind.OUTPUT) or graph.locators[v].op_index < 0:
            report.skip(SKIP_PARAM_OUTPUT)  # entry arguments/results
        elif graph.locators[v].result == NO_RESULT:
            continue  # the reads of an op without results (its operands get use-site constraints)
        else:
            loc = graph.locators[v]
            wanted[(_block_key(loc), loc.op_index, loc.result)][v] = dims
    nodes_of = collections.defaultdict(list)
    for v, loc in enumerate(graph.locators):
        key = (_block_key(loc), loc.op_index, loc.result)
        if key in wanted:
            nodes_of[key].append(v)
    out = {}
    for key, by_node in wanted.items():
        if len(nodes_of[key]) != len(by_node) or len(set(by_node.values())) != 1:
            report.skip(SKIP_CALL_PATHS, len(by_node))
        else:
            out[key] = (min(by_node), next(iter(by_node.values())))
    return out


def order_shared_dims(graph: OpGraph, specs: dict, uses: dict, axis_names: list, order=None) -> tuple:
    """``specs`` and ``uses`` with the axes of each multi-axis dim in ``order`` (axis names, most
    major first; default: mesh order)."""
    order = tuple(order) if order else tuple(axis_names)
    if sorted(order) != sorted(axis_names):
        raise ShardingError(f"axis order {order} is not a permutation of the mesh axes {tuple(axis_names)}")
    rank = {a: i for i, a in enumerate(order)}

    def ordered(dims):
        return tuple(tuple(sorted(d, key=rank.__getitem__)) for d in dims)

    return ({v: ordered(d) for v, d in specs.items()}, {k: ordered(d) for k, d in uses.items()})


def _changed(what: str) -> EmitError:
    return EmitError(f"{what}: the module changed between extraction and emission; extract the "
                     f"graph from a lowering of the same function and arguments")


def _block_ops(funcs: dict, key: tuple, v: int, graph: OpGraph) -> list:
    """The ops of the block ``key = (func, nest)`` (see ``OpLocator.nest``)."""
    fname, nest = key
    if fname not in funcs:
        raise _changed(f"node %{v} ({graph.labels[v]}) lives in @{fname}, which the module lacks")
    ops = [o.operation for o in funcs[fname].regions[0].blocks[0].operations]
    for op_index, region in nest:
        if op_index >= len(ops) or region >= len(ops[op_index].regions):
            raise _changed(f"node %{v} ({graph.labels[v]}) lives in region {region} of @{fname} op {op_index}")
        ops = [o.operation for o in ops[op_index].regions[region].blocks[0].operations]
    return ops


def _matched_ops(module: ir.Module, graph: OpGraph) -> dict:
    """(func, nest) -> that block's ops, after checking every graph node against the module.

    Walks the nodes in extraction order and checks each op node's locator names an op with
    the node's op name and a result of the node's shape.
    """
    funcs = functions(module)
    blocks: dict = {}
    for v, loc in enumerate(graph.locators):
        if loc.op_index < 0:
            continue
        ops = blocks.get(_block_key(loc))
        if ops is None:
            ops = blocks[_block_key(loc)] = _block_ops(funcs, _block_key(loc), v, graph)
        op = ops[loc.op_index] if loc.op_index + 1 < len(ops) else None
        if op is None or op.name != graph.op_names[v] or loc.result >= len(op.results):
            found = "nothing" if op is None else op.name
            raise _changed(f"node %{v} ({graph.labels[v]}) expects {graph.op_names[v]} at "
                           f"@{loc.func} op {loc.op_index}, found {found}")
    return blocks


def _resolve(blocks: dict, graph: OpGraph, groups: dict) -> list:
    """[(op, result index, next op, dims)] for every group (``blocks``: :func:`_matched_ops`);
    EmitError if the module changed."""
    targets = []
    for (block, index, k), (v, dims) in sorted(groups.items()):
        op = blocks[block][index]
        shape = tuple(ir.RankedTensorType(op.results[k].type).shape)
        if shape != graph.shape(v):
            raise _changed(f"node %{v} ({graph.labels[v]}) has shape {graph.shape(v)} but "
                           f"@{block[0]} op {index} result {k} has shape {shape}")
        targets.append((op, k, blocks[block][index + 1], dims, v))
    return targets


def carry_whiles(graph: OpGraph) -> dict:
    """Carry node (a while's carried slot, ``op_index`` CARRY_INDEX) -> the ``op_index`` of its
    ``stablehlo.while`` in the carry's block: the result node of the same slot, which extraction
    tied to the same yield."""
    tied = collections.defaultdict(list)
    for a, b in graph.ties:
        tied[int(b)].append(int(a))
    out = {}
    for nodes in tied.values():
        for c in nodes:
            lc = graph.locators[c]
            if lc.op_index != CARRY_INDEX:
                continue
            whiles = {graph.locators[r].op_index for r in nodes if graph.op_names[r] == "stablehlo.while"
                      and graph.locators[r].op_index >= 0 and _slot_place(graph.locators[r]) == _slot_place(lc)}
            if len(whiles) == 1:
                out[c] = whiles.pop()
    return out


def _carry_groups(blocks: dict, graph: OpGraph, specs: dict, report: EmitReport) -> list:
    """[(while op, slot, dims, node)]: the layout of each requested carried slot, for the block
    arguments of the while's regions (a slot whose call paths disagree is skipped).

    The loop's init, yield and result are constrained as values; unconstrained, the block
    arguments were left to Shardy, which could carry a slot split where the plan (and every
    constrained read of it in the body) keeps it whole, and XLA gathered it on every iteration
    (a vmapped while over a batch: mctx's search loops, 13 all-gathers per iteration)."""
    whiles = carry_whiles(graph)
    wanted, node_of = collections.defaultdict(set), {}
    for c, w in whiles.items():
        if c in specs:
            loc = graph.locators[c]
            key = (_block_key(loc), w, loc.result)
            wanted[key].add(specs[c])
            node_of[key] = min(c, node_of.get(key, c))
    out = []
    for (block, w, slot), all_dims in sorted(wanted.items()):
        op = blocks[block][w]
        if len(all_dims) != 1:
            report.skip(SKIP_CALL_PATHS)
        elif op.name != "stablehlo.while" or any(slot >= len(r.blocks[0].arguments) for r in op.regions):
            raise _changed(f"node %{node_of[(block, w, slot)]} expects a stablehlo.while carrying slot {slot} "
                           f"at @{block[0]} op {w}")
        else:
            out.append((op, slot, next(iter(all_dims)), node_of[(block, w, slot)]))
    return out


def _slot_place(loc) -> tuple:
    """Where a while's carry or result node sits: its block, call path and slot."""
    return loc.func, loc.nest, loc.call_path, loc.result


def _resolve_uses(blocks: dict, graph: OpGraph, uses: dict, report: EmitReport) -> list:
    """[(consumer op, operand index, dims)] for use-site requests, one per MLIR use. A carry
    node's read of its init operand is the ``stablehlo.while``'s operand of that slot."""
    wanted = collections.defaultdict(set)
    node_of = {}
    whiles = carry_whiles(graph) if any(graph.locators[v].op_index == CARRY_INDEX for v, _ in uses) else {}
    for (v, t), dims in uses.items():
        loc = graph.locators[v]
        if loc.op_index == CARRY_INDEX and v in whiles:
            key = (_block_key(loc), whiles[v], loc.result)
        elif loc.op_index < 0:
            report.skip(SKIP_PARAM_OUTPUT)
            continue
        else:
            op = blocks[_block_key(loc)][loc.op_index]
            key = (_block_key(loc), loc.op_index, op_table.operand_index(op, loc.result, t))
        wanted[key].add(dims)
        node_of[key] = min((v, t), node_of.get(key, (v, t)))
    out = []
    for (block, index, t), all_dims in sorted(wanted.items()):
        v, graph_t = node_of[(block, index, t)]
        op = blocks[block][index]
        if len(all_dims) != 1 or t >= len(op.operands):
            report.skip(SKIP_CALL_PATHS)
            continue
        out.append((op, t, next(iter(all_dims)), v, graph_t))
    return out


def insert_constraints(module: ir.Module, graph: OpGraph,
                       node_dim_shardings: dict[int, list[tuple[str, ...]]],
                       mesh_name: str = "mesh", operand_dim_shardings: dict | None = None,
                       axis_order: tuple | None = None, operand_steps: dict | None = None) -> EmitReport:
    """Insert one ``sdy.sharding_constraint`` per requested value of ``graph`` into ``module``.

    Args:
      module: a Shardy module with the same functions/ops as the one ``graph`` came from.
      graph: the extracted graph (its locators say where each node's value lives).
      node_dim_shardings: node id -> per-tensor-dim tuple of mesh axis names (``()`` = dim
        replicated).  GENERATOR, PARAMETER and OUTPUT nodes are skipped; a callee value reached
        through several call paths is constrained only if all its nodes ask for the same spec.
      operand_dim_shardings: (node id, operand index) -> dims: a constraint on that one use of the
        operand, placed right before the consuming op (the layout the plan reshards the operand
        to for that consumer). Only for nodes whose graph operands are the op's MLIR operands.
      operand_steps: (node id, operand index) -> [dims, ...]: layouts the operand passes through,
        in order, before its use-site layout (``reshard_steps``): one constraint each. Uses in one
        block that read one value through the same layouts share those constraints (one
        reshard in XLA, as a value's own uses share its partitioner's reshard cache).
      axis_order: the mesh axis names, most major first, in which a dim split over several axes
        lists them (a plan's ``axis_order``: the order its reshards were priced in, which its
        entry shardings use too); None: mesh order.
    Returns:
      An :class:`EmitReport` with counts.
    Raises:
      EmitError: no ``sdy.mesh @mesh_name``, ops that do not match the graph, or a module that
        no longer verifies.  ShardingError: a spec of the wrong rank or with unknown axes.
    """
    axes = mesh_axes(module, mesh_name)
    specs = {int(v): tuple(tuple(d) for d in dims) for v, dims in node_dim_shardings.items()}
    for v, dims in specs.items():
        _check_spec(graph, v, dims, axes)
    uses = {(int(v), int(t)): tuple(tuple(d) for d in dims)
            for (v, t), dims in (operand_dim_shardings or {}).items()}
    for (v, t), dims in uses.items():
        _check_spec(graph, graph.operands(v)[t], dims, axes)
    steps = {(int(v), int(t)): [tuple(tuple(d) for d in dims) for dims in chain]
             for (v, t), chain in (operand_steps or {}).items()}
    for (v, t), chain in steps.items():
        for dims in chain:
            _check_spec(graph, graph.operands(v)[t], dims, axes)
    order = tuple(axis_order) if axis_order else tuple(axes)
    specs, uses = order_shared_dims(graph, specs, uses, list(axes), order)
    rank = {a: i for i, a in enumerate(order)}
    steps = {k: [tuple(tuple(sorted(d, key=rank.__getitem__)) for d in dims) for dims in chain]
             for k, chain in steps.items()}
    report = EmitReport()
    blocks = _matched_ops(module, graph)  # (once: the value, use-site and carry targets share it)
    targets = _resolve(blocks, graph, _value_groups(graph, specs, report))
    use_targets = _resolve_uses(blocks, graph, uses, report)
    carry_targets = _carry_groups(blocks, graph, specs, report)
    attrs: dict = {}

    def attr(dims):
        if dims not in attrs:
            attrs[dims] = ir.Attribute.parse(sharding_text(dims, mesh_name))
        return attrs[dims]

    with module.context:
        for op, k, next_op, dims, v in targets:
            value = op.results[k]
            with constraint_location(v):
                c = sdy.ShardingConstraintOp(value, attr(dims), ip=ir.InsertionPoint(next_op))
            value.replace_all_uses_except(c.result, c.operation)
            report.inserted += 1
        made: dict = {}  # (block, value, layouts so far) -> the constraint that reaches them
        for op, t, dims, v, graph_t in use_targets:  # after value constraints: wrap what the op now reads
            value, block, done = op.operands[t], op.operation.block, ()
            with constraint_location(v, graph_t):
                for step in [*steps.get((v, graph_t), ()), dims]:
                    done += (step,)
                    key = (block, op.operands[t], done)
                    if key not in made:  # (uses come in block order: the first one dominates)
                        made[key] = sdy.ShardingConstraintOp(value, attr(step), ip=ir.InsertionPoint(op)).result
                        report.inserted += 1
                    value = made[key]
            op.operands[t] = value
        for op, slot, dims, v in carry_targets:  # every region reads its block argument in the carry's layout
            for region in op.regions:
                arg = region.blocks[0].arguments[slot]
                if not list(arg.uses):
                    continue
                with constraint_location(v):
                    c = sdy.ShardingConstraintOp(arg, attr(dims), ip=ir.InsertionPoint(region.blocks[0].operations[0]))
                arg.replace_all_uses_except(c.result, c.operation)
                report.inserted += 1
    verify_module(module, "inserting constraints")
    return report


def verify_module(module: ir.Module, after: str) -> None:
    """EmitError unless ``module`` verifies (``after``: the rewrite just made, for the message)."""
    try:
        module.operation.verify()
    except ir.MLIRError as e:
        raise EmitError(f"the module does not verify after {after}: {e}") from e
