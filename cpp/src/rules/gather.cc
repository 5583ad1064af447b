// GATHER: any result spec whose splits map to the operands. Result dims in offset_dims map (in
// order) to the operand dims that are neither collapsed nor operand-batching: a split there splits
// that operand dim, allowed only when the slice covers the whole dim and the dim is not indexed
// (not in start_index_map). The other result dims map (in order) to the start_indices dims other
// than index_vector_dim: a split there splits that indices dim, and the operand batching dim paired
// with it if any (else the operand is replicated on that axis). Besides, vocab-parallel lookups:
// the operand split on an indexed dim of slice size 1, the partial results all-reduced.
#include <stdexcept>

#include "rules.h"

namespace alpa::rules {
namespace {

constexpr int32_t kIllegal = -2;

struct GatherMap {
  std::vector<int32_t> operand_dim;  // per result dim: operand dim split with it, -1, or kIllegal
  std::vector<int32_t> indices_dim;  // per result dim: indices dim split with it, or -1
};

GatherMap gather_map(const Graph& g, int64_t v) {
  const GatherAttrs a = decode_gather_attrs(g.node_attrs(v));
  const int64_t index_vector_dim = a.index_vector_dim;
  const Dims &offset_dims = a.offset_dims, &collapsed = a.collapsed_slice_dims;
  const Dims &start_index_map = a.start_index_map, &operand_batching = a.operand_batching_dims;
  const Dims &indices_batching = a.start_indices_batching_dims, &slice_sizes = a.slice_sizes;
  const auto operand_shape = g.shape(g.operands(v)[0]);
  const int64_t indices_rank = g.rank(g.operands(v)[1]);
  std::vector<int32_t> operand_offset, indices_batch;
  for (int64_t d = 0; d < static_cast<int64_t>(operand_shape.size()); ++d) {
    if (index_of(collapsed, d) < 0 && index_of(operand_batching, d) < 0) {
      operand_offset.push_back(static_cast<int32_t>(d));
    }
  }
  for (int64_t d = 0; d < indices_rank; ++d) {
    if (d != index_vector_dim) indices_batch.push_back(static_cast<int32_t>(d));
  }
  GatherMap m;
  const int64_t rank = g.rank(v);
  m.operand_dim.assign(rank, -1);
  m.indices_dim.assign(rank, -1);
  size_t next_offset = 0, next_batch = 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (index_of(offset_dims, d) >= 0) {
      if (next_offset >= operand_offset.size()) throw std::invalid_argument("gather offset_dims");
      const int32_t od = operand_offset[next_offset++];
      const bool whole = checked_dim(slice_sizes, od, "gather slice_sizes") == operand_shape[od] &&
                         index_of(start_index_map, od) < 0;
      m.operand_dim[d] = whole ? od : kIllegal;
    } else {
      if (next_batch >= indices_batch.size()) throw std::invalid_argument("gather batch dims");
      const int32_t id = indices_batch[next_batch++];
      m.indices_dim[d] = id;
      const int64_t pair = index_of(indices_batching, id);
      if (pair >= 0) {
        checked_dim(operand_shape, operand_batching[pair], "gather operand_batching");
        m.operand_dim[d] = static_cast<int32_t>(operand_batching[pair]);
      }
    }
  }
  return m;
}

// Whether every mesh axis of size > 1 other than `a` splits something of `s`.
bool others_used(const Strategy& s, size_t a, const Mesh& mesh) {
  for (size_t b = 0; b < mesh.shape.size(); ++b) {
    if (b == a || mesh.shape[b] <= 1) continue;
    if (s.out[b] < 0 && s.ins[0][b] < 0 && s.ins[1][b] < 0) return false;
  }
  return true;
}

NodeStrategies gather_rule(const RuleContext& ctx, int64_t v) {
  const Graph& g = ctx.graph;
  const auto ops = g.operands(v);
  const GatherMap m = gather_map(g, v);
  NodeStrategies ns;
  for (Spec& out : out_specs(ctx, v)) {
    Spec operand = replicated_spec(ctx.mesh), indices = operand;
    bool legal = true;
    for (size_t a = 0; a < out.size() && legal; ++a) {
      if (out[a] < 0) continue;
      legal = m.operand_dim[out[a]] != kIllegal;
      operand[a] = legal ? m.operand_dim[out[a]] : -1;
      indices[a] = m.indices_dim[out[a]];
    }
    if (!legal || !spec_fits(operand, g.shape(ops[0]), ctx.mesh) ||
        !spec_fits(indices, g.shape(ops[1]), ctx.mesh)) {
      continue;
    }
    Strategy s;
    s.compute = compute_cost(ctx, g.numel(v), num_shards(out, ctx.mesh));
    s.name = "gather " + spec_to_string(out, static_cast<int>(g.rank(v)));
    s.out = std::move(out);
    s.ins = {std::move(operand), std::move(indices)};
    ns.list.push_back(std::move(s));
  }
  // Vocab-parallel (Megatron's embedding lookup): the operand split over axis a on a dim it takes
  // one index of (in start_index_map, slice size 1), indices and result whole on a: each device
  // gathers the rows it holds, the others masked to zero, and the partial results are all-reduced
  // over a (XLA's SPMD partitioner lowers a gather so). Only on a strategy that leaves a alone of
  // the mesh axes (the others split the batch or the hidden dim, as Megatron's data x tensor
  // parallel layout): a lookup replicated over another axis is dominated, and every free axis
  // would multiply the strategies (a 2x2x2 GPT's ILP: 25% more columns).
  const GatherAttrs attrs = decode_gather_attrs(g.node_attrs(v));
  const auto operand_shape = g.shape(ops[0]);
  const size_t num_base = ns.list.size();
  for (int64_t d : attrs.start_index_map) {
    if (checked_dim(attrs.slice_sizes, d, "gather slice_sizes") != 1) continue;
    for (size_t a = 0; a < ctx.mesh.shape.size(); ++a) {
      if (ctx.mesh.shape[a] <= 1) continue;
      const int axis[1] = {static_cast<int>(a)};
      for (size_t k = 0; k < num_base; ++k) {
        const Strategy& base = ns.list[k];
        if (base.out[a] >= 0 || base.ins[0][a] >= 0 || base.ins[1][a] >= 0) continue;
        if (!others_used(base, a, ctx.mesh)) continue;
        Spec operand = base.ins[0];
        operand[a] = static_cast<int32_t>(d);
        if (!spec_fits(operand, operand_shape, ctx.mesh)) continue;
        Strategy s = base;
        s.ins[0] = std::move(operand);
        s.comm += partial_sum_all_reduce(ctx, v, bytes_per_device(ctx, v, s.out), axis);
        s.name += " vocab-split";
        ns.list.push_back(std::move(s));
      }
    }
  }
  ns.leader_weight = static_cast<int64_t>(num_base);
  return ns;
}

}  // namespace

void register_gather_rule() { set_builtin_rule(OpKind::kGather, gather_rule); }

}  // namespace alpa::rules
