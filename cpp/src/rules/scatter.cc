// SCATTER (operands [input, scatter_indices, update]). Each mesh axis of size > 1 may
//  (a) split an input window dim (not inserted, not indexed by scatter_dims_to_operand_dims, not
//      input-batching) that the update covers whole: input, result and the matching update
//      window dim split alike, indices replicated; or
//  (b) split an update scatter dim (and the matching indices dim) with the input and the result
//      replicated on the axis: each device scatters its share, the partial results are
//      all-reduced over the axis;
//  (c) split a batching dim (input_batching_dims[i] with scatter_indices_batching_dims[i] and its
//      update scatter dim): input, indices, update and result split alike, no communication;
//  (d) split an indexed input dim the update inserts: input and result split, no communication
//      (on one axis, the others all splitting something: vocab_split_as_megatron);
//  or nothing. The embedding gradient (scatter-add of [B,S,H] into [V,H]) thus gets "split H"
//  and "split B + all-reduce"; the gradient of take_along_axis over the vocabulary (scatter of
//  [B,S,1] into [B,S,V] with B and S batching dims) gets B and S split like the logits (before
//  (c) it could only be replicated: GPT 1.3B on 8x8 held its [64,1024,51200] f32, 12.8 GB, whole
//  on every device).
#include <stdexcept>

#include "rules.h"

namespace alpa::rules {
namespace {

struct ScatterOption {
  int32_t input_dim = -1, update_dim = -1, indices_dim = -1;
  bool partial = false;
  std::string label;
  bool indexed = false;  // option (d)
};

std::vector<ScatterOption> scatter_options(const Graph& g, int64_t v) {
  const ScatterAttrs a = decode_scatter_attrs(g.node_attrs(v));
  const int64_t index_vector_dim = a.index_vector_dim;
  const Dims &window = a.update_window_dims, &inserted = a.inserted_window_dims;
  const Dims &indexed = a.scatter_dims_to_operand_dims, &input_batching = a.input_batching_dims;
  const auto ops = g.operands(v);
  const auto input = g.shape(ops[0]), update = g.shape(ops[2]);
  std::vector<ScatterOption> options;
  size_t k = 0;  // k-th input window dim <-> window[k]
  for (int64_t d = 0; d < static_cast<int64_t>(input.size()); ++d) {
    if (index_of(inserted, d) >= 0 || index_of(input_batching, d) >= 0) continue;
    if (k >= window.size()) throw std::invalid_argument("scatter update_window_dims too short");
    const int64_t ud = window[k++];
    if (index_of(indexed, d) < 0 && checked_dim(update, ud, "scatter update window") == input[d]) {
      options.push_back({static_cast<int32_t>(d), static_cast<int32_t>(ud), -1, false,
                         "win" + std::to_string(d)});
    }
  }
  // (d) an indexed input dim the update inserts (one index each: the embedding gradient's vocab
  //     dim): input and result split on it, indices and update whole; each device adds the
  //     updates whose index falls in its rows (the partitioner masks the others), no communication.
  for (int64_t d : indexed) {
    if (index_of(inserted, d) >= 0 && index_of(input_batching, d) < 0 && input[d] > 1) {
      options.push_back({static_cast<int32_t>(d), -1, -1, false, "idx" + std::to_string(d), true});
    }
  }
  int64_t id = 0;  // indices dims other than index_vector_dim, in order
  for (int64_t ud = 0; ud < static_cast<int64_t>(update.size()); ++ud) {
    if (index_of(window, ud) >= 0) continue;
    if (id == index_vector_dim) ++id;
    checked_dim(g.shape(ops[1]), id, "scatter indices");
    const int64_t b = index_of(a.scatter_indices_batching_dims, id);
    if (b >= 0 && b < static_cast<int64_t>(input_batching.size()) &&
        input[input_batching[b]] == update[ud]) {
      // (c) a batching dim: each device scatters its batch rows into its own rows of the input.
      options.push_back({static_cast<int32_t>(input_batching[b]), static_cast<int32_t>(ud),
                         static_cast<int32_t>(id++), false, "bat" + std::to_string(ud)});
      continue;
    }
    options.push_back({-1, static_cast<int32_t>(ud), static_cast<int32_t>(id++), true,
                       "upd" + std::to_string(ud)});
  }
  return options;
}

// choice[k] for the k-th split axis: 0 = none, o + 1 = options[o]. False if a split does not fit.
bool build(const RuleContext& ctx, int64_t v, const std::vector<ScatterOption>& options,
           const std::vector<int>& axes, const std::vector<size_t>& choice, Strategy& s) {
  const Graph& g = ctx.graph;
  const auto ops = g.operands(v);
  Spec input = replicated_spec(ctx.mesh), indices = input, update = input;
  std::vector<std::string> labels(ctx.mesh.ndim());
  for (size_t k = 0; k < axes.size(); ++k) {
    if (choice[k] == 0) continue;
    const ScatterOption& o = options[choice[k] - 1];
    input[axes[k]] = o.input_dim;
    indices[axes[k]] = o.indices_dim;
    update[axes[k]] = o.update_dim;
    labels[axes[k]] = o.label;
  }
  if (!spec_fits(input, g.shape(ops[0]), ctx.mesh) ||
      !spec_fits(indices, g.shape(ops[1]), ctx.mesh) ||
      !spec_fits(update, g.shape(ops[2]), ctx.mesh)) {
    return false;
  }
  std::vector<int> partial;  // reduced by one all-reduce over all of them
  for (size_t k = 0; k < axes.size(); ++k) {
    if (choice[k] > 0 && options[choice[k] - 1].partial) partial.push_back(axes[k]);
  }
  s.comm += partial_sum_all_reduce(ctx, v, bytes_per_device(ctx, v, input), partial);
  s.compute = compute_cost(ctx, g.numel(ops[2]), num_shards(update, ctx.mesh));
  s.name = strategy_name("scatter", labels);
  s.out = input;
  s.ins = {std::move(input), std::move(indices), std::move(update)};
  return true;
}

// Option (d) on one axis only, with every other axis splitting something (as the vocab-split
// lookup in gather.cc): (d) on any subset of axes would grow a 3-D mesh's embedding gradient from
// 64 to 125 strategies.
bool vocab_split_as_megatron(const std::vector<ScatterOption>& options, const std::vector<size_t>& choice) {
  size_t indexed = 0, none = 0;
  for (size_t c : choice) {
    if (c == 0) {
      ++none;
    } else if (options[c - 1].indexed) {
      ++indexed;
    }
  }
  return indexed == 0 || (indexed == 1 && none == 0);
}

NodeStrategies scatter_rule(const RuleContext& ctx, int64_t v) {
  const std::vector<ScatterOption> options = scatter_options(ctx.graph, v);
  const std::vector<int> axes = split_axes(ctx.mesh);
  std::vector<size_t> choice(axes.size(), 0);
  NodeStrategies ns;
  do {
    Strategy s;
    if (vocab_split_as_megatron(options, choice) && build(ctx, v, options, axes, choice, s)) {
      ns.list.push_back(std::move(s));
    }
  } while (next_choice(choice, options.size() + 1));
  return ns;
}

}  // namespace

void register_scatter_rule() { set_builtin_rule(OpKind::kScatter, scatter_rule); }

}  // namespace alpa::rules
