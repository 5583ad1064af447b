"""Readable verdicts of one case result (shared by run_suite's printout and the report)."""
from __future__ import annotations

MIB = 2**20


def rows(result: dict) -> list[dict]:
    """One row per method: predicted objective, comm MiB (wire, per device), peak MiB, step time,
    ratio of step time against auto, loss error."""
    cm = result["cost_model"]
    auto_time = result["methods"]["auto"].get("timing", {}).get("median_s")
    out = []
    for name, entry in result["methods"].items():
        objective = cm["auto_objective"] if name == "auto" else cm["baselines"][name]["objective"]
        timing = entry.get("timing", {}).get("median_s")
        out.append({
            "method": name,
            "objective": objective,
            "model": "planner" if name == "auto" else cm["baselines"][name]["model"],
            "comm_mib": sum(k["wire_bytes"] for k in entry["comm"].values()) / MIB,
            "collectives": {k: v["count"] for k, v in entry["comm"].items() if v["count"]},
            "peak_mib": entry["memory"]["peak"] / MIB,
            "step_ms": timing * 1e3 if timing else None,
            "time_vs_auto": timing / auto_time if timing and auto_time else None,
            "loss_error": entry.get("loss_error"),
        })
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
        if auto_time and t and b["objective"] > cm["auto_objective"] and t < auto_time:
            out.append(f"{name}: predicted {b['objective'] / cm['auto_objective']:.2f}x auto's cost, "
                       f"measured {t / auto_time:.2f}x auto's step time")
    return out


def text(result: dict) -> str:
    """A plain-text table of ``rows`` plus the verdicts."""
    head = (f"{result['suite']} {result['size']} ({result['params'] / 1e6:.1f}M params) on mesh "
            f"{'x'.join(map(str, result['mesh']['shape']))}; auto planned in "
            f"{result['methods']['auto']['wall_s']:.2f}s")
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
    return "\n".join(lines)
