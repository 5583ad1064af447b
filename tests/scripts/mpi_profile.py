"""Run under ``alpa_pass.launch`` on 2 processes x 2 devices: only rank 0's host holds a cached
profile of the cluster (``alpa-pass profile`` under mpirun writes it on rank 0 only); each rank
looks in its own cache directory (``sys.argv[1]``/rank<N>). Plans with the default options
(``profile="auto"``) must use rank 0's profile on both ranks and agree; prints one JSON line per
rank with the profile planned with and the objective, then ``RAN``."""
import json
import os
import sys

import jax
import jax.numpy as jnp

import alpa_pass as ap
from alpa_pass import cost_profile

rank = jax.process_index()
os.environ["ALPA_PASS_PROFILE_DIR"] = os.path.join(sys.argv[1], f"rank{rank}")
if rank == 0:  # a synthetic profile of this cluster: every axis 1e-9 s/byte, 1 GFLOP/s
    key = cost_profile.cluster_key(**cost_profile.current_cluster())
    axes = [{"size": n, "stride": s, "alpha": 1e-5, "beta": 1e-9} for n, s in cost_profile.axes_of(4)]
    data = {"format": cost_profile.FORMAT, "format_version": cost_profile.FORMAT_VERSION, "key": key,
            "cluster": {"num_devices": 4}, "axes": axes, "compute": {"matmul_flops_per_s": {"float32": 1e9}}}
    os.makedirs(os.environ["ALPA_PASS_PROFILE_DIR"])
    with open(cost_profile.cache_path(key), "w") as f:
        f.write(cost_profile.ClusterProfile.from_dict(data).to_json())

mesh = ap.LogicalMesh(shape=(2, jax.device_count() // 2))
step = ap.parallelize(lambda a, b: jnp.tanh(a @ b), method=ap.ShardParallel(mesh=mesh))
plan = step.plan(jnp.ones((16, 32)), jnp.ones((32, 16)))
jax.block_until_ready(step(jnp.ones((16, 32)), jnp.ones((32, 16))))
print(json.dumps({"rank": rank, "profile": plan.made_with["options"]["profile"], "objective": plan.objective}),
      flush=True)
print("RAN", flush=True)
