"""``CreateStateParallel``: the training state is created directly in the train step's layouts.

On 8 devices the created state has the train step's input shardings, equals plain ``jax.jit`` of
the init bit for bit (floats too: the init is emitted with layout constraints on anchors only,
so XLA optimises the sampler's ``normal * std`` as one expression like the plain jit; with a
constraint on every value a quarter of the weights were 1 ulp off, like eager) and training from it
matches single-device ``jax.jit``; a larger GPT's init compiled from ShapeDtypeStructs holds per
device no more than the train step's share of the state.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass.errors import ShardingError
from zoo import default_optimizer, gpt, init_state

RTOL, ATOL = 1e-5, 1e-6


def _init_fn(config, optimizer):
    def init_fn(key):
        return init_state(gpt.init(key, config), optimizer)
    return init_fn


def test_created_state_equals_the_plain_init_and_trains_like_jit():
    config, optimizer = gpt.Config(layers=2), default_optimizer()
    init_fn = _init_fn(config, optimizer)
    batches = [gpt.make_batch(jax.random.key(100 + i), config) for i in range(2)]
    p_train = ap.parallelize(gpt.make_train_step(optimizer, config),
                             method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4))))
    p_init = ap.parallelize(init_fn, method=ap.CreateStateParallel(p_train, batches[0]))
    state = p_init(jax.random.key(0))
    leaves = jax.tree.leaves(state)
    train_exe = p_train.executables[0]
    assert [x.sharding for x in leaves] == train_exe.input_shardings[:len(leaves)]
    assert any(len(x.addressable_shards[0].data.shape) and x.addressable_shards[0].data.shape != x.shape
               for x in leaves), "nothing is split: a weak test"
    want = jax.jit(init_fn)(jax.random.key(0))
    assert jax.tree.structure(state) == jax.tree.structure(want)
    for i, (a, b) in enumerate(zip(leaves, jax.tree.leaves(want))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"leaf {i}")
    # training from the created state: no new plan, the same losses as one device
    dev = jax.devices()[0]
    step = jax.jit(gpt.make_train_step(optimizer, config))
    ref = jax.device_put(want, dev)
    for batch in batches:
        state, loss = p_train(state, batch)
        ref, ref_loss = step(ref, jax.device_put(batch, dev))
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=RTOL, atol=ATOL)
    assert p_train.num_plans == 1
    for i, (a, b) in enumerate(zip(jax.tree.leaves(state), jax.tree.leaves(ref))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL, err_msg=f"leaf {i}")


@pytest.mark.slow  # a GPT planned and compiled twice (GPT-39B on 8x8: benchmarks/bench_create_state.py)
def test_init_holds_no_more_than_the_train_steps_share():
    """Planned and compiled from ShapeDtypeStructs only: per-device argument + output bytes of the
    init within 10% of the train step's per-device argument bytes (Zero3: state split 8 ways)."""
    config = gpt.Config(vocab=1024, seq=32, hidden=128, heads=4, layers=2, batch=8)
    optimizer = default_optimizer()
    init_fn = _init_fn(config, optimizer)
    key = jax.eval_shape(lambda: jax.random.key(0))
    batch = jax.eval_shape(lambda k: gpt.make_batch(k, config), key)
    p_train = ap.parallelize(gpt.make_train_step(optimizer, config),
                             method=ap.Zero3Parallel(mesh=ap.LogicalMesh(shape=(2, 4))))
    init = ap.parallelize(init_fn, method=ap.CreateStateParallel(p_train, batch)).get_executable(key)
    train = p_train.executables[0].memory_analysis()
    mem = init.memory_analysis()
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(init_fn, key)))
    init_bytes = mem.argument_size_in_bytes + mem.output_size_in_bytes
    assert init_bytes <= 1.10 * train.argument_size_in_bytes, (init_bytes, train.argument_size_in_bytes)
    assert mem.output_size_in_bytes < state_bytes / 4, (mem.output_size_in_bytes, state_bytes)


def test_the_init_must_build_the_train_steps_state():
    config, optimizer = gpt.Config(layers=1), default_optimizer()
    batch = gpt.make_batch(jax.random.key(1), config)
    exe = ap.parallelize(gpt.make_train_step(optimizer, config)).get_executable(
        _init_fn(config, optimizer)(jax.random.key(0)), batch)
    method = ap.CreateStateParallel(exe, batch)
    with pytest.raises(ShardingError, match="the init must build that state"):
        ap.parallelize(lambda key: gpt.init(key, config), method=method).get_executable(jax.random.key(0))
