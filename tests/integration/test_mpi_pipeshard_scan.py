"""PipeshardParallel on the scanned GPT under ``mpirun`` (2 processes, one stage each): each process
holds, differentiates and updates only its stage's half of the stacked parameters and Adam moments,
the returned stacked leaves span both processes, and 3 Adam steps equal plain jax.jit on one device."""
from __future__ import annotations

import numpy as np

from tests import helpers
from tests.integration.test_mpi import _launch, _load_script, _saved_run, needs_mpi
from zoo import default_optimizer


@needs_mpi
def test_scanned_pipeline_stages_on_two_processes_hold_their_halves(tmp_path):
    steps = 3
    proc = _launch("mpi_pipeline_scan.py", str(tmp_path / "out.npz"), str(steps), devices=2, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(tmp_path / "out.npz")
    assert int(got["process_count"]) == 2 and len(set(got["digests"].tolist())) == 1
    assert got["stacked_processes"].tolist() == [[0, 1]] * len(got["stacked_processes"])
    script = _load_script("mpi_pipeline_scan")
    blocks = len(got["stacked_processes"]) // 3  # parameters, mu, nu
    assert got["stage_args"].tolist() == [[0, blocks]] * 2  # each stage reads its half of every block leaf
    optimizer = default_optimizer()
    state, batches = script.make_data(optimizer, steps)
    helpers.assert_same_run(helpers.reference_run(script.make_train_step(optimizer), state, batches),
                            _saved_run(got))
