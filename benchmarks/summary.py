"""Readable verdicts of one case result (shared by run_suite's printout and the report)."""
from __future__ import annotations

import math

MIB = 2**20
# The cost-model status of a baseline whose cheapest plan does not fit the case's memory budget
# (benchmarks/cost_model.py): not evaluated, not compared with auto
OVER_BUDGET = "Over the memory budget"


def evaluated(baseline: dict) -> bool:
    """The cost model gave this baseline's layout an objective (None or inf: infeasible there)."""
    return baseline["objective"] is not None and math.isfinite(baseline["objective"])


def over_budget(baseline: dict) -> bool:
    """The baseline's cheapest plan peaks over the case's memory budget (``run_suite --budget``)."""
    return str(baseline.get("status", "")).startswith(OVER_BUDGET)


def rows(result: dict) -> list[dict]:
    """One row per method: predicted objective, comm MiB (wire, per device), compiled and predicted
    peak MiB per device, step time, ratio of step time against auto, loss error."""
    cm = result["cost_model"]
    auto_time = result["methods"]["auto"].get("timing", {}).get("median_s")
    out = []
    for name, entry in result["methods"].items():
        objective = cm["auto_objective"] if name == "auto" else cm["baselines"][name]["objective"]
        timing = entry.get("timing", {}).get("median_s")
        predicted = entry.get("predicted", {}) if name == "auto" else cm["baselines"][name].get("predicted", {})
        out.append({
            "method": name,
            "objective": objective,
            "model": "planner" if name == "auto" else cm["baselines"][name]["model"]
            + ("" if evaluated(cm["baselines"][name]) else
               ": over budget" if over_budget(cm["baselines"][name]) else ": infeasible"),
            "comm_mib": sum(k["wire_bytes"] for k in entry["comm"].values()) / MIB,
            "collectives": {k: v["count"] for k, v in entry["comm"].items() if v["count"]},
            "peak_mib": entry["memory"]["peak"] / MIB,
            "predicted_peak_mib": predicted["peak_bytes"] / MIB if predicted.get("peak_bytes") else None,
            "step_ms": timing * 1e3 if timing else None,
            "time_vs_auto": timing / auto_time if timing and auto_time else None,
            "loss_error": entry.get("loss_error"),
        })
    return out


def trace_rows(result: dict) -> list[dict]:
    """Per method traced (``run_suite.py --trace``): predicted compute and communication (ms,
    when the objective is in seconds, i.e. planned with a profile; else None) beside each device's
    measured milliseconds per step in compute and in collectives (``benchmarks.step_trace``)."""
    cm, out = result["cost_model"], []
    seconds = bool(result.get("profile"))
    for name, entry in result["methods"].items():
        tr = entry.get("trace")
        if not tr:
            continue
        predicted = entry.get("predicted", {}) if name == "auto" else cm["baselines"][name].get("predicted", {})
        comm = predicted.get("communication", 0.0) + predicted.get("resharding", 0.0)
        out.append({"method": name, "step_ms": entry.get("timing", {}).get("median_s", 0.0) * 1e3,
                    "predicted_compute_ms": predicted["compute"] * 1e3 if seconds and predicted else None,
                    "predicted_comm_ms": comm * 1e3 if seconds and predicted else None,
                    "compute_ms": tr["compute_ms"], "collectives_ms": tr["collectives_ms"],
                    "by_kind": tr["by_kind"], "events_matched": tr["events_matched"]})
    return out


def violations(result: dict, model: str = "merged") -> list[str]:
    """Baselines the auto plan is worse than under its own cost model. ``model="merged"`` (the
    planner's own ILP) must be empty; ``"unmerged"`` lists what follower merging costs the plan."""
    cm = result["cost_model"]
    return [f"auto objective {cm['auto_objective']:.6g} > {name} {b['objective']:.6g} ({b['model']} ILP)"
            for name, b in cm["baselines"].items() if b["auto_not_worse"] is False and b["model"] == model]


def disagreements(result: dict) -> list[str]:
    """Baselines predicted costlier than auto that measured faster (the cost model is wrong there)."""
    cm, out = result["cost_model"], []
    auto_time = result["methods"]["auto"].get("timing", {}).get("median_s")
    for name, b in cm["baselines"].items():
        t = result["methods"][name].get("timing", {}).get("median_s")
        if auto_time and t and evaluated(b) and b["objective"] > cm["auto_objective"] and t < auto_time:
            out.append(f"{name}: predicted {b['objective'] / cm['auto_objective']:.2f}x auto's cost, "
                       f"measured {t / auto_time:.2f}x auto's step time")
    return out


def compiled_disagreements(result: dict, margin: float = 0.05) -> list[str]:
    """Where the compiled HLO contradicts the cost model's ranking of auto against a baseline: a
    baseline predicted at least as costly that sends fewer bytes per device, or whose predicted
    peak memory is at least auto's but whose compiled peak (memory_analysis) is lower — by more
    than ``margin`` (a fraction of auto's figure)."""
    cm, methods, out = result["cost_model"], result["methods"], []
    comm = {n: sum(k["wire_bytes"] for k in e["comm"].values()) for n, e in methods.items()}
    auto_pred_peak = methods["auto"].get("predicted", {}).get("peak_bytes")
    for name, b in cm["baselines"].items():
        if not evaluated(b):
            continue
        if b["objective"] >= cm["auto_objective"] and comm[name] < (1 - margin) * comm["auto"]:
            out.append(f"{name}: predicted {b['objective'] / cm['auto_objective']:.2f}x auto's cost, but its "
                       f"compiled HLO sends {comm[name] / comm['auto']:.2f}x auto's bytes per device")
        peak, pred = methods[name]["memory"]["peak"], b.get("predicted", {}).get("peak_bytes")
        if auto_pred_peak and pred and pred >= auto_pred_peak and peak < (1 - margin) * methods["auto"]["memory"]["peak"]:
            out.append(f"{name}: predicted peak memory {pred / auto_pred_peak:.2f}x auto's, compiled peak "
                       f"{peak / methods['auto']['memory']['peak']:.2f}x auto's")
    return out


def text(result: dict) -> str:
    """A plain-text table of ``rows`` plus the verdicts."""
    head = (f"{result['suite']} {result['size']} ({result['params'] / 1e6:.1f}M params) on mesh "
            f"{'x'.join(map(str, result['mesh']['shape']))}; auto planned in "
            f"{result['methods']['auto']['wall_s']:.2f}s")
    if result.get("memory_budget_per_device") is not None:
        head += f" under a memory budget of {result['memory_budget_per_device'] / 2**30:g} GiB per device"
    lines = [head, f"{'method':10} {'objective':>12} {'ILP':>9} {'comm MiB':>9} {'peak MiB':>9} "
                   f"{'step ms':>8} {'vs auto':>8} {'loss err':>9}  collectives"]
    for r in rows(result):
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        lines.append(f"{r['method']:10} {fmt(r['objective'], '12.5g')} {r['model']:>9} {r['comm_mib']:9.2f} "
                     f"{r['peak_mib']:9.2f} {fmt(r['step_ms'], '8.2f')} {fmt(r['time_vs_auto'], '8.2f')} "
                     f"{fmt(r['loss_error'], '9.1e')}  {r['collectives']}")
    for v in violations(result):
        lines.append(f"VIOLATION: {v}")
    for v in violations(result, "unmerged"):
        lines.append(f"FOLLOWER MERGING LOSES: {v}")
    for d in disagreements(result):
        lines.append(f"cost model disagrees with measurement: {d}")
    for d in compiled_disagreements(result):
        lines.append(f"cost model disagrees with the compiled HLO: {d}")
    return "\n".join(lines)


def over_budget_compiled(result: dict) -> dict:
    """{baseline: compiled peak bytes} of the baselines whose compiled peak exceeds the case's
    memory budget (``run_suite --budget``; {} without one)."""
    budget = result.get("memory_budget_per_device")
    if budget is None:
        return {}
    return {n: e["memory"]["peak"] for n, e in result["methods"].items()
            if n != "auto" and e["memory"]["peak"] > budget}


def headline(result: dict) -> dict:
    """The case in one row: auto's predicted cost, comm and peak memory (and measured step time
    when it ran) as ratios to the best baseline on each figure (< 1: auto is better), with that
    baseline's name; None where no baseline has the figure. Under a memory budget, baselines whose
    compiled peak exceeds it count for the peak figure only."""
    cm, methods = result["cost_model"], result["methods"]
    figures = {
        "objective": {n: cm["baselines"][n]["objective"] if n != "auto" else cm["auto_objective"] for n in methods},
        "comm": {n: sum(k["wire_bytes"] for k in methods[n]["comm"].values()) for n in methods},
        "peak": {n: methods[n]["memory"]["peak"] for n in methods},
        "time": {n: methods[n].get("timing", {}).get("median_s") for n in methods},
    }
    row = {"planning_s": methods["auto"]["wall_s"]}
    over = set(over_budget_compiled(result))
    for key, values in figures.items():
        # (under a budget, auto's cost and time are compared with the baselines that fit it only)
        known = [(v, n) for n, v in values.items() if n != "auto" and v is not None and math.isfinite(v)
                 and (key == "peak" or n not in over)]
        best_value, best_name = min(known) if known else (None, None)
        ok = best_value and values["auto"] is not None
        row[f"{key}_vs_best"] = values["auto"] / best_value if ok else None
        row[f"{key}_best"] = best_name
    return row


def mpi_text(result: dict) -> str:
    """A plain-text table of a multi-process case (``benchmarks/mpi_case.py``)."""
    auto = result["methods"]["auto"]["timing"]["median_s"]
    lines = [f"{result['suite']} {result['size']} on {result['processes']} processes x {result['local_devices']} "
             f"devices (mesh {'x'.join(map(str, result['mesh']['shape']))}); "
             f"plans agree across ranks: {len(set(result['digests'])) == 1}",
             f"{'method':10} {'comm MiB':>9} {'peak MiB':>9} {'step ms':>8} {'vs auto':>8} {'loss err':>9}"]
    for name, e in result["methods"].items():
        t = e["timing"]["median_s"]
        lines.append(f"{name:10} {sum(k['wire_bytes'] for k in e['comm'].values()) / MIB:9.2f} "
                     f"{e['memory']['peak'] / MIB:9.2f} {t * 1e3:8.2f} {t / auto:8.2f} {e['loss_error']:9.1e}")
    return "\n".join(lines)


def spearman(xs, ys) -> float | None:
    """Spearman's rank correlation of two equally long sequences (tied values share their mean
    rank); None with fewer than 3 pairs or when either side is constant."""
    import numpy as np

    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} predictions for {len(ys)} measurements")
    if len(xs) < 3:
        return None

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):  # ties: the mean of their ranks
            tied = v == value
            r[tied] = r[tied].mean()
        return r

    rx, ry = ranks(xs), ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def predicted_vs_measured(result: dict) -> list[tuple[str, float, float]]:
    """(method, predicted objective, measured median step s) for every method of a case that the
    cost model evaluated and that ran; with a profile (``result["profile"]``) the objective is a
    predicted step time in seconds."""
    cm, out = result["cost_model"], []
    for name, entry in result["methods"].items():
        t = entry.get("timing", {}).get("median_s")
        if name == "auto":
            objective = cm["auto_objective"]
        elif evaluated(cm["baselines"][name]):
            objective = cm["baselines"][name]["objective"]
        else:
            continue
        if t:
            out.append((name, float(objective), float(t)))
    return out
