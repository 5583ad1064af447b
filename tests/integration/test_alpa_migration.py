"""A script written for Alpa runs with ``import alpa_pass as alpa``: the calls of Alpa's quickstart
(``alpa.init``, bare ``@alpa.parallelize``, ``alpa.testing.assert_allclose``,
``preshard_dynamic_args``, ``alpa.util.benchmark_func``, ``get_total_allocation_size``)."""
from __future__ import annotations

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

import alpa_pass as alpa


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(4):
            x = nn.relu(nn.Dense(256 if i % 2 == 0 else 64)(x))
        return x


def train_step(state, batch):
    def loss_func(params):
        return jnp.mean((state.apply_fn(params, batch["x"]) - batch["y"]) ** 2)

    return state.apply_gradients(grads=jax.grad(loss_func)(state.params))


@pytest.fixture(scope="module")
def setup():
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (64, 64))
    batch = {"x": x, "y": x @ jax.random.normal(k2, (64, 64)) / 8}
    model = MLP()
    state = TrainState.create(apply_fn=model.apply, params=model.init(k1, x), tx=optax.adam(1e-3))
    return state, batch


def test_alpa_quickstart_calls(setup, caplog):
    state, batch = setup
    with caplog.at_level(logging.INFO, logger="alpa_pass"):
        assert alpa.init(cluster="ray") is None
    assert "without Ray" in caplog.text
    expected = jax.jit(train_step)(state, batch)
    step = alpa.parallelize(train_step)
    actual = step(state, batch)
    # (adam scales each update to ~lr: a gradient summed in another order moves it by ~1e-6)
    alpa.testing.assert_allclose(expected.params, actual.params, rtol=1e-5, atol=1e-5)
    assert any(len(leaf.sharding.device_set) == 8 for leaf in jax.tree.leaves(actual.params))
    # the leaves placed where the step reads them; calling with them moves nothing
    exe = step.get_executable(state, batch)
    placed = step.preshard_dynamic_args(state, batch)
    assert jax.tree.structure(placed) == jax.tree.structure((state, batch))
    for leaf, sharding in zip(jax.tree.leaves(placed), exe.input_shardings):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    assert all(a is b for a, b in zip(jax.tree.leaves(step.preshard_dynamic_args(*placed)), jax.tree.leaves(placed)))
    alpa.testing.assert_allclose(step(*placed).params, actual.params, rtol=0, atol=0)
    m = exe.memory_analysis()
    assert exe.get_total_allocation_size() == (m.argument_size_in_bytes + m.output_size_in_bytes
                                               + m.temp_size_in_bytes - m.alias_size_in_bytes) > 0
    assert exe.get_hlo_text() == exe.hlo_text()
    assert alpa.shutdown() is None


def test_assert_allclose_names_the_leaf_and_checks_structure():
    alpa.testing.assert_allclose({"a": [1.0, np.ones(3)]}, {"a": [1.0 + 1e-6, np.ones(3)]})
    with pytest.raises(AssertionError, match=r"\['a'\]\[1\]"):
        alpa.testing.assert_allclose({"a": [1.0, np.ones(3)]}, {"a": [1.0, np.ones(3) * 1.1]})
    with pytest.raises(AssertionError, match="pytrees differ"):
        alpa.testing.assert_allclose({"a": 1.0}, {"b": 1.0})


def test_benchmark_func_calls_and_returns_per_call_times():
    calls, syncs = [], []
    costs = alpa.util.benchmark_func(lambda: calls.append(1), lambda: syncs.append(1),
                                     warmup=2, repeat=3, number=4)
    assert len(calls) == 2 + 3 * 4 and len(syncs) == 1 + 3
    assert costs.shape == (3,) and (costs >= 0).all()
    with pytest.raises(ValueError, match="repeat >= 1"):
        alpa.util.benchmark_func(lambda: None, repeat=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"cluster": "slurm"}, "cluster is one of"),
    ({"num_nodes": 2}, "mpirun -np 2 python -m alpa_pass.launch"),
    ({"num_devices_per_node": 3}, r"devices=jax.devices\(\)\[:3\]"),
])
def test_init_says_how_to_get_what_the_script_asks_for(kwargs, match):
    with pytest.raises(alpa.OptionError, match=match):
        alpa.init(**kwargs)
    alpa.init(cluster="local", num_nodes=1, num_devices_per_node=8)  # what this run has
