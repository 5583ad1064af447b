"""StableHLO -> OpGraph extraction on modules lowered from real jax functions."""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alpa_pass.errors import ExtractError
from alpa_pass.extract.graph import OpKind
from alpa_pass.extract.stablehlo import extract_graph, parse_module


def _graph(f, *args):
    return extract_graph(jax.jit(f).lower(*args).compiler_ir("stablehlo"))


def _nodes(g, op_name):
    return [v for v in range(g.num_nodes) if g.op_names[v] == op_name]


def _only(g, op_name):
    (v,) = _nodes(g, op_name)
    return v


def test_graph_is_topological_and_params_outputs_are_indexed():
    def f(w, x):
        return jnp.tanh(x @ w), x.sum()

    g = _graph(f, jnp.ones((8, 16)), jnp.ones((4, 8)))
    for v in range(g.num_nodes):
        assert all(u < v for u in g.operands(v))
    assert g.num_args == 2 and g.num_outputs == 2
    assert [g.shape(v) for v in g.param_nodes()] == [(8, 16), (4, 8)]
    assert [g.labels[v] for v in g.param_nodes()] == ["w", "x"]
    outs = g.output_nodes()
    assert [g.shape(v) for v in outs] == [(4, 16), ()]
    assert [g.labels[v] for v in outs] == ["result[0]", "result[1]"]
    assert g.op_names[g.operands(outs[0])[0]] == "stablehlo.tanh"


def test_mlp_kinds_shapes_and_labels():
    def mlp(w1, w2, x):
        h = jax.nn.relu(x @ w1)
        return jnp.mean(h @ w2)

    g = _graph(mlp, jnp.ones((16, 32)), jnp.ones((32, 8), jnp.bfloat16), jnp.ones((4, 16)))
    dots = _nodes(g, "stablehlo.dot_general")
    assert [g.shape(v) for v in dots] == [(4, 32), (4, 8)]
    assert all(g.kind[v] == OpKind.DOT for v in dots)
    assert g.labels[dots[0]].startswith("dot_general@test_extract.py:")
    assert g.dtype_bytes[g.param_nodes()[1]] == 2
    kinds = {OpKind(int(k)) for k in g.kind}
    assert {OpKind.PARAMETER, OpKind.OUTPUT, OpKind.DOT, OpKind.ELEMENTWISE, OpKind.BROADCAST,
            OpKind.REDUCE, OpKind.GENERATOR} <= kinds
    assert OpKind.OPAQUE not in kinds and g.fallbacks == {}


def test_einsum_with_batch_dims_gives_dot_attrs():
    def f(q, k):
        return jnp.einsum("bshd,bthd->bhst", q, k)

    g = _graph(f, jnp.ones((2, 5, 3, 4)), jnp.ones((2, 7, 3, 4)))
    v = _only(g, "stablehlo.dot_general")
    # batch (b, h) = lhs (0, 2) / rhs (0, 2); contract d = lhs 3 / rhs 3.
    assert g.node_attrs(v) == [2, 0, 2, 0, 2, 1, 3, 3]
    assert g.shape(v) == (2, 3, 5, 7)
    assert g.operands(v) == g.param_nodes()


def test_reduce_and_broadcast_dims():
    def f(x):
        return x.sum(axis=(0, 2)), jnp.broadcast_to(x[:, :1, :].squeeze(1)[:, None, :], (2, 6, 4))

    g = _graph(f, jnp.ones((2, 3, 4)))
    r = _only(g, "stablehlo.reduce")
    assert g.kind[r] == OpKind.REDUCE and g.node_attrs(r) == [0, 2] and g.shape(r) == (3,)
    x, init = g.operands(r)
    assert x == g.param_nodes()[0] and g.kind[init] == OpKind.GENERATOR and g.shape(init) == ()
    b = [v for v in _nodes(g, "stablehlo.broadcast_in_dim") if g.shape(v) == (2, 6, 4)]
    assert [g.node_attrs(v) for v in b] == [[0, 1, 2]]
    assert g.shape(g.operands(b[0])[0]) == (2, 1, 4)


def test_transpose_reshape_and_multi_result_reduce():
    def f(x):
        return x.T.reshape(12), jnp.argmax(x, axis=1)

    g = _graph(f, jnp.ones((3, 4)))
    t = _only(g, "stablehlo.transpose")
    assert g.kind[t] == OpKind.TRANSPOSE and g.node_attrs(t) == [1, 0]
    assert g.kind[_only(g, "stablehlo.reshape")] == OpKind.RESHAPE
    r = _nodes(g, "stablehlo.reduce")
    assert len(r) == 2 and [g.shape(v) for v in r] == [(3,), (3,)]
    assert [g.locators[v].result for v in r] == [0, 1]
    assert g.locators[r[0]].op_index == g.locators[r[1]].op_index
    assert [g.dtype_bytes[v] for v in r] == [4, 4]
    assert all(len(g.operands(v)) == 2 and g.shape(g.operands(v)[1]) == () for v in r)
    # the argmax's indices are reduced with its values (not read from their iota alone): one layout
    assert [g.operands(v)[0] for v in r] == [g.param_nodes()[0]] * 2


def test_windowed_and_slicing_ops_have_unshardable_dims():
    def f(x):
        return (jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3), (1, 1), "SAME"),
                jnp.pad(x, ((2, 0), (0, 0))), jnp.sort(x, axis=1), jnp.flip(x, 0),
                jnp.concatenate([x, x], 1), x[1:, :])

    g = _graph(f, jnp.ones((4, 6)))
    expect = {"stablehlo.reduce_window": [1], "stablehlo.pad": [0], "stablehlo.sort": [1],
              "stablehlo.reverse": [0], "stablehlo.concatenate": [1], "stablehlo.slice": [0]}
    for name, dims in expect.items():
        v = _only(g, name)
        assert g.kind[v] == OpKind.ELEMENTWISE and g.node_attrs(v) == dims, name


def test_slices_at_constant_in_range_starts_are_static_slices_not_runtime_indexed():
    """The gather that transposes ``.at[:, :4].set(u)`` (an FNO's kept Fourier modes) and a
    dynamic_update_slice at a constant start read constant starts that need no clamping: they are
    slices, whose other dims split freely. Read as runtime-indexed, every op after them kept the
    batch whole (s42: an FNO's train step planned at 1.04e7 where data parallelism costs 0.8e6).
    Runtime starts, and constant ones that jax clamps, stay runtime-indexed (``[-1, dims]``)."""
    def f(x, i):
        kept = jnp.zeros_like(x).at[:, :4, -4:].set(x[:, :4, :4] * 2)
        return (kept ** 2).sum() + jax.lax.dynamic_slice(x, (0, 2, 0), (8, 4, 9)).sum()

    g = _graph(jax.grad(f), jnp.ones((8, 16, 9)), 3)
    (gather,) = [v for v in range(g.num_nodes) if g.op_names[v] == "stablehlo.gather"]
    assert g.kind[gather] == OpKind.ELEMENTWISE and g.node_attrs(gather) == [1, 2] and len(g.operands(gather)) == 1
    update = _only(g, "stablehlo.dynamic_update_slice")
    assert g.kind[update] == OpKind.ELEMENTWISE and g.node_attrs(update) == [1]

    def g2(x, i):
        return (jax.lax.dynamic_slice(x, (0, i), (8, 4)).sum() + x[:, jnp.array([1, 5])].sum()
                + jax.lax.dynamic_slice(x, (0, jnp.int32(14)), (8, 4)).sum())

    g = _graph(g2, jnp.ones((8, 16)), 3)
    slices = _nodes(g, "stablehlo.dynamic_slice")
    assert sorted(g.node_attrs(v) for v in slices) == [[-1, 1], [-1, 1]]  # runtime i; 14 > 16 - 4: clamped
    assert [g.kind[v] for v in _nodes(g, "stablehlo.gather")] == [OpKind.GATHER]  # two picked columns


def test_fft_transforms_its_trailing_dims_and_maps_the_batch_dims():
    """rfft over the last dim (its size changes), a 2-D complex fft over the last two: the leading
    dims stay shardable (spectral / Fourier-operator layers keep their batch split)."""
    def f(x):
        return jnp.fft.rfft(x, axis=-1), jnp.fft.fft2(x.astype(jnp.complex64))

    g = _graph(f, jnp.ones((4, 6, 8)))
    rfft, fft2 = _nodes(g, "stablehlo.fft")
    assert g.kind[rfft] == g.kind[fft2] == OpKind.ELEMENTWISE and g.fallbacks == {}
    assert g.node_attrs(rfft) == [2] and g.shape(rfft) == (4, 6, 5)
    assert g.node_attrs(fft2) == [1, 2]


def test_top_k_maps_its_leading_dims():
    g = _graph(lambda x: jax.lax.top_k(x, 2), jnp.ones((4, 6, 8)))
    values, indices = _nodes(g, "chlo.top_k")  # (one node per result)
    assert g.shape(values) == g.shape(indices) == (4, 6, 2) and g.fallbacks == {}
    assert all(g.kind[v] == OpKind.ELEMENTWISE and g.node_attrs(v) == [2] for v in (values, indices))


def test_random_normal_has_no_fallback():
    """jax 0.12.1 computes jax.random.normal's erf_inv with stablehlo.fma (jaxlib 0.10.2 has no such
    op): elementwise, so a jitted init's normal draws keep their split (as a replicated fallback it
    left a flax init over its memory budget unplanned). Run by the compat lane on 0.12.1."""
    g = _graph(lambda k: jax.random.normal(k, (16, 8)), jax.random.key(0))
    assert g.fallbacks == {}
    for v in _nodes(g, "stablehlo.fma"):
        assert g.kind[v] == OpKind.ELEMENTWISE and len(g.operands(v)) == 3


def test_batched_linalg_maps_its_batch_dims_across_results_of_every_rank():
    """jax's batched LAPACK custom calls (their ``sdy.sharding_rule`` shares factor i among all
    operands and results) are planned along their batch dims: eigh's eigenvalues [B, n] and its
    info [B] read the matrices [B, n, n] split as they are split (``-2, 1``); the matrix dims stay
    whole. An unbatched one is planned by its rule too, every dim whole (no fallback)."""
    g = _graph(lambda a: jnp.linalg.eigh(a @ a.swapaxes(-1, -2)), jnp.ones((6, 8, 8)))
    (vecs, vals, info) = _nodes(g, "stablehlo.custom_call")
    assert g.fallbacks == {}
    assert [g.shape(v) for v in (vecs, vals, info)] == [(6, 8, 8), (6, 8), (6,)]
    assert g.node_attrs(vecs) == [1, 2, -2, 1] and g.node_attrs(vals) == [1, -2, 1]
    assert g.node_attrs(info) == [-2, 1]
    assert all(g.kind[v] == OpKind.ELEMENTWISE for v in (vecs, vals, info))
    g = _graph(jnp.linalg.qr, jnp.ones((8, 8)))  # unbatched: its rule shares no factor, all dims whole
    assert g.fallbacks == {}
    assert [g.node_attrs(v) for v in _nodes(g, "stablehlo.custom_call")] == [[0, 1], [0], [0, 1]]


def test_custom_partitioning_ops_follow_their_sharding_rule():
    """A ``custom_partitioning`` op with ``sharding_rule="b i j, b j -> b i"`` lowered for 8 devices
    (``trace.lower``'s ``mesh``): a CustomSPMDPartitioning call whose factors say b is a batch dim
    shared by both operands, i stays whole: the operand of the result's rank (v) has j there, and
    ELEMENTWISE maps same-rank operands dim by dim."""
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    @custom_partitioning
    def matvec(a, v):
        return jnp.einsum("bij,bj->bi", a, v)

    def partition(mesh, arg_shapes, result_shape):
        return mesh, lambda a, v: jnp.einsum("bij,bj->bi", a, v), result_shape.sharding, \
            tuple(s.sharding for s in arg_shapes)

    matvec.def_partition(partition=partition, infer_sharding_from_operands=lambda m, a, r: a[1].sharding,
                         sharding_rule="b i j, b j -> b i")
    mesh = Mesh(np.array(jax.devices()[:8]), ("d",))
    replicated = NamedSharding(mesh, P())
    lowered = jax.jit(matvec, in_shardings=(replicated, replicated)).lower(jnp.ones((8, 6, 4)), jnp.ones((8, 4)))
    g = extract_graph(lowered.compiler_ir("stablehlo"))
    (v,) = _nodes(g, "stablehlo.custom_call")
    assert g.fallbacks == {} and g.kind[v] == OpKind.ELEMENTWISE
    assert g.node_attrs(v) == [1, -2, 1]


def test_call_is_inlined_per_call_path():
    @jax.jit
    def h(a):
        return jnp.sin(a)

    g = _graph(lambda x: h(h(x)), jnp.ones((3,)))
    s = _nodes(g, "stablehlo.sine")
    assert len(s) == 2 and g.operands(s[1]) == [s[0]]
    l0, l1 = g.locators[s[0]], g.locators[s[1]]
    assert l0.func == l1.func != "main" and l0.op_index == l1.op_index
    assert l0.call_path != l1.call_path and len(l0.call_path) == 1


def test_unknown_op_falls_back_to_opaque_and_logs_once(caplog):
    """An op without a rule (``stablehlo.rng``, lax.rng_uniform) is OPAQUE (computed replicated),
    counted per instance and warned about once; one of at most QUIET_FALLBACK_BYTES is counted
    without a warning (it cannot cost a plan anything)."""
    def f(x):
        y = jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0, x)
        z = jax.lax.fori_loop(0, 2, lambda i, c: c + 1.0, y)
        return z, jax.lax.rng_uniform(0.0, 1.0, (64,)), jax.lax.rng_uniform(0.0, 1.0, (64,))

    with caplog.at_level(logging.WARNING, logger="alpa_pass"):
        g = _graph(f, jnp.ones((4,)))
    assert g.fallbacks.get("stablehlo.rng") == 2 and "stablehlo.while" not in g.fallbacks
    rng = _nodes(g, "stablehlo.rng")
    assert len(rng) == 2 and all(g.kind[v] == OpKind.OPAQUE for v in rng)
    msgs = [r.getMessage() for r in caplog.records if "stablehlo.rng" in r.getMessage()]
    assert len(msgs) == 1 and "computed replicated" in msgs[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="alpa_pass"):
        g = _graph(lambda x: x * jax.lax.rng_uniform(0.0, 1.0, (4,)), jnp.ones((4,)))
    assert g.fallbacks == {"stablehlo.rng": 1} and caplog.records == []


def test_rbg_random_bits_are_replicated_by_rule_and_key_casts_are_quiet(caplog):
    """jax's ``rbg`` / ``unsafe_rbg`` generators (MaxText's choice) draw with
    ``stablehlo.rng_bit_generator``: XLA generates the whole bits on every device and slices, so
    they are a GENERATOR (replicated, split by their readers for free), not a warned fallback;
    the 16-byte key reinterpretations (``bitcast_convert`` u32[2,2] <-> u64[2]) are counted only."""
    key = jax.random.key(0, impl="unsafe_rbg")
    with caplog.at_level(logging.WARNING, logger="alpa_pass"):
        g = _graph(lambda k, x: x * jax.random.bernoulli(k, 0.9, x.shape), key, jnp.ones((512, 64)))
    (rng,) = [v for v in _nodes(g, "stablehlo.rng_bit_generator") if g.shape(v) == (512, 64)]
    assert g.kind[rng] == OpKind.GENERATOR
    assert set(g.fallbacks) == {"stablehlo.bitcast_convert"} and caplog.records == []


def test_while_regions_are_extracted_with_tied_carries():
    """Both fori_loops' bodies are walked: the loop's multiply/add are nodes; per carried slot a
    carry node reads the init and ties carry == yield == result."""
    g = _graph(lambda x: jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0, x), jnp.ones((4,)))
    assert g.fallbacks == {}
    carries = [v for v in range(g.num_nodes) if g.locators[v].op_index == -3]
    results = [v for v in _nodes(g, "stablehlo.while") if g.locators[v].op_index >= 0]
    assert len(carries) == len(results) >= 2
    (mul,) = _nodes(g, "stablehlo.multiply")  # in the closed_call the body calls
    assert g.kind[mul] == OpKind.ELEMENTWISE and carries[1] in g.operands(mul)
    (add,) = _nodes(g, "stablehlo.add")  # the loop counter, in region 1 (the body) of op 1
    assert g.locators[add].nest == ((1, 1),)
    tied = {frozenset(t) for t in g.ties}
    for c, r in zip(carries, results):
        (y,) = g.operands(r)
        assert frozenset((c, y)) in tied and frozenset((r, y)) in tied


def test_dynamic_shapes_raise_extract_error():
    text = """
    func.func @main(%a: tensor<4xf32>, %n: tensor<i32>) -> tensor<?xf32> {
      %0 = stablehlo.reshape %n : (tensor<i32>) -> tensor<1xi32>
      %1 = stablehlo.dynamic_iota %0, dim = 0 : (tensor<1xi32>) -> tensor<?xf32>
      return %1 : tensor<?xf32>
    }"""
    with pytest.raises(ExtractError, match=r"stablehlo.dynamic_iota.*static shapes"):
        extract_graph(parse_module(text))


def test_missing_entry_and_unparsable_text():
    m = parse_module("func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {"
                     " return %a : tensor<2xf32> }")
    with pytest.raises(ExtractError, match="no function @main"):
        extract_graph(m)
    assert extract_graph(m, entry="f").num_nodes == 2
    with pytest.raises(ExtractError, match="could not parse"):
        parse_module("func.func @f(")


@pytest.mark.parametrize("text, dims, kind", [
    ("%r = stablehlo.bitcast_convert %a : (tensor<4x2xf32>) -> tensor<4x2xi32>", (4, 2),
     OpKind.ELEMENTWISE),
    ("%r = stablehlo.bitcast_convert %a : (tensor<4x2xf32>) -> tensor<4x2x4xi8>", (4, 2, 4),
     OpKind.OPAQUE),
    ("%r = stablehlo.broadcast %a, sizes = [3] : (tensor<4x2xf32>) -> tensor<3x4x2xf32>",
     (3, 4, 2), OpKind.BROADCAST),
    ("%r = stablehlo.dot %a, %a2 : (tensor<4x2xf32>, tensor<2xf32>) -> tensor<4xf32>", (4,),
     OpKind.DOT),
])
def test_hand_written_ops(text, dims, kind):
    out_type = "tensor<" + "x".join(map(str, dims)) + ("xi32>" if "i32>" in text.split("->")[1]
                                                         else "xi8>" if "i8>" in text else "xf32>")
    m = parse_module(f"""func.func @main(%a: tensor<4x2xf32>, %a2: tensor<2xf32>) -> {out_type} {{
      {text}
      return %r : {out_type}
    }}""")
    g = extract_graph(m)
    v = g.num_nodes - 2
    assert g.kind[v] == kind and g.shape(v) == dims
    if kind == OpKind.BROADCAST:
        assert g.node_attrs(v) == [1, 2]
    if kind == OpKind.DOT:
        assert g.node_attrs(v) == [0, 1, 1, 0]
    assert np.all(g.operand_ids < g.num_nodes)


def test_a_remat_offload_to_host_memory_keeps_the_values_layout():
    """``save_and_offload_only_these_names`` (MaxText's offload remat): lowered for GPUs, the saved
    activation goes to pinned host memory and back by ``annotate_device_placement`` custom calls,
    each following its operand (a fallback replicated the [512, 1024] activation)."""
    from jax.ad_checkpoint import checkpoint_name

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["mid"],
        offload_src="device", offload_dst="pinned_host")

    def loss(w1, w2, x):
        layer = jax.checkpoint(lambda x: checkpoint_name(jnp.tanh(x @ w1), "mid") @ w2,
                               policy=policy)
        return jnp.mean(layer(x) ** 2)

    args = (jnp.ones((64, 1024)), jnp.ones((1024, 64)), jnp.ones((512, 64)))
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("@annotate_device_placement") == 2 and "pinned_host" in text
    g = extract_graph(parse_module(text))
    moves = _nodes(g, "stablehlo.custom_call")
    assert len(moves) == 2 and g.fallbacks == {}
    for v in moves:
        assert g.kind[v] == OpKind.ELEMENTWISE and g.shape(v) == (512, 1024)
        assert g.shape(g.operands(v)[0]) == (512, 1024)
