// Helpers shared by the strategy rules (see rules.h).
#include <stdexcept>

#include "rules.h"

namespace alpa::rules {

std::string axis_name(int axis) {
  static const char* kNames[] = {"x", "y", "z", "w"};
  if (axis >= 0 && axis < 4) return kNames[axis];
  return "a" + std::to_string(axis);
}

NodeStrategies single_replicated(const RuleContext& ctx, int64_t v, const std::string& name) {
  Strategy s;
  s.out = replicated_spec(ctx.mesh);
  s.ins.assign(ctx.graph.operands(v).size(), s.out);
  s.compute = compute_cost(ctx, ctx.graph.numel(v), 1);
  s.name = name;
  NodeStrategies ns;
  ns.list.push_back(std::move(s));
  return ns;
}

double bytes_per_device(const RuleContext& ctx, int64_t v, const Spec& spec) {
  return ctx.graph.bytes(v) / static_cast<double>(num_shards(spec, ctx.mesh));
}

std::vector<Spec> out_specs(const RuleContext& ctx, int64_t v) {
  return enumerate_specs(ctx.graph.shape(v), ctx.mesh);
}

std::vector<int> split_axes(const Mesh& mesh) {
  std::vector<int> axes;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (mesh.shape[a] > 1) axes.push_back(a);
  }
  return axes;
}

bool next_choice(std::vector<size_t>& choice, size_t num_options) {
  for (size_t k = choice.size(); k-- > 0;) {
    if (++choice[k] < num_options) return true;
    choice[k] = 0;
  }
  return false;
}

int64_t checked_dim(std::span<const int64_t> shape, int64_t d, const char* what) {
  if (d < 0 || d >= static_cast<int64_t>(shape.size())) {
    throw std::invalid_argument(std::string(what) + " dim " + std::to_string(d) +
                                " out of range for rank " + std::to_string(shape.size()));
  }
  return shape[d];
}

int64_t index_of(std::span<const int64_t> values, int64_t x) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] == x) return static_cast<int64_t>(i);
  }
  return -1;
}

std::string strategy_name(const std::string& op, const std::vector<std::string>& axis_labels) {
  std::string name = op;
  bool any = false;
  for (size_t a = 0; a < axis_labels.size(); ++a) {
    if (axis_labels[a].empty()) continue;
    name += " " + axis_labels[a] + "@" + axis_name(static_cast<int>(a));
    any = true;
  }
  if (!any) name += " R";
  return name;
}

Strategy unary_strategy(const RuleContext& ctx, int64_t v, const char* family, Spec in, Spec out,
                        double comm) {
  Strategy s;
  s.compute = compute_cost(ctx, ctx.graph.numel(v), num_shards(out, ctx.mesh));
  s.comm = comm;
  s.name = std::string(family) + " " + spec_to_string(out, static_cast<int>(ctx.graph.rank(v)));
  s.out = std::move(out);
  s.ins = {std::move(in)};
  return s;
}

}  // namespace alpa::rules
