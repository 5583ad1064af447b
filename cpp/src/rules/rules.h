// Internal to the strategy rules: shared helpers and the registration hook of each rule file.
// Each rules/*.cc defines one `register_*` function; strategy.cc calls them all once.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "alpa/op_attrs.h"
#include "alpa/strategy.h"

namespace alpa::rules {

void register_parameter_output_rules();
void register_generator_opaque_rules();
void register_elementwise_rule();
void register_broadcast_rule();
void register_transpose_rule();
void register_reshape_rule();
void register_reduce_rule();
void register_dot_rule();
void register_convolution_rule();
void register_gather_rule();
void register_scatter_rule();

// Installs a built-in rule (called only by the register_* functions above, from strategy.cc).
void set_builtin_rule(OpKind kind, RuleFn fn);

// "x", "y", "z", "w", then "a4", "a5", ... (used in strategy names).
std::string axis_name(int axis);

// One strategy: result replicated, every operand replicated, compute = numel * cost per flop.
NodeStrategies single_replicated(const RuleContext& ctx, int64_t v, const std::string& name);
// A one-operand strategy (broadcast, transpose, reshape): operand in `in`, result in `out`,
// elementwise compute, `comm` inside the op; named "<family> <spec>".
Strategy unary_strategy(const RuleContext& ctx, int64_t v, const char* family, Spec in, Spec out,
                        double comm = 0.0);

// Per-device compute cost of `flops` split over `shards` devices.
inline double compute_cost(const RuleContext& ctx, double flops, int64_t shards) {
  return flops / static_cast<double>(shards) * ctx.options.compute_cost_per_flop;
}

// Bytes of v's result held by one device under `spec`.
double bytes_per_device(const RuleContext& ctx, int64_t v, const Spec& spec);

// True if node u has exactly one strategy (generators, tiny nodes, opaque ops).
inline bool single_strategy(const RuleContext& ctx, int64_t u) {
  return ctx.done[u].list.size() <= 1;
}

// Every spec of node v's result shape (enumerate_specs).
std::vector<Spec> out_specs(const RuleContext& ctx, int64_t v);

// Mesh axes of size > 1, ascending.
std::vector<int> split_axes(const Mesh& mesh);

// Odometer over choices[k] in [0, num_options), last position fastest; false once it wraps to 0.
bool next_choice(std::vector<size_t>& choice, size_t num_options);

// shape[d], or std::invalid_argument naming `what` if d is out of range (malformed attrs).
int64_t checked_dim(std::span<const int64_t> shape, int64_t d, const char* what);

// Index of `x` in `values`, or -1.
int64_t index_of(std::span<const int64_t> values, int64_t x);

// Strategy name from per-axis labels: "<op> " + "label@axis" for each non-empty label, or
// "<op> R" when every label is empty.
std::string strategy_name(const std::string& op, const std::vector<std::string>& axis_labels);

// One way a mesh axis may split a two-operand heavy op (dot, convolution): the dim it splits in
// each operand and in the result (-1: not split there); `partial`: contracting, so the result is a
// partial sum all-reduced over the axis.
struct AxisRole {
  int32_t lhs_dim = -1, rhs_dim = -1, out_dim = -1;
  bool partial = false;
  std::string label;  // e.g. "b0", "lfree1", "c0"
  int64_t groups = 0;  // > 0: the devices of the axes taking this role must divide it (conv groups)
};

// Every assignment of each mesh axis of size > 1 to one of `roles` or to none, whose splits divide
// all three shapes, all-replicated first. Unless options.allow_replicated_heavy_ops, assignments
// leaving an axis of size > 1 unused are dropped when some assignment uses every such axis.
// compute = node_flops / (devices used) * compute_cost_per_flop; comm = all-reduce of the
// per-device result over each partial axis. Operands 0 and 1 are lhs and rhs.
NodeStrategies enumerate_role_strategies(const RuleContext& ctx, int64_t v,
                                         const std::vector<AxisRole>& roles, const std::string& op);

}  // namespace alpa::rules
