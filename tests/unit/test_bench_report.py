"""The benchmark report's predicted-vs-measured ranking (benchmarks/summary.py, report_md.py)."""
import pytest

from benchmarks import report_md, run_suite, summary


def test_spearman_matches_the_textbook_values():
    assert summary.spearman([1, 2, 3, 4], [10, 20, 35, 40]) == pytest.approx(1.0)
    assert summary.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their mean rank: ranks (0.5, 0.5, 2, 3) against (0, 1, 2, 3)
    assert summary.spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505139)
    # one swapped pair of five: 1 - 6 * 2 / (5 * 24)
    assert summary.spearman([1, 2, 3, 4, 5], [1, 2, 4, 3, 5]) == pytest.approx(0.9)
    assert summary.spearman([1, 2], [2, 1]) is None  # too few plans to rank
    assert summary.spearman([1, 2, 3], [5, 5, 5]) is None  # nothing measured apart
    with pytest.raises(ValueError, match="3 predictions for 2"):
        summary.spearman([1, 2, 3], [1, 2])


def _case(profile: bool, times: dict, objectives: dict) -> dict:
    comm = {"all-reduce": {"count": 1, "result_bytes": 8, "wire_bytes": 8.0}}
    methods = {m: {"comm": comm, "memory": {"peak": 1}, "timing": {"median_s": t}} for m, t in times.items()}
    r = {"suite": "gpt", "size": "small", "mesh": {"shape": [2, 4]}, "ran": True, "params": 1,
         "methods": methods,
         "cost_model": {"auto_objective": objectives["auto"],
                        "baselines": {m: {"objective": o, "model": "merged"} for m, o in objectives.items()
                                      if m != "auto"}}}
    if profile:
        r["profile"] = {"path": "p.json", "key": "k"}
    return r


def test_ranking_pairs_each_evaluated_plan_that_ran_and_pools_only_profiled_cases():
    inf = float("inf")
    profiled = _case(True, {"auto": 0.010, "dp": 0.012, "zero2": 0.011, "megatron": 0.020},
                     {"auto": 0.009, "dp": 0.013, "zero2": 0.010, "megatron": 0.030})
    unit = _case(False, {"auto": 0.010, "dp": 0.008, "zero2": 0.011, "megatron": 0.009},
                 {"auto": 1.0, "dp": 2.0, "zero2": 3.0, "megatron": inf})  # megatron infeasible: left out
    assert summary.predicted_vs_measured(unit) == [("auto", 1.0, 0.010), ("dp", 2.0, 0.008), ("zero2", 3.0, 0.011)]
    lines = report_md.ranking_section([profiled, unit])
    rows = {ln.split(" | ")[0]: ln for ln in lines if ln.startswith("| gpt small")}
    assert " | 4 | 1.00 | " in rows["| gpt small 2x4 (profiled)"]
    assert " | 3 | 0.50 | " in rows["| gpt small 2x4"]  # ranks (0,1,2) against (1,0,2)
    assert "Over all 4 plans of the cases profiled as `k`: rank correlation 1.00" in "\n".join(lines)
    assert report_md.name(profiled) == "gpt_small_2x4_profiled" and report_md.name(unit) == "gpt_small_2x4"


def test_an_mpirun_case_is_ranked_on_its_own_row_and_pooled_only_with_its_own_profile():
    one = _case(True, {"auto": 0.010, "dp": 0.012, "zero2": 0.011, "megatron": 0.020},
                {"auto": 0.009, "dp": 0.013, "zero2": 0.010, "megatron": 0.030})
    mpi = _case(True, {"auto": 0.30, "dp": 0.31, "megatron": 0.26},  # 2x4 cluster: predicted all wrong way
                {"auto": 0.05, "dp": 0.06, "megatron": 0.07})
    mpi["processes"], mpi["profile"]["key"] = 2, "k2"
    assert report_md.label(mpi) == "gpt small 2x4 (profiled), mpirun -np 2"
    text = "\n".join(report_md.ranking_section([one, mpi]))
    assert "| gpt small 2x4 (profiled), mpirun -np 2 | 3 | -0.50 | " in text  # ranks (0,1,2) vs (1,2,0)
    assert "Over all 4 plans of the cases profiled as `k`: rank correlation 1.00" in text
    assert "Over all 3 plans of the cases profiled as `k2`: rank correlation -0.50" in text


def test_profiled_cases_get_their_own_json():
    assert run_suite.case_file("gpt", "small", (2, 4)) == "suite_gpt_small_2x4"
    assert run_suite.case_file("gpt", "small", (2, 4), profiled=True) == "suite_gpt_small_2x4_profiled"


def test_budgeted_cases_get_their_own_json_label_and_stay_out_of_the_memory_note():
    """``run_suite --budget 80``: its own JSON (``_budget80``), labelled with the budget; the
    report's note that unbudgeted plans keep more memory than ZeRO's does not name it."""
    args = run_suite.parse_args(["gpt", "--size", "39B", "--budget", "80"])
    assert args.budget == 80.0 and run_suite._tag(args) == "_budget80"
    assert run_suite.case_file("gpt", "39B", (8, 8), tag=run_suite._tag(args)) == "suite_gpt_39B_8x8_budget80"
    assert run_suite._tag(run_suite.parse_args(["gpt"])) == ""
    heavy = _case(False, {"auto": 0.01, "zero2": 0.01}, {"auto": 1.0, "zero2": 2.0})
    heavy["methods"]["auto"].update(memory={"peak": 3}, wall_s=1.0)  # 3x zero2's compiled peak
    budgeted = dict(heavy, memory_budget_per_device=80 * 2**30)
    assert report_md.label(budgeted) == "gpt small 2x4 (80 GiB budget)"
    assert report_md.name(budgeted) == "gpt_small_2x4_budget80"
    assert "gpt small 3.0x" in report_md.memory_note([heavy])[0] and report_md.memory_note([budgeted]) == []
    # a baseline over the budget (compiled peak) counts for the peak ratio only, and the note names it
    tight = dict(heavy, memory_budget_per_device=4)
    tight["methods"] = {"auto": heavy["methods"]["auto"], "zero2": dict(heavy["methods"]["zero2"], memory={"peak": 8})}
    row = summary.headline(tight)
    assert row["comm_vs_best"] is None and row["objective_vs_best"] is None and row["time_vs_best"] is None
    assert row["peak_vs_best"] == pytest.approx(3 / 8) and row["peak_best"] == "zero2"
    assert summary.headline(heavy)["comm_vs_best"] == pytest.approx(1.0)
    assert "these baselines compile to more than the budget" in report_md.memory_note([tight])[0]


@pytest.mark.parametrize("argv", [["gpt", "--budget", "0"], ["gpt", "--budget", "80", "--mpirun", "2"]])
def test_run_suite_refuses_a_budget_it_cannot_use(argv, capsys):
    assert run_suite.main(argv) == 2
    assert "--budget" in capsys.readouterr().err


def test_interleaved_timing_runs_rounds_and_pairs_each_round_with_the_first_method(monkeypatch):
    """A fake clock: auto's step takes 1 unit, dp's 2, each scaled by a machine that slows down
    round by round (1x, 2x, ...). Timed one after the other, dp would pay for the slow rounds; in
    rounds both see each slowdown and the paired ratio is exactly 2."""
    from benchmarks import measure

    clock, calls = [0.0], []
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])

    def make(name, cost):
        def step(state, batch):
            calls.append(name)
            clock[0] += cost * (1 + calls.count(name))  # the machine slows down each round
            return state + batch, float(state)
        return step

    out = measure.time_interleaved({"auto": (make("auto", 1.0), 0, 1), "dp": (make("dp", 2.0), 10, 1)}, repeats=3,
                                   warmup=1)
    assert calls == ["auto", "dp"] * 4  # rounds, not one method after the other
    assert out["auto"]["first_loss"] == 0.0 and out["dp"]["first_loss"] == 10.0  # own state, fed back
    assert [out[n]["min_s"] for n in ("auto", "dp")] == [3.0, 6.0]  # rounds 2..4 (round 1 warms up)
    assert out["auto"]["median_s"] == 4.0 and out["dp"]["median_s"] == 8.0
    assert out["dp"]["vs_first"] == 2.0 and out["auto"]["vs_first"] == 1.0 and out["dp"]["repeats"] == 3


def test_gpu_cases_get_the_gpu_section_with_kernel_time_mfu_and_the_memory_check():
    import json
    import os

    from benchmarks import report, report_md

    here = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "report")
    results, _, _ = report.load(os.path.join(here, "data"))
    memory = report.load_gpu_memory(os.path.join(here, "gpu"))
    gpu = [r for r in results if r.get("gpu")]
    assert {r["size"] for r in gpu} == {"small", "1.3B"} and memory["platform"] == "gpu"
    text = report_md.markdown(results, [], [], memory)
    section = text[text.index("## GPU"):]
    big = next(r for r in gpu if r["size"] == "1.3B")
    auto = big["methods"]["auto"]
    row = (f"| auto | {auto['timing']['median_s'] * 1e3:.2f} | {auto['trace']['compute_ms']:.2f} | "
           f"{big['gpu']['methods']['auto']['samples_per_s']:.1f} | ")
    assert row in section and f"{100 * big['gpu']['methods']['auto']['mfu']:.1f}%" in section
    assert f"| measured peak (memory_stats peak_bytes_in_use after 3 steps) | " \
           f"{memory['fits']['measured']['peak_bytes_in_use'] / 2**30:.2f} |" in section
    assert "InfeasibleError" in section and "smallest budget the planner estimates feasible" in section
    # one GPU's cases stay out of the CPU suites' tables, rankings and plots
    before = text[:text.index("## GPU")]
    assert "1 x NVIDIA H200" not in before and "gpu-nvidia-h200" not in before
    assert json.loads(json.dumps(memory))["fits"]["memory_budget"]["source"] == "device"
