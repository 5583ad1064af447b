"""An inference loop around an op defined with jax's custom_partitioning (as jax's cuDNN attention
is), knowing nothing of alpa_pass. Prints one JSON line: a checksum per step, devices of the result."""
import json
import jax, jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning

@custom_partitioning
def act(x):
    return jnp.tanh(x)

def _partition(mesh, arg_shapes, result_shape):
    s = arg_shapes[0].sharding
    return mesh, jnp.tanh, s, (s,)

act.def_partition(partition=_partition, infer_sharding_from_operands=lambda m, a, r: a[0].sharding, sharding_rule="i j -> i j")

@jax.jit
def step(w, x):
    return act(x @ w) @ w

w = jax.random.normal(jax.random.key(0), (256, 256)) / 16
x = jax.random.normal(jax.random.key(1), (512, 256))
outs = []
for _ in range(3):
    x = step(w, x)
    outs.append(float(jnp.abs(x).sum()))
print(json.dumps({"outs": outs, "devices": len(x.sharding.device_set)}))
