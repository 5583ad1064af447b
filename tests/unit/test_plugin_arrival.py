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
