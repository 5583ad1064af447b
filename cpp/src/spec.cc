// Sharding specs: divisibility, enumeration, resharding cost and Alpa-style names.
#include "alpa/spec.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace alpa {

namespace {

void check_spec(const Spec& spec, const Mesh& mesh, int rank, const char* what) {
  if (static_cast<int>(spec.size()) != mesh.ndim()) {
    throw std::invalid_argument(std::string(what) + " spec has " + std::to_string(spec.size()) +
                                " entries but the mesh has " + std::to_string(mesh.ndim()) +
                                " axes: give one tensor dim (or -1) per mesh axis");
  }
  for (size_t a = 0; a < spec.size(); ++a) {
    if (spec[a] < -1 || spec[a] >= rank) {
      throw std::invalid_argument(std::string(what) + " spec maps mesh axis " +
                                  std::to_string(a) + " to dim " + std::to_string(spec[a]) +
                                  " of a rank-" + std::to_string(rank) + " tensor");
    }
  }
}

double product(std::span<const int64_t> shape) {
  double n = 1.0;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

}  // namespace

Spec replicated_spec(const Mesh& mesh) { return Spec(mesh.shape.size(), -1); }

int64_t shards_of_dim(const Spec& spec, int dim, const Mesh& mesh) {
  int64_t n = 1;
  for (size_t a = 0; a < spec.size(); ++a) {
    if (spec[a] == dim) n *= mesh.shape[a];
  }
  return n;
}

int64_t num_shards(const Spec& spec, const Mesh& mesh) {
  int64_t n = 1;
  for (size_t a = 0; a < spec.size(); ++a) {
    if (spec[a] >= 0) n *= mesh.shape[a];
  }
  return n;
}

bool spec_fits(const Spec& spec, std::span<const int64_t> shape, const Mesh& mesh) {
  const int rank = static_cast<int>(shape.size());
  if (static_cast<int>(spec.size()) != mesh.ndim()) return false;
  for (int32_t d : spec) {
    if (d < -1 || d >= rank) return false;
  }
  for (int d = 0; d < rank; ++d) {
    if (shape[d] % shards_of_dim(spec, d, mesh) != 0) return false;
  }
  return true;
}

// Heuristic for meshes with >= 3 axes of size > 1 (none on 1-D and 2-D meshes). Measured on the
// 2-layer test GPT on 2x2x2 (docs/core_api.md): all 4^3 = 64 specs per rank-3 tensor (124 dot
// strategies) gave an 823k-column ILP whose root LP did not finish in 60 s; "each dim on a
// contiguous run of axes, <= 2 dims split" kept 290k columns (~11 s); two blocks keep 157k columns
// (~6 s CPU) at +2% objective against that rule on that GPT, and the same optimum as every spec on
// the test MLP. Requiring the split dims in ascending order as well (65k columns) cost +22%.
bool spec_in_two_blocks(const Spec& spec, const Mesh& mesh) {
  int split_axes = 0, changes = 0;
  int32_t prev = -1;
  for (int a = 0; a < mesh.ndim() && a < static_cast<int>(spec.size()); ++a) {
    if (mesh.shape[a] <= 1) continue;
    if (split_axes++ > 0 && spec[a] != prev) ++changes;
    prev = spec[a];
  }
  return split_axes < 3 || changes <= 1;
}

// Odometer over the axes of size > 1 (axis 0 most significant), each running -1, 0, .., rank-1;
// so the replicated spec comes first and the order depends on the shape only.
std::vector<Spec> enumerate_specs(std::span<const int64_t> shape, const Mesh& mesh) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int> free_axes;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (mesh.shape[a] > 1) free_axes.push_back(a);
  }
  std::vector<Spec> out;
  Spec spec = replicated_spec(mesh);
  while (true) {
    if (spec_fits(spec, shape, mesh) && spec_in_two_blocks(spec, mesh)) out.push_back(spec);
    int i = static_cast<int>(free_axes.size()) - 1;
    while (i >= 0 && spec[free_axes[i]] == rank - 1) spec[free_axes[i--]] = -1;
    if (i < 0) break;
    ++spec[free_axes[i]];
  }
  return out;
}

namespace {

// True if the axes of `spec` splitting dim d, in the mesh's axis order, start with every axis
// `keep` splits it with (size-1 axes ignored): dropping the others is then a plain all-gather /
// all-to-all of each device's tile.
bool kept_axes_lead(const Mesh& mesh, const std::vector<int>& order, const Spec& spec,
                    const Spec& keep, int d) {
  bool other_seen = false;
  for (int a : order) {
    if (mesh.shape[a] <= 1 || spec[a] != d) continue;
    if (keep[a] != d) {
      other_seen = true;
    } else if (other_seen) {
      return false;
    }
  }
  return true;
}

// True if the axes of `dst` splitting dim d, in the mesh's axis order, are the ones `src` splits
// it with, then the ones sliced in (replicated in src), then the ones moved in from another dim:
// the order XLA builds the dim in (it slices before it exchanges, and an exchanged axis lands
// minor to the ones there).
bool dst_axes_in_build_order(const Mesh& mesh, const std::vector<int>& order, const Spec& src,
                             const Spec& dst, int d) {
  int last = 0;
  for (int a : order) {
    if (mesh.shape[a] <= 1 || dst[a] != d) continue;
    const int step = src[a] == d ? 0 : src[a] == -1 ? 1 : 2;
    if (step < last) return false;
    last = step;
  }
  return true;
}

// Which tile of dim d's reshard XLA moves with a collective-permute (besides the all-gathers and
// all-to-alls reshard_cost charges): kDst, kSrc or kNone. XLA tiles a dim split over several axes
// major to minor and builds a dim from its kept axes, then the ones it slices in, then the ones
// an all-to-all brings (each lands minor to those there); a dst axis list in another order is a
// permute of the dst tile, and so is a swap (axis a: d -> e while b: e -> d). Kept axes that do
// not lead the src list, or an axis entering d no larger than one leaving it, cost a permute of
// the src tile: brought by an all-to-all while the leaving one is gathered; or sliced in, smaller,
// while the leaving one is gathered or moves to a later dim. With more than two axes the sizes
// compared are those of the groups: all axes moved in, sliced in, gathered, leaving (2x2x2:
// [S(y,z), R] -> [S(x), R] slices 2 devices' worth in while 4 leave, a permute, as on 2x4
// [S(y), R] -> [S(x), R]; [S(x,y), S(z)] -> [R, S(x,y)] brings 4 in while 2 leave, none).
// Checked against XLA's compiled reshards of every rank-2 spec pair on 2x2, 2x4, 4x2 and 2x2x2
// meshes (and rank 3 on 2x4): each permute predicted where XLA compiles one, except where XLA permutes
// instead of the all-gather / all-to-all charged (equal costs in the model).
enum class Permute { kNone, kSrc, kDst };

Permute dim_permute(const Mesh& mesh, const std::vector<int>& order, const Spec& src,
                    const Spec& dst, int d) {
  if (!dst_axes_in_build_order(mesh, order, src, dst, d)) return Permute::kDst;
  const bool src_tile = !kept_axes_lead(mesh, order, src, dst, d);
  // Products of the sizes of the axes that enter d (moved in from another dim, or sliced in) and
  // that leave it (gathered, or moved to a later dim); a swap's two axes are in neither.
  int64_t moved_in = 1, sliced_in = 1, gathered = 1, leaving = 1;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (mesh.shape[a] <= 1 || (src[a] == d) == (dst[a] == d)) continue;
    bool swap = false;
    for (int b = 0; b < mesh.ndim() && !swap; ++b) {
      swap = mesh.shape[b] > 1 && src[a] >= 0 && dst[a] >= 0 && src[b] == dst[a] && dst[b] == src[a];
    }
    if (swap) {
      if (d < (dst[a] == d ? src[a] : dst[a])) return Permute::kDst;  // charged once, at its lower dim
      continue;
    }
    if (dst[a] == d) {
      (src[a] == -1 ? sliced_in : moved_in) *= mesh.shape[a];
    } else {
      if (dst[a] == -1) gathered *= mesh.shape[a];
      if (dst[a] == -1 || dst[a] > d) leaving *= mesh.shape[a];
    }
  }
  const bool brought = moved_in > 1 && gathered > 1 && moved_in <= gathered;
  const bool sliced = sliced_in > 1 && leaving > 1 && sliced_in < leaving;
  return src_tile || brought || sliced ? Permute::kSrc : Permute::kNone;
}

double reorder_cost(const Mesh& mesh, std::span<const int64_t> shape, double dtype_bytes,
                    const Spec& src, const Spec& dst) {
  const std::vector<int> order = mesh.major_to_minor();
  const double bytes = product(shape) * dtype_bytes;
  double cost = 0.0;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    const Permute p = dim_permute(mesh, order, src, dst, d);
    if (p == Permute::kNone) continue;
    std::vector<int> axes;
    for (int a = 0; a < mesh.ndim(); ++a) {
      if (mesh.shape[a] > 1 && (src[a] == d || dst[a] == d)) axes.push_back(a);
    }
    const Spec& tile = p == Permute::kDst ? dst : src;
    cost += mesh.collective_permute(bytes / static_cast<double>(num_shards(tile, mesh)), axes);
  }
  return cost;
}

}  // namespace

// Per mesh axis a with n > 1 devices, src dim ds = src[a], dst dim dd = dst[a]:
//   ds == dd or ds == -1 (replicated -> anything): 0, a local slice;
//   dd == -1 (split -> replicated): all_gather over a;
//   ds != dd, both split: all_to_all over a.
// Both collectives are charged with B = bytes of the tensor as held per device in the *dst*
// layout (full bytes / num_shards(dst)): for the all-gather that is the gathered buffer, for the
// all-to-all the buffer each device exchanges (split by n on a either way; the other axes as in
// dst). The axes gathered are charged as one all-gather over all of them, the axes exchanged as
// one all-to-all (Mesh's multi-axis collectives: gathering a dim split over 8x8 devices moves
// 63/64 of it, not 2 x 7/8). Plus, per tensor dim, the collective-permute XLA adds where tiles
// land on the wrong devices in the mesh's axis order (reorder_cost above).
double reshard_cost(const Mesh& mesh, std::span<const int64_t> shape, double dtype_bytes,
                    const Spec& src, const Spec& dst) {
  const int rank = static_cast<int>(shape.size());
  check_spec(src, mesh, rank, "source");
  check_spec(dst, mesh, rank, "destination");
  if (src == dst) return 0.0;
  const double per_device =
      product(shape) * dtype_bytes / static_cast<double>(num_shards(dst, mesh));
  std::vector<int> gathered, exchanged;
  for (int a = 0; a < mesh.ndim(); ++a) {
    if (mesh.shape[a] <= 1 || src[a] == dst[a] || src[a] == -1) continue;
    (dst[a] == -1 ? gathered : exchanged).push_back(a);
  }
  return mesh.all_gather(per_device, gathered) + mesh.all_to_all(per_device, exchanged) +
         reorder_cost(mesh, shape, dtype_bytes, src, dst);
}

std::string spec_to_string(const Spec& spec, int rank) {
  std::string s;
  for (int d = 0; d < rank; ++d) {
    std::string axes;
    for (size_t a = 0; a < spec.size(); ++a) {
      if (spec[a] == d) axes += std::to_string(a);
    }
    s += axes.empty() ? "R" : "S" + axes;
  }
  return s;
}

}  // namespace alpa
