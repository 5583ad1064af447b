"""Memory-aware plans (AutoShardingOption.memory_budget_per_device): the predicted per-device peak
against XLA's memory_analysis(), infeasible budgets, and the replicated -> sharded trade-off."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

import alpa_pass as ap
from alpa_pass import _core
from alpa_pass.errors import InfeasibleError
from alpa_pass.extract.graph import OpKind
from alpa_pass.driver import jit as jit_module
from alpa_pass.driver.budget import LEAST_MEMORY_STATUS
from alpa_pass.driver.jit import CPU_MEMORY_SCHEDULER_FLAG, make_plan
from alpa_pass.driver.planning import core_graph
from tests import helpers
from zoo import default_optimizer, gpt, init_state, mlp, moe

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPT = gpt.Config(layers=2, hidden=64, vocab=256, seq=32)
# Deep, narrow, long sequence: per layer, the causal mask broadcast to [batch, heads, seq, seq] (a
# constant expression XLA recomputes inside its selects) outweighs the sharded activations; counting
# it put the prediction at 1.44x XLA here, as at Alpa's 39B GPT on 8x8 (1.63x).
GPT_DEEP = gpt.Config(layers=6, hidden=64, heads=8, seq=128, vocab=256, batch=16)


def _step_and_args(model, config):
    optimizer = default_optimizer()
    state = init_state(model.init(jax.random.key(0), config), optimizer)
    batch = model.make_batch(jax.random.key(1), config)
    step = model.make_train_step(optimizer) if model is mlp else model.make_train_step(optimizer, config)
    return step, state, batch


def _parallel(step, shape, budget=None, donate=True):
    # merged-ILP plans: the unmerged refinement's free optimum already splits a few small parameters
    option = ap.AutoShardingOption(memory_budget_per_device=budget, refine_unmerged=False)
    mesh = ap.LogicalMesh(shape=shape, devices=jax.devices()[:math.prod(shape)])  # (1, 4): half the devices
    return ap.parallelize(step, method=ap.ShardParallel(mesh=mesh, option=option),
                          donate_argnums=(0,) if donate else ())


def _xla_peak(exe) -> int:
    """Per-device bytes XLA allocates: arguments + outputs + temporaries - donated (aliased) outputs."""
    m = exe.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def _split_param_fraction(plan, params) -> float:
    """Fraction of parameter elements whose planned layout splits some dim."""
    leaves = jax.tree.leaves(params)
    specs = plan.input_specs[:len(leaves)]
    split = sum(x.size for x, s in zip(leaves, specs) if any(e is not None for e in s))
    return split / sum(x.size for x in leaves)


@pytest.mark.parametrize("model,config,shape,donate", [
    pytest.param(mlp, mlp.Config(num_layers=3, hidden=64, batch=16), (2, 4), True, id="mlp-2x4-donated"),
    pytest.param(mlp, mlp.Config(num_layers=6, hidden=256, batch=32), (1, 4), False, id="mlp-1x4"),
    pytest.param(gpt, gpt.Config(layers=2), (2, 4), True, id="gpt-2x4-donated", marks=pytest.mark.slow),
    pytest.param(gpt, GPT, (1, 8), False, id="gpt-1x8"),
    pytest.param(gpt, GPT_DEEP, (1, 8), True, id="gpt-deep-1x8-donated", marks=pytest.mark.slow),
])
def test_predicted_peak_within_20_percent_of_xla(model, config, shape, donate):
    step, state, batch = _step_and_args(model, config)
    exe = _parallel(step, shape, donate=donate).get_executable(state, batch)
    predicted, xla = exe.plan.predicted_peak_bytes, _xla_peak(exe)
    assert exe.plan.predicted["peak_bytes"] == predicted
    assert 0.8 * xla <= predicted <= 1.2 * xla, f"predicted peak {predicted} vs XLA {xla} ({predicted / xla:.3f}x)"
    assert "predicted peak memory per device" in exe.plan.summary()


def _constant_expressions(graph) -> set[int]:
    """Nodes computed from GENERATORs through fusible ops only."""
    fusible = {OpKind.GENERATOR, OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.TRANSPOSE, OpKind.RESHAPE}
    out = set()
    for v in range(graph.num_nodes):
        if OpKind(int(graph.kind[v])) in fusible and all(u in out for u in graph.operands(v)):
            out.add(v)
    return out


def test_deep_gpt_counts_no_constant_expression():
    """The causal masks of every layer are the largest values the prediction used to keep live from
    the forward to the backward; XLA gives them no buffer, and neither does the model now."""
    step, state, batch = _step_and_args(gpt, GPT_DEEP)
    mesh = ap.LogicalMesh(shape=(1, 8))
    plan, graph, _ = make_plan(step, (state, batch), mesh, ap.AutoShardingOption(), donate_argnums=(0,))
    problem = _core.build_sharding_problem(core_graph(graph), mesh.to_core(), ap.AutoShardingOption().to_core(),
                                           [], list(graph.donated_args))
    constant = _constant_expressions(graph)
    masks = [v for v in constant if graph.shape(v) == (GPT_DEEP.batch, GPT_DEEP.heads, GPT_DEEP.seq, GPT_DEEP.seq)]
    assert len(masks) >= GPT_DEEP.layers, "one broadcast causal mask per layer"
    assert not constant & {int(v) for v in problem.live_nodes}


@pytest.fixture(scope="module")
def gpt_free():
    step, state, batch = _step_and_args(gpt, GPT)
    return step, state, batch, _parallel(step, (1, 8)).plan(state, batch)


def test_tightening_the_budget_shards_parameters(gpt_free):
    step, state, batch, free = gpt_free
    assert _split_param_fraction(free, state[0]) == 0.0, "the unconstrained GPT plan should replicate parameters"
    plans = [free]
    for fraction in (0.7, 0.5):
        budget = int(free.predicted_peak_bytes * fraction)
        plan = _parallel(step, (1, 8), budget).plan(state, batch)
        assert plan.predicted_peak_bytes <= budget
        assert plan.ilp_size["memory_rows"] > 0
        plans.append(plan)
    peaks = [p.predicted_peak_bytes for p in plans]
    comms = [helpers.communication(p) for p in plans]
    splits = [_split_param_fraction(p, state[0]) for p in plans]
    assert peaks[0] > peaks[1] > peaks[2], peaks
    assert comms[0] < comms[1] < comms[2], comms
    assert splits[0] < splits[1] < splits[2], splits


def test_budgeted_plan_compiles_and_xla_agrees(gpt_free):
    step, state, batch, free = gpt_free
    budget = int(free.predicted_peak_bytes * 0.6)
    exe = _parallel(step, (1, 8), budget).get_executable(state, batch)
    predicted, xla = exe.plan.predicted_peak_bytes, _xla_peak(exe)
    assert predicted <= budget
    assert 0.8 * xla <= predicted <= 1.2 * xla, f"predicted peak {predicted} vs XLA {xla} ({predicted / xla:.3f}x)"


def test_infeasible_budget_names_the_smallest_feasible_one(gpt_free):
    step, state, batch, free = gpt_free
    budget = int(free.predicted_peak_bytes * 0.2)
    with pytest.raises(InfeasibleError, match="smallest budget the planner estimates feasible") as info:
        _parallel(step, (1, 8), budget).plan(state, batch)
    message = str(info.value)
    assert "memory_budget_per_device" in message and "GiB" in message and "more devices" in message
    smallest = int(re.search(r"estimates feasible is [\d.e+-]+ GiB \((\d+) bytes\)", message).group(1))
    assert budget < smallest < free.predicted_peak_bytes
    plan = _parallel(step, (1, 8), smallest).plan(state, batch)  # the named budget is feasible
    assert plan.predicted_peak_bytes <= smallest
    # below it: no plan, or one that fits (the least-memory plan's peak counts its reshard copies,
    # which it does not minimise: an estimate, not a bound)
    try:
        tighter = _parallel(step, (1, 8), int(smallest * 0.97)).plan(state, batch)
    except InfeasibleError:
        return
    assert tighter.predicted_peak_bytes <= int(smallest * 0.97)


@pytest.mark.slow
def test_infeasible_after_copy_rounds_names_a_plan_seen(monkeypatch):
    """MoE on 2x4 at 0.9 of the free plan's peak: no copy round's plan fits with its copies, nor the
    least-memory plan (its rows ignore copies: it peaked above the free plan, 138568 B against
    120360); the error names the least peak of the plans solved, which that plan meets. The
    exact-copy plan (``driver.exact_fit.EXACT_COPY_PLAN``) fits that budget: with it, a plan."""
    from alpa_pass.driver import exact_fit

    step, state, batch = _step_and_args(moe, moe.Config(experts=8, top_k=2))
    free = _parallel(step, (2, 4), donate=False).plan(state, batch)
    budget = int(free.predicted_peak_bytes * 0.9)
    plan = _parallel(step, (2, 4), budget, donate=False).plan(state, batch)
    assert plan.predicted_peak_bytes <= budget and plan.solver_status == "exact-copy plan"
    monkeypatch.setattr(exact_fit, "EXACT_COPY_PLAN", False)
    with pytest.raises(InfeasibleError) as info:
        _parallel(step, (2, 4), budget, donate=False).plan(state, batch)
    assert budget < info.value.smallest_feasible_bytes <= free.predicted_peak_bytes


def test_infeasible_budget_is_decided_by_the_lower_bound_not_the_untied_solve(monkeypatch):
    """A budget below every tied plan's peak: the untied ILP is never solved under the budget
    (on LLaMA-8B it ran into the time limit: SolverError); the LP relaxation of its least-memory
    problem proves no plan fits, so the error is deterministic. It names the smallest budget (a
    plan reaching it exists), the bound, and the levers."""
    from alpa_pass.driver import planning

    step, state, batch = _step_and_args(gpt, dataclasses.replace(GPT, layers=3))  # layers 0 and 2 tied
    free = _parallel(step, (1, 8)).plan(state, batch)
    assert free.ilp_size["groups_untied"] > free.ilp_size["groups"], "no repeated layers tied: weak test"
    budgeted_solves = []
    real = planning.solve_within_budget

    def record(problem, budget, options, where, **kw):
        budgeted_solves.append(int(problem.ilp.num_groups))
        return real(problem, budget, options, where, **kw)

    monkeypatch.setattr(planning, "solve_within_budget", record)
    budget = int(free.predicted_peak_bytes * 0.2)
    with pytest.raises(InfeasibleError) as info:
        _parallel(step, (1, 8), budget).plan(state, batch)
    assert budgeted_solves == [free.ilp_size["groups"]]  # the tied ILP only
    e = info.value
    assert e.lower_bound_bytes is not None and budget < e.lower_bound_bytes <= e.smallest_feasible_bytes
    # (the bound counts values only; the least-memory plan's peak adds its reshard copies, 1.5x here)
    message = str(e)
    named = int(re.search(r"estimates feasible is [\d.e+-]+ GiB \((\d+) bytes\)", message).group(1))
    assert named == e.smallest_feasible_bytes
    for lever in ("ap.Zero3Parallel", "ap.PipeshardParallel", "jax.checkpoint", "memory_budget_per_device"):
        assert lever in message, (lever, message)
    # the named budget is one a plan meets
    assert _parallel(step, (1, 8), named).plan(state, batch).predicted_peak_bytes <= named



@pytest.mark.parametrize("fraction", [0.8, 0.7])
def test_binding_budget_on_a_square_mesh_keeps_a_costed_plan(fraction):
    """On 2x2 each re-solve with a plan's reshard copies counted made copies no earlier plan made
    (the mirrored plan among them), and after 4 re-solves the least-memory plan was kept: 5.2x /
    5.4x the free plan's objective. Copies count in their mirrored layouts too, then the rows are
    tightened by each plan's excess: a plan that fits with its copies, at a cost."""
    step, state, batch = _step_and_args(gpt, GPT)
    free = _parallel(step, (2, 2)).plan(state, batch)
    budget = int(free.predicted_peak_bytes * fraction)
    plan = _parallel(step, (2, 2), budget).plan(state, batch)
    assert plan.predicted_peak_bytes <= budget
    assert plan.solver_status != LEAST_MEMORY_STATUS
    assert free.objective < plan.objective < 3 * free.objective, plan.objective / free.objective

def test_budget_must_be_positive():
    with pytest.raises(ValueError, match="memory_budget_per_device"):
        ap.AutoShardingOption(memory_budget_per_device=0)


_PROMISE = """
import json, jax, alpa_pass as ap
from tests.integration.test_memory_plans import _split_param_fraction, _step_and_args, _xla_peak
from zoo import gpt
step, state, batch = _step_and_args(gpt, gpt.Config(layers=4, hidden=256, heads=8, seq=128, batch=32, vocab=1024))
mesh = ap.LogicalMesh(shape=(2, 4))
free = ap.parallelize(step, method=ap.ShardParallel(mesh=mesh)).plan(state, batch)
budget = int(free.predicted_peak_bytes * 0.8)
option = ap.AutoShardingOption(memory_budget_per_device=budget)
exe = ap.parallelize(step, method=ap.ShardParallel(mesh=mesh, option=option), donate_argnums=(0,)).get_executable(state, batch)
print("PROMISE " + json.dumps({"budget": budget, "predicted": exe.plan.predicted_peak_bytes, "xla": _xla_peak(exe),
                              "split": _split_param_fraction(exe.plan, state[0])}))
"""


@pytest.mark.slow
def test_budgeted_plan_keeps_its_promise_on_xla():
    """A binding budget on 2x4: the plan shards state and reads much of it resharded. XLA reshards
    a value once per layout (a weight gathered for the forward dot is the one the backward dot
    reads), so the model counts each copy from its first reader to its last, and the plan is compiled
    with XLA's memory-minimising CPU scheduler (XLA_FLAGS, read when the backend starts: a fresh
    process): XLA's peak stays within the budget, at most 10% above the prediction and at most 18%
    below it (before copies were counted: 95.9 MiB predicted, 108.4 compiled; with the default
    concurrency scheduler 103.9; the copy rounds' plan: 100.5 predicted, 98.9 compiled; the
    exact-copy plan, 10% cheaper, s24: 101.1 predicted, 88.2 compiled; the exact-copy plan over the
    free plan's frontier strategies, s25: 101.0 predicted, 91.6 compiled; with collective-permutes
    priced, s34: 101.2 predicted, 85.1 compiled). No resharding needs XLA's full rematerialization."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8 " + CPU_MEMORY_SCHEDULER_FLAG,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _PROMISE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROMISE "))
    got = json.loads(line[len("PROMISE "):])
    assert got["predicted"] <= got["budget"] and got["split"] > 0.5, got
    assert got["xla"] <= got["budget"] and -0.18 <= got["xla"] / got["predicted"] - 1 <= 0.10, got
    assert "Involuntary full rematerialization" not in proc.stderr


def test_budgeted_cpu_compile_warns_about_the_concurrent_scheduler(gpt_free, caplog, monkeypatch):
    """Without the flag (this process: XLA_FLAGS from conftest), compiling a budgeted plan for CPU
    devices says how to get the schedule the plan assumes, once."""
    monkeypatch.setattr(jit_module, "_warned_cpu_schedule", [])
    step, state, batch, free = gpt_free
    with caplog.at_level("WARNING", logger="alpa_pass"):
        _parallel(step, (1, 8), int(free.predicted_peak_bytes * 0.7)).get_executable(state, batch)
        _parallel(step, (1, 8), int(free.predicted_peak_bytes * 0.6)).get_executable(state, batch)
    warned = [r for r in caplog.records if CPU_MEMORY_SCHEDULER_FLAG in r.getMessage()]
    assert len(warned) == 1
