// GENERATOR (constant, iota) and OPAQUE (while, custom_call, unknown ops): one replicated strategy
// with every operand replicated.
#include "rules.h"

namespace alpa::rules {

void register_generator_opaque_rules() {
  set_builtin_rule(OpKind::kGenerator, [](const RuleContext& ctx, int64_t v) {
    return single_replicated(ctx, v, "generator R");
  });
  set_builtin_rule(OpKind::kOpaque, [](const RuleContext& ctx, int64_t v) {
    return single_replicated(ctx, v, "opaque R");
  });
}

}  // namespace alpa::rules
