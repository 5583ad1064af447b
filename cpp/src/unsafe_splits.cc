// Splits the partitioner does not carry out correctly (unsafe_splits.h): runtime-indexed dims
// followed forward through the graph, and the filter applied to each node's strategies.
#include "alpa/unsafe_splits.h"

#include <algorithm>
#include <set>
#include <string>

namespace alpa {
namespace {

using DimSet = std::set<int64_t>;

bool has(const std::vector<Dims>& indexed, int64_t u, int64_t d) {
  return std::find(indexed[u].begin(), indexed[u].end(), d) != indexed[u].end();
}

// Result dims of a reshape in a group of consecutive dims (equal products on both sides) that
// holds an indexed operand dim of size > 1; where the groups cannot be matched (zero-size dims),
// every result dim from there on. A size-1 indexed dim picks one index and is dropped by the
// reshape (a scan's per-iteration slice [1, B, ...] -> [B, ...]): the dims it merges with are whole.
void reshape_dims(std::span<const int64_t> in, std::span<const int64_t> out, const Dims& indexed,
                  DimSet& to) {
  Dims from;
  for (int64_t d : indexed) {
    if (d >= static_cast<int64_t>(in.size()) || in[d] != 1) from.push_back(d);
  }
  if (from.empty()) return;
  auto any_from = [&](size_t lo, size_t hi) {
    return std::any_of(from.begin(), from.end(),
                       [&](int64_t d) { return d >= static_cast<int64_t>(lo) && d < static_cast<int64_t>(hi); });
  };
  size_t i = 0, o = 0;
  bool matched = true;
  while (i < in.size() && o < out.size()) {
    const size_t i0 = i, o0 = o;
    int64_t pi = in[i++], po = out[o++];
    while (pi != po) {
      if (pi < po && i < in.size()) {
        pi *= in[i++];
      } else if (po < pi && o < out.size()) {
        po *= out[o++];
      } else {
        break;
      }
    }
    if (pi != po) {
      matched = false;
      o = o0;
      i = i0;
      break;
    }
    if (any_from(i0, i)) {
      for (size_t d = o0; d < o; ++d) to.insert(static_cast<int64_t>(d));
    }
  }
  if (!matched || any_from(i, in.size())) {
    for (size_t d = o; d < out.size(); ++d) to.insert(static_cast<int64_t>(d));
  }
}

// Result dims of gather v that keep an indexed dim of its operands: an indices dim's batch dim
// (all of them when the index vector dim is indexed), an operand dim's offset dim or, for an
// operand-batching dim, its batch dim; an indexed operand dim the indices pick from (collapsed)
// marks every batch dim but those of the operand-batching dims (per-example take_along_axis,
// flax's flip_sequences: row b of the result is read from row b of the operand). (A token read
// by a dynamic_slice of [B, T] at column t, [B, 1], looks up its embedding: only the size-1 dim
// is indexed, the batch dim stays splittable.)
void gather_dims(const Graph& g, const std::vector<Dims>& indexed, int64_t v, DimSet& to) {
  const GatherAttrs a = decode_gather_attrs(g.node_attrs(v));
  const auto ops = g.operands(v);
  const auto in = [](const Dims& ds, int64_t d) { return std::find(ds.begin(), ds.end(), d) != ds.end(); };
  Dims batch;  // result dims that are not offset dims, in the order of the indices' dims
  for (int64_t d = 0; d < g.rank(v); ++d) {
    if (!in(a.offset_dims, d)) batch.push_back(d);
  }
  auto batch_of_index_dim = [&](int64_t d) {  // indices dim (not index_vector_dim) -> result dim
    const int64_t k = d - (d > a.index_vector_dim ? 1 : 0);
    return k < static_cast<int64_t>(batch.size()) ? batch[k] : -1;
  };
  Dims paired;  // result dims of the operand-batching dims (their rows are the operand's own)
  for (int64_t d : a.start_indices_batching_dims) {
    if (int64_t r = batch_of_index_dim(d); r >= 0) paired.push_back(r);
  }
  for (int64_t d : indexed[ops[1]]) {
    if (d == a.index_vector_dim) {
      to.insert(batch.begin(), batch.end());
    } else if (int64_t r = batch_of_index_dim(d); r >= 0) {
      to.insert(r);
    }
  }
  size_t k = 0;  // k-th offset dim <-> k-th operand dim neither collapsed nor operand-batching
  for (int64_t d = 0; d < g.rank(ops[0]); ++d) {
    const bool collapsed = in(a.collapsed_slice_dims, d), batching = in(a.operand_batching_dims, d);
    const bool offset = !collapsed && !batching;
    if (has(indexed, ops[0], d)) {
      if (offset && k < a.offset_dims.size()) {
        to.insert(a.offset_dims[k]);
      } else if (batching) {
        const size_t j = std::find(a.operand_batching_dims.begin(), a.operand_batching_dims.end(), d) -
                         a.operand_batching_dims.begin();
        const int64_t r = j < a.start_indices_batching_dims.size()
                              ? batch_of_index_dim(a.start_indices_batching_dims[j]) : -1;
        if (r >= 0) to.insert(r);
      } else {  // picked from: every batch dim but those paired with operand-batching dims
        for (int64_t r : batch) {
          if (std::find(paired.begin(), paired.end(), r) == paired.end()) to.insert(r);
        }
      }
    }
    if (offset) ++k;
  }
}

// Result dims of node v that keep an indexed dim of one of its operands.
DimSet forwarded_dims(const Graph& g, const std::vector<Dims>& indexed, int64_t v) {
  DimSet to;
  const auto ops = g.operands(v);
  auto any_operand_indexed = [&] {
    return std::any_of(ops.begin(), ops.end(), [&](int64_t u) { return !indexed[u].empty(); });
  };
  switch (g.op_kind(v)) {
    case OpKind::kElementwise:
    case OpKind::kOutput:
      for (int64_t u : ops) {
        if (g.rank(u) == g.rank(v)) to.insert(indexed[u].begin(), indexed[u].end());
      }
      break;
    case OpKind::kTranspose: {
      const Dims perm = decode_transpose_attrs(g.node_attrs(v)).permutation;
      for (size_t d = 0; d < perm.size(); ++d) {
        if (has(indexed, ops[0], perm[d])) to.insert(static_cast<int64_t>(d));
      }
      break;
    }
    case OpKind::kBroadcast: {
      const Dims dims = decode_broadcast_attrs(g.node_attrs(v)).broadcast_dims;
      for (size_t d = 0; d < dims.size(); ++d) {
        if (has(indexed, ops[0], static_cast<int64_t>(d))) to.insert(dims[d]);
      }
      break;
    }
    case OpKind::kReshape: reshape_dims(g.shape(ops[0]), g.shape(v), indexed[ops[0]], to); break;
    case OpKind::kReduce: {
      const Dims reduced = decode_reduce_attrs(g.node_attrs(v)).reduced_dims;
      int64_t out = 0;
      for (int64_t d = 0; d < g.rank(ops[0]); ++d) {
        if (std::find(reduced.begin(), reduced.end(), d) != reduced.end()) continue;
        if (has(indexed, ops[0], d)) to.insert(out);
        ++out;
      }
      break;
    }
    case OpKind::kDot: {  // result dims: batch, lhs free, rhs free
      const DotAttrs a = decode_dot_attrs(g.node_attrs(v));
      int64_t out = 0;
      for (size_t k = 0; k < a.lhs_batch.size(); ++k, ++out) {
        if (has(indexed, ops[0], a.lhs_batch[k]) || has(indexed, ops[1], a.rhs_batch[k])) to.insert(out);
      }
      for (int side = 0; side < 2; ++side) {
        const Dims& batch = side ? a.rhs_batch : a.lhs_batch;
        const Dims& contracting = side ? a.rhs_contracting : a.lhs_contracting;
        for (int64_t d = 0; d < g.rank(ops[side]); ++d) {
          if (std::find(batch.begin(), batch.end(), d) != batch.end() ||
              std::find(contracting.begin(), contracting.end(), d) != contracting.end()) {
            continue;
          }
          if (has(indexed, ops[side], d)) to.insert(out);
          ++out;
        }
      }
      break;
    }
    case OpKind::kGather: gather_dims(g, indexed, v, to); break;
    case OpKind::kConvolution: {  // as a dot: batch and free dims map, windows spread, features contract
      const ConvAttrs a = decode_conv_attrs(g.node_attrs(v));
      if (a.batch_group_count != 1) {
        if (any_operand_indexed()) {
          for (int64_t d = 0; d < g.rank(v); ++d) to.insert(d);
        }
        break;
      }
      if (has(indexed, ops[0], a.input_batch)) to.insert(a.output_batch);
      if (has(indexed, ops[1], a.kernel_output_feature) ||
          (a.feature_group_count > 1 && has(indexed, ops[0], a.input_feature))) {
        to.insert(a.output_feature);
      }
      for (size_t i = 0; i < a.output_spatial.size(); ++i) {
        if (has(indexed, ops[0], a.input_spatial[i]) || has(indexed, ops[1], a.kernel_spatial[i])) {
          to.insert(a.output_spatial[i]);
        }
      }
      break;
    }
    case OpKind::kScatter:
      if (any_operand_indexed()) {
        for (int64_t d = 0; d < g.rank(v); ++d) to.insert(d);
      }
      break;
    default: break;
  }
  return to;
}

// The result dims node v's own runtime start indexes (a gather's: offset dims of indexed operand
// dims sliced smaller than the operand).
Dims own_indexed_dims(const Graph& g, int64_t v) {
  if (g.op_kind(v) == OpKind::kElementwise) {
    return decode_elementwise_attrs(g.node_attrs(v)).runtime_indexed_dims;
  }
  if (g.op_kind(v) != OpKind::kGather) return {};
  const GatherAttrs a = decode_gather_attrs(g.node_attrs(v));
  const auto operand = g.shape(g.operands(v)[0]);
  Dims out;
  size_t k = 0;  // k-th offset dim <-> k-th operand dim neither collapsed nor operand-batching
  for (int64_t d = 0; d < static_cast<int64_t>(operand.size()) && k < a.offset_dims.size(); ++d) {
    const auto in = [&](const Dims& ds) { return std::find(ds.begin(), ds.end(), d) != ds.end(); };
    if (in(a.collapsed_slice_dims) || in(a.operand_batching_dims)) continue;
    if (in(a.start_index_map) && d < static_cast<int64_t>(a.slice_sizes.size()) &&
        a.slice_sizes[d] < operand[d]) {
      out.push_back(a.offset_dims[k]);
    }
    ++k;
  }
  return out;
}

bool splits_unsafely(const Graph& g, const std::vector<Dims>& indexed, int64_t u, const Spec& s) {
  const bool split = std::any_of(s.begin(), s.end(), [](int32_t d) { return d >= 0; });
  if (!split) return false;
  if (g.numel(u) == 0.0) return true;
  return std::any_of(s.begin(), s.end(), [&](int32_t d) { return d >= 0 && has(indexed, u, d); });
}

// A dynamic_update_slice's runtime-indexed dims (an op with such dims whose result has its
// operand 0's shape; empty for every other op). It writes its update in place: every element of
// its result sits where it is, so the start picks nothing a later op reads. The dims are kept
// whole on the op itself (drop_unsafe_splits) and on the buffer it reads, not followed forward (a
// scan's stacked outputs, written one row per iteration, stay splittable after the loop:
// PureJaxRL's minibatches of the rollout were replicated and their activations all-gathered).
Dims updated_dims(const Graph& g, int64_t v) {
  if (g.op_kind(v) != OpKind::kElementwise || g.operands(v).empty()) return {};
  const auto a = g.shape(v), b = g.shape(g.operands(v)[0]);
  if (!std::equal(a.begin(), a.end(), b.begin(), b.end())) return {};
  return decode_elementwise_attrs(g.node_attrs(v)).runtime_indexed_dims;
}

void add_dims(Dims& to, const Dims& more) {
  DimSet dims(to.begin(), to.end());
  dims.insert(more.begin(), more.end());
  to.assign(dims.begin(), dims.end());
}

}  // namespace

std::vector<Dims> runtime_indexed_dims(const Graph& g) {
  const int64_t n = g.num_nodes();
  std::vector<Dims> indexed(n);
  for (int64_t v = 0; v < n; ++v) {
    DimSet dims = forwarded_dims(g, indexed, v);
    if (updated_dims(g, v).empty()) {
      const Dims own = own_indexed_dims(g, v);
      dims.insert(own.begin(), own.end());
    }
    indexed[v].assign(dims.begin(), dims.end());
  }
  for (int64_t v = 0; v < n; ++v) {  // a dynamic_slice / dynamic_update_slice operand: read whole
    if (g.op_kind(v) != OpKind::kElementwise || g.operands(v).empty()) continue;
    const int64_t u = g.operands(v)[0];
    const Dims own = decode_elementwise_attrs(g.node_attrs(v)).runtime_indexed_dims;
    if (own.empty() || g.rank(u) != g.rank(v)) continue;
    add_dims(indexed[u], own);
  }
  return indexed;
}

void drop_unsafe_splits(const RuleContext& ctx, const std::vector<Dims>& indexed, int64_t v,
                        NodeStrategies& ns) {
  const Graph& g = ctx.graph;
  const auto ops = g.operands(v);
  const Dims in_place = updated_dims(g, v);  // whole on the op, its readers may split them
  auto unsafe = [&](const Strategy& s) {
    if (splits_unsafely(g, indexed, v, s.out)) return true;
    if (std::any_of(s.out.begin(), s.out.end(), [&](int32_t d) {
          return d >= 0 && std::find(in_place.begin(), in_place.end(), d) != in_place.end();
        })) {
      return true;
    }
    for (size_t t = 0; t < ops.size() && t < s.ins.size(); ++t) {
      if (splits_unsafely(g, indexed, ops[t], s.ins[t])) return true;
    }
    return false;
  };
  const size_t before = ns.list.size();
  ns.list.erase(std::remove_if(ns.list.begin(), ns.list.end(), unsafe), ns.list.end());
  if (ns.list.size() == before) return;
  ns.follow = -1;
  if (!ns.list.empty()) return;
  Strategy s;
  s.out = replicated_spec(ctx.mesh);
  s.ins.assign(ops.size(), s.out);
  s.compute = node_flops(g, v) * ctx.options.compute_cost_per_flop;
  s.name = std::string(op_kind_name(g.op_kind(v))) + " R (no safe split)";
  ns.list.push_back(std::move(s));
}

}  // namespace alpa
