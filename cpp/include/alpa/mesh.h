// Logical N-D device mesh with an alpha-beta cost per axis.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace alpa {

// The measured cost of a collective over several mesh axes at once (a cluster profile measures
// the flattened group those axes' devices form, e.g. all 8 devices of a 2x4 mesh).
struct AxesCost {
  std::vector<int> axes;  // >= 2 distinct mesh axes, ascending
  double alpha = 0.0;
  double beta = 0.0;
};

// The cost of a collective that the options forbid (Alpa's INFINITY_COST).
inline constexpr double kForbiddenCollectiveCost = 1e13;

struct Mesh {
  std::vector<int64_t> shape;  // devices along each axis
  std::vector<double> alpha;   // latency per collective on that axis
  std::vector<double> beta;    // cost per byte on that axis
  std::vector<AxesCost> axes_costs = {};  // measured multi-axis groups (see below); may be empty
  // The order in which a tensor dim split over several axes lists them, most major first (a
  // permutation of 0..ndim-1; empty: mesh order). XLA tiles such a dim major to minor, so some
  // reshards move whole tiles between devices (e.g. adding an axis in front of one kept);
  // reshard_cost charges those collective-permutes in this order (spec.cc), and the emission
  // writes the same order (the plan's axis_order).
  std::vector<int> axis_order = {};
  // Alpa's allow_all_gather / allow_all_to_all = False: every all-gather (all-to-all) over an
  // axis of size > 1 costs kForbiddenCollectiveCost, as Alpa's INFINITY_COST, so the planner
  // avoids reshards that need one wherever another layout exists (an edge that has no other
  // layout still gets one, at that cost: Plan.objective then shows it).
  bool all_gather_forbidden = false;
  bool all_to_all_forbidden = false;

  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t num_devices() const;
  void validate() const;  // throws std::invalid_argument (sizes differ, axis < 1, negative costs)
  std::vector<int> major_to_minor() const;  // axis_order, or 0..ndim-1 when it is empty

  // Cost of one collective over mesh axis `axis`; `bytes` = size of the full (gathered / reduced)
  // buffer on each participating device. An axis of size 1 costs 0.
  double all_reduce(double bytes, int axis) const;      // a + 2b(n-1)/n B
  double all_gather(double bytes, int axis) const;      // a + b(n-1)/n B
  double reduce_scatter(double bytes, int axis) const;  // a + b(n-1)/n B
  double all_to_all(double bytes, int axis) const;      // a + b(n-1)/n^2 B n/2 (Alpa's form)

  // One collective over the devices of several axes at once: XLA emits it as one collective whose
  // replica groups span those axes (e.g. the gradient all-reduce of data parallelism over both
  // axes of a 2-D mesh), so it costs as above with n = the product of their sizes and the largest
  // alpha and beta among them (a ring runs at its slowest link; Alpa's ClusterEnvironment prices
  // two-axis collectives the same way). Not the sum of one collective per axis at full size: that
  // charges an all-reduce over 8x8 devices 3.5 B instead of 2 (63/64) B. Axes of size 1 are
  // skipped; none left costs 0. When `axes_costs` has an entry for exactly the axes left (two or
  // more), its alpha and beta are used instead of the largest per-axis ones.
  double all_reduce(double bytes, std::span<const int> axes) const;
  double all_gather(double bytes, std::span<const int> axes) const;
  double reduce_scatter(double bytes, std::span<const int> axes) const;
  double all_to_all(double bytes, std::span<const int> axes) const;
  // Every device sends its `bytes` to another device of the group: a + b B.
  double collective_permute(double bytes, std::span<const int> axes) const;
  // An all-reduce that XLA combines with others into one of `bucket_bytes`: alpha * min(1, bytes /
  // bucket_bytes) (its share of the combined collective's latency) + the bandwidth term above.
  // bucket_bytes <= 0: all_reduce(bytes, axes).
  double combined_all_reduce(double bytes, std::span<const int> axes, double bucket_bytes) const;
};

}  // namespace alpa
