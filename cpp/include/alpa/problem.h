// Whole-graph assembly: strategies for every node, follower merging into groups, resharding
// costs on every edge, and the IlpProblem.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "alpa/graph.h"
#include "alpa/ilp.h"
#include "alpa/mesh.h"
#include "alpa/strategy.h"

namespace alpa {

struct ShardingProblem {
  std::vector<NodeStrategies> nodes;  // per node
  std::vector<int64_t> node_group;    // ILP group of each node; node strategy k == group choice k
  IlpProblem ilp;
};

// `ties`: pairs of nodes whose result specs must be equal (e.g. an output and the parameter it
// replaces in a training loop); emitted as IlpEquality by spec equality.
ShardingProblem build_sharding_problem(const Graph& graph, const Mesh& mesh,
                                       const CoreOptions& options,
                                       const std::vector<std::pair<int64_t, int64_t>>& ties);

}  // namespace alpa
