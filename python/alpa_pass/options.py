"""Planner options: a frozen dataclass, validated on construction, that owns its conversions
(to the C++ core's options, to the solver's options, and the fields that key saved plans).

The parallel methods that take it (``ShardParallel``, the presets, ``PipeshardParallel``) live in
``alpa_pass.methods``.
"""
from __future__ import annotations

import dataclasses
import os
import warnings

from alpa_pass import _core, _sizes, cost_profile
from alpa_pass.errors import OptionError
from alpa_pass.solve.highs import SolveOptions

# Field metadata: a field marked ``_SHOWN_ONLY`` changes how a plan is shown, emitted or looked
# up, not what is planned; it is neither recorded in ``Plan.made_with`` nor part of a cache key.
_SHOWN_ONLY = {"planning": False}
# Alpa's defaults of its combiner thresholds (bytes)
ALPA_ALL_REDUCE_THRESHOLD = 1 << 60
ALPA_ZERO3_ALL_GATHER_THRESHOLD = 1 << 25


@dataclasses.dataclass(frozen=True)
class AutoShardingOption:
    """How the intra-operator (sharding) planner searches and solves.

    Attributes:
      allow_replicated_heavy_ops: let dots/convolutions run replicated on a mesh axis (Alpa forbids
        it: replicated heavy compute wastes the devices; off by default).
      allow_mixed_mesh_shape: let one tensor dim be split over several mesh axes of size > 1 (e.g.
        a batch over both axes of a 2-D mesh). Alpa's option of that name is off by default; here
        it is on. Off, Alpa's 2x2 MLP (batch on x, Megatron on y) all-reduces its activations as
        Alpa's test expects; on, it trades them for all-to-alls and all-gathers the alpha-beta model
        prices ~10% lower.
      compute_cost_per_flop: weight of per-device FLOPs in the objective, in the units of the mesh's
        alpha/beta (default 1e-4: with beta 1 per byte, 1e4 FLOPs cost as much as one byte sent,
        between what an H100 computes while NVLink (~2e3) and InfiniBand (~2e4) move a byte). Plans
        of equal communication then differ by their compute, and large work that would otherwise
        run replicated on every device to save a small all-reduce (a [N, K, D] broadcast of
        distances, RNG over a [B, K, V] tensor) is split. A measured profile replaces it.
      memory_cost_per_byte: weight of each argument's per-device bytes in the objective (a
        tie-breaker towards split arguments, e.g. the batch of a data-parallel step).
      memory_budget_per_device: bytes (an int, or a size such as ``"16GiB"`` or ``"512MB"``,
        stored as its int); the plan's predicted per-device peak (live arguments,
        optimizer state and materialised activations over the program, see docs/core_api.md
        "Memory") must stay under it; ``None`` = no budget. A budget no plan meets raises
        InfeasibleError naming the smallest budget the planner estimates feasible.
      merge_followers: merge elementwise/transpose/reduce ops into the op they follow (smaller ILP).
      replicate_below_numel: tensors with at most this many elements are computed replicated.
      solver_time_limit_s: a wall-clock limit (seconds) on each HiGHS solve, opt-in (``None``, the
        default: no limit). A plan is a function of (program, mesh, options, versions) only when
        no solve hits it: a solve stopped by the clock keeps its best plan so far, which depends on
        machine speed and load (``plan.solver_status == "Time limit reached"``, a warning; the
        processes of a ``mpirun`` job may then diverge: ``PlanDivergedError``).
      solver_node_limit: the deterministic bound on each HiGHS solve: branch-and-bound nodes
        (HiGHS ``mip_max_nodes``). A solve stopped by it keeps its best plan (``plan.mip_gap``
        says how far from optimal it may be; status "Solution limit reached"), the same plan on
        any machine; ``None``: no limit. Every ILP of the test suite and the benchmarks solves
        to optimality well under the default.
      solver_rel_gap: HiGHS relative MIP gap at which to stop.
      solver_support_gap: for each solve with memory-budget rows: solve the LP relaxation, then
        the ILP restricted to the strategies the LP uses and, if that plan is not within this
        relative gap of the LP bound, the ILP with the groups the LP decides fixed (the others
        free) until a plan is; a plan within the gap is kept (``plan.mip_gap`` says the gap;
        ``plan.solver_status`` "LP-support plan"), else it starts the full solve. Deterministic.
        ``None``: always the full solve (which, on a large model with a binding budget, may take
        an hour within the node limit). While the plan's reshard copies are still being counted
        (``driver.budget.fit_reshard_copies``) each round keeps the restricted plan as a draft;
        only the plan that fits with its copies is finished to this gap, and the finished plan
        replaces it when cheaper and within the budget with its own copies, else the draft stays
        with its gap (``driver.budget.finish_draft``; LLaMA-8B 8x8 at 35 GiB, bench_budget.py: 3 LP
        solves and 2 RENS -> 2 and 1, the budgeted solve 61-76 s -> 30-44 s over four runs each on
        a noisy 2-core VM, objective 3.885e10 -> 3.833e10). See
        ``solve.highs.SolveOptions.support_gap``.
      solver_threads: HiGHS threads (1, the default, keeps results deterministic: HiGHS then runs
        with a fixed random seed on one thread; more threads may change which optimum is returned).
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
        warm-started from the merged plan and keep it when cheaper (``driver/refine.py``; never
        worse, ``plan.refinement`` records both objectives). True: always; False: never; "auto":
        when the unmerged ILP has at most ``driver.refine.REFINE_MAX_COLUMNS`` columns (2M), its LP
        relaxation (LP-support path) needs at most ``driver.refine.REFINE_LP_ITERATIONS`` simplex
        iterations (a deterministic bound on the work; the same on any machine) and no memory
        budget binds (a memory row keeps its groups from being eliminated, so the unmerged chains
        stay: minutes on GPT-175B at 80 GiB; under a budget the rows are added as plans break them,
        from those the merged plan nearly fills). The solve
        stops at ``refine_node_limit`` branch-and-bound nodes (the same plan on any machine); one
        stopped first by an opt-in ``solver_time_limit_s`` is discarded on "auto" and kept (its
        incumbent, ``plan.refinement["time_limited"]``) when forced.
      refine_node_limit: branch-and-bound nodes of the refinement solve (a deterministic bound).
      device_memory_fraction: with ``memory_budget_per_device=None``, plans on GPU/TPU devices get
        this fraction of the device's memory (``memory_stats()["bytes_limit"]``) as their budget
        (``driver.budget.resolve_budget``; ``plan.memory_budget`` says which budget was used);
        ``None``: no budget unless one is given. CPU devices get no budget unless one is given.
      profile: a measured cluster profile to plan with (``alpa-pass profile`` writes one): a path
        to its JSON (read when the option is made), its dict, or ``"auto"`` (the default) = the
        cached profile of the cluster planned on (``~/.cache/alpa_pass/profiles/<cluster key>.json``,
        what ``alpa-pass profile`` writes by default; read when a plan is requested; in a job of
        several processes, process 0's; none there: unit costs). With a profile each mesh axis
        costs the measured alpha/beta (the LogicalMesh's alpha/beta are not used),
        ``compute_cost_per_flop`` is the measured seconds per float32 FLOP (bfloat16/float16 dots
        and convolutions: per bfloat16 FLOP), each dot or convolution costs at least its bytes
        moved over the measured memory bandwidth (a roofline:
        ``_core.CoreOptions.compute_cost_per_byte``), ``memory_cost_per_byte`` is
        scaled by the profile's median beta, and the objective is in seconds. The profile's
        content is part of the plan's fingerprint. ``None``: unit alpha/beta, as given, even where
        a profile is cached.
      peel_layer_scans: lower the function with the last iteration of each scanned layer stack's
        backward loop (layer 0's backward) run outside the loop (``trace/scan_peel.py``): a
        loop-carried value has one layout, so without this the loop hands the activation gradient
        to the embedding gradient in the loop's layout (all-gathered in its last iteration too);
        peeled, layer 0 gets its own layouts as an unrolled twin's does (the GPT test: objective
        1.022 -> 0.999 of its twin on 1x8). A layer stack's backward loop is a top-level reverse
        ``scan`` of at least 3 iterations over a floating-point argument as passed (stacked
        parameters); forward scans (gradient accumulation, fori_loop) are never rewritten. Same
        ops, same numerics; the cost is one more copy of that loop body in the module, the ILP and
        XLA's compile (constant in the layer count).

    Alpa's option names, so that a script written for Alpa runs unchanged (README "Coming from
    Alpa"):
      allow_all_gather / allow_all_to_all: ``False`` prices every all-gather (all-to-all) over an
        axis of size > 1 at 1e13, as Alpa's ``INFINITY_COST``: the plan reshards without them
        wherever a layout allows (``_core.Mesh.all_gather_forbidden``). One it cannot avoid stays,
        and ``plan.objective`` shows its price.
      force_batch_dim_to_mesh_dim: the batch arguments (``ShardParallel.batch_argnums``) are split
        on dim 0 over this mesh axis and replicated over the others, and, as in Alpa, every dot
        and convolution whose result has a batch dim (followed from the batch's dim 0) splits it
        over this axis (a size-1 axis: no restriction); the planner decides the rest.
        ``None``: the planner decides the batch too (Alpa, given ``None`` on a 2-D mesh, forces
        axis 0). Not for pipeline stages (OptionError).
      force_data_parallel: plan as ``DataParallel`` (batch over all devices, parameters and
        optimizer state replicated). ``force_zero_stage_3``: plan as ``Zero3Parallel``.
      allow_recompute_heavy_op: Alpa's name of ``allow_replicated_heavy_ops`` (``None``: that field).
      enable_auto_sharding (must be True), allow_replicated_parameters (must be True: replicated
        parameters are a choice of the planner; ``Zero3Parallel`` shards them all),
        force_simple_heuristic (must be ""): OptionError otherwise, saying what to use instead.
      all_reduce_threshold, force_zero_stage_3_all_gather_threshold: sizes of XLA's collective
        combiners in Alpa's fork; stock XLA takes them from ``XLA_FLAGS`` (e.g.
        ``--xla_gpu_all_reduce_combine_threshold_bytes``): a value other than Alpa's default
        warns that it is not used, and planning goes on.
    """

    allow_replicated_heavy_ops: bool = False
    allow_mixed_mesh_shape: bool = True
    compute_cost_per_flop: float = 1e-4
    memory_cost_per_byte: float = 1e-9
    memory_budget_per_device: int | None = None
    merge_followers: bool = True
    replicate_below_numel: int = 1
    solver_time_limit_s: float | None = None
    solver_node_limit: int | None = 10_000
    solver_rel_gap: float = 1e-4
    solver_support_gap: float | None = 0.1
    solver_threads: int = 1
    solver_log: bool = dataclasses.field(default=False, metadata=_SHOWN_ONLY)
    solver_objective_bound: float | None = dataclasses.field(default=None, metadata=_SHOWN_ONLY)
    emit: str = dataclasses.field(default="all", metadata=_SHOWN_ONLY)
    tie_outputs_to_inputs: bool = True
    plan_cache_dir: str | None = dataclasses.field(default=None, metadata=_SHOWN_ONLY)
    show_progress: bool | None = dataclasses.field(default=None, metadata=_SHOWN_ONLY)
    tie_repeated_layers: bool = True
    prefer_reduce_scatter: bool = False
    refine_unmerged: bool | str = "auto"
    refine_node_limit: int = 1000
    device_memory_fraction: float | None = dataclasses.field(default=0.9, metadata=_SHOWN_ONLY)
    profile: "str | dict | cost_profile.ClusterProfile | None" = "auto"
    peel_layer_scans: bool = True
    # Alpa's names (see the docstring)
    allow_all_gather: bool = True
    allow_all_to_all: bool = True
    force_batch_dim_to_mesh_dim: int | None = None
    force_data_parallel: bool = False
    force_zero_stage_3: bool = False
    allow_recompute_heavy_op: bool | None = dataclasses.field(default=None, metadata=_SHOWN_ONLY)
    enable_auto_sharding: bool = dataclasses.field(default=True, metadata=_SHOWN_ONLY)
    allow_replicated_parameters: bool = dataclasses.field(default=True, metadata=_SHOWN_ONLY)
    force_simple_heuristic: str = dataclasses.field(default="", metadata=_SHOWN_ONLY)
    all_reduce_threshold: int = dataclasses.field(default=ALPA_ALL_REDUCE_THRESHOLD, metadata=_SHOWN_ONLY)
    force_zero_stage_3_all_gather_threshold: int = dataclasses.field(default=ALPA_ZERO3_ALL_GATHER_THRESHOLD,
                                                                     metadata=_SHOWN_ONLY)

    def __post_init__(self):
        self._check_alpa_names()
        object.__setattr__(self, "profile", cost_profile.normalize(self.profile))
        if isinstance(self.memory_budget_per_device, str):
            object.__setattr__(self, "memory_budget_per_device", _sizes.parse_bytes(
                self.memory_budget_per_device, "AutoShardingOption.memory_budget_per_device", OptionError))
        if not (isinstance(self.refine_unmerged, bool) or self.refine_unmerged == "auto"):
            raise OptionError(f"AutoShardingOption.refine_unmerged must be True, False or 'auto', "
                             f"got {self.refine_unmerged!r}")
        if self.emit not in ("all", "anchors"):
            raise OptionError(f"AutoShardingOption.emit must be 'all' or 'anchors', got {self.emit!r}")
        if self.solver_time_limit_s is not None and not self.solver_time_limit_s > 0:
            raise OptionError(f"AutoShardingOption.solver_time_limit_s must be > 0 or None (no wall-clock "
                              f"limit), got {self.solver_time_limit_s}")
        if self.solver_node_limit is not None and (isinstance(self.solver_node_limit, bool) or
                                                   not isinstance(self.solver_node_limit, int) or
                                                   self.solver_node_limit < 1):
            raise OptionError(f"AutoShardingOption.solver_node_limit must be an int >= 1 or None, "
                              f"got {self.solver_node_limit!r}")
        if self.solver_support_gap is not None and not 0 <= self.solver_support_gap < 1:
            raise OptionError(f"AutoShardingOption.solver_support_gap must be in [0, 1) or None, "
                              f"got {self.solver_support_gap!r}")
        if not 0 <= self.solver_rel_gap < 1:
            raise OptionError(f"AutoShardingOption.solver_rel_gap must be in [0, 1), got {self.solver_rel_gap}")
        if self.compute_cost_per_flop < 0 or self.memory_cost_per_byte < 0:
            raise OptionError("AutoShardingOption.compute_cost_per_flop and memory_cost_per_byte must be >= 0")
        if self.replicate_below_numel < 0:
            raise OptionError("AutoShardingOption.replicate_below_numel must be >= 0")
        if self.refine_node_limit < 0:
            raise OptionError(f"AutoShardingOption.refine_node_limit must be >= 0, got {self.refine_node_limit}")
        if self.device_memory_fraction is not None and not 0 < self.device_memory_fraction <= 1:
            raise OptionError(f"AutoShardingOption.device_memory_fraction must be in (0, 1] or None, "
                              f"got {self.device_memory_fraction!r}")
        if self.solver_threads < 1:
            raise OptionError("AutoShardingOption.solver_threads must be >= 1")
        budget = self.memory_budget_per_device
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                   or not budget > 0):
            raise OptionError(f"AutoShardingOption.memory_budget_per_device must be a number of bytes > 0, "
                              f"a size such as '16GiB', or None; got {budget!r}")
        if self.plan_cache_dir is not None:
            object.__setattr__(self, "plan_cache_dir", os.path.expanduser(os.fspath(self.plan_cache_dir)))
        if self.show_progress not in (None, True, False):
            raise OptionError(f"AutoShardingOption.show_progress must be None, True or False, got {self.show_progress!r}")

    def _check_alpa_names(self):
        """Fold and check the fields named as in Alpa's ``AutoShardingOption``."""
        if self.allow_recompute_heavy_op is not None:
            object.__setattr__(self, "allow_replicated_heavy_ops", bool(self.allow_recompute_heavy_op))
            object.__setattr__(self, "allow_recompute_heavy_op", None)
        if not self.enable_auto_sharding:
            raise OptionError("AutoShardingOption(enable_auto_sharding=False): alpa_pass always plans; for "
                              "XLA's own sharding propagation call jax.jit with in_shardings instead")
        if not self.allow_replicated_parameters:
            raise OptionError("AutoShardingOption(allow_replicated_parameters=False) is not supported: "
                              "use method=Zero3Parallel() to shard every parameter")
        if self.force_simple_heuristic:
            raise OptionError(f"AutoShardingOption(force_simple_heuristic={self.force_simple_heuristic!r}) "
                              f"is not supported: use method=DataParallel(), Zero2Parallel() or "
                              f"Zero3Parallel() for a fixed scheme")
        dim = self.force_batch_dim_to_mesh_dim
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 0):
            raise OptionError(f"AutoShardingOption.force_batch_dim_to_mesh_dim must be a mesh axis index "
                              f"(int >= 0) or None, got {dim!r}")
        if self.force_data_parallel and self.force_zero_stage_3:
            raise OptionError("AutoShardingOption: force_data_parallel and force_zero_stage_3 are two "
                              "different schemes; set one")
        for name, default, flag in (
                ("all_reduce_threshold", ALPA_ALL_REDUCE_THRESHOLD, "all_reduce_combine_threshold_bytes"),
                ("force_zero_stage_3_all_gather_threshold", ALPA_ZERO3_ALL_GATHER_THRESHOLD,
                 "all_gather_combine_threshold_bytes")):
            if getattr(self, name) != default:
                warnings.warn(f"AutoShardingOption.{name} is not used: stock XLA sizes its combiner from "
                              f"XLA_FLAGS (--xla_gpu_{flag}=N on GPU)", UserWarning, stacklevel=4)

    def to_core(self) -> "_core.CoreOptions":
        """The C++ core's view of the options that shape the ILP."""
        opts = _core.CoreOptions()
        opts.allow_replicated_heavy_ops = self.allow_replicated_heavy_ops
        opts.allow_mixed_mesh_shape = self.allow_mixed_mesh_shape
        opts.compute_cost_per_flop = self.compute_cost_per_flop
        opts.memory_cost_per_byte = self.memory_cost_per_byte
        profile = cost_profile.resolve(self.profile)
        if profile is not None:  # objective in seconds: measured compute, the tie-breaker rescaled
            opts.compute_cost_per_flop = profile.seconds_per_flop
            opts.compute_cost_per_flop_half = profile.seconds_per_flop_half
            opts.compute_cost_per_byte = profile.seconds_per_byte
            opts.memory_cost_per_byte = self.memory_cost_per_byte * profile.reference_beta
        opts.memory_budget_per_device = float(self.memory_budget_per_device or 0)
        opts.merge_followers = self.merge_followers
        opts.replicate_below_numel = self.replicate_below_numel
        opts.tie_repeated_layers = self.tie_repeated_layers
        return opts

    def core_mesh(self, mesh, axis_order=()) -> "_core.Mesh":
        """The C++ core's view of LogicalMesh ``mesh`` under these options: the profile's
        measured alpha/beta per axis when one is set, else the mesh's own; ``axis_order``: the
        plan's (axis names, most major first; empty: mesh order)."""
        profile = cost_profile.resolve(self.profile)
        core = mesh.to_core(axis_order) if profile is None else profile.core_mesh(mesh, axis_order)
        core.all_gather_forbidden = not self.allow_all_gather
        core.all_to_all_forbidden = not self.allow_all_to_all
        return core

    def solve_options(self) -> SolveOptions:
        """HiGHS options of a solve under these options.

        Every solve, the main one, the unmerged refinement and each budgeted round (its memory
        rows kept: groups they name are not eliminated and lose only strategies that are no
        larger in them), solves the exact reduction of its ILP (``eliminate_chains``,
        ``solve/eliminate.py``): the same optimum, plans expanded back. (It was off for main
        solves while collectives over several mesh axes were charged as one per axis: among the
        then equal-cost plans it picked some that compiled to collective-permutes;
        test_plan_fidelity checks there are none.)"""
        return SolveOptions(time_limit_s=self.solver_time_limit_s, node_limit=self.solver_node_limit,
                            rel_gap=self.solver_rel_gap, threads=self.solver_threads,
                            log_to_console=self.solver_log, objective_bound=self.solver_objective_bound,
                            eliminate_chains=True, support_gap=self.solver_support_gap)

    def planning_fields(self) -> dict:
        """The fields that change what is planned, as a JSON-ready dict (``Plan.made_with``
        records them; the plan cache keys on them)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.metadata.get("planning", True)}
        if fields["profile"] == "auto":  # the profile it stands for now (requests resolve it once)
            fields["profile"] = cost_profile.resolve("auto")
        if isinstance(fields["profile"], cost_profile.ClusterProfile):  # its key and content digest
            fields["profile"] = str(fields["profile"])
        return fields
