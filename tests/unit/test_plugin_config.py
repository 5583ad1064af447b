"""ALPA_PASS_* parsing and validation (pure strings: no jax, no devices)."""
from __future__ import annotations

import logging
import pathlib

import pytest

from alpa_pass.errors import AlpaPassError
from alpa_pass.plugin.config import (DEFAULT_MIN_BYTES, PluginConfig, PluginConfigError, load_config,
                                     parse_bytes, parse_mesh, plugin_enabled)


@pytest.mark.parametrize("value,enabled", [("alpa_pass", True), ("cuda, alpa_pass", True),
                                           ("alpa_pass,rocm", True), ("", False), ("cuda", False),
                                           ("alpa_pass_x", False)])
def test_plugin_enabled(value, enabled):
    assert plugin_enabled({"JAX_PLUGINS": value}) is enabled
    assert plugin_enabled({}) is False


def test_defaults():
    assert load_config({}) == PluginConfig(method="shard", mesh_shape=None, memory_budget_bytes=None,
                                           report_dir=None, log_level=None, min_bytes=DEFAULT_MIN_BYTES)


def test_full_config():
    cfg = load_config({"ALPA_PASS_METHOD": "Shard", "ALPA_PASS_MESH": "2x4", "ALPA_PASS_REPORT": "/tmp/r",
                       "ALPA_PASS_LOG": "INFO", "ALPA_PASS_MIN_BYTES": "64KiB"})
    assert cfg == PluginConfig(method="shard", mesh_shape=(2, 4), report_dir="/tmp/r",
                               log_level=logging.INFO, min_bytes=65536)


@pytest.mark.parametrize("text,shape", [("8", (8,)), ("2x4", (2, 4)), ("2X2x2", (2, 2, 2)), ("1*8", (1, 8)),
                                        ("", None)])
def test_parse_mesh(text, shape):
    assert parse_mesh(text) == shape


@pytest.mark.parametrize("text", ["2x", "x4", "0x8", "2x-4", "two", "2.5x2", "2x4x"])
def test_bad_mesh(text):
    with pytest.raises(PluginConfigError, match="ALPA_PASS_MESH=.* is not a mesh shape"):
        parse_mesh(text)


def test_auto_mesh_and_cache_dir():
    cfg = load_config({"ALPA_PASS_MESH": "Auto", "ALPA_PASS_CACHE": "/tmp/plans"})
    assert cfg.mesh_shape == "auto" and cfg.cache_dir == "/tmp/plans"


@pytest.mark.parametrize("text,n", [("16GiB", 16 * 2**30), ("512MB", 512 * 10**6), ("1.5G", 1_500_000_000),
                                    ("1048576", 2**20), ("4 kib", 4096), ("2Ti", 2 * 2**40), ("7b", 7)])
def test_parse_bytes(text, n):
    assert parse_bytes(text, "X") == n


@pytest.mark.parametrize("text", ["16 GiBs", "GiB", "-1", "1.5", "12QB", "1e9", "ib"])
def test_bad_bytes(text):
    with pytest.raises(PluginConfigError, match="X="):
        parse_bytes(text, "X")


def test_memory_budget_parsed():
    assert load_config({"ALPA_PASS_MEMORY_BUDGET": "16GiB"}).memory_budget_bytes == 16 * 2**30
    with pytest.raises(PluginConfigError, match="must be a positive size"):
        load_config({"ALPA_PASS_MEMORY_BUDGET": "0"})
    with pytest.raises(PluginConfigError, match="ALPA_PASS_MEMORY_BUDGET='lots' is not a size"):
        load_config({"ALPA_PASS_MEMORY_BUDGET": "lots"})


@pytest.mark.parametrize("method", ["data", "zero2", "zero3", "SHARD"])
def test_preset_methods(method):
    assert load_config({"ALPA_PASS_METHOD": method}).method == method.lower()


def test_auto_mesh_presets_are_refused_with_a_way_out():
    with pytest.raises(PluginConfigError, match="'auto' works with ALPA_PASS_METHOD=shard only"):
        load_config({"ALPA_PASS_METHOD": "data", "ALPA_PASS_MESH": "auto"})


def test_unknown_method_and_log_level():
    with pytest.raises(PluginConfigError, match="not one of shard, data, zero2, zero3"):
        load_config({"ALPA_PASS_METHOD": "pipeline"})
    with pytest.raises(PluginConfigError, match="ALPA_PASS_LOG='loud' is not a log level"):
        load_config({"ALPA_PASS_LOG": "loud"})


def test_config_error_is_an_alpa_pass_error():
    assert issubclass(PluginConfigError, AlpaPassError) and issubclass(PluginConfigError, ValueError)


@pytest.mark.parametrize("name,field,default", [("ALPA_PASS_REDUCE_SCATTER", "reduce_scatter", False),
                                                ("ALPA_PASS_PEEL_SCANS", "peel_scans", True)])
def test_flags(name, field, default):
    assert getattr(load_config({}), field) is default
    assert getattr(load_config({name: ""}), field) is default
    assert getattr(load_config({name: "1"}), field) is True
    assert getattr(load_config({name: "0"}), field) is False
    with pytest.raises(PluginConfigError, match=f"{name}='yes' must be 0 or 1"):
        load_config({name: "yes"})


def test_a_profile_is_auto_or_a_json_that_exists_and_reaches_the_plans_options(tmp_path):
    """ALPA_PASS_PROFILE: the plugin plans with a measured cluster profile (objective in seconds)
    as AutoShardingOption(profile=...) does; a path that is no file is refused up front."""
    from alpa_pass.plugin.planner import PluginPlanner

    assert load_config({"ALPA_PASS_PROFILE": "Auto"}).profile == "auto"
    assert load_config({}).profile == load_config({"ALPA_PASS_PROFILE": ""}).profile == "auto"  # the default
    for text in ("none", "UNIT", "off", "0"):
        assert load_config({"ALPA_PASS_PROFILE": text}).profile is None
    with pytest.raises(PluginConfigError, match="ALPA_PASS_PROFILE='/no/such.json' is no file.*alpa-pass profile"):
        load_config({"ALPA_PASS_PROFILE": "/no/such.json"})
    src = pathlib.Path(__file__).parents[2] / "benchmarks" / "report" / "profile_cpu-cpu-8dev-1x8.json"
    path = tmp_path / "p.json"
    path.write_text(src.read_text())
    cfg = load_config({"ALPA_PASS_PROFILE": str(path), "ALPA_PASS_MESH": "2x4"})
    assert cfg.profile == str(path)
    option = PluginPlanner(cfg).method()[0].planning_option()
    assert option.profile.key == "cpu-cpu-8dev-1x8" and option.profile.seconds_per_flop > 0


@pytest.mark.parametrize("flags, added", [
    ("--xla_force_host_platform_device_count=8", True),
    ("--foo --xla_force_host_platform_device_count=4 --bar", True),
    ("--xla_force_host_platform_device_count=1", False),
    ("", False),
    ("--xla_force_host_platform_device_count=8 --xla_cpu_enable_concurrency_optimized_scheduler=true", False),
])
def test_simulated_cpu_devices_run_one_schedule(flags, added):
    """Several simulated CPU devices (threads of one process) entered a plan's independent
    collectives in different orders under XLA's concurrent CPU schedule and aborted on a rendezvous
    timeout (a lax.map chunked loss on 1x8, 5 of 5 runs): the plugin selects the memory-minimising
    schedule unless the user chose a scheduler."""
    from alpa_pass.plugin import SERIAL_CPU_SCHEDULE, _one_schedule_on_simulated_devices

    environ = {"XLA_FLAGS": flags} if flags else {}
    _one_schedule_on_simulated_devices(environ)
    want = f"{flags} {SERIAL_CPU_SCHEDULE}".strip() if added else flags
    assert environ.get("XLA_FLAGS", "") == want
