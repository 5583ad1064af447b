"""plugin.planner.arrival_axis_order: an argument that keeps the layout it arrives in (an eval
step's parameters) keeps the order in which its layout lists the axes of a dim split over several
mesh axes; a core spec says only which axes split a dim (issue #15, following under the plugin)."""
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import alpa_pass as ap
from alpa_pass.plugin.planner import arrival_axis_order

MESH = ap.LogicalMesh(shape=(2, 2, 2))  # axes x, y, z


def _order(*specs):
    jmesh = MESH.jax_mesh()
    return arrival_axis_order([NamedSharding(jmesh, s) for s in specs], MESH)


def test_a_multi_axis_dim_orders_its_axes_the_others_keep_mesh_order():
    assert _order(P(("z", "y")), P(None, "x")) == ("x", "z", "y")
    assert _order(P(("y", "z")), P(None, "x")) == ("x", "y", "z")
    assert _order(P(("z", "x")), P(None, ("y", "x"))) == ("y", "z", "x")


def test_no_multi_axis_dim_or_disagreeing_orders_impose_none():
    assert _order(P("x"), P(None, "y"), P()) == ()
    assert _order(P(("z", "y")), P(("y", "z"))) == ()


def test_a_user_layout_reads_as_the_equal_layout_on_our_mesh_or_none():
    """plugin.planner.equal_spec: an array committed to a sharding of the user's (another mesh
    object, other axis names) is pinned as the layout on our mesh that puts the same blocks on the
    same devices; none exists for another device order or a split our axes cannot make."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from alpa_pass.plugin.planner import equal_spec

    devices = np.array(jax.devices())
    ours = ap.LogicalMesh(shape=(2, 4))
    user = Mesh(devices.reshape(2, 4), ("data", "model"))
    flat = Mesh(devices, ("batch",))
    assert equal_spec(NamedSharding(user, P("data")), 2, ours) == [0, -1]
    assert equal_spec(NamedSharding(user, P(None, "model")), 2, ours) == [-1, 1]
    assert equal_spec(NamedSharding(user, P("model", "data")), 3, ours) == [1, 0]
    assert equal_spec(NamedSharding(user, P()), 1, ours) == [-1, -1]
    assert equal_spec(NamedSharding(flat, P("batch")), 2, ours) == [0, 0]  # (x major, as x-then-y)
    assert equal_spec(NamedSharding(flat, P(None, "batch")), 2, ap.LogicalMesh(shape=(1, 8))) == [-1, 1]
    # 4 blocks of 2 devices each: the 2x4 mesh splits by 2 or 4 (along y) or 8, never 4 along x*y/2
    assert equal_spec(NamedSharding(Mesh(devices.reshape(4, 2), ("a", "b")), P("a")), 1, ours) is None
    assert equal_spec(NamedSharding(Mesh(devices[::-1], ("batch",)), P("batch")), 1, ours) is None


def test_a_fed_back_leaf_ties_to_the_argument_it_is_computed_from_not_to_the_first_of_its_shape():
    """plugin.planner._node_ties: the plugin sees flat leaves, so it pairs each output with an
    argument of the same shape and dtype. A batch ``(B, D)`` in front of a weight ``(B, D)`` (an
    Equinox step donating all but the model, whose leaves come last) took the new weight's tie; the
    weight, fed back, then read as an argument that keeps an arriving layout: a second plan, worse
    (objective 322563 -> 494595 on 1x8, s41). The new weight is computed elementwise from the
    weight: that pairs them; a new PRNG key (no elementwise path) still pairs by shape."""
    import jax
    import jax.numpy as jnp

    from alpa_pass.extract.stablehlo import extract_graph
    from alpa_pass.plugin.planner import _node_ties

    def step(count, x, key, w, m):
        g = jax.grad(lambda w: jnp.tanh(x.T @ w).sum())(w) + jax.random.normal(key, w.shape)
        m = 0.9 * m + 0.1 * g
        return w - 0.1 * m, jax.random.split(key)[0], m, count + 1, (x * 2).sum()

    args = (jnp.int32(0), jnp.ones((64, 16)), jax.random.PRNGKey(0), jnp.ones((64, 16)), jnp.ones((64, 16)))
    closed = jax.make_jaxpr(step)(*args)
    graph = extract_graph(jax.jit(step).lower(*args).compiler_ir("stablehlo"))
    params, outs = graph.param_nodes(), graph.output_nodes()
    ties = _node_ties(graph, closed.in_avals, closed.out_avals)
    by_output = {outs.index(o): params.index(p) for o, p in ties}
    # new weight -> weight (3), new key -> key (2), new momentum -> momentum (4), count -> count (0)
    assert by_output == {0: 3, 1: 2, 2: 4, 3: 0}
