// Logical N-D device mesh with an alpha-beta cost per axis.
#pragma once
#include <cstdint>
#include <vector>

namespace alpa {

struct Mesh {
  std::vector<int64_t> shape;  // devices along each axis
  std::vector<double> alpha;   // latency per collective on that axis
  std::vector<double> beta;    // cost per byte on that axis

  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t num_devices() const;
  void validate() const;  // throws std::invalid_argument (sizes differ, axis < 1, negative costs)

  // Cost of one collective over mesh axis `axis`; `bytes` = size of the full (gathered / reduced)
  // buffer on each participating device. An axis of size 1 costs 0.
  double all_reduce(double bytes, int axis) const;      // a + 2b(n-1)/n B
  double all_gather(double bytes, int axis) const;      // a + b(n-1)/n B
  double reduce_scatter(double bytes, int axis) const;  // a + b(n-1)/n B
  double all_to_all(double bytes, int axis) const;      // a + b(n-1)/n^2 B n/2 (Alpa's form)
};

}  // namespace alpa
