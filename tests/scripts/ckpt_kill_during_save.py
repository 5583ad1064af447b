"""``ckpt_kill_during_save.py DIR``: save step 1 of a small MLP state, then start saving step 2 and
SIGKILL this process once step 2's data is written but before orbax renames its temporary
directory into place (the last moment a crash can hit). The caller checks what is left."""
import os
import signal
import sys

import jax
from orbax.checkpoint._src.path import atomicity

import alpa_pass as ap
from zoo import default_optimizer, init_state, mlp

path = sys.argv[1]
state = init_state(mlp.init(jax.random.key(0), mlp.Config(num_layers=2, hidden=32)), default_optimizer())
ap.save_checkpoint(path, state, 1)
print("saved 1", flush=True)


async def killed_finalize(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


atomicity.AtomicRenameTemporaryPath.finalize = killed_finalize
ap.save_checkpoint(path, jax.tree.map(lambda x: x + 1, state), 2)
print("SURVIVED", flush=True)
