"""emit.partial_sums: which dots and sums a reduce-scatter may finish, on hand-written plans over a
2x4 mesh ("x" = 2 devices, "y" = 4)."""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

import alpa_pass as ap
from alpa_pass.emit.partial_sums import partial_sums
from alpa_pass.extract.graph import OpKind
from alpa_pass.extract.stablehlo import extract_graph

MESH = ap.LogicalMesh(shape=(2, 4))
NONE = [-1, -1]


def _graph(fn, *shapes):
    lowered = jax.jit(fn).lower(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes))
    return extract_graph(lowered.compiler_ir("stablehlo"))


def _node(graph, kind: OpKind) -> int:
    (v,) = np.nonzero(graph.kind == kind)[0]
    return int(v)


def _plan(graph, v: int, node_spec, operand_specs):
    """Everything replicated except node ``v`` (its result and operand layouts as given)."""
    node_specs = [list(NONE) for _ in range(graph.num_nodes)]
    operands = [[list(NONE) for _ in graph.operands(u)] for u in range(graph.num_nodes)]
    node_specs[v], operands[v] = list(node_spec), [list(s) for s in operand_specs]
    return types.SimpleNamespace(node_specs=node_specs, operand_specs=operands, axis_order=[])


def _weight_grad(a, g):  # [batch, in], [batch, out] -> [in, out]: contracts the batch
    return jnp.einsum("bi,bo->io", a, g)


def test_mixed_weight_gradient_is_scattered_over_the_data_axis():
    # Batch split on "y" (partial sums over y), the out dim split on "x" (local on x).
    graph = _graph(_weight_grad, (8, 4), (8, 6))
    v = _node(graph, OpKind.DOT)
    found = partial_sums(graph, _plan(graph, v, [1, -1], [[-1, 0], [1, 0]]), MESH)[v]
    assert found.axes == (1,)
    assert found.dim == 0  # dim 1 holds 6 / 2 = 3 a device, which 4 does not divide
    assert found.operand_dims == ((("y",), ()), (("y",), ("x",)))
    assert found.local_dims == ((), ("x",))
    assert found.out_dims == (("y",), ("x",))


def test_scatter_dim_prefers_mesh_order_then_size():
    # [16, 32] gradient: dim 1 split on "x" (axis 0) holds 16 a device; scattering it over "y"
    # gives ("x", "y"), in mesh order, and it ties dim 0 (16) on size: the earlier dim wins.
    graph = _graph(_weight_grad, (8, 16), (8, 32))
    v = _node(graph, OpKind.DOT)
    found = partial_sums(graph, _plan(graph, v, [1, -1], [[-1, 0], [1, 0]]), MESH)[v]
    assert found.dim == 0
    # Split on "y" (axis 1) and partial over "x" (axis 0): ("y", "x") would leave mesh order.
    found = partial_sums(graph, _plan(graph, v, [-1, 1], [[0, -1], [0, 1]]), MESH)[v]
    assert found.axes == (0,) and found.dim == 0 and found.out_dims == (("x",), ("y",))


def test_not_local_or_not_partial_is_left_to_xla():
    graph = _graph(_weight_grad, (8, 4), (8, 8))
    v = _node(graph, OpKind.DOT)
    cases = {
        "result split on x with no operand split on x": ([1, -1], [[-1, 0], [-1, 0]]),
        "contracting dim split on y on one operand only": ([-1, -1], [[-1, 0], [-1, -1]]),
        "partial over y but the result is split on y": ([-1, 1], [[-1, 0], [-1, 0]]),
        "no partial sums at all": ([1, -1], [[-1, -1], [1, -1]]),
        "free dim split on x but the result split elsewhere": ([0, -1], [[-1, 0], [1, 0]]),
    }
    for why, (node_spec, operand_specs) in cases.items():
        assert v not in partial_sums(graph, _plan(graph, v, node_spec, operand_specs), MESH), why


def test_batch_dim_must_be_split_on_both_operands():
    graph = _graph(lambda a, b: jnp.einsum("bki,bkj->bij", a, b), (4, 8, 4), (4, 8, 4))
    v = _node(graph, OpKind.DOT)
    ok = _plan(graph, v, [0, -1], [[0, 1], [0, 1]])
    assert partial_sums(graph, ok, MESH)[v].out_dims == (("x",), ("y",), ())
    one_sided = _plan(graph, v, [0, -1], [[0, 1], [-1, 1]])
    assert v not in partial_sums(graph, one_sided, MESH)


def test_only_values_that_reach_outputs_elementwise():
    # A gradient-like sum returned (through a scale) qualifies; the same sum feeding a
    # further reduction (an activation statistic) does not.
    bias_grad = _graph(lambda g: 0.5 * g.sum(axis=0), (8, 16))
    v = _node(bias_grad, OpKind.REDUCE)
    found = partial_sums(bias_grad, _plan(bias_grad, v, [-1, -1], [[-1, 0], NONE]), MESH)[v]
    assert found.axes == (1,) and found.out_dims == (("y",),)
    statistic = _graph(lambda g: jnp.max(jnp.exp(g.sum(axis=0))), (8, 16))
    v = int(np.nonzero(statistic.kind == OpKind.REDUCE)[0][0])
    assert v not in partial_sums(statistic, _plan(statistic, v, [-1, -1], [[-1, 0], NONE]), MESH)


def test_scalar_sum_stays_all_reduced():
    graph = _graph(lambda g: g.sum(), (8, 16))
    v = _node(graph, OpKind.REDUCE)
    assert v not in partial_sums(graph, _plan(graph, v, [-1, -1], [[-1, 0], NONE]), MESH)


def test_embedding_gradient_scatter_add():
    # zeros[64, 32].at[tokens].add(g): updates [8, 16, 32] and indices [8, 16, 1] split on the batch
    # over "y" (partial sums), the hidden dim split on "x" on the updates, the zeros and the result.
    def grad(g):
        tokens = jnp.arange(8 * 16, dtype=jnp.int32).reshape(8, 16) % 64
        return jnp.zeros((64, 32), jnp.float32).at[tokens].add(g)

    graph = _graph(grad, (8, 16, 32))
    v = _node(graph, OpKind.SCATTER)
    assert [len(graph.shape(u)) for u in graph.operands(v)] == [2, 3, 3]
    local = _plan(graph, v, [1, -1], [[1, -1], [-1, 0], [2, 0]])
    found = partial_sums(graph, local, MESH)[v]
    assert found.axes == (1,) and found.out_dims == (("y",), ("x",))
    not_local = _plan(graph, v, [-1, -1], [[-1, -1], [-1, 0], [2, 0]])  # hidden split on updates only
    assert v not in partial_sums(graph, not_local, MESH)
    indices_whole = _plan(graph, v, [-1, -1], [[-1, -1], [-1, -1], [-1, 0]])
    assert v not in partial_sums(graph, indices_whole, MESH)
