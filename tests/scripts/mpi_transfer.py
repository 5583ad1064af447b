"""Run under ``alpa_pass.launch`` on 2 processes x 2 devices: cross-process moves between submeshes.

``mpi_transfer.py OUT_PREFIX``: each rank writes OUT_PREFIX.<rank>.npz with, per case, the blocks it
holds of the moved array (``case_<i>_<device id>``, its index ``index_<i>_<device id>``), the
whole moved array read back on every process (``full_<i>``, by ``global_to_host``) and ``value``.
Cases: permute (stage on process 0 -> stage on process 1 and back, split and replicated
destinations) and broadcast (a whole-cluster array -> one process's devices).
"""
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from alpa_pass.pipeline.run.cross_process import crosses_processes, put
from alpa_pass.runtime.multiprocess import global_to_host

prefix = sys.argv[1]
devices = np.array(jax.devices()).reshape(2, 2)
mesh0, mesh1 = Mesh(devices[0], ("x",)), Mesh(devices[1], ("y",))
whole = Mesh(devices, ("a", "b"))
value = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)

cases = [
    (NamedSharding(mesh0, P("x")), NamedSharding(mesh1, P(None, "y"))),
    (NamedSharding(mesh0, P(None, "x")), NamedSharding(mesh1, P())),
    (NamedSharding(mesh1, P("y")), NamedSharding(mesh0, P("x"))),
    (NamedSharding(whole, P("a", "b")), NamedSharding(mesh1, P("y"))),
]
out = {"value": value, "process": jax.process_index()}
moved = []
for i, (src, dst) in enumerate(cases):
    x = jax.make_array_from_callback(value.shape, src, lambda index: value[index], dtype=value.dtype)
    assert crosses_processes(x, dst)
    y = put(x, dst)
    assert y.sharding == dst and y.shape == value.shape
    moved.append(y)
    for s in y.addressable_shards:
        out[f"case_{i}_{s.device.id}"] = np.asarray(s.data)
        out[f"index_{i}_{s.device.id}"] = np.array([[sl.start or 0, sl.stop or n]
                                                   for sl, n in zip(s.index, value.shape)])
for i, full in enumerate(global_to_host(moved)):
    out[f"full_{i}"] = full
np.savez(f"{prefix}.{jax.process_index()}.npz", **out)
