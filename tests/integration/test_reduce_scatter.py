"""prefer_reduce_scatter on mixed 2-D plans: GPT with the batch split on one mesh axis and Megatron
tensor parallelism on the other (what the ILP picks on 2x4 and 4x2). The weight gradients contract
over the data-split batch while being split on the model axis; with ``prefer_reduce_scatter`` their
data-axis all-reduces must become reduce-scatters, and 3 Adam steps must match one device."""
from __future__ import annotations

import numpy as np
import pytest

import alpa_pass as ap
from tests import helpers
from zoo import gpt, setup

STEPS = 3


def _gpt_reference(layers: int):
    """(train step, state, batches, single-device run: (final state, losses))."""
    step_fn, state, batches = setup(gpt, gpt.Config(layers=layers), STEPS)
    return step_fn, state, batches, helpers.reference_run(step_fn, state, batches)


@pytest.fixture(scope="module")
def gpt_setup():
    return _gpt_reference(layers=2)


@pytest.fixture(scope="module", params=[pytest.param((2, 4), id="2x4"),
                                        pytest.param((4, 2), id="4x2", marks=pytest.mark.slow)])
def mixed_run(request, gpt_setup):
    """Runs 3 steps with prefer_reduce_scatter on the mesh; compiles the same plan without it
    (the plain executable: all-reduces where the run reduce-scatters).

    Returns (mesh, run's executable, plain executable, (final state, losses), model axis index).
    """
    step_fn, state, batches, _ = gpt_setup
    mesh = ap.LogicalMesh(shape=request.param)
    option = ap.AutoShardingOption(prefer_reduce_scatter=True)
    step = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=mesh, option=option))
    exe = step.get_executable(state, batches[0])
    run = helpers.run_steps(step, state, batches)
    plain = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=mesh, plan=exe.plan))
    plain = plain.get_executable(*_args(gpt_setup))
    return mesh, exe, plain, run, _model_axis(exe, mesh, gpt_setup)


def _args(gpt_setup):
    step_fn, state, batches, _ = gpt_setup
    return state, batches[0]


def _model_axis(exe, mesh, gpt_setup) -> int:
    """The mesh axis that splits the MLP kernels (Megatron); asserts the plan is mixed 2-D."""
    state, batch = _args(gpt_setup)
    specs = helpers.specs_by_path((state, batch), exe.plan.input_specs)
    axes = {a for i in range(2) for k in ("w1", "w2")
            for a in sum(helpers.split_dims(specs[f"[0][0]['blocks'][{i}]['{k}']"], 2, mesh).values(), ())}
    assert len(axes) == 1, f"precondition: a Megatron-split MLP on one mesh axis, got axes {axes}"
    return mesh.axis_names.index(axes.pop())


def _groups_along(mesh, axis: int) -> set:
    ids = np.moveaxis(np.arange(mesh.num_devices).reshape(mesh.shape), axis, -1)
    return {tuple(int(i) for i in row) for row in ids.reshape(-1, mesh.shape[axis])}


def _along(collective, groups: set) -> bool:
    return collective.groups is not None and set(collective.groups) == groups


def test_mixed_plan_matches_single_device(mixed_run, gpt_setup):
    helpers.assert_same_run(gpt_setup[3], mixed_run[3])


def _all_devices(collective, n: int) -> bool:
    """One group of every device (any order)."""
    return collective.groups is not None and len(collective.groups) == 1 and sorted(collective.groups[0]) == list(range(n))


def test_gradient_all_reduces_become_reduce_scatters(mixed_run):
    mesh, exe, plain, _, model = mixed_run
    data = 1 - model
    data_groups = _groups_along(mesh, data)
    n = mesh.num_devices
    before = helpers.collectives(plain.hlo_text())
    after = helpers.collectives(exe.hlo_text())
    grads = [c for c in before if c.kind == "all-reduce" and _along(c, data_groups) and any(s for s in c.shapes)]
    assert grads, "precondition: the plain plan all-reduces gradients over the data axis"
    # Gradients partial over both axes (layer norms' and biases', whose inputs the plan splits over
    # the model axis too) are all-reduced over all devices, or over the model axis and then over
    # the data axis within the gradient all-reduce above (counted there).
    both = [c for c in before if c.kind == "all-reduce" and _all_devices(c, n)]
    # Every data-axis or all-device all-reduce of a tensor is gone, only the scalar loss may remain ...
    assert all(s == () for c in after if c.kind == "all-reduce" and (_along(c, data_groups) or _all_devices(c, n))
               for s in c.shapes), [c.line for c in after if c.kind == "all-reduce"]
    # ... each gradient is reduce-scattered over the data axis, or over all devices, instead: 1/n of
    # its bytes a device.
    rs = [c for c in after if c.kind == "reduce-scatter"]
    scalars = lambda cs: 4 * sum(1 for c in cs for s in c.shapes if s == ())  # noqa: E731
    grad_bytes = sum(c.bytes for c in grads + both) - scalars(grads + both)
    assert sum(c.bytes * (mesh.shape[data] if _along(c, data_groups) else n) for c in rs) == grad_bytes
    assert all(_along(c, data_groups) or _all_devices(c, n) for c in rs), [c.line for c in rs]


def test_model_split_gradients_are_scattered_on_both_axes(mixed_run, gpt_setup):
    # The MLP kernels are split on the model axis; their gradient shards are reduce-scattered
    # over the data axis, so each device ends with 1/8 of the kernel's gradient (the 1-D rewrite
    # left these all-reduced).
    mesh, exe, _, _, model = mixed_run
    state, _ = _args(gpt_setup)
    kernel = state[0]["blocks"][0]["w1"]
    data_groups = _groups_along(mesh, 1 - model)
    shards = [c for c in helpers.collectives(exe.hlo_text())
              if c.kind == "reduce-scatter" and _along(c, data_groups)
              and any(int(np.prod(s)) * mesh.num_devices == kernel.size and len(s) == 2 for s in c.shapes)]
    assert len(shards) >= 4, "w1 and w2 gradients of both blocks are scattered over both axes"


def test_activation_all_reduces_stay(mixed_run):
    # Megatron's activation partial sums (model axis, [batch, seq, hidden]) are not parameter
    # gradients: kept. (A model-axis all-reduce of 1-D layer-norm gradients, partial over both
    # axes, is one: it becomes part of an all-device reduce-scatter, see above.)
    # Counted as tensors, not instructions: XLA's all-reduce combiner may pair an activation with
    # another tensor (the vocab-split loss gather's [B, S, 1]) in one instruction or not.
    mesh, exe, plain, _, model = mixed_run
    model_groups = _groups_along(mesh, model)
    count = lambda exe_: sum(1 for c in helpers.collectives(exe_.hlo_text())  # noqa: E731
                             if c.kind == "all-reduce" and _along(c, model_groups)
                             for s in c.shapes if len(s) == 3)
    assert count(exe) == count(plain) > 0


@pytest.mark.slow
def test_embedding_gradient_scatter_is_reduce_scattered_on_3d_mesh():
    # On 2x2x2 the plan scatter-adds the token-embedding gradient from batch-split updates (partial
    # sums over two batch axes, all-reduced without the option); with it, a reduce-scatter. The
    # weight gradients' partial sums over the two batch axes (4 devices) are reduce-scattered too.
    # Batch 16: at the default 8 the [8, 16, 32] updates are small enough that the plan gathers
    # them and scatters replicated (no partial sum to scatter). The merged plan (refine_unmerged=False):
    # the unmerged refinement's (refined on "auto" since session 48) has no partial sum there either.
    step_fn, state, batches = setup(gpt, gpt.Config(layers=1, batch=16), STEPS)
    ref = helpers.reference_run(step_fn, state, batches)
    option = ap.AutoShardingOption(prefer_reduce_scatter=True, refine_unmerged=False)
    step = ap.parallelize(step_fn, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 2, 2)), option=option))
    run = helpers.run_steps(step, state, batches)
    helpers.assert_same_run(ref, run)
    state = run[0]
    found = helpers.collectives(step.get_executable(state, batches[0]).hlo_text())
    scatter_add = [c for c in found if "scatter-add" in c.line]
    kinds = [c.kind for c in scatter_add]  # the scattered gradient is all-gathered for the update
    assert "reduce-scatter" in kinds and "all-reduce" not in kinds, kinds
    assert all(s == () for c in found if c.kind == "all-reduce" and c.group_size == 4 for s in c.shapes)
