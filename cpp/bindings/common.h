// Helpers shared by the binding files of alpa_pass._core (module.cc, problem.cc).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <utility>
#include <vector>

namespace alpa::bindings {

namespace nb = nanobind;

template <typename T>
using In1 = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using InCost = nb::ndarray<const double, nb::c_contig, nb::device::cpu>;
template <typename T>
using Out = nb::ndarray<nb::numpy, T>;

template <typename T>
std::vector<T> to_vector(const In1<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.shape(0));
}

// Getters returning arrays that own their memory (the default reference_internal would clash).
constexpr auto kOwned = nb::rv_policy::automatic;

// A numpy array that owns `v` (moved to the heap).
template <typename T>
Out<T> to_numpy(std::vector<T> v, std::vector<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Out<T>(heap->data(), shape.size(), shape.data(), owner);
}

// A read-only numpy view of a member vector of the bound object `self`, keeping `self` alive.
template <typename T, typename Self>
nb::ndarray<nb::numpy, const T, nb::ndim<1>> view(const Self& self, const std::vector<T>& v) {
  return nb::ndarray<nb::numpy, const T, nb::ndim<1>>(v.data(), {v.size()}, nb::find(&self));
}

}  // namespace alpa::bindings
