"""GPU figures of a case that ran: throughput, achieved TFLOP/s per device and MFU.

The models are f32; under JAX's default matmul precision, Ampere and later GPUs run their matmuls
as TF32, so MFU is measured against the dense TF32 peak of the device kind (None if unknown).
FLOPs are what XLA counts in the partitioned module of each method (``cost_analysis``), per device.
"""
from __future__ import annotations

import jax

# Dense TF32 tensor-core peak, TFLOP/s per device (V100 has no TF32: its FP32 peak).
PEAK_TFLOPS = {"H200": 494.7, "H100": 494.7, "A100": 156.0, "L40S": 183.0, "A10": 62.5,
               "L4": 60.0, "V100": 15.7}


def peak_tflops(device_kind: str) -> float | None:
    for name, peak in PEAK_TFLOPS.items():
        if name.lower() in device_kind.lower():
            return peak
    return None


def throughput(result: dict, suite: str) -> dict:
    """Per method that ran: samples/s (and tokens/s for GPT/MoE), TFLOP/s per device, MFU."""
    config = result["config"]
    peak = peak_tflops(jax.devices()[0].device_kind)
    out = {"device_kind": jax.devices()[0].device_kind, "peak_tflops": peak, "methods": {}}
    for name, entry in result["methods"].items():
        seconds = entry.get("timing", {}).get("median_s")
        if not seconds:
            continue
        figures = {"samples_per_s": config["batch"] / seconds}
        if suite in ("gpt", "moe"):
            figures["tokens_per_s"] = config["batch"] * config["seq"] / seconds
        if entry.get("flops"):
            tflops = entry["flops"] / seconds / 1e12
            figures["tflops_per_device"] = tflops
            figures["mfu"] = tflops / peak if peak else None
        out["methods"][name] = figures
    return out
