"""Many processes and hosts under ``mpirun``: ``mpirun -np N python -m alpa_pass.launch train.py``
(or ``alpa-pass run -np N train.py``).

Each rank joins ``jax.distributed`` from the MPI environment (:func:`initialize`), then runs the
script, whose ``alpa_pass.parallelize`` (or plugin-planned ``jax.jit``) sees every process's
devices. Every rank plans; the plans are compared (``PlanDivergedError`` names differing ranks).
A rank that fails aborts the whole job. Multi-host use: the README section "Many processes and hosts".
"""
from alpa_pass.launch.distributed import LaunchOptions, ProcessInfo, initialize

__all__ = ["LaunchOptions", "ProcessInfo", "initialize"]
