"""Unmerged refinement: re-solve a merged-follower plan in the unmerged ILP, warm-started.

Merging followers (``AutoShardingOption.merge_followers``) makes an elementwise, transpose, reduce
or reshape op take its leader's strategy: a much smaller ILP, but some plans are out of reach
(e.g. a ZeRO-3 layout whose parameter-update ops are sharded unlike the dots they follow). Every
merged plan is a plan of the unmerged ILP with the same objective: each node's chosen strategy
(output spec and operand specs) exists among the node's unmerged strategies with the same cost.
So the merged optimum, expanded to the unmerged variables, is a feasible start for the unmerged
ILP, and its solve (under a node limit) can only improve on it.

With ``tie_repeated_layers`` the unmerged problem ties its repeated layers too; the expanded start
respects those ties when every copy of a tied unmerged group got the same strategy. When it does
not (the merged ties cover other copies than the unmerged ones), refinement solves the unmerged
problem untied instead (``Plan.refinement["untied"]``), where every expansion is feasible. Refinement needs ``merge_followers=True``
(otherwise the first solve already was unmerged).
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from alpa_pass import _core
from alpa_pass.errors import InfeasibleError, SolverError
from alpa_pass.driver.budget import HINT_ROW_FRACTION, solve_within_budget
from alpa_pass.solve.highs import SolveOptions
from alpa_pass.solve.support import LpWorkLimitError

log = logging.getLogger("alpa_pass")

# "auto" refines when the unmerged ILP has at most this many columns. Measured on the 2-core CI
# machine (docs in the refine test / report): the unmerged MoE test model (78k columns) solves
# exactly in ~1.6 s, the 2-layer test GPT (257k columns) in ~12 s. Large GPTs with tied layers
# mostly stay merged-only: their merged plan breaks the unmerged ties and the untied ILP has
# millions of columns. GPT-175B on 16x16 does not (s30): its tied unmerged ILP has 158,540 columns
# (82,020 after the exact reduction); refined in 101-106 s of a 140 s wall (35 s merged-only), 7.1%
# cheaper, nearly all of it HiGHS's root cut rounds (its root LP: 18 s beside another job). So a
# refinement whose reduced ILP has more than REFINE_SUPPORT_COLUMNS columns takes the LP-support
# path (``SolveOptions.start_support_columns``): the LP, then the MIP over the LP's support and the
# merged plan's strategies, warm-started from it, kept when it is within ``solver_support_gap`` of
# the LP bound (else the full MIP runs, from it); on that 175B ILP 8 + 1.1 s instead of 100-190 s,
# +0.46% on the full MIP's objective; 175B unbudgeted plans in 42.5 s wall (refinement 8.2 s).
# Below it the full MIP: exact, and where several plans tie (to 1e-9) it is the one the tests pin
# (a 2x2 MLP's Megatron layers, the top-2 MoE 2x4's all-to-all dispatch without a
# collective-permute); the LP-support path picks another of the tied plans there. Measured (reduced
# columns: full MIP / LP-support): 2x2 MLP 5,145: 0.20 / 0.08 s; top-2 MoE 2x4 28,071: 0.31 / 0.62 s;
# a 3-layer Haiku model (MultiHeadAttention, BatchNorm, dropout; tests/scripts/train_haiku.py) on
# 2x4 45,945: 14.5 s (22-36 s beside other jobs) / 0.66 s, 706,838 vs 706,841 (LP gap 1.45%);
# 1-layer GPT 2x4 59,902: 1.05 / 1.08 s, equal. (Was 50,000: the Haiku model planned in 22.7 s.)
REFINE_SUPPORT_COLUMNS = 40_000
# "auto" refines up to REFINE_MAX_COLUMNS unmerged columns (a bound on building the ILP), and gives
# up when the LP-support path's LP relaxation needs more than REFINE_LP_ITERATIONS simplex iterations
# (a deterministic bound on the solve's work: the same plan on any machine and under any load).
# Until session 48 the cap was 200k columns, which did not predict the cost. Measured on the 2-core
# host (quiet; unmerged columns, refinement LP iterations, LP time, objective merged -> refined):
# the 2-layer test GPT 2x4 262k, 14.0k it, 1.4 s, -6.2%; GPT-1.3B 1x4 242k, 28.5k, 1.1 s, -0.3%;
# GPT-6.7B 2x8 381k, 30.3k, 7 s, -1.7%; GPT-39B 8x8 381k, 74.8k, 92 s, -0.5% (its iterations grow
# dearer: stopped at 20k it takes 1.6 s, 25k 3.0 s, 32k 6.7 s, 40k 15 s); a learned-optimizer meta
# step 2x4 535k, 22.7k, 5 s, -87%. Probe scripts above 200k (session 47): median -5%, GAN +
# spectral norm -42.5%, wav2vec CTC -22%, ragged MoE -19%,
# EfficientNet -17%, each +1.3-5 s of planning; a flax LM with a tied 8192-row table 2x4 322k,
# -26.0%, compiled collectives 2.57 -> 1.65 MB per device (tests/integration/test_plugin.py).
# Not refined: the unrolled twin of the scanned flax_remat GPT on 2x4 (untied, 609k columns: its LP
# needs over 32k iterations) while the scan refines (324k, -7.7%).
REFINE_MAX_COLUMNS = 2_000_000
REFINE_LP_ITERATIONS = 32_000
# A refinement solve is bounded by branch-and-bound nodes (``AutoShardingOption.refine_node_limit``),
# not by time, so that its result is the same on every machine and under any load (every process
# of a multi-process job plans on its own and must get the same plan). A wall-clock limit is opt-in
# (``solver_time_limit_s``, default None): an "auto" refinement stopped by it is discarded (with a
# warning), a forced one (``refine_unmerged=True``) keeps its incumbent and says so.
_REL_TOL = 1e-6


def refine_unmerged(build, problem, solution, option, num_nodes: int, where: str = ""):
    """Re-solve ``solution`` (of the merged ``problem``) in the unmerged ILP when ``option`` asks.

    Args:
      build: ``build(option) -> _core.ShardingProblem``, the same graph, mesh, ties, donations and
        pins as ``problem`` (called with ``merge_followers=False``).
      problem, solution: the merged ShardingProblem and its ``solve.highs.Solution``.
      option: the AutoShardingOption (``refine_unmerged``: True, False or "auto").
      num_nodes: graph nodes (both problems index the same nodes).
      where: the mesh, for log and error messages (e.g. "2x4").
    Returns (problem, solution, record): the unmerged problem and solution when they are strictly
    cheaper, else the inputs; ``record`` is ``Plan.refinement`` ({"solve": "merged"|"unmerged",
    "merged_objective"; "unmerged_columns" and "time_s" (build + solve) once the unmerged ILP was
    built; "unmerged_objective" and "unmerged_status" when it was solved; "gathered_on_edges" when
    the start moved in-op gathers onto edges (``expand_assignment``); "skipped": why it was not}).
    Raises SolverError if the expanded start's objective differs from the merged objective (a bug
    in the core's merged or unmerged strategies).
    """
    record = {"solve": "merged", "merged_objective": float(solution.objective)}
    skip = _skip_reason(option, problem, solution)
    if skip is not None:
        return problem, solution, {**record, "skipped": skip}
    t = time.perf_counter()
    unmerged, start, skip = _unmerged_start(build, problem, solution, option, num_nodes, record)
    if skip is not None:
        return problem, solution, {**record, "time_s": time.perf_counter() - t, "skipped": skip}
    try:
        check_same_objective(unmerged, start, solution.objective)
    except SolverError as e:
        if "gathered_on_edges" not in record:
            raise
        # (an in-op gather costed otherwise than on the edge, e.g. under another loop weight)
        return problem, solution, {**record, "time_s": time.perf_counter() - t, "skipped": str(e)}
    try:
        # memory rows added as the plans break them, from those the start nearly fills (with all of
        # them, GPT-175B 16x16's 10k rows, the node-limited MIP ran for minutes)
        refined = solve_within_budget(unmerged, option.memory_budget_per_device, _refine_solve_options(option),
                                      f"{where} (unmerged)", start=start)
    except LpWorkLimitError as e:  # ("auto": a bound on the work, not a failure)
        log.info("alpa_pass: unmerged refinement skipped on %s: %s; keeping the merged plan", where, e)
        return problem, solution, {**record, "time_s": time.perf_counter() - t, "skipped": str(e)}
    except (InfeasibleError, SolverError) as e:  # cannot happen with a feasible start; keep merged
        log.warning("alpa_pass: unmerged refinement failed (%s); keeping the merged plan", e)
        return problem, solution, {**record, "time_s": time.perf_counter() - t, "skipped": f"solve failed: {e}"}
    record.update(unmerged_objective=float(refined.objective), unmerged_status=refined.status,
                  time_s=time.perf_counter() - t)
    if refined.time_limited:
        record["time_limited"] = True
        if option.refine_unmerged == "auto":
            # an incumbent cut by the clock depends on machine speed and load: processes of one job
            # (which plan independently) could keep different plans. "auto" discards it.
            log.warning("alpa_pass: unmerged refinement hit solver_time_limit_s=%g before its node limit; "
                        "keeping the merged plan (lower refine_node_limit to stay within it)",
                        option.solver_time_limit_s)
            return problem, solution, {**record, "skipped": "stopped by the time limit, not the node limit"}
    if refined.objective < solution.objective * (1 - _REL_TOL) - 1e-12:
        budget = option.memory_budget_per_device
        peak = float(unmerged.predicted_peak(np.asarray(refined.assignment, dtype=np.int64))[0])
        if budget is not None and peak > budget * (1 + 1e-9):  # its reshard copies do not fit
            return problem, solution, {**record, "skipped": f"unmerged plan's peak {peak:.6g} B with its "
                                                            f"reshard copies exceeds the budget"}
        record["solve"] = "unmerged"
        return unmerged, refined, record
    return problem, solution, record


def _unmerged_start(build, problem, solution, option, num_nodes: int, record: dict):
    """(unmerged problem, expanded start, None), or (None, None, why not). Tied repeated layers of
    the unmerged problem that the merged plan breaks (copies that differ only in followers) make it
    retry untied (``record["untied"] = True``). Sets ``record["unmerged_columns"]``."""
    tie = option.tie_repeated_layers
    for untie in ((False, True) if tie else (False,)):
        opt = dataclasses.replace(option, merge_followers=False, tie_repeated_layers=tie and not untie)
        unmerged = build(opt)
        cols = int(unmerged.ilp.num_cols)
        record["unmerged_columns"] = cols
        if untie:
            record["untied"] = True
        if option.refine_unmerged == "auto" and cols > REFINE_MAX_COLUMNS:
            return None, None, f"unmerged ILP{' (untied)' if untie else ''} has {cols} columns > {REFINE_MAX_COLUMNS}"
        record.pop("gathered_on_edges", None)
        start, conflict = expand_assignment(problem, solution.assignment, unmerged, num_nodes, record)
        if conflict is None:
            return unmerged, start, None
    return None, None, conflict


def _skip_reason(option, problem, solution) -> str | None:
    mode = option.refine_unmerged
    if mode is False:
        return "refine_unmerged=False"
    if not option.merge_followers:
        return "merge_followers=False: the ILP solved was already unmerged"
    if mode == "auto" and problem.ilp.num_cols > REFINE_MAX_COLUMNS:
        return f"merged ILP already has {int(problem.ilp.num_cols)} columns > {REFINE_MAX_COLUMNS}"
    budget = option.memory_budget_per_device
    if mode == "auto" and budget is not None and problem.num_memory_rows and _fills(problem, solution) > \
            budget * HINT_ROW_FRACTION:
        # the groups a memory row names are never eliminated (solve/eliminate.py), so the unmerged
        # follower chains stay: GPT-175B 16x16 at 80 GiB, 257 such rows, ran over 7 minutes
        return f"the budget binds (the merged plan fills memory rows past {HINT_ROW_FRACTION} of it)"
    return None


def _fills(problem, solution) -> float:
    """How much of the budget the plan takes: its fullest memory row (copies the rows count
    included) or its peak with every reshard copy, the larger (an exact-copy plan's rows count no
    copies, so by its rows alone the budget did not bind: GPT-175B 16x16 at 80 GiB went on to the
    unmerged refinement, still in it after a minute; a run without the log did not end in 14)."""
    assignment = np.asarray(solution.assignment, dtype=np.int64)
    return max(float(problem.memory_row_activity(assignment).max()), float(problem.predicted_peak(assignment)[0]))


def _refine_solve_options(option) -> SolveOptions:
    """The planner's solver options with the refinement's node limit and no objective bound, on the
    exactly reduced ILP (``eliminate_chains``: the unmerged follower chains folded away); on "auto"
    its LP stops at ``REFINE_LP_ITERATIONS`` simplex iterations."""
    return dataclasses.replace(option.solve_options(), objective_bound=None, node_limit=option.refine_node_limit,
                               eliminate_chains=True, start_support_columns=REFINE_SUPPORT_COLUMNS,
                               lp_iteration_limit=REFINE_LP_ITERATIONS if option.refine_unmerged == "auto" else None)


def expand_assignment(merged, assignment, unmerged, num_nodes: int, record: dict | None = None):
    """The merged ``assignment`` (strategy per merged group) as a strategy per unmerged group.

    Each node keeps its chosen (output spec, operand specs); a follower thus takes its leader's
    choice. A merged follower that all-gathers inside the op what its result cannot keep (a
    reshape of a split that does not map, ``cpp/src/rules/reshape.cc``) reads its operand as
    split as the leader made it; its unmerged counterpart is the strategy with the same result
    reading the operand gathered on those axes (the edge pays the same all-gather). Returns
    (assignment, None), or (None, reason) when a node's strategy has neither counterpart or two
    nodes of one tied unmerged group want different strategies. ``record``: gets
    ``"gathered_on_edges"`` (how many nodes took the gathered counterpart) when some did.
    """
    m_off, u_off = np.asarray(merged.strategy_offsets), np.asarray(unmerged.strategy_offsets)
    m_rows = m_off[:-1] + np.asarray(assignment)[np.asarray(merged.node_group)]
    m_out, u_out = np.asarray(merged.out_specs), np.asarray(unmerged.out_specs)
    m_ins_off, m_ins = np.asarray(merged.in_spec_offsets), np.asarray(merged.in_specs)
    u_ins_off, u_ins = np.asarray(unmerged.in_spec_offsets), np.asarray(unmerged.in_specs)
    u_group = np.asarray(unmerged.node_group)
    out = np.full(int(unmerged.ilp.num_groups), -1, dtype=np.int64)
    for v in range(num_nodes):
        r = m_rows[v]
        want_ins = m_ins[m_ins_off[r]:m_ins_off[r + 1]]
        cands = np.flatnonzero((u_out[u_off[v]:u_off[v + 1]] == m_out[r]).all(axis=1))
        ins = [u_ins[u_ins_off[u_off[v] + c]:u_ins_off[u_off[v] + c + 1]] for c in cands]
        exact = [int(c) for c, got in zip(cands, ins) if np.array_equal(got, want_ins)]
        gathered = [int(c) for c, got in zip(cands, ins)  # the in-op gathers on the edge
                    if got.shape == want_ins.shape and ((got == want_ins) | (got < 0)).all()]
        if not exact + gathered:
            return None, f"node {v}: merged strategy has no unmerged counterpart"
        g = u_group[v]
        if out[g] == -1:
            out[g] = (exact + gathered)[0]
            if not exact and record is not None:
                record["gathered_on_edges"] = record.get("gathered_on_edges", 0) + 1
        elif out[g] not in exact + gathered:  # (a group's nodes share one strategy index)
            return None, f"node {v}: tied unmerged group {g} gets two strategies (tie_repeated_layers)"
    return out, None


def check_same_objective(unmerged, start, merged_objective: float) -> None:
    """Raise SolverError unless ``start`` is feasible in ``unmerged`` with the merged objective
    (within 1e-6 relative)."""
    result = _core.evaluate(unmerged.ilp, np.asarray(start, dtype=np.int64))
    if result.violations or abs(result.objective - merged_objective) > _REL_TOL * max(1.0, abs(merged_objective)):
        raise SolverError(f"the merged plan expanded to the unmerged ILP has objective {result.objective:.9g} "
                          f"({len(result.violations)} violations, e.g. {result.violations[:1]}) but "
                          f"{merged_objective:.9g} merged; this is a bug in alpa_pass's strategies, please "
                          f"report it (AutoShardingOption(refine_unmerged=False) avoids it)")
