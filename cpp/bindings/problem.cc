// alpa_pass._core: ShardingProblem (problem.h) and build_sharding_problem.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "alpa/memory.h"
#include "alpa/problem.h"
#include "alpa/repeat.h"
#include "alpa/spec.h"
#include "common.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace alpa {
using namespace bindings;
namespace {

// Flattened per-strategy views of ShardingProblem.nodes (their contract: the property docstrings).
Out<int64_t> strategy_offsets(const ShardingProblem& p) {
  std::vector<int64_t> off{0};
  for (const auto& ns : p.nodes) off.push_back(off.back() + static_cast<int64_t>(ns.list.size()));
  return to_numpy(std::move(off), {p.nodes.size() + 1});
}

// Specs stacked as int32 rows; `pick` returns the specs of one strategy.
template <typename Pick>
Out<int32_t> stacked_specs(const ShardingProblem& p, Pick pick) {
  std::vector<int32_t> flat;
  size_t rows = 0, width = 0;
  for (const auto& ns : p.nodes) {
    for (const auto& s : ns.list) {
      for (const Spec* spec : pick(s)) {
        width = spec->size();
        flat.insert(flat.end(), spec->begin(), spec->end());
        ++rows;
      }
    }
  }
  return to_numpy(std::move(flat), {rows, width});
}

Out<int64_t> in_spec_offsets(const ShardingProblem& p) {
  std::vector<int64_t> off{0};
  for (const auto& ns : p.nodes) {
    for (const auto& s : ns.list) off.push_back(off.back() + static_cast<int64_t>(s.ins.size()));
  }
  const size_t n = off.size();
  return to_numpy(std::move(off), {n});
}

template <typename Field>
Out<double> strategy_costs(const ShardingProblem& p, Field field) {
  std::vector<double> out;
  for (const auto& ns : p.nodes) {
    for (const auto& s : ns.list) out.push_back(s.*field);
  }
  const size_t n = out.size();
  return to_numpy(std::move(out), {n});
}

nb::dict tie_stats_dict(const TieStats& st) {
  nb::dict d;
  d["regions"] = st.regions;
  d["max_copies"] = st.max_copies;
  d["repeated_nodes"] = st.repeated_nodes;
  d["classes_tied"] = st.classes_tied;
  d["classes_skipped"] = st.classes_skipped;
  d["groups_before"] = st.groups_before;
  d["groups_after"] = st.groups_after;
  return d;
}

void check_assignment(const ShardingProblem& p, const In1<int64_t>& assignment) {
  if (static_cast<int64_t>(assignment.shape(0)) != p.ilp.num_groups()) {
    throw std::invalid_argument("assignment has " + std::to_string(assignment.shape(0)) +
                                " entries, expected one per group (" + std::to_string(p.ilp.num_groups()) + ")");
  }
}

// (consumer, operand, layout, start, end) -> CopyRange (bytes and strategies: completed_copies).
using CopyIn = std::tuple<int64_t, int64_t, Spec, int64_t, int64_t>;

std::vector<CopyRange> to_copies(const std::vector<CopyIn>& in) {
  std::vector<CopyRange> out;
  out.reserve(in.size());
  for (const auto& [consumer, operand, layout, start, end] : in) out.push_back({consumer, operand, layout, start, end, 0.0, {}});
  return out;
}

ShardingProblem py_build_sharding_problem(const Graph& graph, const Mesh& mesh, const CoreOptions& options,
                                          const std::vector<std::pair<int64_t, int64_t>>& ties,
                                          const std::vector<int64_t>& donated_args,
                                          const std::vector<std::pair<int64_t, Spec>>& pinned,
                                          const std::vector<int64_t>& pinned_uses,
                                          const std::vector<double>& node_weights,
                                          const std::vector<double>& comm_weights,
                                          const std::vector<CopyIn>& copies) {
  return build_sharding_problem(graph, mesh, options, ties, donated_args, pinned, pinned_uses, node_weights,
                                comm_weights, to_copies(copies));
}

}  // namespace

void bind_problem(nb::module_& m) {
  nb::class_<ShardingProblem>(m, "ShardingProblem",
                              "Strategies of every node, flattened (S strategies), and the ILP.")
      .def_prop_ro("node_group", [](const ShardingProblem& p) { return view(p, p.node_group); },
                   "int64[N]: the ILP group of each node.")
      .def_prop_ro("strategy_offsets", &strategy_offsets, kOwned,
                   "int64[N+1]: node v's strategies are rows [off[v], off[v+1]).")
      .def_prop_ro("out_specs", [](const ShardingProblem& p) {
        return stacked_specs(p, [](const Strategy& s) { return std::vector<const Spec*>{&s.out}; });
      }, kOwned, "int32[S, mesh.ndim]: result spec of each strategy.")
      .def_prop_ro("in_spec_offsets", &in_spec_offsets, kOwned,
                   "int64[S+1]: rows of in_specs per strategy (one per operand).")
      .def_prop_ro("in_specs", [](const ShardingProblem& p) {
        return stacked_specs(p, [](const Strategy& s) {
          std::vector<const Spec*> out;
          for (const Spec& spec : s.ins) out.push_back(&spec);
          return out;
        });
      }, kOwned, "int32[R, mesh.ndim]: operand specs of every strategy.")
      .def_prop_ro("compute_cost", [](const ShardingProblem& p) {
        return strategy_costs(p, &Strategy::compute);
      }, kOwned, "float64[S]: compute cost of each strategy (weighted by compute_cost_per_flop).")
      .def_prop_ro("comm_cost", [](const ShardingProblem& p) {
        return strategy_costs(p, &Strategy::comm);
      }, kOwned, "float64[S]: communication inside the op (e.g. all-reducing partial sums).")
      .def_prop_ro("memory", [](const ShardingProblem& p) {
        return strategy_costs(p, &Strategy::memory);
      }, kOwned, "float64[S]: per-device bytes of the node's result in that layout.")
      .def_prop_ro("strategy_names", [](const ShardingProblem& p) {
        std::vector<std::string> names;
        for (const auto& ns : p.nodes) {
          for (const auto& s : ns.list) names.push_back(s.name);
        }
        return names;
      })
      .def_prop_ro("follow", [](const ShardingProblem& p) {
        std::vector<int64_t> f;
        for (const auto& ns : p.nodes) f.push_back(ns.follow);
        return to_numpy(std::move(f), {p.nodes.size()});
      }, kOwned, "int64[N]: leader operand node of each node, or -1.")
      .def_ro("num_memory_rows", &ShardingProblem::num_memory_rows,
              "Memory-budget rows (0 without a budget); not in ilp: ilp_with_memory_rows.")
      .def_prop_ro("memory_row_points", [](const ShardingProblem& p) { return view(p, p.memory_rows.points); },
                   "int64[R]: the program point of each memory row (its maximal live set).")
      .def_prop_ro("memory_row_upper", [](const ShardingProblem& p) { return p.memory_rows.upper; },
                   "Every memory row's upper bound (the budget the problem was built with).")
      .def("memory_row_activity", [](const ShardingProblem& p, In1<int64_t> assignment) {
        check_assignment(p, assignment);
        auto out = memory_row_activity(p.memory, p.nodes, p.node_group, p.memory_rows, to_vector(assignment));
        const size_t n = out.size();
        return to_numpy(std::move(out), {n});
      }, "assignment"_a, kOwned, "float64[R]: each memory row's activity under a strategy per group (memory.h).")
      .def("memory_row_lower_bound", [](const ShardingProblem& p) {
        return memory_row_lower_bound(p.memory, p.nodes, p.node_group, p.memory_rows);
      }, "max over memory rows of the sum over groups of their least coefficient: no plan's peak is\n"
         "below it (0.0 without rows).")
      .def("memory_row_matrix", [](const ShardingProblem& p, std::optional<In1<int64_t>> which) {
        std::vector<int64_t> w;
        if (which) w = to_vector(*which);
        const auto rows = materialise_memory_rows(p.memory, p.nodes, p.node_group, p.memory_rows,
                                                  which ? &w : nullptr);
        std::vector<int64_t> indptr{0}, indices;
        std::vector<double> data;
        for (const IlpLinearRow& r : rows) {
          for (const IlpRowEntry& e : r.entries) {
            indices.push_back(p.ilp.group_var_start[e.group] + e.strategy);
            data.push_back(e.coeff);
          }
          indptr.push_back(static_cast<int64_t>(indices.size()));
        }
        const size_t nr = indptr.size(), nz = indices.size();
        return std::make_tuple(to_numpy(std::move(indptr), {nr}), to_numpy(std::move(indices), {nz}),
                               to_numpy(std::move(data), {nz}));
      }, "which"_a = nb::none(), "(indptr, indices, data): the memory rows `which` (ascending indices; None: all)\n"
         "as CSR over the ILP's columns, columns ascending per row; ValueError for a bad index.")
      .def("ilp_with_memory_rows", [](const ShardingProblem& p, std::optional<In1<int64_t>> which) {
        std::vector<int64_t> w;
        if (which) w = to_vector(*which);
        return ilp_with_memory_rows(p, which ? &w : nullptr);
      }, "which"_a = nb::none(), "ilp with the memory rows `which` (ascending indices; None: all) as its linear rows.")
      .def_prop_ro("live_nodes", [](const ShardingProblem& p) { return view(p, p.memory.node); },
                   "int64[L]: the values that count towards memory (memory.h).")
      .def_prop_ro("live_start", [](const ShardingProblem& p) { return view(p, p.memory.start); },
                   "int64[L]: first program point (node) where each value is live.")
      .def_prop_ro("live_end", [](const ShardingProblem& p) { return view(p, p.memory.end); },
                   "int64[L]: last program point where each value is live (inclusive).")
      .def_prop_ro("memory_constant", [](const ShardingProblem& p) {
        return to_numpy(std::vector<uint8_t>(p.memory.constant.begin(), p.memory.constant.end()),
                        {p.memory.constant.size()});
      }, kOwned, "uint8[N]: 1 where the node's value is a constant expression: never counted, nor any copy of it\n"
                 "(memory.h).")
      .def_prop_ro("memory_points", [](const ShardingProblem& p) {
        return view(p, p.memory.points);
      }, "int64[P]: program points with a maximal live set.")
      .def("predicted_peak", [](const ShardingProblem& p, In1<int64_t> assignment) {
        const PeakMemory peak = predicted_peak(p, to_vector(assignment));
        return std::make_tuple(peak.bytes, peak.at);
      }, "assignment"_a, "(per-device peak bytes, node where reached) of a strategy per group, its reshard copies\n"
         "included (memory.h).")
      .def("reshard_copies", [](const ShardingProblem& p, In1<int64_t> assignment) {
        std::vector<std::tuple<int64_t, int64_t, Spec, int64_t, int64_t, double>> out;
        for (const CopyRange& c : reshard_copies(p, to_vector(assignment))) {
          out.emplace_back(c.consumer, c.operand, c.layout, c.start, c.end, c.bytes);
        }
        return out;
      }, "assignment"_a,
           "[(consumer, operand, layout, start, end, bytes)]: the reshard copies of a strategy per\n"
           "group, one per consumer reading one (problem.h reshard_copies).")
      .def("copy_candidates", [](const ShardingProblem& p, In1<uint8_t> used, double min_bytes) {
        CopyCandidates c = copy_candidates(p, to_vector(used), min_bytes);
        auto arr = [](std::vector<int64_t>&& v) { const size_t k = v.size(); return to_numpy(std::move(v), {k}); };
        const size_t nc = c.bytes.size();
        return nb::make_tuple(arr(std::move(c.value)), to_numpy(std::move(c.bytes), {nc}),
                              arr(std::move(c.reader_start)), arr(std::move(c.readers)),
                              arr(std::move(c.read_start)), arr(std::move(c.reads)),
                              arr(std::move(c.has_start)), arr(std::move(c.has)));
      }, "used"_a, "min_bytes"_a,
         "(value, bytes, reader_start, readers, read_start, reads, has_start, has): the reshard copies a\n"
         "plan over the ILP columns with used != 0 (uint8 per column) can make, at least min_bytes\n"
         "global and per device; CSR arrays per candidate (problem.h copy_candidates).")
      .def_ro("ilp", &ShardingProblem::ilp)
      .def_prop_ro("unpinned_uses", [](const ShardingProblem& p) { return view(p, p.unpinned_uses); },
                   "int64[K]: nodes reading a pinned_uses node that no strategy lets read it as pinned.")
      .def_prop_ro("repeat_stats", [](const ShardingProblem& p) {
        return tie_stats_dict(p.repeat);
      }, "Repeated-layer ties: regions, max_copies, repeated_nodes, classes_tied, "
         "classes_skipped, groups_before, groups_after (repeat.h).");
  m.def("build_sharding_problem", &py_build_sharding_problem, "graph"_a, "mesh"_a, "options"_a,
        "ties"_a = std::vector<std::pair<int64_t, int64_t>>{},
        "donated_args"_a = std::vector<int64_t>{},
        "pinned"_a = std::vector<std::pair<int64_t, Spec>>{},
        "pinned_uses"_a = std::vector<int64_t>{},
        "node_weights"_a = std::vector<double>{},
        "comm_weights"_a = std::vector<double>{},
        "copies"_a = std::vector<CopyIn>{},
        "ties: node pairs whose result specs must be equal.\n"
        "donated_args: flat entry-argument indices whose buffers may be reused.\n"
        "pinned: (node, spec) pairs; the node may only take strategies whose result spec equals\n"
        "spec (size-1 mesh axes ignored; an entry -2 leaves its axis free); ValueError if none\n"
        "does (problem.h).\n"
        "pinned_uses: pinned nodes whose users must read them in the pinned spec (no resharding\n"
        "on their out-edges); users that cannot are left free (unpinned_uses).\n"
        "node_weights: empty, or a cost factor >= 0 per node (a loop body's trip count).\n"
        "comm_weights: empty, or a factor >= 0 per node for its own communication cost in place\n"
        "of its node weight (a loop-accumulated gradient dot: reduced once after the loop).\n"
        "copies: (consumer, operand, layout, start, end) reshard copies the memory rows count\n"
        "when the consumer reads the operand in layout (reshard_copies of earlier plans).");
}

}  // namespace alpa
