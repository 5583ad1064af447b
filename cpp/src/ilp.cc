// build_ilp: the sharding ILP as CSC arrays for HiGHS, built in one O(nnz) pass; and the
// solver-free checks evaluate / evaluate_columns / decode_assignment.
//
// Column order: the s-columns of group 0, 1, ..; then the e-columns of each merged edge, row-major
// (e[i][j] at e_start + i * |S_v| + j). Row order: one one-hot row per group; then per merged edge
// its |S_u| rows (sum_j e[i][j] - s[u][i] = 0) and its |S_v| rows (sum_i e[i][j] - s[v][j] = 0);
// then, per equality (u != v), one row per strategy j of v: sum_{i: match[i] == j} s[u][i] - s[v][j]
// = 0, i.e. exactly "u picks i => v picks match[i]" (match need not be injective). An entry with
// match -1 becomes the bound s[u][i] <= 0; with u == v, entries with match[i] != i become such
// bounds (the choice must be a fixed point) and no rows are made. Then one row per linear row.
// Parallel edges (same pair of groups, either direction) share one set of e-columns with summed
// costs. Constant costs (one-strategy groups, edges between two of them) go into `offset`.
#include "alpa/ilp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace alpa {

namespace {

void check_cost(double c, const std::string& where) {
  if (!std::isfinite(c) || c < 0.0) {
    throw std::invalid_argument(where + " = " + std::to_string(c) +
                                ": costs must be finite and >= 0");
  }
}

void check_group(int64_t g, int64_t num_groups, const std::string& where) {
  if (g < 0 || g >= num_groups) {
    throw std::invalid_argument(where + " names group " + std::to_string(g) + " but there are " +
                                std::to_string(num_groups) + " groups");
  }
}

void validate_linear_rows(const std::vector<std::vector<double>>& groups,
                          const std::vector<IlpLinearRow>& rows) {
  const auto G = static_cast<int64_t>(groups.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::string name = "linear row " + std::to_string(r) + " (" + rows[r].name + ")";
    if (std::isnan(rows[r].lower) || std::isnan(rows[r].upper) || rows[r].lower > rows[r].upper) {
      throw std::invalid_argument(name + " has bounds [" + std::to_string(rows[r].lower) + ", " +
                                  std::to_string(rows[r].upper) + "]");
    }
    std::unordered_map<uint64_t, int> seen;
    for (const IlpRowEntry& e : rows[r].entries) {
      check_group(e.group, G, name);
      const auto n = static_cast<int64_t>(groups[e.group].size());
      if (e.strategy < 0 || e.strategy >= n || !std::isfinite(e.coeff)) {
        throw std::invalid_argument(name + ": entry (group " + std::to_string(e.group) +
                                    ", strategy " + std::to_string(e.strategy) + ", coeff " +
                                    std::to_string(e.coeff) + ") is out of range or not finite");
      }
      if (seen[(static_cast<uint64_t>(e.group) << 32) | static_cast<uint64_t>(e.strategy)]++) {
        throw std::invalid_argument(name + " names group " + std::to_string(e.group) +
                                    " strategy " + std::to_string(e.strategy) + " twice");
      }
    }
  }
}

void validate_inputs(const std::vector<std::vector<double>>& groups,
                     const std::vector<IlpEdge>& edges,
                     const std::vector<IlpEquality>& equalities) {
  const auto G = static_cast<int64_t>(groups.size());
  for (int64_t g = 0; g < G; ++g) {
    if (groups[g].empty()) {
      throw std::invalid_argument("group " + std::to_string(g) + " has no strategies");
    }
    for (size_t k = 0; k < groups[g].size(); ++k) {
      check_cost(groups[g][k], "cost of group " + std::to_string(g) + " strategy " + std::to_string(k));
    }
  }
  for (size_t k = 0; k < edges.size(); ++k) {
    const IlpEdge& e = edges[k];
    const std::string name = "edge " + std::to_string(k);
    check_group(e.u, G, name);
    check_group(e.v, G, name);
    const size_t want = groups[e.u].size() * groups[e.v].size();
    if (e.cost.size() != want) {
      throw std::invalid_argument(name + " (groups " + std::to_string(e.u) + " -> " +
                                  std::to_string(e.v) + ") has " + std::to_string(e.cost.size()) +
                                  " costs, expected " + std::to_string(groups[e.u].size()) + " x " +
                                  std::to_string(groups[e.v].size()) + " = " + std::to_string(want));
    }
    for (size_t i = 0; i < e.cost.size(); ++i) check_cost(e.cost[i], name + " cost[" + std::to_string(i) + "]");
  }
  for (size_t k = 0; k < equalities.size(); ++k) {
    const IlpEquality& q = equalities[k];
    const std::string name = "equality " + std::to_string(k);
    check_group(q.u, G, name);
    check_group(q.v, G, name);
    if (q.match.size() != groups[q.u].size()) {
      throw std::invalid_argument(name + " has " + std::to_string(q.match.size()) +
                                  " match entries, expected one per strategy of group " +
                                  std::to_string(q.u) + " (" + std::to_string(groups[q.u].size()) + ")");
    }
    for (int64_t m : q.match) {
      if (m < -1 || m >= static_cast<int64_t>(groups[q.v].size())) {
        throw std::invalid_argument(name + " matches strategy " + std::to_string(m) + " of group " +
                                    std::to_string(q.v) + ", which has " +
                                    std::to_string(groups[q.v].size()) + " (use -1 for none)");
      }
    }
  }
}

// Edges between two groups with > 1 strategy each, parallel edges merged (u < v).
struct MergedEdges {
  std::vector<int64_t> u, v, col_start, row_start;  // row_start: first of the |S_u| + |S_v| rows
  std::vector<int64_t> of_edge;                      // merged id of each input edge, or -1
};

MergedEdges merge_edges(const std::vector<IlpEdge>& edges, const std::vector<int64_t>& size) {
  MergedEdges m;
  m.of_edge.assign(edges.size(), -1);
  std::unordered_map<uint64_t, int64_t> index;
  index.reserve(edges.size());
  const auto G = static_cast<uint64_t>(size.size());
  for (size_t k = 0; k < edges.size(); ++k) {
    const int64_t u = std::min(edges[k].u, edges[k].v), v = std::max(edges[k].u, edges[k].v);
    if (u == v || size[u] == 1 || size[v] == 1) continue;
    auto [it, fresh] = index.emplace(static_cast<uint64_t>(u) * G + static_cast<uint64_t>(v),
                                     static_cast<int64_t>(m.u.size()));
    if (fresh) {
      m.u.push_back(u);
      m.v.push_back(v);
    }
    m.of_edge[k] = it->second;
  }
  return m;
}

// Linear costs: group costs (one-strategy groups into the offset) and every edge's cost, folded
// or added to its merged e-columns.
void fill_costs(IlpProblem& p, const std::vector<int64_t>& size, const MergedEdges& m) {
  for (int64_t g = 0; g < p.num_groups(); ++g) {
    if (size[g] == 1) {
      p.offset += p.group_costs[g][0];
      continue;
    }
    for (int64_t k = 0; k < size[g]; ++k) p.col_cost[p.group_var_start[g] + k] = p.group_costs[g][k];
  }
  for (size_t k = 0; k < p.edges.size(); ++k) {
    const IlpEdge& e = p.edges[k];
    const int64_t su = size[e.u], sv = size[e.v];
    double* s_u = p.col_cost.data() + p.group_var_start[e.u];
    double* s_v = p.col_cost.data() + p.group_var_start[e.v];
    if (m.of_edge[k] >= 0) {
      const int64_t id = m.of_edge[k];
      double* ecol = p.col_cost.data() + m.col_start[id];
      const bool flipped = e.u != m.u[id];  // stored as (v, u): e[j][i]
      for (int64_t i = 0; i < su; ++i) {
        for (int64_t j = 0; j < sv; ++j) ecol[flipped ? j * su + i : i * sv + j] += e.cost[i * sv + j];
      }
    } else if (e.u == e.v) {
      for (int64_t i = 0; i < su; ++i) s_u[i] += e.cost[i * su + i];
    } else if (su == 1 && sv == 1) {
      p.offset += e.cost[0];
    } else if (su == 1) {
      for (int64_t j = 0; j < sv; ++j) s_v[j] += e.cost[j];
    } else {
      for (int64_t i = 0; i < su; ++i) s_u[i] += e.cost[i];
    }
  }
}

}  // namespace

namespace {

// Appends one nonzero to column `col` (cursor[col] walks a_start[col] .. a_start[col + 1]).
struct CscWriter {
  IlpProblem& p;
  std::vector<int64_t> cursor;
  void put(int64_t col, int64_t row, double value) {
    const int64_t at = cursor[col]++;
    p.a_index[at] = static_cast<int32_t>(row);
    p.a_value[at] = value;
  }
};

// Strategy i of an equality's u that is forbidden outright (a bound instead of a row entry).
bool equality_forbids(const IlpEquality& q, size_t i) {
  return q.match[i] < 0 || (q.u == q.v && q.match[i] != static_cast<int64_t>(i));
}

// Nonzeros per column, then a_start as their prefix sum; also sets num_rows.
void count_nonzeros(IlpProblem& p, const std::vector<int64_t>& size, const MergedEdges& m) {
  std::vector<int64_t> per_group(size.size(), 1);  // the one-hot row
  std::vector<int64_t> nnz(p.num_cols, 0);
  int64_t rows = p.num_groups();
  for (size_t id = 0; id < m.u.size(); ++id) {
    ++per_group[m.u[id]];
    ++per_group[m.v[id]];
    rows += size[m.u[id]] + size[m.v[id]];
    std::fill(nnz.begin() + m.col_start[id], nnz.begin() + m.col_start[id] + size[m.u[id]] * size[m.v[id]], 2);
  }
  for (int64_t g = 0; g < p.num_groups(); ++g) {
    std::fill(nnz.begin() + p.group_var_start[g], nnz.begin() + p.group_var_start[g + 1], per_group[g]);
  }
  for (const IlpEquality& q : p.equalities) {
    if (q.u == q.v) continue;
    for (size_t i = 0; i < q.match.size(); ++i) {
      if (!equality_forbids(q, i)) ++nnz[p.group_var_start[q.u] + i];
    }
    for (int64_t j = 0; j < size[q.v]; ++j) ++nnz[p.group_var_start[q.v] + j];
    rows += size[q.v];
  }
  p.linear_row_start = rows;
  for (const IlpLinearRow& r : p.linear_rows) {
    for (const IlpRowEntry& e : r.entries) ++nnz[p.group_var_start[e.group] + e.strategy];
  }
  rows += static_cast<int64_t>(p.linear_rows.size());
  if (rows > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("ILP would have " + std::to_string(rows) +
                                " rows, more than HiGHS's 32-bit row index allows");
  }
  p.num_rows = rows;
  p.a_start.assign(p.num_cols + 1, 0);
  for (int64_t c = 0; c < p.num_cols; ++c) p.a_start[c + 1] = p.a_start[c] + nnz[c];
}

// Writes every nonzero in increasing row order (so each column's rows come out sorted) and the
// row bounds; turns match -1 entries into upper bounds of 0.
void fill_matrix(IlpProblem& p, const std::vector<int64_t>& size, const MergedEdges& m) {
  p.a_index.resize(p.a_start.back());
  p.a_value.resize(p.a_start.back());
  p.row_lower.assign(p.num_rows, 0.0);
  p.row_upper.assign(p.num_rows, 0.0);
  CscWriter w{p, std::vector<int64_t>(p.a_start.begin(), p.a_start.end() - 1)};
  for (int64_t g = 0; g < p.num_groups(); ++g) {
    p.row_lower[g] = p.row_upper[g] = 1.0;
    for (int64_t c = p.group_var_start[g]; c < p.group_var_start[g + 1]; ++c) w.put(c, g, 1.0);
  }
  for (size_t id = 0; id < m.u.size(); ++id) {
    const int64_t su = size[m.u[id]], sv = size[m.v[id]], ru = m.row_start[id], rv = ru + su;
    for (int64_t i = 0; i < su; ++i) w.put(p.group_var_start[m.u[id]] + i, ru + i, -1.0);
    for (int64_t j = 0; j < sv; ++j) w.put(p.group_var_start[m.v[id]] + j, rv + j, -1.0);
    for (int64_t i = 0; i < su; ++i) {
      for (int64_t j = 0; j < sv; ++j) {
        const int64_t col = m.col_start[id] + i * sv + j;
        w.put(col, ru + i, 1.0);
        w.put(col, rv + j, 1.0);
      }
    }
  }
  int64_t row = m.u.empty() ? p.num_groups() : m.row_start.back() + size[m.u.back()] + size[m.v.back()];
  for (const IlpEquality& q : p.equalities) {
    for (size_t i = 0; i < q.match.size(); ++i) {
      if (equality_forbids(q, i)) {
        p.col_upper[p.group_var_start[q.u] + i] = 0.0;
      } else if (q.u != q.v) {
        w.put(p.group_var_start[q.u] + i, row + q.match[i], 1.0);
      }
    }
    if (q.u == q.v) continue;
    for (int64_t j = 0; j < size[q.v]; ++j) w.put(p.group_var_start[q.v] + j, row + j, -1.0);
    row += size[q.v];
  }
  for (const IlpLinearRow& r : p.linear_rows) {
    p.row_lower[row] = r.lower;
    p.row_upper[row] = r.upper;
    for (const IlpRowEntry& e : r.entries) w.put(p.group_var_start[e.group] + e.strategy, row, e.coeff);
    ++row;
  }
}

}  // namespace

IlpProblem build_ilp(std::vector<std::vector<double>> group_costs, std::vector<IlpEdge> edges,
                     std::vector<IlpEquality> equalities,
                     std::vector<IlpLinearRow> linear_rows) {
  validate_inputs(group_costs, edges, equalities);
  validate_linear_rows(group_costs, linear_rows);
  IlpProblem p;
  const auto G = static_cast<int64_t>(group_costs.size());
  std::vector<int64_t> size(G);
  p.group_var_start.assign(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    size[g] = static_cast<int64_t>(group_costs[g].size());
    p.group_var_start[g + 1] = p.group_var_start[g] + size[g];
  }
  MergedEdges m = merge_edges(edges, size);
  int64_t cols = p.group_var_start[G], rows = G;
  for (size_t id = 0; id < m.u.size(); ++id) {
    m.col_start.push_back(cols);
    m.row_start.push_back(rows);
    cols += size[m.u[id]] * size[m.v[id]];
    rows += size[m.u[id]] + size[m.v[id]];
  }
  p.num_cols = cols;
  p.num_edge_vars = cols - p.group_var_start[G];
  p.col_cost.assign(cols, 0.0);
  p.col_lower.assign(cols, 0.0);
  p.col_upper.assign(cols, 1.0);
  p.integrality.assign(cols, 0);
  std::fill(p.integrality.begin(), p.integrality.begin() + p.group_var_start[G], int8_t{1});
  p.group_costs = std::move(group_costs);
  p.edges = std::move(edges);
  p.equalities = std::move(equalities);
  p.linear_rows = std::move(linear_rows);
  fill_costs(p, size, m);
  count_nonzeros(p, size, m);
  fill_matrix(p, size, m);
  return p;
}

namespace {

constexpr size_t kMaxViolations = 50;  // messages kept; the rest are counted

void add_violation(EvalResult& r, size_t& dropped, std::string msg) {
  if (r.violations.size() < kMaxViolations) {
    r.violations.push_back(std::move(msg));
  } else {
    ++dropped;
  }
}

void check_columns(const IlpProblem& p, const std::vector<double>& x) {
  if (static_cast<int64_t>(x.size()) != p.num_cols) {
    throw std::invalid_argument("column vector has " + std::to_string(x.size()) +
                                " entries but the ILP has " + std::to_string(p.num_cols) +
                                " columns");
  }
}

// " (one-hot of group g)", " (<linear row name>)" or "" for edge / equality rows.
std::string row_label(const IlpProblem& p, int64_t row) {
  if (row < p.num_groups()) return " (one-hot of group " + std::to_string(row) + ")";
  const int64_t r = row - p.linear_row_start;
  if (r >= 0 && r < static_cast<int64_t>(p.linear_rows.size())) return " (" + p.linear_rows[r].name + ")";
  return "";
}

}  // namespace

// The objective is linear_cost + edge_cost, both from the costs as given (so `offset`, which
// only moves given costs, is inside them).
EvalResult evaluate(const IlpProblem& p, const std::vector<int64_t>& assignment) {
  const int64_t G = p.num_groups();
  if (static_cast<int64_t>(assignment.size()) != G) {
    throw std::invalid_argument("assignment has " + std::to_string(assignment.size()) +
                                " entries, expected one per group (" + std::to_string(G) + ")");
  }
  EvalResult r;
  for (int64_t g = 0; g < G; ++g) {
    const auto n = static_cast<int64_t>(p.group_costs[g].size());
    if (assignment[g] < 0 || assignment[g] >= n) {
      throw std::invalid_argument("assignment picks strategy " + std::to_string(assignment[g]) +
                                  " of group " + std::to_string(g) + ", which has " +
                                  std::to_string(n));
    }
    r.linear_cost += p.group_costs[g][assignment[g]];
  }
  for (const IlpEdge& e : p.edges) {
    const auto sv = static_cast<int64_t>(p.group_costs[e.v].size());
    r.edge_cost += e.cost[assignment[e.u] * sv + assignment[e.v]];
  }
  size_t dropped = 0;
  for (size_t k = 0; k < p.equalities.size(); ++k) {
    const IlpEquality& q = p.equalities[k];
    const int64_t want = q.match[assignment[q.u]];
    if (want == assignment[q.v]) continue;
    add_violation(r, dropped,
                  "equality " + std::to_string(k) + ": group " + std::to_string(q.u) +
                      " strategy " + std::to_string(assignment[q.u]) +
                      (want < 0 ? std::string(" is not allowed")
                                : " needs group " + std::to_string(q.v) + " strategy " +
                                      std::to_string(want) + ", got " +
                                      std::to_string(assignment[q.v])));
  }
  for (const IlpLinearRow& row : p.linear_rows) {
    double activity = 0.0;
    for (const IlpRowEntry& e : row.entries) {
      if (assignment[e.group] == e.strategy) activity += e.coeff;
    }
    const double tol = 1e-9 * std::max(1.0, std::abs(activity));
    if (activity >= row.lower - tol && activity <= row.upper + tol) continue;
    add_violation(r, dropped, row.name + " = " + std::to_string(activity) + " outside [" +
                                  std::to_string(row.lower) + ", " + std::to_string(row.upper) + "]");
  }
  if (dropped) r.violations.push_back("... and " + std::to_string(dropped) + " more violations");
  r.objective = r.linear_cost + r.edge_cost;
  return r;
}

std::vector<double> one_group_changed(const IlpProblem& p, const std::vector<int64_t>& assignment) {
  const double base = evaluate(p, assignment).objective;  // (checks the assignment)
  const int64_t G = p.num_groups();
  std::vector<int64_t> start(G + 1, 0);
  for (int64_t g = 0; g < G; ++g) start[g + 1] = start[g] + static_cast<int64_t>(p.group_costs[g].size());
  std::vector<double> out(start[G]);
  for (int64_t g = 0; g < G; ++g) {
    const std::vector<double>& c = p.group_costs[g];
    for (size_t k = 0; k < c.size(); ++k) out[start[g] + k] = base - c[assignment[g]] + c[k];
  }
  for (const IlpEdge& e : p.edges) {
    const auto su = static_cast<int64_t>(p.group_costs[e.u].size());
    const auto sv = static_cast<int64_t>(p.group_costs[e.v].size());
    const int64_t au = assignment[e.u], av = assignment[e.v];
    const double now = e.cost[au * sv + av];
    if (e.u == e.v) {  // (a group's edge to itself: both ends change together)
      for (int64_t k = 0; k < su; ++k) out[start[e.u] + k] += e.cost[k * sv + k] - now;
      continue;
    }
    for (int64_t k = 0; k < su; ++k) out[start[e.u] + k] += e.cost[k * sv + av] - now;
    for (int64_t k = 0; k < sv; ++k) out[start[e.v] + k] += e.cost[au * sv + k] - now;
  }
  return out;
}

IlpProblem min_max_row_problem(const IlpProblem& p) {
  if (p.linear_rows.empty()) {
    throw std::invalid_argument("min_max_row_problem needs a problem with linear rows");
  }
  IlpProblem q = p;
  ++q.num_cols;  // the column M
  std::fill(q.col_cost.begin(), q.col_cost.end(), 0.0);
  q.col_cost.push_back(1.0);
  q.col_lower.push_back(0.0);
  q.col_upper.push_back(std::numeric_limits<double>::infinity());
  q.integrality.push_back(0);
  for (int64_t row = q.linear_row_start; row < q.num_rows; ++row) {
    q.a_index.push_back(static_cast<int32_t>(row));
    q.a_value.push_back(-1.0);
    q.row_lower[row] = -std::numeric_limits<double>::infinity();
    q.row_upper[row] = 0.0;
  }
  q.a_start.push_back(static_cast<int64_t>(q.a_index.size()));
  q.offset = 0.0;
  for (auto& costs : q.group_costs) std::fill(costs.begin(), costs.end(), 0.0);
  q.edges.clear();
  q.linear_rows.clear();
  return q;
}

// objective = c.x + offset; linear_cost = the s-columns' part + offset (edge costs folded into
// s-columns count here), edge_cost = the e-columns' part.
EvalResult evaluate_columns(const IlpProblem& p, const std::vector<double>& x, double tol) {
  check_columns(p, x);
  EvalResult r;
  size_t dropped = 0;
  const int64_t num_s = p.group_var_start.back();
  std::vector<double> activity(p.num_rows, 0.0);
  for (int64_t c = 0; c < p.num_cols; ++c) {
    (c < num_s ? r.linear_cost : r.edge_cost) += p.col_cost[c] * x[c];
    if (x[c] < p.col_lower[c] - tol || x[c] > p.col_upper[c] + tol) {
      add_violation(r, dropped, "column " + std::to_string(c) + " = " + std::to_string(x[c]) +
                                    " outside [" + std::to_string(p.col_lower[c]) + ", " +
                                    std::to_string(p.col_upper[c]) + "]");
    }
    if (p.integrality[c] && std::abs(x[c] - std::round(x[c])) > tol) {
      add_violation(r, dropped, "column " + std::to_string(c) + " = " + std::to_string(x[c]) +
                                    " is not integral");
    }
    for (int64_t k = p.a_start[c]; k < p.a_start[c + 1]; ++k) activity[p.a_index[k]] += p.a_value[k] * x[c];
  }
  for (int64_t row = 0; row < p.num_rows; ++row) {
    if (activity[row] >= p.row_lower[row] - tol && activity[row] <= p.row_upper[row] + tol) continue;
    add_violation(r, dropped, "row " + std::to_string(row) +
                                  row_label(p, row) +
                                  " = " + std::to_string(activity[row]) + " outside [" +
                                  std::to_string(p.row_lower[row]) + ", " +
                                  std::to_string(p.row_upper[row]) + "]");
  }
  if (dropped) r.violations.push_back("... and " + std::to_string(dropped) + " more violations");
  r.linear_cost += p.offset;
  r.objective = r.linear_cost + r.edge_cost;
  return r;
}

std::vector<int64_t> decode_assignment(const IlpProblem& p, const std::vector<double>& x) {
  check_columns(p, x);
  std::vector<int64_t> out(p.num_groups());
  for (int64_t g = 0; g < p.num_groups(); ++g) {
    const auto begin = x.begin() + p.group_var_start[g], end = x.begin() + p.group_var_start[g + 1];
    out[g] = std::max_element(begin, end) - begin;
  }
  return out;
}

}  // namespace alpa
