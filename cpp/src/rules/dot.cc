// DOT (dot_general): each mesh axis may split a batch dim pair, an lhs free dim, an rhs free dim,
// or a contracting dim pair (partial sums, all-reduced), or nothing. Result dims are batch, lhs
// free (in order), rhs free (in order).
#include "rules.h"

namespace alpa::rules {
namespace {

std::vector<int32_t> free_dims(int64_t rank, std::span<const int64_t> batch,
                               std::span<const int64_t> contract) {
  std::vector<int32_t> dims;
  for (int64_t d = 0; d < rank; ++d) {
    if (index_of(batch, d) < 0 && index_of(contract, d) < 0) {
      dims.push_back(static_cast<int32_t>(d));
    }
  }
  return dims;
}

std::vector<AxisRole> dot_roles(const Graph& g, int64_t v) {
  const DotAttrs a = decode_dot_attrs(g.node_attrs(v));
  const Dims &lb = a.lhs_batch, &rb = a.rhs_batch, &lc = a.lhs_contracting, &rc = a.rhs_contracting;
  const auto nb = static_cast<int64_t>(lb.size()), nc = static_cast<int64_t>(lc.size());
  const auto ops = g.operands(v);
  const auto lf = free_dims(g.rank(ops[0]), lb, lc), rf = free_dims(g.rank(ops[1]), rb, rc);
  std::vector<AxisRole> roles;
  int32_t out = 0;
  for (int64_t i = 0; i < nb; ++i, ++out) {
    roles.push_back({static_cast<int32_t>(lb[i]), static_cast<int32_t>(rb[i]), out, false,
                     "b" + std::to_string(i)});
  }
  for (size_t i = 0; i < lf.size(); ++i, ++out) {
    roles.push_back({lf[i], -1, out, false, "lfree" + std::to_string(i)});
  }
  for (size_t i = 0; i < rf.size(); ++i, ++out) {
    roles.push_back({-1, rf[i], out, false, "rfree" + std::to_string(i)});
  }
  for (int64_t i = 0; i < nc; ++i) {
    roles.push_back({static_cast<int32_t>(lc[i]), static_cast<int32_t>(rc[i]), -1, true,
                     "c" + std::to_string(i)});
  }
  return roles;
}

}  // namespace

void register_dot_rule() {
  set_builtin_rule(OpKind::kDot, [](const RuleContext& ctx, int64_t v) {
    return enumerate_role_strategies(ctx, v, dot_roles(ctx.graph, v), "dot");
  });
}

}  // namespace alpa::rules
