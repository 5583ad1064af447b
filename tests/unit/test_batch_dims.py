"""extract.batch_dims (the batch dim of each value, followed from the batch arguments' dim 0) and
the core's partial pins (an entry -2 leaves its mesh axis free), which Alpa's
``force_batch_dim_to_mesh_dim`` is built from."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass.driver.planning import solve_graph
from alpa_pass.extract.batch_dims import batch_dims
from alpa_pass.extract.graph import OpKind
from alpa_pass.extract.stablehlo import extract_graph


def _graph(f, *shapes):
    avals = [jax.ShapeDtypeStruct(s, np.float32) for s in shapes]
    return extract_graph(jax.jit(f).lower(*avals).compiler_ir("stablehlo"))


def _by_op(graph, dims, op):
    return [dims.get(v) for v in range(graph.num_nodes) if graph.op_names[v] == op]


def test_the_batch_dim_follows_dots_transposes_reshapes_and_reduces():
    def f(x, w):  # x: [batch 8, seq 4, 16]
        h = jnp.einsum("bsd,de->bse", x, w)            # batch stays dim 0
        t = jnp.transpose(h, (1, 2, 0))                # -> dim 2
        r = t.reshape(4 * 32, 8)                       # [seq*e, batch]: dim 1 (same size, same prefix)
        m = r.reshape(4, 32 * 8)                       # batch merged with e: none
        s = h.sum(axis=1)                              # seq reduced: dim 0
        g = x.sum(axis=0)                              # batch reduced: none
        return t.sum() + m.sum() + s.sum() + g.sum()

    graph = _graph(f, (8, 4, 16), (16, 32))
    x = graph.param_nodes()[0]
    dims = batch_dims(graph, {x: 0})
    assert _by_op(graph, dims, "stablehlo.dot_general") == [0]
    assert _by_op(graph, dims, "stablehlo.transpose") == [2]
    assert _by_op(graph, dims, "stablehlo.reshape") == [1, None]
    reduces = {graph.shape(v): dims.get(v) for v in range(graph.num_nodes) if graph.op_names[v] == "stablehlo.reduce"}
    assert reduces[(8, 32)] == 0 and reduces[(4, 16)] is None
    assert graph.param_nodes()[1] not in dims  # the weight has no batch dim


def test_a_dots_contracted_batch_dim_ends_there_and_rhs_free_dims_come_after_lhs_ones():
    def f(x, y):  # x: [batch 8, 16]; y: [batch 8, 32]
        return (x.T @ y).sum() + (y.T @ x.T.T).sum() + (jnp.ones((4, 16)) @ x.T).sum()

    graph = _graph(f, (8, 16), (8, 32))
    dims = batch_dims(graph, {graph.param_nodes()[0]: 0, graph.param_nodes()[1]: 0})
    shapes = {graph.shape(v): dims.get(v) for v in range(graph.num_nodes) if graph.kind[v] == OpKind.DOT}
    assert shapes[(16, 32)] is None and shapes[(32, 16)] is None  # batch contracted (weight-gradient style)
    assert shapes[(4, 8)] == 1  # batch is the rhs's free dim, after the lhs's


def test_a_partial_pin_fixes_one_axis_and_leaves_the_other_free():
    x = jax.ShapeDtypeStruct((8, 16), np.float32)
    graph = extract_graph(jax.jit(lambda a: (a * 2.0).sum()).lower(x).compiler_ir("stablehlo"))
    mesh = ap.LogicalMesh(shape=(2, 4))
    param = graph.param_nodes()[0]
    for free in (0, 1):
        plan = solve_graph(graph, mesh, ap.AutoShardingOption(), pins=[(param, [free, -2])])
        assert list(plan.node_specs[param])[0] == free
    with pytest.raises(ValueError, match=rf"cannot pin node {param} .* to spec R"):
        solve_graph(graph, mesh, ap.AutoShardingOption(), pins=[(param, [-2, 5])])
