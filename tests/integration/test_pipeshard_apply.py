"""PipeshardParallel's apply (the optimizer update): one executable per stage on its submesh,
cross-stage equations (global-norm clipping) on the whole mesh, donation, has_aux.

Each module fixture compiles once (a 4-layer MLP, 2 stages on a 2 x 4 mesh) and is shared.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import alpa_pass as ap
from tests.helpers import (assert_same_run, assert_same_tree, reference_outputs, reference_run, run_steps,
                           step_outputs)
from tests.integration.test_pipeshard import setup
from zoo import default_optimizer, mlp
from zoo.pipeline import mlp_loss


def _method(micro=4):
    return ap.PipeshardParallel(mesh=ap.LogicalMesh(shape=(2, 4)), num_micro_batches=micro,
                                stage_option=ap.UniformStageOption(num_stages=2))


def _copy(tree):
    return jax.tree.map(jnp.array, tree)


@pytest.fixture(scope="module")
def donated():
    """3 Adam steps with the state donated; step 2 is fed step 1's outputs while every
    ``jax.device_put`` is recorded."""
    step_fn, state, batches = setup("mlp")
    ref = reference_run(step_fn, state, batches)
    step = ap.parallelize(step_fn, method=_method(), donate_argnums=(0,))
    exe = step.get_executable(state, batches[0])
    s1, l1 = step(_copy(state), batches[0])
    fed = jax.tree.leaves(s1)
    moved, put = [], jax.device_put

    def spy(x, *args, **kwargs):
        moved.extend(id(y) for y in jax.tree.leaves(x))
        return put(x, *args, **kwargs)

    jax.device_put = spy
    try:
        s2, l2 = step(s1, batches[1])
    finally:
        jax.device_put = put
    s3, l3 = step(s2, batches[2])
    return dict(ref=ref, got=(s3, [float(l1), float(l2), float(l3)]), exe=exe, fed=fed, moved=set(moved),
                state=s3, step=step, batch=batches[2])


def test_donated_steps_match_single_device(donated):
    assert_same_run(donated["ref"], donated["got"])


def test_preshard_leaves_a_pipelines_arguments_as_they_are(donated):
    # (Alpa's preshard_dynamic_args: a pipeline places its inputs per stage at each call)
    args = (donated["state"], donated["batch"])
    placed = donated["step"].preshard_dynamic_args(*args)
    assert all(a is b for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(args)))


def test_donated_state_is_deleted(donated):
    assert all(x.is_deleted() for x in donated["fed"]), "every donated state leaf must be consumed"


def test_feeding_outputs_back_moves_no_state(donated):
    assert not any(id(x) in donated["moved"] for x in donated["fed"])


def test_params_and_adam_state_live_on_their_stage(donated):
    exe, (params, opt_state) = donated["exe"], donated["state"]
    program = exe.program
    adam = opt_state[0]
    for k, (p, mu, nu) in enumerate(zip(*(jax.tree.leaves(t) for t in (params, adam.mu, adam.nu)))):
        stage = program.layout.owner[k]
        devices = set(exe.plan.stages[stage].devices)
        for x in (p, mu, nu):
            assert {d.id for d in x.sharding.device_set} == devices, f"leaf {k} is not on stage {stage}"
        c = program.stages[stage]
        fwd = dict(zip((*c.program.diff_inputs, *c.program.nondiff_inputs), c.in_shardings("fwd")))
        want = next(sh for v, sh in fwd.items() if c.program.sources[v] == ("arg", k))
        assert p.sharding.is_equivalent_to(want, p.ndim), "a parameter must be where its forward reads it"
    assert {d.id for d in adam.count.sharding.device_set} == set(range(8))


def test_one_apply_per_stage_without_cross_ops(donated):
    plan = donated["exe"].plan
    assert [a.site for a in plan.apply] == [0, 1]
    assert [a.devices for a in plan.apply] == [s.devices for s in plan.stages]
    assert all(a.donated > 0 for a in plan.apply)
    text = plan.summary()
    assert "stage 0" in text and "stage 1" in text and "cross-stage" not in text


@pytest.fixture(scope="module")
def clipped():
    optimizer = optax.chain(optax.clip_by_global_norm(0.05), default_optimizer())
    step_fn, state, batches = setup("mlp", optimizer=optimizer)
    step = ap.parallelize(step_fn, method=_method(2))
    exe = step.get_executable(state, batches[0])
    got = run_steps(step, state, batches)
    grads = jax.grad(mlp_loss)(state[0], batches[0])
    return dict(ref=reference_run(step_fn, state, batches), got=got, exe=exe,
                norm=float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))))


def test_global_norm_clipping_matches_single_device(clipped):
    assert clipped["norm"] > 0.05, "the test must clip"
    assert_same_run(clipped["ref"], clipped["got"])


def test_global_norm_is_computed_from_per_stage_scalars(clipped):
    apply = clipped["exe"].program.apply
    cross = [a for a in apply if a.site == "cross"]
    assert len(cross) == 1, "one cross-stage executable: the norm"
    assert cross[0].program.flat_inputs and all(np.shape(v.aval) == () for v in cross[0].program.flat_inputs), \
        "only per-stage partial sums (scalars) may reach the whole mesh"
    assert all(np.shape(v.aval) == () for v in cross[0].program.flat_outputs)
    stage_sites = sorted((a.site, a.program.phase) for a in apply if a.site != "cross")
    assert stage_sites == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for a in apply:
        if a.site != "cross" and a.program.phase == 1:
            assert len(a.program.inputs[1]) == 12, "params, mu and nu are updated (and tied) in phase 1"


def aux_loss(params, batch):
    x = mlp.apply(params, batch["x"], ap.mark_pipeline_boundary)
    err = x - batch["y"]
    aux = {"mae": jnp.mean(jnp.abs(err)), "positive": jnp.sum(x > 0).astype(jnp.int32), "pred": x[:, 0]}
    return jnp.mean(err ** 2), aux


def test_has_aux_matches_single_device():
    optimizer = default_optimizer()
    _, state, batches = setup("mlp", optimizer=optimizer)
    batches = batches[:2]

    def step_fn(state, batch):
        params, opt_state = state
        (loss, aux), grads = ap.value_and_grad(aux_loss, has_aux=True)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss, aux

    step = ap.parallelize(step_fn, method=_method())
    want, got = reference_outputs(step_fn, state, batches), step_outputs(step, state, batches)
    for w, g in zip(want, got):  # every output of every step: state, loss and aux
        assert_same_tree(w, g)
    assert got[-1][0][0][0]["kernel"].shape == (32, 32)
