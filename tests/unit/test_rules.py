"""Per-op strategy rules (cpp/src/rules/*.cc) through ``_core.node_strategies``.

Meshes: MESH24 = (2, 4) named x, y; MESH14 = (1, 4) whose x axis has size 1 (never split).
"""
import numpy as np
import pytest

from alpa_pass import _core
from alpa_pass.extract.graph import GraphBuilder, OpKind
from tests.helpers import F32, MESH14, MESH24, built_graph

R = [-1, -1]
PER_FLOP = _core.CoreOptions().compute_cost_per_flop  # the default, 1e-4


def options(**kw):
    opts = _core.CoreOptions()
    opts.merge_followers = False
    opts.memory_cost_per_byte = 0.0
    opts.all_reduce_combine_bytes = 0.0  # every all-reduce pays alpha (combining: tests that say so)
    for k, v in kw.items():
        setattr(opts, k, v)
    return opts


def strategies(b, v, mesh, **kw):
    return _core.node_strategies(built_graph(b), v, mesh, options(**kw))


def by_out(ns):
    """{tuple(out spec): strategy} (asserts the out specs are distinct)."""
    table = {tuple(s.out): s for s in ns.strategies}
    assert len(table) == len(ns.strategies)
    return table


def param(b, shape, index=0):
    return b.add(OpKind.PARAMETER, shape, F32, attrs=[index])


# --- parameter, output, generator, opaque, small nodes -------------------------------------------

def test_parameter_enumerates_every_spec_priced_by_held_bytes():
    b = GraphBuilder()
    p = param(b, [8, 6])
    ns = strategies(b, p, MESH24, memory_cost_per_byte=0.5)
    assert [s.out for s in ns.strategies] == _core.enumerate_specs([8, 6], MESH24)
    assert all(s.comm == 0 and s.ins == [] for s in ns.strategies)
    # holding cost = per-device bytes * memory_cost_per_byte: 8*6*4 bytes / shards * 0.5
    shards = [(2 if s.out[0] >= 0 else 1) * (4 if s.out[1] >= 0 else 1) for s in ns.strategies]
    assert [s.compute for s in ns.strategies] == pytest.approx([96.0 / n for n in shards])
    assert ns.follow == -1
    # 6 columns do not divide by 4
    assert {tuple(s.out) for s in strategies(b, p, MESH14).strategies} == {(-1, -1), (-1, 0)}


def test_output_follows_its_operand():
    b = GraphBuilder()
    p = param(b, [8, 8])
    o = b.add(OpKind.OUTPUT, [8, 8], F32, [p], [0])
    ns = strategies(b, o, MESH24)
    assert ns.follow == p
    assert [s.out for s in ns.strategies] == _core.enumerate_specs([8, 8], MESH24)
    assert all(s.ins == [s.out] for s in ns.strategies)


@pytest.mark.parametrize("kind", [OpKind.GENERATOR, OpKind.OPAQUE])
def test_generator_and_opaque_are_replicated(kind):
    b = GraphBuilder()
    p = param(b, [8, 8])
    operands = [p] if kind == OpKind.OPAQUE else []
    v = b.add(kind, [8, 8], F32, operands)
    (s,) = strategies(b, v, MESH24).strategies
    assert s.out == R and s.ins == [R] * len(operands)


def test_small_nodes_are_replicated():
    b = GraphBuilder()
    p = param(b, [4, 4])
    e = b.add(OpKind.ELEMENTWISE, [4, 4], F32, [p, p])
    assert len(strategies(b, e, MESH14).strategies) == 3
    (s,) = strategies(b, e, MESH14, replicate_below_numel=16).strategies
    assert s.out == R and s.ins == [R, R]
    assert len(strategies(b, p, MESH14, replicate_below_numel=16).strategies) == 1


# --- elementwise ---------------------------------------------------------------------------------

def test_elementwise_follower_prefers_non_broadcast_non_parameter():
    b = GraphBuilder()
    x = param(b, [32, 256])
    w = param(b, [256, 256], 1)
    d = b.add(OpKind.DOT, [32, 256], F32, [x, w], [0, 1, 1, 0])
    bias = param(b, [256], 2)
    bb = b.add(OpKind.BROADCAST, [32, 256], F32, [bias], [1])
    c = b.add(OpKind.GENERATOR, [32, 256], F32)
    s = b.add(OpKind.GENERATOR, [], F32)
    add = b.add(OpKind.ELEMENTWISE, [32, 256], F32, [bb, x, c, d, s])
    add2 = b.add(OpKind.ELEMENTWISE, [32, 256], F32, [bb, x])
    add3 = b.add(OpKind.ELEMENTWISE, [32, 256], F32, [c, bb])
    for v, leader in [(add, d), (add2, x)]:
        ns = strategies(b, v, MESH24, merge_followers=True)
        assert ns.follow == leader
        lead = strategies(b, leader, MESH24, merge_followers=True).strategies
        assert [t.out for t in ns.strategies] == [t.out for t in lead]
    # the bias broadcast makes dim 0, which no strategy of its group splits: following it would
    # keep add3 (and whatever follows it) from splitting the batch; add3 enumerates its own specs
    ns = strategies(b, add3, MESH24, merge_followers=True)
    assert ns.follow == -1
    assert [t.out for t in ns.strategies] == _core.enumerate_specs([32, 256], MESH24)
    ns = strategies(b, add, MESH24, merge_followers=True)
    for t in ns.strategies:
        assert t.ins == [t.out] * 4 + [R]  # rank-0 operand replicated
        shards = np.prod([MESH24.shape[a] for a in range(2) if t.out[a] >= 0])
        assert t.compute == pytest.approx(32 * 256 / shards * PER_FLOP)


def test_elementwise_with_unshardable_dims_enumerates_its_own_specs():
    b = GraphBuilder()
    x = param(b, [32, 512])
    sl = b.add(OpKind.ELEMENTWISE, [32, 256], F32, [x], [1])  # slice of dim 1
    ns = strategies(b, sl, MESH14, merge_followers=True)
    assert ns.follow == -1
    assert [(s.out, s.ins) for s in ns.strategies] == [(R, [R]), ([-1, 0], [[-1, 0]])]
    assert {tuple(s.out) for s in strategies(b, sl, MESH24).strategies} == {
        (-1, -1), (0, -1), (-1, 0), (0, 0)}


def test_elementwise_shape_change_does_not_follow():
    b = GraphBuilder()
    x = param(b, [32, 256])
    y = param(b, [32, 256], 1)
    cat = b.add(OpKind.ELEMENTWISE, [64, 256], F32, [x, y], [0])  # concatenate
    ns = strategies(b, cat, MESH14, merge_followers=True)
    assert ns.follow == -1
    assert {tuple(s.out) for s in ns.strategies} == {(-1, -1), (-1, 1)}


# --- broadcast, transpose, reshape ---------------------------------------------------------------

def test_broadcast_maps_split_dims_to_the_operand():
    b = GraphBuilder()
    bias = param(b, [256])
    bb = b.add(OpKind.BROADCAST, [32, 256], F32, [bias], [1])
    ns = strategies(b, bb, MESH24)
    assert [s.out for s in ns.strategies] == _core.enumerate_specs([32, 256], MESH24)
    t = by_out(ns)
    assert t[(0, 1)].ins == [[-1, 0]]
    assert t[(1, 0)].ins == [[0, -1]]
    assert t[(1, 1)].ins == [[0, 0]]
    b2 = GraphBuilder()
    row = param(b2, [1, 256])
    bb2 = b2.add(OpKind.BROADCAST, [32, 256], F32, [row], [0, 1])
    t2 = by_out(strategies(b2, bb2, MESH24))
    assert t2[(0, 1)].ins == [[-1, 1]]  # size-1 dim 0 stays replicated


def test_broadcast_follows_its_operand_when_merging():
    b = GraphBuilder()
    bias = param(b, [256])
    bb = b.add(OpKind.BROADCAST, [32, 256], F32, [bias], [1])
    ns = strategies(b, bb, MESH24, merge_followers=True)
    assert ns.follow == bias
    assert [(s.ins[0], s.out) for s in ns.strategies] == [
        (spec, [-1 if d < 0 else 1 for d in spec]) for spec in _core.enumerate_specs([256], MESH24)]
    c = b.add(OpKind.GENERATOR, [], F32)
    cb = b.add(OpKind.BROADCAST, [32, 256], F32, [c], [])
    (s,) = strategies(b, cb, MESH24, merge_followers=True).strategies  # constant: replicated
    assert s.out == R and s.ins == [R]


def test_transpose_follows_with_permuted_spec_or_enumerates():
    b = GraphBuilder()
    x = param(b, [8, 16, 32])
    tr = b.add(OpKind.TRANSPOSE, [32, 8, 16], F32, [x], [2, 0, 1])
    ns = strategies(b, tr, MESH24, merge_followers=True)
    assert ns.follow == x
    lead = strategies(b, x, MESH24).strategies
    for s, lt in zip(ns.strategies, lead, strict=True):
        assert s.ins == [lt.out]
        assert s.out == [[-1, 1, 2, 0][d + 1] for d in lt.out]  # operand dim d -> result dim
    t = by_out(strategies(b, tr, MESH24))
    assert t[(0, 2)].ins == [[2, 1]]
    assert len(t) == len(_core.enumerate_specs([32, 8, 16], MESH24))


def reshape_graph(in_shape, out_shape):
    b = GraphBuilder()
    x = param(b, in_shape)
    return b, b.add(OpKind.RESHAPE, out_shape, F32, [x])


def reshape_table(in_shape, out_shape, mesh):
    b, r = reshape_graph(in_shape, out_shape)
    return {k: s.ins[0] for k, s in by_out(strategies(b, r, mesh)).items()}


def test_reshape_merge_dims():
    t = reshape_table([4, 8, 16], [32, 16], MESH24)  # [B, S, H] -> [B*S, H]
    assert t[(-1, 0)] == [-1, 0]   # 4 shards of B*S = 4 shards of B
    assert t[(0, -1)] == [0, -1]
    assert t[(0, 0)] == R          # 8 shards of B*S: B=4 does not divide, all-gather
    assert t[(0, 1)] == [0, 2]     # H maps to H


def test_reshape_split_dims():
    t = reshape_table([8, 64], [8, 4, 16], MESH14)  # [B, H] -> [B, N, D]
    assert t[(-1, 1)] == [-1, 1]   # N is the major dim of H's group
    assert t[(-1, 2)] == R         # D is minor: cannot map
    assert t[(-1, 0)] == [-1, 0]


def test_reshape_that_cannot_map_needs_replicated_operand():
    t = reshape_table([2, 12], [8, 3], MESH14)
    assert t[(-1, 0)] == R  # 4 shards of 24 rows of 3 do not align with 2 rows of 12
    t = reshape_table([1, 32], [32], MESH14)  # unit dims are skipped
    assert t[(-1, 0)] == [-1, 1]


def test_reshape_follows_its_operand_when_merging():
    b, r = reshape_graph([8, 12], [96])
    ns = strategies(b, r, MESH14, merge_followers=True)
    assert ns.follow == 0
    got = [(s.ins[0], s.out, s.comm) for s in ns.strategies]
    gather = _core.reshard_cost(MESH14, [8, 12], F32, [-1, 1], R)
    assert gather == pytest.approx(MESH14.all_gather(8 * 12 * F32, 1))
    assert got == [(R, R, 0), ([-1, 0], [-1, 0], 0), ([-1, 1], R, pytest.approx(gather))]
    b, r = reshape_graph([8, 4, 16], [8, 64])  # [B, N, D] -> [B, H]: N's split maps to H
    t = {tuple(s.ins[0]): s for s in strategies(b, r, MESH14, merge_followers=True).strategies}
    assert t[(-1, 1)].out == [-1, 1] and t[(-1, 1)].comm == 0
    assert t[(-1, 2)].out == R and t[(-1, 2)].comm > 0


# --- reduce --------------------------------------------------------------------------------------

def test_reduce_follows_input_and_all_reduces_partial_sums():
    b = GraphBuilder()
    x = param(b, [32, 256])
    init = b.add(OpKind.GENERATOR, [], F32)
    red = b.add(OpKind.REDUCE, [32], F32, [x, init], [1])
    ns = strategies(b, red, MESH14, merge_followers=True, all_reduce_combine_bytes=30 << 20)
    assert ns.follow == x
    t = {tuple(s.ins[0]): s for s in ns.strategies}
    assert t[(-1, 1)].out == R and t[(-1, 1)].ins[1] == R
    # nothing reads the sum: XLA combines its all-reduce with the others like it (its alpha share)
    combined = MESH14.combined_all_reduce(32 * F32, [1], 30 << 20)
    assert combined == pytest.approx(MESH14.all_reduce(32 * F32, 1) - 1 + 32 * F32 / (30 << 20))
    assert t[(-1, 1)].comm == pytest.approx(combined)
    assert _core.CoreOptions().all_reduce_combine_bytes == 30 << 20  # XLA's GPU default
    assert t[(-1, 0)].out == [-1, 0] and t[(-1, 0)].comm == 0
    unmerged = strategies(b, red, MESH14)
    assert unmerged.follow == -1 and len(unmerged.strategies) == 3


def test_a_partial_sum_a_matmul_waits_for_pays_a_whole_all_reduce():
    # reduce -> dot: the next matmul needs the sum, so its all-reduce is not combined (full alpha)
    b = GraphBuilder()
    x = param(b, [32, 256])
    init = b.add(OpKind.GENERATOR, [], F32)
    red = b.add(OpKind.REDUCE, [32], F32, [x, init], [1])
    w = param(b, [32, 8], 1)
    dot = b.add(OpKind.DOT, [8], F32, [red, w], [0, 1, 0, 0])
    graph = built_graph(b)
    # only the dot reaches no dot (x, init and w feed it through the reduce or directly)
    assert _core.combinable_reductions(graph) == [False, False, False, False, True]
    opts = options(all_reduce_combine_bytes=30 << 20)
    t = {tuple(s.ins[0]): s for s in _core.node_strategies(graph, red, MESH14, opts).strategies}
    assert t[(-1, 1)].comm == pytest.approx(MESH14.all_reduce(32 * F32, 1))
    # in a loop body (weight > 1) a reduction runs every trip: not combined either
    assert _core.combinable_reductions(graph, [1.0, 1.0, 1.0, 1.0, 3.0])[dot] is False
    with pytest.raises(ValueError, match="2 weights for a graph of 5 nodes"):
        _core.combinable_reductions(graph, [1.0, 1.0])


def test_reduce_renumbers_remaining_dims():
    b = GraphBuilder()
    x = param(b, [8, 16, 32])
    init = b.add(OpKind.GENERATOR, [], F32)
    red = b.add(OpKind.REDUCE, [16, 32], F32, [x, init], [0])
    t = {tuple(s.ins[0]): s for s in strategies(b, red, MESH24).strategies}
    assert t[(1, 2)].out == [0, 1] and t[(1, 2)].comm == 0
    assert t[(0, 2)].out == [-1, 1]
    assert t[(0, 2)].comm == pytest.approx(MESH24.all_reduce(16 * 32 / 4 * F32, 0))


# --- dot, convolution ----------------------------------------------------------------------------

def matmul(m, k, n):
    b = GraphBuilder()
    x = param(b, [m, k])
    w = param(b, [k, n], 1)
    d = b.add(OpKind.DOT, [m, n], F32, [x, w], [0, 1, 1, 0])
    return b, d


def test_dot_on_1x4_has_row_column_and_contracting_splits():
    b, d = matmul(32, 256, 256)
    ns = strategies(b, d, MESH14)
    names = {s.name: s for s in ns.strategies}
    assert set(names) == {"dot lfree0@y", "dot rfree0@y", "dot c0@y"}
    col = names["dot rfree0@y"]
    assert col.out == [-1, 1] and col.ins == [R, [-1, 1]] and col.comm == 0
    row = names["dot c0@y"]
    assert row.out == R and row.ins == [[-1, 1], [-1, 0]]
    assert row.comm == pytest.approx(MESH14.all_reduce(32 * 256 * F32, 1))
    batch = names["dot lfree0@y"]
    assert batch.out == [-1, 0] and batch.ins == [[-1, 0], R]
    assert all(s.compute == pytest.approx(2 * 32 * 256 * 256 / 4 * PER_FLOP) for s in ns.strategies)
    with_repl = strategies(b, d, MESH14, allow_replicated_heavy_ops=True).strategies
    assert len(with_repl) == 4 and with_repl[0].out == R and with_repl[0].name == "dot R"


def test_dot_on_2x4_uses_both_axes():
    b = GraphBuilder()
    x = param(b, [8, 32, 64])
    w = param(b, [8, 64, 16], 1)
    d = b.add(OpKind.DOT, [8, 32, 16], F32, [x, w], [1, 0, 0, 1, 2, 1])
    ns = strategies(b, d, MESH24)
    # each axis takes one of b0, lfree0, rfree0, c0 (all divide): 4 * 4 strategies.
    assert len(ns.strategies) == 16
    names = {s.name: s for s in ns.strategies}
    s = names["dot b0@x lfree0@y"]
    assert s.out == [0, 1] and s.ins == [[0, 1], [0, -1]]
    s = names["dot c0@x c0@y"]
    assert s.out == R and s.ins == [[2, 2], [1, 1]]
    per_dev = 8 * 32 * 16 * F32
    assert s.comm == pytest.approx(MESH24.all_reduce(per_dev, [0, 1]))  # one all-reduce over 8 devices



def test_no_mixed_mesh_shape_keeps_one_axis_per_dim():
    # allow_mixed_mesh_shape=False (Alpa's default): of the 16 dot strategies on 2x4 the 4 that
    # put both axes on one dim (b0, lfree0, rfree0, c0 twice) go; a parameter keeps its 1-axis specs.
    b = GraphBuilder()
    x = param(b, [8, 32, 64])
    w = param(b, [8, 64, 16], 1)
    d = b.add(OpKind.DOT, [8, 32, 16], F32, [x, w], [1, 0, 0, 1, 2, 1])
    ns = strategies(b, d, MESH24, allow_mixed_mesh_shape=False)
    assert len(ns.strategies) == 12 and "dot c0@x c0@y" not in {s.name for s in ns.strategies}
    specs = [s.out for s in strategies(b, x, MESH24, allow_mixed_mesh_shape=False).strategies]
    assert specs == [s for s in _core.enumerate_specs([8, 32, 64], MESH24) if s[0] < 0 or s[0] != s[1]]

def test_a_tiny_dot_may_also_run_replicated():
    """A dot with at most 1/65536 of the graph's largest dot's FLOPs (a jvp tangent's W @ e_i, 256
    FLOPs beside a 134 MFLOP matmul) gets the strategies that leave mesh axes unused, replicated
    included; the large dot of the same graph keeps Alpa's rule (every axis of size > 1 used)."""
    b = GraphBuilder()
    x, w = param(b, [16384, 64]), param(b, [64, 64], 1)
    a, e = param(b, [64, 2], 2), param(b, [2, 1], 3)
    big = b.add(OpKind.DOT, [16384, 64], F32, [x, w], [0, 1, 1, 0])
    tiny = b.add(OpKind.DOT, [64, 1], F32, [a, e], [0, 1, 1, 0])
    graph = built_graph(b)
    small = {s.name: s for s in _core.node_strategies(graph, tiny, MESH14, options()).strategies}
    assert set(small) == {"dot R", "dot lfree0@y"} and small["dot R"].ins == [R, R], set(small)
    large = {s.name for s in _core.node_strategies(graph, big, MESH14, options()).strategies}
    assert large == {"dot lfree0@y", "dot rfree0@y", "dot c0@y"}
    # alone in its graph the same dot is the largest: every axis used
    b2 = GraphBuilder()
    alone = b2.add(OpKind.DOT, [64, 1], F32, [param(b2, [64, 2]), param(b2, [2, 1], 1)], [0, 1, 1, 0])
    assert {s.name for s in strategies(b2, alone, MESH14).strategies} == {"dot lfree0@y"}


def test_dot_divisibility_drops_strategies():
    b, d = matmul(2, 8, 6)  # 2 rows, 8 contracting, 6 columns: only c0 divides by 4
    (s,) = strategies(b, d, MESH14).strategies
    assert s.name == "dot c0@y"
    b, d = matmul(2, 6, 6)  # nothing divides by 4: fall back to replicated
    (s,) = strategies(b, d, MESH14).strategies
    assert s.name == "dot R" and s.out == R


def conv_graph(kernel_shape, out_features, groups=1):
    b = GraphBuilder()
    x = param(b, [8, 32, 32, 16])  # NHWC
    k = param(b, kernel_shape, 1)  # HWIO
    attrs = [0, 3, 2, 1, 2, 2, 3, 0, 1, 0, 3, 1, 2, groups, 1]
    c = b.add(OpKind.CONVOLUTION, [8, 32, 32, out_features], F32, [x, k], attrs)
    return b, c


def test_convolution_splits_batch_out_features_or_in_features():
    b, c = conv_graph([3, 3, 16, 32], 32)
    names = {s.name: s for s in strategies(b, c, MESH14).strategies}
    assert set(names) == {"conv batch@y", "conv ofeat@y", "conv ifeat@y"}
    assert names["conv batch@y"].ins == [[-1, 0], R] and names["conv batch@y"].out == [-1, 0]
    assert names["conv ofeat@y"].ins == [R, [-1, 3]] and names["conv ofeat@y"].out == [-1, 3]
    ifeat = names["conv ifeat@y"]
    assert ifeat.ins == [[-1, 3], [-1, 2]] and ifeat.out == R
    assert ifeat.comm == pytest.approx(MESH14.all_reduce(8 * 32 * 32 * 32 * F32, 1))
    flops = 2 * 8 * 32 * 32 * 32 * 9 * 16
    assert _core.node_flops(built_graph(b), c) == flops
    assert ifeat.compute == pytest.approx(flops / 4 * PER_FLOP)


def test_a_depthwise_convolution_splits_its_batch_or_whole_groups():
    b, c = conv_graph([3, 3, 1, 16], 16, groups=16)  # depthwise
    names = {s.name: s for s in strategies(b, c, MESH14).strategies}
    assert set(names) == {"conv batch@y", "conv group@y"}
    group = names["conv group@y"]  # 4 of the 16 channels (groups) per device: no communication
    assert group.ins == [[-1, 3], [-1, 3]] and group.out == [-1, 3] and group.comm == 0
    assert _core.node_flops(built_graph(b), c) == 2 * 8 * 32 * 32 * 16 * 9 * 16 / 16
    b, c = conv_graph([3, 3, 8, 16], 16, groups=2)  # 2 groups do not split over 4 devices
    assert [s.name for s in strategies(b, c, MESH14).strategies] == ["conv batch@y"]


def test_a_depthwise_weight_gradient_splits_the_batch_or_whole_groups():
    """The weight gradient of a depthwise layer: lhs = activations [N, H, W, C] read as f01b (the
    batch N contracted, the channels C the lhs batch), rhs = output gradient [N, H, W, C] read as
    i01o, result [3, 3, 1, C] (01bf), batch_group_count = C. Split the batch: partial sums of the
    small filter gradient, all-reduced (data parallelism); or C / 4 whole groups per device."""
    b = GraphBuilder()
    x = param(b, [8, 32, 32, 16])
    dy = param(b, [8, 32, 32, 16], 1)
    attrs = [3, 0, 2, 1, 2, 0, 3, 1, 2, 2, 3, 0, 1, 1, 16]
    c = b.add(OpKind.CONVOLUTION, [3, 3, 1, 16], F32, [x, dy], attrs)
    names = {s.name: s for s in strategies(b, c, MESH14).strategies}
    assert set(names) == {"conv ifeat@y", "conv group@y"}
    ifeat, group = names["conv ifeat@y"], names["conv group@y"]
    assert ifeat.ins == [[-1, 0], [-1, 0]] and ifeat.out == R
    assert ifeat.comm == pytest.approx(MESH14.all_reduce(3 * 3 * 16 * F32, 1))
    assert group.ins == [[-1, 3], [-1, 3]] and group.out == [-1, 3] and group.comm == 0


# --- gather, scatter -----------------------------------------------------------------------------

def embedding_lookup(slice_h=32):
    b = GraphBuilder()
    table = param(b, [64, 32])
    ids = b.add(OpKind.PARAMETER, [8, 16], 4, attrs=[1])
    # index_vector_dim=2, offset_dims=[2], collapsed=[0], start_index_map=[0], no batching,
    # slice_sizes=[1, slice_h]
    attrs = [2, 1, 2, 1, 0, 1, 0, 0, 0, 2, 1, slice_h]
    g = b.add(OpKind.GATHER, [8, 16, slice_h], F32, [table, ids], attrs)
    return b, g


def test_gather_embedding_lookup():
    b, g = embedding_lookup()
    ns = strategies(b, g, MESH14)
    vocab = [s for s in ns.strategies if s.name.endswith("vocab-split")]
    t = {tuple(s.out): s for s in ns.strategies if s not in vocab}
    assert len(t) + len(vocab) == len(ns.strategies)
    assert set(t) == {(-1, -1), (-1, 0), (-1, 1), (-1, 2)}
    assert t[(-1, 0)].ins == [R, [-1, 0]]    # split B through the ids
    assert t[(-1, 1)].ins == [R, [-1, 1]]    # split S through the ids
    assert t[(-1, 2)].ins == [[-1, 1], R]    # split H through the table
    # vocab-parallel: the table split on V (the dim indexed with slice size 1), ids and result
    # whole on the axis; each device's partial rows all-reduced
    (v,) = vocab
    assert v.out == R and v.ins == [[-1, 0], R] and t[(-1, -1)].comm == 0
    assert v.comm == pytest.approx(MESH14.all_reduce(8 * 16 * 32 * F32, 1))
    # on 2x4 every result spec, plus a vocab split on each axis the result leaves whole
    specs = _core.enumerate_specs([8, 16, 32], MESH24)
    plain = [s for s in strategies(b, g, MESH24).strategies if not s.name.endswith("vocab-split")]
    assert len(plain) == len(specs)
    # ... and a vocab split on one axis only where the other splits the result (Megatron's data x
    # tensor layout; a lookup replicated over the other axis is dominated): 3 dims x 2 axes
    vocab = {(tuple(s.out), tuple(s.ins[0])) for s in strategies(b, g, MESH24).strategies
             if s.name.endswith("vocab-split")}
    # (spec: the dim each mesh axis splits; the table [V, H] splits H with the result's H)
    assert vocab == {((-1, 0), (0, -1)), ((-1, 1), (0, -1)), ((-1, 2), (0, 1)),
                     ((0, -1), (-1, 0)), ((1, -1), (-1, 0)), ((2, -1), (1, 0))}


def test_gather_partial_slices_cannot_split_offset_dims():
    b, g = embedding_lookup(slice_h=16)
    ns = strategies(b, g, MESH14).strategies
    assert {tuple(t.out) for t in ns if not t.name.endswith("vocab-split")} == {(-1, -1), (-1, 0), (-1, 1)}
    assert [t.name for t in ns if t.name.endswith("vocab-split")] == ["gather RRR vocab-split"]


def embedding_grad():
    """Scatter-add of updates [B=8, S=16, H=32] into a table [V=64, H] at ids [B, S, 1]."""
    b = GraphBuilder()
    table = param(b, [64, 32])
    ids = b.add(OpKind.PARAMETER, [8, 16, 1], 4, attrs=[1])
    upd = param(b, [8, 16, 32], 2)
    # index_vector_dim=2, update_window_dims=[2], inserted=[0], scatter_dims_to_operand=[0]
    attrs = [2, 1, 2, 1, 0, 1, 0, 0, 0]
    return b, b.add(OpKind.SCATTER, [64, 32], F32, [table, ids, upd], attrs)


def test_scatter_embedding_gradient():
    b, s = embedding_grad()
    names = {t.name: t for t in strategies(b, s, MESH14).strategies}
    assert set(names) == {"scatter R", "scatter win1@y", "scatter upd0@y", "scatter upd1@y", "scatter idx0@y"}
    v = names["scatter idx0@y"]  # the table split on V: each device adds the rows it holds
    assert v.out == [-1, 0] and v.ins == [[-1, 0], R, R] and v.comm == 0
    h = names["scatter win1@y"]
    assert h.out == [-1, 1] and h.ins == [[-1, 1], [-1, -1], [-1, 2]] and h.comm == 0
    # on 2x4 the vocabulary splits over one axis, the other axis splitting something: 4^2 + 6
    on24 = [t.name for t in strategies(b, s, MESH24).strategies]
    assert len(on24) == 16 + 6 and sorted(n for n in on24 if "idx" in n) == sorted(
        [f"scatter idx0@x {o}@y" for o in ("win1", "upd0", "upd1")] +
        [f"scatter {o}@x idx0@y" for o in ("win1", "upd0", "upd1")])
    bsplit = names["scatter upd0@y"]
    assert bsplit.out == R and bsplit.ins == [R, [-1, 0], [-1, 0]]
    assert bsplit.comm == pytest.approx(MESH14.all_reduce(64 * 32 * F32, 1))


def test_scatter_splits_batching_dims_without_communication():
    """The gradient of take_along_axis over the last dim: updates [B=8, S=16, 1] scattered into
    [B, S, V=32] at indices [B, S, 1, 1], B and S batching dims of both. Each device scatters its
    own rows (no all-reduce); before, only the replicated strategy had no all-reduce, and GPT
    1.3B on 8x8 held its [64, 1024, 51200] logits gradient whole on every device."""
    b = GraphBuilder()
    zeros = param(b, [8, 16, 32])
    ids = b.add(OpKind.PARAMETER, [8, 16, 1, 1], 4, attrs=[1])
    upd = param(b, [8, 16, 1], 2)
    # index_vector_dim=3, update_window_dims=[], inserted=[2], scatter_dims_to_operand=[2],
    # input_batching=[0, 1], scatter_indices_batching=[0, 1]
    attrs = [3, 0, 1, 2, 1, 2, 2, 0, 1, 2, 0, 1]
    s = b.add(OpKind.SCATTER, [8, 16, 32], F32, [zeros, ids, upd], attrs)
    names = {t.name: t for t in strategies(b, s, MESH14).strategies}
    # (the update's dim 2 has size 1: no update split; V, indexed and inserted, splits the result's
    # vocabulary, each device adding the updates that fall in its columns)
    assert set(names) == {"scatter R", "scatter bat0@y", "scatter bat1@y", "scatter idx2@y"}
    v = names["scatter idx2@y"]
    assert v.out == [-1, 2] and v.ins == [[-1, 2], R, R] and v.comm == 0
    for dim in (0, 1):
        t = names[f"scatter bat{dim}@y"]
        split = [-1, dim]
        assert t.out == split and t.ins == [split, split, split] and t.comm == 0
    both = {t.name: t for t in strategies(b, s, MESH24).strategies}["scatter bat0@x bat1@y"]
    assert both.out == [0, 1] and both.comm == 0


# --- node_flops ----------------------------------------------------------------------------------

def test_node_flops():
    b, d = matmul(32, 256, 128)
    e = b.add(OpKind.ELEMENTWISE, [32, 128], F32, [d])
    g = built_graph(b)
    assert _core.node_flops(g, d) == 2 * 32 * 128 * 256
    assert _core.node_flops(g, e) == 32 * 128


# --- invariants over whole problems --------------------------------------------------------------

def fits(spec, shape, mesh):
    """spec_fits in Python: every split divides its dim; axes of size 1 never split."""
    shards = [1] * len(shape)
    for a, d in enumerate(spec):
        if d >= 0:
            assert mesh.shape[a] > 1 and d < len(shape)
            shards[d] *= mesh.shape[a]
    return all(n % s == 0 for n, s in zip(shape, shards))


GRAPHS = {
    "reshape": lambda: reshape_graph([4, 8, 16], [32, 16])[0],
    "dot": lambda: matmul(32, 256, 256)[0],
    "conv": lambda: conv_graph([3, 3, 16, 32], 32)[0],
    "gather": lambda: embedding_lookup()[0],
    "scatter": lambda: embedding_grad()[0],
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("mesh", [MESH14, MESH24], ids=["1x4", "2x4"])
@pytest.mark.parametrize("merge", [True, False])
def test_every_spec_fits_its_tensor(name, mesh, merge):
    b = GRAPHS[name]()
    g = b.build()
    opts = options(merge_followers=merge)
    prob = _core.build_sharding_problem(built_graph(b), mesh, opts, [])
    offs, in_offs = prob.strategy_offsets, prob.in_spec_offsets
    for v in range(g.num_nodes):
        for k in range(offs[v], offs[v + 1]):
            assert fits(prob.out_specs[k], g.shape(v), mesh), (name, v, prob.strategy_names[k])
            ins = prob.in_specs[in_offs[k]:in_offs[k + 1]]
            assert len(ins) == len(g.operands(v))
            for spec, u in zip(ins, g.operands(v)):
                assert fits(spec, g.shape(u), mesh), (name, v, prob.strategy_names[k])
