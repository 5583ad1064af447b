"""``FollowParallel``: an eval or inference step whose parameters keep a train step's layouts."""
from __future__ import annotations

import dataclasses

import numpy as np

from alpa_pass.extract.graph import OpKind
from alpa_pass.mesh import LogicalMesh
from alpa_pass.methods.layouts import core_specs, match_leaves, train_executable
from alpa_pass.methods.shard import IntraOpMethod
from alpa_pass.options import AutoShardingOption


@dataclasses.dataclass(frozen=True)
class FollowParallel(IntraOpMethod):
    """Plan a step (eval, inference) on a train step's mesh with the train step's argument layouts
    for the arguments they share, and every op reads those arguments in these layouts: the
    trained parameters are used where they lie, with no resharding on entry or inside (an op
    with no strategy for a layout, e.g. a gather from a table split on the indexed dim, reads it
    resharded; the planner logs which). Every other value is planned by the ILP as usual.

    Which arguments are shared (``methods.layouts.match_leaves``): each argument that is a pytree
    of several leaves takes the layouts of the first subtree of the train step's arguments with
    the same structure, shapes and dtypes (``eval_step(params, batch)`` follows ``state[0]`` of
    ``train_step((params, opt_state), batch)``); any leaf left takes those of the train step's
    leaf at the same key path, if shape and dtype agree (``eval_step(state, batch)``).

    Attributes:
      train_step: the train step's ``Executable`` (``p_train.get_executable(state, batch)``), or
        its ``ap.parallelize``'d function once it has planned exactly one argument signature.
        ShardParallel and the presets can be followed (not PipeshardParallel).
      option: planner options for the values that are not pinned.
    """

    train_step: object = dataclasses.field(default=None, compare=False)
    pin_uses = True  # ops read the followed parameters where they lie (no resharding collective)
    option: AutoShardingOption = dataclasses.field(default_factory=AutoShardingOption)

    def __post_init__(self):
        if self.train_step is None:
            raise TypeError("FollowParallel(train_step) needs the train step's Executable or parallelized function")
        if not isinstance(self.option, AutoShardingOption):
            raise TypeError(f"FollowParallel(option=...) takes an AutoShardingOption, got {type(self.option).__name__}")

    def followed(self):
        """The train step's Executable."""
        return train_executable(self.train_step)

    def resolved_mesh(self) -> LogicalMesh:
        """The train step's mesh."""
        return self.followed().plan.mesh

    def axis_order(self) -> tuple:
        """The train step's axis order: shared layouts list split axes alike."""
        return tuple(self.followed().plan.axis_order)

    def pin_policy(self, mesh: LogicalMesh):
        return lambda graph, ties, args: self.pins(graph, ties, mesh, args)

    def pins(self, graph, ties, mesh: LogicalMesh, args=None) -> list[tuple[int, list[int]]]:
        """(argument node, the train step's core spec) for each argument leaf matching a train
        step leaf; none when the arguments are flat leaves (``args`` None: the plugin)."""
        if args is None:
            return []
        exe = self.followed()
        matches = sorted(match_leaves(exe.abstract_inputs, args).items())
        nodes = graph.param_nodes()
        specs = core_specs([exe.input_shardings[j] for _, j in matches], mesh)
        return with_unit_dim_views(graph, [(nodes[i], spec) for (i, _), spec in zip(matches, specs)])


def with_unit_dim_views(graph, pins: list) -> list:
    """``pins`` plus, for each pinned value, the broadcasts and reshapes of it that only add or
    drop size-1 dims (``bias[None, :]`` before a broadcast to the batch): the same data in the same
    layout, so they are pinned (and read) as the parameter is; otherwise the planner could
    reshard such a view and XLA would move the parameter's bytes."""
    pinned = {int(v): list(s) for v, s in pins}
    out = list(pins)
    for v in range(graph.num_nodes):
        kind, ops = OpKind(int(graph.kind[v])), graph.operands(v)
        if kind not in (OpKind.BROADCAST, OpKind.RESHAPE) or len(ops) != 1 or ops[0] not in pinned:
            continue
        src, dst = graph.shape(ops[0]), graph.shape(v)
        if int(np.prod(src, dtype=np.int64)) != int(np.prod(dst, dtype=np.int64)):
            continue
        big_src = [d for d, n in enumerate(src) if n > 1]
        if kind == OpKind.BROADCAST:
            where = dict(enumerate(graph.node_attrs(v)))  # operand dim -> output dim
        else:
            big_dst = [d for d, n in enumerate(dst) if n > 1]
            if [src[d] for d in big_src] != [dst[d] for d in big_dst]:
                continue
            where = dict(zip(big_src, big_dst))
        spec = pinned[ops[0]]
        if any(d >= 0 and d not in where for d in spec):
            continue
        pinned[v] = [where[d] if d >= 0 else -1 for d in spec]
        out.append((v, pinned[v]))
    return out
