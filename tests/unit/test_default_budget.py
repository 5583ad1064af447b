"""Memory by default: with no ``memory_budget_per_device``, plans on GPU/TPU devices get
``device_memory_fraction`` of the device's ``bytes_limit``; CPU plans get none unless asked; the
plan summary says which (fake devices here: no accelerator needed)."""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import pytest

import alpa_pass as ap
from alpa_pass.driver.budget import resolve_budget
from alpa_pass.plan.plan import budget_line

GIB = 2**30


def _device(platform, limit=None, fails=False):
    def memory_stats():
        if fails:
            raise NotImplementedError("no stats")
        return None if limit is None else {"bytes_limit": limit, "bytes_in_use": 0}
    return types.SimpleNamespace(platform=platform, memory_stats=memory_stats)


def test_gpu_plans_get_a_fraction_of_the_smallest_device_memory():
    option, budget = resolve_budget(ap.AutoShardingOption(), [_device("gpu", 80 * GIB), _device("gpu", 40 * GIB)])
    assert option.memory_budget_per_device == int(0.9 * 40 * GIB)
    assert budget == {"bytes": int(0.9 * 40 * GIB), "source": "device", "fraction": 0.9, "bytes_limit": 40 * GIB}
    assert budget_line(budget) == ("memory budget: 36 GiB per device = 0.9 x the device's 40 GiB "
                                   "(memory_stats bytes_limit)")
    option, _ = resolve_budget(ap.AutoShardingOption(device_memory_fraction=0.5), [_device("gpu", 80 * GIB)])
    assert option.memory_budget_per_device == 40 * GIB


@pytest.mark.parametrize("devices,option", [
    ([_device("cpu", 64 * GIB)], ap.AutoShardingOption()),                               # CPU: none
    ([_device("gpu", 80 * GIB)], ap.AutoShardingOption(device_memory_fraction=None)),    # turned off
    ([_device("gpu")], ap.AutoShardingOption()),                                         # no stats
    ([_device("gpu", fails=True)], ap.AutoShardingOption()),                             # stats raise
])
def test_no_budget_unless_the_device_reports_one(devices, option):
    resolved, budget = resolve_budget(option, devices)
    assert resolved.memory_budget_per_device is None and budget == {"bytes": None, "source": "none"}
    assert budget_line(budget).startswith("memory budget: none")


def test_a_given_budget_wins():
    option, budget = resolve_budget(ap.AutoShardingOption(memory_budget_per_device=2 * GIB), [_device("gpu", 80 * GIB)])
    assert option.memory_budget_per_device == 2 * GIB and budget == {"bytes": 2 * GIB, "source": "given"}
    assert budget_line(budget) == "memory budget: 2 GiB per device (memory_budget_per_device)"


def test_bad_fraction_is_rejected():
    with pytest.raises(ValueError, match="device_memory_fraction must be in"):
        ap.AutoShardingOption(device_memory_fraction=1.5)


def test_cpu_plan_summary_says_no_budget():
    plan = ap.parallelize(lambda x: jnp.sin(x) * 2).plan(jax.ShapeDtypeStruct((64, 64), jnp.float32))
    assert plan.memory_budget == {"bytes": None, "source": "none"}
    assert "memory budget: none" in plan.summary()
