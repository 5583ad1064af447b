"""Run under ``alpa_pass.launch`` on several processes: ShardParallel GPT steps on the global mesh.

``mpi_gpt.py OUT.npz MESH STEPS`` (MESH like ``2x2``). Every process builds the same state and
batches (fixed keys), runs STEPS steps, gathers the final state, and rank 0 writes OUT.npz:
``loss_i``, ``leaf_i`` (final state leaves, tree order), ``process_count``, ``device_count``,
``digests`` (every rank's plan digest, to show they agree) and ``input_specs``. The model and data
are ``zoo.setup(zoo.gpt, gpt.Config(layers=1), STEPS)`` (the repository root must be on sys.path).
"""
import sys

import jax
import numpy as np

import alpa_pass as ap
from alpa_pass.runtime.multiprocess import gather_digests, plan_digest, to_host
from zoo import gpt, setup

out, mesh_text, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
shape = tuple(int(n) for n in mesh_text.split("x"))
step_fn, state, batches = setup(gpt, gpt.Config(layers=1), steps)

step = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=shape)))
losses = []
for batch in batches:
    state, loss = step(state, batch)
    losses.append(float(to_host(loss)))

exe = step.get_executable(state, batches[0])
assert step.num_plans == 1, "outputs fed back must not re-plan"
assert not all(s.is_fully_addressable for s in exe.input_shardings), "the mesh must span processes"
leaves = to_host(jax.tree.leaves(state))
digests = gather_digests(plan_digest(exe.plan))
if jax.process_index() == 0:
    np.savez(out, losses=np.array(losses), process_count=jax.process_count(),
             device_count=jax.device_count(), digests=np.array(digests),
             input_specs=np.array([str(s) for s in exe.plan.input_specs]),
             **{f"leaf_{i}": x for i, x in enumerate(leaves)})
