"""Run under ``alpa_pass.launch`` on 2 processes: a 2-stage PipeshardParallel GPT, one stage per process.

``mpi_pipeline.py OUT.npz STEPS SCHEDULE``. The cluster mesh is every device of both processes
(2 rows: process 0's devices, then process 1's); uniform stages give stage 0 (embedding + block 0)
process 0's devices and stage 1 (block 1 + head + loss) process 1's. Activations go forward and
cotangents back across processes every micro-batch. Rank 0 writes OUT.npz: ``losses``, the final
state leaves ``leaf_i`` (tree order, read on every rank with ``global_to_host``), per stage the
processes holding its devices (``stage_processes``) and per parameter leaf the processes holding
it (``param_processes``), and both ranks' plan digests. The test imports this file for
``CONFIG``, ``make_train_step`` and ``make_data`` to compute the single-device reference.
"""
import sys

import jax
import numpy as np

import alpa_pass as ap
from zoo import default_optimizer, gpt, setup
from zoo.pipeline import make_gpt_loss, make_step, train_and_save

CONFIG = gpt.Config(layers=2, tied=False)


def make_train_step(optimizer):
    """The pipelined zoo GPT step: alpa_pass.value_and_grad of the loss with a boundary after block 0."""
    return make_step(make_gpt_loss(CONFIG), optimizer)


def make_data(optimizer, steps):
    """The first state (eager jax arrays, as a user makes them) and ``steps`` host batches."""
    _, state, batches = setup(gpt, CONFIG, steps, optimizer)
    return state, [jax.tree.map(np.asarray, batch) for batch in batches]


def main(out, steps, schedule):
    optimizer = default_optimizer()
    state, batches = make_data(optimizer, steps)
    method = ap.PipeshardParallel(mesh=ap.LogicalMesh(shape=(2, jax.device_count() // 2)), num_micro_batches=2,
                                  layer_option="manual", stage_option=ap.UniformStageOption(num_stages=2),
                                  pipeline_schedule=schedule)
    step = ap.parallelize(make_train_step(optimizer), method=method)

    def describe(exe, state):
        return {"stage_processes": [sorted({d.process_index for d in st.spec.mesh.devices})
                                    for st in exe.program.stages],
                "param_processes": [sorted({d.process_index for d in x.sharding.device_set})
                                    for x in jax.tree.leaves(state[0])]}

    train_and_save(step, state, batches, out, describe)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
