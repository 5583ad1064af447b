"""ShardParallel training steps equal plain ``jax.jit`` on one device (f32, 3 steps).

Also: outputs are NamedSharded jax.Arrays that feed back in without re-planning or resharding,
and donated inputs are deleted.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

import alpa_pass as ap
from tests import helpers
from zoo import gpt, mlp, moe, setup

STEPS = 3


CASES = [
    pytest.param(mlp, mlp.Config(num_layers=3, hidden=64, batch=16), (2, 4), id="mlp-2x4", marks=pytest.mark.slow),
    pytest.param(gpt, gpt.Config(layers=2), (2, 4), id="gpt-2x4", marks=pytest.mark.slow),
    pytest.param(gpt, gpt.Config(layers=2, tied=False), (1, 8), id="gpt-untied-1x8", marks=pytest.mark.slow),
    pytest.param(moe, moe.Config(experts=8, top_k=2), (2, 4), id="moe-top2-2x4", marks=pytest.mark.slow),
    pytest.param(moe, moe.Config(experts=8, top_k=1), (1, 8), id="moe-top1-1x8"),
]


@pytest.mark.parametrize("model,config,shape", CASES)
def test_matches_single_device(model, config, shape):
    step_fn, state, batches = setup(model, config, STEPS)
    method = ap.ShardParallel(mesh=ap.LogicalMesh(shape=shape), option=ap.AutoShardingOption())
    step = ap.parallelize(step_fn, method=method)
    helpers.assert_same_run(helpers.reference_run(step_fn, state, batches), helpers.run_steps(step, state, batches))
    assert step.num_plans == 1, "feeding the step's outputs back in must not re-plan"


def test_outputs_feed_back_without_replanning_or_resharding():
    config = mlp.Config(num_layers=2, hidden=32, batch=16)
    step_fn, state, batches = setup(mlp, config, STEPS)
    step = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4))))
    exe = step.get_executable(state, batches[0])
    assert step.get_executable(state, batches[0]) is exe
    new_state, loss = step(state, batches[0])
    assert isinstance(loss, jax.Array)
    out_leaves = jax.tree.leaves((new_state, loss))
    assert len(out_leaves) == len(exe.output_shardings) == len(exe.plan.output_specs)
    for leaf, sharding in zip(out_leaves, exe.output_shardings):
        assert isinstance(leaf, jax.Array) and isinstance(leaf.sharding, NamedSharding)
        assert leaf.sharding == sharding
    # The new state has exactly the shardings the executable wants for its state input.
    n_state = len(jax.tree.leaves(new_state))
    for leaf, want in zip(jax.tree.leaves(new_state), exe.input_shardings[:n_state]):
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim), f"{leaf.sharding} != {want}"
    assert step.get_executable(new_state, batches[1]) is exe
    step(new_state, batches[1])
    assert step.num_plans == 1


def test_donated_state_is_deleted():
    config = mlp.Config(num_layers=2, hidden=32, batch=16)
    step_fn, state, batches = setup(mlp, config, STEPS)
    step = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4))),
                          donate_argnums=(0,))
    exe = step.get_executable(state, batches[0])
    placed = jax.tree.unflatten(jax.tree.structure((state, batches[0])),
                                [jax.device_put(x, s) for x, s in
                                 zip(jax.tree.leaves((state, batches[0])), exe.input_shardings)])
    placed_state, placed_batch = placed
    new_state, _ = step(placed_state, placed_batch)
    assert all(x.is_deleted() for x in jax.tree.leaves(placed_state)), "donated state buffers survive"
    assert not any(x.is_deleted() for x in jax.tree.leaves(placed_batch)), "undonated batch was deleted"
    assert not any(x.is_deleted() for x in jax.tree.leaves(new_state))


def test_bare_decorator_uses_all_devices():
    @ap.parallelize
    def scale(x):
        return 2.0 * x

    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    out = scale(x)
    np.testing.assert_array_equal(np.asarray(out), 2.0 * x)
    assert scale.get_executable(x).plan.mesh.shape == (1, len(jax.devices()))
