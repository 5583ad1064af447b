"""Run under ``alpa_pass.launch`` on 2 processes: rank 1 fails after a first collective while rank 0
keeps entering collectives. ``mpi_fault.py MODE`` with MODE ``raise`` (an uncaught exception),
``exit`` (``sys.exit(3)``) or ``kill`` (SIGKILL to itself). Rank 0 prints ``SURVIVED`` only if it
was left running for 120 s: the launcher must end it long before."""
import os
import signal
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

mode = sys.argv[1]
print(f"rank {jax.process_index()} first", multihost_utils.process_allgather(np.array([1])).ravel(), flush=True)
if jax.process_index() == 1:
    if mode == "raise":
        raise RuntimeError("injected failure on rank 1")
    if mode == "exit":
        sys.exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
start = time.time()
while time.time() - start < 120:
    multihost_utils.process_allgather(np.array([2]))
    time.sleep(0.1)
print("SURVIVED", flush=True)
