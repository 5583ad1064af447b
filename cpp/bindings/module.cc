// alpa_pass._core: the module (ShardingProblem's bindings: problem.cc; shared helpers: common.h). Signatures: python/alpa_pass/_core.pyi (generated from
// this module by nanobind.stubgen); contracts and algorithms: docs/core_api.md. Inputs are copied
// once into the C++ structs; IlpProblem arrays come back as read-only numpy views that keep the
// problem alive; std::invalid_argument becomes ValueError with the C++ message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "alpa/graph.h"
#include "alpa/ilp.h"
#include "alpa/memory.h"
#include "alpa/mesh.h"
#include "alpa/op_attrs.h"
#include "alpa/pipeline_dp.h"
#include "alpa/problem.h"
#include "alpa/repeat.h"
#include "alpa/spec.h"
#include "alpa/strategy.h"
#include "common.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace alpa {
using namespace bindings;
namespace {

Mesh make_mesh(std::vector<int64_t> shape, std::vector<double> alpha, std::vector<double> beta,
               std::vector<std::tuple<std::vector<int>, double, double>> axes_costs,
               std::vector<int> axis_order) {
  Mesh m{std::move(shape), std::move(alpha), std::move(beta)};
  for (auto& [axes, a, b] : axes_costs) m.axes_costs.push_back({std::move(axes), a, b});
  m.axis_order = std::move(axis_order);
  m.validate();
  return m;
}

Graph make_graph(In1<int32_t> kind, In1<int32_t> dtype_bytes, In1<int64_t> shape_offsets,
                 In1<int64_t> shape_dims, In1<int64_t> operand_offsets, In1<int64_t> operand_ids,
                 In1<int64_t> attr_offsets, In1<int64_t> attrs) {
  Graph g{to_vector(kind),         to_vector(dtype_bytes), to_vector(shape_offsets),
          to_vector(shape_dims),   to_vector(operand_offsets), to_vector(operand_ids),
          to_vector(attr_offsets), to_vector(attrs)};
  g.validate();
  return g;
}

NodeStrategies node_strategies(const Graph& g, int64_t v, const Mesh& mesh, const CoreOptions& opts) {
  if (v < 0 || v >= g.num_nodes()) {
    throw std::invalid_argument("node " + std::to_string(v) + " out of range for a graph of " +
                                std::to_string(g.num_nodes()) + " nodes");
  }
  std::vector<NodeStrategies> done;
  done.reserve(v + 1);
  const std::vector<char> combinable = combinable_reductions(g);
  RuleContext ctx{g, mesh, opts, done, combinable, tiny_heavy_flops(g)};
  for (int64_t u = 0; u <= v; ++u) done.push_back(rule_for(g.op_kind(u))(ctx, u));
  return std::move(done.back());
}

using EdgeIn = std::tuple<int64_t, int64_t, InCost>;
using EqualityIn = std::tuple<int64_t, int64_t, In1<int64_t>>;
// (groups, strategies, coeffs, lower, upper): lower <= sum coeffs[i] * s[groups[i]][strategies[i]] <= upper.
using RowIn = std::tuple<In1<int64_t>, In1<int64_t>, In1<double>, double, double>;

std::vector<IlpLinearRow> to_linear_rows(const std::vector<RowIn>& rows) {
  std::vector<IlpLinearRow> out;
  out.reserve(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& [groups, strategies, coeffs, lower, upper] = rows[r];
    if (groups.shape(0) != strategies.shape(0) || groups.shape(0) != coeffs.shape(0)) {
      throw std::invalid_argument("linear row " + std::to_string(r) +
                                  ": groups, strategies and coeffs differ in length");
    }
    IlpLinearRow row{{}, lower, upper, "linear row " + std::to_string(r)};
    for (size_t i = 0; i < groups.shape(0); ++i) {
      row.entries.push_back({groups.data()[i], strategies.data()[i], coeffs.data()[i]});
    }
    out.push_back(std::move(row));
  }
  return out;
}

IlpProblem py_build_ilp(const std::vector<In1<double>>& group_costs, const std::vector<EdgeIn>& edges,
                        const std::vector<EqualityIn>& equalities, const std::vector<RowIn>& rows) {
  std::vector<std::vector<double>> groups;
  groups.reserve(group_costs.size());
  for (const auto& c : group_costs) groups.push_back(to_vector(c));
  const auto G = static_cast<int64_t>(groups.size());
  std::vector<IlpEdge> es;
  es.reserve(edges.size());
  for (size_t k = 0; k < edges.size(); ++k) {
    const auto& [u, v, cost] = edges[k];
    if (cost.ndim() == 2 && u >= 0 && u < G && v >= 0 && v < G &&
        (cost.shape(0) != groups[u].size() || cost.shape(1) != groups[v].size())) {
      throw std::invalid_argument(
          "edge " + std::to_string(k) + " cost has shape (" + std::to_string(cost.shape(0)) + ", " +
          std::to_string(cost.shape(1)) + "), expected (" + std::to_string(groups[u].size()) +
          ", " + std::to_string(groups[v].size()) + ") = (|S_u|, |S_v|)");
    }
    es.push_back({u, v, std::vector<double>(cost.data(), cost.data() + cost.size())});
  }
  std::vector<IlpEquality> qs;
  qs.reserve(equalities.size());
  for (const auto& [u, v, match] : equalities) qs.push_back({u, v, to_vector(match)});
  return build_ilp(std::move(groups), std::move(es), std::move(qs), to_linear_rows(rows));
}

void bind_mesh_spec(nb::module_& m) {
  auto cls = nb::class_<Mesh>(m, "Mesh", "Logical N-D device mesh with alpha-beta costs per axis.");
  cls.def(nb::new_(&make_mesh), "shape"_a, "alpha"_a, "beta"_a,
          "axes_costs"_a = std::vector<std::tuple<std::vector<int>, double, double>>{},
          "axis_order"_a = std::vector<int>{},
          "axes_costs: (axes, alpha, beta) of collectives over several axes at once (a measured\n"
          "flattened group), used instead of the largest per-axis alpha and beta.\n"
          "axis_order: mesh axes, most major first, in which a dim split over several axes lists\n"
          "them (empty: mesh order); reshard_cost charges the collective-permutes it implies.")
      .def_ro("shape", &Mesh::shape)
      .def_ro("axis_order", &Mesh::axis_order)
      .def_ro("alpha", &Mesh::alpha)
      .def_ro("beta", &Mesh::beta)
      .def_rw("all_gather_forbidden", &Mesh::all_gather_forbidden,
              "Every all-gather over an axis of size > 1 costs 1e13 (Alpa's allow_all_gather=False).")
      .def_rw("all_to_all_forbidden", &Mesh::all_to_all_forbidden,
              "Every all-to-all over an axis of size > 1 costs 1e13 (Alpa's allow_all_to_all=False).")
      .def_prop_ro("axes_costs", [](const Mesh& mesh) {
        std::vector<std::tuple<std::vector<int>, double, double>> out;
        for (const AxesCost& c : mesh.axes_costs) out.emplace_back(c.axes, c.alpha, c.beta);
        return out;
      })
      .def_prop_ro("ndim", &Mesh::ndim)
      .def_prop_ro("num_devices", &Mesh::num_devices)
      .def("__repr__", [](const Mesh& mesh) {
        std::string s = "Mesh(shape=[";
        for (int a = 0; a < mesh.ndim(); ++a) s += (a ? ", " : "") + std::to_string(mesh.shape[a]);
        return s + "])";
      });
  using One = double (Mesh::*)(double, int) const;
  using Many = double (Mesh::*)(double, std::span<const int>) const;
  const std::tuple<const char*, One, Many> collectives[] = {
      {"all_reduce", &Mesh::all_reduce, &Mesh::all_reduce},
      {"all_gather", &Mesh::all_gather, &Mesh::all_gather},
      {"reduce_scatter", &Mesh::reduce_scatter, &Mesh::reduce_scatter},
      {"all_to_all", &Mesh::all_to_all, &Mesh::all_to_all}};
  cls.def("collective_permute", [](const Mesh& mm, double b, std::vector<int> axes) {
    return mm.collective_permute(b, axes);
  }, "bytes"_a, "axes"_a, "Every device sends `bytes` to another device of the axes' group: a + b B.");
  for (const auto& [name, one, many] : collectives) {  // one axis, or several as one collective
    cls.def(name, one, "bytes"_a, "axis"_a);
    cls.def(name, [many](const Mesh& mm, double b, std::vector<int> axes) { return (mm.*many)(b, axes); },
            "bytes"_a, "axes"_a);
  }
  cls.def("combined_all_reduce", [](const Mesh& mm, double b, std::vector<int> axes, double bucket) {
    return mm.combined_all_reduce(b, axes, bucket);
  }, "bytes"_a, "axes"_a, "bucket_bytes"_a,
          "An all-reduce XLA combines with others into one of bucket_bytes: its share of alpha\n"
          "(alpha * min(1, bytes / bucket_bytes)) plus the bandwidth term (mesh.h).");
  m.def("enumerate_specs", [](std::vector<int64_t> shape, const Mesh& mesh) {
    return enumerate_specs(shape, mesh);
  }, "shape"_a, "mesh"_a, "Every spec of `shape` on `mesh` whose splits divide the dims.");
  m.def("reshard_cost", [](const Mesh& mesh, std::vector<int64_t> shape, double dtype_bytes,
                           const Spec& src, const Spec& dst) {
    return reshard_cost(mesh, shape, dtype_bytes, src, dst);
  }, "mesh"_a, "shape"_a, "dtype_bytes"_a, "src_spec"_a, "dst_spec"_a,
        "Communication cost of moving a tensor from layout src_spec to dst_spec (spec.h).");
  m.def("spec_to_string", &spec_to_string, "spec"_a, "rank"_a,
        "E.g. 'S0R', 'S01R', 'RR' (Alpa style).");
}

// The class `cls` of one attrs layout (alpa/op_attrs.h; fields added by the caller) and its
// decoder function `fn`: _core.decode_<family>_attrs(attrs) -> <Family>Attrs.
template <typename Attrs>
nb::class_<Attrs> bind_attrs(nb::module_& m, const char* cls, const char* fn,
                             Attrs (*decode)(std::span<const int64_t>)) {
  nb::class_<Attrs> c(m, cls, "The named fields of one op family's attrs (op_attrs.h).");
  m.def(fn, [decode](const std::vector<int64_t>& attrs) { return decode(attrs); }, "attrs"_a,
        "The named fields of one node's attrs; ValueError naming the layout if malformed.");
  return c;
}

// OpKind as an IntEnum (python/alpa_pass/extract/graph.py re-exports it) and the attrs decoders.
void bind_op_kinds_attrs(nb::module_& m) {
  nb::enum_<OpKind> kinds(m, "OpKind", nb::is_arithmetic(),
                          "Kind of a graph node (cpp/include/alpa/graph.h); an enum.IntEnum.");
  for (int k = 0; k < kNumOpKinds; ++k) {
    kinds.value(op_kind_name(static_cast<OpKind>(k)), static_cast<OpKind>(k));
  }
#define ALPA_ATTRS(T, fn) bind_attrs<T>(m, #T, #fn, &fn)
#define ALPA_FIELD(T, f) .def_ro(#f, &T::f)
  ALPA_ATTRS(ParameterAttrs, decode_parameter_attrs) ALPA_FIELD(ParameterAttrs, arg_index);
  ALPA_ATTRS(OutputAttrs, decode_output_attrs) ALPA_FIELD(OutputAttrs, output_index);
  ALPA_ATTRS(ElementwiseAttrs, decode_elementwise_attrs)
      ALPA_FIELD(ElementwiseAttrs, unshardable_dims)
      ALPA_FIELD(ElementwiseAttrs, runtime_indexed_dims) ALPA_FIELD(ElementwiseAttrs, batch_dims);
  ALPA_ATTRS(BroadcastAttrs, decode_broadcast_attrs) ALPA_FIELD(BroadcastAttrs, broadcast_dims);
  ALPA_ATTRS(TransposeAttrs, decode_transpose_attrs) ALPA_FIELD(TransposeAttrs, permutation);
  ALPA_ATTRS(ReduceAttrs, decode_reduce_attrs) ALPA_FIELD(ReduceAttrs, reduced_dims);
  ALPA_ATTRS(DotAttrs, decode_dot_attrs)
      ALPA_FIELD(DotAttrs, lhs_batch) ALPA_FIELD(DotAttrs, rhs_batch)
      ALPA_FIELD(DotAttrs, lhs_contracting) ALPA_FIELD(DotAttrs, rhs_contracting);
  ALPA_ATTRS(ConvAttrs, decode_conv_attrs)
      ALPA_FIELD(ConvAttrs, input_batch) ALPA_FIELD(ConvAttrs, input_feature)
      ALPA_FIELD(ConvAttrs, input_spatial) ALPA_FIELD(ConvAttrs, kernel_input_feature)
      ALPA_FIELD(ConvAttrs, kernel_output_feature) ALPA_FIELD(ConvAttrs, kernel_spatial)
      ALPA_FIELD(ConvAttrs, output_batch) ALPA_FIELD(ConvAttrs, output_feature)
      ALPA_FIELD(ConvAttrs, output_spatial) ALPA_FIELD(ConvAttrs, feature_group_count)
      ALPA_FIELD(ConvAttrs, batch_group_count);
  ALPA_ATTRS(GatherAttrs, decode_gather_attrs)
      ALPA_FIELD(GatherAttrs, index_vector_dim) ALPA_FIELD(GatherAttrs, offset_dims)
      ALPA_FIELD(GatherAttrs, collapsed_slice_dims) ALPA_FIELD(GatherAttrs, start_index_map)
      ALPA_FIELD(GatherAttrs, operand_batching_dims)
      ALPA_FIELD(GatherAttrs, start_indices_batching_dims) ALPA_FIELD(GatherAttrs, slice_sizes);
  ALPA_ATTRS(ScatterAttrs, decode_scatter_attrs)
      ALPA_FIELD(ScatterAttrs, index_vector_dim) ALPA_FIELD(ScatterAttrs, update_window_dims)
      ALPA_FIELD(ScatterAttrs, inserted_window_dims)
      ALPA_FIELD(ScatterAttrs, scatter_dims_to_operand_dims)
      ALPA_FIELD(ScatterAttrs, input_batching_dims)
      ALPA_FIELD(ScatterAttrs, scatter_indices_batching_dims);
#undef ALPA_FIELD
#undef ALPA_ATTRS
}

void bind_graph_strategy(nb::module_& m) {
  nb::class_<CoreOptions>(m, "CoreOptions", "Options of the C++ core (see strategy.h).")
      .def(nb::init<>())
      .def_rw("allow_replicated_heavy_ops", &CoreOptions::allow_replicated_heavy_ops)
      .def_rw("allow_mixed_mesh_shape", &CoreOptions::allow_mixed_mesh_shape)
      .def_rw("compute_cost_per_flop", &CoreOptions::compute_cost_per_flop)
      .def_rw("compute_cost_per_flop_half", &CoreOptions::compute_cost_per_flop_half)
      .def_rw("compute_cost_per_byte", &CoreOptions::compute_cost_per_byte)
      .def_rw("memory_cost_per_byte", &CoreOptions::memory_cost_per_byte)
      .def_rw("memory_budget_per_device", &CoreOptions::memory_budget_per_device)
      .def_rw("merge_followers", &CoreOptions::merge_followers)
      .def_rw("replicate_below_numel", &CoreOptions::replicate_below_numel)
      .def_rw("tie_repeated_layers", &CoreOptions::tie_repeated_layers)
      .def_rw("all_reduce_combine_bytes", &CoreOptions::all_reduce_combine_bytes);
  nb::class_<Graph>(m, "Graph",
                    "Flat op graph (CSR arrays, see extract/graph.py), copied and validated: "
                    "ValueError naming the bad node.")
      .def(nb::new_(&make_graph), "kind"_a, "dtype_bytes"_a, "shape_offsets"_a, "shape_dims"_a,
           "operand_offsets"_a, "operand_ids"_a, "attr_offsets"_a, "attrs"_a)
      .def_prop_ro("num_nodes", &Graph::num_nodes);
  m.def("node_flops", &node_flops, "graph"_a, "v"_a,
        "FLOPs of node v (dot: 2 * prod(result) * prod(contracting); convolution likewise; "
        "others: numel).");
  nb::class_<Strategy>(m, "Strategy", "One sharding strategy of a node (strategy.h).")
      .def_ro("out", &Strategy::out, "Spec of the result (mesh axis -> tensor dim, -1: none).")
      .def_ro("ins", &Strategy::ins, "Required spec of each operand.")
      .def_ro("compute", &Strategy::compute)
      .def_ro("comm", &Strategy::comm)
      .def_ro("memory", &Strategy::memory)
      .def_ro("name", &Strategy::name)
      .def("__repr__", [](const Strategy& s) { return "Strategy('" + s.name + "')"; });
  nb::class_<NodeStrategies>(m, "NodeStrategies")
      .def_ro("follow", &NodeStrategies::follow,
              "Operand node this node follows 1:1 (strategy k <-> the leader's k), or -1.")
      .def_ro("strategies", &NodeStrategies::list);
  m.def("combinable_reductions", [](const Graph& g, std::vector<double> weights) {
    const std::vector<char> c = combinable_reductions(g, weights);
    return std::vector<bool>(c.begin(), c.end());
  }, "graph"_a, "weights"_a = std::vector<double>{},
        "Per node: its all-reduce of partial sums is combined by XLA with others like it (no dot or\n"
        "convolution reachable from it, weight <= 1; strategy.h).");
  m.def("node_strategies", &node_strategies, "graph"_a, "v"_a, "mesh"_a, "options"_a,
        "Strategies of node v (rules run on nodes 0..v; no merging).");
}

void bind_ilp(nb::module_& m) {
  nb::class_<IlpProblem>(m, "IlpProblem", "The sharding ILP as HiGHS-ready CSC arrays (ilp.h).")
      .def_ro("num_cols", &IlpProblem::num_cols)
      .def_ro("num_rows", &IlpProblem::num_rows)
      .def_ro("offset", &IlpProblem::offset)
      .def_ro("num_edge_vars", &IlpProblem::num_edge_vars)
      .def_prop_ro("num_groups", &IlpProblem::num_groups)
      .def_ro("linear_row_start", &IlpProblem::linear_row_start)
      .def_prop_ro("num_linear_rows", [](const IlpProblem& p) { return p.linear_rows.size(); })
#define ALPA_ILP_ARRAY(field) \
  .def_prop_ro(#field, [](const IlpProblem& p) { return view(p, p.field); })
      ALPA_ILP_ARRAY(col_cost) ALPA_ILP_ARRAY(col_lower) ALPA_ILP_ARRAY(col_upper)
      ALPA_ILP_ARRAY(integrality) ALPA_ILP_ARRAY(a_start) ALPA_ILP_ARRAY(a_index)
      ALPA_ILP_ARRAY(a_value) ALPA_ILP_ARRAY(row_lower) ALPA_ILP_ARRAY(row_upper)
      ALPA_ILP_ARRAY(group_var_start);
#undef ALPA_ILP_ARRAY
  m.def("build_ilp", &py_build_ilp, "group_costs"_a, "edges"_a,
        "equalities"_a = std::vector<EqualityIn>{}, "rows"_a = std::vector<RowIn>{},
        "group_costs[g]: cost of each strategy of group g.\n"
        "edges: (u, v, cost[|S_u|, |S_v|]).\n"
        "equalities: (u, v, match): s_u = k forces s_v = match[k] (-1: forbids k).\n"
        "rows: (groups, strategies, coeffs, lower, upper) meaning\n"
        "lower <= sum_i coeffs[i] * s[groups[i]][strategies[i]] <= upper; they are the last\n"
        "num_linear_rows rows of the ILP (ilp.h).");
  m.def("min_max_row_problem", &min_max_row_problem, "ilp"_a,
        "Minimise M subject to every linear row <= M (costs zeroed; M is the last column).");
  nb::class_<EvalResult>(m, "EvalResult")
      .def_ro("objective", &EvalResult::objective)
      .def_ro("linear_cost", &EvalResult::linear_cost)
      .def_ro("edge_cost", &EvalResult::edge_cost)
      .def_ro("violations", &EvalResult::violations)
      .def("__repr__", [](const EvalResult& r) {
        return "EvalResult(objective=" + std::to_string(r.objective) + ", violations=" +
               std::to_string(r.violations.size()) + ")";
      });
  m.def("evaluate", [](const IlpProblem& p, In1<int64_t> a) { return evaluate(p, to_vector(a)); },
        "ilp"_a, "assignment"_a,
        "Objective and violated rows of one strategy index per group (no solver).");
  m.def("one_group_changed", [](const IlpProblem& p, In1<int64_t> a) {
    std::vector<double> out = one_group_changed(p, to_vector(a));
    const size_t n = out.size();
    return to_numpy(std::move(out), {n});
  }, "ilp"_a, "assignment"_a,
     "float64 per s-column: the objective of the assignment with only that column's group changed\n"
     "to it (evaluate()'s objective, one pass; equalities and linear rows not checked).");
  m.def("evaluate_columns", [](const IlpProblem& p, In1<double> x, double tol) {
    return evaluate_columns(p, to_vector(x), tol);
  }, "ilp"_a, "x"_a, "tol"_a = 1e-6,
     "Objective c.x + offset and violated bounds, rows and integrality of a column vector.");
  m.def("decode_assignment", [](const IlpProblem& p, In1<double> x) {
    std::vector<int64_t> a = decode_assignment(p, to_vector(x));
    const size_t n = a.size();
    return to_numpy(std::move(a), {n});
  }, "ilp"_a, "x"_a, "Strategy index per group (argmax of each group's columns).");
}

// Repeated structure (alpa/repeat.h).
void bind_repeat(nb::module_& m) {
  m.def("structural_hashes", [](const Graph& g, int rounds) {
    std::vector<uint64_t> h = structural_hashes(g, rounds);
    const size_t n = h.size();
    return to_numpy(std::move(h), {n});
  }, "graph"_a, "rounds"_a, "One WL hash per node after `rounds` refinement rounds (repeat.h).");
  m.def("find_repeats", [](const Graph& g, int region_rounds, int class_rounds, int stride, bool anchor) {
    RepeatOptions o;
    o.region_rounds = region_rounds;
    o.class_rounds = class_rounds;
    o.stride = stride;
    o.anchor = anchor;
    RepeatClasses rc = find_repeats(g, o);
    std::vector<std::tuple<int64_t, int64_t, int64_t>> regions;
    for (const RepeatRegion& r : rc.regions) regions.emplace_back(r.start, r.stop, r.period);
    const size_t n = rc.node_class.size();
    return std::make_tuple(to_numpy(std::move(rc.node_class), {n}), regions);
  }, "graph"_a, "region_rounds"_a = RepeatOptions{}.region_rounds,
     "class_rounds"_a = RepeatOptions{}.class_rounds, "stride"_a = RepeatOptions{}.stride,
     "anchor"_a = RepeatOptions{}.anchor,
     "(node_class int64[N] (-1: none), [(start, stop, period)]) of the graph's tandem repeats.");
}

// Inter-op DPs (alpa/pipeline_dp.h): layer clustering and the stage-submesh DP.
void bind_pipeline(nb::module_& m) {
  m.def("cluster_layers", [](In1<double> flops, In1<double> cut_bytes, int64_t layers, double eps) {
    return cluster_layers(to_vector(flops), to_vector(cut_bytes), layers, eps);
  }, "flops"_a, "cut_bytes"_a, "layers"_a, "eps"_a,
     "Start indices of layers 1..layers-1 cutting the operators into layers (pipeline_dp.h).");
  m.def("stage_dp", [](InCost cost, In1<int64_t> submesh_devices, int64_t num_devices, int64_t num_micro) {
    if (cost.ndim() != 3 || cost.shape(0) != cost.shape(1) || cost.shape(2) != submesh_devices.shape(0)) {
      throw std::invalid_argument("stage_dp: cost must be [num_layers, num_layers, num_submeshes]");
    }
    const int64_t layers = static_cast<int64_t>(cost.shape(0));
    std::vector<double> c(cost.data(), cost.data() + cost.size());
    StageDpResult r = stage_dp(layers, c, to_vector(submesh_devices), num_devices, num_micro);
    std::vector<std::tuple<int64_t, int64_t, int64_t>> stages;
    for (const auto& s : r.stages) stages.emplace_back(s.start, s.stop, s.submesh);
    return std::make_tuple(r.objective, r.max_stage_latency, stages);
  }, "cost"_a, "submesh_devices"_a, "num_devices"_a, "num_micro"_a,
     "cost[i, j, k]: latency of layers [i, j] on submesh choice k.\n"
     "Returns (objective, max stage latency, [(start, stop, submesh)]) (pipeline_dp.h).");
}

}  // namespace
}  // namespace alpa

namespace alpa {
void bind_problem(nb::module_& m);  // problem.cc
}  // namespace alpa

NB_MODULE(_core, m) {
  // Objects kept alive by module globals (e.g. in test modules) at interpreter exit are not leaks.
  nb::set_leak_warnings(false);
  m.doc() = "alpa_pass C++ core: meshes, specs, strategies, the sharding ILP (docs/core_api.md).";
  alpa::bind_mesh_spec(m);
  alpa::bind_op_kinds_attrs(m);
  alpa::bind_graph_strategy(m);
  alpa::bind_problem(m);
  alpa::bind_ilp(m);
  alpa::bind_pipeline(m);
  alpa::bind_repeat(m);
}
