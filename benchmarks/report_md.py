"""The markdown of the benchmark report (``benchmarks/report.py`` writes it with the plots).

Sections: a README-ready summary (headline ratios, where measurement and prediction disagree, how
to re-run), the cost-model check (auto never worse than a baseline), one section per case, the
cases that hit their time limit, the multi-process (``mpirun``) cases and the GPU cases.
"""
from __future__ import annotations

from benchmarks import summary

RERUN = [
    "Re-run (from the repository root, venv active; every command writes `benchmarks/report/data/*.json`):",
    "",
    "```bash",
    "python benchmarks/run_suite.py gpt --report-dir benchmarks/report          # small sizes: 8 CPU devices, run + timed",
    "python benchmarks/run_suite.py moe --report-dir benchmarks/report",
    "python benchmarks/run_suite.py wresnet --report-dir benchmarks/report",
    "nice python benchmarks/run_suite.py gpt --size 1.3B,2.6B --report-dir benchmarks/report   # 64 CPU devices, compiled only",
    "nice python benchmarks/run_suite.py gpt --size 39B --case-timeout 1500 --report-dir benchmarks/report",
    "nice python benchmarks/run_suite.py gpt --size 39B --budget 80 --case-timeout 1500 --report-dir benchmarks/report  # auto under 80 GiB per device",
    "nice python benchmarks/run_suite.py moe --size 380M --report-dir benchmarks/report",
    "nice python benchmarks/run_suite.py wresnet --size 250M --report-dir benchmarks/report",
    "python benchmarks/run_suite.py gpt --mpirun 2 --methods dp,zero2,zero3,megatron --report-dir benchmarks/report  # 2 processes x 4 CPU devices",
    "python benchmarks/run_suite.py moe --mpirun 2 --methods dp,zero2,zero3,megatron,expert --report-dir benchmarks/report",
    "python benchmarks/run_suite.py wresnet --mpirun 2 --methods dp,zero2,zero3 --report-dir benchmarks/report",
    "alpa-pass profile --cpu-devices 8 --out benchmarks/report/profile_cpu-cpu-8dev-1x8.json",
    "python benchmarks/run_suite.py gpt --profile benchmarks/report/profile_cpu-cpu-8dev-1x8.json --trace --repeats 21 --report-dir benchmarks/report  # (and moe, wresnet)",
    "alpa-pass run -np 2 --cpu-devices-per-process 4 python/alpa_pass/tools/profile.py --out benchmarks/report/profile_cpu-cpu-8dev-2x4.json",
    "python benchmarks/run_suite.py gpt --mpirun 2 --methods dp,zero2,zero3,megatron --repeats 15 --profile benchmarks/report/profile_cpu-cpu-8dev-2x4.json --report-dir benchmarks/report  # (and moe, wresnet)",
    "python benchmarks/run_suite.py gpt --gpu --report-dir benchmarks/report       # 'skipped: no GPU' without one",
    "python benchmarks/report.py                                                   # this page and the plots",
    "```",
    "",
    "`--size large` runs every Alpa size of a suite, each in a child process killed after `--case-timeout` "
    "seconds (default 600; a killed case is listed under *Time limits hit*).",
]


def name(r: dict) -> str:
    return (f"{r['suite']}_{r['size']}_{'x'.join(map(str, r['mesh']['shape']))}{_budget(r, '_budget{:g}')}"
            f"{'_profiled' if r.get('profile') else ''}")


def _budget(r: dict, form: str) -> str:
    """``form`` filled with the case's memory budget in GiB (``run_suite --budget``), else ''."""
    budget = r.get("memory_budget_per_device")
    return "" if budget is None else form.format(budget / 2**30)


def label(r: dict, mesh: bool = True, processes: bool = True) -> str:
    """A case as the tables name it: suite, size, mesh (unless ``mesh=False``, where a column or
    the sentence names it), whether planned with a measured profile, and the process count of an
    mpirun case (unless ``processes=False``, where the sentence says so)."""
    shape = f" {'x'.join(map(str, r['mesh']['shape']))}" if mesh else ""
    procs = f", mpirun -np {r['processes']}" if processes and r.get("processes", 1) > 1 else ""
    return f"{r['suite']} {r['size']}{shape}{_budget(r, ' ({:g} GiB budget)')}{' (profiled)' if r.get('profile') else ''}{procs}"


def params_text(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def _ratio(v, best) -> str:
    return "—" if v is None else f"{v:.2f}x ({best})"


def headline_table(results: list[dict]) -> list[str]:
    """One row per case: auto's figures over the best baseline's on each (lower is better for auto)."""
    lines = ["| case | params | mesh | ran | planning s | predicted cost | comm/dev | peak mem/dev | step time |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        h = summary.headline(r)
        lines.append(f"| {label(r, mesh=False)} | {params_text(r['params'])} | {'x'.join(map(str, r['mesh']['shape']))} "
                     f"| {'yes' if r['ran'] else 'compiled only'} | {h['planning_s']:.1f} "
                     f"| {_ratio(h['objective_vs_best'], h['objective_best'])} "
                     f"| {_ratio(h['comm_vs_best'], h['comm_best'])} | {_ratio(h['peak_vs_best'], h['peak_best'])} "
                     f"| {_ratio(h['time_vs_best'], h['time_best'])} |")
    return lines


def summary_section(results, timed_out, mpi) -> list[str]:
    """The README-ready top of the report."""
    out = ["## Summary", "",
           "Each figure is auto's over the best hand-written baseline's for that figure (named in brackets; "
           "< 1.00x: auto is better). *Predicted cost* is alpa_pass's ILP objective (alpha-beta model); "
           "comm and peak memory are read from the compiled, partitioned HLO (per device); step time is "
           "measured (median) on simulated CPU devices that share 2 cores. *Planning s* is wall clock for "
           "auto's plan + XLA compile on those 2 cores, shared with other jobs (the large cases ran under `nice`, "
           "so read them as upper bounds); step times on this shared machine vary from run to run (a repeat of "
           "the small GPT case once measured dp at 0.29x auto's step time, here 0.92x).", ""]
    out += headline_table(results) + [""]
    out += memory_note(results)
    merged = [(name(r), v) for r in results for v in summary.violations(r)]
    unmerged = [(name(r), v) for r in results for v in summary.violations(r, "unmerged")]
    out.append("**Cost model check.** " + (
        "The auto plan's objective is <= every baseline's evaluated in the planner's own ILP, in every case."
        if not merged else "VIOLATIONS: " + "; ".join(f"{c}: {v}" for c, v in merged) + "."))
    if unmerged:
        out[-1] += (" But follower merging costs optimality: with merging off (the unmerged ILP), a plan with "
                    "these baselines' layouts is cheaper than auto's — " + "; ".join(f"{c}: {v}" for c, v in unmerged)
                    + " (a predicted-cost ratio above 1.00x in the table comes from this).")
    out.append("")
    dis = [(name(r), d) for r in results for d in summary.disagreements(r)]
    if dis:
        out += ["**Where measurement disagrees with the prediction.** On simulated CPU devices the cost model's "
                "ranking does not hold for these baselines: they are predicted costlier than auto but ran faster. "
                "The devices share 2 cores and their 'network' is memory copies, so communication (what the model "
                "counts) is cheap, while auto's extra resharding ops (all-to-all, collective-permute: memory copies here) "
                "and smaller per-device matmuls likely are what the clock sees; the model has no term for either. "
                "Under `mpirun`, where collectives cross processes, the ranking moves toward the prediction "
                "(section *Several processes*).", ""]
        out += [f"- {c}: {d}" for c, d in dis] + [""]
    dis = [(name(r), d) for r in results for d in summary.compiled_disagreements(r)]
    if dis:
        out += ["**Where the compiled HLO disagrees with the prediction.** The cost model ranks auto at least as "
                "cheap as these baselines, but XLA's partitioned module says otherwise on communication bytes or "
                "peak memory per device (XLA's SPMD partitioner falls back to replicating some tensors it cannot "
                "reshard directly — the 'Involuntary full rematerialization' warnings — which the model does not "
                "foresee; its peak-memory estimate also ignores buffer reuse):", ""]
        out += [f"- {c}: {d}" for c, d in dis] + [""]
    for m in mpi:
        t = {n: e["timing"]["median_s"] for n, e in m["methods"].items()}
        others = ", ".join(f"{n} {t[n] / t['auto']:.2f}x" for n in t if n != "auto")
        out += [f"Under `mpirun` ({m['processes']} processes x {m['local_devices']} CPU devices, gloo collectives), "
                f"{label(m, processes=False)}: baselines' step time over auto's: {others}.", ""]
    if timed_out:
        out += ["Time limits hit (not in the table): " + ", ".join(
            f"{r['suite']} {r['size']} ({r['limit_s']:.0f} s)" for r in timed_out) + ".", ""]
    return out + RERUN + [""]


def memory_note(results: list[dict]) -> list[str]:
    """The notes on memory: per budgeted case, the baselines that do not fit its budget; the
    unbudgeted cases whose auto plan peaks over 1.5x the leanest baseline."""
    heavy = [f"{r['suite']} {r['size']} {summary.headline(r)['peak_vs_best']:.1f}x"
             for r in results if (summary.headline(r)["peak_vs_best"] or 0) > 1.5
             and r.get("memory_budget_per_device") is None]
    out = []
    for r in results:
        over = summary.over_budget_compiled(r)
        if over:
            out += [f"**{label(r)}.** Auto's plan compiles to {r['methods']['auto']['memory']['peak'] / 2**30:.1f} GiB "
                    f"per device; these baselines compile to more than the budget and are left out of its cost, comm "
                    f"and time ratios: " + ", ".join(f"{n} {p / 2**30:.1f} GiB" for n, p in over.items()) + ".", ""]
    if not heavy:
        return out
    return out + ["**Memory.** Where no memory budget was set (`AutoShardingOption.memory_budget_per_device`; "
                  "`run_suite.py --budget`), the planner minimises communication and resharding only, so its "
                  "plans keep more per device than the ZeRO baselines, which shard state to save memory: auto's "
                  "compiled peak over the leanest baseline's: " + ", ".join(heavy) + ".", ""]


def cost_model_section(results: list[dict]) -> list[str]:
    flagged = [(name(r), v) for r in results for v in summary.violations(r)]
    out = ["## Auto plan vs. baselines under alpa_pass's own cost model", ""]
    out += ([f"- **VIOLATION** {c}: {v}" for c, v in flagged] if flagged else
            ["No violations in the planner's own (merged) ILP: in every case the auto plan's objective is "
             "<= every baseline layout's (baselines evaluated as the cheapest plan with their argument "
             "layouts pinned)."])
    merging = [(name(r), v) for r in results for v in summary.violations(r, "unmerged")]
    out += [f"- **FOLLOWER MERGING LOSES OPTIMALITY** {c}: {v}" for c, v in merging]
    infeasible = [(name(r), b) for r in results for b, e in r["cost_model"]["baselines"].items()
                  if not summary.evaluated(e) and not summary.over_budget(e)]
    over = [(name(r), b, e["status"]) for r in results for b, e in r["cost_model"]["baselines"].items()
            if summary.over_budget(e)]
    if over:
        out += ["", "Not compared with auto (their layouts do not fit the case's memory budget, which auto's "
                    "plan meets): " + "; ".join(f"{b} in {c}: {s}" for c, b, s in over) + "."]
    if infeasible:
        out += ["", "Not evaluated (their layouts are infeasible in the merged ILP, and the unmerged ILP of a "
                    "large model was not built): " + ", ".join(f"{b} in {c}" for c, b in infeasible) + "."]
    return out + ["", "![planning time](planning_time.png)", ""]


def case_section(r: dict) -> list[str]:
    auto = r["methods"]["auto"]
    lines = [f"## {label(r, mesh=False)} — {r['params'] / 1e6:,.1f}M params, mesh "
             f"{'x'.join(map(str, r['mesh']['shape']))} ({r['devices']}{'' if r['ran'] else ', compiled only'})", "",
             f"Planning: {auto['wall_s']:.1f}s (" + ", ".join(f"{k} {v:.2f}s" for k, v in auto["timings_s"].items())
             + f"); ILP {auto['ilp_size']['groups']} groups, {auto['ilp_size']['columns']} columns, "
             f"{auto['ilp_size']['rows']} rows; solver {auto['solver_status']}."]
    if r.get("profile"):
        lines[-1] += (f" Planned and costed with the measured profile `{r['profile']['path']}`: objectives are "
                      f"predicted step times in seconds.")
    compile_s = {n: e["compile_s"] for n, e in r["methods"].items() if "compile_s" in e}
    if compile_s:
        lines[-1] += " Baseline XLA compile: " + ", ".join(f"{n} {s:.1f}s" for n, s in compile_s.items()) + "."
    if r["cost_model"].get("wall_s"):
        lines[-1] += f" Baselines' layouts evaluated in the cost model in {r['cost_model']['wall_s']:.1f}s."
    lines += ["", "| method | objective | evaluated in | comm MiB/dev | peak MiB/dev | predicted peak | step ms | vs auto "
                  "| loss err | collectives |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    fmt = lambda v, f: "—" if v is None or v == float("inf") else format(v, f)  # noqa: E731
    for row in summary.rows(r):
        coll = ", ".join(f"{k} {v}" for k, v in row["collectives"].items()) or "none"
        lines.append(f"| {row['method']} | {fmt(row['objective'], '.4g')} | {row['model']} | {row['comm_mib']:,.2f} | "
                     f"{row['peak_mib']:,.2f} | {fmt(row['predicted_peak_mib'], ',.2f')} | {fmt(row['step_ms'], '.1f')} | {fmt(row['time_vs_auto'], '.2f')} | "
                     f"{fmt(row['loss_error'], '.1e')} | {coll} |")
    free = r["cost_model"].get("unmerged_free")
    if free:
        lines += ["", f"Baselines marked *unmerged* cannot be expressed with follower merging on (an output "
                      f"tied to its input must share a strategy with a merged chain); they are evaluated in the "
                      f"unmerged ILP, whose own optimum is {free['objective']:.4g} ({free['status']}; "
                      f"{free['objective'] / auto['objective']:.2f}x the planner's merged optimum)."]
    for v in summary.violations(r):
        lines += ["", f"**VIOLATION: {v}**"]
    for v in summary.violations(r, "unmerged"):
        lines += ["", f"**FOLLOWER MERGING LOSES OPTIMALITY: {v}** — the unmerged ILP holds a plan with "
                      f"this baseline's layouts that is cheaper than the planner's merged optimum."]
    dis = summary.disagreements(r)
    if dis:
        lines += ["", "**Measured step times disagree with the cost model** (predicted costlier, ran faster):", ""]
        lines += [f"- {d}" for d in dis]
    dis = summary.compiled_disagreements(r)
    if dis:
        lines += ["", "**The compiled HLO disagrees with the cost model:**", ""] + [f"- {d}" for d in dis]
    return lines + trace_table(r) + ["", f"![{name(r)}]({name(r)}.png)", ""]


def trace_table(r: dict) -> list[str]:
    """Where each method's step time went on each device (``run_suite.py --trace``) beside what
    the cost model predicted for compute and for communication."""
    rows = summary.trace_rows(r)
    if not rows:
        return []
    fmt = lambda v: "—" if v is None else f"{v:.1f}"  # noqa: E731
    out = ["", "Traced steps (`--trace`: `jax.profiler`, ms per device per step; a collective's time includes "
               "waiting for the other devices):", "",
           "| method | step ms | predicted compute | traced compute | predicted comm | traced in collectives | by kind |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for t in rows:
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in t["by_kind"].items()) or "none"
        out.append(f"| {t['method']} | {t['step_ms']:.1f} | {fmt(t['predicted_compute_ms'])} | {t['compute_ms']:.1f} | "
                   f"{fmt(t['predicted_comm_ms'])} | {t['collectives_ms']:.1f} | {kinds} |")
    return out


def timed_out_section(timed_out: list[dict]) -> list[str]:
    if not timed_out:
        return []
    out = ["## Time limits hit", "", "| case | mesh | limit s | last phase reached |", "|---|---|---:|---|"]
    for r in timed_out:
        last = "; ".join(r.get("last_output") or ["—"])
        out.append(f"| {r['suite']} {r['size']} | {'x'.join(map(str, r['mesh']['shape']))} | {r['limit_s']:.0f} | {last} |")
    return out + [""]


def mpi_section(mpi: list[dict], results: list[dict]) -> list[str]:
    """Per mpirun case its table, and the same case's step times in one process for comparison."""
    if not mpi:
        return []
    out = ["## Several processes (`mpirun`)", ""]
    for m in mpi:
        auto = m["methods"]["auto"]["timing"]["median_s"]
        planned = (f"auto planned with the measured profile `{m['profile']['path']}` (cluster "
                   f"{m['profile']['key']}); " if m.get("profile") else "")
        out += [f"{label(m, processes=False)}: {m['processes']} processes x {m['local_devices']} simulated CPU devices, {planned}"
                f"one global mesh {'x'.join(map(str, m['mesh']['shape']))} (CPU collectives go through gloo); "
                f"every rank made the same plan: {'yes' if len(set(m['digests'])) == 1 else '**no**'}. "
                f"Command: `{m['command']}`.", "",
                "| method | comm MiB/dev | peak MiB/dev | step ms | vs auto | loss err |", "|---|---:|---:|---:|---:|---:|"]
        for n, e in m["methods"].items():
            t = e["timing"]["median_s"]
            out.append(f"| {n} | {sum(k['wire_bytes'] for k in e['comm'].values()) / 2**20:.2f} | "
                       f"{e['memory']['peak'] / 2**20:.2f} | {t * 1e3:.1f} | {t / auto:.2f} | {e['loss_error']:.1e} |")
        one = [r for r in results if name(r) == name(m) and r["ran"]]
        if one:
            t1 = {n: e["timing"]["median_s"] for n, e in one[0]["methods"].items() if n in m["methods"]}
            out += ["", "The same case in one process (8 simulated devices, no gloo): " + ", ".join(
                f"{n} {t * 1e3:.1f} ms ({t / t1['auto']:.2f}x auto)" for n, t in t1.items()) + "."]
        # the case's own evaluation of the baselines, else the one-process case's when both planned
        # with the same costs (unit costs, or one profile; a 1x8 profile does not price a 2x4 cluster)
        cm = m.get("cost_model")
        if cm is None and one and (one[0].get("profile") or {}).get("key") == (m.get("profile") or {}).get("key"):
            cm = one[0]["cost_model"]
        if cm is not None:
            faster = [f"{n} (predicted {cm['baselines'][n]['objective'] / cm['auto_objective']:.2f}x auto's cost, "
                      f"measured {m['methods'][n]['timing']['median_s'] / auto:.2f}x)" for n in m["methods"]
                      if n != "auto" and n in cm["baselines"] and summary.evaluated(cm["baselines"][n])
                      and cm["baselines"][n]["objective"] > cm["auto_objective"]
                      and m["methods"][n]["timing"]["median_s"] < auto]
            if faster:
                out += ["", "Measured faster than auto under `mpirun` although predicted costlier: "
                        + ", ".join(faster) + "."]
        out.append("")
    return out


def gpu_section(results: list[dict], memory: dict | None = None) -> list[str]:
    """Per GPU case: throughput, MFU, the step's kernel time (traced) and the plan's prediction;
    then ``memory`` (``benchmarks/gpu_memory.py``'s JSON): the default budget and predicted vs
    compiled vs measured peak."""
    gpu = [r for r in results if r.get("gpu")]
    out = ["## GPU", ""]
    if not gpu:
        return out + ["No GPU case yet: `python benchmarks/run_suite.py gpt --gpu` runs the small case on all local "
                      "GPUs (mesh 1xN) and adds samples/s, tokens/s, model TFLOP/s per device and MFU against the "
                      "device's dense TF32 peak (`benchmarks/flops.py`); it prints `skipped: no GPU` and exits 0 "
                      "where there is none.", ""]
    out += ["`scripts/gpu_check.sh` on the lent machine; *kernels* is the GPU's kernel time per step from a "
            "profiler trace (`--trace`: the rest of the step is the host launching it and Python's per-call "
            "work).", ""]
    for r in gpu:
        g = r["gpu"]
        out += [f"{r['suite']} {r['size']} (batch {r['config']['batch']}) on {g['devices']} x {g['device_kind']} "
                f"(peak {g['peak_tflops']} TFLOP/s {g['precision']}; {g['model_flops_per_step'] / 1e12:.3g} model "
                f"TFLOP per step; jax {r.get('jax', '?')})", "",
                "| method | step ms | kernels ms | samples/s | model TFLOP/s/dev | MFU |",
                "|---|---:|---:|---:|---:|---:|"]
        for n, f in g["methods"].items():
            entry = r["methods"][n]
            mfu = "—" if f["mfu"] is None else f"{100 * f['mfu']:.1f}%"
            kernels = entry.get("trace", {}).get("compute_ms")
            kernels = "—" if kernels is None else f"{kernels + entry['trace']['collectives_ms']:.2f}"
            out.append(f"| {n} | {entry['timing']['median_s'] * 1e3:.2f} | {kernels} | "
                       f"{f['samples_per_s']:.1f} | {f['model_tflops_per_device']:.2f} | {mfu} |")
        out.append("")
    if memory:
        fit, big = memory["fits"], memory["too_big"]
        gib = lambda b: "—" if not b else f"{b / 2**30:.2f}"  # noqa: E731
        out += [f"Memory by default ({memory['devices']}, jax {memory['jax']}; `benchmarks/gpu_memory.py`): "
                f"GPT {fit['size']} batch {fit['batch']} planned with `AutoShardingOption()`: {fit['budget_line']}.", "",
                "| per device | GiB |", "|---|---:|",
                f"| predicted peak (plan) | {gib(fit['predicted_peak_bytes'])} |",
                f"| compiled peak (memory_analysis: arguments + outputs - aliased + temps) | "
                f"{gib(fit['compiled']['peak'])} |",
                f"| measured peak (memory_stats peak_bytes_in_use after {len(fit['losses'])} steps) | "
                f"{gib(fit['measured'].get('peak_bytes_in_use'))} |", "",
                f"GPT {big['size']} ({big['params'] / 1e9:.1f}B parameters) under the same default budget: "
                f"`{big['error']}` after {big['wall_s']:.1f} s: \"{big.get('message', '')}\"", ""]
    return out


def ranking_section(results: list[dict]) -> list[str]:
    """Spearman's rank correlation of predicted cost against measured median step time over each
    case's plans, and over all the plans of the cases planned with a measured profile (whose
    objectives are seconds, so comparable across cases)."""
    ran = [r for r in results if r["ran"] and len(summary.predicted_vs_measured(r)) >= 3]
    if not ran:
        return []
    out = ["## Predicted vs measured step time", "",
           "Spearman's rank correlation of each plan's predicted cost (the ILP objective: auto's plan, and each "
           "baseline's layouts evaluated in the same ILP) against its measured median step time, over the plans "
           "of one case; *profiled* cases are planned and costed with `benchmarks/report/profile_*.json` "
           "(objective in seconds), the others with unit alpha-beta costs (no compute term).", "",
           "| case | plans | rank correlation | predicted (s or units) / measured ms per plan |", "|---|---:|---:|---|"]
    for r in ran:
        pm = summary.predicted_vs_measured(r)
        rho = summary.spearman([p for _, p, _ in pm], [t for _, _, t in pm])
        unit = "s" if r.get("profile") else ""
        out.append(f"| {label(r)} | {len(pm)} | {'—' if rho is None else f'{rho:.2f}'} | "
                   + ", ".join(f"{m} {p:.4g}{unit} / {t * 1e3:.1f}" for m, p, t in pm) + " |")
    keys = sorted({r["profile"].get("key") or "" for r in ran if r.get("profile")})
    for key in keys:  # pooled per profile: seconds of one cluster's costs compare across its cases
        pooled = [x for r in ran if r.get("profile") and (r["profile"].get("key") or "") == key
                  for x in summary.predicted_vs_measured(r)]
        rho = summary.spearman([p for _, p, _ in pooled], [t for _, _, t in pooled])
        out += ["", f"Over all {len(pooled)} plans of the cases profiled as `{key}`: rank correlation "
                    f"{'—' if rho is None else f'{rho:.2f}'} (it mixes models of different sizes, which rank "
                    f"easily; the per-case figures are the harder test)."]
    return out + [""]


def markdown(results: list[dict], timed_out: list[dict], mpi: list[dict], gpu_memory: dict | None = None) -> str:
    out = ["# alpa_pass against hand-written parallelism", "",
           "Generated by `python benchmarks/report.py` from `benchmarks/report/data/*.json` "
           "(written by `benchmarks/run_suite.py ... --report-dir benchmarks/report`). "
           "See `benchmarks/README.md` for what each method and column means.", ""]
    gpu = [r for r in results if r.get("gpu")]  # (their own section: one GPU, one plan; MFU is their figure)
    results = [r for r in results if not r.get("gpu")]
    out += (summary_section(results, timed_out, mpi) + ranking_section(results + [m for m in mpi if "cost_model" in m])
            + cost_model_section(results))
    for r in results:
        out += case_section(r)
    out += timed_out_section(timed_out) + mpi_section(mpi, results) + gpu_section(gpu, gpu_memory)
    return "\n".join(out) + "\n"
