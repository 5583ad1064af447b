// ELEMENTWISE (attrs = unshardable dims): operands of the result's rank take the result's spec,
// rank-0 operands are replicated. With merge_followers, a node with no unshardable dims whose
// operands all have the result's shape (or rank 0) follows one operand; otherwise it enumerates
// its own specs, never splitting an unshardable dim.
#include <algorithm>
#include <tuple>

#include "rules.h"

namespace alpa::rules {
namespace {

bool same_shape(const Graph& g, int64_t a, int64_t b) {
  const auto sa = g.shape(a), sb = g.shape(b);
  return std::equal(sa.begin(), sa.end(), sb.begin(), sb.end());
}

// Whether u's merged group is rooted at an entry argument (u, or the leader it follows through
// any chain, is a PARAMETER): an optimizer moment `b * mu`, a parameter itself.
bool parameter_rooted(const RuleContext& ctx, int64_t u) {
  while (ctx.done[u].follow >= 0) u = ctx.done[u].follow;
  return ctx.graph.op_kind(u) == OpKind::kParameter;
}

// The strategies of u (of the leader of u's merged group: a follower copies its list 1:1) that
// count for following it: NodeStrategies::leader_weight.
int64_t leader_weight(const RuleContext& ctx, int64_t u) {
  while (ctx.done[u].follow >= 0) u = ctx.done[u].follow;
  const NodeStrategies& ns = ctx.done[u];
  return ns.leader_weight >= 0 ? ns.leader_weight : static_cast<int64_t>(ns.list.size());
}

// Whether following u limits a node to the specs of a smaller tensor: u's merged group runs
// through a BROADCAST that makes a dim (of size > 1) its operand does not have, a dim no strategy of
// the group can split. (jax.vmap(init) over 8 seeds: threefry's `counts + key`, both broadcast, the
// counts [64, 64] to [8, 64, 64]; the add followed the counts, and with it the whole init, the
// training loops' carries and every weight of the 8 runs could not split the seed dim: 2x4 planned
// 5.9e6 where splitting the seeds costs nothing.)
bool narrowed_by_broadcast(const RuleContext& ctx, int64_t u) {
  const Graph& g = ctx.graph;
  for (; u >= 0; u = ctx.done[u].follow) {
    if (g.op_kind(u) != OpKind::kBroadcast) continue;
    const Dims dims = decode_broadcast_attrs(g.node_attrs(u)).broadcast_dims;
    const auto in = g.shape(g.operands(u)[0]), out = g.shape(u);
    std::vector<bool> mapped(out.size(), false);
    for (size_t i = 0; i < dims.size(); ++i) {
      if (in[i] == out[dims[i]]) mapped[dims[i]] = true;
    }
    for (size_t d = 0; d < out.size(); ++d) {
      if (!mapped[d] && out[d] > 1) return true;
    }
  }
  return false;
}

// The operand to follow, or -1. Candidates have the result's exact shape and more than one
// strategy, and their groups can split every dim of it (not narrowed_by_broadcast); preferred in
// order: not a BROADCAST, not a PARAMETER, most strategies (leader_weight); among equals, one whose
// group is not rooted at a parameter, then the LAST operand.
//
// The tie-break decides whole chains, so it is measured, not cosmetic (merged optima, unit costs):
// - a residual add `x + proj(h)` follows the branch just computed, not the stream: with the first
//   operand the residual stream (and its gradient) of every layer is one group, one layout for all
//   layers, and the unrolled GPT on 2x4 was 8% above this rule (119299 vs 110338), its scanned twin
//   (one body, so no cross-layer chain) 9% cheaper than it; GPT 1.3B on 8x8 compiled to 10687 MiB
//   of collectives per device, 9827 with this rule (data parallelism: 10666);
// - Adam's `(1 - b1) * g + b1 * mu` follows the gradient, not the moment read from the state (the
//   state is resharded into the gradient's layout where they differ): following the moment put the
//   tied 4-layer MLP on 2x4 9% above this rule (11096 vs 10157). The first-operand rule is the
//   cheapest on that MLP (9592); a small problem like it is refined unmerged anyway (8115).
int64_t pick_leader(const RuleContext& ctx, int64_t v) {
  const Graph& g = ctx.graph;
  if (!ctx.options.merge_followers) return -1;
  if (!decode_elementwise_attrs(g.node_attrs(v)).unshardable_dims.empty()) return -1;
  int64_t best = -1;
  std::tuple<bool, bool, int64_t> best_key;
  for (int64_t u : g.operands(v)) {
    if (g.rank(u) == 0) continue;
    if (!same_shape(g, u, v)) return -1;  // slice, pad, concatenate: not 1:1
    if (single_strategy(ctx, u) || narrowed_by_broadcast(ctx, u)) continue;
    const std::tuple<bool, bool, int64_t> key{g.op_kind(u) == OpKind::kBroadcast,
                                              g.op_kind(u) == OpKind::kParameter,
                                              -leader_weight(ctx, u)};
    if (best < 0 || key < best_key ||
        (key == best_key && parameter_rooted(ctx, u) <= parameter_rooted(ctx, best))) {
      best = u;
      best_key = key;
    }
  }
  return best;
}

// Operand specs for result spec `out`: same spec for same-rank operands, except axes splitting a
// dim where the operand's size differs (replicated there); rank-0 and other ranks replicated,
// except on the leading `batch_dims` dims (attrs -2, k), which operands of any rank >= k share.
std::vector<Spec> operand_specs(const RuleContext& ctx, int64_t v, const Spec& out) {
  const Graph& g = ctx.graph;
  const auto out_shape = g.shape(v);
  const int64_t batch = decode_elementwise_attrs(g.node_attrs(v)).batch_dims;
  std::vector<Spec> ins;
  ins.reserve(g.operands(v).size());
  for (int64_t u : g.operands(v)) {
    Spec s = replicated_spec(ctx.mesh);
    if (g.rank(u) == g.rank(v) || (batch > 0 && g.rank(u) >= batch)) {
      const auto shape = g.shape(u);
      const int64_t shared = g.rank(u) == g.rank(v) ? g.rank(v) : batch;
      for (size_t a = 0; a < out.size(); ++a) {
        if (out[a] >= 0 && out[a] < shared && shape[out[a]] == out_shape[out[a]]) s[a] = out[a];
      }
    }
    ins.push_back(std::move(s));
  }
  return ins;
}

Strategy make(const RuleContext& ctx, int64_t v, const Spec& out) {
  Strategy s;
  s.out = out;
  s.ins = operand_specs(ctx, v, out);
  s.compute = compute_cost(ctx, ctx.graph.numel(v), num_shards(out, ctx.mesh));
  s.name = "elementwise " + spec_to_string(out, static_cast<int>(ctx.graph.rank(v)));
  return s;
}

bool splits_any(const Spec& spec, std::span<const int64_t> dims) {
  for (int32_t d : spec) {
    if (d >= 0 && index_of(dims, d) >= 0) return true;
  }
  return false;
}

NodeStrategies elementwise_rule(const RuleContext& ctx, int64_t v) {
  NodeStrategies ns;
  const int64_t leader = pick_leader(ctx, v);
  if (leader >= 0) {
    ns.follow = leader;
    ns.list.reserve(ctx.done[leader].list.size());
    for (const Strategy& lead : ctx.done[leader].list) ns.list.push_back(make(ctx, v, lead.out));
    return ns;
  }
  const Dims unshardable = decode_elementwise_attrs(ctx.graph.node_attrs(v)).unshardable_dims;
  for (const Spec& spec : out_specs(ctx, v)) {
    if (!splits_any(spec, unshardable)) ns.list.push_back(make(ctx, v, spec));
  }
  return ns;
}

}  // namespace

void register_elementwise_rule() { set_builtin_rule(OpKind::kElementwise, elementwise_rule); }

}  // namespace alpa::rules
