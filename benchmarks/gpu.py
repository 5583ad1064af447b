"""GPU figures of a case that ran: throughput, model TFLOP/s per device and MFU.

Model FLOPs per step come from the model config (``benchmarks.flops.step_flops``: matmuls and
convolutions, 3x forward); MFU is against the dense TF32 peak of the device kind (the models are
f32, and JAX's default matmul precision runs f32 matmuls as TF32 on Ampere and later), None where
the kind is not in ``flops.PEAK_TFLOPS``. XLA's own count of the partitioned module
(``cost_analysis``, per device, includes elementwise work and rematerialisation) is reported beside
it as ``xla_tflops_per_device``; on GPU that count leaves out the matmuls XLA hands to cuBLAS and
its GEMM fusions (GPT 1.3B on one H200: 0.94 of 34.7 model TFLOP per step), so there it is no
measure of the step's work.
"""
from __future__ import annotations

from benchmarks import flops


def throughput(result: dict, suite: str, config, device_kind: str, devices: int) -> dict:
    """Per method that ran (``entry["timing"]["median_s"]``): samples/s, tokens/s (GPT, MoE), model
    TFLOP/s per device and MFU, and XLA's TFLOP/s per device where the compiled module counted FLOPs."""
    peak = flops.peak_tflops(device_kind)
    per_step = flops.step_flops(suite, config)
    tokens = config.batch * config.seq if suite in ("gpt", "moe") else None
    out = {"device_kind": device_kind, "devices": devices, "peak_tflops": peak, "precision": "tf32",
           "model_flops_per_step": per_step, "methods": {}}
    for name, entry in result["methods"].items():
        seconds = entry.get("timing", {}).get("median_s")
        if not seconds:
            continue
        figures = flops.throughput_figures(per_step, seconds, devices, peak, config.batch, tokens)
        if entry.get("flops"):  # XLA's count is per device already
            figures["xla_tflops_per_device"] = entry["flops"] / seconds / 1e12
        out["methods"][name] = figures
    return out

