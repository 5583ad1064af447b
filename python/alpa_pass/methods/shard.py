"""``ShardParallel``: intra-operator parallelism, one sharding plan (an ILP) over one mesh; and
the base that the presets share with it."""
from __future__ import annotations

import dataclasses
import os

import jax

from alpa_pass.driver.jit import make_plan, plan_and_compile
from alpa_pass.driver.meshes import resolve_mesh
from alpa_pass.errors import OptionError
from alpa_pass.mesh import LogicalMesh
from alpa_pass.methods.base import ParallelMethod, alpa_names
from alpa_pass.options import AutoShardingOption
from alpa_pass.pipeline.trace.accumulate import accumulating_step
from alpa_pass.plan.plan import Plan
from alpa_pass.runtime.executable import Executable


class IntraOpMethod(ParallelMethod):
    """A method whose executable is one intra-op plan: ``ShardParallel`` and the presets.

    Subclasses say what differs: :meth:`resolved_mesh`, :meth:`planning_option`,
    :meth:`pin_policy` / :meth:`pins` (forced argument layouts) and :attr:`saved_plan`.
    """

    saved_plan: Plan | None = None
    pin_uses: bool = False  # whether the ops reading a pinned argument read it as pinned too

    def resolved_mesh(self):
        raise NotImplementedError

    def planning_option(self) -> AutoShardingOption:
        """The options the planner runs with."""
        return self.option

    def pin_policy(self, mesh: LogicalMesh):
        """None, or ``policy(graph, ties, args) -> [(node, core spec)]``: layouts the method
        forces once the step is extracted (presets)."""
        return None

    def axis_order(self) -> tuple:
        """The axis order the plan must use for multi-axis dims (another plan's, whose layouts
        it shares: ``FollowParallel``); empty: the planner's own."""
        return ()

    def pins(self, graph, ties, mesh: LogicalMesh, args=None) -> list:
        """(parameter node, core spec) pins for an extracted graph; ``args`` None when its
        arguments are flat leaves (the plugin): none unless the method forces layouts."""
        return []

    def step_function(self, fn):
        """The function that is planned for the user's ``fn``: itself, or with
        ``num_micro_batches=k > 1`` the step accumulating gradients over ``k`` micro-batches."""
        k = getattr(self, "num_micro_batches", None) or 1
        return fn if k == 1 else accumulating_step(fn, self.batch_argnums, k)

    def build_executable(self, fn, args, donate_argnums) -> Executable:
        mesh = self.resolved_mesh()
        fn = self.step_function(fn)
        plan, compiled = plan_and_compile(fn, args, mesh, self.planning_option(), donate_argnums,
                                          saved=self.saved_plan, pin_policy=self._policy(mesh),
                                          pin_uses=self.pin_uses, axis_order=self.axis_order())
        return Executable(plan, compiled, jax.tree.structure(args), jax.tree.structure(compiled.output_shardings))

    def plan_for(self, fn, args, donate_argnums) -> Plan:
        mesh = self.resolved_mesh()
        fn = self.step_function(fn)
        plan, _, _ = make_plan(fn, args, mesh, self.planning_option(), saved=self.saved_plan,
                               donate_argnums=donate_argnums, pin_policy=self._policy(mesh),
                               pin_uses=self.pin_uses, axis_order=self.axis_order())
        return plan

    def _policy(self, mesh):
        return None if isinstance(mesh, tuple) else self.pin_policy(mesh)


@alpa_names("auto_sharding_option")
@dataclasses.dataclass(frozen=True)
class ShardParallel(IntraOpMethod):
    """Intra-operator parallelism: one sharding plan (an ILP) over one logical mesh.

    Attributes:
      mesh: the logical mesh; ``None`` = all of ``jax.devices()`` as a 1 x N mesh (or the saved
        plan's mesh); ``"auto"`` = plan every logical shape of ``jax.devices()`` (1xN, 2xN/2, ...,
        see ``driver.auto_mesh``) and keep the cheapest plan (``plan.mesh_search`` lists them).
      option: planner options.
      plan: a saved ``Plan`` (or the path of its ``Plan.save`` file) to apply without solving; it
        must have been made by this jax version for the same function signature and mesh
        (PlanMismatchError says what differs otherwise).
      num_micro_batches: ``None`` (or 1): the step runs as written. ``k > 1``: gradient
        accumulation as in Alpa: the step's one ``alpa_pass.value_and_grad`` / ``alpa_pass.grad``
        call runs as a ``lax.scan`` over ``k`` micro-batches (its batch inputs cut along axis 0),
        gradients and loss averaged over them, the rest of the step (the update) once
        (``pipeline.trace.accumulate``).
      batch_argnums: positions of the step's arguments that hold the batch (with
        ``num_micro_batches`` or ``option.force_batch_dim_to_mesh_dim``).
      devices, auto_sharding_option: Alpa's names of ``mesh`` (also a ``PhysicalDeviceMesh`` or
        a list of devices) and ``option``; ``method.devices`` / ``method.as_option`` read them.

    Alpa's ``option.force_data_parallel`` / ``force_zero_stage_3`` make the plan
    ``DataParallel``'s / ``Zero3Parallel``'s on the same mesh (``mesh="auto"``: 1 x N).
    """

    mesh: LogicalMesh | str | None = None
    option: AutoShardingOption = dataclasses.field(default_factory=AutoShardingOption)
    plan: object = dataclasses.field(default=None, hash=False)
    num_micro_batches: int | None = None
    batch_argnums: tuple = (1,)
    _scheme: object = dataclasses.field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self):
        if self.mesh is not None and self.mesh != "auto" and not isinstance(self.mesh, LogicalMesh):
            raise TypeError(f"ShardParallel(mesh=...) takes an alpa_pass.LogicalMesh, \"auto\" or None, "
                            f"got {self.mesh!r}")
        if not isinstance(self.option, AutoShardingOption):
            raise TypeError(f"ShardParallel(option=...) takes an AutoShardingOption, got {type(self.option).__name__}")
        if self.plan is not None:
            self._load_plan()
        if self.num_micro_batches is not None and (isinstance(self.num_micro_batches, bool) or
                                                   not isinstance(self.num_micro_batches, int) or
                                                   self.num_micro_batches < 1):
            raise ValueError(f"ShardParallel(num_micro_batches=...) takes None or an int >= 1, "
                             f"got {self.num_micro_batches!r}")
        argnums = (self.batch_argnums,) if isinstance(self.batch_argnums, int) else self.batch_argnums
        object.__setattr__(self, "batch_argnums", tuple(int(i) for i in argnums))
        if self.mesh == "auto" and self.option.force_batch_dim_to_mesh_dim is not None:
            raise OptionError("ShardParallel(mesh=\"auto\") with force_batch_dim_to_mesh_dim: the axis index "
                              "names an axis of one mesh; give mesh=LogicalMesh(...) or drop the option")
        opt = self.option
        if opt.force_data_parallel or opt.force_zero_stage_3:
            from alpa_pass.methods.presets import DataParallel, Zero3Parallel

            cls = DataParallel if opt.force_data_parallel else Zero3Parallel
            object.__setattr__(self, "_scheme", cls(
                mesh=self.mesh if isinstance(self.mesh, LogicalMesh) else None, batch_argnums=self.batch_argnums,
                option=dataclasses.replace(opt, force_data_parallel=False, force_zero_stage_3=False)))

    def scheme(self):
        """The preset that Alpa's ``force_data_parallel`` / ``force_zero_stage_3`` name, or None."""
        return self._scheme

    def planning_option(self) -> AutoShardingOption:
        scheme = self.scheme()
        return self.option if scheme is None else scheme.planning_option()

    def pin_policy(self, mesh: LogicalMesh):
        scheme = self.scheme()
        if scheme is not None:
            return scheme.pin_policy(mesh)
        axis = self.option.force_batch_dim_to_mesh_dim
        if axis is None:
            return None
        from alpa_pass.methods.presets import batch_axis_pins

        return lambda graph, ties, args: batch_axis_pins(graph, mesh, args, self.batch_argnums, axis)

    def resolved_mesh(self):
        """The LogicalMesh to plan for, or with ``mesh="auto"`` the tuple of candidate meshes."""
        if self._scheme is not None:
            return self._scheme.resolved_mesh()
        return resolve_mesh(self.mesh, None if self.plan is None else self.plan.mesh)

    def _load_plan(self):
        if isinstance(self.plan, (str, os.PathLike)):
            object.__setattr__(self, "plan", Plan.load(os.path.expanduser(os.fspath(self.plan))))
        elif not isinstance(self.plan, Plan):
            raise TypeError(f"ShardParallel(plan=...) takes a Plan or the path of a saved plan, "
                            f"got {type(self.plan).__name__}")
        if self.mesh == "auto":
            raise ValueError("ShardParallel(plan=..., mesh=\"auto\"): a saved plan fixes its mesh; "
                             "drop mesh= (the plan's mesh is used) or drop plan= to search meshes")

    @property
    def saved_plan(self) -> Plan | None:
        return self.plan
