// Per-device memory of a sharding plan: liveness of the values XLA materialises over the graph's
// node order (program order), the peak of an assignment, and memory-budget rows for the ILP.
//
// Which values count (measured against XLA's memory_analysis(), argument + output + temp - alias,
// donated or not: MLP and GPT test models within 0.86x..1.14x, deep GPTs up to Alpa's 39B on 8x8
// within 0.92x..1.05x): XLA fuses elementwise chains, so a value takes memory only if it is a
// PARAMETER, the result of a DOT, CONVOLUTION, REDUCE, GATHER, SCATTER or OPAQUE op, has more than
// one distinct consumer, or is read by an OUTPUT. A constant expression (a GENERATOR, or a
// fusible op computed from constant expressions only, e.g. a causal mask broadcast to
// [batch, heads, seq, seq]) counts only when an OUTPUT reads it: XLA folds it or recomputes it
// inside every user. OUTPUT nodes alias their operand and never count themselves.
//
// Live range of a counted value v, inclusive, in node ids: a PARAMETER from 0 to the end of the
// program (a donated one only to its last read); any other value from v to its last read; a value
// read by an OUTPUT until the end. A value is read by each counted consumer at that consumer's node;
// a consumer that does not count is fused into (recomputed inside) its own consumers, so it reads
// its operands wherever it is itself read. The per-device bytes of v under a strategy are that
// strategy's `memory`.
//
// Reshard copies: where a consumer reads an operand in another layout than the operand's own, XLA's
// partitioner makes the copy once per (value, layout) and every consumer wanting that layout reads
// it, so the copy lives from the first such consumer to the last (a weight gathered for the forward
// dot is the one the backward dot reads; measured on a budgeted 4-layer GPT on 2x4: XLA 108.4 MiB,
// this model 108.9, without copies 95.9). A copy of a constant expression is not counted (XLA
// builds the constant in the layout wanted).
#pragma once
#include <cstdint>
#include <vector>

#include "alpa/graph.h"
#include "alpa/ilp.h"
#include "alpa/strategy.h"

namespace alpa {

struct MemoryModel {
  // One entry per counted value, sorted by start: its node and live range [start, end].
  std::vector<int64_t> node, start, end;
  // Program points (node ids) whose live set is maximal (contained in no other point's set),
  // ascending: every point's live set is a subset of one of theirs, so the peak is reached at one.
  std::vector<int64_t> points;
  // Per node: its value is a constant expression (never counted, nor any copy of it).
  std::vector<char> constant;
};

// One consumer's share of a reshard copy: the copy of operand `operand` of node `consumer` in
// layout `layout`, live over [start, end]; `bytes` per device. In a memory row it counts when the
// consumer's group takes one of `strategies` (those reading the operand in `layout`), whatever its
// producer's layout (an upper bound: no copy when the producer already has the layout), except that
// a producer in the consumer's group (same strategy index) is known: strategies where it already
// has the layout are left out.
struct CopyRange {
  int64_t consumer = 0, operand = 0;
  Spec layout;
  int64_t start = 0, end = 0;
  double bytes = 0.0;
  std::vector<int64_t> strategies;
};

// `donated_args`: flat entry-argument indices (a PARAMETER's arg_index) whose buffers XLA may reuse.
// Throws std::invalid_argument for an index that names no argument.
MemoryModel build_memory_model(const Graph& g, const std::vector<int64_t>& donated_args);

// The memory-budget rows of a problem, kept unmaterialised: one row per maximal point of values and
// copies together, "sum over values v live at the point of memory(v, s) * s[group(v)][s] plus the
// copies live there (each where its consumer's group takes one of its `strategies`) <= upper".
// A large model has thousands of rows over most groups (LLaMA-8B 8x8: 3.7k rows, 15M nonzeros, 15x
// the rest of the ILP), of which a solve needs tens: the rows are materialised only on demand.
struct MemoryRows {
  std::vector<int64_t> points;    // one row per point, ascending ("memory at node <t>")
  std::vector<CopyRange> copies;  // completed (bytes and strategies filled in)
  double upper = 0.0;             // every row's upper bound (the budget)
};

// The rows of `m` and `copies` (completed) with upper bound `budget`.
MemoryRows make_memory_rows(const MemoryModel& m, int64_t num_nodes, double budget, std::vector<CopyRange> copies);

// Rows `which` (ascending indices into rows.points; all if null) as ILP linear rows: coefficients of
// nodes merged into one group add up per (group, strategy) (one-strategy groups included, so a row's
// activity is the whole live set's bytes); zero coefficients are dropped. Named "memory at node <t>".
// Throws std::invalid_argument for an index out of range or out of order.
std::vector<IlpLinearRow> materialise_memory_rows(const MemoryModel& m, const std::vector<NodeStrategies>& nodes,
                                                  const std::vector<int64_t>& node_group, const MemoryRows& rows,
                                                  const std::vector<int64_t>* which = nullptr);

// Each row's activity under a strategy index per ILP group (what the materialised row times the
// assignment's columns gives), in O(nodes + copies).
std::vector<double> memory_row_activity(const MemoryModel& m, const std::vector<NodeStrategies>& nodes,
                                        const std::vector<int64_t>& node_group, const MemoryRows& rows,
                                        const std::vector<int64_t>& group_assignment);

// max over rows of the sum over groups of the group's least coefficient in the row (each row at its
// own minimum, every group free): no plan of any edges or ties has a peak below it. One sweep over
// the points, each value and copy entering and leaving once.
double memory_row_lower_bound(const MemoryModel& m, const std::vector<NodeStrategies>& nodes,
                              const std::vector<int64_t>& node_group, const MemoryRows& rows);

struct PeakMemory {
  double bytes = 0.0;  // per-device peak
  int64_t at = -1;     // first program point (node id) where it is reached; -1 if nothing counts
};

// Peak of `group_assignment` (a strategy index per ILP group) plus `copies` (the assignment's
// reshard copies: each counted over its range, whatever its `strategies`); without copies it
// equals the largest memory row activity.
PeakMemory peak_memory(const MemoryModel& m, const std::vector<NodeStrategies>& nodes,
                       const std::vector<int64_t>& node_group,
                       const std::vector<int64_t>& group_assignment,
                       const std::vector<CopyRange>& copies = {});

}  // namespace alpa
