"""The per-call path of a parallelized function (api.ParallelizedFunction -> Executable): it runs on
every training step, so it must not redo work. On one H200 the small GPT's step ran 1.84 ms through
alpa_pass against 1.22 ms through jax.jit (same compiled module) until the signature key stopped
going through ``jax.typeof`` and ``str(dtype)`` per leaf and equivalently placed arguments stopped
being copied (benchmarks/report/gpu/, session 19)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import alpa_pass as ap
from alpa_pass.api import _leaf_key
from alpa_pass.runtime.executable import Executable


def test_the_signature_key_says_shape_dtype_and_weak_type_whatever_the_leaf_is():
    f32 = ((3,), np.dtype("float32"), False)
    assert _leaf_key(jnp.ones(3)) == _leaf_key(np.ones(3, np.float32)) == f32
    assert _leaf_key(jax.ShapeDtypeStruct((3,), jnp.float32)) == f32
    assert _leaf_key(jnp.ones(3, jnp.bfloat16)) != f32
    assert _leaf_key(1.0)[2] is True and _leaf_key(np.float32(1.0))[2] is False  # Python scalars are weak
    for x in (jnp.asarray(1.0), jnp.float32(1.0), jnp.ones((2, 3), jnp.int8), np.int32(3), 2, True):
        aval = jax.typeof(x)  # the fast path agrees with jax's own abstraction
        assert _leaf_key(x) == (aval.shape, aval.dtype, aval.weak_type)
    key = jax.random.key(0)  # a typed key array has no weak_type attribute: jax.typeof decides
    assert _leaf_key(key) == _leaf_key(jax.ShapeDtypeStruct(key.shape, key.dtype)) == ((), key.dtype, False)


def test_one_plan_per_signature_and_the_call_neither_replans_nor_copies():
    def step(w, x):
        return w - 0.1 * (x.T @ jnp.tanh(x @ w)), jnp.sum(x)

    f = ap.parallelize(step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 1), devices=jax.devices()[:1])))
    w, x = jnp.ones((8, 8)), jnp.ones((4, 8))  # one device's arrays (SingleDeviceSharding)
    exe = f.get_executable(w, x)
    # an array on the mesh's one device is taken as it is, not copied to a NamedSharding each call
    assert not isinstance(x.sharding, NamedSharding)
    assert all(Executable._place(a, s) is a for a, s in zip((w, x), exe.input_shardings))
    w2, s = f(w, x)
    w3, _ = f(w2, np.ones((4, 8), np.float32))  # fed back, and a NumPy batch: the same signature
    assert f.num_plans == 1
    np.testing.assert_allclose(w3, step(step(w, x)[0], x)[0], rtol=1e-6)
    f(w.astype(jnp.bfloat16), x.astype(jnp.bfloat16))  # another dtype: another plan
    assert f.num_plans == 2


def test_an_argument_placed_otherwise_is_moved_to_the_planned_layout():
    mesh = ap.LogicalMesh(shape=(2, 4))
    f = ap.parallelize(lambda w, x: (w * 2.0, jnp.sum(x @ w)), method=ap.ShardParallel(mesh=mesh))
    w, x = jnp.ones((8, 16)), jnp.ones((32, 8))
    exe = f.get_executable(w, x)
    sharded = [s for s in exe.input_shardings if not s.is_fully_replicated]
    assert sharded, "the plan splits something over 8 devices"
    for a, s in zip((w, x), exe.input_shardings):
        placed = Executable._place(a, s)
        assert placed.sharding.is_equivalent_to(s, a.ndim)
        assert (placed is a) == a.sharding.is_equivalent_to(s, a.ndim)
    replicated = jax.device_put(x, NamedSharding(mesh.jax_mesh(), P()))
    out = f(w, replicated)
    np.testing.assert_allclose(out[1], jnp.sum(x @ w), rtol=1e-6)
