"""Saved plans applied without solving, the on-disk plan cache across processes, planning progress."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass.driver import planning
from zoo import default_optimizer, init_state, mlp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = mlp.Config(num_layers=3, hidden=32, batch=16)
MESH = ap.LogicalMesh(shape=(2, 4))


def _args(config=CONFIG):
    state = init_state(mlp.init(jax.random.key(0), config), default_optimizer())
    return state, mlp.make_batch(jax.random.key(1), config)


def _step(method):
    return ap.parallelize(mlp.make_train_step(default_optimizer()), method=method)


@pytest.fixture
def no_solver(monkeypatch):
    """Planning that reaches the ILP builder/solver fails the test."""
    def refuse(*a, **k):
        raise AssertionError("the solver ran although a plan was given or cached")

    monkeypatch.setattr(planning, "solve_graph", refuse)


@pytest.fixture(scope="module")
def solved():
    exe = _step(ap.ShardParallel(mesh=MESH)).get_executable(*_args())
    return exe


def test_saved_plan_compiles_the_same_executable_without_solving(solved, tmp_path, no_solver):
    path = tmp_path / "mlp_plan.json"
    solved.plan.save(path)
    exe = _step(ap.ShardParallel(plan=path)).get_executable(*_args())
    plan = exe.plan
    assert plan.origin == "saved" and "solve" not in plan.timings and "build" not in plan.timings
    assert {"trace", "extract", "emit", "compile"} <= set(plan.timings)
    assert plan.mesh == MESH and plan.node_specs == solved.plan.node_specs
    assert exe.input_shardings == solved.input_shardings and exe.output_shardings == solved.output_shardings
    assert plan.emit_report.inserted == solved.plan.emit_report.inserted > 0
    assert solved.plan.origin == "solver"  # applying a copy leaves the saved object alone
    (s1, loss1), (s2, loss2) = solved(*_args()), exe(*_args())
    np.testing.assert_allclose(float(loss1), float(loss2), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(s1), jax.tree.leaves(s2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


def test_saved_plan_is_refused_for_another_signature_mesh_or_jax(solved):
    other = mlp.Config(num_layers=3, hidden=32, batch=32)
    with pytest.raises(ap.PlanMismatchError, match="another function signature"):
        _step(ap.ShardParallel(plan=solved.plan)).get_executable(*_args(other))
    with pytest.raises(ap.PlanMismatchError, match=r"shape \[2, 4\] \(plan\) vs \[4, 2\] \(mesh\)"):
        _step(ap.ShardParallel(mesh=ap.LogicalMesh(shape=(4, 2)), plan=solved.plan)).get_executable(*_args())
    old = ap.Plan.from_json(solved.plan.to_json().replace(f'"jax": "{jax.__version__}"', '"jax": "0.4.30"'))
    with pytest.raises(ap.PlanMismatchError, match="made with jax 0.4.30"):
        _step(ap.ShardParallel(plan=old)).plan(*_args())


@pytest.mark.slow
def test_cache_in_process_hit_and_foreign_entry(tmp_path, caplog):
    option = ap.AutoShardingOption(plan_cache_dir=str(tmp_path))
    first = _step(ap.ShardParallel(mesh=MESH, option=option)).plan(*_args())
    entries = sorted(tmp_path.iterdir())
    assert first.origin == "solver" and [p.suffix for p in entries] == [".json"]
    second = _step(ap.ShardParallel(mesh=MESH, option=option)).plan(*_args())
    assert second.origin == "cache" and "cache" in second.timings and "solve" not in second.timings
    assert second.node_specs == first.node_specs and second.objective == first.objective

    other = _step(ap.ShardParallel(mesh=MESH, option=option)).plan(*_args(mlp.Config(num_layers=2, hidden=32)))
    other_entry = next(p for p in tmp_path.iterdir() if p not in entries)
    entries[0].write_text(other_entry.read_text())  # a foreign plan under this step's key
    third = _step(ap.ShardParallel(mesh=MESH, option=option)).plan(*_args())
    assert third.origin == "solver" and third.node_specs == first.node_specs
    assert any("ignoring plan cache entry" in r.getMessage() for r in caplog.records)
    assert json.loads(entries[0].read_text())["fingerprint"] == first.fingerprint != other.fingerprint


_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    import alpa_pass as ap
    from zoo import default_optimizer, init_state, mlp

    config = mlp.Config(num_layers=3, hidden=32, batch=16)
    state = init_state(mlp.init(jax.random.key(0), config), default_optimizer())
    batch = mlp.make_batch(jax.random.key(1), config)
    method = ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4)),
                              option=ap.AutoShardingOption(plan_cache_dir=sys.argv[1]))
    exe = ap.parallelize(mlp.make_train_step(default_optimizer()), method=method).get_executable(state, batch)
    _, loss = exe(state, batch)
    print("RESULT " + json.dumps({"origin": exe.plan.origin, "timings": sorted(exe.plan.timings),
                                  "node_specs": exe.plan.node_specs, "fingerprint": exe.plan.fingerprint,
                                  "inputs": [str(s) for s in exe.input_shardings], "loss": float(loss)}))
""")


def _run_process(script, cache_dir):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(script), str(cache_dir)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=400)  # (only a hang)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), proc.stderr


@pytest.mark.slow
def test_second_process_reads_the_plan_from_the_cache(tmp_path):
    script, cache_dir = tmp_path / "plan_step.py", tmp_path / "cache"
    script.write_text(_SCRIPT)
    first, _ = _run_process(script, cache_dir)
    second, _ = _run_process(script, cache_dir)
    assert first["origin"] == "solver" and "solve" in first["timings"]
    assert second["origin"] == "cache" and "solve" not in second["timings"] and "cache" in second["timings"]
    assert second["fingerprint"] == first["fingerprint"]  # the fingerprint is stable across processes
    assert second["node_specs"] == first["node_specs"] and second["inputs"] == first["inputs"]
    assert second["loss"] == pytest.approx(first["loss"], rel=1e-6)

    (entry,) = cache_dir.iterdir()
    entry.write_text(entry.read_text()[:200])  # truncated: corrupt
    third, stderr = _run_process(script, cache_dir)
    assert third["origin"] == "solver" and third["node_specs"] == first["node_specs"]
    assert "ignoring plan cache entry" in stderr
    assert json.loads(entry.read_text())["fingerprint"] == first["fingerprint"]  # overwritten


@pytest.mark.slow
def test_progress_lines_when_asked_and_silence_by_default(capfd):
    _step(ap.ShardParallel(mesh=MESH, option=ap.AutoShardingOption(show_progress=True))).plan(*_args())
    err = capfd.readouterr().err
    stages = [m.group(1) for m in re.finditer(r"^alpa_pass planning: (.*) \(\d+\.\d s\)$", err, re.M)]
    assert re.fullmatch(r"build ILP \(mesh 2x4, \d+ ops\)", stages[-2]), stages
    assert re.fullmatch(r"solve ILP \(mesh 2x4, \d+ columns, \d+ rows\)", stages[-1]), stages
    _step(ap.ShardParallel(mesh=MESH)).plan(*_args())
    assert "alpa_pass planning" not in capfd.readouterr().err
