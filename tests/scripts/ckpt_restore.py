"""``ckpt_restore.py DIR OUT.npz``: restore the GPT training state saved in DIR onto all of this
process's devices, in the layouts of a ShardParallel train step planned on them (1 x N); write
the restored leaves (``leaf_i``), their shard shapes on device 0 (``shard_i``) and the device count."""
import sys

import jax
import numpy as np

import alpa_pass as ap
from zoo import default_optimizer, gpt, init_state

path, out = sys.argv[1], sys.argv[2]
config = gpt.Config(layers=1)
optimizer = default_optimizer()
abstract = jax.eval_shape(lambda k: init_state(gpt.init(k, config), optimizer), jax.random.key(0))
batch = jax.eval_shape(lambda k: gpt.make_batch(k, config), jax.random.key(1))
exe = ap.parallelize(gpt.make_train_step(optimizer, config)).get_executable(abstract, batch)
state = ap.restore_checkpoint(path, exe)
leaves = jax.tree.leaves(state)
assert [x.sharding for x in leaves] == exe.input_shardings[:len(leaves)]
np.savez(out, device_count=jax.device_count(), **{f"leaf_{i}": np.asarray(x) for i, x in enumerate(leaves)},
         **{f"shard_{i}": np.array(x.addressable_shards[0].data.shape) for i, x in enumerate(leaves)})
