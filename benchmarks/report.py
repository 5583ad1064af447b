"""The benchmark report: markdown + PNG plots from the case JSONs in ``benchmarks/report/data/``.

    python benchmarks/run_suite.py gpt --report-dir benchmarks/report   # (and moe, wresnet, sizes)
    python benchmarks/report.py                                         # -> benchmarks/report/report.md

Per case: a figure with per-device communication (wire bytes, by collective kind), per-device peak
memory and measured step time against auto; across cases: planning time (per phase) against model
size. The markdown tables flag, loudly, any baseline the auto plan is worse than under its own cost
model, and every case where measured step times disagree with the predicted ranking.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchmarks import report_md  # noqa: E402
KIND_COLORS = {"all-reduce": "#4c72b0", "all-gather": "#55a868", "reduce-scatter": "#c44e52",
               "all-to-all": "#8172b2", "collective-permute": "#ccb974"}


def load(data_dir: str) -> tuple[list[dict], list[dict], list[dict]]:
    """The case JSONs of ``data_dir``: (cases, cases that hit their time limit, mpirun cases); cases
    ordered by suite then size."""
    results = []
    # (only the suites' cases: fuzz and create-state runs keep their JSONs in the same folder)
    for path in sorted(glob.glob(os.path.join(data_dir, "suite_*.json"))):
        with open(path) as f:
            results.append(json.load(f))
    order = {"gpt": 0, "moe": 1, "wresnet": 2}
    results.sort(key=lambda r: (order.get(r["suite"], 9), r.get("params", 0), r["size"]))
    timed_out = [r for r in results if r.get("timed_out")]
    mpi = [r for r in results if "processes" in r]
    return [r for r in results if r not in timed_out and r not in mpi], timed_out, mpi


def load_gpu_memory(gpu_dir: str) -> dict | None:
    """The newest ``gpu_memory_gpu_*.json`` (benchmarks/gpu_memory.py on a GPU) in ``gpu_dir``, or None."""
    paths = sorted(glob.glob(os.path.join(gpu_dir, "gpu_memory_gpu_*.json")))
    if not paths:
        return None
    with open(paths[-1]) as f:
        return json.load(f)


case_name = report_md.name


def plot_case(r: dict, path: str) -> None:
    """Three panels: wire MiB per device by collective kind, peak MiB per device, step time / auto."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(r["methods"])
    panels = 3 if r.get("ran") else 2
    fig, axes = plt.subplots(1, panels, figsize=(3.6 * panels, 2.8), dpi=80)
    bottom = [0.0] * len(methods)
    for kind, color in KIND_COLORS.items():
        vals = [r["methods"][m]["comm"][kind]["wire_bytes"] / 2**20 for m in methods]
        if any(vals):
            axes[0].bar(methods, vals, bottom=bottom, color=color, label=kind)
            bottom = [b + v for b, v in zip(bottom, vals)]
    axes[0].set_title("communication / device (MiB)", fontsize=9)
    axes[0].legend(fontsize=6)
    axes[1].bar(methods, [r["methods"][m]["memory"]["peak"] / 2**20 for m in methods], color="#937860")
    axes[1].set_title("peak memory / device (MiB)", fontsize=9)
    if panels == 3:
        auto = r["methods"]["auto"]["timing"]["median_s"]
        axes[2].bar(methods, [r["methods"][m]["timing"]["median_s"] / auto for m in methods], color="#64b5cd")
        axes[2].axhline(1.0, color="k", lw=0.8)
        axes[2].set_title("step time / auto's (measured)", fontsize=9)
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"{r['suite']} {r['size']} ({r['params'] / 1e6:.1f}M params), mesh "
                 f"{'x'.join(map(str, r['mesh']['shape']))}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_planning(results: list[dict], path: str) -> None:
    """Left: planning time per phase (stacked), one bar per case; right: total planning time (plan +
    XLA compile of the auto plan) against parameter count, one line per suite (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = ("trace", "extract", "build", "solve", "emit", "compile")
    names = [report_md.label(r) for r in results]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(max(7.0, 0.7 * len(results) + 4), 3.2), dpi=80,
                                  gridspec_kw={"width_ratios": [max(1, len(results)), 4]})
    bottom = [0.0] * len(results)
    for phase in phases:
        vals = [r["methods"]["auto"]["timings_s"].get(phase, 0.0) for r in results]
        ax.bar(names, vals, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("seconds")
    ax.set_title("planning time by phase (2 CPU cores)", fontsize=9)
    ax.tick_params(axis="x", labelsize=7, labelrotation=60)
    ax.legend(fontsize=6, ncol=2)
    for suite in dict.fromkeys(r["suite"] for r in results):
        rs = [r for r in results if r["suite"] == suite and not r.get("profile")]  # (unit-cost plans)
        ax2.plot([r["params"] for r in rs], [r["methods"]["auto"]["wall_s"] for r in rs], "o-", label=suite)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("parameters", fontsize=8)
    ax2.set_title("plan + compile (s) vs model size", fontsize=9)
    ax2.tick_params(labelsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=os.path.join(HERE, "report"))
    args = p.parse_args(argv)
    results, timed_out, mpi = load(os.path.join(args.dir, "data"))
    if not results:
        print(f"no case JSONs in {args.dir}/data; run benchmarks/run_suite.py --report-dir {args.dir}", file=sys.stderr)
        return 1
    for r in results:
        if not r.get("gpu"):  # (GPU cases: a table in the GPU section)
            plot_case(r, os.path.join(args.dir, f"{case_name(r)}.png"))
    plot_planning([r for r in results if not r.get("gpu")], os.path.join(args.dir, "planning_time.png"))
    with open(os.path.join(args.dir, "report.md"), "w") as f:
        f.write(report_md.markdown(results, timed_out, mpi, load_gpu_memory(os.path.join(args.dir, "gpu"))))
    print(f"wrote {args.dir}/report.md and {len(results) + 1} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
