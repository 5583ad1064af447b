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
