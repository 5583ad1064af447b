// Repeated structure: structural hashes, tandem repeats of the hash sequence, and merging the ILP
// groups of repeated leaders (see repeat.h). All linear in the graph size except the period
// scan, O(N * max_periods).
#include "alpa/repeat.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

namespace alpa {
namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t mix(uint64_t h, uint64_t x) { return splitmix(h ^ splitmix(x + 0x632be59bd9b4e019ULL * h)); }

// Kind, dtype, shape, operand count and attrs; PARAMETER / OUTPUT attrs (their absolute index)
// are left out so that the parameters of different layers hash alike.
uint64_t local_hash(const Graph& g, int64_t v) {
  const OpKind kind = g.op_kind(v);
  uint64_t h = mix(static_cast<uint64_t>(kind), static_cast<uint64_t>(g.dtype_bytes[v]));
  h = mix(h, static_cast<uint64_t>(g.rank(v)));
  for (int64_t d : g.shape(v)) h = mix(h, static_cast<uint64_t>(d));
  h = mix(h, g.operands(v).size());
  if (kind != OpKind::kParameter && kind != OpKind::kOutput) {
    for (int64_t a : g.node_attrs(v)) h = mix(h, static_cast<uint64_t>(a));
  }
  return h;
}

// Users of each node as CSR: (user, operand slot) pairs.
struct Users {
  std::vector<int64_t> offsets, user, slot;
};

Users build_users(const Graph& g) {
  const int64_t n = g.num_nodes();
  Users us;
  us.offsets.assign(n + 1, 0);
  for (int64_t u : g.operand_ids) ++us.offsets[u + 1];
  std::partial_sum(us.offsets.begin(), us.offsets.end(), us.offsets.begin());
  us.user.resize(g.operand_ids.size());
  us.slot.resize(g.operand_ids.size());
  std::vector<int64_t> fill(us.offsets.begin(), us.offsets.end() - 1);
  for (int64_t v = 0; v < n; ++v) {
    const auto ops = g.operands(v);
    for (size_t t = 0; t < ops.size(); ++t) {
      const int64_t at = fill[ops[t]]++;
      us.user[at] = v;
      us.slot[at] = static_cast<int64_t>(t);
    }
  }
  return us;
}

// The most frequent distances between consecutive equal hashes in h[lo, hi) (ties: shorter first).
std::vector<int64_t> candidate_periods(const std::vector<uint64_t>& h, int64_t lo, int64_t hi,
                                       int max_periods) {
  std::unordered_map<uint64_t, int64_t> last;
  last.reserve(hi - lo);
  std::vector<int64_t> count(hi - lo + 1, 0);
  for (int64_t v = lo; v < hi; ++v) {
    auto [it, fresh] = last.try_emplace(h[v], v);
    if (!fresh) {
      ++count[v - it->second];
      it->second = v;
    }
  }
  std::vector<int64_t> gaps;
  for (int64_t p = 1; p <= hi - lo; ++p) {
    if (count[p] > 0) gaps.push_back(p);
  }
  std::stable_sort(gaps.begin(), gaps.end(), [&](int64_t a, int64_t b) { return count[a] > count[b]; });
  if (static_cast<int64_t>(gaps.size()) > max_periods) gaps.resize(max_periods);
  return gaps;
}

// Maximal regions of h[lo, hi) with period p and at least two full copies.
void scan_period(const std::vector<uint64_t>& h, int64_t lo, int64_t hi, int64_t p,
                 std::vector<RepeatRegion>& out) {
  int64_t a = lo;
  while (a + p < hi) {
    if (h[a] != h[a + p]) {
      ++a;
      continue;
    }
    int64_t e = a;
    while (e + p < hi && h[e] == h[e + p]) ++e;
    if (e - a >= p) out.push_back({a, e + p, p});
    a = e + 1;
  }
}

// Longest regions first (then shorter period, then earlier), skipping any that overlaps one kept;
// the result in ascending start.
std::vector<RepeatRegion> pick_regions(std::vector<RepeatRegion> cands) {
  std::sort(cands.begin(), cands.end(), [](const RepeatRegion& x, const RepeatRegion& y) {
    const int64_t lx = x.stop - x.start, ly = y.stop - y.start;
    if (lx != ly) return lx > ly;
    if (x.period != y.period) return x.period < y.period;
    return x.start < y.start;
  });
  std::map<int64_t, RepeatRegion> kept;  // by start
  for (const RepeatRegion& r : cands) {
    auto next = kept.lower_bound(r.start);
    if (next != kept.end() && next->first < r.stop) continue;
    if (next != kept.begin() && std::prev(next)->second.stop > r.start) continue;
    kept.emplace(r.start, r);
  }
  std::vector<RepeatRegion> out;
  for (const auto& [start, r] : kept) out.push_back(r);
  return out;
}

std::vector<RepeatRegion> regions_in(const std::vector<uint64_t>& h, int64_t lo, int64_t hi,
                                     int max_periods) {
  std::vector<RepeatRegion> cands;
  for (int64_t p : candidate_periods(h, lo, hi, max_periods)) scan_period(h, lo, hi, p, cands);
  return pick_regions(std::move(cands));
}

// rep[v] for v in [lo, hi): the node that v repeats in the first `stride` copies of its region
// (copy k repeats copy k mod stride), through nested repeats (e.g. the blocks inside each of
// Adam's mu and nu sections) up to `depth` more levels; a nested repeat must cover at least half
// of the copy it is in (so that, say, four same-shaped weights in a row within one layer are not
// taken for a repeat). Returns the regions found at this level.
std::vector<RepeatRegion> assign_reps(const std::vector<uint64_t>& h, int64_t lo, int64_t hi,
                                      const RepeatOptions& o, int depth, std::vector<int64_t>& rep) {
  std::vector<RepeatRegion> regions = regions_in(h, lo, hi, o.max_periods);
  if (depth < o.nesting) {  // inside a copy: only a repeat that makes up most of it
    std::erase_if(regions, [&](const RepeatRegion& r) { return 2 * (r.stop - r.start) < hi - lo; });
  }
  for (const RepeatRegion& r : regions) {
    const int64_t block = std::min<int64_t>(o.stride, r.copies()) * r.period;
    for (int64_t at = r.start; depth > 0 && at < r.start + block; at += r.period) {
      assign_reps(h, at, std::min(at + r.period, r.stop), o, depth - 1, rep);
    }
    for (int64_t v = r.start + block; v < r.stop; ++v) rep[v] = rep[r.start + (v - r.start) % block];
  }
  return regions;
}

bool same_strategies(const NodeStrategies& a, const NodeStrategies& b) {
  if (a.list.size() != b.list.size()) return false;
  for (size_t k = 0; k < a.list.size(); ++k) {
    if (a.list[k].out != b.list[k].out || a.list[k].ins != b.list[k].ins) return false;
  }
  return true;
}

int64_t find_root(std::vector<int64_t>& parent, int64_t x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

// Anchoring (repeat.h, step 2), on any partition `rc` of the nodes (find_repeats passes the
// positions): keeps the members of a part that are linked to a part of dots / convolutions through
// a neighbour of the same kind (operand slot t, or a user reading them at slot t) in one standing
// part, and so on outwards; members no such link covers leave the part (a boundary copy whose
// neighbour is not repeated, say), and parts left with fewer than two members dissolve. A worklist
// over parts: a part is (re)checked when a part next to one of its members starts to stand.
void anchor_classes(const Graph& g, RepeatClasses& rc) {
  const int64_t n = g.num_nodes();
  std::vector<int64_t>& cls = rc.node_class;
  std::vector<std::vector<int64_t>> members(rc.num_classes);
  for (int64_t v = 0; v < n; ++v) {
    if (cls[v] >= 0) members[cls[v]].push_back(v);
  }
  const Users us = build_users(g);
  // Values computed from constants alone (a constant, its broadcast): operand ids precede users.
  std::vector<char> constant(n, 0);
  for (int64_t v = 0; v < n; ++v) {
    const auto ops = g.operands(v);
    constant[v] = g.op_kind(v) != OpKind::kParameter &&
                  std::all_of(ops.begin(), ops.end(), [&](int64_t u) { return constant[u] != 0; });
  }
  std::vector<char> stands(rc.num_classes, 0), weak(rc.num_classes, 0);
  std::vector<int64_t> work;
  for (int64_t c = 0; c < rc.num_classes; ++c) {
    const int64_t v = members[c][0];
    const OpKind k = g.op_kind(v);
    // Unused values (a loop's pass-through results, a reduction or select nobody reads) stand
    // too: free in any layout. They anchor only the constants they read (values computed from
    // constants alone), not the loop carries behind a while's unused results.
    const bool unused = us.offsets[v + 1] == us.offsets[v] && k != OpKind::kOutput;
    if (k == OpKind::kDot || k == OpKind::kConvolution || unused) {
      stands[c] = 1;
      weak[c] = unused;
      work.push_back(c);
    }
  }
  // The members of c linked one way to one standing class (the most such members; ties: the
  // smallest (direction, slot, class)); empty when no link covers two members.
  using Key = std::tuple<int, int64_t, int64_t>;  // (0 operand / 1 user, slot, class)
  std::map<Key, std::vector<int64_t>> by_key;
  std::vector<Key> keys;
  auto linked = [&](int64_t c) {
    by_key.clear();
    const bool leaf = constant[members[c][0]] != 0;  // a constant may hang on an unused value
    auto standing = [&](int64_t v) { return cls[v] >= 0 && stands[cls[v]] && (leaf || !weak[cls[v]]); };
    for (int64_t v : members[c]) {
      keys.clear();
      const auto ops = g.operands(v);
      for (size_t t = 0; t < ops.size(); ++t) {
        if (standing(ops[t])) keys.emplace_back(0, static_cast<int64_t>(t), cls[ops[t]]);
      }
      for (int64_t i = us.offsets[v]; i < us.offsets[v + 1]; ++i) {
        if (standing(us.user[i])) keys.emplace_back(1, us.slot[i], cls[us.user[i]]);
      }
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      for (const Key& k : keys) by_key[k].push_back(v);
    }
    const std::vector<int64_t>* best = nullptr;
    for (const auto& [k, vs] : by_key) {
      if (best == nullptr || vs.size() > best->size()) best = &vs;
    }
    return best != nullptr && best->size() >= 2 ? *best : std::vector<int64_t>{};
  };
  // Splits off linked members until none are left (the rest may link to another standing part,
  // e.g. layers 4 and 6 to one part and 0 and 2 to another).
  auto check = [&](int64_t c) {
    while (c >= 0 && !stands[c] && members[c].size() >= 2) {
      std::vector<int64_t> keep = linked(c);
      if (keep.empty()) return;
      if (keep.size() == members[c].size()) {
        stands[c] = 1;
        work.push_back(c);
        return;
      }
      const int64_t fresh = static_cast<int64_t>(members.size());  // the linked members split off
      std::vector<int64_t> rest;
      std::set_difference(members[c].begin(), members[c].end(), keep.begin(), keep.end(),
                          std::back_inserter(rest));
      for (int64_t v : keep) cls[v] = fresh;
      members[c] = std::move(rest);
      members.push_back(std::move(keep));
      stands.push_back(1);
      weak.push_back(0);
      work.push_back(fresh);
    }
  };
  while (!work.empty()) {
    const int64_t d = work.back();
    work.pop_back();
    const std::vector<int64_t> ms = members[d];
    for (int64_t v : ms) {
      for (int64_t u : g.operands(v)) {
        if (!weak[d] || constant[u]) check(cls[u]);
      }
      for (int64_t i = us.offsets[v]; i < us.offsets[v + 1]; ++i) check(cls[us.user[i]]);
    }
  }
  // Renumber the standing classes of two or more by first node; the rest are no class.
  std::vector<int64_t> renum(members.size(), -1);
  int64_t next = 0;
  for (int64_t v = 0; v < n; ++v) {
    const int64_t c = cls[v];
    if (c < 0) continue;
    if (!stands[c] || members[c].size() < 2) {
      cls[v] = -1;
      continue;
    }
    if (renum[c] < 0) renum[c] = next++;
    cls[v] = renum[c];
  }
  rc.num_classes = next;
}

}  // namespace

std::vector<uint64_t> structural_hashes(const Graph& g, int rounds) {
  const int64_t n = g.num_nodes();
  std::vector<uint64_t> h(n), next(n);
  for (int64_t v = 0; v < n; ++v) h[v] = local_hash(g, v);
  if (rounds <= 0) return h;
  const Users us = build_users(g);
  std::vector<uint64_t> user_keys;
  for (int r = 0; r < rounds; ++r) {
    for (int64_t v = 0; v < n; ++v) {
      uint64_t x = mix(h[v], 0x5bd1e995ULL + static_cast<uint64_t>(r));
      for (int64_t u : g.operands(v)) x = mix(x, h[u]);
      user_keys.clear();
      for (int64_t i = us.offsets[v]; i < us.offsets[v + 1]; ++i) {
        user_keys.push_back(mix(h[us.user[i]], static_cast<uint64_t>(us.slot[i])));
      }
      std::sort(user_keys.begin(), user_keys.end());
      x = mix(x, user_keys.size());
      for (uint64_t k : user_keys) x = mix(x, k);
      next[v] = x;
    }
    h.swap(next);
  }
  return h;
}

RepeatClasses find_repeats(const Graph& g, const RepeatOptions& options) {
  const int64_t n = g.num_nodes();
  const std::vector<uint64_t> h = structural_hashes(g, options.region_rounds);
  std::vector<int64_t> rep(n);
  std::iota(rep.begin(), rep.end(), 0);
  RepeatClasses rc;
  rc.regions = assign_reps(h, 0, n, options, options.nesting, rep);
  const std::vector<uint64_t> fine = options.class_rounds == options.region_rounds
                                         ? h : structural_hashes(g, options.class_rounds);
  // A class: the nodes repeating one first-copy node that also agree on the fine hash.
  std::unordered_map<uint64_t, int64_t> count;
  auto key = [&](int64_t v) { return mix(static_cast<uint64_t>(rep[v]), fine[v]); };
  for (int64_t v = 0; v < n; ++v) ++count[key(v)];
  std::unordered_map<uint64_t, int64_t> id;
  rc.node_class.assign(n, -1);
  for (int64_t v = 0; v < n; ++v) {
    const uint64_t k = key(v);
    if (count[k] >= 2) rc.node_class[v] = id.try_emplace(k, static_cast<int64_t>(id.size())).first->second;
  }
  rc.num_classes = static_cast<int64_t>(id.size());
  if (options.anchor) {
    // Anchor the positions (nodes repeating one first-copy node, whatever their fine hash: a
    // boundary layer's dot still stands for its position), then keep each class's members whose
    // position stands, split by the standing part of the position they are in.
    RepeatClasses pos;
    std::unordered_map<int64_t, int64_t> copies;
    for (int64_t v = 0; v < n; ++v) ++copies[rep[v]];
    std::unordered_map<int64_t, int64_t> pid;
    pos.node_class.assign(n, -1);
    for (int64_t v = 0; v < n; ++v) {
      if (copies[rep[v]] < 2) continue;
      pos.node_class[v] = pid.try_emplace(rep[v], static_cast<int64_t>(pid.size())).first->second;
    }
    pos.num_classes = static_cast<int64_t>(pid.size());
    anchor_classes(g, pos);
    std::map<std::pair<int64_t, int64_t>, int64_t> kept_count, kept_id;
    for (int64_t v = 0; v < n; ++v) {
      if (rc.node_class[v] >= 0 && pos.node_class[v] >= 0) {
        ++kept_count[{rc.node_class[v], pos.node_class[v]}];
      }
    }
    for (int64_t v = 0; v < n; ++v) {
      const std::pair<int64_t, int64_t> k{rc.node_class[v], pos.node_class[v]};
      const bool kept = k.first >= 0 && k.second >= 0 && kept_count[k] >= 2;
      const int64_t fresh = static_cast<int64_t>(kept_id.size());
      rc.node_class[v] = kept ? kept_id.try_emplace(k, fresh).first->second : -1;
    }
    rc.num_classes = static_cast<int64_t>(kept_id.size());
  }
  return rc;
}

TieStats tie_repeated_groups(const Graph& g, const std::vector<NodeStrategies>& nodes,
                             const RepeatClasses& classes, std::vector<int64_t>& node_group,
                             std::vector<size_t>& group_size) {
  const int64_t n = g.num_nodes();
  if (static_cast<int64_t>(nodes.size()) != n || static_cast<int64_t>(node_group.size()) != n ||
      static_cast<int64_t>(classes.node_class.size()) != n) {
    throw std::invalid_argument("tie_repeated_groups: strategies, groups and classes must cover all " +
                                std::to_string(n) + " nodes");
  }
  TieStats st;
  st.regions = static_cast<int64_t>(classes.regions.size());
  for (const RepeatRegion& r : classes.regions) st.max_copies = std::max(st.max_copies, r.copies());
  st.groups_before = static_cast<int64_t>(group_size.size());
  // Members of each class; a class mixing leaders and followers is skipped.
  std::vector<std::vector<int64_t>> members(classes.num_classes);
  std::vector<char> has_follower(classes.num_classes, 0);
  for (int64_t v = 0; v < n; ++v) {
    const int64_t c = classes.node_class[v];
    if (c < 0) continue;
    ++st.repeated_nodes;
    if (nodes[v].follow >= 0) {
      has_follower[c] = 1;
    } else {
      members[c].push_back(v);
    }
  }
  std::vector<int64_t> parent(group_size.size());
  std::iota(parent.begin(), parent.end(), 0);
  for (int64_t c = 0; c < classes.num_classes; ++c) {
    const auto& m = members[c];
    if (m.empty() || (m.size() < 2 && !has_follower[c])) continue;  // followers / a lone node
    bool ok = !has_follower[c];
    for (size_t i = 1; ok && i < m.size(); ++i) ok = same_strategies(nodes[m[0]], nodes[m[i]]);
    if (!ok) {
      ++st.classes_skipped;
      continue;
    }
    ++st.classes_tied;
    const int64_t root = find_root(parent, node_group[m[0]]);
    for (size_t i = 1; i < m.size(); ++i) parent[find_root(parent, node_group[m[i]])] = root;
  }
  // Renumber by first node, so groups stay in node order.
  std::vector<int64_t> renum(group_size.size(), -1);
  std::vector<size_t> sizes;
  for (int64_t v = 0; v < n; ++v) {
    const int64_t root = find_root(parent, node_group[v]);
    if (renum[root] < 0) {
      renum[root] = static_cast<int64_t>(sizes.size());
      sizes.push_back(group_size[root]);
    }
    node_group[v] = renum[root];
  }
  group_size = std::move(sizes);
  st.groups_after = static_cast<int64_t>(group_size.size());
  return st;
}

}  // namespace alpa
