// The registry of strategy rules (one per OpKind) and per-node FLOP counts.
//
// The built-in rules (src/rules/*.cc) are registered explicitly the first time the registry is
// touched (no static initialisers), and nothing else may install or replace one. Every rule is
// wrapped so that a node with at most `options.replicate_below_numel` elements gets one replicated
// strategy; OUTPUT nodes are exempt (they always follow their operand), and so are reductions and
// contractions (REDUCE, DOT, CONVOLUTION): their small result comes from large operands, which may
// stay split (the partial results are all-reduced, as their rules price).
#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "alpa/op_attrs.h"
#include "alpa/strategy.h"
#include "rules/rules.h"

namespace alpa {
namespace {

struct Registry {
  std::array<RuleFn, kNumOpKinds> rules;
};

// True if `spec` splits some tensor dim over two or more mesh axes of size > 1.
bool splits_dim_over_axes(const Spec& spec, const Mesh& mesh) {
  for (size_t a = 0; a < spec.size(); ++a) {
    if (spec[a] < 0 || mesh.shape[a] <= 1) continue;
    for (size_t b = a + 1; b < spec.size(); ++b) {
      if (spec[b] == spec[a] && mesh.shape[b] > 1) return true;
    }
  }
  return false;
}

// Without options.allow_mixed_mesh_shape: drop a leader's strategies that split a dim over several
// axes (followers are built 1:1 from their leader's filtered list). Keeps all if none remains.
NodeStrategies drop_mixed(const RuleContext& ctx, NodeStrategies s) {
  if (ctx.options.allow_mixed_mesh_shape || s.follow >= 0) return s;
  std::vector<Strategy> kept;
  for (const Strategy& st : s.list) {
    bool mixed = splits_dim_over_axes(st.out, ctx.mesh);
    for (const Spec& in : st.ins) mixed = mixed || splits_dim_over_axes(in, ctx.mesh);
    if (!mixed) kept.push_back(st);
  }
  if (!kept.empty()) s.list = std::move(kept);
  return s;
}

RuleFn wrap_small_replicated(OpKind kind, RuleFn fn) {
  if (kind == OpKind::kOutput || kind == OpKind::kReduce || kind == OpKind::kDot ||
      kind == OpKind::kConvolution) {
    return [fn = std::move(fn)](const RuleContext& ctx, int64_t v) -> NodeStrategies {
      return drop_mixed(ctx, fn(ctx, v));
    };
  }
  return [fn = std::move(fn)](const RuleContext& ctx, int64_t v) -> NodeStrategies {
    if (ctx.graph.numel(v) <= static_cast<double>(ctx.options.replicate_below_numel)) {
      return rules::single_replicated(ctx, v,
                                      std::string(op_kind_name(ctx.graph.op_kind(v))) + " small R");
    }
    return drop_mixed(ctx, fn(ctx, v));
  };
}

void register_builtin_rules() {
  rules::register_parameter_output_rules();
  rules::register_generator_opaque_rules();
  rules::register_elementwise_rule();
  rules::register_broadcast_rule();
  rules::register_transpose_rule();
  rules::register_reshape_rule();
  rules::register_reduce_rule();
  rules::register_dot_rule();
  rules::register_convolution_rule();
  rules::register_gather_rule();
  rules::register_scatter_rule();
}

// Storage only; never destroyed (rules may be looked up during shutdown).
Registry& storage() {
  static Registry* r = new Registry();
  return *r;
}

// The registry, with the built-ins installed on first use.
const Registry& registry() {
  static const bool builtins_done = [] {
    register_builtin_rules();
    return true;
  }();
  (void)builtins_done;
  return storage();
}

int kind_index(OpKind kind) {
  const int k = static_cast<int>(kind);
  if (k < 0 || k >= kNumOpKinds) {
    throw std::invalid_argument("unknown OpKind " + std::to_string(k));
  }
  return k;
}

double product(std::span<const int64_t> dims) {
  double p = 1.0;
  for (int64_t d : dims) p *= static_cast<double>(d);
  return p;
}

}  // namespace

const RuleFn& rule_for(OpKind kind) {
  const RuleFn& fn = registry().rules[kind_index(kind)];
  if (!fn) {
    throw std::logic_error(std::string("no strategy rule registered for ") + op_kind_name(kind));
  }
  return fn;
}

namespace rules {
void set_builtin_rule(OpKind kind, RuleFn fn) {
  storage().rules[kind_index(kind)] = wrap_small_replicated(kind, std::move(fn));
}
}  // namespace rules

double tiny_heavy_flops(const Graph& g) {
  double most = 0.0;
  for (int64_t v = 0; v < g.num_nodes(); ++v) {
    if (g.op_kind(v) == OpKind::kDot || g.op_kind(v) == OpKind::kConvolution) {
      most = std::max(most, node_flops(g, v));
    }
  }
  return most * kTinyHeavyFraction;
}

double node_flops(const Graph& g, int64_t v) {
  const auto out = g.shape(v);
  if (g.op_kind(v) == OpKind::kDot) {
    const DotAttrs a = decode_dot_attrs(g.node_attrs(v));
    const auto lhs = g.shape(g.operands(v)[0]);
    double contract = 1.0;
    for (int64_t d : a.lhs_contracting) {
      contract *= static_cast<double>(rules::checked_dim(lhs, d, "dot contracting"));
    }
    return 2.0 * product(out) * contract;
  }
  if (g.op_kind(v) == OpKind::kConvolution) {
    const ConvAttrs a = decode_conv_attrs(g.node_attrs(v));
    const auto input = g.shape(g.operands(v)[0]);
    const auto kernel = g.shape(g.operands(v)[1]);
    double window = 1.0;
    for (int64_t d : a.kernel_spatial) {
      window *= static_cast<double>(rules::checked_dim(kernel, d, "conv kernel"));
    }
    const double in_features =
        static_cast<double>(rules::checked_dim(input, a.input_feature, "conv input feature"));
    return 2.0 * product(out) * window * in_features / static_cast<double>(a.feature_group_count);
  }
  return g.numel(v);
}

void apply_measured_rates(const Graph& g, const Mesh& mesh, const CoreOptions& options, int64_t v,
                          std::vector<Strategy>& list) {
  const auto ops = g.operands(v);
  const OpKind kind = g.op_kind(v);
  if (kind != OpKind::kDot && kind != OpKind::kConvolution) return;
  double flop_scale = 1.0;
  if (options.compute_cost_per_flop_half > 0.0 && options.compute_cost_per_flop > 0.0 && !ops.empty() &&
      g.dtype_bytes[ops[0]] == 2) {
    flop_scale = options.compute_cost_per_flop_half / options.compute_cost_per_flop;
  }
  for (Strategy& st : list) {
    st.compute *= flop_scale;
    if (options.compute_cost_per_byte <= 0.0) continue;
    double moved = st.memory;
    for (size_t t = 0; t < ops.size(); ++t) {
      moved += g.bytes(ops[t]) / static_cast<double>(num_shards(st.ins[t], mesh));
    }
    st.compute = std::max(st.compute, moved * options.compute_cost_per_byte);
  }
}

std::vector<char> combinable_reductions(const Graph& g, std::span<const double> weights) {
  const int64_t n = g.num_nodes();
  if (!weights.empty() && static_cast<int64_t>(weights.size()) != n) {
    throw std::invalid_argument("combinable_reductions: " + std::to_string(weights.size()) +
                                " weights for a graph of " + std::to_string(n) + " nodes");
  }
  // feeds_heavy[v]: a DOT or CONVOLUTION is reachable from v's result (operands come first, so
  // one pass from the last node back sees every user of v before v).
  std::vector<char> feeds_heavy(n, 0), out(n, 0);
  for (int64_t v = n - 1; v >= 0; --v) {
    const OpKind k = g.op_kind(v);
    const bool heavy = k == OpKind::kDot || k == OpKind::kConvolution;
    if (heavy || feeds_heavy[v]) {
      for (int64_t u : g.operands(v)) feeds_heavy[u] = 1;
    }
    out[v] = !feeds_heavy[v] && (weights.empty() || weights[v] <= 1.0);
  }
  return out;
}

double partial_sum_all_reduce(const RuleContext& ctx, int64_t v, double bytes,
                              std::span<const int> axes) {
  if (v < static_cast<int64_t>(ctx.combinable.size()) && ctx.combinable[v]) {
    return ctx.mesh.combined_all_reduce(bytes, axes, ctx.options.all_reduce_combine_bytes);
  }
  return ctx.mesh.all_reduce(bytes, axes);
}

}  // namespace alpa
