// REDUCE (attrs = reduced dims; operands [input, init]): the input takes any spec (with
// merge_followers: the spec of the input's strategy k, and the node follows the input); the result
// spec drops the reduced dims and renumbers the rest; each mesh axis that splits a reduced dim
// holds partial results, all-reduced over that axis. The init scalar is replicated.
#include "rules.h"

namespace alpa::rules {
namespace {

Strategy make(const RuleContext& ctx, int64_t v, const Spec& in) {
  const Graph& g = ctx.graph;
  const Dims reduced = decode_reduce_attrs(g.node_attrs(v)).reduced_dims;
  const int64_t input = g.operands(v)[0];
  Spec out = replicated_spec(ctx.mesh);
  std::vector<int> partial_axes;
  for (size_t a = 0; a < in.size(); ++a) {
    if (in[a] < 0) continue;
    if (index_of(reduced, in[a]) >= 0) {
      partial_axes.push_back(static_cast<int>(a));
      continue;
    }
    int32_t d = in[a];
    for (int64_t r : reduced) d -= (r < in[a]) ? 1 : 0;
    out[a] = d;
  }
  Strategy s;
  s.comm += partial_sum_all_reduce(ctx, v, bytes_per_device(ctx, v, out), partial_axes);
  s.compute = compute_cost(ctx, g.numel(input), num_shards(in, ctx.mesh));
  s.name = "reduce " + spec_to_string(in, static_cast<int>(g.rank(input))) + "->" +
           spec_to_string(out, static_cast<int>(g.rank(v)));
  s.out = std::move(out);
  s.ins.assign(g.operands(v).size(), replicated_spec(ctx.mesh));
  s.ins[0] = in;
  return s;
}

NodeStrategies reduce_rule(const RuleContext& ctx, int64_t v) {
  const int64_t input = ctx.graph.operands(v)[0];
  NodeStrategies ns;
  if (ctx.options.merge_followers) {
    ns.follow = input;
    ns.list.reserve(ctx.done[input].list.size());
    for (const Strategy& lead : ctx.done[input].list) ns.list.push_back(make(ctx, v, lead.out));
    return ns;
  }
  for (const Spec& in : enumerate_specs(ctx.graph.shape(input), ctx.mesh)) {
    ns.list.push_back(make(ctx, v, in));
  }
  return ns;
}

}  // namespace

void register_reduce_rule() { set_builtin_rule(OpKind::kReduce, reduce_rule); }

}  // namespace alpa::rules
