// Whole-graph assembly (see problem.h): strategies per node in topological order (less the splits
// unsafe_splits.h removes), followers merged into their leader's ILP group, repeated layers'
// groups merged (repeat.h), resharding costs accumulated per pair of groups, ties turned into
// equalities, the memory model (and budget rows), then build_ilp. Cost: one reshard_cost call per
// (distinct producer spec, distinct consumer spec) per graph edge, i.e. O(E * S^2) with S the
// number of strategies (tens); everything else is linear.
#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "alpa/problem.h"
#include "alpa/spec.h"
#include "alpa/unsafe_splits.h"

namespace alpa {
namespace {

std::string node_label(const Graph& g, int64_t v) {
  return "node " + std::to_string(v) + " (" + op_kind_name(g.op_kind(v)) + ")";
}

// Throws std::logic_error if a rule broke the NodeStrategies contract for node v.
void check_rule_output(const Graph& g, const Mesh& mesh, const std::vector<NodeStrategies>& nodes,
                       int64_t v) {
  const NodeStrategies& ns = nodes[v];
  const size_t num_ops = g.operands(v).size();
  auto fail = [&](const std::string& what) {
    throw std::logic_error("strategy rule for " + node_label(g, v) + ": " + what);
  };
  if (ns.list.empty()) fail("no strategies");
  if (ns.follow >= 0) {
    if (ns.follow >= v) fail("follows a later node");
    if (ns.list.size() != nodes[ns.follow].list.size()) fail("follower length differs from leader");
  }
  for (const Strategy& s : ns.list) {
    if (s.out.size() != static_cast<size_t>(mesh.ndim()) || s.ins.size() != num_ops) {
      fail("strategy '" + s.name + "' has wrong spec or operand count");
    }
  }
}

// Distinct specs of a list, and for each entry the index of its distinct spec.
struct SpecIndex {
  std::vector<const Spec*> unique;
  std::vector<int32_t> of;
};

template <typename GetSpec>
SpecIndex index_specs(size_t n, GetSpec get) {
  SpecIndex idx;
  idx.of.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const Spec& s = get(i);
    size_t k = 0;
    while (k < idx.unique.size() && *idx.unique[k] != s) ++k;
    if (k == idx.unique.size()) idx.unique.push_back(&s);
    idx.of.push_back(static_cast<int32_t>(k));
  }
  return idx;
}

struct Assembler {
  const Graph& g;
  const Mesh& mesh;
  ShardingProblem& p;
  const std::vector<double>& weights;       // empty or one cost factor per node
  const std::vector<double>& comm_weights;  // empty or one factor per node for its own comm
  std::vector<std::vector<double>> group_costs;
  std::vector<IlpEdge> edges;
  std::unordered_map<uint64_t, size_t> edge_of_pair;  // (lo group << 32 | hi group) -> edge

  double weight(int64_t v) const { return weights.empty() ? 1.0 : weights[v]; }
  double comm_weight(int64_t v) const { return comm_weights.empty() ? weight(v) : comm_weights[v]; }

  void add_group_costs() {
    for (int64_t v = 0; v < g.num_nodes(); ++v) {
      std::vector<double>& cost = group_costs[p.node_group[v]];
      const auto& list = p.nodes[v].list;
      const double w = weight(v), wc = comm_weight(v);
      for (size_t k = 0; k < list.size(); ++k) cost[k] += w * list[k].compute + wc * list[k].comm;
    }
  }

  // Adds the resharding cost of operand t of node v (producer u) to the pair of groups.
  void add_operand_edge(int64_t v, size_t t, int64_t u) {
    const auto& su = p.nodes[u].list;
    const auto& sv = p.nodes[v].list;
    const int64_t gu = p.node_group[u], gv = p.node_group[v];
    const SpecIndex iu = index_specs(su.size(), [&](size_t i) -> const Spec& { return su[i].out; });
    const SpecIndex iv =
        index_specs(sv.size(), [&](size_t j) -> const Spec& { return sv[j].ins[t]; });
    const auto shape = g.shape(u);
    const double elem = g.dtype_bytes[u];
    std::vector<double> r(iu.unique.size() * iv.unique.size());
    for (size_t a = 0; a < iu.unique.size(); ++a) {
      for (size_t b = 0; b < iv.unique.size(); ++b) {
        r[a * iv.unique.size() + b] =
            weight(v) * reshard_cost(mesh, shape, elem, *iu.unique[a], *iv.unique[b]);
      }
    }
    auto cost = [&](size_t i, size_t j) { return r[iu.of[i] * iv.unique.size() + iv.of[j]]; };
    if (gu == gv) {  // same group: strategy k of u meets strategy k of v
      for (size_t k = 0; k < su.size(); ++k) group_costs[gu][k] += cost(k, k);
      return;
    }
    IlpEdge& e = edge_for(gu, gv);
    const bool flipped = gu > gv;  // edges are stored with u < v
    const size_t cols = flipped ? su.size() : sv.size();
    for (size_t i = 0; i < su.size(); ++i) {
      for (size_t j = 0; j < sv.size(); ++j) {
        e.cost[flipped ? j * cols + i : i * cols + j] += cost(i, j);
      }
    }
  }

  IlpEdge& edge_for(int64_t a, int64_t b) {
    const int64_t lo = std::min(a, b), hi = std::max(a, b);
    const uint64_t key = (static_cast<uint64_t>(lo) << 32) | static_cast<uint64_t>(hi);
    auto [it, inserted] = edge_of_pair.try_emplace(key, edges.size());
    if (inserted) {
      IlpEdge e;
      e.u = lo;
      e.v = hi;
      e.cost.assign(group_costs[lo].size() * group_costs[hi].size(), 0.0);
      edges.push_back(std::move(e));
    }
    return edges[it->second];
  }
};

std::vector<IlpEquality> tie_equalities(const Graph& g, const ShardingProblem& p,
                                        const std::vector<std::pair<int64_t, int64_t>>& ties) {
  std::vector<IlpEquality> eqs;
  eqs.reserve(ties.size());
  for (const auto& [a, b] : ties) {
    if (a < 0 || b < 0 || a >= g.num_nodes() || b >= g.num_nodes()) {
      throw std::invalid_argument("tie (" + std::to_string(a) + ", " + std::to_string(b) +
                                  ") names a node outside the graph of " +
                                  std::to_string(g.num_nodes()) + " nodes");
    }
    const auto& sa = p.nodes[a].list;
    const auto& sb = p.nodes[b].list;
    IlpEquality eq;
    eq.u = p.node_group[a];
    eq.v = p.node_group[b];
    eq.match.assign(sa.size(), -1);
    for (size_t i = 0; i < sa.size(); ++i) {
      if (i < sb.size() && sb[i].out == sa[i].out) {  // prefer the same index (same group)
        eq.match[i] = static_cast<int64_t>(i);
        continue;
      }
      for (size_t j = 0; j < sb.size() && eq.match[i] < 0; ++j) {
        if (sb[j].out == sa[i].out) eq.match[i] = static_cast<int64_t>(j);
      }
    }
    eqs.push_back(std::move(eq));
  }
  return eqs;
}

// One self-equality per pinned node: strategies whose out spec differs from the pin (on mesh axes
// of size > 1) are forbidden. A pin entry kAnyDim (-2) leaves that mesh axis free.
std::vector<IlpEquality> pin_equalities(const Graph& g, const Mesh& mesh, const ShardingProblem& p,
                                        const std::vector<std::pair<int64_t, Spec>>& pinned) {
  std::vector<IlpEquality> eqs;
  for (const auto& [v, want] : pinned) {
    if (v < 0 || v >= g.num_nodes() || static_cast<int64_t>(want.size()) != mesh.ndim()) {
      throw std::invalid_argument("pin of node " + std::to_string(v) + ": needs a node of the graph (" +
                                  std::to_string(g.num_nodes()) + " nodes) and one entry per mesh axis (" +
                                  std::to_string(mesh.ndim()) + ")");
    }
    const auto& list = p.nodes[v].list;
    IlpEquality eq;
    eq.u = eq.v = p.node_group[v];
    eq.match.assign(list.size(), -1);
    std::string have;
    for (size_t i = 0; i < list.size(); ++i) {
      bool same = true;
      for (int a = 0; a < mesh.ndim(); ++a) {
        if (mesh.shape[a] > 1 && want[a] != kAnyDim && list[i].out[a] != want[a]) same = false;
      }
      if (same) eq.match[i] = static_cast<int64_t>(i);
      have += (i ? ", " : "") + spec_to_string(list[i].out, static_cast<int>(g.shape(v).size()));
    }
    if (std::all_of(eq.match.begin(), eq.match.end(), [](int64_t m) { return m < 0; })) {
      throw std::invalid_argument("cannot pin " + node_label(g, v) + " to spec " +  // (free axes: R)
                                  spec_to_string(want, static_cast<int>(g.shape(v).size())) +
                                  ": its strategies produce only " + have);
    }
    eqs.push_back(std::move(eq));
  }
  return eqs;
}

// One self-equality per ILP group that reads a `pinned_uses` node: the group's strategies that read
// such an operand in another spec than its pin (on mesh axes of size > 1) are forbidden. A group
// with no strategy left is not restricted; its reading nodes go to p.unpinned_uses.
std::vector<IlpEquality> use_pin_equalities(const Graph& g, const Mesh& mesh, ShardingProblem& p,
                                            const std::vector<std::pair<int64_t, Spec>>& pinned,
                                            const std::vector<int64_t>& pinned_uses) {
  std::map<int64_t, Spec> want;
  for (int64_t u : pinned_uses) {
    auto it = std::find_if(pinned.begin(), pinned.end(), [u](const auto& pin) { return pin.first == u; });
    if (it == pinned.end()) {
      throw std::invalid_argument("pinned use of node " + std::to_string(u) + ": the node is not pinned");
    }
    want[u] = it->second;
  }
  std::map<int64_t, std::vector<char>> allowed;  // group -> strategies kept
  std::map<int64_t, std::vector<int64_t>> readers;
  for (int64_t v = 0; v < g.num_nodes() && !want.empty(); ++v) {
    const auto ops = g.operands(v);
    const auto& list = p.nodes[v].list;
    for (size_t t = 0; t < ops.size(); ++t) {
      auto w = want.find(ops[t]);
      if (w == want.end()) continue;
      auto& keep = allowed.try_emplace(p.node_group[v], list.size(), 1).first->second;
      for (size_t i = 0; i < list.size() && i < keep.size(); ++i) {
        if (t >= list[i].ins.size()) continue;
        for (int a = 0; a < mesh.ndim(); ++a) {
          if (mesh.shape[a] > 1 && list[i].ins[t][a] != w->second[a]) keep[i] = 0;
        }
      }
      readers[p.node_group[v]].push_back(v);
    }
  }
  std::vector<IlpEquality> eqs;
  for (const auto& [group, keep] : allowed) {
    if (std::none_of(keep.begin(), keep.end(), [](char k) { return k != 0; })) {
      for (int64_t v : readers[group]) p.unpinned_uses.push_back(v);
      continue;
    }
    IlpEquality eq;
    eq.u = eq.v = group;
    eq.match.assign(keep.size(), -1);
    for (size_t i = 0; i < keep.size(); ++i) {
      if (keep[i]) eq.match[i] = static_cast<int64_t>(i);
    }
    eqs.push_back(std::move(eq));
  }
  std::sort(p.unpinned_uses.begin(), p.unpinned_uses.end());
  return eqs;
}

}  // namespace

ShardingProblem build_sharding_problem(const Graph& graph, const Mesh& mesh,
                                       const CoreOptions& options,
                                       const std::vector<std::pair<int64_t, int64_t>>& ties,
                                       const std::vector<int64_t>& donated_args,
                                       const std::vector<std::pair<int64_t, Spec>>& pinned,
                                       const std::vector<int64_t>& pinned_uses,
                                       const std::vector<double>& node_weights,
                                       const std::vector<double>& comm_weights,
                                       const std::vector<CopyRange>& copies) {
  graph.validate();
  mesh.validate();
  const int64_t n = graph.num_nodes();
  for (const auto* ws : {&node_weights, &comm_weights}) {
    const std::string what = ws == &node_weights ? "node_weights" : "comm_weights";
    if (!ws->empty() && static_cast<int64_t>(ws->size()) != n) {
      throw std::invalid_argument(what + " has " + std::to_string(ws->size()) +
                                  " entries for a graph of " + std::to_string(n) + " nodes");
    }
    for (double w : *ws) {
      if (!(w >= 0.0) || !std::isfinite(w)) {
        throw std::invalid_argument(what + " must be finite and >= 0, got " + std::to_string(w));
      }
    }
  }
  ShardingProblem p;
  p.nodes.reserve(n);
  p.node_group.assign(n, -1);
  int64_t num_groups = 0;
  std::vector<size_t> group_size;
  const std::vector<Dims> indexed = runtime_indexed_dims(graph);
  // How often each node's own communication runs per step (the Assembler's comm_weight).
  const std::vector<double>& comm_runs = comm_weights.empty() ? node_weights : comm_weights;
  const std::vector<char> combinable = combinable_reductions(graph, comm_runs);
  const double tiny_heavy = tiny_heavy_flops(graph);
  for (int64_t v = 0; v < n; ++v) {
    const RuleContext ctx{graph, mesh, options, p.nodes, combinable, tiny_heavy};
    p.nodes.push_back(rule_for(graph.op_kind(v))(ctx, v));
    drop_unsafe_splits(ctx, indexed, v, p.nodes.back());
    check_rule_output(graph, mesh, p.nodes, v);
    for (Strategy& st : p.nodes[v].list) st.memory = graph.bytes(v) / static_cast<double>(num_shards(st.out, mesh));
    apply_measured_rates(graph, mesh, options, v, p.nodes[v].list);
    const int64_t leader = p.nodes[v].follow;
    if (leader >= 0) {
      p.node_group[v] = p.node_group[leader];
    } else {
      p.node_group[v] = num_groups++;
      group_size.push_back(p.nodes[v].list.size());
    }
  }
  if (options.tie_repeated_layers) {
    p.repeat = tie_repeated_groups(graph, p.nodes, find_repeats(graph), p.node_group, group_size);
    num_groups = static_cast<int64_t>(group_size.size());
  }
  Assembler as{graph, mesh, p, node_weights, comm_weights, {}, {}, {}};
  as.group_costs.resize(num_groups);
  for (int64_t gi = 0; gi < num_groups; ++gi) as.group_costs[gi].assign(group_size[gi], 0.0);
  as.add_group_costs();
  for (int64_t v = 0; v < n; ++v) {
    const auto ops = graph.operands(v);
    for (size_t t = 0; t < ops.size(); ++t) as.add_operand_edge(v, t, ops[t]);
  }
  std::vector<IlpEquality> eqs = tie_equalities(graph, p, ties);
  for (IlpEquality& eq : pin_equalities(graph, mesh, p, pinned)) eqs.push_back(std::move(eq));
  for (IlpEquality& eq : use_pin_equalities(graph, mesh, p, pinned, pinned_uses)) eqs.push_back(std::move(eq));
  p.memory = build_memory_model(graph, donated_args);
  p.mesh = mesh;
  p.operand_start.assign(1, 0);
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t u : graph.operands(v)) p.operand_ids.push_back(u);
    p.operand_start.push_back(static_cast<int64_t>(p.operand_ids.size()));
    p.value_bytes.push_back(graph.bytes(v));
  }
  p.ilp = build_ilp(std::move(as.group_costs), std::move(as.edges), std::move(eqs));
  if (options.memory_budget_per_device > 0.0) {
    p.memory_rows = make_memory_rows(p.memory, n, options.memory_budget_per_device, completed_copies(p, copies));
    p.num_memory_rows = static_cast<int64_t>(p.memory_rows.points.size());
  }
  return p;
}

namespace {

bool same_layout(const Spec& a, const Spec& b, const Mesh& mesh) {
  for (int ax = 0; ax < mesh.ndim(); ++ax) {
    if (mesh.shape[ax] > 1 && a[ax] != b[ax]) return false;
  }
  return true;
}

// `c` with the bytes of its copy and the consumer strategies that read the operand in its layout.
CopyRange completed(const ShardingProblem& p, CopyRange c) {
  const auto n = static_cast<int64_t>(p.nodes.size());
  if (c.consumer < 0 || c.consumer >= n || c.operand < 0 ||
      c.operand >= p.operand_start[c.consumer + 1] - p.operand_start[c.consumer]) {
    throw std::invalid_argument("copy of operand " + std::to_string(c.operand) + " of node " +
                                std::to_string(c.consumer) + ": no such operand");
  }
  if (static_cast<int>(c.layout.size()) != p.mesh.ndim() || c.start < 0 || c.start > c.end || c.end >= n) {
    throw std::invalid_argument("copy of operand " + std::to_string(c.operand) + " of node " +
                                std::to_string(c.consumer) + ": layout needs " + std::to_string(p.mesh.ndim()) +
                                " entries and 0 <= start <= end < " + std::to_string(n));
  }
  const int64_t u = p.operand_ids[p.operand_start[c.consumer] + c.operand];
  c.bytes = p.value_bytes[u] / static_cast<double>(num_shards(c.layout, p.mesh));
  c.strategies.clear();
  const auto& list = p.nodes[c.consumer].list;
  // a producer in the consumer's group takes the same strategy index: the copy is exact there
  const bool same_group = p.node_group[u] == p.node_group[c.consumer];
  for (size_t k = 0; k < list.size(); ++k) {
    if (!same_layout(list[k].ins[c.operand], c.layout, p.mesh)) continue;
    if (same_group && same_layout(p.nodes[u].list[k].out, c.layout, p.mesh)) continue;
    c.strategies.push_back(static_cast<int64_t>(k));
  }
  return c;
}

}  // namespace

std::vector<CopyRange> completed_copies(const ShardingProblem& p, const std::vector<CopyRange>& copies) {
  std::vector<CopyRange> out;
  out.reserve(copies.size());
  for (const CopyRange& c : copies) out.push_back(completed(p, c));
  return out;
}

std::vector<CopyRange> reshard_copies(const ShardingProblem& p, const std::vector<int64_t>& group_assignment) {
  if (static_cast<int64_t>(group_assignment.size()) != p.ilp.num_groups()) {
    throw std::invalid_argument("assignment has " + std::to_string(group_assignment.size()) +
                                " entries, expected one per group (" +
                                std::to_string(p.ilp.num_groups()) + ")");
  }
  const auto n = static_cast<int64_t>(p.nodes.size());
  auto strategy = [&](int64_t v) -> const Strategy& {
    const int64_t k = group_assignment[p.node_group[v]];
    if (k < 0 || k >= static_cast<int64_t>(p.nodes[v].list.size())) {
      throw std::invalid_argument("assignment has no valid strategy for group " +
                                  std::to_string(p.node_group[v]) + " (node " + std::to_string(v) + ")");
    }
    return p.nodes[v].list[k];
  };
  // (value, layout) -> index of its last CopyRange so far; consumers come in node order
  std::map<std::pair<int64_t, Spec>, size_t> last;
  std::vector<CopyRange> out;
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t t = 0; t < p.operand_start[v + 1] - p.operand_start[v]; ++t) {
      const int64_t u = p.operand_ids[p.operand_start[v] + t];
      if (p.memory.constant[u]) continue;
      const Spec& want = strategy(v).ins[t];
      if (same_layout(strategy(u).out, want, p.mesh)) continue;
      const auto [it, first] = last.try_emplace({u, want}, out.size());
      int64_t start = v;
      if (!first) {
        const int64_t prev = out[it->second].consumer;
        if (prev == v) continue;  // the same consumer reads it twice: one copy
        start = prev + 1;
        it->second = out.size();
      }
      out.push_back(completed(p, CopyRange{v, t, want, start, v, 0.0, {}}));
    }
  }
  return out;
}

CopyCandidates copy_candidates(const ShardingProblem& p, const std::vector<uint8_t>& used, double min_bytes) {
  const int64_t n = static_cast<int64_t>(p.nodes.size());
  const std::vector<int64_t>& gs = p.ilp.group_var_start;
  if (static_cast<int64_t>(used.size()) != p.ilp.num_cols) {
    throw std::invalid_argument("used has " + std::to_string(used.size()) + " entries, expected one per ILP column (" +
                                std::to_string(p.ilp.num_cols) + ")");
  }
  // each value's reads (consumer, operand) in node order; values in the order of their first read
  std::vector<std::vector<std::pair<int64_t, int64_t>>> reads_of(n);
  std::vector<int64_t> order;
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t t = 0; t < p.operand_start[v + 1] - p.operand_start[v]; ++t) {
      const int64_t u = p.operand_ids[p.operand_start[v] + t];
      if (p.memory.constant[u]) continue;
      if (reads_of[u].empty()) order.push_back(u);
      reads_of[u].emplace_back(v, t);
    }
  }
  CopyCandidates out;
  out.reader_start.push_back(0);
  out.read_start.push_back(0);
  out.has_start.push_back(0);
  for (const int64_t u : order) {
    const double size = p.value_bytes[u];
    if (size < min_bytes) continue;  // (no layout makes a copy of it as large)
    // layouts in the order of their first used read; per layout: reader -> its columns
    std::vector<Spec> layouts;
    std::map<Spec, size_t> index;
    std::vector<std::map<int64_t, std::vector<int64_t>>> by_reader;
    for (const auto& [v, t] : reads_of[u]) {
      const int64_t base = gs[p.node_group[v]];
      const auto& list = p.nodes[v].list;
      for (size_t k = 0; k < list.size(); ++k) {
        if (!used[base + static_cast<int64_t>(k)]) continue;
        const Spec& layout = list[k].ins[t];
        const auto [it, fresh] = index.try_emplace(layout, layouts.size());
        if (fresh) {
          layouts.push_back(layout);
          by_reader.emplace_back();
        }
        by_reader[it->second][v].push_back(base + static_cast<int64_t>(k));
      }
    }
    const int64_t ubase = gs[p.node_group[u]];
    const auto& made = p.nodes[u].list;
    for (size_t l = 0; l < layouts.size(); ++l) {
      const Spec& layout = layouts[l];
      const double per_device = size / static_cast<double>(num_shards(layout, p.mesh));
      if (per_device < min_bytes) continue;
      bool always = true;  // every used strategy of the producer makes it
      for (size_t k = 0; k < made.size() && always; ++k) {
        always = made[k].out == layout || !used[ubase + static_cast<int64_t>(k)];
      }
      if (always) continue;
      out.value.push_back(u);
      out.bytes.push_back(per_device);
      for (auto& [v, cols] : by_reader[l]) {
        std::sort(cols.begin(), cols.end());
        cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
        out.readers.push_back(v);
        out.reads.insert(out.reads.end(), cols.begin(), cols.end());
        out.read_start.push_back(static_cast<int64_t>(out.reads.size()));
      }
      out.reader_start.push_back(static_cast<int64_t>(out.readers.size()));
      for (size_t k = 0; k < made.size(); ++k) {
        if (made[k].out == layout) out.has.push_back(ubase + static_cast<int64_t>(k));
      }
      out.has_start.push_back(static_cast<int64_t>(out.has.size()));
    }
  }
  return out;
}

IlpProblem ilp_with_memory_rows(const ShardingProblem& p, const std::vector<int64_t>* which) {
  return build_ilp(p.ilp.group_costs, p.ilp.edges, p.ilp.equalities,
                   materialise_memory_rows(p.memory, p.nodes, p.node_group, p.memory_rows, which));
}

PeakMemory predicted_peak(const ShardingProblem& p, const std::vector<int64_t>& group_assignment) {
  if (static_cast<int64_t>(group_assignment.size()) != p.ilp.num_groups()) {
    throw std::invalid_argument("assignment has " + std::to_string(group_assignment.size()) +
                                " entries, expected one per group (" +
                                std::to_string(p.ilp.num_groups()) + ")");
  }
  return peak_memory(p.memory, p.nodes, p.node_group, group_assignment, reshard_copies(p, group_assignment));
}

}  // namespace alpa
