import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import alpa_pass as ap
from alpa_pass.trace.lower import output_ties


def test_logical_mesh_defaults_and_specs():
    mesh = ap.LogicalMesh(shape=(2, 4))
    assert mesh.alpha == (1.0, 1.0) and mesh.beta == (1.0, 1.0)
    assert mesh.axis_names == ("x", "y") and mesh.num_devices == 8
    assert mesh.spec_to_partition_spec([1, -1], 2) == P(None, "x")
    assert mesh.spec_to_partition_spec([0, 0], 3) == P(("x", "y"), None, None)
    assert mesh.spec_to_partition_spec([-1, -1], 0) == P()
    jm = mesh.jax_mesh()
    assert jm.shape == {"x": 2, "y": 4} and list(jm.devices.flat) == jax.devices()[:8]


@pytest.mark.parametrize("kwargs, match", [
    (dict(shape=(2, 4), alpha=(1.0,)), "alpha has 1 entries but the mesh has 2 axes"),
    (dict(shape=(2, 4), beta=(1.0, -1.0)), "finite and >= 0"),
    (dict(shape=(0, 4)), "positive ints"),
    (dict(shape=(2, 2), axis_names=("x", "x")), "distinct"),
])
def test_logical_mesh_rejects_bad_input(kwargs, match):
    with pytest.raises(ap.MeshError, match=match):
        ap.LogicalMesh(**kwargs)


def test_mesh_larger_than_devices_is_a_clear_error():
    with pytest.raises(ap.MeshError, match="needs 16 devices but only 8"):
        ap.LogicalMesh(shape=(4, 4)).jax_mesh()
    with pytest.raises(ap.MeshError, match="4 devices were given"):
        ap.LogicalMesh(shape=(2, 4), devices=jax.devices()[:4]).jax_mesh()


def test_options_validate():
    with pytest.raises(ValueError, match="emit"):
        ap.AutoShardingOption(emit="some")
    with pytest.raises(TypeError, match="LogicalMesh"):
        ap.ShardParallel(mesh=(2, 4))
    assert ap.ShardParallel().resolved_mesh().shape == (1, 8)


def test_output_ties_match_state_leaves():
    state = ({"w": jnp.ones((4, 4)), "b": jnp.ones(4)}, (jnp.zeros(()), jnp.ones((4, 4))))
    batch = jnp.ones((2, 4))
    ties = output_ties((state, batch), (state, jnp.zeros(())))
    n = len(jax.tree.leaves(state))
    assert ties == [(k, k) for k in range(n)]
    # an output that is not shaped like any argument ties nothing
    assert output_ties((batch,), ({"a": batch, "b": batch},)) == []
    # same structure but another shape: no tie
    assert output_ties((batch,), (jnp.ones((4, 2)),)) == []


def test_output_ties_compare_dtypes_as_jax_traces_them():
    # numpy float64 parameters (rng.standard_normal(...) / np.sqrt(n)) are float32 arrays in a
    # step without x64, so the step's float32 new values are theirs (the presets find parameters
    # by these ties); a real dtype change still ties nothing
    import numpy as np

    params = {"w": np.ones((4, 4)), "b": np.ones(4, np.float32)}
    assert output_ties((params,), ({"w": jnp.ones((4, 4)), "b": jnp.ones(4)},)) == [(0, 0), (1, 1)]
    assert output_ties((params,), ({"w": jnp.ones((4, 4), jnp.bfloat16), "b": jnp.ones(4)},)) == []
