// RESHAPE. The two shapes are cut into groups of consecutive dims with equal products; a split of
// the major-most non-unit result dim of a group keeps the same elements per device as a split of
// the group's major-most non-unit operand dim, if both dims divide by the shard count.
//
// Without merge_followers: any result spec; a split that maps needs the operand split alike, any
// other split needs the operand replicated on its axes (the resharding edge pays an all-gather).
// With merge_followers: the node follows its operand; strategy k keeps the operand's k-th spec,
// maps what maps, and all-gathers the rest inside the op (comm). As consumers slice further splits
// for free, this loses nothing in the cost model and keeps reshapes out of the ILP.
#include <stdexcept>

#include "rules.h"

namespace alpa::rules {
namespace {

// For each result dim: the operand dim its split maps to, or -1.
std::vector<int32_t> map_result_dims(std::span<const int64_t> in, std::span<const int64_t> out) {
  const size_t nin = in.size(), nout = out.size();
  std::vector<int32_t> out_to_in(nout, -1);
  size_t i = 0, o = 0;
  while (i < nin && o < nout) {
    const size_t i0 = i, o0 = o;
    int64_t pi = in[i++], po = out[o++];
    while (pi != po) {
      if (pi < po && i < nin) {
        pi *= in[i++];
      } else if (po < pi && o < nout) {
        po *= out[o++];
      } else {
        break;  // inconsistent shapes (or zero-size dims): stop mapping
      }
    }
    if (pi != po) break;
    size_t first_in = i0, first_out = o0;
    while (first_in + 1 < i && in[first_in] == 1) ++first_in;
    while (first_out + 1 < o && out[first_out] == 1) ++first_out;
    if (in[first_in] > 1 && out[first_out] > 1) {
      out_to_in[first_out] = static_cast<int32_t>(first_in);
    }
  }
  return out_to_in;
}

NodeStrategies follow_operand(const RuleContext& ctx, int64_t v, int64_t u,
                              const std::vector<int32_t>& out_to_in) {
  const Graph& g = ctx.graph;
  const auto in_shape = g.shape(u), out_shape = g.shape(v);
  std::vector<int32_t> in_to_out(in_shape.size(), -1);
  for (size_t o = 0; o < out_to_in.size(); ++o) {
    if (out_to_in[o] >= 0) in_to_out[out_to_in[o]] = static_cast<int32_t>(o);
  }
  NodeStrategies ns;
  ns.follow = u;
  ns.list.reserve(ctx.done[u].list.size());
  for (const Strategy& lead : ctx.done[u].list) {
    Spec kept = lead.out, out = replicated_spec(ctx.mesh);
    for (size_t a = 0; a < kept.size(); ++a) {
      if (kept[a] < 0) continue;
      const int32_t o = in_to_out[kept[a]];
      if (o >= 0 && out_shape[o] % shards_of_dim(lead.out, kept[a], ctx.mesh) == 0) {
        out[a] = o;
      } else {
        kept[a] = -1;
      }
    }
    const double gather = reshard_cost(ctx.mesh, in_shape, g.dtype_bytes[u], lead.out, kept);
    ns.list.push_back(unary_strategy(ctx, v, "reshape", lead.out, std::move(out), gather));
  }
  return ns;
}

NodeStrategies reshape_rule(const RuleContext& ctx, int64_t v) {
  const Graph& g = ctx.graph;
  if (g.operands(v).size() != 1) {
    throw std::invalid_argument("reshape node " + std::to_string(v) + " needs exactly 1 operand");
  }
  const int64_t u = g.operands(v)[0];
  const auto in_shape = g.shape(u);
  const std::vector<int32_t> out_to_in = map_result_dims(in_shape, g.shape(v));
  if (ctx.options.merge_followers) return follow_operand(ctx, v, u, out_to_in);
  NodeStrategies ns;
  for (Spec& out : out_specs(ctx, v)) {
    Spec in = replicated_spec(ctx.mesh);
    for (size_t a = 0; a < out.size(); ++a) {
      if (out[a] < 0 || out_to_in[out[a]] < 0) continue;
      const int32_t d = out_to_in[out[a]];
      if (in_shape[d] % shards_of_dim(out, out[a], ctx.mesh) == 0) in[a] = d;
    }
    ns.list.push_back(unary_strategy(ctx, v, "reshape", std::move(in), std::move(out), 0.0));
  }
  return ns;
}

}  // namespace

void register_reshape_rule() { set_builtin_rule(OpKind::kReshape, reshape_rule); }

}  // namespace alpa::rules
