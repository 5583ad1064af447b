"""Unmerged refinement (``AutoShardingOption.refine_unmerged``, ``driver/refine.py``).

The merged-follower plan, re-solved in the unmerged ILP from a warm start, is never worse; on the
MoE test model (small enough to solve unmerged exactly) it reaches the unmerged optimum, and the
refined plan still computes what single-device ``jax.jit`` does.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import alpa_pass as ap
from alpa_pass import _core
from alpa_pass.extract.stablehlo import extract_graph
from alpa_pass.driver.jit import make_plan, plan_and_compile
from alpa_pass.driver.planning import core_graph
from alpa_pass.driver import refine
from alpa_pass.driver.refine import REFINE_MAX_COLUMNS, expand_assignment
from alpa_pass.solve.highs import solve_ilp
from alpa_pass.trace.lower import lower
from tests import helpers
from zoo import gpt, moe, setup

MESH = ap.LogicalMesh(shape=(2, 4))
MOE = moe.Config(experts=8, top_k=2)


def _plan(model, config, **option):
    step_fn, state, batches = setup(model, config, 1)
    plan, graph, _ = make_plan(step_fn, (state, batches[0]), MESH, ap.AutoShardingOption(**option))
    return plan, graph


@pytest.fixture(scope="module")
def moe_plans():
    return {mode: _plan(moe, MOE, refine_unmerged=mode)[0] for mode in ("auto", False)}


def test_moe_refined_reaches_unmerged_optimum(moe_plans):
    refined, merged = moe_plans["auto"], moe_plans[False]
    r = refined.refinement
    assert r["unmerged_columns"] <= REFINE_MAX_COLUMNS  # "auto" is on for this size
    assert r["solve"] == "unmerged" and r["unmerged_status"] == "Optimal"
    assert r["merged_objective"] == pytest.approx(merged.objective, rel=1e-9)
    assert refined.objective == pytest.approx(r["unmerged_objective"], rel=1e-9)
    assert refined.objective < 0.9 * merged.objective  # merging costs this model >10%
    exact, _ = _plan(moe, MOE, merge_followers=False)
    assert exact.refinement["skipped"].startswith("merge_followers=False")
    assert refined.objective == pytest.approx(exact.objective, rel=1e-4)  # solver_rel_gap
    assert refined.ilp_size["columns"] == r["unmerged_columns"]
    assert "solve: unmerged ILP kept" in refined.summary(max_rows=1)


def test_refine_false_keeps_the_merged_plan(moe_plans):
    merged = moe_plans[False]
    assert merged.refinement == {"solve": "merged", "merged_objective": merged.objective,
                                 "skipped": "refine_unmerged=False"}
    assert "refine" not in merged.timings
    assert merged.ilp_size["columns"] < moe_plans["auto"].ilp_size["columns"]  # the merged ILP
    assert "unmerged refinement skipped (refine_unmerged=False)" in merged.summary(max_rows=1)


def test_moe_refined_plan_matches_single_device():
    step_fn, state, batches = setup(moe, MOE, steps=2)
    ref = helpers.reference_run(step_fn, state, batches)
    step = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=MESH, option=ap.AutoShardingOption()))
    assert step.get_executable(state, batches[0]).plan.refinement["solve"] == "unmerged"
    helpers.assert_same_run(ref, helpers.run_steps(step, state, batches), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_gpt_refined_not_worse_under_a_node_limit(monkeypatch):
    """The 2-layer GPT's unmerged ILP (~262k columns; "auto" stopped at 200k columns before session
    48) refines on "auto" within the LP work bound (its LP: 14.0k of REFINE_LP_ITERATIONS simplex
    iterations; 145,983 -> 136,980). With the bound below what that LP needs, "auto" keeps the
    merged plan and says why: a skip that depends on simplex iterations, not on the clock; so does
    a column cap below its size. Forced on, neither applies; with a tiny node limit the warm start
    still guarantees a plan no worse than the merged one (the node limit, not the time limit,
    stopped it)."""
    auto, _ = _plan(gpt, gpt.Config(layers=2))  # no wall-clock limit by default
    merged = auto.refinement["merged_objective"]
    assert REFINE_MAX_COLUMNS >= auto.refinement["unmerged_columns"] > 200_000
    assert auto.refinement["solve"] == "unmerged" and auto.refinement["unmerged_status"] == "LP-support plan"
    assert auto.objective < 0.97 * merged
    monkeypatch.setattr(refine, "REFINE_LP_ITERATIONS", 2000)
    bounded, _ = _plan(gpt, gpt.Config(layers=2))
    assert re.fullmatch(r"its LP relaxation \(\d+ columns, \d+ rows\) needs over 2000 simplex iterations",
                        bounded.refinement["skipped"]), bounded.refinement
    assert bounded.objective == bounded.refinement["merged_objective"] == merged
    monkeypatch.setattr(refine, "REFINE_MAX_COLUMNS", 200_000)
    capped, _ = _plan(gpt, gpt.Config(layers=2))
    assert capped.refinement["skipped"].startswith("unmerged ILP has") and capped.objective == merged
    monkeypatch.undo()
    forced, _ = _plan(gpt, gpt.Config(layers=2), refine_unmerged=True, refine_node_limit=1)
    r = forced.refinement
    assert "time_limited" not in r
    assert r["merged_objective"] == pytest.approx(merged, rel=1e-9)
    assert forced.objective <= r["merged_objective"]
    assert forced.objective == pytest.approx(min(r["merged_objective"], r["unmerged_objective"]), rel=1e-9)


@pytest.mark.slow
def test_budgeted_refinement_keeps_the_budget(moe_plans):
    """Under a binding budget the forced unmerged re-solve adds memory rows as its plans break them
    (from those the merged plan nearly fills): the kept plan is no worse than the merged one and
    meets the budget, reshard copies included. "auto" skips it (memory rows keep the unmerged
    chains from being eliminated: GPT-175B 16x16 at 80 GiB ran for minutes)."""
    free = moe_plans[False]
    budget = int(free.predicted_peak_bytes * 0.95)  # (0.9: no merged plan fits)
    merged, _ = _plan(moe, MOE, refine_unmerged=False, memory_budget_per_device=budget)
    refined, _ = _plan(moe, MOE, refine_unmerged=True, memory_budget_per_device=budget)
    r = refined.refinement
    assert merged.objective > free.objective * (1 + 1e-6), "the budget does not bind: weak test"
    assert r["merged_objective"] == pytest.approx(merged.objective, rel=1e-9)
    assert "unmerged_objective" in r, r
    assert r["solve"] == "unmerged" and refined.objective < merged.objective, r  # (MoE: 10395 vs 15770)
    assert refined.objective <= merged.objective * (1 + 1e-9)
    assert refined.predicted_peak_bytes <= budget and merged.predicted_peak_bytes <= budget
    auto, _ = _plan(moe, MOE, memory_budget_per_device=budget)  # "auto" leaves a binding budget merged
    assert auto.refinement["skipped"].startswith("the budget binds") and auto.objective == merged.objective


@pytest.mark.parametrize("tie", [True, False])
def test_expanded_start_has_the_merged_objective(tie):
    """Every node keeps its (output, operand) specs: same objective, no violation, ties respected."""
    step_fn, state, batches = setup(moe, MOE, 1)
    graph = extract_graph(lower(step_fn, (state, batches[0])).compiler_ir("stablehlo"))
    option = ap.AutoShardingOption(tie_repeated_layers=tie)
    merged = _core.build_sharding_problem(core_graph(graph), MESH.to_core(), option.to_core(), [])
    unmerged = _core.build_sharding_problem(core_graph(graph), MESH.to_core(),
                                            dataclasses.replace(option, merge_followers=False).to_core(), [])
    solution = solve_ilp(merged.ilp)
    start, conflict = expand_assignment(merged, solution.assignment, unmerged, graph.num_nodes)
    assert conflict is None
    result = _core.evaluate(unmerged.ilp, start)
    assert not result.violations
    assert result.objective == pytest.approx(solution.objective, rel=1e-6)


def test_option_validation():
    with pytest.raises(ValueError, match="refine_unmerged"):
        ap.AutoShardingOption(refine_unmerged="yes")
    with pytest.raises(ValueError, match="start assignment"):
        solve_ilp(_core.build_ilp([np.array([1.0, 2.0])], []), start=np.array([2]))


def _beam_scores(w, h):
    """A beam search's step: logits [B, K, V] from a vocabulary-split projection, flattened to
    [B, K * V] for top_k (a reshape that cannot keep the split of its minor dim)."""
    top, _ = jax.lax.top_k(jnp.einsum("bkh,hv->bkv", h, w).reshape(32, 4 * 800), 4)
    return top.sum()


def test_a_reshape_that_gathers_inside_the_op_is_refined():
    """The merged reshape follower reads its operand split on V and gathers inside the op; the
    unmerged reshape reads it gathered (the edge pays the same all-gather). The expansion
    matched only identical operand specs (and then one strategy per tied group, the scalar output
    taking another of its producer's equal-looking strategies): the refinement was skipped and
    the plan stayed 8x costlier (153605 vs 19208 on 2x4; a GRU beam search 4.2e6 vs 1.5e6)."""
    w = jax.random.normal(jax.random.key(0), (64, 800), jnp.float32)
    h = jax.random.normal(jax.random.key(1), (32, 4, 64), jnp.float32)
    # compute as a tie-breaker only (1e-9 per FLOP): the merged plan then keeps the reshape's in-op
    # gather (at the default 1e-4 its reshape reads its operand gathered already: nothing to move)
    plan, exe = plan_and_compile(_beam_scores, (w, h), MESH, ap.AutoShardingOption(compute_cost_per_flop=1e-9),
                                 pinned_args=[[-1, 1], [-1, -1]])  # w split on V (another plan's layout)
    r = plan.refinement
    assert "skipped" not in r and r["solve"] == "unmerged" and r["gathered_on_edges"] >= 1, r
    assert plan.objective < 0.2 * r["merged_objective"], r
    jmesh = MESH.jax_mesh()
    args = [jax.device_put(a, NamedSharding(jmesh, s)) for a, s in zip((w, h), plan.input_specs)]
    assert plan.input_specs[0] == P(None, "y")
    np.testing.assert_allclose(float(exe(*args)), float(jax.jit(_beam_scores)(w, h)), rtol=1e-5)


def test_the_merged_plan_of_runs_vmapped_over_seeds_splits_the_seeds():
    """PureJaxRL's ``jax.jit(jax.vmap(train))(keys)``: 8 independent runs, each initialising its
    weights from its key and training them in a scan. Splitting the seed dim over the whole mesh
    needs no communication. The merged ILP could not: threefry's ``counts + key`` (both broadcast;
    the counts [64, 64] to [8, 64, 64]) followed the counts, so the init, the scan's carries and
    the weights of every run were one group without a seed split (the PPO of the probe: merged
    objective 5.9e6 on 2x4, too big to refine unmerged; the core's ``narrowed_by_broadcast``)."""
    import optax

    tx = optax.adam(1e-3)

    def train(key):
        k1, k2 = jax.random.split(key)
        w = {"a": jax.random.normal(k1, (64, 64)) * 0.1, "b": jax.random.normal(k2, (64, 2)) * 0.1}

        def step(carry, k):
            w, o = carry
            x = jax.random.normal(k, (1024, 64))
            loss, g = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w["a"]) @ w["b"]) ** 2))(w)
            u, o = tx.update(g, o, w)
            return (optax.apply_updates(w, u), o), loss

        return jax.lax.scan(step, (w, tx.init(w)), jax.random.split(key, 4))[1]

    keys = jax.random.split(jax.random.key(0), 8)
    plan, graph, _ = make_plan(jax.vmap(train), (keys,), MESH, ap.AutoShardingOption(refine_unmerged=False))
    assert plan.predicted["communication"] == plan.predicted["resharding"] == 0, plan.predicted
    carries = [v for v in range(graph.num_nodes) if graph.op_names[v] == "stablehlo.while"
               and graph.shape(v) == (8, 64, 64)]
    assert carries and all(list(plan.node_specs[v]) == [0, 0] for v in carries)  # seeds over x and y


def test_a_pinns_laplacian_tangents_do_not_split_its_merged_plan():
    """A PINN's Laplacian by jvp-of-grad, vmapped over collocation points: the tangent of the first
    layer's pre-activation is ``W @ e_i``, one (64,) vector for all points, broadcast over them.
    That dot is tiny, so it may run replicated (``tiny_heavy_flops``); forced to split (Alpa's rule
    for heavy ops) its merged group split the broadcast's hidden dim and every use resharded the
    (4096, 64) activation: the merged plan predicted 5.46e7 of resharding on 1x8 in the L-BFGS step
    of a 16k-point PINN (7x its unmerged plan, which on 2x4 is over the refinement cap). Now the
    merged plan reshards nothing and trains as jax.jit; the refinement only splits, over the points,
    the broadcasts that the merged plan computes replicated with the tiny dot they follow (the same
    communication, less compute)."""
    def u(p, x):
        h = jnp.tanh(x @ p["w0"] + p["b0"])
        h = jnp.tanh(h @ p["w1"] + p["b1"])
        return (h @ p["w2"])[0]

    def laplacian(p, x):
        g = lambda x: jax.grad(u, argnums=1)(p, x)  # noqa: E731
        return sum(jax.jvp(g, (x,), (jnp.eye(2)[i],))[1][i] for i in range(2))

    def step(p, xs):
        def loss(p):
            res = jax.vmap(lambda x: laplacian(p, x) + jnp.sin(x[0]) * jnp.sin(x[1]))(xs)
            return jnp.mean(res ** 2)
        value, grads = jax.value_and_grad(loss)(p)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, grads), value

    rng = np.random.default_rng(0)
    p = {"w0": rng.standard_normal((2, 64)), "b0": np.zeros(64), "w1": rng.standard_normal((64, 64)) / 8,
         "b1": np.zeros(64), "w2": rng.standard_normal((64, 1)) / 8}
    p = jax.tree.map(lambda a: a.astype(np.float32), p)
    xs = rng.random((4096, 2)).astype(np.float32)
    mesh = ap.LogicalMesh(shape=(1, 8))
    merged, _, _ = make_plan(step, (p, xs), mesh, ap.AutoShardingOption(refine_unmerged=False))
    assert merged.predicted["resharding"] == 0.0, merged.summary()
    splits = [c for c in merged.choices if c.kind == "DOT" and c.shape == (4096, 64)]
    assert splits and all(str(c.spec) == "P('y', None)" for c in splits), splits
    plan, compiled = plan_and_compile(step, (p, xs), mesh, ap.AutoShardingOption())
    assert plan.objective <= merged.objective and plan.predicted["resharding"] == 0.0, plan.summary()
    assert helpers.communication(plan) == pytest.approx(helpers.communication(merged), rel=1e-9)
    got, want = compiled(p, xs), jax.jit(step)(p, xs)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)
