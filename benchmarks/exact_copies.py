"""Experiment (issue #15, not a test, not the product): a budgeted plan whose memory rows count
every reshard copy exactly, in one MIP, against the planner's reshard-copy rounds.

The planner's memory rows count a reshard copy on the consumer's strategies that read the operand
in the copy's layout, over the range a solved plan gave it (``driver.budget.fit_reshard_copies``):
copies a plan has not made yet are not counted, so each round's plan makes new ones and the budget
is solved again (LLaMA-8B 8x8 at 30 GiB: 3 re-solves, 55-80% of the budgeted solve). Counting the
copies a plan *could* make in that form overcounts (s23: +5..28% costlier plans), because a copy
of value u in layout L is live from the first reader of L to the last one (``_core`` memory.h):
between two readers c1 < c2 it exists only if both read L and u is not produced in L — an AND
of two groups' choices (and a third's) that rows over strategy columns cannot express.

Here each candidate copy (u, L) gets continuous columns in [0, 1]: r_i = [reader i reads u in L]
(a sum of its strategy columns), q = [u is produced in L];
pre_i >= pre_{i-1}, pre_i >= r_i (some reader <= i reads L); suf_i >= suf_{i+1}, suf_i >= r_i;
at reader i's point  wp_i >= pre_i + suf_i - 1 - q;  between readers i and i+1
ws_i >= pre_i + suf_{i+1} - 1 - q; the memory row of a point counts bytes(u, L) * w there. The
memory rows push w down, so for a 0/1 plan w is exactly "the copy is live here". A copy with at
most ``--pairwise`` readers of its layout gets no pre/suf columns: one row per pair of readers
around each w instead (w >= r_a + r_b - 1 - q, w >= r_a - q at reader a itself). Candidates: the
values read in a layout that some strategy in the first budgeted solve's LP support reads (and that
their producer can avoid), at least ``--min-mib`` per device, whose readers span a starting memory
row. The MIP keeps the group strategies of that LP's support and the first plan's (as the planner's
restricted MIP does; when they admit no plan, each group's least-memory strategies too), with the
memory rows the first plan fills most; rows it breaks are added and it is solved again. Its
plan's real peak (``predicted_peak``: every copy) is checked against the budget; the planner's own
plan for the same budget is then finished as usual and printed beside it.

    python benchmarks/exact_copies.py --budget 30                  # LLaMA-8B-shaped step on 8x8
    python benchmarks/exact_copies.py --budget 13 --layers 24 --hidden 2048 --heads 16 --seq 1024 \\
        --vocab 51200 --batch 8 --mesh 2x4 --tied                  # bench_planning.py's GPT 1.3B

s23 (2-core VM; copies >= 4 MiB; --pairwise 4, the default; the planner's copy rounds and finish
beside the MIP that would replace them; the planner's whole budgeted solve in brackets):
| case | planner: objective, peak, rounds (solve) | exact copies: objective, peak, build + MIP |
| LLaMA-8B 8x8, 30 GiB | 5.0714e10, 28.12 GiB, 14.8 s (22 s) | 4.9748e10 (-1.9%), 29.92 GiB, 3.1 + 7.1 s |
| LLaMA-8B 8x8, 33 GiB | 3.9482e10, 33.00 GiB, 6.3 s (13 s) | 4.3875e10 (+11.1%), 32.56 GiB, 3.2 + 10.1 s |
| LLaMA-8B 8x8, 35 GiB | 3.8301e10, 34.80 GiB, 0 s (11 s) | 3.8331e10 (+0.1%), 34.64 GiB, 2.7 + 0.5 s |
| GPT 1.3B 2x4, 12 GiB | 1.6405e10, 11.15 GiB, 13.7 s (24 s) | 1.4221e10 (-13.3%), 11.99 GiB, 1.1 + 2.2 s |
| GPT 1.3B 2x4, 13 GiB | 1.5122e10, 12.39 GiB, 16.1 s (25 s) | 1.2429e10 (-17.8%), 12.99 GiB, 1.5 + 5.5 s |
| GPT 1.3B 2x4, 14 GiB | 1.1155e10, 13.83 GiB, 7.0 s (12 s) | 1.1375e10 (+2.0%), 14.00 GiB, 1.8 + 1.3 s |
| GPT 1.3B 2x4, 15 GiB | 1.0434e10, 14.76 GiB, 17.0 s (23 s) | 1.0272e10 (-1.6%), 14.98 GiB, 2.0 + 6.3 s |
The rows' peak is the plan's real peak (to the 4 MiB cut: GPT 14 GiB rows 13.99, real 14.00); the
LP support alone had no plan in 5 of 7 cases (each group's least-memory strategies joined it).
Where the planner tightened its rows (GPT 12-13 GiB) it left 13-18% of the objective unused under
the budget; elsewhere its rounds found cheaper strategies than this one restricted MIP sees. With
prefix/suffix columns for every copy (--pairwise 0) the same plans took 8.5-66 s of MIP (LLaMA 30
GiB 28 + 30 s): the pairwise rows are what makes it fast. With an LP support from the unreduced LP
(an earlier version of this experiment) LLaMA 30 GiB went to 4.7615e10.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # zoo, benchmarks.*
from benchmarks.devices import planner_log, simulate_cpu_devices  # noqa: E402

START_ROWS = 32  # the memory rows the first plan fills most start in the MIP
MAX_ROW_ROUNDS = 6


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=30.0, help="GiB per device")
    p.add_argument("--min-mib", type=float, default=4.0, help="smallest copy (MiB per device) given columns")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mesh", default="8x8")
    p.add_argument("--tied", action="store_true", help="tied embeddings (bench_planning.py's GPT)")
    p.add_argument("--pairwise", type=int, default=4,
                   help="copies with at most this many readers of their layout get one row per reader pair "
                        "instead of the prefix/suffix columns")
    p.add_argument("--log", action="store_true", help="print the planner's INFO log")
    return p.parse_args(argv)


def _constants(graph) -> np.ndarray:
    """Per node: a constant expression, whose copies XLA never makes (``_core`` memory.cc use_info:
    not a heavy op or an output, and every operand constant)."""
    from alpa_pass._core import OpKind

    heavy = {int(k) for k in (OpKind.PARAMETER, OpKind.DOT, OpKind.CONVOLUTION, OpKind.REDUCE, OpKind.GATHER,
                              OpKind.SCATTER, OpKind.OPAQUE, OpKind.OUTPUT)}
    out = np.zeros(graph.num_nodes, dtype=bool)
    for v in range(graph.num_nodes):
        out[v] = int(graph.kind[v]) not in heavy and all(out[u] for u in graph.operands(v))
    return out


class CopyColumns:
    """The candidate copies' columns and rows over ``problem.ilp``'s columns (see the module doc)."""

    def __init__(self, problem, graph, mesh_shape, used, points, min_bytes, pairwise=0):
        gs = np.asarray(problem.ilp.group_var_start, dtype=np.int64)
        group = np.asarray(problem.node_group)
        off = np.asarray(problem.strategy_offsets)
        outs, ins = np.asarray(problem.out_specs), np.asarray(problem.in_specs)
        in_off = np.asarray(problem.in_spec_offsets)
        constant = _constants(graph)
        readers: dict = {}
        for v in range(graph.num_nodes):
            for t, u in enumerate(graph.operands(v)):
                if not constant[u]:
                    readers.setdefault(u, []).append((v, t))
        self.first = int(problem.ilp.num_cols)
        self.pairwise = pairwise  # values with at most this many readers of a layout: pairwise rows
        self.count = 0
        self.rows = []    # ([(column, coefficient)], lower bound): each a ">=" row
        self.terms = []   # (first point, last point, column, bytes): counted in the memory rows there
        self.candidates = 0
        # (reads per reader, has, pre, suf, [(w, first reader, second reader)]); pairwise ones:
        # (reads, has, None, None, [(w, [(reader a, reader b)])])
        self.records = []
        points = np.sort(np.asarray(points))
        for u, rs in readers.items():
            u_cols = gs[group[u]] + np.arange(off[u + 1] - off[u])
            by_layout: dict = {}
            for v, t in rs:
                for k in range(off[v + 1] - off[v]):
                    if used[gs[group[v]] + k]:
                        by_layout.setdefault(tuple(ins[in_off[off[v] + k] + t]), {}).setdefault(v, []).append(
                            gs[group[v]] + k)
            size = int(graph.dtype_bytes[u]) * math.prod(graph.shape(u))
            for layout, by_reader in by_layout.items():
                per_device = size / math.prod(n for n, d in zip(mesh_shape, layout) if d >= 0)
                has = [int(c) for c, s in zip(u_cols, outs[off[u]:off[u + 1]]) if tuple(s) == layout]
                if per_device < min_bytes or all(tuple(s) == layout or not used[c]
                                                 for c, s in zip(u_cols, outs[off[u]:off[u + 1]])):
                    continue
                order = sorted(by_reader)
                k = np.searchsorted(points, order[0])
                if k >= points.size or points[k] > order[-1]:
                    continue  # no starting row between its first and last reader
                self._add(order, [sorted(set(by_reader[v])) for v in order], has, per_device)

    def _column(self) -> int:
        self.count += 1
        return self.first + self.count - 1

    def _add(self, order, reads, has, per_device):
        self.candidates += 1
        m = len(order)
        q = [(c, 1.0) for c in has]
        if m <= self.pairwise:
            # each w >= r_a + r_b - 1 - q for every pair of readers around it (r_a - q for a = b)
            ws = []
            for i in range(m):
                spans = [((order[i], order[i]), [(a, b) for a in range(i + 1) for b in range(i, m)])]
                if i + 1 < m and order[i + 1] > order[i] + 1:
                    spans.append(((order[i] + 1, order[i + 1] - 1),
                                  [(a, b) for a in range(i + 1) for b in range(i + 1, m)]))
                for (first, last), pairs in spans:
                    w = self._column()
                    for a, b in pairs:
                        r = [(c, -1.0) for c in reads[a]] + ([] if a == b else [(c, -1.0) for c in reads[b]])
                        self.rows.append(([(w, 1.0)] + r + q, 0.0 if a == b else -1.0))
                    self.terms.append((first, last, w, per_device))
                    ws.append((w, pairs))
            self.records.append((reads, has, None, None, ws))
            return
        pre = [self._column() for _ in range(m)]
        suf = [self._column() for _ in range(m)]
        for i in range(m):
            r = [(c, -1.0) for c in reads[i]]
            self.rows.append(([(pre[i], 1.0)] + r, 0.0))
            self.rows.append(([(suf[i], 1.0)] + r, 0.0))
            if i:
                self.rows.append(([(pre[i], 1.0), (pre[i - 1], -1.0)], 0.0))
                self.rows.append(([(suf[i - 1], 1.0), (suf[i], -1.0)], 0.0))
        ws = []
        for i in range(m):
            w = self._column()
            self.rows.append(([(w, 1.0), (pre[i], -1.0), (suf[i], -1.0)] + q, -1.0))
            self.terms.append((order[i], order[i], w, per_device))
            ws.append((w, i, i))
            if i + 1 < m and order[i + 1] > order[i] + 1:
                w = self._column()
                self.rows.append(([(w, 1.0), (pre[i], -1.0), (suf[i + 1], -1.0)] + q, -1.0))
                self.terms.append((order[i] + 1, order[i + 1] - 1, w, per_device))
                ws.append((w, i, i + 1))
        self.records.append((reads, has, pre, suf, ws))

    def in_memory_rows(self, points) -> "scipy.sparse.csr_matrix":
        """The copy columns' coefficients in the memory rows of ``points`` (ascending: one row each),
        over the ILP's columns and then the copy columns."""
        import scipy.sparse as sp

        points = np.asarray(points)
        rows, cols, values = [], [], []
        for first, last, col, size in self.terms:
            for row in range(np.searchsorted(points, first), np.searchsorted(points, last, side="right")):
                rows.append(row)
                cols.append(col)
                values.append(size)
        return sp.csr_matrix((values, (rows, cols)), shape=(points.size, self.first + self.count))

    def least_values(self, x: np.ndarray) -> np.ndarray:
        """``x`` (the ILP's columns) with the copy columns at the least values their rows allow:
        for a 0/1 plan, 1 exactly where the copy is live."""
        x = np.concatenate([np.asarray(x, dtype=np.float64)[:self.first], np.zeros(self.count)])
        for reads, has, pre, suf, ws in self.records:
            r = [float(x[cols].sum()) for cols in reads]
            q = float(x[has].sum())
            if pre is None:  # pairwise
                for w, pairs in ws:
                    x[w] = max(0.0, max(r[a] - q if a == b else r[a] + r[b] - 1.0 - q for a, b in pairs))
                continue
            x[pre] = np.maximum.accumulate(r)
            x[suf] = np.maximum.accumulate(r[::-1])[::-1]
            for w, i, j in ws:
                x[w] = max(0.0, x[pre[i]] + x[suf[j]] - 1.0 - q)
        return x


def exact_copy_plan(problem, graph, solution, budget, mesh_shape, min_bytes, least_memory=False,
                    pairwise=4) -> dict:
    """The restricted MIP with ``CopyColumns`` (module doc) and what came of it."""
    import highspy
    import scipy.sparse as sp

    from alpa_pass import _core
    from alpa_pass.solve.support import _least_memory_columns

    t0 = time.perf_counter()
    ilp = problem.ilp
    gs = np.asarray(ilp.group_var_start, dtype=np.int64)
    plan = np.asarray(solution.assignment, dtype=np.int64)
    used = np.zeros(int(gs[-1]), dtype=bool)
    if solution.support is not None:
        used[gs[0]:] = solution.support.columns
    used[gs[:-1] + plan] = True
    upper = float(problem.memory_row_upper)
    points = np.asarray(problem.memory_row_points)
    indptr, indices, data = problem.memory_row_matrix(None)
    memory = sp.csr_matrix((data, indices, indptr), shape=(problem.num_memory_rows, int(ilp.num_cols)))
    if least_memory:  # (the planner's widened restricted MIP's rule)
        used[gs[0]:] |= _least_memory_columns(memory, gs)
    active = np.sort(np.argsort(-problem.memory_row_activity(plan), kind="stable")[:START_ROWS])
    copies = CopyColumns(problem, graph, mesh_shape, used, points[active], min_bytes, pairwise)
    n0, n = int(ilp.num_cols), int(ilp.num_cols) + copies.count
    base = sp.csc_matrix((np.asarray(ilp.a_value), np.asarray(ilp.a_index), np.asarray(ilp.a_start)),
                         shape=(int(ilp.num_rows), n0))
    r, c, v = zip(*[(i, col, x) for i, (terms, _) in enumerate(copies.rows) for col, x in terms]) if copies.rows \
        else ((), (), ())
    extra = sp.csr_matrix((v, (r, c)), shape=(len(copies.rows), n))
    rows = sp.vstack([sp.hstack([base, sp.csc_matrix((base.shape[0], copies.count))]), extra]).tocsr()
    row_lower = np.concatenate([np.asarray(ilp.row_lower), [b for _, b in copies.rows]])
    row_upper = np.concatenate([np.asarray(ilp.row_upper), np.full(len(copies.rows), np.inf)])
    memory = (sp.hstack([memory, sp.csr_matrix((memory.shape[0], copies.count))]).tocsr()
              + copies.in_memory_rows(points)) * (1000.0 / upper)
    cost = np.concatenate([np.asarray(ilp.col_cost), np.zeros(copies.count)])
    scale = 2.0 ** -math.ceil(math.log2(max(np.abs(cost).max(), 1e-300) / 1e3))
    col_upper = np.concatenate([np.asarray(ilp.col_upper), np.ones(copies.count)])
    col_upper[:gs[-1]][~used] = 0.0
    integrality = np.concatenate([np.asarray(ilp.integrality), np.zeros(copies.count, dtype=np.int8)])
    built = time.perf_counter() - t0
    solves = []
    for _ in range(MAX_ROW_ROUNDS):
        a = sp.vstack([rows, memory[active]]).tocsc()
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("random_seed", 0)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, a.shape[0]
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost * scale, np.zeros(n), col_upper
        lp.row_lower_ = np.concatenate([row_lower, np.full(active.size, -np.inf)])
        lp.row_upper_ = np.concatenate([row_upper, np.full(active.size, 1000.0)])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in integrality]
        h.passModel(lp)
        t = time.perf_counter()
        h.run()
        solves.append((time.perf_counter() - t, int(active.size), h.modelStatusToString(h.getModelStatus()),
                       int(h.getInfo().mip_node_count)))
        x = np.asarray(h.getSolution().col_value)
        if x.size != n or h.getInfo().primal_solution_status != 2:
            return {"built_s": built, "solves": solves}
        over = np.setdiff1d(np.flatnonzero(memory @ x > 1000.0 * (1 + 1e-9) + 1e-6), active)
        if not over.size:
            break
        active = np.union1d(active, over)
    assignment = np.asarray([int(np.argmax(x[gs[g]:gs[g + 1]])) for g in range(gs.size - 1)], dtype=np.int64)
    return {"built_s": built, "solves": solves, "candidates": copies.candidates, "columns": copies.count,
            "rows": len(copies.rows), "objective": float(_core.evaluate(ilp, assignment).objective),
            "peak": float(problem.predicted_peak(assignment)[0]),
            "rows_peak": float((memory @ copies.least_values(_one_hot(assignment, gs, n0))).max() * upper / 1000.0),
            "budget": budget}


def _one_hot(assignment, gs, num_cols) -> np.ndarray:
    x = np.zeros(num_cols)
    x[gs[:-1] + np.asarray(assignment, dtype=np.int64)] = 1.0
    return x


def plan_and_capture(step, args, mesh_shape, budget: int, experiment=None) -> tuple:
    """(plan, captured): ``step`` planned on ``mesh_shape`` under ``budget`` bytes per device, and
    the graph, problem and plan of its first budgeted solve (``captured``: graph, problem,
    solution, how many reshard copies its rows count already (the free plan's, when it nearly met
    the budget: ``driver.budget.FREE_COPIES_WITHIN``; the experiment then counts them twice), plus
    ``experiment(graph, problem, solution)``'s result and the copy rounds' seconds)."""
    import alpa_pass as ap
    from alpa_pass.driver import planning
    from alpa_pass.driver.jit import make_plan

    captured: dict = {}
    solve_graph, fit = planning.solve_graph, planning.fit_reshard_copies

    def capture_graph(graph, *a, **k):
        captured["graph"] = graph
        return solve_graph(graph, *a, **k)

    def first_budgeted(copies, problem, solution, budget_, options, where):
        if "problem" not in captured and budget_ is not None:
            captured.update(problem=problem, solution=solution, counted=len(copies))
            if experiment is not None:
                t = time.perf_counter()
                captured["result"] = experiment(captured["graph"], problem, solution)
                captured["experiment_s"] = time.perf_counter() - t
        t = time.perf_counter()
        out = fit(copies, problem, solution, budget_, options, where)
        captured["rounds_s"] = time.perf_counter() - t
        return out

    planning.solve_graph, planning.fit_reshard_copies = capture_graph, first_budgeted
    try:
        plan, _, _ = make_plan(step, args, ap.LogicalMesh(shape=mesh_shape),
                               ap.AutoShardingOption(memory_budget_per_device=budget), donate_argnums=(0,))
    finally:
        planning.solve_graph, planning.fit_reshard_copies = solve_graph, fit
    return plan, captured


def main(argv=None) -> int:
    args = parse_args(argv)
    mesh_shape = tuple(int(s) for s in args.mesh.split("x"))
    simulate_cpu_devices(math.prod(mesh_shape), memory_scheduler=True)
    if args.log:
        planner_log()
    from benchmarks.bench_planning import abstract_inputs
    from zoo import default_optimizer, gpt

    config = gpt.Config(vocab=args.vocab, seq=args.seq, hidden=args.hidden, heads=args.heads,
                        layers=args.layers, batch=args.batch, tied=args.tied)
    budget = int(args.budget * 2**30)

    def experiment(graph, problem, solution):
        out = {"narrow": None}
        found = exact_copy_plan(problem, graph, solution, budget, mesh_shape, args.min_mib * 2**20,
                                pairwise=args.pairwise)
        if "objective" not in found:  # the LP's support alone has no plan: widen it
            out["narrow"] = found
            found = exact_copy_plan(problem, graph, solution, budget, mesh_shape, args.min_mib * 2**20,
                                    least_memory=True, pairwise=args.pairwise)
        out["exact"] = found
        return out

    optimizer = default_optimizer()
    plan, seen = plan_and_capture(gpt.make_train_step(optimizer, config), abstract_inputs(config, optimizer),
                                  mesh_shape, budget, experiment)
    planner_s = plan.timings["solve"] - seen.get("experiment_s", 0.0)
    print(f"planner: solve {planner_s:.1f} s (copy rounds and finish {seen.get('rounds_s', 0):.1f} s), "
          f"objective {plan.objective:.6g} [{plan.solver_status}], predicted peak "
          f"{plan.predicted_peak_bytes / 2**30:.2f} GiB (budget {args.budget:g} GiB)")
    if "result" not in seen:
        print("exact copies: the budget was met without a budgeted solve; nothing to compare")
        return 0
    narrow, exact = seen["result"]["narrow"], seen["result"]["exact"]
    if seen["counted"]:
        print(f"(the first budgeted problem's rows count {seen['counted']} copies of the free plan already: "
              "the exact-copy plan counts them twice and is conservative)")
    if narrow is not None:
        print("exact copies: no plan on the LP's support and the first plan's strategies "
              f"({narrow['solves'][-1][0]:.1f} s); with each group's least-memory strategies too:")
    solves = "; ".join(f"{s:.1f} s with {r} memory rows ({st}, {nodes} nodes)" for s, r, st, nodes in exact["solves"])
    if "objective" not in exact:
        print(f"exact copies: no plan ({solves})")
        return 1
    print(f"exact copies: {exact['candidates']} candidate copies, {exact['columns']} columns and {exact['rows']} "
          f"rows more (built in {exact['built_s']:.1f} s); MIP {solves}; objective {exact['objective']:.6g}, "
          f"peak with every copy {exact['peak'] / 2**30:.2f} GiB (its rows say {exact['rows_peak'] / 2**30:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
