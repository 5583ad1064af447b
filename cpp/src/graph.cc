// Graph helpers and the consistency check run once when Python hands a graph over.
#include "alpa/graph.h"

#include <stdexcept>
#include <string>

#include "alpa/op_attrs.h"

namespace alpa {

const char* op_kind_name(OpKind kind) {
  static const char* const kNames[kNumOpKinds] = {
      "PARAMETER", "OUTPUT",      "GENERATOR", "ELEMENTWISE", "BROADCAST", "TRANSPOSE", "RESHAPE",
      "REDUCE",    "DOT",         "CONVOLUTION", "GATHER",    "SCATTER",   "OPAQUE"};
  const int k = static_cast<int>(kind);
  return k >= 0 && k < kNumOpKinds ? kNames[k] : "UNKNOWN";
}

double Graph::numel(int64_t v) const {
  double n = 1.0;
  for (int64_t d : shape(v)) n *= static_cast<double>(d);
  return n;
}

namespace {

[[noreturn]] void fail(const Graph& g, int64_t v, const std::string& what) {
  throw std::invalid_argument("graph node " + std::to_string(v) + " (" + op_kind_name(g.op_kind(v)) +
                              "): " + what);
}

void check_offsets(const std::vector<int64_t>& offsets, size_t flat_size, int64_t n,
                   const char* name) {
  if (static_cast<int64_t>(offsets.size()) != n + 1 || offsets[0] != 0 ||
      offsets[n] != static_cast<int64_t>(flat_size)) {
    throw std::invalid_argument(std::string(name) + " must have num_nodes + 1 = " +
                                std::to_string(n + 1) + " entries, start at 0 and end at " +
                                std::to_string(flat_size));
  }
  for (int64_t v = 0; v < n; ++v) {
    if (offsets[v + 1] < offsets[v]) {
      throw std::invalid_argument(std::string(name) + " decreases at node " + std::to_string(v));
    }
  }
}

void check_dims(const Graph& g, int64_t v, std::span<const int64_t> dims, int64_t rank,
                const char* what) {
  for (int64_t d : dims) {
    if (d < 0 || d >= rank) {
      fail(g, v, std::string(what) + " dim " + std::to_string(d) + " out of range for rank " +
                     std::to_string(rank));
    }
  }
}

void check_operand_count(const Graph& g, int64_t v, size_t want) {
  if (g.operands(v).size() != want) {
    fail(g, v, "has " + std::to_string(g.operands(v).size()) + " operands, expected " +
                   std::to_string(want));
  }
}

void check_length(const Graph& g, int64_t v, size_t have, int64_t want) {
  if (static_cast<int64_t>(have) != want) {
    fail(g, v, "attrs have " + std::to_string(have) + " entries, expected " + std::to_string(want));
  }
}

// decode(node_attrs(v)), naming the node in the decoder's error.
template <typename Decode>
auto decoded(const Graph& g, int64_t v, Decode decode) {
  try {
    return decode(g.node_attrs(v));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("graph node " + std::to_string(v) + ": " + e.what());
  }
}

void check_empty(const Graph& g, int64_t v) {
  decoded(g, v, [&](std::span<const int64_t> a) { check_no_attrs(op_kind_name(g.op_kind(v)), a); });
}

// DOT: batch and contracting dims of each side within that operand's rank.
void check_dot(const Graph& g, int64_t v) {
  const DotAttrs a = decoded(g, v, decode_dot_attrs);
  const int64_t lhs = g.rank(g.operands(v)[0]), rhs = g.rank(g.operands(v)[1]);
  check_dims(g, v, a.lhs_batch, lhs, "lhs batch");
  check_dims(g, v, a.rhs_batch, rhs, "rhs batch");
  check_dims(g, v, a.lhs_contracting, lhs, "lhs contracting");
  check_dims(g, v, a.rhs_contracting, rhs, "rhs contracting");
}

// The operand count and the attrs of node v against its kind's layout (op_attrs.h) and ranks.
void check_attrs(const Graph& g, int64_t v) {
  const auto ops = g.operands(v);
  switch (g.op_kind(v)) {
    case OpKind::kParameter: decoded(g, v, decode_parameter_attrs); break;
    case OpKind::kOutput: check_operand_count(g, v, 1); decoded(g, v, decode_output_attrs); break;
    case OpKind::kGenerator: check_empty(g, v); break;
    case OpKind::kElementwise: {  // runtime-indexed dims are among the unshardable ones
      const ElementwiseAttrs e = decoded(g, v, decode_elementwise_attrs);
      check_dims(g, v, e.unshardable_dims, g.rank(v), "unshardable");
      if (e.batch_dims > g.rank(v)) {
        throw std::invalid_argument("node " + std::to_string(v) + " (ELEMENTWISE): " +
                                    std::to_string(e.batch_dims) + " batch dims on a rank-" +
                                    std::to_string(g.rank(v)) + " result");
      }
      break;
    }
    case OpKind::kBroadcast: {
      check_operand_count(g, v, 1);
      const BroadcastAttrs b = decoded(g, v, decode_broadcast_attrs);
      check_length(g, v, b.broadcast_dims.size(), g.rank(ops[0]));
      check_dims(g, v, b.broadcast_dims, g.rank(v), "broadcast");
      break;
    }
    case OpKind::kTranspose: {
      check_operand_count(g, v, 1);
      const TransposeAttrs t = decoded(g, v, decode_transpose_attrs);
      check_length(g, v, t.permutation.size(), g.rank(v));
      check_dims(g, v, t.permutation, g.rank(ops[0]), "permutation");
      break;
    }
    case OpKind::kReshape: check_operand_count(g, v, 1); check_empty(g, v); break;
    case OpKind::kReduce:
      if (ops.empty()) fail(g, v, "reduce without operands");
      check_dims(g, v, decoded(g, v, decode_reduce_attrs).reduced_dims, g.rank(ops[0]), "reduced");
      break;
    case OpKind::kDot: check_operand_count(g, v, 2); check_dot(g, v); break;
    case OpKind::kConvolution: check_operand_count(g, v, 2); decoded(g, v, decode_conv_attrs); break;
    case OpKind::kGather: check_operand_count(g, v, 2); decoded(g, v, decode_gather_attrs); break;
    case OpKind::kScatter: check_operand_count(g, v, 3); decoded(g, v, decode_scatter_attrs); break;
    case OpKind::kOpaque: check_empty(g, v); break;
  }
}

}  // namespace

void Graph::validate() const {
  const int64_t n = num_nodes();
  if (static_cast<int64_t>(dtype_bytes.size()) != n) {
    throw std::invalid_argument("dtype_bytes has " + std::to_string(dtype_bytes.size()) +
                                " entries but kind has " + std::to_string(n));
  }
  check_offsets(shape_offsets, shape_dims.size(), n, "shape_offsets");
  check_offsets(operand_offsets, operand_ids.size(), n, "operand_offsets");
  check_offsets(attr_offsets, attrs.size(), n, "attr_offsets");
  for (int64_t v = 0; v < n; ++v) {
    if (kind[v] < 0 || kind[v] >= kNumOpKinds) {
      throw std::invalid_argument("graph node " + std::to_string(v) + ": unknown kind " +
                                  std::to_string(kind[v]));
    }
    if (dtype_bytes[v] < 0) fail(*this, v, "negative dtype_bytes");
    for (int64_t d : shape(v)) {
      if (d < 0) fail(*this, v, "negative dimension " + std::to_string(d));
    }
    for (int64_t u : operands(v)) {
      if (u < 0 || u >= v) fail(*this, v, "operand " + std::to_string(u) + " is not an earlier node");
    }
    check_attrs(*this, v);
  }
}

}  // namespace alpa
