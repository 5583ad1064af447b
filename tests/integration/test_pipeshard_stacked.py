"""Stacked parameters held per stage (``pipeline.trace.stacked_params``, ``pipeline.run.stacked``) on
a tiny scanned model: which leaves are cut, the fallbacks (a stack the loss also reads whole, several
pieces on one stage, a global-norm clip over every stack), and cutting / joining arrays."""
from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import alpa_pass as ap
from alpa_pass.pipeline.run.stacked import cut, cut_inputs, join, stage_array
from tests.helpers import assert_same_run, reference_run, run_steps
from zoo import default_optimizer
from zoo.pipeline import make_step

L = 4


def make_loss(read_whole: bool, scale: bool = False, reverse: bool = False):
    """``lax.scan`` over ``params["stack"]`` (``k [L, 8, 8]``, ``b [L, 8]``), then a linear head;
    ``read_whole``: the loss also reads ``stack["b"]`` whole (an L2 penalty); ``scale``: the stack
    is scaled before the scan (as a mixed-precision policy casts a param tree before applying it);
    ``reverse``: the scan runs its rows last to first."""
    def loss(params, batch):
        def body(h, p):
            return jnp.tanh(h @ p["k"] + p["b"]), None

        stack = params["stack"]
        if scale:
            stack = jax.tree.map(lambda x: x * 0.5, stack)
        h, _ = lax.scan(body, batch["x"], stack, reverse=reverse)
        out = jnp.mean((h @ params["head"] - batch["y"]) ** 2)
        return out + 1e-2 * jnp.sum(params["stack"]["b"] ** 2) if read_whole else out

    return loss


def setup(optimizer, read_whole=False, steps=2, scale=False, reverse=False, layers=L):
    rng = np.random.default_rng(0)
    params = {"stack": {"k": rng.standard_normal((layers, 8, 8), np.float32) * 0.4,
                        "b": rng.standard_normal((layers, 8), np.float32) * 0.1},
              "head": rng.standard_normal((8, 2), np.float32) * 0.3}
    batches = [{"x": rng.standard_normal((8, 8), np.float32), "y": rng.standard_normal((8, 2), np.float32)}
               for _ in range(steps)]
    return make_step(make_loss(read_whole, scale, reverse), optimizer), (params, optimizer.init(params)), batches


def arg_shapes(compiled) -> Counter:
    return Counter(tuple(a.shape) for a in jax.tree.leaves(compiled.args_info))


def scan_lengths(stage) -> list:
    return [int(e.params["length"]) for e in stage.program.eqns if e.primitive.name == "scan"]


def cut_paths(exe, state) -> list:
    """Paths of the user leaves the step cut into per-piece leaves."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    return sorted({paths[i] for i, j in exe.program.split.inputs if j is not None and i < len(paths)})


def run(step_fn, state, batches, donate_argnums=(), **option):
    method = ap.PipeshardParallel(mesh=ap.LogicalMesh(shape=(1, 4), devices=tuple(jax.devices()[:4])),
                                  num_micro_batches=2, **option)
    step = ap.parallelize(step_fn, method=method, donate_argnums=donate_argnums)
    ref = reference_run(step_fn, state, batches)  # first: a donating step deletes the state's arrays
    got = run_steps(step, state, batches)
    assert_same_run(ref, got)
    assert step.num_plans == 1
    return step.get_executable(state, batches[0]), got


def test_a_stack_the_loss_also_reads_whole_keeps_one_owner():
    step_fn, state, batches = setup(default_optimizer(), read_whole=True)
    exe, (new_state, _) = run(step_fn, state, batches, donate_argnums=(0,),
                              stage_option=ap.UniformStageOption(num_stages=2))
    # k (and its Adam moments) is cut per stage; b, read whole by the penalty, stays one leaf
    # (the state is donated: each stage donates the views of its pieces of the previous state)
    assert cut_paths(exe, state) == ["[0]['stack']['k']", "[1][0].mu['stack']['k']", "[1][0].nu['stack']['k']"]
    assert new_state[0]["stack"]["k"].sharding.mesh.axis_names[0] == "stage"
    assert exe.plan.stacked == (3, (0, 2, 4)) and "stacked leaves held per piece: 3" in exe.plan.summary()
    assert len(new_state[0]["stack"]["b"].sharding.device_set) == 2  # on its owner stage's submesh


def test_a_stack_scaled_before_the_scan_is_scaled_per_piece_on_its_stage():
    step_fn, state, batches = setup(default_optimizer(), scale=True)
    exe, _ = run(step_fn, state, batches, stage_option=ap.UniformStageOption(num_stages=2))
    assert len(cut_paths(exe, state)) == 6  # k, b and their Adam moments
    for st in exe.program.stages:
        assert arg_shapes(st.fwd)[(2, 8, 8)] == 1 and arg_shapes(st.fwd)[(L, 8, 8)] == 0
        scales = [e for e in st.program.eqns if e.primitive.name == "mul" and e.outvars[0].aval.shape[0] == 2]
        assert len(scales) == 2 and all(e.invars[0] in st.program.param_inputs for e in scales)


def test_several_pieces_per_stage_and_a_global_norm_clip():
    optimizer = optax.chain(optax.clip_by_global_norm(0.05), default_optimizer())
    step_fn, state, batches = setup(optimizer)
    exe, (new_state, _) = run(step_fn, state, batches, layer_option=ap.AutoLayerOption(layer_num=4),
                              stage_option=ap.UniformStageOption(num_stages=2))
    # the stack is cut into 4 scans (one per layer); each stage's two pieces are merged into one
    assert [scan_lengths(st) for st in exe.program.stages] == [[1, 1], [1, 1]]
    assert exe.program.split.bounds == (0, 2, 4)
    assert [arg_shapes(st.fwd)[(2, 8, 8)] for st in exe.program.stages] == [1, 1]
    # the norm's sums of squares run per piece on the stages; the cross-stage program adds scalars
    (cross,) = [a for a in exe.program.apply if a.site == "cross"]
    assert set(arg_shapes(cross.exe)) == {()}
    for x in jax.tree.leaves(new_state[0]["stack"]):
        assert x.shape[0] == L and x.sharding.mesh.axis_names[0] == "stage"


def test_a_reverse_scan_cut_into_more_layers_than_stages():
    """6 rows run last to first, one layer each, 3 layers per stage: stage 0 runs rows 5, 4, 3 and
    holds them as one [3, ...] piece; the returned array's first stage slab is stage 1's devices."""
    step_fn, state, batches = setup(default_optimizer(), reverse=True, layers=6)
    exe, (new_state, _) = run(step_fn, state, batches, stage_option=ap.ManualStageOption(
        ((0, 1, 2), (3, 4, 5)), ((1, 2), (1, 2))))
    assert [scan_lengths(st) for st in exe.program.stages] == [[1, 1, 1], [1, 1, 1]]
    assert exe.program.split.bounds == (0, 3, 6)
    assert [arg_shapes(st.fwd)[(3, 8, 8)] for st in exe.program.stages] == [1, 1]
    k = new_state[0]["stack"]["k"]
    slabs = [set(np.asarray(k.sharding.mesh.devices)[g].flat) for g in range(2)]
    assert slabs == [set(st.spec.mesh.devices) for st in reversed(exe.program.stages)]
    # fed back, each piece is a view already laid out as its stage's programs read it: no transfer
    p = exe.program
    leaves = cut_inputs(p.split, jax.tree.leaves((new_state, batches[0])))
    index = {v: i for i, v in enumerate(p.traced.step.jaxpr.invars)}
    cut = {j for j, (_, piece) in enumerate(p.split.inputs) if piece is not None}
    wanted = [(k, sh) for a in p.apply for k, sh in zip(a.program.flat_inputs, a.in_shardings) if index.get(k) in cut]
    for st in p.stages:
        for v, sh in zip((*st.program.diff_inputs, *st.program.nondiff_inputs), st.in_shardings("fwd")):
            kind, src = st.program.sources[v]
            if kind == "arg" and p.traced.marker_arg[src] in cut:
                wanted.append((p.traced.step.jaxpr.invars[p.traced.marker_arg[src]], sh))
    assert len(wanted) == 2 * 6 + 2 * 2  # per stage: k, b and their mu, nu (apply); k, b (forward)
    for v, sh in wanted:
        assert leaves[index[v]].sharding.is_equivalent_to(sh, leaves[index[v]].ndim)


@pytest.mark.parametrize("spec,joined_spec", [(PartitionSpec(None, "y"), PartitionSpec("stage", "y")),
                                               (PartitionSpec("y"), PartitionSpec(("stage", "y"), None))])
def test_join_is_one_array_over_the_stages_and_cut_views_its_buffers(spec, joined_spec):
    devs = jax.devices()
    x = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    halves = [NamedSharding(Mesh(np.array(devs[2 * i:2 * i + 2]), ("y",)), spec) for i in (0, 1)]
    parts = [jax.device_put(x[:2], halves[0]), jax.device_put(x[2:], halves[1])]
    joined = stage_array(parts)
    assert joined.sharding.spec == joined_spec and len(joined.sharding.device_set) == 4
    np.testing.assert_array_equal(np.asarray(joined), x)
    views = cut(joined, (0, 2, 4))
    for view, part in zip(views, parts):
        assert view.sharding.is_equivalent_to(part.sharding, 2)
        assert sorted(s.data.unsafe_buffer_pointer() for s in view.addressable_shards) == \
            sorted(s.data.unsafe_buffer_pointer() for s in part.addressable_shards)
    # a slab holding two pieces is sliced on its own devices
    quarters = cut(joined, (0, 1, 2, 3, 4))
    assert [np.asarray(q).tolist() for q in quarters] == [x[i:i + 1].tolist() for i in range(4)]
    assert quarters[3].sharding.device_set == parts[1].sharding.device_set


def test_join_falls_back_to_a_concatenation_for_unequal_pieces():
    devs = jax.devices()
    x = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    parts = [jax.device_put(x[:2], devs[0]), jax.device_put(x[2:], devs[1])]
    joined = join(parts, lambda xs, shardings: jax.device_put(xs, shardings))
    np.testing.assert_array_equal(np.asarray(joined), x)
    np.testing.assert_array_equal(np.asarray(cut(joined, (0, 2, 5))[1]), x[2:])
    np.testing.assert_array_equal(cut(x, (0, 2, 5))[0], x[:2])  # host values: cut on the host
