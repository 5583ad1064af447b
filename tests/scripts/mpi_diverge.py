"""Run under ``alpa_pass.launch`` on 2 processes: each rank plans a matmul on a mesh whose beta
depends on the rank, so the plans differ; the planner must raise PlanDivergedError on every rank
(naming rank 1) instead of running mismatched programs. Prints ``RAN`` if it ever runs."""
import jax
import jax.numpy as jnp

import alpa_pass as ap

beta = (1.0, 1.0) if jax.process_index() == 0 else (1.0, 0.5)
mesh = ap.LogicalMesh(shape=(2, jax.device_count() // 2), beta=beta)
step = ap.parallelize(lambda a, b: jnp.tanh(a @ b), method=ap.ShardParallel(mesh=mesh))
step(jnp.ones((16, 32)), jnp.ones((32, 16)))
print("RAN", flush=True)
