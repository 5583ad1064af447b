// Logical mesh: device count, validation and the alpha-beta cost of one collective per axis
// (formulas from DESIGN.md, without Alpa's small per-collective penalty constants).
#include "alpa/mesh.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace alpa {

namespace {

void check_cost(const std::vector<double>& costs, const char* name, size_t axis) {
  double c = costs[axis];
  if (!(c >= 0.0) || !std::isfinite(c)) {
    throw std::invalid_argument("mesh " + std::string(name) + "[" + std::to_string(axis) +
                                "] = " + std::to_string(c) + ": must be finite and >= 0");
  }
}

}  // namespace

int64_t Mesh::num_devices() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

void Mesh::validate() const {
  if (alpha.size() != shape.size() || beta.size() != shape.size()) {
    throw std::invalid_argument("mesh has " + std::to_string(shape.size()) + " axes but " +
                                std::to_string(alpha.size()) + " alpha and " +
                                std::to_string(beta.size()) +
                                " beta values: give one alpha and one beta per axis");
  }
  for (size_t a = 0; a < shape.size(); ++a) {
    if (shape[a] < 1) {
      throw std::invalid_argument("mesh axis " + std::to_string(a) + " has size " +
                                  std::to_string(shape[a]) + ": every axis needs >= 1 device");
    }
    check_cost(alpha, "alpha", a);
    check_cost(beta, "beta", a);
  }
  if (!axis_order.empty()) {
    std::vector<int> sorted = axis_order;
    std::sort(sorted.begin(), sorted.end());
    bool perm = static_cast<int>(sorted.size()) == ndim();
    for (int a = 0; perm && a < ndim(); ++a) perm = sorted[a] == a;
    if (!perm) {
      throw std::invalid_argument("mesh axis_order must be a permutation of the " +
                                  std::to_string(ndim()) + " mesh axes (most major first), or empty");
    }
  }
  for (size_t k = 0; k < axes_costs.size(); ++k) {
    const AxesCost& c = axes_costs[k];
    const std::string where = "mesh axes_costs[" + std::to_string(k) + "]";
    if (c.axes.size() < 2) {
      throw std::invalid_argument(where + " names " + std::to_string(c.axes.size()) +
                                  " axes: a multi-axis cost needs two or more");
    }
    for (size_t i = 0; i < c.axes.size(); ++i) {
      if (c.axes[i] < 0 || c.axes[i] >= ndim() || (i && c.axes[i] <= c.axes[i - 1])) {
        throw std::invalid_argument(where + ": axes must be distinct, ascending and < " +
                                    std::to_string(ndim()));
      }
    }
    if (!(c.alpha >= 0.0) || !std::isfinite(c.alpha) || !(c.beta >= 0.0) || !std::isfinite(c.beta)) {
      throw std::invalid_argument(where + ": alpha and beta must be finite and >= 0");
    }
    for (size_t j = 0; j < k; ++j) {
      if (axes_costs[j].axes == c.axes) throw std::invalid_argument(where + ": axes given twice");
    }
  }
}

std::vector<int> Mesh::major_to_minor() const {
  if (!axis_order.empty()) return axis_order;
  std::vector<int> out(shape.size());
  for (int a = 0; a < ndim(); ++a) out[a] = a;
  return out;
}

namespace {

// Devices on mesh axis `axis`; throws std::invalid_argument for an axis the mesh lacks.
int64_t axis_size(const Mesh& mesh, int axis) {
  if (axis < 0 || axis >= mesh.ndim()) {
    throw std::invalid_argument("mesh axis " + std::to_string(axis) + " out of range for a " +
                                std::to_string(mesh.ndim()) + "-D mesh");
  }
  return mesh.shape[axis];
}

// n, alpha and beta of the flattened group of `axes` (n = 1 when every axis has one device).
struct Group {
  double n = 1.0, alpha = 0.0, beta = 0.0;
};

Group flattened(const Mesh& mesh, std::span<const int> axes) {
  Group g;
  std::vector<int> used;  // the axes of more than one device, ascending
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t n = axis_size(mesh, axes[i]);
    for (size_t j = 0; j < i; ++j) {
      if (axes[j] == axes[i]) {
        throw std::invalid_argument("mesh axis " + std::to_string(axes[i]) +
                                    " given twice for one collective");
      }
    }
    if (n <= 1) continue;
    g.n *= static_cast<double>(n);
    g.alpha = std::max(g.alpha, mesh.alpha[axes[i]]);
    g.beta = std::max(g.beta, mesh.beta[axes[i]]);
    used.insert(std::upper_bound(used.begin(), used.end(), axes[i]), axes[i]);
  }
  if (used.size() >= 2) {
    for (const AxesCost& c : mesh.axes_costs) {
      if (c.axes == used) {  // the group was measured as a whole
        g.alpha = c.alpha;
        g.beta = c.beta;
        break;
      }
    }
  }
  return g;
}

double group_collective(const Group& g, double bytes, double factor) {
  return g.n <= 1.0 ? 0.0 : g.alpha + g.beta * factor * bytes;
}

}  // namespace

double Mesh::all_reduce(double bytes, std::span<const int> axes) const {
  const Group g = flattened(*this, axes);
  return group_collective(g, bytes, 2.0 * (g.n - 1.0) / g.n);
}

double Mesh::combined_all_reduce(double bytes, std::span<const int> axes,
                                 double bucket_bytes) const {
  if (!(bucket_bytes > 0.0)) return all_reduce(bytes, axes);
  Group g = flattened(*this, axes);
  g.alpha *= std::min(1.0, bytes / bucket_bytes);
  return group_collective(g, bytes, 2.0 * (g.n - 1.0) / g.n);
}

double Mesh::all_gather(double bytes, std::span<const int> axes) const {
  const Group g = flattened(*this, axes);
  if (all_gather_forbidden && g.n > 1.0) return kForbiddenCollectiveCost;
  return group_collective(g, bytes, (g.n - 1.0) / g.n);
}

double Mesh::reduce_scatter(double bytes, std::span<const int> axes) const {
  const Group g = flattened(*this, axes);
  return group_collective(g, bytes, (g.n - 1.0) / g.n);
}

double Mesh::all_to_all(double bytes, std::span<const int> axes) const {
  const Group g = flattened(*this, axes);
  if (all_to_all_forbidden && g.n > 1.0) return kForbiddenCollectiveCost;
  return group_collective(g, bytes, (g.n - 1.0) / (g.n * g.n) * (g.n / 2.0));
}

double Mesh::collective_permute(double bytes, std::span<const int> axes) const {
  return group_collective(flattened(*this, axes), bytes, 1.0);
}

double Mesh::all_reduce(double bytes, int axis) const { return all_reduce(bytes, {&axis, 1}); }
double Mesh::all_gather(double bytes, int axis) const { return all_gather(bytes, {&axis, 1}); }
double Mesh::reduce_scatter(double bytes, int axis) const {
  return reduce_scatter(bytes, {&axis, 1});
}
double Mesh::all_to_all(double bytes, int axis) const { return all_to_all(bytes, {&axis, 1}); }

}  // namespace alpa
