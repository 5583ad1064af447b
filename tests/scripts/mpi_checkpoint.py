"""Run under ``alpa_pass.launch`` on several processes: ``mpi_checkpoint.py DIR OUT.npz MESH``.

One ShardParallel GPT step on the global mesh, then ``save_checkpoint(DIR, state, 1)`` from every
process (each writes the shards of its own devices). Rank 0 writes OUT.npz with the saved state's
leaves (``leaf_i``, gathered here only to check the checkpoint) and ``process_count``."""
import sys

import jax
import numpy as np

import alpa_pass as ap
from alpa_pass.runtime.multiprocess import to_host
from zoo import default_optimizer, gpt, init_state

path, out, mesh_text = sys.argv[1], sys.argv[2], sys.argv[3]
config = gpt.Config(layers=1)
optimizer = default_optimizer()
state = init_state(gpt.init(jax.random.key(0), config), optimizer)
step = ap.parallelize(gpt.make_train_step(optimizer, config),
                      method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=tuple(int(n) for n in mesh_text.split("x")))))
state, _ = step(state, gpt.make_batch(jax.random.key(100), config))
assert not all(x.is_fully_addressable for x in jax.tree.leaves(state)), "the state must span processes"
ap.save_checkpoint(path, state, 1)
leaves = to_host(jax.tree.leaves(state))
if jax.process_index() == 0:
    np.savez(out, process_count=jax.process_count(), **{f"leaf_{i}": x for i, x in enumerate(leaves)})
