// CONVOLUTION: each mesh axis may split the batch (input batch <-> result batch), the output
// features (kernel out-feature <-> result feature) or the input features (input feature <-> kernel
// in-feature: partial sums, all-reduced), or nothing. Spatial dims are never split. Grouped
// convolutions tie features to groups: a depthwise layer (feature_group_count G) may split its
// batch or its groups (input feature <-> kernel out-feature <-> result feature, G / devices whole
// groups per device); its weight gradient (batch_group_count G: the layer's channels are the input
// batch dim, its batch the contracted input feature) may split the contracted dim (partial sums,
// all-reduced: data parallelism) or its groups (input batch <-> kernel out-feature <-> result
// feature). XLA's SPMD partitioner lowers both group splits without communication.
#include "rules.h"

namespace alpa::rules {
namespace {

std::vector<AxisRole> conv_roles(const Graph& g, int64_t v) {
  const ConvAttrs a = decode_conv_attrs(g.node_attrs(v));
  const auto in_batch = static_cast<int32_t>(a.input_batch);
  const auto in_feature = static_cast<int32_t>(a.input_feature);
  const auto k_in = static_cast<int32_t>(a.kernel_input_feature);
  const auto k_out = static_cast<int32_t>(a.kernel_output_feature);
  const auto out_batch = static_cast<int32_t>(a.output_batch);
  const auto out_feature = static_cast<int32_t>(a.output_feature);
  const int64_t feature_groups = a.feature_group_count, batch_groups = a.batch_group_count;
  std::vector<AxisRole> roles;
  if (batch_groups == 1) roles.push_back({in_batch, -1, out_batch, false, "batch"});
  if (feature_groups == 1 && batch_groups == 1) roles.push_back({-1, k_out, out_feature, false, "ofeat"});
  if (feature_groups == 1) roles.push_back({in_feature, k_in, -1, true, "ifeat"});
  if (feature_groups > 1) roles.push_back({in_feature, k_out, out_feature, false, "group", feature_groups});
  if (batch_groups > 1) roles.push_back({in_batch, k_out, out_feature, false, "group", batch_groups});
  return roles;
}

}  // namespace

void register_convolution_rule() {
  set_builtin_rule(OpKind::kConvolution, [](const RuleContext& ctx, int64_t v) {
    return enumerate_role_strategies(ctx, v, conv_roles(ctx.graph, v), "conv");
  });
}

}  // namespace alpa::rules
