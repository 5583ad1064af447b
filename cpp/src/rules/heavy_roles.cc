// Strategy enumeration shared by the heavy ops (dot, convolution): see enumerate_role_strategies.
#include "rules.h"

namespace alpa::rules {
namespace {

// choice[k] for the k-th axis of size > 1: 0 = none, r + 1 = roles[r]. Returns false if a split
// does not divide its dim (or a role's groups), or (meshes with >= 3 axes of size > 1) an operand or the result spec is
// not in two blocks (spec.h).
bool build(const RuleContext& ctx, int64_t v, const std::vector<AxisRole>& roles,
           const std::vector<int>& axes, const std::vector<size_t>& choice, const std::string& op,
           Strategy& s) {
  const Graph& g = ctx.graph;
  const auto ops = g.operands(v);
  Spec lhs = replicated_spec(ctx.mesh), rhs = lhs, out = lhs;
  std::vector<std::string> labels(ctx.mesh.ndim());
  std::vector<int64_t> role_devices(roles.size(), 1);
  int64_t devices = 1;
  for (size_t k = 0; k < axes.size(); ++k) {
    if (choice[k] == 0) continue;
    const AxisRole& r = roles[choice[k] - 1];
    const int a = axes[k];
    lhs[a] = r.lhs_dim;
    rhs[a] = r.rhs_dim;
    out[a] = r.out_dim;
    labels[a] = r.label;
    devices *= ctx.mesh.shape[a];
    role_devices[choice[k] - 1] *= ctx.mesh.shape[a];
  }
  for (size_t r = 0; r < roles.size(); ++r) {
    if (roles[r].groups > 0 && roles[r].groups % role_devices[r] != 0) return false;
  }
  if (!spec_fits(lhs, g.shape(ops[0]), ctx.mesh) || !spec_fits(rhs, g.shape(ops[1]), ctx.mesh) ||
      !spec_fits(out, g.shape(v), ctx.mesh) || !spec_in_two_blocks(lhs, ctx.mesh) ||
      !spec_in_two_blocks(rhs, ctx.mesh) || !spec_in_two_blocks(out, ctx.mesh)) {  // >= 3-axis heuristic
    return false;
  }
  std::vector<int> partial;  // reduced by one all-reduce over all of them
  for (size_t k = 0; k < axes.size(); ++k) {
    if (choice[k] > 0 && roles[choice[k] - 1].partial) partial.push_back(axes[k]);
  }
  s.comm = partial_sum_all_reduce(ctx, v, bytes_per_device(ctx, v, out), partial);
  s.compute = compute_cost(ctx, node_flops(g, v), devices);
  s.name = strategy_name(op, labels);
  s.out = std::move(out);
  s.ins.assign(ops.size(), replicated_spec(ctx.mesh));
  s.ins[0] = std::move(lhs);
  s.ins[1] = std::move(rhs);
  return true;
}

}  // namespace

NodeStrategies enumerate_role_strategies(const RuleContext& ctx, int64_t v,
                                         const std::vector<AxisRole>& roles,
                                         const std::string& op) {
  const std::vector<int> axes = split_axes(ctx.mesh);
  std::vector<size_t> choice(axes.size(), 0);
  NodeStrategies all, full;  // full: strategies using every axis of size > 1
  do {
    Strategy s;
    if (!build(ctx, v, roles, axes, choice, op, s)) continue;
    bool uses_all = true;
    for (size_t c : choice) uses_all = uses_all && c > 0;
    if (uses_all) full.list.push_back(s);
    all.list.push_back(std::move(s));
  } while (next_choice(choice, roles.size() + 1));
  if (!ctx.options.allow_replicated_heavy_ops && !full.list.empty() &&
      node_flops(ctx.graph, v) > ctx.tiny_heavy_flops) {
    return full;
  }
  return all;
}

}  // namespace alpa::rules
