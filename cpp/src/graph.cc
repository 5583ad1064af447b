// Graph helpers and the consistency check run once when Python hands a graph over.
#include "alpa/graph.h"

#include <stdexcept>
#include <string>

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

// Reads a length-prefixed list at attrs[pos]; returns the position after it or -1 if too short.
int64_t skip_list(std::span<const int64_t> attrs, int64_t pos) {
  if (pos >= static_cast<int64_t>(attrs.size()) || attrs[pos] < 0) return -1;
  return pos + 1 + attrs[pos];
}

// Expected attrs length of a kind whose layout depends on counts inside attrs (DOT, GATHER,
// SCATTER, CONVOLUTION); -1 if the counts themselves are missing or negative.
int64_t counted_length(OpKind kind, std::span<const int64_t> a) {
  const int64_t n = static_cast<int64_t>(a.size());
  switch (kind) {
    case OpKind::kDot: {
      if (n < 1 || a[0] < 0 || n < 2 + 2 * a[0] || a[1 + 2 * a[0]] < 0) return -1;
      return 2 + 2 * a[0] + 2 * a[1 + 2 * a[0]];
    }
    case OpKind::kConvolution:
      return n < 3 || a[2] < 0 ? -1 : 9 + 3 * a[2];
    case OpKind::kGather:
    case OpKind::kScatter: {
      int64_t pos = 1;
      for (int i = 0; i < (kind == OpKind::kGather ? 6 : 5) && pos >= 0; ++i) pos = skip_list(a, pos);
      return pos;
    }
    default:
      return -1;
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

// DOT: batch and contracting dims of each side within that operand's rank.
void check_dot(const Graph& g, int64_t v) {
  const auto a = g.node_attrs(v);
  const int64_t nb = a[0], nc = a[1 + 2 * nb];
  const int64_t lhs = g.rank(g.operands(v)[0]), rhs = g.rank(g.operands(v)[1]);
  check_dims(g, v, a.subspan(1, nb), lhs, "lhs batch");
  check_dims(g, v, a.subspan(1 + nb, nb), rhs, "rhs batch");
  check_dims(g, v, a.subspan(2 + 2 * nb, nc), lhs, "lhs contracting");
  check_dims(g, v, a.subspan(2 + 2 * nb + nc, nc), rhs, "rhs contracting");
}

void check_attrs(const Graph& g, int64_t v) {
  const auto a = g.node_attrs(v);
  const auto ops = g.operands(v);
  const auto len = static_cast<int64_t>(a.size());
  auto want_len = [&](int64_t want) {
    if (len != want) {
      fail(g, v, "attrs have " + std::to_string(len) + " entries, expected " + std::to_string(want));
    }
  };
  switch (g.op_kind(v)) {
    case OpKind::kParameter: want_len(1); break;
    case OpKind::kOutput: want_len(1); check_operand_count(g, v, 1); break;
    case OpKind::kBroadcast:
      check_operand_count(g, v, 1);
      want_len(g.rank(ops[0]));
      check_dims(g, v, a, g.rank(v), "broadcast");
      break;
    case OpKind::kTranspose:
      check_operand_count(g, v, 1);
      want_len(g.rank(v));
      check_dims(g, v, a, g.rank(ops[0]), "permutation");
      break;
    case OpKind::kDot:
      check_operand_count(g, v, 2);
      want_len(counted_length(OpKind::kDot, a));
      check_dot(g, v);
      break;
    case OpKind::kConvolution:
      check_operand_count(g, v, 2);
      want_len(counted_length(OpKind::kConvolution, a));
      break;
    case OpKind::kGather: check_operand_count(g, v, 2); want_len(counted_length(OpKind::kGather, a)); break;
    case OpKind::kScatter: check_operand_count(g, v, 3); want_len(counted_length(OpKind::kScatter, a)); break;
    case OpKind::kElementwise: check_dims(g, v, a, g.rank(v), "unshardable"); break;
    case OpKind::kReshape: check_operand_count(g, v, 1); break;
    case OpKind::kReduce:
      if (ops.empty()) fail(g, v, "reduce without operands");
      check_dims(g, v, a, g.rank(ops[0]), "reduced");
      break;
    default: break;
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
