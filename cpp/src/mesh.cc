// Logical mesh: device count, validation and the alpha-beta cost of one collective per axis
// (formulas from DESIGN.md, without Alpa's small per-collective penalty constants).
#include "alpa/mesh.h"

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

// alpha + beta * factor * bytes, or 0 on an axis of one device.
double collective(const Mesh& mesh, int axis, double bytes, double factor) {
  int64_t n = axis_size(mesh, axis);
  if (n <= 1) return 0.0;
  return mesh.alpha[axis] + mesh.beta[axis] * factor * bytes;
}

}  // namespace

double Mesh::all_reduce(double bytes, int axis) const {
  double n = static_cast<double>(axis_size(*this, axis));
  return collective(*this, axis, bytes, 2.0 * (n - 1.0) / n);
}

double Mesh::all_gather(double bytes, int axis) const {
  double n = static_cast<double>(axis_size(*this, axis));
  return collective(*this, axis, bytes, (n - 1.0) / n);
}

double Mesh::reduce_scatter(double bytes, int axis) const {
  double n = static_cast<double>(axis_size(*this, axis));
  return collective(*this, axis, bytes, (n - 1.0) / n);
}

double Mesh::all_to_all(double bytes, int axis) const {
  double n = static_cast<double>(axis_size(*this, axis));
  return collective(*this, axis, bytes, (n - 1.0) / (n * n) * (n / 2.0));
}

}  // namespace alpa
