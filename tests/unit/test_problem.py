"""Whole-graph assembly (cpp/src/problem.cc): groups, edge costs and ties, checked by evaluate."""
import itertools

import numpy as np
import pytest

from alpa_pass import _core
from alpa_pass.extract.graph import GraphBuilder, OpKind
from tests.helpers import F32, MESH14, MESH24, built_graph

R = [-1, -1]


def options(merge=True):
    opts = _core.CoreOptions()
    opts.merge_followers = merge
    opts.memory_cost_per_byte = 0.0
    return opts


def param(b, shape, index=0):
    return b.add(OpKind.PARAMETER, shape, F32, attrs=[index])


def dot(b, x, w, out_shape):
    return b.add(OpKind.DOT, out_shape, F32, [x, w], [0, 1, 1, 0])


def strategy_index(prob, v, name=None, out=None):
    """Index (within node v's list) of the strategy with this name or out spec."""
    lo, hi = prob.strategy_offsets[v], prob.strategy_offsets[v + 1]
    for k in range(hi - lo):
        if (name is None or prob.strategy_names[lo + k] == name) and \
                (out is None or list(prob.out_specs[lo + k]) == out):
            return k
    raise KeyError((v, name, out))


def mlp():
    b = GraphBuilder()
    x = param(b, [32, 64])
    w1 = param(b, [64, 128], 1)
    d1 = dot(b, x, w1, [32, 128])
    relu = b.add(OpKind.ELEMENTWISE, [32, 128], F32, [d1])
    w2 = param(b, [128, 64], 2)
    d2 = dot(b, relu, w2, [32, 64])
    b.add(OpKind.OUTPUT, [32, 64], F32, [d2], [0])
    return b


def test_mlp_followers_merge_into_their_leaders():
    g = built_graph(mlp())
    prob = _core.build_sharding_problem(g, MESH24, options(), [])
    assert list(prob.node_group) == [0, 1, 2, 2, 3, 4, 4]
    assert list(prob.follow) == [-1, -1, -1, 2, -1, -1, 5]
    assert prob.ilp.num_groups == 5
    unmerged = _core.build_sharding_problem(g, MESH24, options(merge=False), [])
    assert list(unmerged.node_group) == [0, 1, 2, 3, 4, 5, 5]  # outputs always follow
    offs = prob.strategy_offsets
    assert offs[-1] == prob.out_specs.shape[0] == len(prob.strategy_names)
    assert prob.in_spec_offsets[-1] == prob.in_specs.shape[0]
    assert offs[4] - offs[3] == offs[3] - offs[2]  # relu has as many strategies as dot1


def test_follower_chains_resolve_to_the_root():
    b = GraphBuilder()
    x = param(b, [32, 64])
    w = param(b, [64, 128], 1)
    d = dot(b, x, w, [32, 128])
    e = b.add(OpKind.ELEMENTWISE, [32, 128], F32, [d])
    t = b.add(OpKind.TRANSPOSE, [128, 32], F32, [e], [1, 0])
    init = b.add(OpKind.GENERATOR, [], F32)
    r = b.add(OpKind.REDUCE, [128], F32, [t, init], [1])
    prob = _core.build_sharding_problem(built_graph(b), MESH24, options(), [])
    groups = list(prob.node_group)
    assert groups[d] == groups[e] == groups[t] == groups[r]
    assert groups[init] not in (groups[d], groups[x], groups[w])
    assert prob.ilp.num_groups == 4


def matmul_problem():
    b = GraphBuilder()
    x = param(b, [32, 256])
    w = param(b, [256, 256], 1)
    d = dot(b, x, w, [32, 256])
    b.add(OpKind.OUTPUT, [32, 256], F32, [d], [0])
    return _core.build_sharding_problem(built_graph(b), MESH14, options(), [])


def test_matmul_objective_by_hand():
    prob = matmul_problem()
    ilp = prob.ilp
    assert ilp.num_groups == 3 and ilp.num_edge_vars == 2 * 3 * 3
    compute = 2 * 32 * 256 * 256 / 4 * _core.CoreOptions().compute_cost_per_flop  # the default, 1e-4
    x_rows = strategy_index(prob, 0, out=[-1, 0])
    w_repl = strategy_index(prob, 1, out=R)
    rows = strategy_index(prob, 2, name="dot lfree0@y")
    cols = strategy_index(prob, 2, name="dot rfree0@y")
    contract = strategy_index(prob, 2, name="dot c0@y")
    res = _core.evaluate(ilp, np.array([x_rows, w_repl, rows], dtype=np.int64))
    assert res.violations == []
    assert res.objective == pytest.approx(compute) and res.edge_cost == 0
    # x split by rows but the column split needs it whole: one all-gather of x over y.
    res = _core.evaluate(ilp, np.array([x_rows, w_repl, cols], dtype=np.int64))
    gather = MESH14.all_gather(32 * 256 * F32, 1)
    assert gather == pytest.approx(1 + 0.75 * 32 * 256 * F32)
    assert res.edge_cost == pytest.approx(gather)
    assert res.objective == pytest.approx(compute + gather)
    # Replicated inputs are sliced for free; the contracting split pays its all-reduce, combined
    # (the result is the program's output: nothing waits for it, its alpha is a 30 MiB bucket's share).
    res = _core.evaluate(ilp, np.array([0, 0, contract], dtype=np.int64))
    combined = MESH14.combined_all_reduce(32 * 256 * F32, [1], 30 << 20)
    assert combined == pytest.approx(MESH14.all_reduce(32 * 256 * F32, 1) - 1 + 32 * 256 * F32 / (30 << 20))
    assert res.objective == pytest.approx(compute + combined)
    best = min(_core.evaluate(ilp, np.array(a, dtype=np.int64)).objective
               for a in itertools.product(range(3), range(3), range(3)))
    assert best == pytest.approx(compute)


def test_two_edges_between_the_same_groups_share_one_ilp_edge():
    b = GraphBuilder()
    x = param(b, [64, 64])
    d = dot(b, x, x, [64, 64])
    prob = _core.build_sharding_problem(built_graph(b), MESH14, options(), [])
    assert prob.ilp.num_groups == 2 and prob.ilp.num_edge_vars == 3 * 3
    x_rows = strategy_index(prob, x, out=[-1, 0])
    rows = strategy_index(prob, d, name="dot lfree0@y")  # lhs rows split, rhs replicated
    res = _core.evaluate(prob.ilp, np.array([x_rows, rows], dtype=np.int64))
    assert res.edge_cost == pytest.approx(
        _core.reshard_cost(MESH14, [64, 64], F32, [-1, 0], R))


def test_edges_inside_a_group_fold_into_linear_costs():
    b = GraphBuilder()
    x = param(b, [32, 64])
    e = b.add(OpKind.ELEMENTWISE, [32, 64], F32, [x, x])  # follows x
    prob = _core.build_sharding_problem(built_graph(b), MESH24, options(), [])
    assert prob.ilp.num_groups == 1 and prob.ilp.num_edge_vars == 0
    n = prob.strategy_offsets[1]
    for k in range(n):
        res = _core.evaluate(prob.ilp, np.array([k], dtype=np.int64))
        assert res.edge_cost == 0
        assert res.objective == pytest.approx(prob.compute_cost[n + k])  # e's row k
    assert list(prob.node_group) == [0, 0] and e == 1


def test_ties_force_equal_specs():
    b = GraphBuilder()
    p1 = param(b, [64, 64])
    p2 = param(b, [64, 64], 1)
    o = b.add(OpKind.OUTPUT, [64, 64], F32, [p2], [0])
    prob = _core.build_sharding_problem(built_graph(b), MESH24, options(), [(o, p1), (p2, o)])
    g1, g2 = prob.node_group[p1], prob.node_group[p2]
    assert g1 != g2 and prob.node_group[o] == g2

    def assign(out1, out2):
        a = np.zeros(prob.ilp.num_groups, dtype=np.int64)
        a[g1] = strategy_index(prob, p1, out=out1)
        a[g2] = strategy_index(prob, p2, out=out2)
        return _core.evaluate(prob.ilp, a)

    assert assign([0, 1], [0, 1]).violations == []
    assert assign([0, 1], [1, 0]).violations != []


def test_bad_tie_is_rejected():
    g = built_graph(mlp())
    with pytest.raises(ValueError, match="tie"):
        _core.build_sharding_problem(g, MESH24, options(), [(0, 99)])


def transformer_like(layers, batch=8, hidden=64):
    """A chain of MLP blocks with bias, residual, layer-norm-like reduce: ~12 nodes per layer."""
    b = GraphBuilder()
    h = param(b, [batch, hidden])
    for i in range(layers):
        w1 = param(b, [hidden, 4 * hidden], 3 * i + 1)
        bias = param(b, [4 * hidden], 3 * i + 2)
        w2 = param(b, [4 * hidden, hidden], 3 * i + 3)
        u = dot(b, h, w1, [batch, 4 * hidden])
        bb = b.add(OpKind.BROADCAST, [batch, 4 * hidden], F32, [bias], [1])
        u = b.add(OpKind.ELEMENTWISE, [batch, 4 * hidden], F32, [u, bb])
        u = b.add(OpKind.ELEMENTWISE, [batch, 4 * hidden], F32, [u])
        y = dot(b, u, w2, [batch, hidden])
        h = b.add(OpKind.ELEMENTWISE, [batch, hidden], F32, [h, y])
        init = b.add(OpKind.GENERATOR, [], F32)
        m = b.add(OpKind.REDUCE, [batch], F32, [h, init], [1])
        mb = b.add(OpKind.BROADCAST, [batch, hidden], F32, [m], [0])
        h = b.add(OpKind.ELEMENTWISE, [batch, hidden], F32, [h, mb])
    b.add(OpKind.OUTPUT, [batch, hidden], F32, [h], [0])
    return b


def test_large_chain_group_count():
    layers = 300
    g = built_graph(transformer_like(layers))
    opts = options()
    opts.tie_repeated_layers = False  # count the groups of the untied problem
    prob = _core.build_sharding_problem(g, MESH24, opts, [])
    assert g.num_nodes == 1 + 13 * layers + 1
    # Groups per layer: w1, bias (+ its broadcast), w2, dot1 (+ bias add + gelu), dot2, init. The
    # residual add, the reduce, the mean's broadcast and the normalising add join existing groups.
    per_layer = 6
    assert prob.ilp.num_groups == 1 + per_layer * layers


def _shards(spec, mesh) -> int:
    return int(np.prod([n for n, d in zip(mesh.shape, spec) if d >= 0]))


def test_measured_rates_cost_the_bytes_a_dot_moves_and_16_bit_dots_at_their_rate():
    """compute_cost_per_byte (a profile's 1 / memory bandwidth): each dot or convolution strategy's
    compute is the larger of its FLOP cost and the bytes it moves per device (operands in the
    layouts it reads them, its result); other ops keep their FLOP cost (XLA fuses them);
    compute_cost_per_flop_half: dots of 2-byte operands at that rate."""
    b = GraphBuilder()
    x, w = param(b, [32, 64]), param(b, [64, 128], 1)
    d = dot(b, x, w, [32, 128])
    e = b.add(OpKind.ELEMENTWISE, [32, 128], F32, [d])
    xh, wh = b.add(OpKind.PARAMETER, [32, 64], 2, attrs=[2]), b.add(OpKind.PARAMETER, [64, 128], 2, attrs=[3])
    dh = b.add(OpKind.DOT, [32, 128], 2, [xh, wh], [0, 1, 1, 0])
    g = built_graph(b)
    per_flop, per_byte = 1e-9, 5e-9
    plain = options()
    plain.compute_cost_per_flop = per_flop
    base = _core.build_sharding_problem(g, MESH24, plain, [])
    measured = options()
    measured.compute_cost_per_flop, measured.compute_cost_per_flop_half = per_flop, per_flop / 2
    measured.compute_cost_per_byte = per_byte
    prob = _core.build_sharding_problem(g, MESH24, measured, [])
    offs, ins = np.asarray(prob.strategy_offsets), np.asarray(prob.in_spec_offsets)
    assert list(offs) == list(base.strategy_offsets)
    value_bytes = [32 * 64 * F32, 64 * 128 * F32, 32 * 128 * F32, 32 * 128 * F32, 32 * 64 * 2, 64 * 128 * 2,
                   32 * 128 * 2]
    reads = {d: [x, w], dh: [xh, wh]}
    want = np.array(base.compute_cost, dtype=np.float64)
    for v, operands in reads.items():
        for s in range(offs[v], offs[v + 1]):
            moved = prob.memory[s] + sum(value_bytes[u] / _shards(prob.in_specs[ins[s] + t], MESH24)
                                         for t, u in enumerate(operands))
            want[s] = max(base.compute_cost[s] * (0.5 if v == dh else 1.0), moved * per_byte)
    np.testing.assert_allclose(prob.compute_cost, want, rtol=1e-12, atol=0)
    # both sides of the roofline occur for the f32 dot (FLOP-bound where it splits the weight,
    # byte-bound where every device reads the weight whole); the elementwise op keeps its FLOP cost;
    # the 16-bit dot (the same strategies) costs half its f32 twin where FLOP-bound
    ours, theirs = (np.asarray(p.compute_cost[offs[d]:offs[d + 1]]) for p in (prob, base))
    assert (theirs > 0).all() and (ours == theirs).any() and (ours > theirs).any()
    assert list(prob.compute_cost[offs[e]:offs[e + 1]]) == list(base.compute_cost[offs[e]:offs[e + 1]])
    half = np.asarray(prob.compute_cost[offs[dh]:offs[dh + 1]])
    assert np.isclose(half, theirs / 2, rtol=1e-12, atol=0).any() and (half < ours).all()
