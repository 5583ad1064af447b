"""One benchmark case: a model size on a mesh, planned by alpa_pass and by each hand-written
baseline; every figure the report needs, as a JSON-ready dict."""
from __future__ import annotations

import math
import sys
import time

import jax

import alpa_pass as ap
from benchmarks import baselines, measure, summary
from benchmarks import step_trace
from benchmarks.cost_model import CostModel
from benchmarks.models import gpt_sizes, moe_transformer, wide_resnet
from zoo import default_optimizer, init_state, train_step_for

SUITES = {"gpt": gpt_sizes, "moe": moe_transformer, "wresnet": wide_resnet}
SUITE_METHODS = {"gpt": ("dp", "zero2", "zero3", "megatron"),
                 "moe": ("dp", "zero2", "zero3", "megatron", "expert"),
                 "wresnet": ("dp", "zero2", "zero3")}


def model_inputs(suite: str, config, abstract: bool):
    """``(loss_fn, optimizer, state, batch)``; ShapeDtypeStructs when ``abstract`` (no memory)."""
    mod, optimizer = SUITES[suite], default_optimizer()
    make_state = lambda: init_state(mod.init(jax.random.key(0), config), optimizer)  # noqa: E731
    make_batch = lambda: mod.make_batch(jax.random.key(1), config)  # noqa: E731
    if abstract:
        return mod.make_loss_fn(config), optimizer, jax.eval_shape(make_state), jax.eval_shape(make_batch)
    return mod.make_loss_fn(config), optimizer, make_state(), make_batch()


def auto_step(fn, mesh: ap.LogicalMesh, option: ap.AutoShardingOption | None = None):
    """``fn`` (``state, batch -> state, loss``) parallelized by alpa_pass's planner on ``mesh``, the
    state donated: the "auto" method of every case (in-process, mpirun, GPU checks)."""
    method = ap.ShardParallel(mesh=mesh) if option is None else ap.ShardParallel(mesh=mesh, option=option)
    return ap.parallelize(fn, method=method, donate_argnums=(0,))


def run_case(suite: str, size: str, mesh: ap.LogicalMesh, option: ap.AutoShardingOption,
             methods=None, run: bool = True, repeats: int = 9, unmerged: bool = True,
             interleave: bool = True, trace: bool = False) -> dict:
    """Plan, compile (and when ``run``, execute and time) auto and every baseline of ``suite``.

    ``interleave``: time the methods in rounds (``measure.time_interleaved``; every method's state
    is live at once), else one after another, each state freed before the next (a GPU-sized model).
    ``unmerged``: evaluate baselines that follower merging cannot express in the unmerged ILP
    (slower; off for the large sizes). ``trace``: also trace a few steps of every method and record
    where each device's time went (``benchmarks.step_trace``: compute vs collectives by kind)."""
    mod = SUITES[suite]
    config = mod.SIZES[size]
    loss_fn, optimizer, state, batch = model_inputs(suite, config, abstract=not run)
    fn = train_step_for(loss_fn, optimizer)
    result = {"suite": suite, "size": size, "config": _asdict(config),
              "params": sum(math.prod(x.shape) for x in jax.tree.leaves(state[0])),
              "mesh": {"shape": list(mesh.shape), "alpha": list(mesh.alpha), "beta": list(mesh.beta)},
              "devices": f"{len(jax.devices())} x {jax.devices()[0].device_kind}", "ran": run,
              "jax": jax.__version__}
    step = auto_step(fn, mesh, option)
    _progress(f"auto: plan + compile ({result['params'] / 1e6:.0f}M params, mesh {mesh.shape})")
    t = time.perf_counter()
    exe = step.get_executable(state, batch)
    auto = {"wall_s": time.perf_counter() - t, "objective": exe.plan.objective,
            "predicted": dict(exe.plan.predicted), "timings_s": dict(exe.plan.timings),
            "ilp_size": dict(exe.plan.ilp_size), "solver_status": exe.plan.solver_status,
            "mip_gap": exe.plan.mip_gap, **measure.compiled_stats(exe), "hlo": exe.hlo_text()}
    result["methods"] = {"auto": auto}
    jmesh = mesh.jax_mesh()
    for name in methods or SUITE_METHODS[suite]:
        rule = getattr(mod, "megatron_dim" if name == "megatron" else "expert_dim", None)
        base = baselines.make_baseline(name, state, batch, mesh.axis_names, mesh.shape, rule)
        jitted = baselines.jit_baseline(baselines.make_train_step(loss_fn, optimizer, base, jmesh), base, jmesh)
        _progress(f"{name}: compile")
        t = time.perf_counter()
        compiled = jitted.lower(state, batch).compile()
        result["methods"][name] = {"compile_s": time.perf_counter() - t, "baseline": base,
                                   "jitted": jitted, **measure.compiled_stats(compiled), "hlo": compiled.as_text()}
    _progress("cost model: baselines' layouts in the planner's ILP")
    t = time.perf_counter()
    result["cost_model"] = evaluate_baselines(fn, (state, batch), mesh, option, result["methods"], unmerged)
    result["cost_model"]["wall_s"] = time.perf_counter() - t
    if run:
        _progress("run and time every method")
        result["reference_loss"] = float(jax.jit(fn)(measure.fresh_copy(state), batch)[1])
        runner = lambda name: step if name == "auto" else result["methods"][name]["jitted"]  # noqa: E731
        if interleave:  # (auto first: vs_first is against auto)
            timings = measure.time_interleaved(
                {n: (runner(n), measure.fresh_copy(state), batch) for n in result["methods"]}, repeats)
        else:
            timings = {n: measure.time_steps(runner(n), measure.fresh_copy(state), batch, repeats)
                       for n in result["methods"]}
        for name, entry in result["methods"].items():
            entry["timing"] = timings[name]
            entry["loss_error"] = abs(entry["timing"]["first_loss"] - result["reference_loss"])
        if trace:
            _progress("trace every method's steps")
            for name, entry in result["methods"].items():
                _, entry["trace"] = step_trace.step_breakdown(runner(name), measure.fresh_copy(state), batch,
                                                              entry["hlo"])
    for entry in result["methods"].values():
        entry.pop("baseline", None), entry.pop("jitted", None), entry.pop("hlo", None)
    return result


def evaluate_baselines(fn, args, mesh, option, methods: dict, unmerged_fallback: bool = True) -> dict:
    """Each baseline's layout in alpa_pass's cost model: the planner's own problem, or, where follower
    merging makes the layout infeasible and ``unmerged_fallback``, the unmerged problem (whose free
    optimum is reported too)."""
    merged = CostModel(fn, args, mesh, option)
    out = {"auto_objective": methods["auto"]["objective"], "baselines": {}, "unmerged_free": None}
    unmerged = None
    for name, entry in methods.items():
        if name == "auto":
            continue
        specs = baselines.flat_specs(entry["baseline"])
        ev, model = merged.pinned(specs), "merged"
        if ev.status == "Infeasible" and unmerged_fallback:
            if unmerged is None:
                unmerged = CostModel(fn, args, mesh, _replace(option, merge_followers=False))
                free = unmerged.free()
                out["unmerged_free"] = {"objective": free.objective, "status": free.status}
            ev, model = unmerged.pinned(specs), "unmerged"
        infeasible = ev.status == "Infeasible" or ev.status.startswith(summary.OVER_BUDGET)
        out["baselines"][name] = {"objective": None if infeasible else ev.objective, "predicted": ev.predicted,
                                  "model": model,
                                  "status": ev.status, "unpinned": ev.unpinned,
                                  "auto_not_worse": None if infeasible else
                                  out["auto_objective"] <= ev.objective * (1 + 1e-4) + 1e-9}
    return out


def _progress(what: str) -> None:
    """One line on stderr per phase (``run_suite.py`` keeps the last ones of a case that times out)."""
    print(f"alpa_pass bench: {what}", file=sys.stderr, flush=True)


def _asdict(config) -> dict:
    import dataclasses

    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _replace(option, **changes):
    import dataclasses

    return dataclasses.replace(option, **changes)
