// The sharding ILP as plain data (named CSC arrays, as handed to HiGHS), how it is built from
// per-group strategy costs and pairwise resharding costs, and a solver-free evaluator.
//
// Formulation: group g has one binary column s[g][k] per strategy k with sum_k s[g][k] = 1.
// An edge (u, v, R) between two groups with more than one strategy each gets continuous columns
// e[i][j] in [0, 1] with sum_j e[i][j] = s[u][i] and sum_i e[i][j] = s[v][j] (exact for binary s)
// and cost R[i][j]. Edges touching a one-strategy group, and edges with u == v (cost R[i][i]),
// fold into linear costs. An equality (u, v, match) means "u picks i => v picks match[i]" (match -1:
// u never picks i); one row per strategy j of v: sum_{i: match[i] = j} s[u][i] = s[v][j].
// An extra linear row (e.g. a memory budget at one program point) is
// lower <= sum_entries coeff * s[group][strategy] <= upper.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace alpa {

struct IlpEdge {
  int64_t u = 0, v = 0;
  std::vector<double> cost;  // |S_u| x |S_v|, row-major
};

struct IlpEquality {
  int64_t u = 0, v = 0;
  std::vector<int64_t> match;  // for each strategy of u: the strategy of v it must equal, or -1
};

struct IlpRowEntry {
  int64_t group = 0, strategy = 0;
  double coeff = 0.0;
};

struct IlpLinearRow {
  std::vector<IlpRowEntry> entries;  // distinct (group, strategy) pairs
  double lower = -std::numeric_limits<double>::infinity();
  double upper = std::numeric_limits<double>::infinity();
  std::string name;                  // for violation messages, e.g. "memory at node 12"
};

struct IlpProblem {
  // --- HiGHS model (columns = variables, CSC matrix) ---
  int64_t num_cols = 0, num_rows = 0;
  std::vector<double> col_cost, col_lower, col_upper;
  std::vector<int8_t> integrality;  // 1 = integer (binary with bounds 0/1), 0 = continuous
  std::vector<int64_t> a_start;     // [num_cols + 1]
  std::vector<int32_t> a_index;     // row of each nonzero
  std::vector<double> a_value;
  std::vector<double> row_lower, row_upper;
  double offset = 0.0;              // constant part of the objective (one-strategy groups and
                                    // edges between two of them); objective = c.x + offset
  // --- structure, for decoding and evaluate() ---
  std::vector<int64_t> group_var_start;  // [G + 1]: s-columns of group g
  std::vector<std::vector<double>> group_costs;  // the linear costs as given
  std::vector<IlpEdge> edges;            // as given
  std::vector<IlpEquality> equalities;   // as given
  std::vector<IlpLinearRow> linear_rows; // as given; rows linear_row_start .. num_rows - 1
  int64_t linear_row_start = 0;
  int64_t num_edge_vars = 0;             // e-columns created
  int64_t num_groups() const { return static_cast<int64_t>(group_costs.size()); }
};

IlpProblem build_ilp(std::vector<std::vector<double>> group_costs, std::vector<IlpEdge> edges,
                     std::vector<IlpEquality> equalities,
                     std::vector<IlpLinearRow> linear_rows = {});

// The problem "minimise M such that every linear row's activity <= M" over the same one-hot and
// equality constraints: `p` with all costs and the offset zeroed and one continuous column M in
// [0, inf) (cost 1, the last column) entering each linear row with -1, whose bounds become
// (-inf, 0]. Its optimum is the smallest upper bound all linear rows can share (e.g. the smallest
// feasible memory budget). Groups, decode_assignment and evaluate_columns apply as usual; evaluate()
// on it checks one-hot/equalities only (objective 0). Throws std::invalid_argument if `p` has no
// linear rows.
IlpProblem min_max_row_problem(const IlpProblem& p);

struct EvalResult {
  double objective = 0.0;    // linear + edge costs (the offset is part of them)
  double linear_cost = 0.0;
  double edge_cost = 0.0;
  std::vector<std::string> violations;  // human-readable; empty = feasible
};

// From a strategy index per group (no solver).
EvalResult evaluate(const IlpProblem& p, const std::vector<int64_t>& assignment);
// Per s-column of group g (in group_var_start order): the objective of `assignment` with only
// g's strategy changed to that column's (evaluate()'s objective; equalities and linear rows are not
// checked). One pass over the groups and edges, not one evaluate() per column.
std::vector<double> one_group_changed(const IlpProblem& p, const std::vector<int64_t>& assignment);
// From a full column vector: objective c.x + offset, and violated bounds / rows / integrality.
EvalResult evaluate_columns(const IlpProblem& p, const std::vector<double>& x, double tol = 1e-6);
// Strategy index per group from a column vector (argmax of each group's s-columns).
std::vector<int64_t> decode_assignment(const IlpProblem& p, const std::vector<double>& x);

}  // namespace alpa
