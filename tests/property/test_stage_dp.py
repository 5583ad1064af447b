"""The C++ inter-op DPs equal exhaustive search on small random instances."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from alpa_pass import _core


def _compositions(n):
    """Every way to cut range(n) into consecutive non-empty (start, stop) ranges."""
    for k in range(n):
        for cuts in itertools.combinations(range(1, n), k):
            b = [0, *cuts, n]
            yield list(zip(b[:-1], b[1:]))


def brute_stage(cost, sizes, num_devices, num_micro):
    best = np.inf
    L, _, K = cost.shape
    for ranges in _compositions(L):
        for ks in itertools.product(range(K), repeat=len(ranges)):
            if sum(sizes[k] for k in ks) > num_devices:
                continue
            lat = [cost[a, b - 1, k] for (a, b), k in zip(ranges, ks)]
            if np.all(np.isfinite(lat)):
                best = min(best, sum(lat) + (num_micro - 1) * max(lat))
    return best


@st.composite
def stage_instances(draw):
    L = draw(st.integers(1, 4))
    K = draw(st.integers(1, 3))
    sizes = np.array(draw(st.lists(st.integers(1, 4), min_size=K, max_size=K)), np.int64)
    vals = draw(st.lists(st.one_of(st.integers(1, 20).map(float), st.just(np.inf)),
                         min_size=L * L * K, max_size=L * L * K))
    cost = np.array(vals).reshape(L, L, K)
    for i in range(L):  # one always-feasible single-device choice per layer keeps most instances solvable
        cost[i, i, 0] = min(cost[i, i, 0], 25.0)
    return cost, sizes, draw(st.integers(1, 8)), draw(st.integers(1, 6))


@settings(max_examples=300, deadline=None)
@given(stage_instances())
def test_stage_dp_equals_brute_force(inst):
    cost, sizes, num_devices, num_micro = inst
    want = brute_stage(cost, sizes, num_devices, num_micro)
    if not np.isfinite(want):
        try:
            _core.stage_dp(cost, sizes, num_devices, num_micro)
        except ValueError:
            return
        raise AssertionError("DP found an assignment where brute force found none")
    objective, max_lat, stages = _core.stage_dp(cost, sizes, num_devices, num_micro)
    assert objective == want
    lat = [cost[a, b - 1, k] for a, b, k in stages]
    assert [a for a, _, _ in stages] == [0] + [b for _, b, _ in stages[:-1]] and stages[-1][1] == cost.shape[0]
    assert sum(sizes[k] for _, _, k in stages) <= num_devices
    assert max_lat == max(lat) and sum(lat) + (num_micro - 1) * max(lat) == objective


def brute_layers(flops, cut, layers, eps):
    n = len(flops)
    cap = max((1 + eps) * sum(flops) / layers, max(flops)) * (1 + 1e-12)
    best = None
    for starts in itertools.combinations(range(1, n), layers - 1):
        b = [0, *starts, n]
        if any(sum(flops[x:y]) > cap for x, y in zip(b[:-1], b[1:])):
            continue
        c = [cut[s - 1] for s in starts]
        key = (max(c, default=0.0), sum(c))
        best = key if best is None or key < best else best
    return best


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=8), st.data(), st.floats(0, 1))
def test_cluster_layers_equals_brute_force(flops, data, eps):
    _check_cluster_layers(flops, data.draw(st.lists(st.integers(0, 50).map(float), min_size=len(flops) - 1,
                                                    max_size=len(flops) - 1)),
                          data.draw(st.integers(1, len(flops))), eps)


def test_cluster_layers_least_max_then_least_sum():
    """Found by a random run: a one-pass DP over (max cut, sum of cuts) keeps each prefix's
    lexicographic best, but a prefix with a larger max and a smaller sum wins once a later cut sets
    the max: it returned (3, 7) where (3, 6) exists."""
    _check_cluster_layers([1, 1, 2, 1, 1, 1, 2, 1], [0.0, 2.0, 3.0, 2.0, 0.0, 3.0, 0.0], 4, 0.5)


def _check_cluster_layers(flops, cut, layers, eps):
    n = len(flops)
    want = brute_layers(flops, cut, layers, eps)
    f, c = np.array(flops, float), np.array(cut, float)
    if want is None:
        try:
            _core.cluster_layers(f, c, layers, eps)
        except ValueError:
            return
        raise AssertionError("DP found a clustering where brute force found none")
    starts = _core.cluster_layers(f, c, layers, eps)
    assert len(starts) == layers - 1 and list(starts) == sorted(set(starts)) and all(0 < s < n for s in starts)
    got = [cut[s - 1] for s in starts]
    assert (max(got, default=0.0), sum(got)) == want
