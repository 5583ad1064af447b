"""Options and parallelization methods: frozen dataclasses, validated on construction."""
from __future__ import annotations

import dataclasses
import os

from alpa_pass.mesh import LogicalMesh


@dataclasses.dataclass(frozen=True)
class AutoShardingOption:
    """How the intra-operator (sharding) planner searches and solves.

    Attributes:
      allow_replicated_heavy_ops: let dots/convolutions run replicated on a mesh axis (Alpa forbids
        it: replicated heavy compute wastes the devices; off by default).
      compute_cost_per_flop: weight of per-device FLOPs in the objective, in the units of the mesh's
        alpha/beta (a tie-breaker by default).
      memory_cost_per_byte: weight of each argument's per-device bytes in the objective (a
        tie-breaker towards split arguments, e.g. the batch of a data-parallel step).
      memory_budget_per_device: bytes; the plan's predicted per-device peak (live arguments,
        optimizer state and materialised activations over the program, see docs/core_api.md
        "Memory") must stay under it; ``None`` = no budget. A budget no plan meets raises
        InfeasibleError naming the smallest budget the planner estimates feasible.
      merge_followers: merge elementwise/transpose/reduce ops into the op they follow (smaller ILP).
      replicate_below_numel: tensors with at most this many elements are computed replicated.
      solver_time_limit_s: HiGHS time limit; the best plan found by then is used (the gap is reported).
      solver_rel_gap: HiGHS relative MIP gap at which to stop.
      solver_threads: HiGHS threads (1 keeps results deterministic).
      solver_log: print HiGHS's log to the terminal.
      solver_objective_bound: stop a solve as soon as HiGHS proves no plan beats this objective
        (SolverError "cannot beat"); the mesh search sets it to the best objective found so far.
      emit: "all" constrains every planned value in the module; "anchors" only dots, convolutions,
        reduces and gathers/scatters (XLA propagates the rest).
      tie_outputs_to_inputs: an output leaf whose pytree position matches an input leaf of the same
        shape (e.g. the new ``state`` of ``train_step(state, batch)``) gets the same sharding, so
        feeding outputs back in needs no resharding.
      plan_cache_dir: directory of the on-disk plan cache (``None``: no cache). A plan is stored
        under a hash of (function's StableHLO fingerprint, mesh, planning options, versions); the
        next process planning the same step skips the solver (``plan.origin == "cache"``).
      show_progress: a status line (stage, ILP size, elapsed) on stderr while planning; ``None``
        = only when stderr is a terminal and planning takes over ~2 s.
      tie_repeated_layers: solve repeated layers once: nodes at the same place of structurally
        repeated blocks (the layers a Python loop unrolls into) share one ILP choice, so L identical
        layers do not make an L-times larger ILP (``ShardingProblem.repeat_stats`` says what was tied).
      prefer_reduce_scatter: weight-update sharding: where the plan all-reduces a partial sum
        that reaches the step's outputs elementwise (parameter gradients of dots, sum-reduces and
        embedding scatter-adds, also in mixed data x model plans), emit an explicit reduce-scatter
        over the summed mesh axes (``emit/reduce_scatter.py``, ``emit/partial_sums.py``) instead
        of XLA's all-reduce. Activation partial sums stay all-reduces (their users need them whole).
      refine_unmerged: after the merged solve (``merge_followers``), solve the unmerged ILP
        warm-started from the merged plan and keep it when cheaper (``plan/refine.py``; never worse,
        ``plan.refinement`` records both objectives). True: always (the best incumbent within
        ``solver_time_limit_s``); False: never; "auto": when the unmerged ILP has at most
        ``plan.refine.REFINE_MAX_COLUMNS`` columns, keeping the result only when HiGHS proves it
        optimal within ``plan.refine.REFINE_TIME_LIMIT_S`` (so the plan never depends on timing).
    """

    allow_replicated_heavy_ops: bool = False
    compute_cost_per_flop: float = 1e-9
    memory_cost_per_byte: float = 1e-9
    memory_budget_per_device: int | None = None
    merge_followers: bool = True
    replicate_below_numel: int = 1
    solver_time_limit_s: float = 60.0
    solver_rel_gap: float = 1e-4
    solver_threads: int = 1
    solver_log: bool = False
    solver_objective_bound: float | None = None
    emit: str = "all"
    tie_outputs_to_inputs: bool = True
    plan_cache_dir: str | None = None
    show_progress: bool | None = None
    tie_repeated_layers: bool = True
    prefer_reduce_scatter: bool = False
    refine_unmerged: bool | str = "auto"

    def __post_init__(self):
        if not (isinstance(self.refine_unmerged, bool) or self.refine_unmerged == "auto"):
            raise ValueError(f"AutoShardingOption.refine_unmerged must be True, False or 'auto', "
                             f"got {self.refine_unmerged!r}")
        if self.emit not in ("all", "anchors"):
            raise ValueError(f"AutoShardingOption.emit must be 'all' or 'anchors', got {self.emit!r}")
        if self.solver_time_limit_s <= 0:
            raise ValueError(f"AutoShardingOption.solver_time_limit_s must be > 0, got {self.solver_time_limit_s}")
        if not 0 <= self.solver_rel_gap < 1:
            raise ValueError(f"AutoShardingOption.solver_rel_gap must be in [0, 1), got {self.solver_rel_gap}")
        if self.compute_cost_per_flop < 0 or self.memory_cost_per_byte < 0:
            raise ValueError("AutoShardingOption.compute_cost_per_flop and memory_cost_per_byte must be >= 0")
        if self.replicate_below_numel < 0:
            raise ValueError("AutoShardingOption.replicate_below_numel must be >= 0")
        if self.solver_threads < 1:
            raise ValueError("AutoShardingOption.solver_threads must be >= 1")
        if self.memory_budget_per_device is not None and not self.memory_budget_per_device > 0:
            raise ValueError(f"AutoShardingOption.memory_budget_per_device must be > 0 bytes or None, "
                             f"got {self.memory_budget_per_device!r}")
        if self.plan_cache_dir is not None:
            object.__setattr__(self, "plan_cache_dir", os.fspath(self.plan_cache_dir))
        if self.show_progress not in (None, True, False):
            raise ValueError(f"AutoShardingOption.show_progress must be None, True or False, got {self.show_progress!r}")

    def to_core(self):
        from alpa_pass import _core

        opts = _core.CoreOptions()
        opts.allow_replicated_heavy_ops = self.allow_replicated_heavy_ops
        opts.compute_cost_per_flop = self.compute_cost_per_flop
        opts.memory_cost_per_byte = self.memory_cost_per_byte
        opts.memory_budget_per_device = float(self.memory_budget_per_device or 0)
        opts.merge_followers = self.merge_followers
        opts.replicate_below_numel = self.replicate_below_numel
        opts.tie_repeated_layers = self.tie_repeated_layers
        return opts


class ParallelMethod:
    """Base of the methods ``parallelize`` accepts."""


@dataclasses.dataclass(frozen=True)
class ShardParallel(ParallelMethod):
    """Intra-operator parallelism: one sharding plan (an ILP) over one logical mesh.

    Attributes:
      mesh: the logical mesh; ``None`` = all of ``jax.devices()`` as a 1 x N mesh (or the saved
        plan's mesh); ``"auto"`` = plan every logical shape of ``jax.devices()`` (1xN, 2xN/2, ...,
        see ``plan.auto_mesh``) and keep the cheapest plan (``plan.mesh_search`` lists them).
      option: planner options.
      plan: a saved ``Plan`` (or the path of its ``Plan.save`` file) to apply without solving; it
        must have been made by this jax version for the same function signature and mesh
        (PlanMismatchError says what differs otherwise).
    """

    mesh: LogicalMesh | str | None = None
    option: AutoShardingOption = dataclasses.field(default_factory=AutoShardingOption)
    plan: object = dataclasses.field(default=None, hash=False)

    def __post_init__(self):
        if self.mesh is not None and self.mesh != "auto" and not isinstance(self.mesh, LogicalMesh):
            raise TypeError(f"ShardParallel(mesh=...) takes an alpa_pass.LogicalMesh, \"auto\" or None, "
                            f"got {self.mesh!r}")
        if not isinstance(self.option, AutoShardingOption):
            raise TypeError(f"ShardParallel(option=...) takes an AutoShardingOption, got {type(self.option).__name__}")
        if self.plan is not None:
            self._load_plan()

    def _load_plan(self):
        from alpa_pass.plan.plan import Plan

        if isinstance(self.plan, (str, os.PathLike)):
            object.__setattr__(self, "plan", Plan.load(self.plan))
        elif not isinstance(self.plan, Plan):
            raise TypeError(f"ShardParallel(plan=...) takes a Plan or the path of a saved plan, "
                            f"got {type(self.plan).__name__}")
        if self.mesh == "auto":
            raise ValueError("ShardParallel(plan=..., mesh=\"auto\"): a saved plan fixes its mesh; "
                             "drop mesh= (the plan's mesh is used) or drop plan= to search meshes")

    def resolved_mesh(self):
        """The LogicalMesh to plan for, or with ``mesh="auto"`` the tuple of candidate meshes."""
        if self.mesh == "auto":
            import jax

            from alpa_pass.plan.auto_mesh import candidate_meshes

            return candidate_meshes(len(jax.devices()))
        if self.mesh is not None:
            return self.mesh
        if self.plan is not None:
            return self.plan.mesh
        import jax

        return LogicalMesh(shape=(1, len(jax.devices())))
