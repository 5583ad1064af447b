"""Run under ``alpa_pass.launch`` on 2 processes: each rank plans with a setting that depends on
the rank, so the plans differ; the planner must raise PlanDivergedError on every rank (naming rank
1) instead of running mismatched programs. Prints ``RAN`` if it ever runs.

``mpi_diverge.py``: a ShardParallel matmul on a mesh whose beta depends on the rank.
``mpi_diverge.py pipeline``: a 2-stage PipeshardParallel MLP whose schedule depends on the rank.
"""
import sys

import jax
import jax.numpy as jnp

import alpa_pass as ap

rank = jax.process_index()
if sys.argv[1:] == ["pipeline"]:
    def loss_fn(ws, x):
        h = jnp.tanh(x @ ws[0])
        ap.mark_pipeline_boundary()
        return jnp.mean((h @ ws[1]) ** 2)

    def train_step(ws, x):
        loss, grads = ap.value_and_grad(loss_fn)(ws, x)
        return [w - 0.1 * g for w, g in zip(ws, grads)], loss

    method = ap.PipeshardParallel(mesh=ap.LogicalMesh(shape=(2, jax.device_count() // 2)), num_micro_batches=2,
                                  layer_option="manual", stage_option=ap.UniformStageOption(num_stages=2),
                                  pipeline_schedule="1f1b" if rank == 0 else "gpipe")
    step = ap.parallelize(train_step, method=method)
    step([jnp.ones((8, 8)), jnp.ones((8, 8))], jnp.ones((4, 8)))
else:
    beta = (1.0, 1.0) if rank == 0 else (1.0, 0.5)
    mesh = ap.LogicalMesh(shape=(2, jax.device_count() // 2), beta=beta)
    step = ap.parallelize(lambda a, b: jnp.tanh(a @ b), method=ap.ShardParallel(mesh=mesh))
    step(jnp.ones((16, 32)), jnp.ones((32, 16)))
print("RAN", flush=True)
