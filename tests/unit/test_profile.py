"""Measured cost profiles (``alpa-pass profile``, ``AutoShardingOption(profile=...)``): the
alpha/beta fit, the JSON and its key, the mesh costs the core receives, the plans they lead to and
the plan fingerprint."""
import json
import logging
import os

import jax
import numpy as np
import pytest

import alpa_pass as ap
from alpa_pass import _core, cost_profile
from alpa_pass.driver.request import fingerprint
from alpa_pass.errors import OptionError, PlanMismatchError
from alpa_pass.tools import profile as profile_tool
from zoo import mlp
from zoo.pipeline import make_heavy_layer_loss


def synthetic(beta_by_stride: dict, alpha: float = 1e-5, flops: float = 1e9, key: str = "synthetic",
              beta_by_axis: dict | None = None) -> dict:
    """A profile of 8 devices whose axes cost ``beta_by_stride[stride]`` per byte, or
    ``beta_by_axis[(size, stride)]`` where given."""
    beta_by_axis = beta_by_axis or {}
    axes = [{"size": n, "stride": s, "alpha": alpha, "beta": beta_by_axis.get((n, s), beta_by_stride[s])}
            for n, s in cost_profile.axes_of(8)]
    return {"format": cost_profile.FORMAT, "format_version": cost_profile.FORMAT_VERSION, "key": key,
            "cluster": {"num_devices": 8}, "axes": axes, "compute": {"matmul_flops_per_s": {"float32": flops}}}


def test_byte_factors_are_the_cores():
    mesh = _core.Mesh(shape=[4], alpha=[0.0], beta=[1.0])
    core = {"all-reduce": mesh.all_reduce, "all-gather": mesh.all_gather,
            "reduce-scatter": mesh.reduce_scatter, "all-to-all": mesh.all_to_all}
    for kind, cost in core.items():
        assert cost(1000.0, 0) == pytest.approx(cost_profile.byte_factor(kind, 4) * 1000.0)


def test_fit_recovers_known_alpha_beta():
    sizes = np.array([4096 * 4 ** i for i in range(6)], dtype=float)
    alpha, beta = 3e-5, 1.2e-9
    # exact timings of every kind on a 4-device axis: the joint fit the core receives is exact
    xs = np.concatenate([cost_profile.byte_factor(k, 4) * sizes for k in cost_profile.CORE_KINDS])
    got = cost_profile.fit_alpha_beta(xs, alpha + beta * xs)
    assert got == pytest.approx((alpha, beta), rel=1e-6)
    # 10% multiplicative noise, one timing 30x too low and one lost in noise (<= 0): still close
    rng = np.random.default_rng(0)
    x = cost_profile.byte_factor("all-reduce", 8) * sizes
    t = (alpha + beta * x) * np.exp(rng.normal(0, 0.1, len(x)))
    t[2] /= 30
    x, t = np.append(x, 5e4), np.append(t, -1e-6)
    a, b = cost_profile.fit_alpha_beta(x, t)
    assert a == pytest.approx(alpha, rel=0.25) and b == pytest.approx(beta, rel=0.25)
    # pure latency and pure bandwidth
    assert cost_profile.fit_alpha_beta(sizes, np.full(6, 5e-5)) == pytest.approx((5e-5, 0.0), abs=1e-12)
    a, b = cost_profile.fit_alpha_beta(sizes, 2e-9 * sizes)
    assert a == pytest.approx(0.0, abs=1e-9) and b == pytest.approx(2e-9, rel=1e-6)
    with pytest.raises(ValueError):
        cost_profile.fit_alpha_beta([1.0, 1.0], [1.0, 2.0])  # one size: no slope


def test_axes_and_keys():
    assert cost_profile.axes_of(8) == [(2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (2, 4)]
    assert cost_profile.mesh_axes((2, 4)) == [(2, 4), (4, 1)]
    assert cost_profile.mesh_axes((2, 2, 2)) == [(2, 4), (2, 2), (2, 1)]
    assert cost_profile.cluster_key("cpu", "cpu", 8, [8]) == "cpu-cpu-8dev-1x8"
    assert cost_profile.cluster_key("gpu", "NVIDIA H200", 16, [8, 8]) == "gpu-nvidia-h200-16dev-2x8"
    assert cost_profile.cluster_key("gpu", "NVIDIA H200", 12, [8, 4]) == "gpu-nvidia-h200-12dev-8-4"
    assert cost_profile.cluster_key(**cost_profile.current_cluster()) == "cpu-cpu-8dev-1x8"


def test_profile_tool_writes_a_keyed_profile_that_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("ALPA_PASS_PROFILE_DIR", str(tmp_path / "cache"))
    data = profile_tool.profile_cluster("cache", axes=[(2, 4), (4, 1)], sizes=(65536, 1 << 20), repeats=3,
                                        iters=4, matmul_n=128, memory_bytes=4 << 20, dtypes=("float32",))
    path = tmp_path / "cache" / "cpu-cpu-8dev-1x8.json"
    assert data["key"] == "cpu-cpu-8dev-1x8" and path.exists()
    assert data["cluster"] == {"platform": "cpu", "device_kind": "cpu", "num_devices": 8, "devices_per_process": [8]}
    assert [(a["size"], a["stride"]) for a in data["axes"]] == [(2, 4), (4, 1)]
    for axis in data["axes"]:
        assert sorted(axis["kinds"]) == sorted(cost_profile.KINDS)
        assert all([b for b, _ in k["samples"]] == [65536, 1 << 20] for k in axis["kinds"].values())
        assert axis["alpha"] >= 0 and axis["beta"] >= 0
    assert data["compute"]["matmul_flops_per_s"]["float32"] > 0 and data["compute"]["memory_bytes_per_s"] > 0
    loaded = cost_profile.load(path)
    assert loaded.data == json.loads(json.dumps(data)) and loaded == ap.AutoShardingOption(profile=str(path)).profile
    again = cost_profile.ClusterProfile.from_dict(json.loads(loaded.to_json()))
    assert again.digest == loaded.digest
    assert loaded.mesh_costs((2, 4)) == ((data["axes"][0]["alpha"], data["axes"][1]["alpha"]),
                                         (data["axes"][0]["beta"], data["axes"][1]["beta"]))
    with pytest.raises(OptionError, match="sizes \\[2, 4\\], not 8"):
        loaded.mesh_costs((8,))


def test_bad_profiles_are_option_errors(tmp_path):
    with pytest.raises(OptionError, match="alpa-pass profile --out"):
        ap.AutoShardingOption(profile=str(tmp_path / "missing.json"))
    bad = synthetic({1: 1e-9, 2: 1e-9, 4: 1e-9})
    del bad["compute"]
    with pytest.raises(OptionError, match="malformed"):
        ap.AutoShardingOption(profile=bad)
    with pytest.raises(OptionError, match="not an alpa_pass profile"):
        ap.AutoShardingOption(profile={"axes": []})
    with pytest.raises(OptionError, match="must be None, 'auto'"):
        ap.AutoShardingOption(profile=3)


def test_profile_sets_the_mesh_and_compute_costs_the_core_receives():
    mesh = ap.LogicalMesh(shape=(2, 4), alpha=(1.0, 1.0), beta=(1.0, 1.0))
    plain = ap.AutoShardingOption()
    assert plain.core_mesh(mesh).beta == [1.0, 1.0] and plain.to_core().compute_cost_per_flop == 1e-4
    option = ap.AutoShardingOption(profile=synthetic({1: 1e-8, 2: 5e-9, 4: 1e-7}, alpha=2e-5, flops=4e9))
    core = option.core_mesh(mesh)
    assert core.shape == [2, 4] and core.alpha == [2e-5, 2e-5] and core.beta == [1e-7, 1e-8]  # strides 4, 1
    opts = option.to_core()
    assert opts.compute_cost_per_flop == pytest.approx(1 / 4e9)
    assert opts.memory_cost_per_byte == pytest.approx(1e-9 * 1e-8)  # the tie-breaker x median beta
    assert option.core_mesh(ap.LogicalMesh(shape=(4, 2))).beta == [5e-9, 1e-8]  # (4, stride 2), (2, stride 1)


def test_a_one_device_profile_weighs_memory_by_its_measured_bandwidth(mlp_step):
    # the profile gpu_check.sh took of one H200 (no mesh axes): the memory tie-breaker is scaled by
    # a byte through memory (1 / 3.58 TB/s), not by 1 s/byte, so the objective is the step's compute
    # (before: GPT 1.3B "cost" 15.9 s for a 0.2 s step, the tie-breaker being nearly all of it)
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "report",
                        "profile_gpu-nvidia-h200-1dev-1x1.json")
    option = ap.AutoShardingOption(profile=path)
    with open(path) as f:
        data = json.load(f)
    assert data["axes"] == [] and data["cluster"]["num_devices"] == 1
    opts = option.to_core()
    assert opts.memory_cost_per_byte == pytest.approx(1e-9 / data["compute"]["memory_bytes_per_s"], rel=1e-9, abs=0)
    assert opts.compute_cost_per_flop == pytest.approx(1 / data["compute"]["matmul_flops_per_s"]["float32"], rel=1e-9, abs=0)
    step, params, batch = mlp_step
    plan = ap.parallelize(step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 1)),
                                                        option=option)).plan(params, batch)
    assert plan.predicted["communication"] == 0
    # the tie-breaker (peak bytes x memory_cost_per_byte) is a sliver of the objective
    assert plan.predicted["peak_bytes"] * opts.memory_cost_per_byte < 1e-3 * plan.objective
    del data["compute"]["memory_bytes_per_s"]  # an older profile without it: the 1.0 fallback stays
    assert cost_profile.ClusterProfile.from_dict(data).reference_beta == 1.0


def test_collectives_over_several_axes_cost_their_measured_group():
    """A collective over both axes of 2x4 is one collective over all 8 devices (stride 1), which
    the profile timed as a whole: its alpha and beta, not the larger per-axis ones. Only axes
    whose devices form one (size, stride) group get one: consecutive axes, axes of one device
    between them not counting (axes 0 and 2 of 2x2x2 stay with the larger per-axis costs)."""
    option = ap.AutoShardingOption(profile=synthetic({1: 1e-8, 2: 5e-9, 4: 1e-7}, alpha=2e-5))
    core, b = option.core_mesh(ap.LogicalMesh(shape=(2, 4))), 1000.0
    assert core.axes_costs == [([0, 1], 2e-5, 1e-8)]  # (8, stride 1)
    assert core.all_reduce(b, [0, 1]) == pytest.approx(2e-5 + 1e-8 * 2 * (7 / 8) * b)  # not beta 1e-7
    assert core.all_gather(b, [1, 0]) == pytest.approx(2e-5 + 1e-8 * (7 / 8) * b)
    assert core.all_reduce(b, [0]) == pytest.approx(2e-5 + 1e-7 * 2 * (1 / 2) * b)  # one axis: its own
    cube = option.core_mesh(ap.LogicalMesh(shape=(2, 2, 2)))
    assert cube.axes_costs == [([0, 1], 2e-5, 5e-9), ([0, 1, 2], 2e-5, 1e-8), ([1, 2], 2e-5, 1e-8)]
    assert cube.all_reduce(b, [0, 2]) == pytest.approx(2e-5 + 1e-7 * 2 * (3 / 4) * b)  # strides 4 and 1: max
    gap = option.core_mesh(ap.LogicalMesh(shape=(2, 1, 4)))
    assert gap.axes_costs == [([0, 2], 2e-5, 1e-8)]  # the axis of one device does not split the group
    assert ap.AutoShardingOption().core_mesh(ap.LogicalMesh(shape=(2, 4))).axes_costs == []


MLP = mlp.Config(num_layers=2, hidden=64, batch=32)


@pytest.fixture(scope="module")
def mlp_step():
    params, batch = mlp.init(jax.random.key(0), MLP), mlp.make_batch(jax.random.key(1), MLP)
    loss = mlp.make_loss_fn()

    def step(params, batch):
        value, grads = jax.value_and_grad(loss)(params, batch)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    return step, params, batch


def _plan(mlp_step, profile, **kw):
    step, params, batch = mlp_step
    option = ap.AutoShardingOption(profile=profile, **kw)
    method = ap.ShardParallel(mesh=ap.LogicalMesh(shape=(2, 4)), option=option)
    return ap.parallelize(step, method=method).plan(params, batch)


def _axes_used(plan) -> set:
    return {a for spec in plan.input_specs + plan.output_specs for entry in spec if entry is not None
            for a in ((entry,) if isinstance(entry, str) else entry)}


@pytest.mark.parametrize("slow", ["x", "y"])
def test_a_10x_slower_axis_is_not_split(mlp_step, slow):
    # x = (2 devices, stride 4), y = (4 devices, stride 1). Compute at 1 GFLOP/s makes splitting
    # the MLP's dots pay on an axis at 1e-8 s/B and not at 1e-7 s/B (heavy ops may run replicated).
    # A slow x (the link between devices 0-3 and 4-7) slows every group spanning both halves: all
    # 8 devices (8, stride 1) and (4, stride 2); a slow y (neighbours) every stride-1 group.
    fast, slow_beta = 1e-8, 1e-7
    betas = {1: slow_beta if slow == "y" else fast, 2: fast, 4: slow_beta if slow == "x" else fast}
    spanning = {(8, 1): slow_beta, (4, 2): slow_beta} if slow == "x" else {}
    plan = _plan(mlp_step, synthetic(betas, beta_by_axis=spanning), allow_replicated_heavy_ops=True)
    assert _axes_used(plan) == {"x", "y"} - {slow}
    # the objective is the plan's predicted seconds under the profile: far below the unit-cost one
    assert 1e-6 < plan.objective < 1e-2


def test_the_fingerprint_and_cache_key_follow_the_profile(mlp_step, tmp_path, monkeypatch, caplog):
    a, b = synthetic({1: 1e-8, 2: 1e-8, 4: 1e-8}), synthetic({1: 1e-8, 2: 1e-8, 4: 2e-8})
    plans = {name: _plan(mlp_step, p, plan_cache_dir=str(tmp_path / "plans"))
             for name, p in (("none", None), ("a", a), ("b", b))}
    prints = {name: p.fingerprint for name, p in plans.items()}
    assert len(set(prints.values())) == 3
    assert plans["a"].made_with["options"]["profile"].startswith("profile synthetic sha256:")
    assert plans["none"].made_with["options"]["profile"] is None
    assert len(list((tmp_path / "plans").glob("*.json"))) == 3  # one cache entry each
    assert _plan(mlp_step, a, plan_cache_dir=str(tmp_path / "plans")).origin == "cache"
    assert fingerprint("m", [], 1) != fingerprint("m", [], 1, profile=cost_profile.ClusterProfile.from_dict(a))
    # profile="auto", the default: the cached profile of this cluster, found by its key; none
    # there: unit costs (said once, at INFO); profile=None: unit costs whatever is cached
    monkeypatch.setenv("ALPA_PASS_PROFILE_DIR", str(tmp_path / "profiles"))
    assert ap.AutoShardingOption().profile == "auto"
    with caplog.at_level(logging.INFO, logger="alpa_pass"):
        assert _plan(mlp_step, "auto").fingerprint == prints["none"]
    assert "no cached profile of this cluster" in caplog.text
    path = cost_profile.cache_path(cost_profile.cluster_key(**cost_profile.current_cluster()))
    assert path == str(tmp_path / "profiles" / "cpu-cpu-8dev-1x8.json")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "cpu-cpu-8dev-1x8.json").write_text(cost_profile.ClusterProfile.from_dict(b).to_json())
    default = _plan(mlp_step, "auto")
    assert default.fingerprint == prints["b"] and default.objective == pytest.approx(plans["b"].objective)
    assert default.made_with["options"]["profile"] == plans["b"].made_with["options"]["profile"]
    assert _plan(mlp_step, None).fingerprint == prints["none"]
    # a plan saved under unit costs still applies once a profile is cached (one made with another
    # profile does not: its fingerprint names that profile)
    step, params, batch = mlp_step
    for saved, origin in ((plans["none"], "saved"), (plans["b"], "saved")):
        applied = ap.parallelize(step, method=ap.ShardParallel(plan=saved)).plan(params, batch)
        assert (applied.origin, applied.input_specs) == (origin, saved.input_specs)
    with pytest.raises(PlanMismatchError):
        ap.parallelize(step, method=ap.ShardParallel(plan=plans["a"])).plan(params, batch)


def test_the_processes_of_a_job_plan_with_process_0s_profile(monkeypatch):
    """profile="auto" in a multi-process job: every process gets process 0's cached profile (its
    JSON broadcast), whatever its own host holds, and none where process 0 has none, so that their
    plans cannot diverge over a cache one host lacks."""
    from alpa_pass.driver import request

    p0 = cost_profile.ClusterProfile.from_dict(synthetic({1: 1e-8, 2: 1e-8, 4: 1e-8}))
    mine = cost_profile.ClusterProfile.from_dict(synthetic({1: 1e-8, 2: 1e-8, 4: 2e-8}))
    sent = []

    def from_rank0(rank0: bytes):
        def broadcast(data):
            sent.append(data)
            return rank0
        return broadcast

    monkeypatch.setattr(request.jax, "process_count", lambda: 2)
    monkeypatch.setattr(request.jax, "process_index", lambda: 1)
    monkeypatch.setattr(request, "broadcast_bytes", from_rank0(p0.to_json().encode()))
    for local in (mine, None):
        got = request.agreed_profile(local)
        assert got is not None and got.digest == p0.digest
    monkeypatch.setattr(request, "broadcast_bytes", from_rank0(b""))  # process 0 holds none
    assert request.agreed_profile(mine) is None
    assert sent == [b"", b"", b""]  # a process other than 0 sends nothing
    monkeypatch.setattr(request.jax, "process_index", lambda: 0)
    monkeypatch.setattr(request, "broadcast_bytes", lambda data: sent.append(data) or data)
    assert request.agreed_profile(mine).digest == mine.digest and sent[-1] == mine.to_json().encode()
    monkeypatch.setattr(request.jax, "process_count", lambda: 1)
    assert request.agreed_profile(mine) is mine and len(sent) == 4  # one process: no collective


def test_cli_has_a_profile_command(capsys):
    from alpa_pass.launch import cli

    ns = cli.parser().parse_args(["profile", "--out", "p.json", "--sizes", "4096,65536", "--iters", "4"])
    assert (ns.command, ns.out, ns.sizes, ns.iters, ns.repeats) == ("profile", "p.json", "4096,65536", 4, 5)
    assert cli.parser().parse_args(["profile"]).out == "cache"


def test_mesh_search_compares_measured_costs(mlp_step):
    step, params, batch = mlp_step

    def search(profile):
        option = ap.AutoShardingOption(profile=profile, allow_replicated_heavy_ops=True)
        plan = ap.parallelize(step, method=ap.ShardParallel(mesh="auto", option=option)).plan(params, batch)
        return {"x".join(map(str, t["shape"])): t for t in plan.mesh_search}, plan

    # unit costs: 8x1 is 1x8 with its axes swapped, solved once; 4x2 is not 2x4 relabelled (a dim
    # split over both axes tiles with the other one major), solved too
    assert search(None)[0]["8x1"]["same_as"] == [1, 8] and "same_as" not in search(None)[0]["4x2"]
    # stride-1 axes 10x slower: 2x4 (its 4-axis has stride 1) and 4x2 (its 2-axis has) differ
    tried, plan = search(synthetic({1: 1e-7, 2: 1e-8, 4: 1e-8}))
    assert "same_as" not in tried["4x2"] and tried["4x2"]["objective"] != tried["2x4"]["objective"]
    assert plan.objective == min(t["objective"] for t in tried.values() if t["objective"] is not None)


def test_auto_stage_latencies_under_a_profile_are_seconds():
    # tests/integration/test_pipeshard.py's heavy-layer case, costed with a profile: 1 GFLOP/s, cheap links
    import jax.numpy as jnp

    from alpa_pass.pipeline.compile.pipeshard import micro_avals
    from alpa_pass.pipeline.partition import stage_search
    from alpa_pass.pipeline.partition.layers import manual_layers
    from alpa_pass.pipeline.trace.step import trace_step

    reps = (1, 4, 1, 1)  # layer 1 applies its kernel 4 times: 4x the FLOPs of the others
    loss_fn = make_heavy_layer_loss(reps)

    hidden, batch, micro = 64, 16384, 8
    params = [{"kernel": jax.ShapeDtypeStruct((hidden, hidden), jnp.float32)} for _ in reps]
    data = {"x": jax.ShapeDtypeStruct((batch, hidden), jnp.float32),
            "y": jax.ShapeDtypeStruct((batch, hidden), jnp.float32)}
    cluster = ap.LogicalMesh(shape=(1, 8))
    option = ap.AutoShardingOption(profile=synthetic({1: 1e-9, 2: 1e-9, 4: 1e-9}, alpha=1e-5, flops=1e9))
    method = ap.PipeshardParallel(mesh=cluster, num_micro_batches=micro, option=option,
                                  stage_option=ap.AutoStageOption(submesh_logical_shapes="same"))
    traced = trace_step(lambda p, b: ap.grad(loss_fn)(p, b), (params, data), (1,),
                        lambda a, m: micro_avals(a, m, micro, "step"))
    costs = {}
    real = stage_search.stage_cost

    def recording(traced, program, mesh, method):
        cost = real(traced, program, mesh, method)
        costs.setdefault(mesh.num_devices, []).append(cost)
        return cost

    stage_search.stage_cost = recording
    try:
        auto = stage_search.auto_stages(traced, manual_layers(traced.loss), cluster, method)
    finally:
        stage_search.stage_cost = real
    # the whole step on one device: 20 dots (layer 0: forward + weight gradient, layer 1: 4 x 3,
    # layers 2-3: 3 each) of 2 x (batch / micro) x hidden^2 FLOPs at 1e9 FLOP/s (+ a few % elementwise)
    dots = 20 * 2 * (batch // micro) * hidden * hidden / 1e9
    assert max(costs[1]) == pytest.approx(dots, rel=0.05)
    assert max(costs[8]) == pytest.approx(max(costs[1]) / 8, rel=0.05)  # data parallel, links nearly free
    assert len(auto) == 1 and auto[0].mesh.num_devices == 8  # so one 8-device stage beats any pipeline


def _moe_step(S: int = 256, D: int = 32, E: int = 8, K: int = 2, F: int = 64):
    """A GShard-style top-2 mixture of experts with capacity C: one-hot (S, K, E, C) dispatch and
    combine tensors built through a cumsum over the tokens (which no device can split)."""
    C = int(1.25 * S * K / E)

    def moe(params, x):
        gate, idx = jax.lax.top_k(jax.nn.softmax(x @ params["router"], -1), K)
        mask = jax.nn.one_hot(idx, E)
        pos = jax.numpy.cumsum(mask.reshape(S * K, E), axis=0).reshape(S, K, E) * mask - 1
        keep = (pos < C) & (mask > 0)
        disp = jax.nn.one_hot(jax.numpy.where(keep, pos, -1).astype(np.int32), C) * keep[..., None]
        dispatch, combine = disp.sum(1), (disp * gate[..., None, None]).sum(1)
        h = jax.nn.gelu(jax.numpy.einsum("ecd,edf->ecf", jax.numpy.einsum("sec,sd->ecd", dispatch, x), params["w1"]))
        return jax.numpy.einsum("sec,ecd->sd", combine, jax.numpy.einsum("ecf,efd->ecd", h, params["w2"]))

    def step(params, x, y):
        loss, grads = jax.value_and_grad(lambda p: jax.numpy.mean((moe(p, x) - y) ** 2))(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

    k = jax.random.split(jax.random.key(0), 5)
    params = {"router": jax.random.normal(k[0], (D, E)), "w1": jax.random.normal(k[1], (E, D, F)) / 6,
              "w2": jax.random.normal(k[2], (E, F, D)) / 8}
    return step, (params, jax.random.normal(k[3], (S, D)), jax.random.normal(k[4], (S, D))), (S, K, E, C)


def test_a_cached_profile_is_what_default_plans_use_and_it_splits_the_experts_dispatch(tmp_path, monkeypatch):
    """With this machine's profile cached (the committed CPU one), AutoShardingOption() plans in
    seconds: the (tokens, k, experts, capacity) one-hot dispatch chain, which unit costs (compute
    a tie-breaker) leave whole on every device, is split over the experts as the expert weights
    are, and the step still computes what jax.jit does."""
    monkeypatch.setenv("ALPA_PASS_PROFILE_DIR", str(tmp_path))
    src = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "report", "profile_cpu-cpu-8dev-1x8.json")
    (tmp_path / "cpu-cpu-8dev-1x8.json").write_text(open(src).read())
    step, args, (S, K, E, C) = _moe_step()
    fn = ap.parallelize(step, method=ap.ShardParallel(mesh=ap.LogicalMesh(shape=(1, 8))))
    plan = fn.plan(*args)
    assert plan.made_with["options"]["profile"].startswith("profile cpu-cpu-8dev-1x8 sha256:")
    assert plan.objective < 1.0  # seconds
    chain = [c for c in plan.choices if c.shape in ((S, K, E, C), (S, E, C))]
    assert len(chain) >= 6
    assert all(tuple(c.spec)[c.shape.index(E)] == "y" for c in chain), [(c.label, c.spec) for c in chain]
    experts = jax.sharding.PartitionSpec("y", None, None)
    assert plan.input_specs[1:3] == [experts, experts]  # w1, w2 (after "router"): expert parallel
    (new, loss), (ref_new, ref_loss) = fn(*args), jax.jit(step)(*args)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(ref_new)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
