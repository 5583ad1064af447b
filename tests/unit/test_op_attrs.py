"""The typed C++ contract: ``_core.OpKind`` (an IntEnum bound once) and the attrs decoders
(cpp/include/alpa/op_attrs.h), which read the layouts extract/op_table.py writes."""
import enum

import numpy as np
import pytest

from alpa_pass import _core
from alpa_pass.extract import graph as graph_mod
from alpa_pass.extract.graph import GraphBuilder, OpKind


def test_opkind_is_the_bound_int_enum():
    assert OpKind is _core.OpKind and graph_mod.OpKind is _core.OpKind
    assert issubclass(OpKind, enum.IntEnum)
    assert [k.name for k in OpKind] == [
        "PARAMETER", "OUTPUT", "GENERATOR", "ELEMENTWISE", "BROADCAST", "TRANSPOSE", "RESHAPE",
        "REDUCE", "DOT", "CONVOLUTION", "GATHER", "SCATTER", "OPAQUE"]
    assert [int(k) for k in OpKind] == list(range(13))
    assert OpKind(int(np.int32(8))) is OpKind.DOT and OpKind.DOT == 8
    assert OpKind(9).name.lower() == "convolution"
    assert 7 in (OpKind.REDUCE, OpKind.DOT) and {OpKind.GATHER: 1}[OpKind(10)] == 1
    kinds = np.array([OpKind.PARAMETER, OpKind.DOT, OpKind.OUTPUT], dtype=np.int32)
    assert (kinds == OpKind.DOT).tolist() == [False, True, False]


def test_builder_kinds_reach_the_core():
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [4, 8], 4, attrs=[0])
    w = b.add(OpKind.PARAMETER, [8, 2], 4, attrs=[1])
    d = b.add(OpKind.DOT, [4, 2], 4, [x, w], [0, 1, 1, 0])
    b.add(OpKind.OUTPUT, [4, 2], 4, [d], [0])
    g = b.build(num_args=2, num_outputs=1)
    assert g.kind.dtype == np.int32 and g.kind.tolist() == [0, 0, 8, 1]
    assert g.param_nodes() == [0, 1] and g.output_nodes() == [3]


def test_decode_dot_and_reduce():
    dot = _core.decode_dot_attrs([1, 0, 0, 1, 2, 1])
    assert (dot.lhs_batch, dot.rhs_batch, dot.lhs_contracting, dot.rhs_contracting) == ([0], [0], [2], [1])
    assert _core.decode_dot_attrs(np.array([0, 1, 1, 0], dtype=np.int64)).lhs_contracting == [1]
    assert _core.decode_reduce_attrs([0, 2]).reduced_dims == [0, 2]
    assert _core.decode_transpose_attrs([1, 0]).permutation == [1, 0]
    assert _core.decode_broadcast_attrs([1]).broadcast_dims == [1]
    assert _core.decode_elementwise_attrs([]).unshardable_dims == []
    assert _core.decode_parameter_attrs([3]).arg_index == 3
    assert _core.decode_output_attrs([0]).output_index == 0


def test_decode_conv_gather_scatter():
    # NHWC input, HWIO kernel, NHWC output, 2 spatial dims, feature groups 2.
    conv = _core.decode_conv_attrs([0, 3, 2, 1, 2, 2, 3, 0, 1, 0, 3, 1, 2, 2, 1])
    assert (conv.input_batch, conv.input_feature, conv.input_spatial) == (0, 3, [1, 2])
    assert (conv.kernel_input_feature, conv.kernel_output_feature, conv.kernel_spatial) == (2, 3, [0, 1])
    assert (conv.output_batch, conv.output_feature, conv.output_spatial) == (0, 3, [1, 2])
    assert (conv.feature_group_count, conv.batch_group_count) == (2, 1)
    gather = _core.decode_gather_attrs([1, 1, 1, 1, 0, 1, 0, 0, 0, 2, 1, 64])
    assert gather.index_vector_dim == 1 and gather.offset_dims == [1]
    assert (gather.collapsed_slice_dims, gather.start_index_map) == ([0], [0])
    assert (gather.operand_batching_dims, gather.start_indices_batching_dims) == ([], [])
    assert gather.slice_sizes == [1, 64]
    scatter = _core.decode_scatter_attrs([2, 1, 2, 1, 0, 1, 0, 0, 0])
    assert (scatter.index_vector_dim, scatter.update_window_dims) == (2, [2])
    assert (scatter.inserted_window_dims, scatter.scatter_dims_to_operand_dims) == ([0], [0])
    assert scatter.input_batching_dims == [] and scatter.scatter_indices_batching_dims == []


@pytest.mark.parametrize("decode,attrs,match", [
    (_core.decode_dot_attrs, [0, 1, 1], r"DOT attrs have 3 entries, expected 4 \(layout \[nb,"),
    (_core.decode_dot_attrs, [], "DOT attrs have 0 entries, too few to hold nb"),
    (_core.decode_dot_attrs, [0, -1], "DOT attrs nc is -1, expected >= 0"),
    (_core.decode_dot_attrs, [7, 0], "DOT attrs nb is 7, more than the 2 entries"),
    (_core.decode_conv_attrs, [0, 3, 1, 1, 2, 3, 0, 0, 3, 1, 1], "CONVOLUTION attrs have 11 entries, expected 12"),
    (_core.decode_gather_attrs, [1, 0, 0], "GATHER attrs have 3 entries, too few to hold count of start_index_map"),
    (_core.decode_scatter_attrs, [0, 0, 0, 0, 0, 0, 9], "SCATTER attrs have 7 entries, expected 6"),
    (_core.decode_parameter_attrs, [], "PARAMETER attrs have 0 entries, expected 1"),
    (_core.decode_output_attrs, [-2], "OUTPUT attrs output_index is -2, expected >= 0"),
])
def test_decode_errors_name_the_layout(decode, attrs, match):
    with pytest.raises(ValueError, match=match):
        decode(attrs)


def test_graph_validation_names_the_node_and_rejects_attrs_on_attrless_kinds():
    b = GraphBuilder()
    x = b.add(OpKind.PARAMETER, [4, 8], 4, attrs=[0])
    b.add(OpKind.RESHAPE, [32], 4, [x], [1])
    g = b.build()
    with pytest.raises(ValueError, match=r"graph node 1: RESHAPE attrs have 1 entries, expected 0"):
        _core.Graph(g.kind, g.dtype_bytes, g.shape_offsets, g.shape_dims, g.operand_offsets,
                    g.operand_ids, g.attr_offsets, g.attrs)
