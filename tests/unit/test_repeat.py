"""Repeated structure (cpp/src/repeat.cc): structural hashes, tandem-repeat classes, merged ILP
groups; on hand graphs and on a traced GPT."""
from __future__ import annotations

import collections

import jax
import numpy as np
import pytest

from alpa_pass import _core
from alpa_pass.extract.graph import GraphBuilder, OpKind
from alpa_pass.extract.stablehlo import extract_graph
from alpa_pass.driver.planning import core_graph
from alpa_pass.trace.lower import lower
from tests.helpers import F32, MESH24, built_graph
from zoo import default_optimizer, gpt, init_state


def options(tie: bool):
    opts = _core.CoreOptions()
    opts.tie_repeated_layers = tie
    return opts


def stack(layers: int, hidden: int = 64, params_first: bool = False):
    """x -> L x (w_i, dot, elementwise) -> output. Returns (core graph, (w, dot, elementwise) per
    layer)."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [32, hidden], F32, attrs=[0])
    ws = [b.add(OpKind.PARAMETER, [hidden, hidden], F32, attrs=[i + 1]) for i in range(layers)] \
        if params_first else []
    per_layer = []
    for i in range(layers):
        w = ws[i] if params_first else b.add(OpKind.PARAMETER, [hidden, hidden], F32, attrs=[i + 1])
        d = b.add(OpKind.DOT, [32, hidden], F32, [x, w], [0, 1, 1, 0])
        x = b.add(OpKind.ELEMENTWISE, [32, hidden], F32, [d])
        per_layer.append((w, d, x))
    b.add(OpKind.OUTPUT, [32, hidden], F32, [x], [0])
    return built_graph(b), per_layer


def test_hashes_ignore_argument_index_but_see_neighbours():
    g, layers = stack(6)
    h0 = _core.structural_hashes(g, 0)
    ws = [w for w, _, _ in layers]
    assert len({int(h0[w]) for w in ws}) == 1            # same shape, only the arg index differs
    assert h0[layers[0][1]] != h0[layers[0][0]]           # dot vs parameter
    h2 = _core.structural_hashes(g, 2)
    dots = [d for _, d, _ in layers]
    assert h2[dots[0]] != h2[dots[2]]                    # the first dot reads x, a parameter
    assert h2[dots[2]] == h2[dots[3]]                    # interior layers look alike


def test_stride_two_ties_even_and_odd_copies_apart():
    g, layers = stack(6)
    node_class, _ = _core.find_repeats(g, 0, 0, stride=2)
    for pos in range(3):
        assert len({int(node_class[layer[pos]]) for layer in layers[0::2]}) == 1
        assert len({int(node_class[layer[pos]]) for layer in layers[1::2]}) == 1
        assert node_class[layers[0][pos]] != node_class[layers[1][pos]]


def test_stack_is_one_region_with_one_class_per_op_and_layer_position():
    g, layers = stack(6)
    node_class, regions = _core.find_repeats(g, 0, 0, stride=1)
    assert regions == [(1, 19, 3)]                       # period 3 (w, dot, elementwise), 6 copies
    for pos in range(3):
        assert len({int(node_class[layer[pos]]) for layer in layers}) == 1
    assert len({int(node_class[v]) for v in layers[0]}) == 3
    fine, _ = _core.find_repeats(g, 0, 2, stride=1)               # boundary layers split off, interior stays
    assert len({int(fine[layers[i][1]]) for i in range(2, 4)}) == 1
    assert fine[layers[0][1]] != fine[layers[2][1]]


def test_same_shaped_neighbours_without_tied_compute_are_not_a_class():
    """Three [h, h] parameters in a row (a scanned stack's wq, wo, wv) repeat in the hash sequence,
    and stride 2 would tie the first to the third; their dots are no repeat (the second reads its
    weight transposed, the third's result feeds a different op), so anchoring (``repeat.h``)
    drops that class: without it the ILP had to give wo the layout of wv (a scanned GPT on 2x4
    paid 1.9% for it). Each parameter of a real stack reaches its tied dot, and stays tied."""
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [32, 64], F32, attrs=[0])
    wa, wb, wc = (b.add(OpKind.PARAMETER, [64, 64], F32, attrs=[i + 1]) for i in range(3))
    da = b.add(OpKind.DOT, [32, 64], F32, [x, wa], [0, 1, 1, 0])
    db = b.add(OpKind.DOT, [32, 64], F32, [da, wb], [0, 1, 1, 1])
    dc = b.add(OpKind.DOT, [32, 64], F32, [db, wc], [0, 1, 1, 0])
    r = b.add(OpKind.REDUCE, [32], F32, [dc], [1])
    b.add(OpKind.OUTPUT, [32], F32, [r], [0])
    g = built_graph(b)
    loose, _ = _core.find_repeats(g, 0, 0, anchor=False)
    assert loose[wa] == loose[wc] >= 0 and loose[wb] < 0
    anchored, _ = _core.find_repeats(g, 0, 0)
    assert (np.asarray(anchored) == -1).all()
    stacked, layers = stack(6)
    node_class, _ = _core.find_repeats(stacked, 0, 0, stride=1)
    assert len({int(node_class[w]) for w, _, _ in layers}) == 1 and node_class[layers[0][0]] >= 0


def test_no_repeats_without_two_full_copies():
    g, _ = stack(1)
    node_class, regions = _core.find_repeats(g)
    assert regions == [] and (np.asarray(node_class) == -1).all()


def _solve(ilp):
    from alpa_pass.solve.highs import SolveOptions, solve_ilp

    return solve_ilp(ilp, SolveOptions(rel_gap=0.0))


@pytest.mark.parametrize("params_first", [False, True])
def test_ties_merge_groups_collapse_edges_and_keep_the_optimum(params_first):
    # 16 layers: the default class hashes (6 WL rounds) keep the dots within 6 hops of either end
    # (3 layers of this 2-hop-per-layer chain) out of the interior classes.
    g, layers = stack(16, params_first=params_first)
    untied = _core.build_sharding_problem(g, MESH24, options(False), [])
    tied = _core.build_sharding_problem(g, MESH24, options(True), [])
    st = tied.repeat_stats
    assert st["groups_before"] == untied.ilp.num_groups == 1 + 2 * 16
    assert st["groups_after"] == tied.ilp.num_groups < untied.ilp.num_groups
    assert st["classes_tied"] >= 2 and st["classes_skipped"] == 0
    # Interior layers of one parity share their dot's group (stride 2: even and odd copies apart).
    ng = np.asarray(tied.node_group)
    assert ng[layers[4][1]] == ng[layers[6][1]] == ng[layers[10][1]] != ng[layers[5][1]] == ng[layers[7][1]]
    assert ng[layers[0][1]] != ng[layers[2][1]]  # the first layer reads x, a parameter
    assert ng[layers[5][1]] != ng[layers[5][0]]
    assert tied.ilp.num_edge_vars <= untied.ilp.num_edge_vars / 2
    assert _solve(tied.ilp).objective == pytest.approx(_solve(untied.ilp).objective, rel=1e-9)


def _gpt_graph(layers: int):
    config = gpt.Config(layers=layers)
    opt = default_optimizer()
    state = jax.eval_shape(lambda: init_state(gpt.init(jax.random.key(0), config), opt))
    batch = jax.eval_shape(lambda: gpt.make_batch(jax.random.key(1), config))
    graph = extract_graph(lower(gpt.make_train_step(opt, config), (state, batch)).compiler_ir("stablehlo"))
    return graph, state


@pytest.fixture(scope="module")
def gpt_graphs():
    return {layers: _gpt_graph(layers) for layers in (4, 6, 8)}


def test_gpt_block_parameters_and_optimizer_state_fall_into_one_class_per_leaf_and_parity(gpt_graphs):
    # 8 layers: the interior layers 2-5 (layers 0 and 7, and layer 6's w2, have nodes within the
    # class hashes' 6 hops of the embedding or the head and stay out of some classes)
    graph, state = gpt_graphs[8]
    node_class, _ = _core.find_repeats(core_graph(graph))
    params = graph.param_nodes()
    by_leaf = collections.defaultdict(list)  # "mu ... ['wq']" -> [node of block 0, 1, 2, 3]
    for i, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path(state)[0]):
        key = jax.tree_util.keystr(path)
        if "['blocks']" in key:
            head, tail = key.split("['blocks']")
            by_leaf[head + tail[tail.index("]") + 1:]].append(params[i])
    assert len(by_leaf) == 3 * 13  # params, mu, nu of each of the 13 block leaves
    for leaf, nodes in by_leaf.items():
        assert len(nodes) == 8
        nodes = nodes[2:6]
        for parity in nodes[0::2], nodes[1::2]:
            assert len({int(node_class[v]) for v in parity}) == 1 and node_class[parity[0]] >= 0, leaf
        assert node_class[nodes[0]] != node_class[nodes[1]], leaf


def test_gpt_forward_dots_of_the_layers_share_classes(gpt_graphs):
    graph, _ = gpt_graphs[8]
    node_class = np.asarray(_core.find_repeats(core_graph(graph))[0])
    dots = np.flatnonzero(graph.kind == OpKind.DOT)
    sizes = collections.Counter(int(node_class[v]) for v in dots if node_class[v] >= 0)
    assert max(sizes.values()) == 4  # layers 0, 2, 4, 6 (or 1, 3, 5, 7) of one parity
    # all but the embedding / head dots and the boundary layers' dots near them (169 of 195)
    assert sum(sizes.values()) >= 0.85 * len(dots)


def test_gpt_tied_ilp_does_not_grow_with_the_layer_count(gpt_graphs):
    mesh = _core.Mesh(shape=[2, 4], alpha=[1.0, 1.0], beta=[1.0, 1.0])
    stats = {}
    for layers, (graph, _) in gpt_graphs.items():
        prob = _core.build_sharding_problem(core_graph(graph), mesh, options(True), [])
        stats[layers] = prob.repeat_stats
        assert prob.ilp.num_groups == prob.repeat_stats["groups_after"]
        assert prob.repeat_stats["classes_skipped"] == 0
    assert stats[8]["groups_before"] > 1.8 * stats[4]["groups_before"]
    # One layer's worth whatever L, once the boundary layers (whose nodes near the embedding or the
    # head are left out of their classes) are apart from the interior ones: 568 groups from L = 6.
    assert stats[8]["groups_after"] == stats[6]["groups_after"]
    assert stats[4]["groups_after"] <= stats[8]["groups_after"] <= 1.1 * stats[4]["groups_after"]
    assert stats[8]["groups_after"] < stats[8]["groups_before"] / 3  # two layers' worth of 8


def test_pins_that_part_the_repeated_layers_untie_them_rather_than_fail():
    """An FNO's eval step reads its train step's parameters where they lie (plugin following):
    the spectral weights of layers 0 and 1 split, layer 2's replicated. With the repeated layers
    tied to one layout no plan kept both, and the eval step ran unplanned ("the sharding ILP is
    infeasible", s42); without a memory budget only such pins can leave no plan, so the planner
    unties the layers (as it does for a budget) and keeps every pin."""
    import flax.linen as nn
    import jax.numpy as jnp

    import alpa_pass as ap
    from alpa_pass.driver.planning import solve_graph

    class Spectral(nn.Module):
        @nn.compact
        def __call__(self, x):
            b, h, w, c = x.shape
            w1 = self.param("w1", lambda k, s: (jax.random.uniform(k, s) + 0j).astype(jnp.complex64), (c, c, 4, 4))
            top = jnp.einsum("bxyi,ioxy->bxyo", jnp.fft.rfftn(x, axes=(1, 2))[:, :4, :4], w1)
            out = jnp.zeros((b, h, w // 2 + 1, c), jnp.complex64).at[:, :4, :4].set(top)
            return jnp.fft.irfftn(out, s=(h, w), axes=(1, 2))

    class FNO(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Dense(8)(x)
            for _ in range(3):
                x = nn.gelu(Spectral()(x) + nn.Conv(8, (1, 1))(x))
            return nn.Dense(1)(x)

    x = jnp.ones((8, 16, 16, 2))
    params = FNO().init(jax.random.PRNGKey(0), x)
    lowered = jax.jit(lambda p, x: FNO().apply(p, x).mean()).lower(params, x)
    graph = extract_graph(lowered.compiler_ir("stablehlo"))
    names = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(params)]
    params_at = graph.param_nodes()
    pins = [(params_at[i], [-1, 1] if "Spectral_0" in n or "Spectral_1" in n else [-1, -1])
            for i, n in enumerate(names)]
    assert sum(s == [-1, 1] for _, s in pins) == 2
    plan = solve_graph(graph, ap.LogicalMesh(shape=(1, 8)), ap.AutoShardingOption(), pins=pins)
    untied = solve_graph(graph, ap.LogicalMesh(shape=(1, 8)), ap.AutoShardingOption(tie_repeated_layers=False),
                         pins=pins)
    assert [list(plan.node_specs[v]) for v, _ in pins] == [s for _, s in pins]
    assert plan.objective == pytest.approx(untied.objective)
