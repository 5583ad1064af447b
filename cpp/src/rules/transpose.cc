// TRANSPOSE (attrs = permutation: result dim i = operand dim perm[i]): with merge_followers it
// follows its operand (result spec = the leader's spec, permuted); otherwise it enumerates result
// specs and asks for the matching operand spec.
#include "rules.h"

namespace alpa::rules {
namespace {

NodeStrategies transpose_rule(const RuleContext& ctx, int64_t v) {
  const int64_t u = ctx.graph.operands(v)[0];
  const Dims perm = decode_transpose_attrs(ctx.graph.node_attrs(v)).permutation;
  NodeStrategies ns;
  if (ctx.options.merge_followers) {
    ns.follow = u;
    ns.list.reserve(ctx.done[u].list.size());
    for (const Strategy& lead : ctx.done[u].list) {
      Spec out = lead.out;
      for (int32_t& d : out) {
        if (d >= 0) d = static_cast<int32_t>(index_of(perm, d));
      }
      ns.list.push_back(unary_strategy(ctx, v, "transpose", lead.out, std::move(out)));
    }
    return ns;
  }
  for (Spec& out : out_specs(ctx, v)) {
    Spec in = out;
    for (int32_t& d : in) {
      if (d >= 0) d = static_cast<int32_t>(perm[d]);
    }
    ns.list.push_back(unary_strategy(ctx, v, "transpose", std::move(in), std::move(out)));
  }
  return ns;
}

}  // namespace

void register_transpose_rule() { set_builtin_rule(OpKind::kTranspose, transpose_rule); }

}  // namespace alpa::rules
