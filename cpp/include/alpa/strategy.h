// Per-op sharding strategies and the registry of rules that generate them (one rule per op family).
#pragma once
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "alpa/graph.h"
#include "alpa/mesh.h"
#include "alpa/spec.h"

namespace alpa {

struct CoreOptions {
  // Heavy ops (dot, convolution) may run replicated on a mesh axis of size > 1 only if no strategy
  // uses every such axis (Alpa: "we disallow replicated computation for heavy operators").
  bool allow_replicated_heavy_ops = false;
  // Strategies may split one tensor dim over several mesh axes of size > 1 (Alpa's
  // `allow_mixed_mesh_shape`, off there by default: a [S01, R] activation between Megatron layers
  // trades each all-reduce for an all-to-all plus all-gathers). Off: a node keeps only strategies
  // whose specs split each dim over at most one such axis (all of them if none does).
  bool allow_mixed_mesh_shape = true;
  // Cost per FLOP of per-device compute, in the mesh's alpha/beta units. The default, 1e-4 with
  // beta 1 per byte, prices 1e4 FLOPs like one byte sent (an H100 does ~2e3 bf16 FLOPs in the
  // time NVLink moves a byte, ~2e4 over InfiniBand): a tie-breaker between plans of the same
  // communication, and big replicated work (a [N, K, D] broadcast, RNG over a large tensor) is
  // split rather than run whole on every device to save a small all-reduce.
  double compute_cost_per_flop = 1e-4;
  // Cost per FLOP of a dot or convolution whose operands are 16-bit floats (bf16, f16: 2-byte
  // elements); <= 0: compute_cost_per_flop (a measured profile sets both: matmul FLOP/s per dtype).
  double compute_cost_per_flop_half = 0.0;
  // Cost per byte a dot or convolution moves through its device's memory: its operands in the
  // layouts it reads them and its result, per device. > 0: each of its strategies' compute is the
  // larger of its FLOP cost and this byte cost (a roofline: a small or skinny dot is bound by
  // memory bandwidth). Other ops keep their FLOP cost and reshards their collectives' (s27, the
  // small GPT on 8 CPU devices with the measured profile: costing each elementwise op's bytes
  // predicted ZeRO-2 1.7x faster than data parallelism, measured 2%: XLA fuses elementwise chains;
  // costing each reshard's local copy gave data parallelism's plan 18 ms of copies in the merged
  // ILP and ranked Megatron, measured slowest, first). 0: FLOPs only (a measured profile sets
  // 1 / the device's memory bandwidth).
  double compute_cost_per_byte = 0.0;
  // Merge followers (elementwise, transpose, reduce, output, ...) into the node they follow.
  bool merge_followers = true;
  // Nodes whose output has at most this many elements are computed replicated (one strategy).
  int64_t replicate_below_numel = 1;
  // Cost per per-device byte of holding an argument (PARAMETER): a tie-breaker that prefers
  // split arguments when splitting is otherwise free (e.g. the batch of a data-parallel step).
  double memory_cost_per_byte = 1e-9;
  // Per-device memory budget in bytes (peak of live values, see memory.h); <= 0: no budget.
  double memory_budget_per_device = 0.0;
  // Solve repeated layers once: merge the ILP groups of structurally repeated nodes (repeat.h).
  bool tie_repeated_layers = true;
  // XLA's all-reduce combiner merges independent all-reduces into one of up to this many bytes
  // (XLA's default threshold on GPU, 30 MiB): an all-reduce of partial sums that
  // combinable_reductions() marks pays alpha * min(1, bytes / this) of one collective's latency,
  // its share of the combined one, plus its full bandwidth term. <= 0: every all-reduce pays alpha.
  double all_reduce_combine_bytes = 30.0 * 1024 * 1024;
};

struct Strategy {
  Spec out;                 // spec of the node's result
  std::vector<Spec> ins;    // required spec of each operand (same order as graph operands)
  double compute = 0.0;     // compute cost (already weighted by compute_cost_per_flop)
  double comm = 0.0;        // communication inside the op (e.g. all-reduce of partial sums)
  double memory = 0.0;      // per-device bytes of the result in layout `out` (set by the assembly)
  std::string name;         // e.g. "dot b0->x rfree->y"
};

struct NodeStrategies {
  std::vector<Strategy> list;
  // If >= 0: this node follows operand node `follow`: list[k] corresponds 1:1 to the leader's
  // strategy k (same length, derived from it), and the node is merged into the leader's ILP group.
  int64_t follow = -1;
  // How many of `list` count when a follower picks its leader (elementwise.cc: the operand with
  // the most strategies); < 0: all. The gather's vocab-split variants repeat a result spec of
  // another strategy with the table split instead: they add no choice of result layout.
  int64_t leader_weight = -1;
};

// Context given to each rule. `done[u]` holds the strategies of every node u < v already built,
// so a rule can build a follower list from its leader's list.
struct RuleContext {
  const Graph& graph;
  const Mesh& mesh;
  const CoreOptions& options;
  const std::vector<NodeStrategies>& done;
  // combinable[v] != 0: v's all-reduce of partial sums is combined (combinable_reductions); empty:
  // none is.
  std::span<const char> combinable = {};
  // A DOT or CONVOLUTION with at most this many FLOPs may also run replicated on mesh axes (the
  // others must use every axis: allow_replicated_heavy_ops); 0: none may. tiny_heavy_flops().
  double tiny_heavy_flops = 0.0;
};

// The FLOPs below which a heavy op counts as tiny: kTinyHeavyFraction of the graph's largest DOT
// or CONVOLUTION. Alpa forbids heavy ops replicated on a mesh axis, so that a plan never trades
// communication for redundant matmuls; an op that small costs nothing replicated, and forced to
// split it drags what follows it in its merged group along (a jvp's tangent W @ e_i, a (64,)
// vector broadcast over 16384 collocation points: the broadcast split the hidden dim and every
// use resharded the (16384, 64) activation, a PINN's L-BFGS line search 7x its refined plan).
inline constexpr double kTinyHeavyFraction = 1.0 / 65536.0;
double tiny_heavy_flops(const Graph& g);

// Nodes whose all-reduce of partial sums XLA combines with the others like them into few large
// collectives: no DOT or CONVOLUTION is reachable from the node's result, so nothing but the step's
// end waits for it (a weight's gradient, the loss; not an activation or an activation's gradient,
// which the next matmul needs), and the node runs once per step: `weights[v]` <= 1 (a loop body's
// reduction runs every trip; empty `weights` = 1 each). Measured on 8 CPU devices: data
// parallelism's ~30 gradient all-reduces compile to one.
std::vector<char> combinable_reductions(const Graph& g, std::span<const double> weights = {});

// The cost of node v's all-reduce of partial sums (`bytes` per device, over mesh `axes`):
// Mesh::all_reduce, with only its combined share of alpha when ctx.combinable marks v.
double partial_sum_all_reduce(const RuleContext& ctx, int64_t v, double bytes,
                              std::span<const int> axes);

using RuleFn = std::function<NodeStrategies(const RuleContext&, int64_t v)>;

// The built-in rule of `kind` (src/rules/*.cc; the registry is fixed, rules are not pluggable).
const RuleFn& rule_for(OpKind kind);

// FLOPs of node v (dot: 2*prod(out)*prod(contracting); conv likewise; others: numel).
double node_flops(const Graph& g, int64_t v);

// Node v's strategies costed at the measured rates of `options` when v is a dot or convolution (the
// rules cost FLOPs at compute_cost_per_flop; `list[k].memory` set): 16-bit operands at
// compute_cost_per_flop_half, and with compute_cost_per_byte > 0 each strategy's compute is the
// larger of that and the bytes it moves per device (each operand in the layout it reads, its result).
void apply_measured_rates(const Graph& g, const Mesh& mesh, const CoreOptions& options, int64_t v,
                          std::vector<Strategy>& list);

}  // namespace alpa
