"""Checkpoints (``ap.save_checkpoint`` / ``ap.restore_checkpoint`` on orbax-checkpoint).

A GPT training state planned on 2x4 round-trips bit for bit into the executable's layouts; it
restores onto another mesh (1x8), onto another device count (4, in a subprocess) and, saved by
two processes under mpirun, into one process; a save killed before its rename leaves the
previous step readable; missing, truncated and mismatched checkpoints are typed errors naming
the path.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import alpa_pass as ap
from alpa_pass.errors import CheckpointError
from tests.integration.test_mpi import _env, _launch, needs_mpi
from zoo import default_optimizer, gpt, init_state, mlp

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
CONFIG = gpt.Config(layers=1)


def _trained_gpt(mesh_shape=(2, 4)):
    """(parallelized step, its executable, the state after one step, the batch) on ``mesh_shape``."""
    optimizer = default_optimizer()
    step = ap.parallelize(gpt.make_train_step(optimizer, CONFIG),
                          method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=mesh_shape)))
    state = init_state(gpt.init(jax.random.key(0), CONFIG), optimizer)
    batch = gpt.make_batch(jax.random.key(100), CONFIG)
    state, _ = step(state, batch)
    return step, step.get_executable(state, batch), state, batch


@pytest.fixture(scope="module")
def trained_gpt():
    """``_trained_gpt()`` once for the module: three tests save the same trained state (planning,
    compiling and running the step once instead of three times)."""
    return _trained_gpt()


def _assert_equal(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for i, (a, b) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"leaf {i}")


def test_round_trip_on_2x4_is_bit_exact_in_the_executables_layouts(tmp_path, trained_gpt):
    step, exe, state, batch = trained_gpt
    assert any(s.spec != P() for s in exe.input_shardings), "nothing is sharded: a weak test"
    ap.save_checkpoint(tmp_path, state, 1)
    restored = ap.restore_checkpoint(tmp_path, exe)
    _assert_equal(restored, state)
    n = len(jax.tree.leaves(state))
    assert [x.sharding for x in jax.tree.leaves(restored)] == exe.input_shardings[:n]
    # training goes on from the restored state exactly as from the saved one, with no new plan
    want_state, want_loss = step(state, batch)
    got_state, got_loss = step(restored, batch)
    assert step.num_plans == 1
    assert float(got_loss) == float(want_loss)
    _assert_equal(got_state, want_state)


def test_restore_onto_1x8_reshards_on_load(tmp_path, trained_gpt):
    _, _, state, batch = trained_gpt
    ap.save_checkpoint(tmp_path, state, 3)
    other = ap.parallelize(gpt.make_train_step(default_optimizer(), CONFIG),
                           method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 8))))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    plan = other.plan(abstract, batch)
    restored = ap.restore_checkpoint(tmp_path, plan, like=abstract)
    _assert_equal(restored, state)
    mesh = plan.mesh.jax_mesh()
    n = len(jax.tree.leaves(state))
    assert [x.sharding for x in jax.tree.leaves(restored)] == [NamedSharding(mesh, s) for s in plan.input_specs[:n]]
    # a pytree of shardings is a target too
    replicated = NamedSharding(mesh, P())
    flat = ap.restore_checkpoint(tmp_path, jax.tree.map(lambda _: replicated, state), step=3)
    _assert_equal(flat, state)


def test_restore_onto_4_devices(tmp_path, trained_gpt):
    """Saved from a 2x4 plan on 8 devices; restored by a 4-device process in its own plan's layouts."""
    _, _, state, _ = trained_gpt
    ap.save_checkpoint(tmp_path / "ckpt", state, 1)
    out = tmp_path / "out.npz"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "ckpt_restore.py"), str(tmp_path / "ckpt"), str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=4"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert int(got["device_count"]) == 4
    leaves = jax.tree.leaves(state)
    for i, want in enumerate(leaves):
        np.testing.assert_array_equal(got[f"leaf_{i}"], np.asarray(want), err_msg=f"leaf {i}")
    assert any(tuple(got[f"shard_{i}"]) != x.shape for i, x in enumerate(leaves)), "nothing is split on 4 devices"


@needs_mpi
def test_saved_by_two_processes_restored_by_one(tmp_path):
    """mpirun -np 2 (2 devices each): every process writes its own shards; this process (8
    devices) restores the state bit for bit into the layouts of a plan on 1x8."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out.npz"
    proc = _launch("mpi_checkpoint.py", str(ckpt), str(out), "2x2", devices=2, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert int(got["process_count"]) == 2
    state_dir = ckpt / "1" / "state"
    assert {p.name for p in state_dir.iterdir() if p.name.startswith("ocdbt.process_")} == \
        {"ocdbt.process_0", "ocdbt.process_1"}, "each process writes its own shards"
    optimizer = default_optimizer()
    abstract = jax.eval_shape(lambda k: init_state(gpt.init(k, CONFIG), optimizer), jax.random.key(0))
    batch = jax.eval_shape(lambda k: gpt.make_batch(k, CONFIG), jax.random.key(1))
    plan = ap.parallelize(gpt.make_train_step(optimizer, CONFIG),
                          method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 8)))).plan(abstract, batch)
    restored = ap.restore_checkpoint(ckpt, plan, like=abstract)
    assert jax.tree.structure(restored) == jax.tree.structure(abstract)
    for i, x in enumerate(jax.tree.leaves(restored)):
        assert x.sharding.mesh.devices.size == 8
        np.testing.assert_array_equal(np.asarray(x), got[f"leaf_{i}"], err_msg=f"leaf {i}")


def test_killed_save_leaves_the_previous_step_readable(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPTS / "ckpt_kill_during_save.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert "saved 1" in proc.stdout and "SURVIVED" not in proc.stdout
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith("2") and p != "2"]
    assert leftovers and not (tmp_path / "2").exists(), os.listdir(tmp_path)
    state = init_state(mlp.init(jax.random.key(0), mlp.Config(num_layers=2, hidden=32)), default_optimizer())
    targets = jax.tree.map(lambda x: x.sharding, state)
    _assert_equal(ap.restore_checkpoint(tmp_path, targets), state)  # the latest finalized step: 1
    with pytest.raises(CheckpointError, match=rf"no step 2 in {tmp_path}; finalized steps: \[1\]"):
        ap.restore_checkpoint(tmp_path, targets, step=2)
    ap.save_checkpoint(tmp_path, jax.tree.map(lambda x: x + 1, state), 2)  # the step can be saved again
    _assert_equal(ap.restore_checkpoint(tmp_path, targets), jax.tree.map(lambda x: x + 1, state))


def test_missing_truncated_and_mismatched_checkpoints_are_typed_errors(tmp_path):
    with pytest.raises(CheckpointError, match=f"no checkpoint at {tmp_path / 'nope'}"):
        ap.restore_checkpoint(tmp_path / "nope", [])
    with pytest.raises(CheckpointError, match=f"no finalized checkpoint step in {tmp_path}"):
        ap.restore_checkpoint(tmp_path, [])
    state = {"w": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64), "key": jax.random.key(7)}
    targets = jax.tree.map(lambda x: x.sharding, state)
    ap.save_checkpoint(tmp_path, state, 0)
    got = ap.restore_checkpoint(tmp_path, targets)
    np.testing.assert_array_equal(got["w"], state["w"])
    assert jax.random.key_data(got["key"]).tolist() == jax.random.key_data(state["key"]).tolist()
    with pytest.raises(CheckpointError, match=rf"{tmp_path / '0'} exists already"):
        ap.save_checkpoint(tmp_path, state, 0)
    with pytest.raises(CheckpointError, match=rf"{tmp_path / '0'} holds 2 leaves .* target pytree has 1"):
        ap.restore_checkpoint(tmp_path, {"w": targets["w"]})
    bad = {"key": targets["key"], "w": jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=targets["w"])}
    with pytest.raises(CheckpointError, match=r"leaf \['w'\] was saved with shape \(64, 64\)"):
        ap.restore_checkpoint(tmp_path, bad)
    for f in (tmp_path / "0" / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"cannot read the checkpoint at {tmp_path / '0'} \(truncated"):
        ap.restore_checkpoint(tmp_path, targets)
