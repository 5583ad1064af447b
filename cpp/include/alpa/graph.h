// The flat operator graph built by python/alpa_pass/extract (see extract/graph.py for the
// contract). Graph owns copies of the CSR arrays (the binding copies the numpy input once); each
// kind's attrs layout is decoded by alpa/op_attrs.h.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace alpa {

// The kind of a node. Bound once to Python as alpa_pass._core.OpKind (an enum.IntEnum whose
// member names are op_kind_name's), which extract/graph.py re-exports: no Python copy to sync.
enum class OpKind : int32_t {
  kParameter = 0,
  kOutput = 1,
  kGenerator = 2,
  kElementwise = 3,
  kBroadcast = 4,
  kTranspose = 5,
  kReshape = 6,
  kReduce = 7,
  kDot = 8,
  kConvolution = 9,
  kGather = 10,
  kScatter = 11,
  kOpaque = 12,
};
constexpr int kNumOpKinds = 13;
const char* op_kind_name(OpKind kind);

struct Graph {
  std::vector<int32_t> kind;          // [N]
  std::vector<int32_t> dtype_bytes;   // [N]
  std::vector<int64_t> shape_offsets; // [N+1]
  std::vector<int64_t> shape_dims;
  std::vector<int64_t> operand_offsets;  // [N+1]
  std::vector<int64_t> operand_ids;
  std::vector<int64_t> attr_offsets;  // [N+1]
  std::vector<int64_t> attrs;

  int64_t num_nodes() const { return static_cast<int64_t>(kind.size()); }
  OpKind op_kind(int64_t v) const { return static_cast<OpKind>(kind[v]); }
  std::span<const int64_t> shape(int64_t v) const {
    return {shape_dims.data() + shape_offsets[v], shape_dims.data() + shape_offsets[v + 1]};
  }
  int64_t rank(int64_t v) const { return shape_offsets[v + 1] - shape_offsets[v]; }
  std::span<const int64_t> operands(int64_t v) const {
    return {operand_ids.data() + operand_offsets[v], operand_ids.data() + operand_offsets[v + 1]};
  }
  std::span<const int64_t> node_attrs(int64_t v) const {
    return {attrs.data() + attr_offsets[v], attrs.data() + attr_offsets[v + 1]};
  }
  double numel(int64_t v) const;        // product of shape dims (1 for rank 0)
  double bytes(int64_t v) const { return numel(v) * dtype_bytes[v]; }
  // Throws std::invalid_argument naming the node if the arrays are inconsistent (offsets, operand
  // ids not earlier nodes, operand counts, attrs not matching the kind's layout or ranks).
  void validate() const;
};

}  // namespace alpa
