// Inter-operator DPs (Alpa's layer clustering and stage-submesh assignment) on plain arrays.
#pragma once

#include <cstdint>
#include <vector>

namespace alpa {

// Cut n operators (in order) into `layers` consecutive non-empty layers. flops[i] is operator i's
// FLOPs, cut_bytes[i] (n - 1 entries) the bytes live across the gap after operator i. Every layer
// holds at most max((1 + eps) * sum(flops) / layers, max(flops)) FLOPs; among such cuts the result
// minimises the largest cut, then the sum of cuts. Returns the layers - 1 start indices of layers
// 1..layers-1. Throws std::invalid_argument when no cut satisfies the FLOP cap.
std::vector<int64_t> cluster_layers(const std::vector<double>& flops, const std::vector<double>& cut_bytes,
                                    int64_t layers, double eps);

struct StageAssignment {
  int64_t start;    // first layer
  int64_t stop;     // one past the last layer
  int64_t submesh;  // index into the submesh choices
};

struct StageDpResult {
  double objective;  // sum of stage latencies + (num_micro - 1) * max stage latency
  double max_stage_latency;
  std::vector<StageAssignment> stages;
};

// Stage-submesh DP. cost has num_layers * num_layers * num_submeshes entries, cost[(i * L + j) * K + k]
// = latency of layers [i, j] (inclusive) on submesh choice k (+inf: infeasible, e.g. memory).
// submesh_devices[k] = devices of choice k. Picks consecutive layer ranges covering every layer,
// each on a submesh, using at most num_devices devices in all, minimising
// sum(latency) + (num_micro - 1) * max(latency). Throws std::invalid_argument when infeasible.
StageDpResult stage_dp(int64_t num_layers, const std::vector<double>& cost,
                       const std::vector<int64_t>& submesh_devices, int64_t num_devices, int64_t num_micro);

}  // namespace alpa
