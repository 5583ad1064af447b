"""``CreateStateParallel``: run a state initialiser so that its outputs are born in the layouts a
train step's plan wants for its state; no device ever holds more than its share of the state."""
from __future__ import annotations

import dataclasses

import jax
from jax.sharding import NamedSharding

import numpy as np

from alpa_pass import _core
from alpa_pass.driver.jit import compile_plan, make_plan
from alpa_pass.driver.planning import core_graph
from alpa_pass.errors import ShardingError
from alpa_pass.methods.layouts import core_specs, train_executable
from alpa_pass.methods.shard import IntraOpMethod, ShardParallel
from alpa_pass.options import AutoShardingOption
from alpa_pass.runtime.executable import Executable
from alpa_pass.trace.lower import fn_name


class CreateStateParallel(IntraOpMethod):
    """A method for ``ap.parallelize(init_fn, method=CreateStateParallel(train_step, *batch))``.

    The train step (``train_step(state, *batch)``, the state being ``init_fn``'s output) is
    planned first, on ``init_fn``'s output shapes and ``example_batch``; then ``init_fn`` is
    planned on the train step's mesh with its outputs pinned to the train step's layouts for the
    state, and compiled with them as its output shardings. An output whose producer has no
    strategy in its layout (a broadcast scalar: zeros, ones) is computed as the planner likes and
    cut to the layout on output (a local slice, no communication). The random values equal the
    unparallelized init's (jax's threefry is partitionable: values do not depend on the layout).

    Args:
      train_step: the train step's ``ap.parallelize``'d function (its executable for this state
        and batch is built now and reused when training starts: nothing is planned twice), its
        ``Executable``, or a plain function (planned with ``method``; parallelizing it later with
        the same method and arguments finds the same plan).
      *example_batch: the train step's arguments after the state: arrays or
        ``jax.ShapeDtypeStruct``s (shapes and dtypes matter, not values).
      method: how to plan a plain ``train_step`` (default ``ShardParallel()``); ignored otherwise.
      option: planner options for the initialiser's own values.
    """

    def __init__(self, train_step, *example_batch, method: IntraOpMethod | None = None,
                 option: AutoShardingOption | None = None):
        if method is not None and not isinstance(method, IntraOpMethod):
            raise TypeError(f"CreateStateParallel(method=...) takes ShardParallel or a preset, got {type(method).__name__}")
        self.train_step = train_step
        self.example_batch = tuple(example_batch)
        self.method = method or ShardParallel()
        self.option = option or AutoShardingOption()

    def planning_option(self) -> AutoShardingOption:
        """``option`` without follower merging and repeated-layer ties: values an init creates once
        (Adam's zero moments of every parameter of a shape, each layer's weights) are often one op
        or one tied group, yet the train step may want them in different layouts. Emitted with
        layout constraints on anchors only (the outputs keep theirs): with a constraint between a
        sampler and its scale (``normal(k, shape) * std``) XLA optimises the float ops apart, not
        as one expression like the plain jit, and a quarter of the values came out 1 ulp apart (as
        eager does); the init's elementwise values take their layouts from the outputs (per-device
        bytes unchanged: GPT-1.3B Zero3 2x4, bench_create_state.py, 1.839 GiB out, 0.580 temp)."""
        return dataclasses.replace(self.option, merge_followers=False, tie_repeated_layers=False, emit="anchors")

    def build_executable(self, fn, args, donate_argnums) -> Executable:
        plan, graph, out_tree = self._plan(fn, args, donate_argnums)
        compiled = compile_plan(fn, args, plan, graph, out_tree, self.planning_option(), donate_argnums)
        return Executable(plan, compiled, jax.tree.structure(args), jax.tree.structure(compiled.output_shardings))

    def plan_for(self, fn, args, donate_argnums):
        return self._plan(fn, args, donate_argnums)[0]

    def _plan(self, fn, args, donate_argnums):
        """make_plan's (plan, graph, out_tree) with every output in the train step's layout."""
        mesh, specs, order = self._state_layouts(fn, args)
        option, unpinned = self.planning_option(), []

        def policy(graph, ties, _):
            feasible = _feasible(graph, ties, mesh, option, specs)
            unpinned.extend(i for i, ok in enumerate(feasible) if not ok)
            return [(v, s) for v, s, ok in zip(graph.output_nodes(), specs, feasible) if ok]

        plan, graph, out_tree = make_plan(fn, args, mesh, option, donate_argnums=donate_argnums, pin_policy=policy,
                                          axis_order=order)
        for i in unpinned:
            plan.output_specs[i] = plan.partition_spec(specs[i], len(graph.shape(graph.output_nodes()[i])))
        return plan, graph, out_tree

    def _state_layouts(self, init_fn, args):
        """(the train step's LogicalMesh, the core spec of each of the init's output leaves there,
        the train plan's axis order)."""
        state = jax.eval_shape(init_fn, *args)
        train_args = (state, *self.example_batch)
        if isinstance(self.train_step, Executable) or hasattr(self.train_step, "get_executable"):
            exe = train_executable(self.train_step, train_args)
            mesh, shardings, treedef = exe.plan.mesh, exe.input_shardings, exe.in_treedef.children()[0]
            order = tuple(exe.plan.axis_order)
        elif callable(self.train_step):
            plan = self.method.plan_for(self.train_step, train_args, ())
            mesh, jmesh = plan.mesh, plan.mesh.jax_mesh()
            shardings, treedef = [NamedSharding(jmesh, s) for s in plan.input_specs], jax.tree.structure(state)
            order = tuple(plan.axis_order)
        else:
            raise TypeError(f"CreateStateParallel(train_step, ...) takes a function, its ap.parallelize'd "
                            f"version or an Executable, got {type(self.train_step).__name__}")
        if treedef != jax.tree.structure(state):
            raise ShardingError(f"{fn_name(init_fn)} returns {jax.tree.structure(state)} but the train step's "
                                f"first argument (the state) is {treedef}; the init must build that state")
        return mesh, core_specs(shardings[:treedef.num_leaves], mesh), order


def _feasible(graph, ties, mesh, option, specs) -> list[bool]:
    """Per output node: whether one of its strategies (the unpinned ILP's) has that core spec."""
    problem = _core.build_sharding_problem(core_graph(graph), option.core_mesh(mesh), option.to_core(), list(ties),
                                           list(graph.donated_args))
    offsets, outs = np.asarray(problem.strategy_offsets), np.asarray(problem.out_specs)
    big = np.asarray(mesh.shape) > 1
    return [bool(np.any(np.all((outs[offsets[v]:offsets[v + 1]] == np.asarray(s))[:, big], axis=1)))
            for v, s in zip(graph.output_nodes(), specs)]

