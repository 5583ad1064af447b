// Liveness of materialised values, maximal live sets, memory-budget rows and the peak of an
// assignment (see memory.h for the counting rule and the live ranges).
//
// Maximal points: the live set only grows at a start, so every point's set is contained in the set
// of the latest start at or before it. Of two consecutive start points t_a < t_b, set(t_a) is
// contained in set(t_b) iff no range ends in [t_a, t_b); otherwise set(t_a) is maximal (the range
// starting at t_a is live at no earlier start, the one ending before t_b at no later one).
#include "alpa/memory.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

#include "alpa/op_attrs.h"

namespace alpa {
namespace {

bool heavy_kind(OpKind k) {
  switch (k) {
    case OpKind::kParameter:
    case OpKind::kDot:
    case OpKind::kConvolution:
    case OpKind::kReduce:
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kOpaque:
      return true;
    default:
      return false;
  }
}

// donated[v] for every PARAMETER node v named by `donated_args`.
std::vector<char> donated_nodes(const Graph& g, const std::vector<int64_t>& donated_args) {
  std::vector<int64_t> node_of_arg;
  for (int64_t v = 0; v < g.num_nodes(); ++v) {
    if (g.op_kind(v) != OpKind::kParameter) continue;
    const int64_t arg = decode_parameter_attrs(g.node_attrs(v)).arg_index;
    if (arg >= static_cast<int64_t>(node_of_arg.size())) node_of_arg.resize(arg + 1, -1);
    node_of_arg[arg] = v;
  }
  std::vector<char> out(g.num_nodes(), 0);
  for (int64_t arg : donated_args) {
    if (arg < 0 || arg >= static_cast<int64_t>(node_of_arg.size()) || node_of_arg[arg] < 0) {
      throw std::invalid_argument("donated argument " + std::to_string(arg) + " is not an argument of " +
                                  "the graph (it has " + std::to_string(node_of_arg.size()) + ")");
    }
    out[node_of_arg[arg]] = 1;
  }
  return out;
}

// Points (ascending) whose live set is maximal, from ranges given by `start` (ascending) and `end`.
std::vector<int64_t> maximal_points(const std::vector<int64_t>& start, const std::vector<int64_t>& end,
                                    int64_t n) {
  std::vector<int64_t> ends_before(n + 1, 0);  // number of range ends at points < t
  for (int64_t e : end) ++ends_before[e + 1];
  std::partial_sum(ends_before.begin(), ends_before.end(), ends_before.begin());
  std::vector<int64_t> points;
  for (size_t i = 0; i < start.size(); ++i) {
    const int64_t t = start[i];
    if (i + 1 < start.size() && start[i + 1] == t) continue;  // one point per distinct start
    const int64_t next = i + 1 < start.size() ? start[i + 1] : n;
    if (next == n || ends_before[next] > ends_before[t]) points.push_back(t);
  }
  return points;
}

// Per node: its distinct consumers, whether an OUTPUT reads it, and whether it is a constant
// expression (a GENERATOR, or a fusible op whose operands all are: XLA folds or recomputes those
// inside their users and never gives them a buffer of their own).
struct UseInfo {
  std::vector<int64_t> consumers;
  std::vector<char> to_output, constant;
};

UseInfo use_info(const Graph& g) {
  const int64_t n = g.num_nodes();
  UseInfo u{std::vector<int64_t>(n, 0), std::vector<char>(n, 0), std::vector<char>(n, 0)};
  std::vector<int64_t> last_reader(n, -1);
  for (int64_t v = 0; v < n; ++v) {
    u.constant[v] = !heavy_kind(g.op_kind(v)) && g.op_kind(v) != OpKind::kOutput;
    for (int64_t x : g.operands(v)) {
      if (last_reader[x] != v) ++u.consumers[x];  // distinct consumers (v's operands come together)
      last_reader[x] = v;
      if (g.op_kind(v) == OpKind::kOutput) u.to_output[x] = 1;
      if (!u.constant[x]) u.constant[v] = 0;
    }
  }
  return u;
}

// read[v]: the last program point at which v's value is read. A materialised consumer reads it at
// its own node; a fused one (not materialised) is recomputed inside each of its consumers, so it
// reads its operands wherever it is itself read. -1 if nothing reads v.
std::vector<int64_t> read_points(const Graph& g, const std::vector<char>& materialised) {
  const int64_t n = g.num_nodes();
  std::vector<int64_t> read(n, -1);
  for (int64_t v = n - 1; v >= 0; --v) {
    const int64_t at = (materialised[v] || g.op_kind(v) == OpKind::kOutput) ? v : std::max(v, read[v]);
    for (int64_t x : g.operands(v)) read[x] = std::max(read[x], at);
  }
  return read;
}

}  // namespace

MemoryModel build_memory_model(const Graph& g, const std::vector<int64_t>& donated_args) {
  const int64_t n = g.num_nodes();
  const std::vector<char> donated = donated_nodes(g, donated_args);
  const UseInfo use = use_info(g);
  std::vector<char> materialised(n, 0);
  for (int64_t v = 0; v < n; ++v) {
    const OpKind k = g.op_kind(v);
    const bool computed = heavy_kind(k) || (use.consumers[v] > 1 && !use.constant[v]);
    materialised[v] = k != OpKind::kOutput && (computed || use.to_output[v]);
  }
  const std::vector<int64_t> read = read_points(g, materialised);
  std::vector<int64_t> node, start, end;
  for (int64_t v = 0; v < n; ++v) {
    if (!materialised[v]) continue;
    const bool param = g.op_kind(v) == OpKind::kParameter;
    const int64_t first = param ? 0 : v;
    int64_t last = std::max(first, read[v]);
    if ((param && !donated[v]) || use.to_output[v]) last = n - 1;
    node.push_back(v);
    start.push_back(first);
    end.push_back(last);
  }
  std::vector<size_t> order(node.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return start[a] < start[b]; });
  MemoryModel m;
  for (size_t i : order) {
    m.node.push_back(node[i]);
    m.start.push_back(start[i]);
    m.end.push_back(end[i]);
  }
  m.points = maximal_points(m.start, m.end, n);
  m.constant = use.constant;
  return m;
}

namespace {

// Accumulates one row: coefficients per (group, strategy) in a dense scratch.
struct RowBuilder {
  const std::vector<NodeStrategies>& nodes;
  const std::vector<int64_t>& node_group;
  std::vector<int64_t> group_start;  // scratch offset of each group
  std::vector<double> coeff;
  std::vector<int64_t> touched;      // groups with entries in the current row
  std::vector<char> in_row;          // per group: in `touched`

  void add(int64_t v) {
    const auto& list = nodes[v].list;
    const int64_t g = node_group[v];
    if (!in_row[g]) {
      in_row[g] = 1;
      touched.push_back(g);
    }
    for (size_t k = 0; k < list.size(); ++k) coeff[group_start[g] + k] += list[k].memory;
  }

  void add_copy(const CopyRange& c) {
    const int64_t g = node_group[c.consumer];
    if (!in_row[g]) {
      in_row[g] = 1;
      touched.push_back(g);
    }
    for (int64_t k : c.strategies) coeff[group_start[g] + k] += c.bytes;
  }

  // Emits the row with upper bound `budget` and clears the scratch.
  IlpLinearRow take(double budget, int64_t point) {
    IlpLinearRow row;
    std::sort(touched.begin(), touched.end());
    for (int64_t g : touched) {
      for (int64_t k = 0; k < group_start[g + 1] - group_start[g]; ++k) {
        double& c = coeff[group_start[g] + k];
        if (c != 0.0) row.entries.push_back({g, k, c});
        c = 0.0;
      }
      in_row[g] = 0;
    }
    row.upper = budget;
    row.name = "memory at node " + std::to_string(point);
    touched.clear();
    return row;
  }
};

std::vector<int64_t> group_offsets(const std::vector<NodeStrategies>& nodes,
                                   const std::vector<int64_t>& node_group) {
  const int64_t G = node_group.empty() ? 0 : *std::max_element(node_group.begin(), node_group.end()) + 1;
  std::vector<int64_t> size(G, 0), start(G + 1, 0);
  for (size_t v = 0; v < nodes.size(); ++v) size[node_group[v]] = static_cast<int64_t>(nodes[v].list.size());
  for (int64_t g = 0; g < G; ++g) start[g + 1] = start[g] + size[g];
  return start;
}

}  // namespace

MemoryRows make_memory_rows(const MemoryModel& m, int64_t num_nodes, double budget, std::vector<CopyRange> copies) {
  MemoryRows rows;
  rows.upper = budget;
  rows.points = m.points;
  if (!copies.empty()) {  // maximal points of values and copies together
    std::vector<std::pair<int64_t, int64_t>> all;
    for (size_t i = 0; i < m.start.size(); ++i) all.emplace_back(m.start[i], m.end[i]);
    for (const CopyRange& c : copies) all.emplace_back(c.start, c.end);
    std::stable_sort(all.begin(), all.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<int64_t> start, end;
    for (const auto& [s, e] : all) {
      start.push_back(s);
      end.push_back(e);
    }
    rows.points = maximal_points(start, end, num_nodes);
  }
  std::stable_sort(copies.begin(), copies.end(), [](const CopyRange& x, const CopyRange& y) { return x.start < y.start; });
  rows.copies = std::move(copies);
  return rows;
}

std::vector<IlpLinearRow> materialise_memory_rows(const MemoryModel& m, const std::vector<NodeStrategies>& nodes,
                                                  const std::vector<int64_t>& node_group, const MemoryRows& rows,
                                                  const std::vector<int64_t>* which) {
  const auto num_rows = static_cast<int64_t>(rows.points.size());
  std::vector<int64_t> all;
  if (which == nullptr) {
    all.resize(num_rows);
    std::iota(all.begin(), all.end(), 0);
    which = &all;
  }
  for (size_t i = 0; i < which->size(); ++i) {
    const int64_t r = (*which)[i];
    if (r < 0 || r >= num_rows || (i > 0 && r <= (*which)[i - 1])) {
      throw std::invalid_argument("memory row " + std::to_string(r) + ": rows must be ascending indices below " +
                                  std::to_string(num_rows));
    }
  }
  RowBuilder b{nodes, node_group, group_offsets(nodes, node_group), {}, {}, {}};
  b.coeff.assign(b.group_start.back(), 0.0);
  b.in_row.assign(b.group_start.size() - 1, 0);
  const std::vector<CopyRange>& copies = rows.copies;  // sorted by start
  std::vector<IlpLinearRow> out;
  out.reserve(which->size());
  std::vector<size_t> active, active_copies;
  size_t next = 0, next_copy = 0;
  for (int64_t r : *which) {
    const int64_t t = rows.points[r];
    while (next < m.start.size() && m.start[next] <= t) active.push_back(next++);
    std::erase_if(active, [&](size_t i) { return m.end[i] < t; });
    for (size_t i : active) b.add(m.node[i]);
    while (next_copy < copies.size() && copies[next_copy].start <= t) active_copies.push_back(next_copy++);
    std::erase_if(active_copies, [&](size_t i) { return copies[i].end < t; });
    for (size_t i : active_copies) b.add_copy(copies[i]);
    out.push_back(b.take(rows.upper, t));
  }
  return out;
}

namespace {

bool takes(const CopyRange& c, int64_t k) {  // strategies are ascending (completed_copies)
  return std::binary_search(c.strategies.begin(), c.strategies.end(), k);
}

}  // namespace

std::vector<double> memory_row_activity(const MemoryModel& m, const std::vector<NodeStrategies>& nodes,
                                        const std::vector<int64_t>& node_group, const MemoryRows& rows,
                                        const std::vector<int64_t>& group_assignment) {
  const auto n = static_cast<int64_t>(nodes.size());
  auto strategy = [&](int64_t v) {
    const int64_t g = node_group[v];
    if (g < 0 || g >= static_cast<int64_t>(group_assignment.size()) || group_assignment[g] < 0 ||
        group_assignment[g] >= static_cast<int64_t>(nodes[v].list.size())) {
      throw std::invalid_argument("assignment has no valid strategy for group " + std::to_string(g) +
                                  " (node " + std::to_string(v) + ")");
    }
    return group_assignment[g];
  };
  std::vector<double> delta(n + 1, 0.0);
  for (size_t i = 0; i < m.node.size(); ++i) {
    const double bytes = nodes[m.node[i]].list[strategy(m.node[i])].memory;
    delta[m.start[i]] += bytes;
    delta[m.end[i] + 1] -= bytes;
  }
  for (const CopyRange& c : rows.copies) {
    if (!takes(c, strategy(c.consumer))) continue;
    delta[c.start] += c.bytes;
    delta[c.end + 1] -= c.bytes;
  }
  std::vector<double> live(n, 0.0);
  double sum = 0.0;
  for (int64_t t = 0; t < n; ++t) live[t] = sum += delta[t];
  std::vector<double> out;
  out.reserve(rows.points.size());
  for (int64_t t : rows.points) out.push_back(live[t]);
  return out;
}

double memory_row_lower_bound(const MemoryModel& m, const std::vector<NodeStrategies>& nodes,
                              const std::vector<int64_t>& node_group, const MemoryRows& rows) {
  const std::vector<int64_t> group_start = group_offsets(nodes, node_group);
  const auto num_groups = static_cast<int64_t>(group_start.size()) - 1;
  std::vector<double> coeff(group_start.back(), 0.0), least(num_groups, 0.0);
  double total = 0.0;
  auto refresh = [&](int64_t g) {  // the group's least coefficient after a change
    const double old = least[g];
    const double* c = coeff.data() + group_start[g];
    least[g] = std::max(0.0, *std::min_element(c, c + (group_start[g + 1] - group_start[g])));
    total += least[g] - old;
  };
  auto add_value = [&](size_t i, double sign) {
    const int64_t v = m.node[i], g = node_group[v];
    const auto& list = nodes[v].list;
    for (size_t k = 0; k < list.size(); ++k) coeff[group_start[g] + k] += sign * list[k].memory;
    refresh(g);
  };
  auto add_copy = [&](const CopyRange& c, double sign) {
    const int64_t g = node_group[c.consumer];
    for (int64_t k : c.strategies) coeff[group_start[g] + k] += sign * c.bytes;
    refresh(g);
  };
  // values and copies leave in the order of their ends
  std::vector<size_t> by_end(m.node.size()), copy_by_end(rows.copies.size());
  std::iota(by_end.begin(), by_end.end(), 0);
  std::iota(copy_by_end.begin(), copy_by_end.end(), 0);
  std::stable_sort(by_end.begin(), by_end.end(), [&](size_t a, size_t b) { return m.end[a] < m.end[b]; });
  std::stable_sort(copy_by_end.begin(), copy_by_end.end(),
                   [&](size_t a, size_t b) { return rows.copies[a].end < rows.copies[b].end; });
  size_t next = 0, next_copy = 0, gone = 0, gone_copy = 0;
  double best = 0.0;
  for (int64_t t : rows.points) {
    while (next < m.start.size() && m.start[next] <= t) add_value(next++, 1.0);
    while (next_copy < rows.copies.size() && rows.copies[next_copy].start <= t) add_copy(rows.copies[next_copy++], 1.0);
    while (gone < by_end.size() && m.end[by_end[gone]] < t) add_value(by_end[gone++], -1.0);
    while (gone_copy < copy_by_end.size() && rows.copies[copy_by_end[gone_copy]].end < t) {
      add_copy(rows.copies[copy_by_end[gone_copy++]], -1.0);
    }
    best = std::max(best, total);
  }
  return best;
}

PeakMemory peak_memory(const MemoryModel& m, const std::vector<NodeStrategies>& nodes,
                       const std::vector<int64_t>& node_group,
                       const std::vector<int64_t>& group_assignment,
                       const std::vector<CopyRange>& copies) {
  const auto n = static_cast<int64_t>(nodes.size());
  std::vector<double> delta(n + 1, 0.0);
  for (const CopyRange& c : copies) {
    delta[c.start] += c.bytes;
    delta[c.end + 1] -= c.bytes;
  }
  for (size_t i = 0; i < m.node.size(); ++i) {
    const int64_t v = m.node[i], g = node_group[v];
    if (g < 0 || g >= static_cast<int64_t>(group_assignment.size()) || group_assignment[g] < 0 ||
        group_assignment[g] >= static_cast<int64_t>(nodes[v].list.size())) {
      throw std::invalid_argument("assignment has no valid strategy for group " + std::to_string(g) +
                                  " (node " + std::to_string(v) + ")");
    }
    const double bytes = nodes[v].list[group_assignment[g]].memory;
    delta[m.start[i]] += bytes;
    delta[m.end[i] + 1] -= bytes;
  }
  PeakMemory peak;
  double live = 0.0;
  for (int64_t t = 0; t < n && !(m.node.empty() && copies.empty()); ++t) {
    live += delta[t];
    if (live > peak.bytes || peak.at < 0) {
      peak.bytes = live;
      peak.at = t;
    }
  }
  return peak;
}

}  // namespace alpa
