"""Splits the partitioner gets wrong never reach a plan (cpp/include/alpa/unsafe_splits.h):
runtime-indexed dims (dynamic_slice / dynamic_update_slice / gather) and zero-size values.

Checked on ``_core.build_sharding_problem``: no strategy of any node splits such a dim, in its
result or in an operand it reads. Mesh (2, 4) named x, y.
"""
import pytest

from alpa_pass import _core
from alpa_pass.extract.graph import GraphBuilder, OpKind

MESH24 = _core.Mesh(shape=[2, 4], alpha=[1.0, 1.0], beta=[1.0, 1.0])
MESH18 = _core.Mesh(shape=[1, 8], alpha=[1.0, 1.0], beta=[1.0, 1.0])
F32 = 4


def build(b: GraphBuilder, mesh=MESH24, merge=True):
    g = b.build()
    graph = _core.Graph(g.kind, g.dtype_bytes, g.shape_offsets, g.shape_dims, g.operand_offsets,
                        g.operand_ids, g.attr_offsets, g.attrs)
    opts = _core.CoreOptions()
    opts.merge_followers = merge
    return _core.build_sharding_problem(graph, mesh, opts, [])


def split_dims(prob, v):
    """{dim split by some strategy's result of node v} and the same for each operand it reads."""
    lo, hi = prob.strategy_offsets[v], prob.strategy_offsets[v + 1]
    out = {int(d) for k in range(lo, hi) for d in prob.out_specs[k] if d >= 0}
    ins = {}
    for k in range(lo, hi):
        for t, row in enumerate(range(prob.in_spec_offsets[k], prob.in_spec_offsets[k + 1])):
            ins.setdefault(t, set()).update(int(d) for d in prob.in_specs[row] if d >= 0)
    return out, ins


def dynamic_slice_graph(consumer):
    """x[12, 2], i, dynamic_slice(x, (i, 0), (8, 2)) -> consumer(b, ds) ."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [12, 2], F32, attrs=[0])
    i = b.add(OpKind.PARAMETER, [], 4, attrs=[1])
    zero = b.add(OpKind.GENERATOR, [], 4)
    ds = b.add(OpKind.ELEMENTWISE, [8, 2], F32, [x, i, zero], [-1, 0])
    return b, x, ds, consumer(b, ds)


def _dot(b, ds):
    w = b.add(OpKind.PARAMETER, [2, 4], F32, attrs=[2])
    return b.add(OpKind.DOT, [8, 4], F32, [ds, w], [0, 1, 1, 0])


def _transpose_then_dot(b, ds):
    t = b.add(OpKind.TRANSPOSE, [2, 8], F32, [ds], [1, 0])
    w = b.add(OpKind.PARAMETER, [4, 2], F32, attrs=[2])
    return b.add(OpKind.DOT, [4, 8], F32, [w, t], [0, 1, 1, 0])


def _tanh_then_reduce(b, ds):
    e = b.add(OpKind.ELEMENTWISE, [8, 2], F32, [ds])
    init = b.add(OpKind.GENERATOR, [], F32)
    return b.add(OpKind.REDUCE, [2], F32, [e, init], [0])


@pytest.mark.parametrize("mesh", [MESH24, MESH18], ids=["2x4", "1x8"])
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_dynamic_slice_rows_are_never_split_nor_read_split(mesh, merge):
    b, x, ds, dot = dynamic_slice_graph(_dot)
    prob = build(b, mesh, merge)
    assert 0 not in split_dims(prob, ds)[0]
    out, ins = split_dims(prob, dot)
    assert 0 not in ins[0] and 0 not in out, "the dot reads the slice split along its sliced rows"
    assert 0 not in split_dims(prob, x)[0], "the sliced operand is split (resharded) along the rows"


def test_runtime_indexed_dims_are_followed_through_transpose_and_reduce():
    b, _, ds, dot = dynamic_slice_graph(_transpose_then_dot)
    prob = build(b)
    out, ins = split_dims(prob, dot)
    assert 1 not in ins[1] and 1 not in out   # the transposed rows
    b, _, ds, red = dynamic_slice_graph(_tanh_then_reduce)
    prob = build(b)
    assert 0 not in split_dims(prob, red)[1][0], "the reduce reads the rows split (a partition slice)"


def test_a_follower_that_loses_strategies_becomes_its_own_group():
    # tanh(ds) + y: the add follows y (same shape, more strategies) but may not split the rows.
    b, _, ds, _ = dynamic_slice_graph(lambda b, ds: None)
    y = b.add(OpKind.PARAMETER, [8, 2], F32, attrs=[2])
    add = b.add(OpKind.ELEMENTWISE, [8, 2], F32, [y, ds])
    prob = build(b)
    assert 0 not in split_dims(prob, add)[0]
    assert prob.node_group[add] != prob.node_group[y]


def test_a_convolution_forwards_runtime_indexed_dims_as_a_dot_does():
    """A conv over a runtime-sliced window (jax.scipy.signal.stft's framing gather feeding a
    conv): the indexed spatial dim stays whole through the conv and after it, the batch dim does
    not (it was marked too: every op after the stft ran replicated, 10x plain on 1x8)."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [8, 20, 1], F32, attrs=[0])  # (batch, time, feature)
    i = b.add(OpKind.PARAMETER, [], 4, attrs=[1])
    zero = b.add(OpKind.GENERATOR, [], 4)
    ds = b.add(OpKind.ELEMENTWISE, [8, 16, 1], F32, [x, zero, i, zero], [-1, 1])  # time picked at runtime
    w = b.add(OpKind.PARAMETER, [3, 1, 4], F32, attrs=[2])  # (window, in, out)
    # batch 0, feature 2, 1 spatial dim (1); kernel in 1, out 2, spatial (0); output batch 0,
    # feature 2, spatial (1); feature_group_count 1, batch_group_count 1
    conv = b.add(OpKind.CONVOLUTION, [8, 14, 4], F32, [ds, w], [0, 2, 1, 1, 1, 2, 0, 0, 2, 1, 1, 1])
    e = b.add(OpKind.ELEMENTWISE, [8, 14, 4], F32, [conv])
    prob = build(b, MESH18)
    for v in (conv, e):
        out, ins = split_dims(prob, v)
        assert 0 in out and 1 not in out, (v, out)
    assert 1 not in split_dims(prob, conv)[1][0]  # the conv never reads the window split


def test_gather_rows_indexed_and_sliced_are_runtime_indexed():
    # x[12, 2] gathered at one start row: offset dims (0, 1), slice (8, 2), start_index_map (0,).
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [12, 2], F32, attrs=[0])
    idx = b.add(OpKind.PARAMETER, [1], 4, attrs=[1])
    attrs = [0, 2, 0, 1, 0, 1, 0, 0, 0, 2, 8, 2]  # index_vector_dim 0; offset (0, 1); map (0,); slice (8, 2)
    gather = b.add(OpKind.GATHER, [8, 2], F32, [x, idx], attrs)
    e = b.add(OpKind.ELEMENTWISE, [8, 2], F32, [gather])
    prob = build(b)
    assert 0 not in split_dims(prob, e)[0] and 0 not in split_dims(prob, e)[1][0]


def test_a_token_read_by_dynamic_slice_looks_up_its_embedding_split_on_batch():
    """Greedy decoding: tok = dynamic_slice(out[8, 16], (0, t), (8, 1)), emb[tok] (a gather whose
    indices are the token): only the gather's batch dim from the indexed size-1 column is runtime
    indexed; the batch dim (and what follows from it) stays splittable. An embedding table read
    at a runtime-sliced row still marks every batch dim of the lookup (the indices pick from it)."""
    b = GraphBuilder()
    out = b.add(OpKind.PARAMETER, [8, 16], 4, attrs=[0])
    t = b.add(OpKind.PARAMETER, [], 4, attrs=[1])
    zero = b.add(OpKind.GENERATOR, [], 4)
    tok = b.add(OpKind.ELEMENTWISE, [8, 1], 4, [out, zero, t], [-1, 1])
    emb = b.add(OpKind.PARAMETER, [64, 32], F32, attrs=[2])
    # index_vector_dim 2 (implicit); offset (2,); collapsed (0,); map (0,); slice (1, 32)
    attrs = [2, 1, 2, 1, 0, 1, 0, 0, 0, 2, 1, 32]
    look = b.add(OpKind.GATHER, [8, 1, 32], F32, [emb, tok], attrs)
    h = b.add(OpKind.ELEMENTWISE, [8, 1, 32], F32, [look])
    table = b.add(OpKind.PARAMETER, [64, 32], F32, attrs=[3])
    rows = b.add(OpKind.ELEMENTWISE, [48, 32], F32, [table, t, zero], [-1, 0])
    idx = b.add(OpKind.PARAMETER, [8, 1], 4, attrs=[4])
    picked = b.add(OpKind.GATHER, [8, 1, 32], F32, [rows, idx], attrs)
    for merge in (True, False):
        prob = build(b, MESH18, merge)
        assert 0 in split_dims(prob, look)[0] and 0 in split_dims(prob, h)[0]
        assert 1 not in split_dims(prob, tok)[0]
        assert split_dims(prob, picked)[0] <= {2}, "a lookup in runtime-sliced rows split its batch"


def test_rows_written_by_dynamic_update_slice_are_not_followed_past_the_write():
    """A scan's stacked output: buf[32, 256, 4] = dynamic_update_slice(buf, row[1, 256, 4], (t, 0, 0)).
    The update op keeps the time dim whole (its result and the buffer it reads), but its result's
    elements sit where they are: after the loop, reshaped to [8192, 4] (the rollout as one batch,
    PureJaxRL) and to [4, 2048, 4] minibatches, the batch dims stay splittable. A dynamic_slice's
    rows are followed (the contrast)."""
    b = GraphBuilder()
    buf = b.add(OpKind.PARAMETER, [32, 256, 4], F32, attrs=[0])
    row = b.add(OpKind.PARAMETER, [1, 256, 4], F32, attrs=[1])
    t = b.add(OpKind.PARAMETER, [], 4, attrs=[2])
    zero = b.add(OpKind.GENERATOR, [], 4)
    dus = b.add(OpKind.ELEMENTWISE, [32, 256, 4], F32, [buf, row, t, zero, zero], [-1, 0])
    flat = b.add(OpKind.RESHAPE, [8192, 4], F32, [dus])
    mbs = b.add(OpKind.RESHAPE, [4, 2048, 4], F32, [flat])
    sq = b.add(OpKind.ELEMENTWISE, [4, 2048, 4], F32, [mbs])
    other = b.add(OpKind.PARAMETER, [32, 256, 4], F32, attrs=[3])
    ds = b.add(OpKind.ELEMENTWISE, [8, 256, 4], F32, [other, t, zero, zero], [-1, 0])
    after = b.add(OpKind.RESHAPE, [2048, 4], F32, [ds])
    for merge in (True, False):
        prob = build(b, MESH18, merge)
        assert 0 not in split_dims(prob, dus)[0] and 0 not in split_dims(prob, dus)[1][0]
        assert 1 in split_dims(prob, dus)[0]
        assert 0 not in split_dims(prob, after)[0], "rows a dynamic_slice picked were split"
    prob = build(b, MESH18, merge=False)  # merged, the reshapes follow the update's own layouts
    assert split_dims(prob, flat) == ({0}, {0: {0}}) and 1 in split_dims(prob, sq)[0]


def test_per_example_take_along_axis_keeps_its_batch_splittable():
    """flax's flip_sequences: take_along_axis(x, idx[B, K, 1], axis=1) on rows a dynamic_slice cut
    at a runtime column (x[B, 16] from y[B, 32]). The gather picks from the indexed time dim
    (operand-batching dim 0 pairs result dim 0 with x's own rows): only the picked dim K is
    runtime indexed; the batch B stays splittable (it marked every batch dim, and with it the
    whole backward pass of a bidirectional RNN)."""
    b = GraphBuilder()
    y = b.add(OpKind.PARAMETER, [8, 32], F32, attrs=[0])
    t = b.add(OpKind.PARAMETER, [], 4, attrs=[1])
    zero = b.add(OpKind.GENERATOR, [], 4)
    x = b.add(OpKind.ELEMENTWISE, [8, 16], F32, [y, zero, t], [-1, 1])
    idx = b.add(OpKind.PARAMETER, [8, 4, 1], 4, attrs=[2])
    # index_vector_dim 2; offset (); collapsed (1,); map (1,); operand batching (0,) x indices (0,)
    attrs = [2, 0, 1, 1, 1, 1, 1, 0, 1, 0, 2, 1, 1]
    picked = b.add(OpKind.GATHER, [8, 4], F32, [x, idx], attrs)
    h = b.add(OpKind.ELEMENTWISE, [8, 4], F32, [picked])
    for merge in (True, False):
        prob = build(b, MESH18, merge)
        assert 0 in split_dims(prob, picked)[0] and 0 in split_dims(prob, h)[0]
        assert 1 not in split_dims(prob, picked)[0] | split_dims(prob, h)[0]


def test_zero_size_values_stay_replicated():
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [8, 16], F32, attrs=[0])
    w = b.add(OpKind.PARAMETER, [16, 0], F32, attrs=[1])
    dot = b.add(OpKind.DOT, [8, 0], F32, [x, w], [0, 1, 1, 0])
    out = b.add(OpKind.OUTPUT, [8, 0], F32, [dot], [0])
    prob = build(b)
    for v in (w, dot, out):
        assert split_dims(prob, v)[0] == set(), f"node {v} of a zero-size value is split"
    assert split_dims(prob, dot)[1][1] == set()


def test_elementwise_attrs_runtime_indexed_layout():
    a = _core.decode_elementwise_attrs([1, -1, 0])
    assert sorted(a.unshardable_dims) == [0, 1] and a.runtime_indexed_dims == [0]
    assert _core.decode_elementwise_attrs([2]).runtime_indexed_dims == []
    with pytest.raises(ValueError, match="more than one -1"):
        _core.decode_elementwise_attrs([-1, 0, -1])


def test_elementwise_attrs_batch_dims_layout():
    a = _core.decode_elementwise_attrs([1, 2, -2, 1])
    assert (a.unshardable_dims, a.runtime_indexed_dims, a.batch_dims) == ([1, 2], [], 1)
    b = _core.decode_elementwise_attrs([1, -1, 0, -2, 2])
    assert (sorted(b.unshardable_dims), b.runtime_indexed_dims, b.batch_dims) == ([0, 1], [0], 2)
    assert _core.decode_elementwise_attrs([2]).batch_dims == 0
    for bad in ([-2], [-2, 0], [-2, 1, 3], [-2, 1, -2, 1]):
        with pytest.raises(ValueError, match="-2 must be followed"):
            _core.decode_elementwise_attrs(bad)


def test_a_one_layer_slice_reshaped_keeps_its_other_dims_splittable():
    """scan's read of one layer: dynamic_slice(x[4, 8, 2], (i, 0, 0), (1, 8, 2)) reshaped to [8, 2].
    The indexed dim has size 1 in the slice, so the reshape's dim 0 (from the slice's dim 1) is no
    runtime-indexed dim: the dot reading it may split it. A reshape that merges an indexed dim of
    size > 1 into its group still marks the group."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [4, 8, 2], F32, attrs=[0])
    i = b.add(OpKind.PARAMETER, [], 4, attrs=[1])
    zero = b.add(OpKind.GENERATOR, [], 4)
    ds = b.add(OpKind.ELEMENTWISE, [1, 8, 2], F32, [x, i, zero, zero], [-1, 0])
    layer = b.add(OpKind.RESHAPE, [8, 2], F32, [ds])
    dot = _dot(b, layer)
    rows = b.add(OpKind.PARAMETER, [12, 2], F32, attrs=[3])
    ds8 = b.add(OpKind.ELEMENTWISE, [8, 2], F32, [rows, i, zero], [-1, 0])
    flat = b.add(OpKind.RESHAPE, [16], F32, [ds8])
    for merge in (True, False):
        prob = build(b, MESH24, merge)
        assert 1 in split_dims(prob, ds)[0] and 0 not in split_dims(prob, x)[0]
        assert 0 in split_dims(prob, layer)[0] and 0 in split_dims(prob, dot)[0]
        assert split_dims(prob, flat)[0] == set(), "an [8, 2] slice of 12 rows reshaped to [16] was split"
