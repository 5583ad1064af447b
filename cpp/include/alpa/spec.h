// A sharding spec: for each mesh axis, the tensor dim it splits, or -1 (replicated on that axis).
// Several axes may split one dim; they then split it in ascending axis order (major to minor),
// i.e. spec {0, 0} on mesh (2, 4) is PartitionSpec(("x", "y"),).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "alpa/mesh.h"

namespace alpa {

using Spec = std::vector<int32_t>;  // size == mesh.ndim()

Spec replicated_spec(const Mesh& mesh);
// Shards along tensor dim `dim` (product of the sizes of the axes mapped to it).
int64_t shards_of_dim(const Spec& spec, int dim, const Mesh& mesh);
// Total number of distinct shards (product over used axes).
int64_t num_shards(const Spec& spec, const Mesh& mesh);
bool spec_fits(const Spec& spec, std::span<const int64_t> shape, const Mesh& mesh);  // divisible
// The search-space heuristic for meshes with >= 3 axes of size > 1: true if, over those axes in
// order, the spec's entries change value at most once, i.e. the spec is a 2-D spec of the mesh
// viewed as (axes before a cut) x (axes from the cut on) for some cut. So at most two tensor dims
// are split, each over a contiguous run of axes. Always true with <= 2 axes of size > 1 (1-D and
// 2-D meshes keep every spec). Entries on size-1 axes are ignored.
bool spec_in_two_blocks(const Spec& spec, const Mesh& mesh);
// Every spec of `shape` on `mesh` whose splits divide the dims and that is in two blocks (above);
// axes of size 1 always -1. Deterministic order, the replicated spec first. Same shape -> same list.
std::vector<Spec> enumerate_specs(std::span<const int64_t> shape, const Mesh& mesh);
// Cost of turning a tensor laid out as `src` into `dst` (per device, alpha-beta):
// same: 0; replicated->split: 0 (local slice); split->replicated: all-gather;
// split on dim a -> split on dim b: all-to-all. Summed over mesh axes; plus a collective-permute
// of a tile per dim whose tiles XLA must move between devices in the mesh's axis_order (spec.cc).
double reshard_cost(const Mesh& mesh, std::span<const int64_t> shape, double dtype_bytes,
                    const Spec& src, const Spec& dst);
std::string spec_to_string(const Spec& spec, int rank);  // e.g. "S0R", "S01R", "RR" (Alpa style)

}  // namespace alpa
