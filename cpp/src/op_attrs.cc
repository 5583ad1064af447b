// The attrs decoders (op_attrs.h). Each reads its layout front to back with a Reader, which
// records how long the attrs must be for the counts they hold and checks that once at the end,
// so a short or long array is reported as "<KIND> attrs have N entries, expected M (layout)".
#include "alpa/op_attrs.h"

#include <algorithm>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace alpa {
namespace {

class Reader {
 public:
  Reader(const char* kind, const char* layout, std::span<const int64_t> attrs)
      : kind_(kind), layout_(layout), attrs_(attrs) {}

  // The next entry (0 past the end: finish() then reports the length).
  int64_t scalar() {
    const int64_t x = pos_ < attrs_.size() ? attrs_[pos_] : 0;
    ++pos_;
    return x;
  }

  // The next entry as a non-negative index named `what` (0 past the end, as for scalar()).
  int64_t index(const char* what) {
    const int64_t x = scalar();
    if (x < 0) fail(std::string(what) + " is " + std::to_string(x) + ", expected >= 0");
    return x;
  }

  // The next entry as the length `what` of lists that follow: it must be present, since the rest
  // of the layout depends on it, and no more than the entries there are.
  int64_t count(const char* what) {
    if (pos_ >= attrs_.size()) {
      fail("have " + std::to_string(attrs_.size()) + " entries, too few to hold " + what);
    }
    const int64_t n = index(what);
    if (n > static_cast<int64_t>(attrs_.size())) {
      fail(std::string(what) + " is " + std::to_string(n) + ", more than the " +
           std::to_string(attrs_.size()) + " entries");
    }
    return n;
  }

  // The next n entries (those present; finish() reports a shortfall).
  Dims list(int64_t n) {
    const size_t begin = std::min(pos_, attrs_.size());
    pos_ += static_cast<size_t>(n);
    const size_t end = std::min(pos_, attrs_.size());
    return Dims(attrs_.begin() + begin, attrs_.begin() + end);
  }

  // A count-prefixed list: n, then n entries.
  Dims counted_list(const char* what) { return list(count(what)); }

  // Throws unless exactly every entry was read.
  void finish() const {
    if (pos_ != attrs_.size()) {
      fail("have " + std::to_string(attrs_.size()) + " entries, expected " + std::to_string(pos_));
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(std::string(kind_) + " attrs " + what + " (layout " + layout_ +
                                ")");
  }

  const char* kind_;
  const char* layout_;
  std::span<const int64_t> attrs_;
  size_t pos_ = 0;
};

// The GATHER / SCATTER layout [index_vector_dim, then each list as n, values*n]: fills the named
// lists in order and returns index_vector_dim.
int64_t read_index_lists(const char* kind, std::span<const int64_t> attrs,
                         std::initializer_list<std::pair<const char*, Dims*>> lists) {
  std::string layout = "[index_vector_dim";
  for (const auto& [name, out] : lists) layout += std::string(", n, ") + name + "*n";
  layout += "]";
  Reader r(kind, layout.c_str(), attrs);
  const int64_t index_vector_dim = r.scalar();
  for (const auto& [name, out] : lists) {
    *out = r.counted_list(("count of " + std::string(name)).c_str());
  }
  r.finish();
  return index_vector_dim;
}

// A layout that is one list of dims (any length; Graph::validate checks it against ranks).
Dims all_dims(std::span<const int64_t> attrs) { return Dims(attrs.begin(), attrs.end()); }

}  // namespace

ParameterAttrs decode_parameter_attrs(std::span<const int64_t> attrs) {
  Reader r("PARAMETER", "[arg_index]", attrs);
  ParameterAttrs a{r.index("arg_index")};
  r.finish();
  return a;
}

OutputAttrs decode_output_attrs(std::span<const int64_t> attrs) {
  Reader r("OUTPUT", "[output_index]", attrs);
  OutputAttrs a{r.index("output_index")};
  r.finish();
  return a;
}

ElementwiseAttrs decode_elementwise_attrs(std::span<const int64_t> attrs) {
  int64_t batch_dims = 0;
  if (const auto two = std::find(attrs.begin(), attrs.end(), int64_t{-2}); two != attrs.end()) {
    if (attrs.end() - two != 2 || two[1] < 1) {
      throw std::invalid_argument(
          "ELEMENTWISE attrs: -2 must be followed by exactly one batch dim count >= 1, last "
          "(layout [unshardable dims..., -1, runtime-indexed dims..., -2, batch dims])");
    }
    batch_dims = two[1];
    attrs = attrs.first(static_cast<size_t>(two - attrs.begin()));
  }
  const auto sep = std::find(attrs.begin(), attrs.end(), int64_t{-1});
  ElementwiseAttrs a{Dims(attrs.begin(), sep), {}, batch_dims};
  if (sep == attrs.end()) return a;
  a.runtime_indexed_dims.assign(sep + 1, attrs.end());
  if (std::find(a.runtime_indexed_dims.begin(), a.runtime_indexed_dims.end(), int64_t{-1}) !=
      a.runtime_indexed_dims.end()) {
    throw std::invalid_argument(
        "ELEMENTWISE attrs have more than one -1 (layout [unshardable dims..., -1, runtime-indexed "
        "dims...])");
  }
  for (int64_t d : a.runtime_indexed_dims) {
    if (std::find(a.unshardable_dims.begin(), a.unshardable_dims.end(), d) ==
        a.unshardable_dims.end()) {
      a.unshardable_dims.push_back(d);
    }
  }
  return a;
}

BroadcastAttrs decode_broadcast_attrs(std::span<const int64_t> attrs) {
  return {all_dims(attrs)};
}

TransposeAttrs decode_transpose_attrs(std::span<const int64_t> attrs) {
  return {all_dims(attrs)};
}

ReduceAttrs decode_reduce_attrs(std::span<const int64_t> attrs) {
  return {all_dims(attrs)};
}

DotAttrs decode_dot_attrs(std::span<const int64_t> attrs) {
  Reader r("DOT", "[nb, lhs_batch*nb, rhs_batch*nb, nc, lhs_contracting*nc, rhs_contracting*nc]",
           attrs);
  DotAttrs a;
  const int64_t nb = r.count("nb");
  a.lhs_batch = r.list(nb);
  a.rhs_batch = r.list(nb);
  const int64_t nc = r.count("nc");
  a.lhs_contracting = r.list(nc);
  a.rhs_contracting = r.list(nc);
  r.finish();
  return a;
}

ConvAttrs decode_conv_attrs(std::span<const int64_t> attrs) {
  Reader r("CONVOLUTION",
           "[input_batch, input_feature, ns, input_spatial*ns, kernel_input_feature, "
           "kernel_output_feature, kernel_spatial*ns, output_batch, output_feature, "
           "output_spatial*ns, feature_group_count, batch_group_count]",
           attrs);
  ConvAttrs a;
  a.input_batch = r.scalar();
  a.input_feature = r.scalar();
  const int64_t ns = r.count("ns");
  a.input_spatial = r.list(ns);
  a.kernel_input_feature = r.scalar();
  a.kernel_output_feature = r.scalar();
  a.kernel_spatial = r.list(ns);
  a.output_batch = r.scalar();
  a.output_feature = r.scalar();
  a.output_spatial = r.list(ns);
  a.feature_group_count = r.scalar();
  a.batch_group_count = r.scalar();
  r.finish();
  return a;
}

GatherAttrs decode_gather_attrs(std::span<const int64_t> attrs) {
  GatherAttrs a;
  a.index_vector_dim =
      read_index_lists("GATHER", attrs,
                       {{"offset_dims", &a.offset_dims},
                        {"collapsed_slice_dims", &a.collapsed_slice_dims},
                        {"start_index_map", &a.start_index_map},
                        {"operand_batching_dims", &a.operand_batching_dims},
                        {"start_indices_batching_dims", &a.start_indices_batching_dims},
                        {"slice_sizes", &a.slice_sizes}});
  return a;
}

ScatterAttrs decode_scatter_attrs(std::span<const int64_t> attrs) {
  ScatterAttrs a;
  a.index_vector_dim =
      read_index_lists("SCATTER", attrs,
                       {{"update_window_dims", &a.update_window_dims},
                        {"inserted_window_dims", &a.inserted_window_dims},
                        {"scatter_dims_to_operand_dims", &a.scatter_dims_to_operand_dims},
                        {"input_batching_dims", &a.input_batching_dims},
                        {"scatter_indices_batching_dims", &a.scatter_indices_batching_dims}});
  return a;
}

void check_no_attrs(const char* kind, std::span<const int64_t> attrs) {
  Reader(kind, "[]", attrs).finish();
}

}  // namespace alpa
