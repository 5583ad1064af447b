// Whole-graph assembly: strategies for every node, follower merging into groups, resharding
// costs on every edge, and the IlpProblem.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "alpa/graph.h"
#include "alpa/ilp.h"
#include "alpa/memory.h"
#include "alpa/mesh.h"
#include "alpa/repeat.h"
#include "alpa/strategy.h"

namespace alpa {

// A pin entry that leaves its mesh axis free (build_sharding_problem's `pinned`).
constexpr int32_t kAnyDim = -2;

struct ShardingProblem {
  std::vector<NodeStrategies> nodes;  // per node
  std::vector<int64_t> node_group;    // ILP group of each node; node strategy k == group choice k
  MemoryModel memory;                 // liveness of the materialised values
  int64_t num_memory_rows = 0;        // memory-budget rows (0 without a budget), not in `ilp`
  MemoryRows memory_rows;             // them, unmaterialised (ilp_with_memory_rows)
  TieStats repeat;                    // repeated-layer ties (all zero unless tie_repeated_layers)
  std::vector<int64_t> unpinned_uses; // users of `pinned_uses` nodes left free to reshard them
  IlpProblem ilp;
  // What reshard_copies needs of the graph and mesh: operands (CSR), global bytes per node.
  Mesh mesh;
  std::vector<int64_t> operand_start, operand_ids;
  std::vector<double> value_bytes;
};

// `ties`: pairs of nodes whose result specs must be equal (e.g. an output and the parameter it
// replaces in a training loop); emitted as IlpEquality by spec equality. `donated_args`: flat
// entry-argument indices whose buffers may be reused (live only until their last use).
// With options.memory_budget_per_device > 0 the problem gets memory rows (memory.h MemoryRows, with
// `copies` counted), kept out of `ilp`: ilp_with_memory_rows materialises those a solve needs.
// With options.tie_repeated_layers the groups of repeated leaders are merged (repeat.h).
// `pinned`: (node, spec) pairs; the node may only take strategies whose out spec equals spec
// (entries on size-1 mesh axes are ignored, and entries kAnyDim leave their axis free: a partial
// pin), emitted as a self-equality (u == v) that forbids the rest. Throws std::invalid_argument naming the node and its specs if none matches.
// `pinned_uses`: pinned nodes that their users must also read in the pinned spec (no resharding on
// their out-edges: a followed parameter is used where it lies). Each user's ILP group keeps only the
// strategies that read every such operand as pinned; a group that would keep none keeps all (its
// nodes are listed in `unpinned_uses`). Throws std::invalid_argument for a node that is not pinned.
// `node_weights`: empty, or one factor >= 0 per node that scales the node's compute and
// communication costs and the resharding costs of its operands (a loop body's ops: the loop's
// trip count); memory is not scaled (a body's live set exists once).
// `comm_weights`: empty, or one factor >= 0 per node that scales the node's own communication
// cost instead of its node weight (a gradient dot whose partial sums a loop accumulates and
// reduces once after the loop: the weight of the loop's scope, not the trip count).
ShardingProblem build_sharding_problem(const Graph& graph, const Mesh& mesh,
                                       const CoreOptions& options,
                                       const std::vector<std::pair<int64_t, int64_t>>& ties,
                                       const std::vector<int64_t>& donated_args = {},
                                       const std::vector<std::pair<int64_t, Spec>>& pinned = {},
                                       const std::vector<int64_t>& pinned_uses = {},
                                       const std::vector<double>& node_weights = {},
                                       const std::vector<double>& comm_weights = {},
                                       const std::vector<CopyRange>& copies = {});

// `copies` with their `bytes` and `strategies` filled in from `p` (std::invalid_argument as above).
std::vector<CopyRange> completed_copies(const ShardingProblem& p, const std::vector<CopyRange>& copies);

// The reshard copies of a strategy index per ILP group (memory.h "Reshard copies"): per (value,
// layout) one copy from its first to its last consumer reading it in that layout, as one
// CopyRange per consumer (the first: [c, c]; each later one from after the previous consumer to
// itself), in consumer order.
std::vector<CopyRange> reshard_copies(const ShardingProblem& p, const std::vector<int64_t>& group_assignment);

// The reshard copies a plan over the ILP columns with `used[c]` != 0 can make (the exact-copy MIP's
// candidates, driver/exact_copies.py): one per (value u, layout L) where u is not a constant, some
// used strategy of a consumer of u reads it in L, and some used strategy of u's producer does not
// produce L; without those of fewer than `min_bytes` global or per-device bytes. Values in the
// order of their first read, then layouts in the order of their first used read (consumer, operand,
// strategy). Spec equality is exact (entries on size-1 mesh axes count).
struct CopyCandidates {
  std::vector<int64_t> value;         // per candidate: u
  std::vector<double> bytes;          // per candidate: per-device bytes of u in L
  std::vector<int64_t> reader_start;  // per candidate, CSR into `readers`
  std::vector<int64_t> readers;       // consumers reading u in L under some used strategy, ascending
  std::vector<int64_t> read_start;    // per reader, CSR into `reads`
  std::vector<int64_t> reads;         // the used ILP columns of that reader reading u in L, ascending
  std::vector<int64_t> has_start;     // per candidate, CSR into `has`
  std::vector<int64_t> has;           // ILP columns of u's producer producing L (used or not)
};
CopyCandidates copy_candidates(const ShardingProblem& p, const std::vector<uint8_t>& used, double min_bytes);

// `p.ilp` with the memory rows `which` (ascending indices; all if null) as its linear rows.
IlpProblem ilp_with_memory_rows(const ShardingProblem& p, const std::vector<int64_t>* which = nullptr);

// Per-device peak memory of a strategy index per ILP group, its reshard copies included (memory.h).
PeakMemory predicted_peak(const ShardingProblem& p, const std::vector<int64_t>& group_assignment);

}  // namespace alpa
