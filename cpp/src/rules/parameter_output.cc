// PARAMETER: every spec of its shape; holding it costs memory_cost_per_byte per per-device byte
// (a tie-breaker towards split arguments). OUTPUT: follows its operand 1:1.
#include "rules.h"

namespace alpa::rules {
namespace {

NodeStrategies parameter_rule(const RuleContext& ctx, int64_t v) {
  NodeStrategies ns;
  const int rank = static_cast<int>(ctx.graph.rank(v));
  for (Spec& spec : out_specs(ctx, v)) {
    Strategy s;
    s.name = "param " + spec_to_string(spec, rank);
    s.compute = bytes_per_device(ctx, v, spec) * ctx.options.memory_cost_per_byte;
    s.out = std::move(spec);
    ns.list.push_back(std::move(s));
  }
  return ns;
}

// Strategy k requires the operand in the leader's k-th result spec and passes it through.
NodeStrategies output_rule(const RuleContext& ctx, int64_t v) {
  const int64_t u = ctx.graph.operands(v)[0];
  const int rank = static_cast<int>(ctx.graph.rank(v));
  NodeStrategies ns;
  ns.follow = u;
  ns.list.reserve(ctx.done[u].list.size());
  for (const Strategy& lead : ctx.done[u].list) {
    Strategy s;
    s.out = lead.out;
    s.ins = {lead.out};
    s.name = "output " + spec_to_string(lead.out, rank);
    ns.list.push_back(std::move(s));
  }
  return ns;
}

}  // namespace

void register_parameter_output_rules() {
  set_builtin_rule(OpKind::kParameter, parameter_rule);
  set_builtin_rule(OpKind::kOutput, output_rule);
}

}  // namespace alpa::rules
