"""The model-zoo table: each library training script run unchanged with and without
``JAX_PLUGINS=alpa_pass`` on 8 simulated CPU devices; prints a markdown table (library | planned |
compiles of the step plugin/plain | parameter leaves on all 8 devices | largest loss difference).

    python benchmarks/zoo_table.py            # all scripts (about a minute on 2 cores)
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "scripts"
ZOO = {
    "flax linen, TrainState, jitted init (lm1b style)": "train_linen_jit_init.py",
    "flax linen, TrainState": "train_flax.py",
    "flax linen LM (`nn.Embed` + tied `Embed.attend`, `SelfAttention`, adamw; `ALPA_PASS_MESH=2x4`)": "train_flax_lm.py",
    "flax NNX (nnx.jit, Optimizer, Rngs, Dropout, BatchNorm)": "train_nnx.py",
    "Equinox (filter_jit, typed keys, Dropout)": "train_equinox.py",
    "flax NNX scan over layers (nnx.vmap stack, nnx.scan, nnx.remat)": "train_nnx_scan.py",
    "Equinox scan over layers (filter_vmap stack, lax.scan, checkpoint, inject_hyperparams)": "train_equinox_scan.py",
    "Keras 3 model.fit (3 epochs, validation_data), evaluate, predict": "train_keras.py",
    "flax linen: jitted init, eval before training and every 2 steps, a second run from the init": "train_eval_restart.py",
    "flax linen + orbax CheckpointManager: save, restart, restore, train on": "train_orbax_resume.py",
    "Keras 3 applications.MobileNetV3Small (model.fit, unchanged)": "train_keras_app.py",
    "optax MultiSteps": "train_multisteps.py",
    "Haiku (transform_with_state, MultiHeadAttention, BatchNorm state, dropout keys)": "train_haiku.py",
    "flax linen with jax.debug.print / debug.callback in the step, clip + adamw": "train_debug_print.py",
    "flax linen recurrent (`nn.RNN` over `OptimizedLSTMCell`, `Bidirectional` GRU: scans over time)": "train_flax_rnn.py",
    "jax + optax, typed dropout key": "train_dropout_key.py",
    "jax, step is the first computation": "train_first_jit.py",
    "flax linen, MaxText style: bf16 compute, `nn.remat` policy, gradient accumulation by `lax.scan` in the step": "train_accum_bf16.py",
    "flax NNX MNIST tutorial (`nnx.Conv`, `MultiMetric` updated in train and eval steps)": "train_nnx_mnist.py",
    "Keras 3 custom JAX loop (`stateless_call`, `stateless_apply` in `jax.jit`)": "train_keras_stateless.py",
    "flax linen + optax `contrib.muon` (Newton-Schulz on each update, `TrainState`)": "train_muon.py",
    "Equinox stateful (`make_with_state`, `BatchNorm`, `Conv2d`)": "train_equinox_bn.py",
    "flax linen, the whole training loop in one jit (`lax.scan` over steps, PureJaxRL style)": "train_scan_loop.py",
    "diffrax neural ODE (Equinox MLP field, Tsit5 + PID adaptive steps, checkpointed adjoint, adabelief)": "train_diffrax_ode.py",
    "flax linen diffusion UNet (`Conv`, `ConvTranspose`, `GroupNorm`, time embedding, EMA params in the state)": "train_unet_diffusion.py",
    "flax linen physics-informed network (`jax.hessian` / `jax.grad` of the model in the loss)": "train_pinn.py",
    "flax linen top-2 GShard mixture of experts (capacity dispatch, `sow` aux loss)": "train_flax_moe.py",
    "flax linen MaxText/T5X style (`with_logical_partitioning`, boxed params, jitted init)": "train_t5x_logical.py",
    "flax NNX LoRA (`LoRALinear`, `Optimizer(wrt=LoRAParam)`)": "train_nnx_lora.py",
}
ENV = {"train_flax_lm.py": {"ALPA_PASS_MESH": "2x4"}}  # (its table splits on 2x4)


def losses(out: dict) -> list[float]:
    """Every loss a script printed: training (``losses``, or per run), validation, after a restart."""
    runs = out.get("runs") or [out]
    return [v for r in runs for v in (*r["losses"], *(e["loss"] for e in r.get("evals", ())))] + \
        [*out.get("val_losses", ()), *out.get("resumed", ())]


def run(script: str, plugin: bool) -> tuple[dict, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ALPA_PASS_", "JAX_PLUGINS"))}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    if plugin:
        env.update(JAX_PLUGINS="alpa_pass", **ENV.get(script, {}))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "run_script.py"), str(SCRIPTS / script)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"{script} failed:\n{proc.stderr[-2000:]}")
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-2]), json.loads(lines[-1][len("ALPA_PASS_RUN "):])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="comma-separated script names (default: all), e.g. train_flax.py")
    args = p.parse_args(argv)
    zoo = ZOO if args.only is None else {k: v for k, v in ZOO.items() if v in args.only.split(",")}
    print("| library | planned | step compiles plugin/plain | leaves on 8 devices | max loss diff (rel) |")
    print("|---|---|---|---|---|")
    for library, script in zoo.items():
        try:
            (plain, plain_run), (out, out_run) = run(script, False), run(script, True)
        except RuntimeError as e:
            if "ModuleNotFoundError" not in str(e):
                raise
            print(f"| {library} | library not installed | | | |")
            continue
        step = "train_step"
        diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses(out), losses(plain)))
        on_all = sum(p["devices"] == 8 for p in out["params"])
        print(f"| {library} | {out_run['plugin']['planned']} | {out_run['compiles'].get(step)}/"
              f"{plain_run['compiles'].get(step)} | {on_all}/{len(out['params'])} | {diff:.1e} |")


if __name__ == "__main__":
    main()
