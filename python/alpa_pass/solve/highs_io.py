"""HiGHS plumbing shared by ``solve.highs`` and ``solve.support``: a configured ``Highs``, the
model handed over in one call, a start, a run that survives HiGHS's global thread pool."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING

import highspy
import numpy as np

from alpa_pass.errors import SolverError

if TYPE_CHECKING:
    from alpa_pass.solve.highs import SolveOptions


def _run(h, highspy) -> None:
    if h.run() == highspy.HighsStatus.kError and h.getModelStatus() == highspy.HighsModelStatus.kNotset:
        # HiGHS's thread pool is global: another Highs in this process started it with a different
        # thread count, so the "threads" option is refused. Restart the pool and solve again.
        h.resetGlobalScheduler(True)
        h.run()


def _highs(options: SolveOptions, presolve: bool):
    """A quiet Highs with ``options``' limits and heuristics (``presolve`` as given)."""
    with _quiet_stdout(not options.log_to_console):
        h = highspy.Highs()  # HiGHS prints a banner from C++ on the first construction
    h.setOptionValue("output_flag", bool(options.log_to_console))
    h.setOptionValue("log_to_console", bool(options.log_to_console))
    h.setOptionValue("time_limit", float("inf") if options.time_limit_s is None else float(options.time_limit_s))
    h.setOptionValue("mip_rel_gap", float(options.rel_gap))
    h.setOptionValue("threads", int(options.threads))
    h.setOptionValue("random_seed", int(options.seed))
    if options.node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(options.node_limit))
    h.setOptionValue("presolve", "on" if presolve else "off")
    # absent before HiGHS 1.10 (an unknown option is refused with a warning; nothing to turn off then)
    h.setOptionValue("mip_heuristic_run_feasibility_jump", bool(options.feasibility_jump))
    if not options.sub_mip_heuristics:
        h.setOptionValue("mip_heuristic_run_rins", False)
        h.setOptionValue("mip_heuristic_run_rens", False)
        h.setOptionValue("mip_allow_restart", False)
    return h


def _pass_model(h, problem, highspy) -> None:
    """Hand the CSC arrays to HiGHS in one call (HiGHS uses 32-bit indices)."""
    a_value = np.asarray(problem.a_value, dtype=np.float64)
    status = h.passModel(
        int(problem.num_cols), int(problem.num_rows), int(a_value.size),
        int(highspy.MatrixFormat.kColwise), int(highspy.ObjSense.kMinimize), float(problem.offset),
        np.asarray(problem.col_cost, dtype=np.float64), np.asarray(problem.col_lower, dtype=np.float64),
        np.asarray(problem.col_upper, dtype=np.float64), np.asarray(problem.row_lower, dtype=np.float64),
        np.asarray(problem.row_upper, dtype=np.float64), np.asarray(problem.a_start, dtype=np.int32),
        np.asarray(problem.a_index, dtype=np.int32), a_value,
        np.asarray(problem.integrality, dtype=np.int32))
    if status == highspy.HighsStatus.kError:
        raise SolverError("HiGHS rejected the sharding ILP arrays (passModel returned an error); "
                          "this is a bug in alpa_pass's ILP builder, please report it")


def _check_start(problem, start) -> None:
    """ValueError unless ``start`` has one in-range strategy index per group of ``problem``."""
    sizes = np.diff(np.asarray(problem.group_var_start, dtype=np.int64))
    start = np.asarray(start, dtype=np.int64)
    if start.shape != sizes.shape or (start < 0).any() or (start >= sizes).any():
        raise ValueError(f"start assignment needs one strategy index per group ({sizes.size} groups, "
                         f"each below its strategy count), got shape {start.shape}")


def _set_start(h, problem, start, highspy) -> None:
    """Give HiGHS the one-hot group columns of ``start`` (strategy index per group)."""
    _check_start(problem, start)
    group_start = np.asarray(problem.group_var_start, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    index = np.arange(group_start[0], group_start[-1], dtype=np.int32)
    value = np.zeros(index.size, dtype=np.float64)
    value[group_start[:-1] + start - group_start[0]] = 1.0
    if h.setSolution(int(index.size), index, value) == highspy.HighsStatus.kError:
        raise SolverError("HiGHS rejected the start assignment (setSolution returned an error); "
                          "this is a bug in alpa_pass's refinement, please report it")


@contextlib.contextmanager
def _quiet_stdout(enabled: bool):
    """Silence the C-level stdout (fd 1) while enabled."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
