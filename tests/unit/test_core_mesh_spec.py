"""alpa_pass._core: Mesh collectives, sharding specs, resharding cost and Graph validation."""
import itertools
import math

import numpy as np
import pytest

from alpa_pass import _core

ALPHA, BETA = [1.0, 2.0], [0.5, 0.1]


@pytest.fixture
def mesh():
    return _core.Mesh(shape=[2, 4], alpha=ALPHA, beta=BETA)


def test_mesh_properties(mesh):
    assert mesh.shape == [2, 4] and mesh.alpha == ALPHA and mesh.beta == BETA
    assert mesh.ndim == 2 and mesh.num_devices == 8


def test_collective_formulas(mesh):
    b = 1000.0
    # axis 0: n = 2, alpha 1, beta 0.5
    assert mesh.all_reduce(b, 0) == pytest.approx(1 + 0.5 * 2 * (1 / 2) * b)    # 501
    assert mesh.all_gather(b, 0) == pytest.approx(1 + 0.5 * (1 / 2) * b)        # 251
    assert mesh.reduce_scatter(b, 0) == pytest.approx(1 + 0.5 * (1 / 2) * b)
    assert mesh.all_to_all(b, 0) == pytest.approx(1 + 0.5 * (1 / 4) * b * 1)   # 126
    # axis 1: n = 4, alpha 2, beta 0.1
    assert mesh.all_reduce(b, 1) == pytest.approx(2 + 0.1 * 2 * (3 / 4) * b)    # 152
    assert mesh.all_gather(b, 1) == pytest.approx(2 + 0.1 * (3 / 4) * b)        # 77
    assert mesh.reduce_scatter(b, 1) == pytest.approx(77.0)
    assert mesh.all_to_all(b, 1) == pytest.approx(2 + 0.1 * (3 / 16) * b * 2)  # 39.5


def test_collectives_over_several_axes_are_one_flattened_collective(mesh):
    """XLA emits a collective over two axes as one collective over their devices: n = 8, the
    larger alpha (2) and beta (0.5). Not the sum of one full-size collective per axis."""
    b = 1000.0
    assert mesh.all_reduce(b, [0, 1]) == pytest.approx(2 + 0.5 * 2 * (7 / 8) * b)
    assert mesh.all_reduce(b, [1, 0]) == mesh.all_reduce(b, [0, 1])
    assert mesh.all_gather(b, [0, 1]) == pytest.approx(2 + 0.5 * (7 / 8) * b)
    assert mesh.reduce_scatter(b, [0, 1]) == mesh.all_gather(b, [0, 1])
    assert mesh.all_to_all(b, [0, 1]) == pytest.approx(2 + 0.5 * (7 / 64) * b * 4)
    for axis in (0, 1):  # one axis: the single-axis formula
        assert mesh.all_reduce(b, [axis]) == mesh.all_reduce(b, axis)
        assert mesh.all_to_all(b, [axis]) == mesh.all_to_all(b, axis)
    square = _core.Mesh(shape=[8, 8], alpha=[0.0, 0.0], beta=[1.0, 1.0])
    assert square.all_reduce(b, [0, 1]) == pytest.approx(2 * (63 / 64) * b)  # not 2 x 2 (7/8) b
    assert mesh.all_reduce(b, []) == 0.0
    one = _core.Mesh(shape=[1, 4], alpha=[5.0, 1.0], beta=[5.0, 0.1])
    assert one.all_reduce(b, [0, 1]) == one.all_reduce(b, 1)  # an axis of one device adds nothing
    with pytest.raises(ValueError, match="axis 0 given twice"):
        mesh.all_reduce(b, [0, 0])
    with pytest.raises(ValueError, match="axis 2 out of range"):
        mesh.all_gather(b, [0, 2])


def test_a_combined_all_reduce_pays_its_share_of_alpha(mesh):
    """XLA combines independent all-reduces into one of up to ``bucket_bytes``: each pays alpha
    times its share of the bucket (at most one alpha) and its whole bandwidth term."""
    b = 1000.0
    assert mesh.combined_all_reduce(b, [1], 4000.0) == pytest.approx(2 * 0.25 + 0.1 * 2 * (3 / 4) * b)
    assert mesh.combined_all_reduce(b, [0, 1], 8000.0) == pytest.approx(2 / 8 + 0.5 * 2 * (7 / 8) * b)
    for bucket in (b, 10.0, 0.0, -1.0):  # a buffer as large as the bucket, or no combining
        assert mesh.combined_all_reduce(b, [1], bucket) == mesh.all_reduce(b, 1)
    assert mesh.combined_all_reduce(b, [], 4000.0) == 0.0


def test_measured_axis_groups_replace_the_largest_per_axis_costs():
    """``axes_costs``: (axes, alpha, beta) of a collective over exactly those axes (a profile's
    measured flattened group); other sets and single axes keep the per-axis rule."""
    b = 1000.0
    mesh = _core.Mesh(shape=[2, 1, 4], alpha=[1.0, 7.0, 2.0], beta=[0.5, 9.0, 0.1],
                      axes_costs=[([0, 2], 0.25, 0.05)])
    assert mesh.axes_costs == [([0, 2], 0.25, 0.05)]
    assert mesh.all_reduce(b, [0, 2]) == pytest.approx(0.25 + 0.05 * 2 * (7 / 8) * b)
    assert mesh.all_reduce(b, [2, 1, 0]) == mesh.all_reduce(b, [0, 2])  # the axis of one device is skipped
    assert mesh.all_to_all(b, [0, 2]) == pytest.approx(0.25 + 0.05 * (7 / 64) * b * 4)
    assert mesh.all_gather(b, [2]) == pytest.approx(2 + 0.1 * (3 / 4) * b)
    for bad, match in (([([0], 1.0, 1.0)], "needs two or more"), ([([2, 0], 1.0, 1.0)], "ascending"),
                       ([([0, 3], 1.0, 1.0)], "ascending and < 3"), ([([0, 2], -1.0, 1.0)], "finite and >= 0"),
                       ([([0, 2], 1.0, 1.0), ([0, 2], 2.0, 1.0)], "given twice")):
        with pytest.raises(ValueError, match=match):
            _core.Mesh(shape=[2, 1, 4], alpha=[1.0] * 3, beta=[1.0] * 3, axes_costs=bad)


def test_forbidden_collectives_cost_alpas_infinity(mesh):
    # Alpa's allow_all_gather / allow_all_to_all = False: 1e13 per collective on an axis of
    # size > 1, in reshards too; the other collectives and size-1 axes keep their price
    mesh.all_gather_forbidden = True
    assert mesh.all_gather(8.0, 1) == mesh.all_gather(8.0, [0, 1]) == 1e13
    assert mesh.all_to_all(1000.0, 1) == pytest.approx(39.5) and mesh.all_reduce(1000.0, 0) == pytest.approx(501)
    assert _core.reshard_cost(mesh, [8, 8], 4.0, [0, -1], [-1, -1]) >= 1e13   # S0R -> RR gathers on 0
    assert _core.reshard_cost(mesh, [8, 8], 4.0, [-1, -1], [0, 1]) == 0.0     # slicing is free
    mesh.all_to_all_forbidden = True
    assert mesh.all_to_all(1000.0, 0) == 1e13
    assert _core.reshard_cost(mesh, [8, 8], 4.0, [0, -1], [1, -1]) >= 1e13    # S0R -> S1R exchanges on 0
    one = _core.Mesh(shape=[1, 8], alpha=[1.0, 1.0], beta=[1.0, 1.0])
    one.all_gather_forbidden = True
    assert one.all_gather(100.0, 0) == 0.0


def test_axis_of_one_device_is_free():
    m = _core.Mesh(shape=[1, 8], alpha=[5.0, 1.0], beta=[5.0, 1.0])
    for fn in (m.all_reduce, m.all_gather, m.reduce_scatter, m.all_to_all):
        assert fn(1e6, 0) == 0.0
    assert m.all_gather(800.0, 1) == pytest.approx(1 + 700.0)


@pytest.mark.parametrize("shape,alpha,beta,match", [
    ([2, 4], [1.0], [1.0, 1.0], "one alpha and one beta per axis"),
    ([2, 0], [1.0, 1.0], [1.0, 1.0], "axis 1 has size 0"),
    ([2, 4], [-1.0, 1.0], [1.0, 1.0], r"alpha\[0\]"),
    ([2, 4], [1.0, 1.0], [1.0, math.nan], r"beta\[1\]"),
])
def test_mesh_validation(shape, alpha, beta, match):
    with pytest.raises(ValueError, match=match):
        _core.Mesh(shape=shape, alpha=alpha, beta=beta)


def test_collective_axis_out_of_range(mesh):
    with pytest.raises(ValueError, match="axis 2 out of range"):
        mesh.all_gather(10.0, 2)


def test_enumerate_specs_by_hand(mesh):
    # (8, 6) on (2, 4): axis 0 in {R, 0, 1} (8 % 2, 6 % 2); axis 1 in {R, 0} (8 % 4; 6 % 4 != 0);
    # combined: dim 0 by both axes 8 % 8 ok; dim 1 by both 6 % 8 no. -> 3 * 2 = 6 specs.
    specs = _core.enumerate_specs([8, 6], mesh)
    assert specs == [[-1, -1], [-1, 0], [0, -1], [0, 0], [1, -1], [1, 0]]
    assert _core.enumerate_specs([8, 6], mesh) == specs  # deterministic


def test_enumerate_specs_divisibility():
    cube = _core.Mesh(shape=[2, 2, 2], alpha=[1.0] * 3, beta=[1.0] * 3)
    specs = _core.enumerate_specs([4, 4], cube)
    # 15 two-block specs of a rank-2 tensor on 3 axes, minus [0,0,0] and [1,1,1] (8 does not divide 4).
    assert len(specs) == 13 and specs[0] == [-1, -1, -1]
    for spec in specs:
        for d, size in enumerate([4, 4]):
            assert size % math.prod(2 for a in spec if a == d) == 0
    assert len({tuple(s) for s in specs}) == 13


def _mesh(shape):
    return _core.Mesh(shape=list(shape), alpha=[1.0] * len(shape), beta=[1.0] * len(shape))


def _every_spec(shape, mesh_shape, two_block: bool):
    """Brute force in enumerate_specs' order: every fitting spec (only two-block ones if asked)."""
    free = [a for a, n in enumerate(mesh_shape) if n > 1]
    out = []
    for choice in itertools.product(range(-1, len(shape)), repeat=len(free)):
        changes = sum(choice[k] != choice[k - 1] for k in range(1, len(choice)))
        if two_block and changes > 1:
            continue
        spec = [-1] * len(mesh_shape)
        for a, d in zip(free, choice):
            spec[a] = d
        if all(shape[d] % math.prod(mesh_shape[a] for a in free if spec[a] == d) == 0
               for d in range(len(shape))):
            out.append(spec)
    return out


@pytest.mark.parametrize("mesh_shape", [(2, 4), (1, 8), (8,), (4, 1, 2), (2, 2), (1, 1, 8)])
@pytest.mark.parametrize("shape", [[], [8], [8, 6], [8, 4, 16], [16, 8, 4, 2]])
def test_meshes_with_two_split_axes_keep_every_spec(mesh_shape, shape):
    specs = _core.enumerate_specs(shape, _mesh(mesh_shape))
    assert specs == _every_spec(shape, mesh_shape, two_block=False)


@pytest.mark.parametrize("mesh_shape,shape,count", [
    ((2, 2, 2), [8], 6), ((2, 2, 2), [8, 8], 15), ((2, 2, 2), [8, 8, 8], 28),
    ((2, 2, 2), [8, 8, 8, 8], 45), ((2, 1, 2, 2), [8, 8, 8], 28),
    ((2, 2, 2, 2), [16, 16], 21), ((2, 2, 2, 2), [16, 16, 16], 40),
])
def test_three_or_more_split_axes_keep_two_block_specs(mesh_shape, shape, count):
    specs = _core.enumerate_specs(shape, _mesh(mesh_shape))
    assert len(specs) == count
    assert specs == _every_spec(shape, mesh_shape, two_block=True)
    full = len(_every_spec(shape, mesh_shape, two_block=False))
    assert full == (len(shape) + 1) ** sum(n > 1 for n in mesh_shape)  # all dims divisible here


def test_two_block_specs_by_hand():
    # rank 1 on 2x2x2: 8 specs, minus [-1, 0, -1] (middle axis alone) and [0, -1, 0] (not adjacent).
    assert _core.enumerate_specs([8], _mesh((2, 2, 2))) == [
        [-1, -1, -1], [-1, -1, 0], [-1, 0, 0], [0, -1, -1], [0, 0, -1], [0, 0, 0]]
    specs = _core.enumerate_specs([8, 8, 8], _mesh((2, 2, 2)))
    assert [0, 1, 2] not in specs and [0, 0, 1] in specs and [-1, 1, 1] in specs


def test_enumerate_specs_edge_cases(mesh):
    assert _core.enumerate_specs([3, 5], mesh) == [[-1, -1]]
    assert _core.enumerate_specs([], mesh) == [[-1, -1]]
    assert _core.enumerate_specs([8], mesh) == [[-1, -1], [-1, 0], [0, -1], [0, 0]]
    one = _core.Mesh(shape=[1, 4], alpha=[1.0, 1.0], beta=[1.0, 1.0])
    assert _core.enumerate_specs([8, 8], one) == [[-1, -1], [-1, 0], [-1, 1]]


def test_reshard_same_and_slice_are_free(mesh):
    shape = [8, 8]
    assert _core.reshard_cost(mesh, shape, 4, [0, 1], [0, 1]) == 0.0
    assert _core.reshard_cost(mesh, shape, 4, [-1, -1], [0, 1]) == 0.0
    assert _core.reshard_cost(mesh, shape, 4, [0, -1], [0, 1]) == 0.0


def test_reshard_split_to_replicated_is_all_gather(mesh):
    full = 8 * 8 * 4.0
    assert _core.reshard_cost(mesh, [8, 8], 4, [0, -1], [-1, -1]) == pytest.approx(
        mesh.all_gather(full, 0))
    # Both axes gathered: one all-gather over all 8 devices, at the slower alpha and beta.
    assert _core.reshard_cost(mesh, [8, 8], 4, [0, 1], [-1, -1]) == pytest.approx(
        mesh.all_gather(full, [0, 1]))
    assert mesh.all_gather(full, [0, 1]) == pytest.approx(2 + 0.5 * (7 / 8) * full)
    # S01R -> S0R with axis 0 kept (the major one in mesh order): gather over axis 1 of the bytes
    # per device in dst.
    assert _core.reshard_cost(mesh, [8, 8], 4, [0, 0], [0, -1]) == pytest.approx(
        mesh.all_gather(full / 2, 1))


def _permuting(order):
    return _core.Mesh(shape=[2, 4], alpha=ALPHA, beta=BETA, axis_order=order)


def test_reshard_keeping_a_minor_axis_of_a_dim_also_permutes(mesh):
    """XLA tiles a dim split over several axes major to minor (the mesh's axis_order): adding or
    dropping an axis in front of the ones kept moves every tile (a collective-permute over the
    dim's axes, of the src tile when dropping, the dst tile when adding), as XLA compiles it (a
    64x64 f32 on a 2x4 CPU mesh: P('y') -> P(('x','y')) is one collective-permute of the 2,048-byte
    dst tile; P(('x','y')) -> P('y') one of the src tile, then the all-gather)."""
    full = 8 * 8 * 4.0
    permute = mesh.collective_permute(full / 8, [0, 1])
    assert permute == pytest.approx(2 + 0.5 * full / 8)  # a + b B, the slower axis' alpha, beta
    # RS1 -> S01R (axis 1 kept on dim 0, axis 0 added in front of it): a slice, then the permute.
    assert _core.reshard_cost(mesh, [8, 8], 4, [-1, 0], [0, 0]) == pytest.approx(permute)
    assert _core.reshard_cost(mesh, [8, 8], 4, [0, 0], [-1, 0]) == pytest.approx(
        permute + mesh.all_gather(full / 4, 0))
    # With axis 1 the major one, those are a slice and an all-gather, and axis 0 kept permutes.
    flipped = _permuting([1, 0])
    assert flipped.axis_order == [1, 0]
    assert _core.reshard_cost(flipped, [8, 8], 4, [-1, 0], [0, 0]) == 0.0
    assert _core.reshard_cost(flipped, [8, 8], 4, [0, 0], [-1, 0]) == pytest.approx(
        flipped.all_gather(full / 4, 0))
    assert _core.reshard_cost(flipped, [8, 8], 4, [0, -1], [0, 0]) == pytest.approx(permute)
    # An axis moved in from another dim behind a kept one: the all-to-all and the permute.
    assert _core.reshard_cost(mesh, [8, 8], 4, [1, 0], [0, 0]) == pytest.approx(
        mesh.all_to_all(full / 8, 0) + permute)
    assert _core.reshard_cost(mesh, [8, 8], 4, [0, 1], [0, 0]) == pytest.approx(mesh.all_to_all(full / 8, 1))
    # Axis 0 sliced in where axis 1 (larger) leaves the dim: XLA permutes the src tile, then
    # all-gathers; axis 1 sliced in where axis 0 (smaller) leaves: the all-gather alone.
    src_tile = mesh.collective_permute(full / 4, [0, 1])
    assert _core.reshard_cost(mesh, [8, 8], 4, [-1, 0], [0, -1]) == pytest.approx(
        src_tile + mesh.all_gather(full / 2, 1))
    assert _core.reshard_cost(mesh, [8, 8], 4, [0, -1], [-1, 0]) == pytest.approx(mesh.all_gather(full / 4, 0))
    # Axes swapping dims: the all-to-all, then a permute of the dst tile.
    assert _core.reshard_cost(mesh, [8, 8], 4, [0, 1], [1, 0]) == pytest.approx(
        mesh.all_to_all(full / 8, [0, 1]) + permute)
    # Moved to a free dim: the all-to-all alone.
    assert _core.reshard_cost(mesh, [8, 8, 8], 4, [0, 1], [2, 1]) == pytest.approx(
        mesh.all_to_all(8 * full / 8, 0))


def test_three_axis_permutes_compare_the_axes_entering_and_leaving_a_dim_together():
    """On a 2-D mesh one axis enters a dim and one leaves; on 2x2x2 several do, and XLA permutes by
    the sizes of the groups (tests/integration/test_reshard_permutes.py compiles every pair)."""
    cube = _core.Mesh(shape=[2, 2, 2], alpha=[1.0] * 3, beta=[0.5] * 3)
    full = 8 * 8 * 4.0
    # S12R -> S0R: axis 0 (2 devices) sliced in while axes 1, 2 (4) are gathered: the src tile
    # moves (a pairwise comparison, 2 < 2, saw none).
    assert _core.reshard_cost(cube, [8, 8], 4, [-1, 0, 0], [0, -1, -1]) == pytest.approx(
        cube.collective_permute(full / 4, [0, 1, 2]) + cube.all_gather(full / 2, [1, 2]))
    # S01S2 -> RS01: axes 0, 1 (4 devices) brought into dim 1 while axis 2 (2) leaves it: XLA
    # gathers z, then exchanges the whole dim, no permute (pairwise, 2 <= 2 charged one).
    assert _core.reshard_cost(cube, [8, 8], 4, [0, 0, 1], [1, 1, -1]) == pytest.approx(
        cube.all_gather(full / 4, 2) + cube.all_to_all(full / 4, [0, 1]))



@pytest.mark.parametrize("order", [[0], [0, 0], [1, 2], [0, 1, 2]])
def test_mesh_rejects_an_axis_order_that_is_no_permutation(order):
    with pytest.raises(ValueError, match="axis_order must be a permutation"):
        _permuting(order)


def test_reshard_split_to_other_split_is_all_to_all(mesh):
    full = 8 * 8 * 4.0
    # S0 on axis 1 -> S1 on axis 1: all-to-all over axis 1 of the per-device bytes (full / 4).
    cost = _core.reshard_cost(mesh, [8, 8], 4, [-1, 0], [-1, 1])
    assert cost == pytest.approx(mesh.all_to_all(full / 4, 1))
    assert cost == pytest.approx(2 + 0.1 * (3 / 16) * 64 * 2)


def test_reshard_rejects_bad_specs(mesh):
    with pytest.raises(ValueError, match="source spec has 1 entries"):
        _core.reshard_cost(mesh, [8, 8], 4, [0], [-1, -1])
    with pytest.raises(ValueError, match="dim 2 of a rank-2"):
        _core.reshard_cost(mesh, [8, 8], 4, [-1, -1], [2, -1])


@pytest.mark.parametrize("spec,rank,text", [
    ([1, -1], 2, "RS0"), ([0, 0], 2, "S01R"), ([-1, -1], 2, "RR"), ([1, 0], 3, "S1S0R"),
    ([-1, -1], 0, ""), ([2, -1, 2], 3, "RRS02"),
])
def test_spec_to_string(spec, rank, text):
    assert _core.spec_to_string(spec, rank) == text


# --- Graph -----------------------------------------------------------------------------------

def _graph(kinds, shapes, operands, attrs, dtype_bytes=4):
    def csr(rows):
        offs = np.zeros(len(rows) + 1, dtype=np.int64)
        offs[1:] = np.cumsum([len(r) for r in rows])
        return offs, np.array([x for r in rows for x in r], dtype=np.int64)

    so, sd = csr(shapes)
    oo, oi = csr(operands)
    ao, aa = csr(attrs)
    return dict(kind=np.array(kinds, dtype=np.int32),
                dtype_bytes=np.full(len(kinds), dtype_bytes, dtype=np.int32),
                shape_offsets=so, shape_dims=sd, operand_offsets=oo, operand_ids=oi,
                attr_offsets=ao, attrs=aa)


PARAM, OUTPUT, BROADCAST, TRANSPOSE, DOT = 0, 1, 4, 5, 8
MATMUL = _graph([PARAM, PARAM, DOT, OUTPUT], [[8, 4], [4, 6], [8, 6], [8, 6]],
                [[], [], [0, 1], [2]], [[0], [1], [0, 1, 1, 0], [0]])


def test_graph_accepts_valid_and_counts_flops():
    g = _core.Graph(**MATMUL)
    assert g.num_nodes == 4
    assert _core.node_flops(g, 2) == 2 * 8 * 6 * 4


@pytest.mark.parametrize("change,match", [
    (dict(operand_ids=np.array([0, 3, 2], dtype=np.int64)), "node 2 .*operand 3 is not an earlier"),
    (dict(shape_offsets=np.array([0, 2, 4, 6], dtype=np.int64)), "shape_offsets must have"),
    (dict(attr_offsets=np.array([0, 1, 2, 1, 7], dtype=np.int64)), "attr_offsets decreases"),
    (dict(attrs=np.array([0, 1, 0, 1, 2, 0, 0], dtype=np.int64)),
     "node 2 .*DOT.*lhs contracting dim 2"),
    (dict(kind=np.array([0, 0, 8, 13], dtype=np.int32)), "unknown kind 13"),
])
def test_graph_validation_errors(change, match):
    with pytest.raises(ValueError, match=match):
        _core.Graph(**{**MATMUL, **change})


def test_graph_attrs_length_per_kind():
    bad_dot = _graph([PARAM, PARAM, DOT], [[8, 4], [4, 6], [8, 6]], [[], [], [0, 1]],
                     [[0], [1], [0, 1, 1]])
    with pytest.raises(ValueError, match="DOT.*attrs have 3 entries, expected 4"):
        _core.Graph(**bad_dot)
    bad_bcast = _graph([PARAM, BROADCAST], [[4], [8, 4]], [[], [0]], [[0], [0, 1]])
    with pytest.raises(ValueError, match="BROADCAST.*attrs have 2 entries, expected 1"):
        _core.Graph(**bad_bcast)
    bad_perm = _graph([PARAM, TRANSPOSE], [[4, 8], [8, 4]], [[], [0]], [[0], [1, 2]])
    with pytest.raises(ValueError, match="permutation dim 2 out of range"):
        _core.Graph(**bad_perm)
    no_index = _graph([PARAM], [[4]], [[]], [[]])
    with pytest.raises(ValueError, match="PARAMETER.*attrs have 0 entries, expected 1"):
        _core.Graph(**no_index)


def test_sharding_problem_arrays_are_consistent(mesh):
    g = _core.Graph(**MATMUL)
    opts = _core.CoreOptions()
    prob = _core.build_sharding_problem(g, mesh, opts, [])
    off = prob.strategy_offsets
    num_strategies = int(off[-1])
    assert off.shape == (5,) and off[0] == 0 and np.all(np.diff(off) >= 1)
    assert prob.out_specs.shape == (num_strategies, 2) and prob.out_specs.dtype == np.int32
    assert prob.in_spec_offsets.shape == (num_strategies + 1,)
    assert prob.in_specs.shape == (int(prob.in_spec_offsets[-1]), 2)
    operands = [0, 0, 2, 1]
    for v in range(4):
        counts = np.diff(prob.in_spec_offsets[off[v]:off[v + 1] + 1])
        assert np.all(counts == operands[v])
        ns = _core.node_strategies(g, v, mesh, opts)
        assert [s.name for s in ns.strategies] == prob.strategy_names[off[v]:off[v + 1]]
        assert ns.follow == prob.follow[v]
        assert [s.out for s in ns.strategies] == prob.out_specs[off[v]:off[v + 1]].tolist()
    assert prob.compute_cost.shape == prob.comm_cost.shape == (num_strategies,)
    assert prob.node_group.shape == (4,) and prob.ilp.num_groups == int(prob.node_group.max()) + 1
    with pytest.raises(ValueError, match="node 4 out of range"):
        _core.node_strategies(g, 4, mesh, opts)


def test_dot_on_three_axes_keeps_two_block_role_assignments():
    # [8,32,64] x [64,16] -> [8,32,16]: each of 3 axes takes lfree0, lfree1, rfree0 or c0 (4^3 = 64);
    # kept: operand and result specs in two blocks = role sequences changing at most once (28).
    g = _core.Graph(**_graph([PARAM, PARAM, DOT], [[8, 32, 64], [64, 16], [8, 32, 16]],
                             [[], [], [0, 1]], [[0], [1], [0, 1, 2, 0]]))
    names = [s.name for s in _core.node_strategies(g, 2, _mesh((2, 2, 2)), _core.CoreOptions()).strategies]
    assert len(names) == 28
    assert "dot lfree0@x c0@y c0@z" in names and "dot lfree0@x lfree1@y rfree0@z" not in names
    flat = [s.name for s in _core.node_strategies(g, 2, _mesh((2, 4)), _core.CoreOptions()).strategies]
    assert len(flat) == 16
