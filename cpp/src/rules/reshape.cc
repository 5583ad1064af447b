// RESHAPE: any result spec. The two shapes are cut into groups of consecutive dims with equal
// products; a split of the major-most non-unit result dim of a group keeps the same elements per
// device as a split of the group's major-most non-unit operand dim, if that dim divides by the
// shard count. Every other split needs the operand replicated on its axes (the resharding edge
// then pays an all-gather).
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

NodeStrategies reshape_rule(const RuleContext& ctx, int64_t v) {
  const Graph& g = ctx.graph;
  if (g.operands(v).size() != 1) {
    throw std::invalid_argument("reshape node " + std::to_string(v) + " needs exactly 1 operand");
  }
  const auto in_shape = g.shape(g.operands(v)[0]);
  const std::vector<int32_t> out_to_in = map_result_dims(in_shape, g.shape(v));
  NodeStrategies ns;
  for (Spec& out : out_specs(ctx, v)) {
    Spec in = replicated_spec(ctx.mesh);
    for (size_t a = 0; a < out.size(); ++a) {
      if (out[a] < 0 || out_to_in[out[a]] < 0) continue;
      const int32_t d = out_to_in[out[a]];
      if (in_shape[d] % shards_of_dim(out, out[a], ctx.mesh) == 0) in[a] = d;
    }
    Strategy s;
    s.compute = compute_cost(ctx, g.numel(v), num_shards(out, ctx.mesh));
    s.name = "reshape " + spec_to_string(out, static_cast<int>(g.rank(v)));
    s.out = std::move(out);
    s.ins = {std::move(in)};
    ns.list.push_back(std::move(s));
  }
  return ns;
}

}  // namespace

void register_reshape_rule() { set_builtin_rule(OpKind::kReshape, reshape_rule); }

}  // namespace alpa::rules
