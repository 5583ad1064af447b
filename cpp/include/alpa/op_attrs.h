// Typed views of a node's attrs: one decoder per op family, the only code that knows the int64
// layouts written by python/alpa_pass/extract (op_table.py; the table in extract/graph.py).
//
// Each decode_*_attrs takes one node's attrs (Graph::node_attrs) and returns the named fields, or
// throws std::invalid_argument "<KIND> attrs ..." naming the expected layout when the length does
// not match the counts the attrs hold (or a count or index is negative). Decoders check layouts
// only; Graph::validate checks dims against operand and result ranks. Bound to Python as
// _core.decode_*_attrs (emit/partial_sums.py uses them).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace alpa {

using Dims = std::vector<int64_t>;

// PARAMETER: [arg_index] (flat index among the entry function's arguments, >= 0).
struct ParameterAttrs {
  int64_t arg_index = 0;
};
// OUTPUT: [output_index] (flat index among the entry function's results, >= 0).
struct OutputAttrs {
  int64_t output_index = 0;
};
// ELEMENTWISE: [unshardable dims...] (result dims that no mesh axis may split), optionally
// followed by -1 and the runtime-indexed dims: those whose elements a runtime start index picks
// (dynamic_slice, dynamic_update_slice; see unsafe_splits.h). Runtime-indexed dims are
// unshardable too: the decoder adds them to unshardable_dims. The layout may end with -2, k: the
// result's leading k dims are batch dims that every operand of rank >= k shares, whatever its rank
// (a batched LAPACK custom call's results: eigh's eigenvalues [B, n] of a matrix [B, n, n]);
// without it an operand of another rank is replicated.
struct ElementwiseAttrs {
  Dims unshardable_dims;
  Dims runtime_indexed_dims;
  int64_t batch_dims = 0;
};
// BROADCAST: broadcast_dimensions (operand dim i -> result dim broadcast_dims[i]).
struct BroadcastAttrs {
  Dims broadcast_dims;
};
// TRANSPOSE: permutation (result dim i = operand dim permutation[i]).
struct TransposeAttrs {
  Dims permutation;
};
// REDUCE: [reduced dims...] of the input (operand 0).
struct ReduceAttrs {
  Dims reduced_dims;
};
// DOT: [nb, lhs_batch*nb, rhs_batch*nb, nc, lhs_contracting*nc, rhs_contracting*nc]; result dims
// are batch, lhs free (in order), rhs free (in order).
struct DotAttrs {
  Dims lhs_batch, rhs_batch, lhs_contracting, rhs_contracting;
};
// CONVOLUTION: [input_batch, input_feature, ns, input_spatial*ns, kernel_input_feature,
// kernel_output_feature, kernel_spatial*ns, output_batch, output_feature, output_spatial*ns,
// feature_group_count, batch_group_count]; operands [input, kernel].
struct ConvAttrs {
  int64_t input_batch = 0, input_feature = 0;
  Dims input_spatial;
  int64_t kernel_input_feature = 0, kernel_output_feature = 0;
  Dims kernel_spatial;
  int64_t output_batch = 0, output_feature = 0;
  Dims output_spatial;
  int64_t feature_group_count = 1, batch_group_count = 1;
};
// GATHER: [index_vector_dim, then each list as n, values*n: offset_dims, collapsed_slice_dims,
// start_index_map, operand_batching_dims, start_indices_batching_dims, slice_sizes];
// operands [operand, start_indices].
struct GatherAttrs {
  int64_t index_vector_dim = 0;
  Dims offset_dims, collapsed_slice_dims, start_index_map, operand_batching_dims,
      start_indices_batching_dims, slice_sizes;
};
// SCATTER: [index_vector_dim, then each list as n, values*n: update_window_dims,
// inserted_window_dims, scatter_dims_to_operand_dims, input_batching_dims,
// scatter_indices_batching_dims]; operands [input, scatter_indices, update].
struct ScatterAttrs {
  int64_t index_vector_dim = 0;
  Dims update_window_dims, inserted_window_dims, scatter_dims_to_operand_dims,
      input_batching_dims, scatter_indices_batching_dims;
};

ParameterAttrs decode_parameter_attrs(std::span<const int64_t> attrs);
OutputAttrs decode_output_attrs(std::span<const int64_t> attrs);
ElementwiseAttrs decode_elementwise_attrs(std::span<const int64_t> attrs);
BroadcastAttrs decode_broadcast_attrs(std::span<const int64_t> attrs);
TransposeAttrs decode_transpose_attrs(std::span<const int64_t> attrs);
ReduceAttrs decode_reduce_attrs(std::span<const int64_t> attrs);
DotAttrs decode_dot_attrs(std::span<const int64_t> attrs);
ConvAttrs decode_conv_attrs(std::span<const int64_t> attrs);
GatherAttrs decode_gather_attrs(std::span<const int64_t> attrs);
ScatterAttrs decode_scatter_attrs(std::span<const int64_t> attrs);
// GENERATOR, RESHAPE, OPAQUE: [] (throws naming `kind` if attrs are not empty).
void check_no_attrs(const char* kind, std::span<const int64_t> attrs);

}  // namespace alpa
