"""Pipeline schedules: per-stage orders of forward/backward tasks, and a clocked issue order.

``stage_orders(name, S, M)`` gives, per stage, the order it runs its tasks in:
GPipe runs every forward, then every backward; 1F1B (PipeDream-flush) runs ``min(S - i - 1, M)``
warm-up forwards on stage i, then alternates one forward and one backward, then drains, so at
most ``S - i`` micro-batches are in flight on stage i. ``clock(orders)`` simulates unit-time tasks
(forward (s, m) needs forward (s - 1, m); backward (s, m) needs forward (s, m) and backward
(s + 1, m)) and returns the tasks run at each tick; issuing ticks in order respects every
dependency, and the ticks are the timeline the plan draws.
"""
from __future__ import annotations

import dataclasses

from alpa_pass.errors import AlpaPassError


@dataclasses.dataclass(frozen=True)
class Task:
    stage: int
    kind: str   # "fwd" or "bwd"
    micro: int


def stage_orders(name: str, num_stages: int, num_micro: int) -> list[list[Task]]:
    """Per stage, its tasks in the order the schedule ``name`` ("gpipe" or "1f1b") runs them."""
    if name == "gpipe":
        return [[Task(s, "fwd", m) for m in range(num_micro)] + [Task(s, "bwd", m) for m in range(num_micro)]
                for s in range(num_stages)]
    if name == "1f1b":
        return [_one_f_one_b(s, num_stages, num_micro) for s in range(num_stages)]
    raise ValueError(f"unknown pipeline schedule {name!r}; use 'gpipe' or '1f1b'")


def _one_f_one_b(s: int, num_stages: int, num_micro: int) -> list[Task]:
    warm = min(num_stages - s - 1, num_micro)
    order = [Task(s, "fwd", m) for m in range(warm)]
    for k in range(num_micro - warm):
        order += [Task(s, "fwd", warm + k), Task(s, "bwd", k)]
    order += [Task(s, "bwd", m) for m in range(num_micro - warm, num_micro)]
    return order


def clock(orders: list[list[Task]]) -> list[list[Task]]:
    """Tasks run at each tick when every stage runs its next ready task (one per tick)."""
    num_stages = len(orders)
    done: set = set()
    pos = [0] * num_stages
    ticks = []
    while any(p < len(o) for p, o in zip(pos, orders)):
        tick = [orders[s][pos[s]] for s in range(num_stages)
                if pos[s] < len(orders[s]) and _ready(orders[s][pos[s]], done, num_stages)]
        if not tick:
            raise AlpaPassError(f"pipeline schedule deadlocks at {[o[p] for p, o in zip(pos, orders) if p < len(o)]}")
        for t in tick:
            pos[t.stage] += 1
        done.update(tick)
        ticks.append(tick)
    return ticks


def _ready(t: Task, done: set, num_stages: int) -> bool:
    if t.kind == "fwd":
        return t.stage == 0 or Task(t.stage - 1, "fwd", t.micro) in done
    return Task(t.stage, "fwd", t.micro) in done and (
        t.stage == num_stages - 1 or Task(t.stage + 1, "bwd", t.micro) in done)
