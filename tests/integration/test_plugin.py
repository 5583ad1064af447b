"""``JAX_PLUGINS=alpa_pass``: unchanged scripts, run in subprocesses on 8 CPU devices."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
HEAVY = ["alpa_pass._core", "alpa_pass.emit.constraints", "alpa_pass.extract.stablehlo",
         "alpa_pass.driver.planning", "highspy"]


def _env(**extra):
    return helpers.child_env(("ALPA_PASS_", "JAX_PLUGINS"), XLA_FLAGS="--xla_force_host_platform_device_count=8",
                             JAX_PLATFORMS="cpu", **extra)


# A run's time limit only catches a hang: a zoo script takes ~30-60 s on 2 idle cores, and more
# than 120 s on a loaded machine (a diffrax ODE and a UNet did, with the tests' two workers).
RUN_TIMEOUT = 400


def _run(script: str, **env):
    """Run tests/scripts/<script> through run_script.py; (script's JSON, run report, stderr)."""
    proc = subprocess.run([sys.executable, str(SCRIPTS / "run_script.py"), str(SCRIPTS / script)],
                          env=_env(**env), capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("ALPA_PASS_RUN "), proc.stdout
    return json.loads(lines[-2]), json.loads(lines[-1][len("ALPA_PASS_RUN "):]), proc.stderr


@pytest.fixture(scope="module")
def plain_run():
    return _run("train_mlp.py")


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory):
    report = tmp_path_factory.mktemp("report")
    return (*_run("train_mlp.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_REPORT=str(report),
                  ALPA_PASS_LOG="info"), report)


def test_plugin_off_changes_nothing(plain_run):
    out, run, _ = plain_run
    assert run["plugin"] == {"enabled": False, "planned": 0, "reused": 0, "passed": 0, "failed": 0}
    assert run["heavy_modules"] == []
    assert [p["devices"] for p in out["params"]] == [1] * 8
    assert run["compiles"]["train_step"] == 1


def test_plugin_plans_train_step_once_and_matches_losses(plain_run, plugin_run):
    plain, _, _ = plain_run
    out, run, stderr, _ = plugin_run
    assert run["plugin"]["planned"] == 1 and run["plugin"]["failed"] == 0
    assert run["plugin"]["reused"] == 1             # step 2 feeds sharded outputs back: same executable
    assert run["compiles"]["train_step"] == 1       # 5 steps, one XLA compilation
    assert "planned train_step on mesh 1x8" in stderr
    assert "8 simulated CPU devices: XLA_FLAGS += --xla_cpu_enable_concurrency_optimized_scheduler=false" in stderr
    assert len(out["losses"]) == 5
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_plugin_shards_parameters_over_all_devices(plugin_run):
    out, _, _, _ = plugin_run
    assert out["num_devices"] == 8
    assert all(p["devices"] == 8 for p in out["params"])
    kernels = [p["spec"] for p in out["params"][1::2]]  # leaves: bias, kernel per layer
    assert any("'y'" in s for s in kernels), kernels     # weights are split, not just replicated


@pytest.mark.slow
def test_unchanged_flax_script_matches_and_is_sharded():
    """The issue's acceptance: an unchanged flax + optax script gives the same losses with and
    without JAX_PLUGINS=alpa_pass, and with it its parameters end up on all 8 devices."""
    plain, plain_run_info, _ = _run("train_flax.py")
    out, run, _ = _run("train_flax.py", JAX_PLUGINS="alpa_pass")
    assert plain_run_info["plugin"]["planned"] == 0
    assert run["plugin"]["planned"] == 1 and run["plugin"]["failed"] == 0
    assert run["compiles"]["train_step"] == 1
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert all(p["devices"] == 8 for p in out["params"])
    kernels = [p["spec"] for p in out["params"] if "kernel" in p["path"]]
    assert len(kernels) == 4 and any("'y'" in s for s in kernels), kernels


@pytest.mark.parametrize("method", ["data", "zero2", "zero3"])
def test_preset_methods_for_plain_jit(plain_run, method):
    """ALPA_PASS_METHOD=data keeps the state (arguments the step returns) replicated and splits the
    batch; zero2 keeps the parameters (found from the loss) replicated and shards the optimizer
    state; zero3 splits every 2-D parameter over all 8 devices. Same losses either way."""
    out, run, _ = _run("train_mlp.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_METHOD=method)
    assert run["plugin"]["planned"] == 1 and run["plugin"]["failed"] == 0
    for a, b in zip(out["losses"], plain_run[0]["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    kernels = [p["spec"] for p in out["params"][1::2]]  # leaves: bias, kernel per layer
    if method in ("data", "zero2"):
        # replicated: no mesh axis named in any parameter's spec
        assert not any("'x'" in p["spec"] or "'y'" in p["spec"] for p in out["params"]), out["params"]
    else:
        assert all("('x', 'y')" in s or "'y'" in s for s in kernels), kernels


@pytest.mark.slow
def test_auto_mesh_budget_and_plan_cache(plain_run, tmp_path):
    """ALPA_PASS_MESH=auto searches the shapes of 8 devices under ALPA_PASS_MEMORY_BUDGET; with
    ALPA_PASS_CACHE a second run of the unchanged script reads the plan instead of solving."""
    env = dict(JAX_PLUGINS="alpa_pass", ALPA_PASS_MESH="auto", ALPA_PASS_MEMORY_BUDGET="64MiB",
               ALPA_PASS_CACHE=str(tmp_path / "cache"))
    figures = []
    for k in range(2):
        report = tmp_path / f"report{k}"
        out, run, _ = _run("train_mlp.py", ALPA_PASS_REPORT=str(report), **env)
        assert run["plugin"]["planned"] == 1 and run["plugin"]["failed"] == 0
        for a, b in zip(out["losses"], plain_run[0]["losses"]):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
        (path,) = report.glob("*.json")
        figures.append(json.loads(path.read_text()))
    first, second = figures
    assert first["origin"] == "solver" and second["origin"] == "cache"
    shapes = [tuple(e["shape"]) for e in first["mesh_search"]]
    assert {(1, 8), (2, 4), (4, 2), (8, 1), (2, 2, 2)} <= set(shapes)
    best = min(e["objective"] for e in first["mesh_search"] if e["objective"] is not None)
    assert first["objective"] == pytest.approx(best)
    assert first["predicted"]["peak_bytes"] <= 64 * 2**20
    assert second["input_specs"] == first["input_specs"] and second["mesh"] == first["mesh"]


def test_report_has_summary_and_json(plugin_run):
    _, _, _, report = plugin_run
    texts, jsons = sorted(report.glob("*.txt")), sorted(report.glob("*.json"))
    assert len(texts) == len(jsons) == 1
    assert "alpa_pass plan" in texts[0].read_text()
    figures = json.loads(jsons[0].read_text())
    assert figures["computation"] == "train_step" and figures["mesh"] == [1, 8]
    assert len(figures["input_specs"]) == 8 + 17 + 2 and len(figures["output_specs"]) == 8 + 17 + 1
    assert figures["objective"] > 0 and figures["ilp_size"]["columns"] > 0
    assert {"extract", "build", "solve", "emit"} <= set(figures["timings"])


def test_user_in_shardings_left_alone():
    plain, _, _ = _run("user_shardings.py")
    out, run, _ = _run("user_shardings.py", JAX_PLUGINS="alpa_pass")
    assert run["plugin"]["enabled"] and run["plugin"]["planned"] == 0
    assert run["heavy_modules"] == []
    assert out == plain   # same spec, devices and bitwise-equal loss


@pytest.mark.parametrize("script", ["user_placed.py", "nnx_spmd_guide.py"])
def test_arrays_the_user_placed_keep_their_blocks_and_the_step_around_them_is_planned(script):
    """tests/scripts/user_placed.py puts parameters (Megatron column/row splits) and each batch on
    its own 2x4 mesh with ``jax.device_put``; nnx_spmd_guide.py is flax NNX's guide (parameters
    sharded by their metadata in a jitted init under ``jax.set_mesh``). Both then jit a plain step:
    it is planned on that mesh's shape (no ALPA_PASS_MESH) with those arrays read as they are; it
    ran untouched before ("arguments committed to shardings of the user's"). Every parameter ends
    on the same devices' blocks as under plain jit, the losses are plain jit's, one compile."""
    plain, _, _ = _run(script)
    out, run, err = _run(script, JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert run["plugin"]["planned"] == 1 and run["plugin"]["failed"] == 0, err[-2000:]
    assert "planned train_step on mesh 2x4" in err
    assert run["compiles"]["train_step"] == 1  # (plain jit compiles user_placed's step twice)
    assert out["blocks"] == plain["blocks"]
    weights = [leaf for leaf in out["blocks"].values() if len(leaf["0"]) == 2]
    assert weights and all(len({str(b) for b in leaf.values()}) > 1 for leaf in weights)  # split, as given
    np.testing.assert_allclose(out["losses"], plain["losses"], rtol=1e-5, atol=1e-6)


def test_aot_calls_user_meshes_and_explicit_axes_after_a_planned_init():
    """A jitted init is planned; then (1) an AOT-compiled step, planned from shapes, is called with
    the init's outputs and a frozen argument left in the init's layout (its call refused them:
    "compiled for input shardings that disagree"; resharded on the fast path, a crash); (2) the
    user's own 2x4 mesh named ('x', 'y'), like ours, with ``jit(in_shardings=...)`` (taken for
    ours, replanned, then refused by jit); (3) Explicit-axes arrays outside ``jax.set_mesh``
    (crashed lowering our probe); (4) the init's outputs straight into a jit given in_shardings and
    into ``pmap(in_axes=None)`` ("Sharding passed to jit does not match": ours are committed,
    plain jit's move freely); (5) the same array donated twice, a user bug that XLA reports on one
    device and crashes on on a mesh. Each must run (or fail) as plain jit does."""
    plain, _, _ = _run("aot_and_user_meshes.py")
    for mesh in ("2x4", "1x8"):
        out, run, err = _run("aot_and_user_meshes.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_MESH=mesh,
                             ALPA_PASS_LOG="debug")
        assert run["plugin"]["planned"] == 2 and run["plugin"]["failed"] == 0, err[-2000:]  # init, AOT step
        assert "step runs untouched (user in_shardings)" in err
        assert "runs untouched (arguments typed on the user's mesh (explicit sharding))" in err
        assert out["user_specs"] == plain["user_specs"] == ["P(None, 'y')", "P('y',)"]
        assert out["explicit"] == plain["explicit"]
        for key in ("aot", "user_mesh", "given", "pmap"):
            np.testing.assert_allclose(out[key], plain[key], rtol=1e-5)
        assert run["compiles"]["step"] == 2  # the AOT step and the user's, as plain jit
        assert out["donated_twice"] == plain["donated_twice"] == ["JaxRuntimeError"] * 2  # not a crash


def test_bad_mesh_is_a_clear_error():
    proc = subprocess.run([sys.executable, str(SCRIPTS / "train_mlp.py")], capture_output=True,
                          text=True, timeout=120, env=_env(JAX_PLUGINS="alpa_pass", ALPA_PASS_MESH="2x3"))
    assert proc.returncode != 0
    assert "PluginConfigError: ALPA_PASS_MESH=2x3 has 6 positions but there are 8 devices" in proc.stderr


def test_bad_syntax_is_a_clear_error():
    proc = subprocess.run([sys.executable, str(SCRIPTS / "train_mlp.py")], capture_output=True,
                          text=True, timeout=120, env=_env(JAX_PLUGINS="alpa_pass", ALPA_PASS_MESH="2x"))
    assert proc.returncode != 0
    assert "PluginConfigError: ALPA_PASS_MESH='2x' is not a mesh shape" in proc.stderr


def test_entry_point_import_is_light():
    """Importing the entry point and initialize() (JAX_PLUGINS set) import no C++ core, highspy,
    MLIR-walking module or rich (jaxlib.mlir itself comes with ``import jax``)."""
    code = ("import sys, jax, alpa_pass.plugin as p; p.initialize(); "
            f"print(sorted(m for m in {HEAVY + ['rich']!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=_env(JAX_PLUGINS="alpa_pass"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_unsupported_jax_warns_once_and_runs_plain():
    code = ("import warnings, alpa_pass._compat as c; c.SUPPORTED = ((99, 0, 0), (100, 0, 0)); "
            "import jax, alpa_pass.plugin as p; "
            "x = jax.numpy.ones(3) + 1; print(p.stats()['enabled'], float(x.sum()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=_env(JAX_PLUGINS="alpa_pass"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "6.0"]
    assert proc.stderr.count("is not supported (need >=99.0.0,<100.0.0); running as plain JAX") == 1


def test_plugin_and_api_make_the_same_plan():
    """One planning path: the same donated training step planned by the plugin (plain jax.jit,
    ALPA_PASS_MESH=2x4, ALPA_PASS_REDUCE_SCATTER=1) and by ap.parallelize (ShardParallel on 2x4,
    prefer_reduce_scatter=True) gets the same objective, the same spec for every input and output,
    the same predicted peak (donation honoured by both) and the same reduce-scatter rewrites. (The
    two traces of optax's bias correction differ in one scalar convert, which jax's trace cache
    leaves in one of them: the objectives agree to the solver's relative gap, 1e-4.)"""
    out, run, _ = _run("plugin_vs_api.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_MESH="2x4",
                       ALPA_PASS_MIN_BYTES="0", ALPA_PASS_REDUCE_SCATTER="1")
    plugin, api = out["plugin"], out["api"]
    assert plugin["objective"] == pytest.approx(api["objective"], rel=1e-4)
    assert plugin["input_specs"] == api["input_specs"] and len(api["input_specs"]) == 21
    assert plugin["output_specs"] == api["output_specs"] and len(api["output_specs"]) == 20
    assert plugin["peak_bytes"] == api["peak_bytes"] > 0
    assert plugin["reduce_scattered"] == api["reduce_scattered"] > 0
    assert out["losses"][0] == pytest.approx(out["losses"][1], rel=1e-6)


def test_plugin_and_api_peel_a_scanned_layer_stack_alike():
    """The same step with its layers one lax.scan over stacked params: the plugin lowers it with the
    layer stack's boundary iterations peeled as ap.parallelize does (``trace.scan_peel``): the
    same objective, specs and ILP, which peeling changes (the API's ILP with it off has fewer
    columns: the peeled iteration is one more copy of the backward body; the objective may be the
    same); ``ALPA_PASS_PEEL_SCANS=0`` gives the plugin the API's unpeeled plan."""
    env = dict(JAX_PLUGINS="alpa_pass", ALPA_PASS_MESH="2x4", ALPA_PASS_MIN_BYTES="0",
               ALPA_PASS_REDUCE_SCATTER="1", PLUGIN_VS_API_SCAN="1")
    out, _, _ = _run("plugin_vs_api.py", **env)
    plugin, api = out["plugin"], out["api"]
    assert plugin["objective"] == pytest.approx(api["objective"], rel=1e-4)
    assert plugin["ilp_columns"] == api["ilp_columns"] > out["api_unpeeled_columns"]
    assert plugin["input_specs"] == api["input_specs"] and plugin["output_specs"] == api["output_specs"]
    assert out["losses"][0] == pytest.approx(out["losses"][1], rel=1e-6)
    off, _, _ = _run("plugin_vs_api.py", **env, ALPA_PASS_PEEL_SCANS="0")
    assert off["plugin"]["objective"] == pytest.approx(out["api_unpeeled_objective"], rel=1e-4)
    assert off["plugin"]["ilp_columns"] < plugin["ilp_columns"]
    assert off["losses"][0] == pytest.approx(off["losses"][1], rel=1e-6)


@pytest.mark.slow
def test_typed_prng_key_step_is_planned_once():
    """A step that takes and returns a typed PRNG key (``jax.random.key``; dropout inside): planned
    (not "the module changed between extraction and emission"), compiled once, the key keeps its
    type and value, same losses as without the plugin."""
    plain, _, _ = _run("train_dropout_key.py")
    out, run, _ = _run("train_dropout_key.py", JAX_PLUGINS="alpa_pass")
    assert run["plugin"]["planned"] == 1 and run["plugin"]["failed"] == 0 and run["plugin"]["reused"] >= 1
    assert run["compiles"]["train_step"] == 1
    assert out["key_dtype"] == plain["key_dtype"] == "key<fry>" and out["key_data"] == plain["key_data"]
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert all(p["devices"] == 8 for p in out["params"])


@pytest.mark.parametrize("script", ["train_nnx.py", "train_haiku.py", "train_scan_loop.py", *(pytest.param(s, marks=pytest.mark.slow) for s in (
    "train_linen_jit_init.py", "train_equinox.py", "train_multisteps.py", "train_keras_stateless.py",
    "train_muon.py", "train_equinox_bn.py", "train_diffrax_ode.py", "train_unet_diffusion.py", "train_pinn.py",
    "train_flax_moe.py", "train_t5x_logical.py"))])
def test_library_training_loops_plan_the_step(script, tmp_path):
    """The model zoo, each script written with a library's own layers and training utilities:
    flax NNX (nnx.jit, nnx.Optimizer, Rngs, Dropout, BatchNorm); Haiku (transform_with_state,
    MultiHeadAttention, BatchNorm state, dropout keys from PRNGSequence); flax linen with a jitted
    TrainState init (lm1b style: the init's outputs arrive committed to the init's plan, which
    alpa_pass owns and reshards on entry); Equinox (filter_jit, typed keys, Dropout); Keras 3
    ``model.fit`` over 3 epochs (its step re-lowered with renumbered, re-ordered helpers); optax
    ``MultiSteps`` gradient accumulation (the update under a ``lax.cond``); Keras 3's custom JAX
    loop (``stateless_call`` / ``stateless_apply`` in a ``jax.jit``); optax's Muon (Newton-Schulz
    iterations on each update); Equinox with ``BatchNorm`` state (``make_with_state``); the whole
    training loop in one jit, a ``lax.scan`` over steps (its program one equation: it was taken
    for an eager op and ran untouched); a diffrax neural ODE (adaptive-step while loops and
    checkpointed adjoint loops; traced again under the mesh, jax adds identity reshapes that made
    a second plan and compile: ``_compat.fold_retraced_mesh_ops``); a diffusion UNet (convolutions,
    transposed convolutions, GroupNorm, an EMA of the parameters in the state); a physics-informed
    network (``jax.hessian`` of the model in its loss: traced again under the mesh, jacrev's rows
    gained identity ``convert_element_type``s that made a second plan and compile, now folded);
    a user-written top-2 GShard mixture of experts (capacity dispatch, ``sow``'d aux loss); a
    MaxText/T5X-style LM (``nn.with_logical_partitioning`` metadata without a mesh, boxed
    parameters in the state, a jitted init). The
    *step* is planned, compiles as often as without the plugin, the parameters live on all 8
    devices, the plan splits some of the step's arguments (parameters or batch), same losses."""
    plain, plain_info, _ = _run(script)
    out, run, stderr = _run(script, JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info", ALPA_PASS_REPORT=str(tmp_path))
    assert "planned train_step on mesh 1x8" in stderr and run["plugin"]["failed"] == 0
    assert run["compiles"]["train_step"] == plain_info["compiles"]["train_step"] == 1
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert len(out["losses"]) == len(plain["losses"]) >= 4 and all(p["devices"] == 8 for p in out["params"])
    steps = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("*_train_step.json"))]
    assert steps and all(any("'y'" in spec for spec in s["input_specs"]) for s in steps), \
        [s["input_specs"] for s in steps]


@pytest.mark.slow
def test_nnx_lora_fine_tuning_trains_only_the_adapters():
    """tests/scripts/train_nnx_lora.py: flax NNX LoRA (``nnx.LoRALinear``, ``nnx.LoRA`` around a
    head, ``Optimizer(wrt=nnx.LoRAParam)``, ``DiffState``): the step is planned once, the 37 base
    weights stay bit-identical and the 10 adapters train, same losses as without the plugin."""
    plain, _, _ = _run("train_nnx_lora.py")
    out, run, stderr = _run("train_nnx_lora.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert stderr.count("planned train_step on mesh 1x8") == 1 and run["plugin"]["failed"] == 0
    assert run["compiles"]["train_step"] == 1
    assert out["base_unchanged"] and (out["n_base"], out["n_lora"], out["lora_changed"]) == (37, 10, 10)
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert all(p["devices"] == 8 for p in out["params"])


_INJECT = ("import json, runpy, sys\n"
           "import alpa_pass.plugin as plugin, alpa_pass.plugin.planner as planner\n"
           "def plan(*args, **kwargs):\n"
           "    raise RuntimeError('injected planner bug')\n"
           "planner.PluginPlanner.plan = plan\n"
           "runpy.run_path(sys.argv[1], run_name='__main__')\n"
           "print('STATS ' + json.dumps(plugin.stats()))\n")


def test_an_unexpected_planning_error_leaves_the_step_to_plain_jit(plain_run):
    """A bug while planning (injected: the planner raises RuntimeError) does not end the user's
    run: it is logged with its traceback, the step runs as plain jax.jit with the same losses, and
    stats count it as failed. ``ALPA_PASS_STRICT=1`` raises it instead."""
    script = str(SCRIPTS / "train_mlp.py")
    proc = subprocess.run([sys.executable, "-c", _INJECT, script], env=_env(JAX_PLUGINS="alpa_pass"),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "unexpected RuntimeError while planning train_step" in proc.stderr
    assert "injected planner bug" in proc.stderr and "Traceback" in proc.stderr
    lines = proc.stdout.strip().splitlines()
    stats = json.loads(lines[-1][len("STATS "):])
    assert stats["failed"] == 1 and stats["planned"] == 0, stats
    assert json.loads(lines[-2])["losses"] == plain_run[0]["losses"]
    strict = subprocess.run([sys.executable, "-c", _INJECT, script], env=_env(JAX_PLUGINS="alpa_pass", ALPA_PASS_STRICT="1"),
                            capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT)
    assert strict.returncode != 0 and "RuntimeError: injected planner bug" in strict.stderr


def test_a_step_with_debug_prints_is_planned_and_prints_once_per_step():
    """``jax.debug.print`` and ``jax.debug.callback`` inside the step (unordered effects) no longer
    make the plugin pass the step by: it is planned, each callback runs once per step and sees the
    loss the step returns, same losses as without the plugin, parameters over all 8 devices."""
    plain, _, _ = _run("train_debug_print.py")
    out, run, stderr = _run("train_debug_print.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert "planned train_step on mesh 1x8" in stderr and run["plugin"]["failed"] == 0
    assert run["compiles"]["train_step"] == 1
    assert [s[0] for s in out["seen"]] == [0, 1, 2, 3], out["seen"]  # once per step, in order
    for (_, seen_loss, seen_norm), loss, (_, _, plain_norm) in zip(out["seen"], out["losses"], plain["seen"]):
        assert seen_loss == loss and seen_norm == pytest.approx(plain_norm, rel=1e-5)
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert all(p["devices"] == 8 for p in out["params"])
    assert any("'y'" in p["spec"] for p in out["params"]), out["params"]


def test_an_error_check_that_fires_in_a_planned_step_raises_as_in_plain_jax():
    """``eqx.error_if`` in a planned step: its callback (in a ``cond`` branch) raises. jax put it
    on device 0 and the other devices waited for its result in a collective: XLA's CPU runtime
    aborted the process after 40 s (NCCL would wait for ever). Run on every device
    (``emit.callbacks``), it raises on each: the step raises EquinoxRuntimeError as plain jax's
    does, and training goes on with the same losses."""
    plain, _, _ = _run("train_error_if.py")
    out, run, stderr = _run("train_error_if.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert "planned step on mesh 1x8" in stderr and run["plugin"]["failed"] == 0
    assert plain["error"] == out["error"] == ["EquinoxRuntimeError", True]
    assert (plain["devices"], out["devices"]) == (1, 8)
    for a, b in zip(out["losses"], plain["losses"], strict=True):
        assert a == pytest.approx(b, rel=1e-5)


def test_host_code_helpers_fed_by_a_plan_run_on_one_device_as_in_plain_jax():
    """tests/scripts/train_then_host_math.py: a planned step's weights (split over our mesh) feed
    a jitted ``pure_callback`` clip and a batched Cholesky. Run where the arguments are, on all 8
    simulated devices, the callback made XLA gather the weights onto device 0 ("Involuntary full
    rematerialization") while 7 devices waited (it can hang), and jaxlib < 0.11's batched LAPACK
    can deadlock (a vmapped cholesky of a planned step's output: 6 s a step, plain 0.01 s). They
    run on one device, as plain jax runs them, with the same numbers; the clipped weights go
    back into the planned step (its one plan and executable)."""
    from alpa_pass import _compat

    plain, _, _ = _run("train_then_host_math.py")
    out, run, stderr = _run("train_then_host_math.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert stderr.count("planned train_step on mesh 1x8") == 1 and run["compiles"]["train_step"] == 1, stderr
    assert "Involuntary full rematerialization" not in stderr
    assert out["devices"]["clipped"] == 1 and out["devices"]["w"] == 8, out["devices"]
    if _compat.jax_version() < (0, 11):
        assert out["devices"]["logdets"] == 1
    for key in ("losses", "clip"):
        np.testing.assert_allclose(out[key], plain[key], rtol=1e-5)
    np.testing.assert_allclose(out["logdets"], plain["logdets"], rtol=1e-5)


def test_a_batch_committed_to_one_device_beside_planned_weights_runs_there():
    """tests/scripts/train_then_committed_batch.py: a loader that commits batches to one device
    (``jax.device_put(x, jax.devices()[3])``) after planned steps. Plain jax's uncommitted
    outputs follow the batch; the planned step's outputs are committed to all 8 devices, and jax
    refused the mix ("Received incompatible devices for jitted computation"). Now the step runs
    where the user's batch is, as under plain jax, with the same numbers (and the eval step on a
    batch committed to device 5 likewise), said once per step at info level."""
    plain, _, _ = _run("train_then_committed_batch.py")
    out, run, stderr = _run("train_then_committed_batch.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert stderr.count("planned train_step on mesh 1x8") == 1, stderr
    assert stderr.count("train_step runs untouched (arguments committed to 1 of the 8 devices") == 1, stderr
    assert out["devices"]["w1_after_1"] == list(range(8)) and plain["devices"]["w1_after_1"] == [0]
    for k in ("pred", "w1_after_2", "w1_after_4"):
        assert out["devices"][k] == plain["devices"][k] == ([5] if k == "pred" else [3]), out["devices"]
    np.testing.assert_allclose(out["losses"], plain["losses"], rtol=1e-5)
    assert out["eval_error"] == pytest.approx(plain["eval_error"], rel=1e-5)


def test_batched_lapack_the_jaxpr_does_not_show_runs_on_one_device():
    """tests/scripts/train_then_hidden_lapack.py: a batched QR inside a primitive lowered by
    ``mlir.lower_fun`` (lineax's GMRES does its QR inside Equinox's primitive: a vmapped solve in
    a planned step deadlocked on 1x8 with jaxlib < 0.11) shows only in the lowered module. A step
    holding one runs untouched, and a helper fed by a planned step's weights runs on one device,
    as plain jax runs them; same numbers. (jaxlib >= 0.11 cannot deadlock there: planned.)"""
    from alpa_pass import _compat

    plain, _, _ = _run("train_then_hidden_lapack.py")
    out, run, stderr = _run("train_then_hidden_lapack.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="debug")
    assert stderr.count("planned train_step on mesh 1x8") == 1 and out["devices"]["w"] == 8, stderr[-3000:]
    if _compat.jax_version() < (0, 11):
        assert "planned basis_fit" not in stderr and "basis_fit runs untouched (batched LAPACK" in stderr
        assert "group_basis reads arguments on a plan's mesh; it runs on one device" in stderr
        assert out["devices"]["sums"] == 1 and out["devices"]["fit"] == 1, out["devices"]
        assert run["plugin"]["planned"] == 1 and run["compiles"]["basis_fit"] == 1, run
    for key in ("losses", "sums", "fits"):
        np.testing.assert_allclose(out[key], plain[key], rtol=1e-5)


def test_a_recurrent_model_is_planned_and_compiled_once():
    """tests/scripts/train_flax_rnn.py (``nn.RNN`` over an LSTM cell, a bidirectional GRU: scans
    over time). Its step's second call, with the state committed to our mesh, is traced again
    under that mesh, where jax makes tanh's and sigmoid's jvp constant 1 as ``reshard 1.0`` and the
    scans take it as one more constant (``_compat.fold_retraced_mesh_ops``): it was planned and
    compiled a second time; now once, and the same losses as without the plugin."""
    plain, _, _ = _run("train_flax_rnn.py")
    out, run, stderr = _run("train_flax_rnn.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert stderr.count("planned train_step on mesh 1x8") == 1, stderr[-2000:]
    assert run["compiles"]["train_step"] == 1 and run["plugin"]["planned"] == 1, run
    assert run["plugin"]["reused"] >= 1 and run["plugin"]["failed"] == 0, run
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert len(out["losses"]) == 4 and all(p["devices"] == 8 for p in out["params"]), out["params"]


def test_a_custom_partitioning_op_is_planned_under_the_plugin():
    """tests/scripts/infer_custom_partitioning.py: the planner extracts the module lowered for the
    mesh's devices, where the op is a CustomSPMDPartitioning call as in the compiled one (it was
    planned from the inline lowering and failed at emission: "runs as plain jax.jit")."""
    plain, _, _ = _run("infer_custom_partitioning.py")
    out, run, stderr = _run("infer_custom_partitioning.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info",
                            ALPA_PASS_MIN_BYTES="0")
    assert "planned step on mesh 1x8" in stderr and "plain jax.jit" not in stderr, stderr[-2000:]
    assert run["plugin"]["failed"] == 0 and run["compiles"]["step"] == 1 and out["devices"] == 8
    for a, b in zip(out["outs"], plain["outs"]):
        assert a == pytest.approx(b, rel=1e-5)


@pytest.mark.slow
def test_a_flax_language_model_splits_its_tied_table(tmp_path):
    """tests/scripts/train_flax_lm.py (``nn.Embed`` with the tied head ``Embed.attend``, vocab 8192,
    hidden 64) on 2x4: the table and its Adam moments split on the vocabulary over y (Megatron's
    vocab-parallel embedding: the lookup masks its rows and all-reduces), same losses. This is the
    unmerged refinement's plan (322k columns: refined on "auto" since session 48 lifted the column
    cap; objective 2.066e6 -> 1.529e6, compiled collectives 2.57 -> 1.65 MB per device, all-to-alls
    1.28 -> 0.13 MB). The merged plan split the table on the hidden dim over y. (Before
    collective-permutes were priced a merged plan split the table on its vocabulary, and its logits,
    split over (x, y) on the vocabulary, were read by the loss's gather split over y with x on the
    batch: a 2 MB collective-permute per device the cost model did not see, 5.95 MB compiled in all.
    The vocab-parallel lookup itself: tests/integration/test_vocab_parallel.py.)"""
    plain, _, _ = _run("train_flax_lm.py")
    out, run, stderr = _run("train_flax_lm.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_MESH="2x4",
                            ALPA_PASS_REPORT=str(tmp_path), ALPA_PASS_LOG="info")
    assert "planned train_step on mesh 2x4" in stderr and run["plugin"]["failed"] == 0
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert len(out["losses"]) == 4 and out["embedding"]["devices"] == 8
    assert len(out["params"]) == 35 and all(p["devices"] == 8 for p in out["params"]), out["params"]
    assert out["embedding"]["spec"] == "P('y', None)", out["embedding"]
    (summary,) = tmp_path.glob("*_train_step.txt")
    text = summary.read_text()
    assert "solve: unmerged ILP kept" in text, text
    # the lookup reads the table as it lies, split on the vocabulary (masked rows, all-reduced)
    assert re.search(r"│ gather +│ GATHER +│ 16x32x64 .*│ gather RRS0 vocab-split", text), text


def test_eval_step_keeps_the_train_layouts_and_a_restart_from_the_init_reshards(tmp_path):
    """flax's loop around a train step (tests/scripts/train_eval_restart.py): a jitted init, a
    jitted ``eval_step(state, ...)`` before training and every 2 steps, and a second run from the
    same initial state. It crashed the process before (PJRT "RuntimeProgramInputMismatch", then a
    segfault): jax's C++ dispatch passed arguments committed to one plan's layouts as they were to
    an executable planned for others, from the second such call on. Now the eval step reads the
    parameters where they arrive: one plan for the init's layouts, one for the train step's (its
    input specs are the train step's output specs), each compiled once and reused by the second
    run; a train step called again with the init's layouts reshards them on entry; the losses and
    eval metrics equal plain jax.jit's, both runs alike."""
    plain, plain_info, _ = _run("train_eval_restart.py")
    out, run, stderr = _run("train_eval_restart.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info",
                            ALPA_PASS_REPORT=str(tmp_path))
    assert run["plugin"]["planned"] == 4 and run["plugin"]["failed"] == 0
    for name in ("create_state", "train_step"):
        assert run["compiles"][name] == plain_info["compiles"][name] == 1, name
    assert run["compiles"]["eval_step"] == 2  # (plain: every input on one device, one executable)
    assert stderr.count("eval_step reads 14 argument(s) where an earlier plan's outputs lie") == 2
    assert out["runs"][0] == out["runs"][1] and len(out["runs"][0]["evals"]) == 3
    for got, want in zip(out["runs"], plain["runs"]):
        for a, b in zip(got["losses"], want["losses"]):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
        for a, b in zip(got["evals"], want["evals"]):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["accuracy"] == b["accuracy"]
    n = len(out["params"])

    def specs(name, field, start):
        (path,) = tmp_path.glob(f"{name}.json")
        return json.loads(path.read_text())[field][start:start + n]

    # state.step, then the params (outputs); the params first among the eval's inputs (step and
    # opt_state unread)
    assert specs("002_train_step", "output_specs", 1) != specs("000_create_state", "output_specs", 1)
    assert specs("001_eval_step", "input_specs", 0) == specs("000_create_state", "output_specs", 1)
    assert specs("003_eval_step", "input_specs", 0) == specs("002_train_step", "output_specs", 1)


@pytest.mark.slow
def test_eval_step_follows_the_train_step_onto_the_mesh_it_chose(tmp_path):
    """``ALPA_PASS_MESH=auto``: the eval step is planned on the mesh the train step chose (where
    its parameters lie), following their layouts, not over every candidate mesh and resharded at
    every call; same losses and metrics as without the plugin."""
    plain, _, _ = _run("train_eval_restart.py")
    out, run, _ = _run("train_eval_restart.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_MESH="auto",
                       ALPA_PASS_REPORT=str(tmp_path))
    assert run["plugin"]["planned"] == 4 and run["plugin"]["failed"] == 0

    def report(name):
        (path,) = tmp_path.glob(f"{name}.json")
        return json.loads(path.read_text())

    train, evals = report("002_train_step"), report("003_eval_step")
    assert evals["mesh"] == train["mesh"] and len(evals["mesh_search"] or []) <= 1, (evals["mesh"], train["mesh"])
    n = len(out["params"])
    assert evals["input_specs"][:n] == train["output_specs"][1:1 + n]
    for got, want in zip(out["runs"], plain["runs"]):
        for a, b in zip(got["losses"] + [e["loss"] for e in got["evals"]],
                        want["losses"] + [e["loss"] for e in want["evals"]]):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_keras_fit_with_validation_evaluate_and_predict():
    """Keras 3 ``model.fit(..., validation_data=...)``, ``evaluate`` and ``predict``
    (tests/scripts/train_keras.py): its jitted ``train_step``, ``test_step`` and ``predict_step``
    are planned and compile once each, as without the plugin; ``test_step`` and ``predict_step``
    read the trainable variables where ``train_step`` leaves them (Keras's ``test_step`` hands
    them back unchanged: an argument returned as it came in is followed, not planned anew and
    resharded on entry at every call), and every loss and prediction equals plain jax.jit's."""
    plain, plain_info, _ = _run("train_keras.py")
    out, run, stderr = _run("train_keras.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert run["plugin"]["planned"] == 3 and run["plugin"]["failed"] == 0
    for name in ("train_step", "test_step", "predict_step"):
        assert run["compiles"][name] == plain_info["compiles"][name] == 1, name
        assert f"planned {name} on mesh 1x8" in stderr
    for name in ("test_step", "predict_step"):  # the trainable variables and the dropout seed
        followed = re.search(rf"{name} reads (\d+) argument\(s\) where an earlier plan's outputs lie", stderr)
        assert followed and int(followed.group(1)) == len(out["params"]) + 1, stderr
    assert len(out["losses"]) == 12 and len(out["val_losses"]) == 3
    for a, b in zip(out["losses"] + out["val_losses"], plain["losses"] + plain["val_losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert out["evaluate"] == pytest.approx(plain["evaluate"], rel=1e-5)
    assert out["predict_abs_sum"] == pytest.approx(plain["predict_abs_sum"], rel=1e-5)
    assert all(p["devices"] == 8 for p in out["params"]) and any("'y'" in p["spec"] for p in out["params"])


def test_first_computation_of_the_script_is_planned():
    """The script's first jax computation is the jitted step: its lowering starts JAX's backend
    and with it the plugin, from inside that lowering. It is planned all the same (compiled once,
    the weights on all 8 devices), same losses."""
    plain, plain_info, _ = _run("train_first_jit.py")
    out, run, stderr = _run("train_first_jit.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert "planned train_step on mesh 1x8" in stderr and run["plugin"]["planned"] == 1
    assert run["compiles"]["train_step"] == plain_info["compiles"]["train_step"] == 1
    assert out["params"][0]["devices"] == 8 and plain["params"][0]["devices"] == 1
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_log_lines_once_when_the_application_configures_root_logging():
    """With ALPA_PASS_LOG=info and an application that configured root logging itself, each
    alpa_pass line is printed once (not again through the root logger)."""
    _, run, stderr = _run("train_root_logging.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_LOG="info")
    assert run["plugin"]["planned"] == 1
    planned = [ln for ln in stderr.splitlines() if "planned train_step" in ln]
    assert len(planned) == 1, planned
    assert not any(ln.startswith("ROOT alpa_pass") for ln in stderr.splitlines())


@pytest.mark.slow
def test_jitted_init_of_a_model_over_the_memory_budget_is_planned(tmp_path):
    """An unchanged script (flax linen, jitted TrainState init) whose state is 3x the per-device
    memory budget: the init is planned within the budget (it ran as plain jax.jit on one device
    before: the merged ILP had no plan under the budget) and the step trains like plain jax."""
    import importlib.util

    import jax

    spec = importlib.util.spec_from_file_location("jit_init", SCRIPTS / "train_linen_jit_init.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    x = np.zeros((script.BATCH, script.HIDDEN), np.float32)
    state = jax.eval_shape(script.create_state, jax.random.key(0), x)
    whole = sum(np.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(state))
    budget = 2**20
    assert whole > 3 * budget
    plain, _, _ = _run("train_linen_jit_init.py")
    report = tmp_path / "report"
    out, run, stderr = _run("train_linen_jit_init.py", JAX_PLUGINS="alpa_pass", ALPA_PASS_MEMORY_BUDGET=str(budget),
                            ALPA_PASS_REPORT=str(report), ALPA_PASS_LOG="info")
    assert "planned create_state on mesh 1x8" in stderr and "runs as plain jax.jit" not in stderr
    assert run["plugin"]["planned"] == 2 and run["plugin"]["failed"] == 0
    for name in ("create_state", "train_step"):
        (path,) = report.glob(f"*_{name}.json")
        assert json.loads(path.read_text())["predicted"]["peak_bytes"] <= budget, name
    for a, b in zip(out["losses"], plain["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert all(p["devices"] == 8 for p in out["params"])


@pytest.mark.slow
def test_orbax_checkpoint_manager_resume_in_an_unchanged_script():
    """flax's checkpointing pattern, unchanged: orbax ``CheckpointManager`` saving the TrainState
    every 2 steps from the planned step, then a restart restoring the latest step into an abstract
    target taken from the live (sharded) state. Every restored leaf equals the saved one bit for
    bit, the restored state keeps the plan's layouts (the step compiles once: no re-plan, no
    recompile for the restored arguments), and the losses before and after the restart equal
    the run without the plugin."""
    plain, plain_info, _ = _run("train_orbax_resume.py")
    out, run, _ = _run("train_orbax_resume.py", JAX_PLUGINS="alpa_pass")
    assert run["plugin"]["planned"] == 1 and run["plugin"]["failed"] == 0 and run["plugin"]["reused"] >= 1
    # (plain jax.jit compiles the step again for the restored, committed arrays; the plugin's
    # restored state is in the layouts the plan was compiled for)
    assert run["compiles"]["train_step"] == 1 <= plain_info["compiles"]["train_step"]
    assert out["restored_equal"] and plain["restored_equal"] and out["latest"] == plain["latest"] == 4
    for a, b in zip(out["losses"] + out["resumed"], plain["losses"] + plain["resumed"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
    assert out["restored_devices"] == [8] and plain["restored_devices"] == [1]
    assert len(out["resumed"]) == 2 and all(p["devices"] == 8 for p in out["params"])
    assert any("'y'" in p["spec"] for p in out["params"]), out["params"]
