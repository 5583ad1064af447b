"""The hand-written baselines of benchmarks/ (dp, ZeRO-2, ZeRO-3, Megatron) on the small GPT and
8 CPU devices: same loss as single-device jit, and the collectives each method implies."""
import math

import jax
import numpy as np
import pytest

from benchmarks import baselines
from benchmarks.models import gpt_sizes
from tests import helpers
from zoo import default_optimizer, gpt, init_state, train_step_for

CONFIG = gpt.Config(vocab=64, seq=16, hidden=32, heads=4, layers=2, batch=8)
MESH_SHAPE, AXES = (2, 4), ("x", "y")


@pytest.fixture(scope="module")
def setup():
    optimizer = default_optimizer()
    state = init_state(gpt.init(jax.random.key(0), CONFIG), optimizer)
    batch = gpt.make_batch(jax.random.key(1), CONFIG)
    loss_fn = gpt.make_loss_fn(CONFIG.heads)
    reference = float(jax.jit(train_step_for(loss_fn, optimizer))(state, batch)[1])
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(MESH_SHAPE), AXES)
    return optimizer, state, batch, loss_fn, reference, mesh


_RUNS = {}


def _compile_and_run(method, setup):
    """(baseline, hlo text, new state, loss) of one method, compiled once per test session."""
    if method not in _RUNS:
        _RUNS[method] = _build(method, setup)
    return _RUNS[method]


def _build(method, setup):
    optimizer, state, batch, loss_fn, reference, mesh = setup
    base = baselines.make_baseline(method, state, batch, AXES, MESH_SHAPE, gpt_sizes.megatron_dim)
    jitted = baselines.jit_baseline(baselines.make_train_step(loss_fn, optimizer, base, mesh), base, mesh)
    compiled = jitted.lower(state, batch).compile()
    (new_state, loss) = compiled(jax.tree.map(lambda x: x.copy(), state), batch)
    return base, compiled.as_text(), new_state, float(loss)


@pytest.mark.parametrize("method", ["dp", "zero2", "zero3", "megatron"])
def test_baseline_loss_matches_single_device(method, setup):
    reference = setup[4]
    base, _, new_state, loss = _compile_and_run(method, setup)
    assert loss == pytest.approx(reference, rel=1e-5, abs=1e-6)
    shardings = jax.tree.leaves(jax.tree.map(lambda x: x.sharding.spec, new_state[0]),
                                is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    assert shardings == baselines._leaves(base.state_specs[0])  # outputs keep the baseline's layout


def test_dp_all_reduces_gradients_only(setup):
    params = setup[1][0]
    _, hlo, _, _ = _compile_and_run("dp", setup)
    ar = [c for c in helpers.collectives(hlo) if c.kind == "all-reduce"]
    param_bytes = sum(4 * math.prod(x.shape) for x in jax.tree.leaves(params))
    assert sum(c.bytes for c in ar) >= param_bytes  # every gradient is all-reduced
    assert all(c.group_size in (None, 8) for c in ar)
    counts = helpers.count(hlo)
    assert counts["all-gather"] == counts["all-to-all"] == counts["collective-permute"] == 0


def test_megatron_all_reduces_activations_over_tp(setup):
    _, hlo, _, _ = _compile_and_run("megatron", setup)
    local_act = (CONFIG.batch // MESH_SHAPE[0], CONFIG.seq, CONFIG.hidden)
    act = [c for c in helpers.collectives(hlo) if c.kind == "all-reduce" and local_act in c.shapes]
    # forward: attention out + MLP out per layer; backward: the same for the input gradients
    assert len(act) >= 2 * CONFIG.layers
    assert all(c.group_size == MESH_SHAPE[1] for c in act)


def test_zero3_gathers_sharded_parameters(setup):
    base, hlo, _, _ = _compile_and_run("zero3", setup)
    sharded = [s for s in baselines._leaves(base.state_specs[0]) if any(e is not None for e in s)]
    assert len(sharded) > 0
    assert helpers.count(hlo)["all-gather"] >= len(sharded)


# --- model FLOPs, device peaks and the GPU figures (benchmarks/flops.py, benchmarks/gpu.py) ---

def _xla_forward_flops(model, config, loss_fn) -> float:
    """XLA's FLOP count of the unoptimised forward (abstract inputs: nothing is computed)."""
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), config))
    batch = jax.eval_shape(lambda: model.make_batch(jax.random.key(1), config))
    return jax.jit(loss_fn).lower(params, batch).cost_analysis()["flops"]


def test_gpt_flops_match_megatron_formula_and_xla():
    from benchmarks import flops

    c = gpt.Config(vocab=256, seq=32, hidden=128, heads=4, layers=2, batch=4)
    b, s, h, L, V = c.batch, c.seq, c.hidden, c.layers, c.vocab
    megatron = 72 * b * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))  # Narayanan et al. 2021, eq. 3
    assert flops.step_flops("gpt", c) == pytest.approx(megatron, rel=1e-12)
    assert flops.step_flops("gpt", c) == 3 * flops.gpt_forward_flops(c)
    xla = _xla_forward_flops(gpt, c, gpt.make_loss_fn(c.heads))
    assert xla == pytest.approx(flops.gpt_forward_flops(c), rel=0.05)  # XLA adds the elementwise work
    alpa_13b = gpt_sizes.SIZES["1.3B"]
    assert flops.step_flops("gpt", alpa_13b) / 1e12 == pytest.approx(555.8, rel=1e-3)


def test_moe_flops_count_top2_experts_and_gate():
    from benchmarks import flops
    from benchmarks.models import moe_transformer as moe

    c = moe.Config(vocab=256, seq=32, hidden=128, heads=4, layers=4, experts=8, group_size=32, batch=4)
    dense = flops.gpt_forward_flops(c.gpt_config())
    tokens, h = c.batch * c.seq, c.hidden
    extra_per_moe_block = tokens * (16 * h * h + 2 * h * c.experts)  # a 2nd expert FFN + the gate
    assert flops.moe_forward_flops(c) == pytest.approx(dense + c.layers * extra_per_moe_block, rel=1e-12)
    every_other = moe.Config(**{**c.__dict__, "moe_every": 2})
    assert flops.moe_forward_flops(every_other) == pytest.approx(dense + 2 * extra_per_moe_block, rel=1e-12)


def test_wresnet_flops_match_xla_convolutions():
    from benchmarks import flops
    from benchmarks.models import wide_resnet as wr

    c = wr.Config(image=32, layers=10, channels=16, width=2, classes=10, batch=2)
    xla = _xla_forward_flops(wr, c, wr.make_loss_fn(c))
    ours = flops.wresnet_forward_flops(c)
    # ours counts every tap of a padded 3x3 window (the MFU convention); XLA skips the padding,
    # which on these 2x2..16x16 feature maps is ~8% of the taps
    assert 0.88 * ours < xla < ours
    assert flops.step_flops("wresnet", c) == 3 * ours
    with pytest.raises(ValueError, match="unknown suite 'bert'"):
        flops.step_flops("bert", c)


def test_peak_table_and_mfu():
    from benchmarks import flops

    assert flops.peak_tflops("NVIDIA A100-SXM4-80GB") == 156.0
    assert flops.peak_tflops("NVIDIA A10") == 62.5  # not A100's
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert flops.peak_tflops("cpu") is None
    f = flops.throughput_figures(2e15, 0.5, 8, 500.0, samples=64, tokens=64 * 1024)
    assert f == {"samples_per_s": 128.0, "tokens_per_s": 131072.0, "model_tflops_per_device": 500.0, "mfu": 1.0}
    assert flops.throughput_figures(1e12, 1.0, 1, None, samples=1)["mfu"] is None
    with pytest.raises(ValueError):
        flops.throughput_figures(1e12, 0.0, 1, None, samples=1)


def test_gpu_throughput_of_a_case():
    from benchmarks import flops, gpu

    c = gpt_sizes.SIZES["small"]
    result = {"methods": {"auto": {"timing": {"median_s": 0.01}, "flops": 3e9},
                          "dp": {"timing": {"median_s": 0.02}, "flops": None}, "zero3": {}}}
    out = gpu.throughput(result, "gpt", c, "NVIDIA H200", 8)
    per_step = flops.step_flops("gpt", c)
    assert out["peak_tflops"] == 494.7 and out["model_flops_per_step"] == per_step
    assert set(out["methods"]) == {"auto", "dp"}  # zero3 did not run
    auto = out["methods"]["auto"]
    assert auto["model_tflops_per_device"] == pytest.approx(per_step / 0.01 / 8 / 1e12)
    assert auto["mfu"] == pytest.approx(auto["model_tflops_per_device"] / 494.7)
    assert auto["tokens_per_s"] == pytest.approx(c.batch * c.seq / 0.01)
    assert auto["xla_tflops_per_device"] == pytest.approx(0.3)
    assert "xla_tflops_per_device" not in out["methods"]["dp"]


def test_run_suite_gpu_skips_cleanly_without_gpu(capsys):
    from benchmarks import run_suite

    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("a GPU is present")
    assert run_suite.main(["gpt", "--gpu"]) == 0
    assert capsys.readouterr().out.strip() == "skipped: no GPU"


def test_run_suite_sizes():
    from benchmarks import run_suite

    assert run_suite.expand_sizes(gpt_sizes.SIZES, "large") == ["350M", "760M", "1.3B", "2.6B", "6.7B", "15B", "39B"]
    assert run_suite.expand_sizes(gpt_sizes.SIZES, "1.3B, 2.6B") == ["1.3B", "2.6B"]
    with pytest.raises(ValueError, match="unknown size '3B'"):
        run_suite.expand_sizes(gpt_sizes.SIZES, "3B")


def test_expert_baseline_splits_experts_over_the_axes_that_divide_them():
    from benchmarks.models import moe_transformer as moe

    c = moe.Config(experts=8, batch=64)
    state = jax.eval_shape(lambda: init_state(moe.init(jax.random.key(0), c), default_optimizer()))
    batch = jax.eval_shape(lambda: moe.make_batch(jax.random.key(1), c))
    w1 = lambda base: base.state_specs[0]["blocks"][0]["moe"]["w1"]  # noqa: E731
    on_8 = baselines.make_baseline("expert", state, batch, AXES, MESH_SHAPE, moe.expert_dim)
    assert w1(on_8) == jax.sharding.PartitionSpec(("x", "y"))  # 8 experts on 2x4: all devices
    on_64 = baselines.make_baseline("expert", state, batch, AXES, (8, 8), moe.expert_dim)
    assert w1(on_64) == jax.sharding.PartitionSpec("x")  # 8 experts on 8x8: "x" only
    assert on_64.state_specs[0]["wte"] == jax.sharding.PartitionSpec()


def test_a_baseline_over_the_memory_budget_is_not_compared_with_auto(setup):
    """``run_suite --budget``: the cost model pins a baseline's layouts and solves without the
    memory rows; when that plan peaks over the budget the baseline gets no objective (a 39B case
    flagged auto as worse than a DP plan that needs 581 GiB per device) and its status says whether
    any plan with those layouts could fit (``least_peak``, a lower bound: with nothing pinned, the
    core's ``memory_row_lower_bound``)."""
    import alpa_pass as ap
    from benchmarks import cases, summary
    from benchmarks.cost_model import CostModel

    optimizer, state, batch, loss_fn, _, _ = setup
    fn, mesh = train_step_for(loss_fn, optimizer), ap.LogicalMesh(shape=MESH_SHAPE)
    dp = baselines.flat_specs(baselines.make_baseline("dp", state, batch, AXES, MESH_SHAPE, gpt_sizes.megatron_dim))
    free = CostModel(fn, (state, batch), mesh, ap.AutoShardingOption())
    unbudgeted = free.pinned(dp)
    dp_peak, free_peak = unbudgeted.predicted["peak_bytes"], free.free().predicted["peak_bytes"]
    assert math.isfinite(unbudgeted.objective) and free_peak < 0.75 * dp_peak
    between = CostModel(fn, (state, batch), mesh, ap.AutoShardingOption(memory_budget_per_device=int(0.82 * dp_peak)))
    upper = np.array(between.problem.ilp.col_upper, dtype=np.float64)
    least = between.least_peak(upper)
    assert least == pytest.approx(between.problem.memory_row_lower_bound(), rel=1e-12) and 0 < least < free_peak
    over = between.pinned(dp)
    assert over.objective == math.inf and summary.over_budget({"status": over.status})
    assert "might fit" in over.status and over.predicted["peak_bytes"] == dp_peak
    tight = CostModel(fn, (state, batch), mesh, ap.AutoShardingOption(memory_budget_per_device=int(1.1 * least)))
    assert "no plan with these layouts fits" in tight.pinned(dp).status  # DP's replicated state alone
    methods = {"auto": {"objective": 1.0}, "dp": {"baseline": baselines.make_baseline(
        "dp", state, batch, AXES, MESH_SHAPE, gpt_sizes.megatron_dim)}}
    entry = cases.evaluate_baselines(fn, (state, batch), mesh, between.option, methods)["baselines"]["dp"]
    assert entry["objective"] is None and entry["auto_not_worse"] is None and summary.over_budget(entry)
