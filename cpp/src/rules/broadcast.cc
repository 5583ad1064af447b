// BROADCAST (attrs = broadcast_dimensions: operand dim i -> result dim attrs[i]).
//
// With merge_followers it follows its operand: strategy k keeps the operand in its k-th spec and
// splits the result dims those operand dims map to. This loses nothing in the cost model: a
// consumer that wants more splits slices them locally for free (replicated -> split costs 0), and
// it keeps broadcasts (hundreds in a transformer step, often of constants) out of the ILP.
// Otherwise it enumerates result specs; the operand is split where it maps to a split result dim
// of the same size, else replicated.
#include "rules.h"

namespace alpa::rules {
namespace {

NodeStrategies follow_operand(const RuleContext& ctx, int64_t v, int64_t u) {
  const Dims dims = decode_broadcast_attrs(ctx.graph.node_attrs(v)).broadcast_dims;
  NodeStrategies ns;
  ns.follow = u;
  ns.list.reserve(ctx.done[u].list.size());
  for (const Strategy& lead : ctx.done[u].list) {
    Spec out = lead.out;
    for (int32_t& d : out) {
      if (d >= 0) d = static_cast<int32_t>(dims[d]);
    }
    ns.list.push_back(unary_strategy(ctx, v, "broadcast", lead.out, std::move(out)));
  }
  return ns;
}

NodeStrategies broadcast_rule(const RuleContext& ctx, int64_t v) {
  const Graph& g = ctx.graph;
  const int64_t u = g.operands(v)[0];
  if (ctx.options.merge_followers) return follow_operand(ctx, v, u);
  const Dims dims = decode_broadcast_attrs(g.node_attrs(v)).broadcast_dims;
  const auto in_shape = g.shape(u), out_shape = g.shape(v);
  NodeStrategies ns;
  for (Spec& out : out_specs(ctx, v)) {
    Spec in = replicated_spec(ctx.mesh);
    for (size_t a = 0; a < out.size(); ++a) {
      if (out[a] < 0) continue;
      const int64_t i = index_of(dims, out[a]);
      if (i >= 0 && in_shape[i] == out_shape[out[a]]) in[a] = static_cast<int32_t>(i);
    }
    ns.list.push_back(unary_strategy(ctx, v, "broadcast", std::move(in), std::move(out)));
  }
  return ns;
}

}  // namespace

void register_broadcast_rule() { set_builtin_rule(OpKind::kBroadcast, broadcast_rule); }

}  // namespace alpa::rules
