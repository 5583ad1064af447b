// Repeated structure in the op graph (the L identical layers a traced Python loop unrolls into),
// so that the ILP solves a repeated layer once instead of L times.
//
// 1. Structural hashes (Weisfeiler-Lehman style): round 0 hashes a node's kind, dtype, shape,
//    operand count and attrs (without the argument / output index of PARAMETER / OUTPUT nodes);
//    each further round mixes in the previous hashes of its operands (in order) and of its users
//    (as a multiset with the operand slot they read). A few rounds capture a node's position
//    within a layer but not its absolute depth.
// 2. Repeats: node ids are program order, and a traced loop emits the same op sequence for each
//    iteration, so a layer shows up as a tandem repeat in the sequence of hashes: a region
//    [start, stop) with hash[v] == hash[v + period] for every v, v + period in it, and at least two
//    full copies. Candidate periods are the most frequent gaps between equal hashes; regions are
//    picked greedily by length (then smaller period), without overlap. Copy k of a region repeats
//    copy k mod `stride`: with stride 2, even and odd copies are tied separately, so a plan that
//    alternates between two layouts (Megatron's column- then row-split dense layers in a plain
//    stack of dense layers) stays reachable. Those first copies are searched again for a repeat
//    that covers at least half of the copy (nested repeats, e.g. the per-layer blocks inside each
//    of Adam's mu and nu sections). A node's representative
//    is the node it repeats, through all levels; a class is the set (of two or more) of nodes with
//    one representative that also agree on a finer hash (more WL rounds), so a boundary layer's
//    node whose neighbourhood differs (it reads the embedding, say) stays out of its class.
//    Classes are then anchored to repeated compute (`anchor`): a position (the nodes repeating one
//    first-copy node, whatever their finer hash) of dots / convolutions stands; a position of other
//    nodes stands for those of its members with a neighbour of the same kind (their operand at slot
//    t, or a user reading them at slot t) in one standing position, and so on outwards; unused
//    values stand and anchor only what they read that is computed from constants alone. A class keeps its members that lie in
//    one standing part of their position. A layer's norms, parameters and optimizer updates reach
//    its dots that way; same-shaped values that only sit side by side do not (a scanned stack's
//    [L, h, h] weights wq, wk, wv, wo in a row, their loop carries and Adam updates: stride 2 tied
//    wo to wv, whose dots read them differently, and the plan paid for it every iteration).
// 3. Ties: the ILP groups of each class's leader nodes (NodeStrategies::follow < 0) are merged
//    into one group when all members have identical strategy lists (same out and operand specs,
//    in order); followers come along with their leaders. Parallel edges between merged groups are
//    summed by the assembly, so the L copies of a layer's edges become one ILP edge. Every
//    assignment of the tied ILP is an assignment of the untied one with the same cost (tying only
//    restricts: all copies take the same strategy).
#pragma once
#include <cstdint>
#include <vector>

#include "alpa/graph.h"
#include "alpa/strategy.h"

namespace alpa {

struct RepeatOptions {
  int region_rounds = 0;    // WL rounds of the hashes whose tandem repeats give the regions
  // WL rounds of the hashes that split a region's classes further: a boundary layer's nodes within
  // this many hops of the embedding / head stay untied. 2 rounds tied a GPT's layer 0 (its
  // layernorm reads the embedding) to layer 2 and lost 4% (3-layer GPT on 1x8: 219578 tied vs
  // 211515 untied); 6 lose nothing on the test models (tests/integration/test_repeat_optimal.py).
  int class_rounds = 6;
  int max_periods = 256;    // candidate periods tried (most frequent gaps first)
  int nesting = 2;          // levels of repeats searched inside a repeat's first copies
  int stride = 2;           // copy k is tied to copy k mod stride (2: alternating layers allowed)
  bool anchor = true;       // keep only the members of classes anchored to repeated dots (above)
};

// A tandem repeat: nodes [start, stop), period `period`, at least two full copies.
struct RepeatRegion {
  int64_t start = 0, stop = 0, period = 0;
  int64_t copies() const { return (stop - start + period - 1) / period; }
};

struct RepeatClasses {
  std::vector<int64_t> node_class;   // [N]: class id (numbered by first node) or -1
  std::vector<RepeatRegion> regions; // the outermost regions, ascending start
  int64_t num_classes = 0;
};

// One hash per node after `rounds` refinement rounds (round 0 only when rounds == 0).
std::vector<uint64_t> structural_hashes(const Graph& g, int rounds);

// Tandem repeats of the structural hash sequence and their classes (see above).
RepeatClasses find_repeats(const Graph& g, const RepeatOptions& options = {});

struct TieStats {
  int64_t regions = 0;          // tandem repeats found
  int64_t max_copies = 0;       // most copies of one region (the layer count of a plain stack)
  int64_t repeated_nodes = 0;   // nodes in some class
  int64_t classes_tied = 0;     // leader classes whose groups were merged
  int64_t classes_skipped = 0;  // leader classes left alone: members' strategy lists differ
  int64_t groups_before = 0, groups_after = 0;
};

// Merges the groups of each class's leaders (see above). `node_group` (group of each node, groups
// numbered by their first node) is rewritten, renumbered the same way; `group_size` (strategy
// count per group) follows. Throws std::invalid_argument if the sizes do not match the graph.
TieStats tie_repeated_groups(const Graph& g, const std::vector<NodeStrategies>& nodes,
                             const RepeatClasses& classes, std::vector<int64_t>& node_group,
                             std::vector<size_t>& group_size);

}  // namespace alpa
