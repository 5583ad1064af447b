"""Run under ``alpa_pass.launch`` on 2 processes: a 2-stage PipeshardParallel on the scanned GPT
(``zoo.gpt_scan``, one ``lax.scan`` over stacked blocks), one stage per process.

``mpi_pipeline_scan.py OUT.npz STEPS``. The scan is cut into one scan per stage and each stage
holds, differentiates and updates only its half of the stacked parameters and Adam moments; the
step returns each stacked leaf as one array over both processes' devices. Rank 0 writes OUT.npz:
``losses``, the final state leaves ``leaf_i`` (tree order, read on every rank with
``global_to_host``), per stacked leaf the processes holding it (``stacked_processes``), per stage
how many of its forward's arguments have a stacked leaf's whole shape and how many its half's
(``stage_args``), and both ranks' plan digests. The test imports this file for ``CONFIG``,
``make_train_step`` and ``make_data`` to compute the single-device reference.
"""
import sys

import jax
import numpy as np

import alpa_pass as ap
from zoo import default_optimizer, gpt_scan, setup
from zoo.pipeline import make_step, train_and_save

CONFIG = gpt_scan.Config(layers=4, hidden=64, heads=4, seq=16, batch=8, vocab=64, flax=False)


def make_train_step(optimizer):
    return make_step(gpt_scan.make_loss_fn(CONFIG), optimizer)


def make_data(optimizer, steps):
    """The first state (eager jax arrays, as a user makes them) and ``steps`` host batches."""
    _, state, batches = setup(gpt_scan, CONFIG, steps, optimizer)
    return state, [jax.tree.map(np.asarray, batch) for batch in batches]


def main(out, steps):
    optimizer = default_optimizer()
    state, batches = make_data(optimizer, steps)
    method = ap.PipeshardParallel(mesh=ap.LogicalMesh(shape=(2, jax.device_count() // 2)), num_micro_batches=2,
                                  stage_option=ap.UniformStageOption(num_stages=2))
    step = ap.parallelize(make_train_step(optimizer), method=method)

    def describe(exe, state):
        assert exe.program.split is not None, "the stacked blocks were not cut per stage"
        stacked = [x for p, x in jax.tree_util.tree_flatten_with_path(state)[0] if "'blocks'" in jax.tree_util.keystr(p)]
        whole = {tuple(x.shape) for x in stacked}
        halves = {(x.shape[0] // 2, *x.shape[1:]) for x in stacked}
        shapes = [[tuple(a.shape) for a in jax.tree.leaves(st.fwd.args_info)] for st in exe.program.stages]
        return {"stacked_processes": [sorted({d.process_index for d in x.sharding.device_set}) for x in stacked],
                "stage_args": [[sum(s in whole for s in ss), sum(s in halves for s in ss)] for ss in shapes]}

    train_and_save(step, state, batches, out, describe)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
