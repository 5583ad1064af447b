// Layer clustering and stage-submesh DPs (see alpa/pipeline_dp.h).
#include "alpa/pipeline_dp.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace alpa {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

std::vector<int64_t> cluster_layers(const std::vector<double>& flops, const std::vector<double>& cut_bytes,
                                    int64_t layers, double eps) {
  const int64_t n = static_cast<int64_t>(flops.size());
  if (layers < 1 || layers > n) {
    throw std::invalid_argument("cluster_layers: layers = " + std::to_string(layers) + " must be in [1, " +
                                std::to_string(n) + "] (the operator count)");
  }
  if (static_cast<int64_t>(cut_bytes.size()) != n - 1) {
    throw std::invalid_argument("cluster_layers: cut_bytes needs n - 1 = " + std::to_string(n - 1) + " entries");
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + flops[i];
  const double cap = std::max((1.0 + eps) * prefix[n] / static_cast<double>(layers),
                              *std::max_element(flops.begin(), flops.end())) * (1.0 + 1e-12);
  // Lexicographic (max cut, sum of cuts) does not decompose over prefixes (a prefix with a larger
  // max but a smaller sum can win once a later cut sets the max), so solve it in two exact DPs:
  // the least max cut (min-max decomposes), then the least sum with every cut at most that max.
  // best[l][i]: layers 0..l-1 cover operators [0, i); choice[l][i]: where layer l - 1 starts.
  std::vector<std::vector<double>> best(layers + 1, std::vector<double>(n + 1));
  std::vector<std::vector<int64_t>> choice(layers + 1, std::vector<int64_t>(n + 1, -1));
  auto solve = [&](bool sum_phase, double max_cut) {
    for (auto& row : best) std::fill(row.begin(), row.end(), kInf);
    best[0][0] = 0.0;
    for (int64_t l = 1; l <= layers; ++l) {
      for (int64_t i = l; i <= n - (layers - l); ++i) {
        for (int64_t j = i - 1; j >= l - 1; --j) {
          if (prefix[i] - prefix[j] > cap) break;
          if (best[l - 1][j] == kInf) continue;
          const double cut = j > 0 ? cut_bytes[j - 1] : 0.0;
          if (sum_phase && cut > max_cut) continue;
          const double c = sum_phase ? best[l - 1][j] + cut : std::max(best[l - 1][j], cut);
          if (c < best[l][i]) {
            best[l][i] = c;
            choice[l][i] = j;
          }
        }
      }
    }
    return best[layers][n];
  };
  const double max_cut = solve(false, kInf);
  if (max_cut == kInf) {
    throw std::invalid_argument("cluster_layers: no cut into " + std::to_string(layers) +
                                " layers keeps every layer under the FLOP cap; raise eps or use fewer layers");
  }
  solve(true, max_cut);
  std::vector<int64_t> starts(layers - 1);
  for (int64_t l = layers, i = n; l > 1; --l) {
    i = choice[l][i];
    starts[l - 2] = i;
  }
  return starts;
}

namespace {

struct StageTable {
  int64_t L, K, N;
  const std::vector<double>& cost;
  const std::vector<int64_t>& devices;
  double at(int64_t i, int64_t j, int64_t k) const { return cost[(i * L + j) * K + k]; }
};

// Minimum sum of latencies covering layers [i, L) with at most d devices, every stage <= t_max.
// f has (L + 1) * (N + 1) entries; arg (same size) records (j, k) of the first stage when given.
void fill_sum_dp(const StageTable& t, double t_max, std::vector<double>& f,
                 std::vector<std::pair<int64_t, int64_t>>* arg) {
  const int64_t L = t.L, N = t.N;
  std::fill(f.begin(), f.end(), kInf);
  for (int64_t d = 0; d <= N; ++d) f[L * (N + 1) + d] = 0.0;
  for (int64_t i = L - 1; i >= 0; --i) {
    for (int64_t j = i; j < L; ++j) {
      for (int64_t k = 0; k < t.K; ++k) {
        const double c = t.at(i, j, k);
        if (!(c <= t_max)) continue;
        const int64_t need = t.devices[k];
        const double* next = &f[(j + 1) * (N + 1)];
        double* cur = &f[i * (N + 1)];
        for (int64_t d = need; d <= N; ++d) {
          const double v = c + next[d - need];
          if (v < cur[d]) {
            cur[d] = v;
            if (arg) (*arg)[i * (N + 1) + d] = {j, k};
          }
        }
      }
    }
  }
}

}  // namespace

StageDpResult stage_dp(int64_t num_layers, const std::vector<double>& cost,
                       const std::vector<int64_t>& submesh_devices, int64_t num_devices, int64_t num_micro) {
  const int64_t L = num_layers, K = static_cast<int64_t>(submesh_devices.size()), N = num_devices;
  if (L < 1 || K < 1 || N < 1 || num_micro < 1) {
    throw std::invalid_argument("stage_dp: num_layers, submesh choices, num_devices and num_micro must be >= 1");
  }
  if (static_cast<int64_t>(cost.size()) != L * L * K) {
    throw std::invalid_argument("stage_dp: cost needs num_layers^2 * num_submeshes = " + std::to_string(L * L * K) +
                                " entries, got " + std::to_string(cost.size()));
  }
  for (int64_t d : submesh_devices) {
    if (d < 1) throw std::invalid_argument("stage_dp: every submesh needs >= 1 device");
  }
  StageTable t{L, K, N, cost, submesh_devices};
  std::vector<double> candidates;
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = i; j < L; ++j)
      for (int64_t k = 0; k < K; ++k)
        if (std::isfinite(t.at(i, j, k))) candidates.push_back(t.at(i, j, k));
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  if (num_micro == 1 && !candidates.empty()) candidates = {candidates.back()};
  std::vector<double> f((L + 1) * (N + 1));
  double best = kInf, best_t = kInf;
  for (double t_max : candidates) {
    if (static_cast<double>(num_micro - 1) * t_max >= best) break;
    fill_sum_dp(t, t_max, f, nullptr);
    const double total = f[N] + static_cast<double>(num_micro - 1) * t_max;
    if (total < best) {
      best = total;
      best_t = t_max;
    }
  }
  if (best == kInf) {
    throw std::invalid_argument("stage_dp: no assignment of layers to submeshes fits the devices (every "
                                "candidate stage is infeasible or needs too many devices)");
  }
  std::vector<std::pair<int64_t, int64_t>> arg((L + 1) * (N + 1), {-1, -1});
  fill_sum_dp(t, best_t, f, &arg);
  StageDpResult out{best, 0.0, {}};
  for (int64_t i = 0, d = N; i < L;) {
    auto [j, k] = arg[i * (N + 1) + d];
    out.stages.push_back({i, j + 1, k});
    out.max_stage_latency = std::max(out.max_stage_latency, t.at(i, j, k));
    d -= submesh_devices[k];
    i = j + 1;
  }
  out.objective = f[N] + static_cast<double>(num_micro - 1) * out.max_stage_latency;
  return out;
}

}  // namespace alpa
