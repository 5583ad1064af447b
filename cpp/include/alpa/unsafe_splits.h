// Splits XLA's SPMD partitioner does not carry out correctly, removed from every node's strategies
// right after its rule (problem.cc), so no plan contains one:
//
// * Zero-size values are never split: a result with a 0-sized dim split on another dim cannot be
//   read back (x[8,16] @ w[16,0] planned P(('x','y'), None) fails in device_get).
// * Runtime-indexed dims are never split or resharded. XLA folds a partition slice (the local
//   slice of a replicated -> split reshard) of a dynamic_slice result along a dim its runtime start
//   indexes into the dynamic_slice, clamping the start for the shard's size instead of the
//   slice's. Minimal repro (jax 0.10.2, 8 CPU devices, mesh ("x", "y") = (2, 4); jax 0.12.0 gets
//   it right, the rule stays for the jax versions that do not):
//
//     wsc = lambda v, s: lax.with_sharding_constraint(v, NamedSharding(mesh, s))
//     x, i = jnp.arange(24.0).reshape(12, 2), 6      # jax clamps the start 6 to 4: rows 4..11
//     f = lambda x, i: wsc(wsc(lax.dynamic_slice(x, (i, 0), (8, 2)), P()), P("x", None))
//     jax.jit(f)(x, i)   # shard k: dynamic_slice(x, clamp(i + 4k, 0, 8), 4): rows 6..9, 8..11
//
//   The same holds through a transpose of the slice and for a gather's sliced offset dims, with
//   sharding constraints between, so the dims are followed forward through every op that keeps
//   them (runtime_indexed_dims) and no value on that path is split or read split along them. A
//   dynamic_slice / dynamic_update_slice operand is not split along its indexed dims either (it is
//   read whole there, so it is never resharded into the op). A dynamic_update_slice's result is
//   kept whole along them too, but not followed further: it writes its update in place, so no
//   later op reads an element a runtime start picked (checked on jax 0.10.2 against jax.jit with
//   the result split, replicated then split, and reshaped then split, starts clamped or not).
#pragma once
#include <cstdint>
#include <vector>

#include "alpa/graph.h"
#include "alpa/op_attrs.h"
#include "alpa/strategy.h"

namespace alpa {

// Per node, the result dims whose elements a runtime start index picks: ELEMENTWISE attrs'
// runtime_indexed_dims (dynamic_slice; a dynamic_update_slice's are its own only, not followed)
// and GATHER offset dims sliced
// smaller than the operand, followed forward (elementwise, transpose, broadcast, reshape, reduce
// and dot dims map one to one, a reshape marks each dim group holding an indexed dim of size > 1;
// a gather's indices dims map to its batch dims, operand dims to offset dims, a picked-from
// operand dim marks every batch dim; a convolution's batch, output feature and spatial dims follow
// the input batch, kernel output feature (or, grouped, input feature) and input or kernel spatial
// dims, its contracted features do not (with batch_group_count > 1, and for a scatter, every
// result dim is marked when an operand has any); plus, for a dynamic_slice /
// dynamic_update_slice, those dims of its operand 0.
// Sorted, distinct.
std::vector<Dims> runtime_indexed_dims(const Graph& g);

// Removes node v's strategies whose result or operand specs split a zero-size value or a dim in
// `indexed` (runtime_indexed_dims). A follower that loses strategies becomes its own group
// (ns.follow = -1); a node left with none gets one all-replicated strategy (compute =
// node_flops * options.compute_cost_per_flop), which every op can run.
void drop_unsafe_splits(const RuleContext& ctx, const std::vector<Dims>& indexed, int64_t v,
                        NodeStrategies& ns);

}  // namespace alpa
