"""Pipeline schedules: order of work per stage, in-flight bounds, and a dependency-respecting clock."""
from __future__ import annotations

import pytest

from alpa_pass.pipeline.partition.schedule import Task, clock, stage_orders

GRID = [(s, m) for s in range(1, 9) for m in range(1, 33)]


def _in_flight_max(order):
    live = peak = 0
    for t in order:
        live += 1 if t.kind == "fwd" else -1
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_every_task_once_and_forward_before_backward(name):
    for s_count, m_count in GRID:
        orders = stage_orders(name, s_count, m_count)
        assert len(orders) == s_count
        for s, order in enumerate(orders):
            assert sorted((t.kind, t.micro) for t in order) == sorted(
                [("fwd", m) for m in range(m_count)] + [("bwd", m) for m in range(m_count)])
            assert all(t.stage == s for t in order)
            pos = {(t.kind, t.micro): i for i, t in enumerate(order)}
            assert all(pos[("fwd", m)] < pos[("bwd", m)] for m in range(m_count))


def test_1f1b_in_flight_bound():
    for s_count, m_count in GRID:
        for s, order in enumerate(stage_orders("1f1b", s_count, m_count)):
            assert _in_flight_max(order) == min(s_count - s, m_count), (s_count, m_count, s)


def test_gpipe_runs_all_forwards_first():
    for s_count, m_count in GRID:
        for order in stage_orders("gpipe", s_count, m_count):
            kinds = [t.kind for t in order]
            assert kinds == ["fwd"] * m_count + ["bwd"] * m_count
            assert _in_flight_max(order) == m_count


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_clock_respects_dependencies_and_stage_order(name):
    for s_count, m_count in GRID:
        orders = stage_orders(name, s_count, m_count)
        ticks = clock(orders)
        when = {t: i for i, tick in enumerate(ticks) for t in tick}
        assert len(when) == 2 * s_count * m_count
        for tick in ticks:
            assert len({t.stage for t in tick}) == len(tick), "a stage runs one task per tick"
        for order in orders:
            assert [when[t] for t in order] == sorted(when[t] for t in order)
        for s in range(s_count):
            for m in range(m_count):
                if s:
                    assert when[Task(s - 1, "fwd", m)] < when[Task(s, "fwd", m)]
                if s + 1 < s_count:
                    assert when[Task(s + 1, "bwd", m)] < when[Task(s, "bwd", m)]
                assert when[Task(s, "fwd", m)] < when[Task(s, "bwd", m)]


def test_clock_lengths():
    # GPipe and 1F1B both take 2 (M + S - 1) unit ticks; 1F1B only changes memory.
    for s_count, m_count in GRID:
        assert len(clock(stage_orders("gpipe", s_count, m_count))) == 2 * (m_count + s_count - 1)
        assert len(clock(stage_orders("1f1b", s_count, m_count))) == 2 * (m_count + s_count - 1)


def test_unknown_schedule():
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        stage_orders("interleaved", 2, 2)
