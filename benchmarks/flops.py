"""Model FLOPs per training step and device peaks: pure functions of a model config and a device kind.

``step_flops`` counts the useful (model) FLOPs of one training step, forward + backward = 3x the
forward's multiply-adds x 2, the convention of Megatron-LM's and PaLM's MFU: matmuls and
convolutions only (elementwise work, softmax, norms are left out); attention scores and context
are counted in full (the models compute the causal mask by masking, not by skipping). For MoE,
each token counts its ``top_k`` experts' FFNs plus the gate; GShard's dispatch/combine einsums and
the capacity padding are overhead, not model FLOPs. Rematerialisation is not counted.

``mfu`` divides achieved model FLOP/s per device by the device's dense peak for the precision
the matmuls run in (``PEAK_TFLOPS``).
"""
from __future__ import annotations

import math

# Dense (no sparsity) peak TFLOP/s per device, by the precision the matmuls run in. The models are
# f32; under JAX's default matmul precision Ampere and later GPUs run f32 matmuls as TF32.
PEAK_TFLOPS = {
    "H200": {"tf32": 494.7, "bf16": 989.4, "fp32": 66.9},
    "H100": {"tf32": 494.7, "bf16": 989.4, "fp32": 66.9},   # SXM
    "A100": {"tf32": 156.0, "bf16": 312.0, "fp32": 19.5},
    "L40S": {"tf32": 183.0, "bf16": 362.0, "fp32": 91.6},
    "A10": {"tf32": 62.5, "bf16": 125.0, "fp32": 31.2},
    "L4": {"tf32": 60.0, "bf16": 121.0, "fp32": 30.3},
    "V100": {"tf32": 15.7, "bf16": 125.0, "fp32": 15.7},   # no TF32: its FP32 (fp16 tensor for bf16)
}


def peak_tflops(device_kind: str, precision: str = "tf32") -> float | None:
    """Dense peak of ``device_kind`` (e.g. "NVIDIA H100 80GB HBM3") at ``precision``; None if the
    kind is not in the table. The longest matching name wins ("A100" before "A10")."""
    kind = device_kind.lower()
    matches = [name for name in PEAK_TFLOPS if name.lower() in kind]
    if not matches:
        return None
    return PEAK_TFLOPS[max(matches, key=len)][precision]


def gpt_forward_flops(config) -> float:
    """Forward FLOPs of ``zoo.gpt`` (and the dense part of the MoE model) per step.

    Per token and layer: Q, K, V and output projections 8h^2, MLP 4*mlp_ratio*h^2, attention
    scores + context 4*seq*h; per token the LM head 2*h*vocab.
    """
    h, s, tokens = config.hidden, config.seq, config.batch * config.seq
    per_layer = 8 * h * h + 4 * getattr(config, "mlp_ratio", 4) * h * h + 4 * s * h
    return float(tokens * (config.layers * per_layer + 2 * h * config.vocab))


def moe_forward_flops(config, top_k: int = 2) -> float:
    """Forward FLOPs of ``benchmarks.models.moe_transformer`` (every ``moe_every``-th block MoE):
    attention as GPT; a MoE block's MLP counts ``top_k`` expert FFNs (ffn = 4h) and the gate
    (2*h*experts) per token."""
    h, s, tokens = config.hidden, config.seq, config.batch * config.seq
    moe_blocks = sum(1 for i in range(config.layers) if i % config.moe_every == config.moe_every - 1)
    attention = 8 * h * h + 4 * s * h
    dense_mlp, moe_mlp = 16 * h * h, top_k * 16 * h * h + 2 * h * config.experts
    per_token = (config.layers * attention + (config.layers - moe_blocks) * dense_mlp
                 + moe_blocks * moe_mlp + 2 * h * config.vocab)
    return float(tokens * per_token)


def wresnet_forward_flops(config) -> float:
    """Forward FLOPs of ``benchmarks.models.wide_resnet``: 2*k*k*cin*cout per output pixel of
    every convolution ("SAME" padding: a stride-2 conv halves the side, rounding up), plus the head."""
    side = math.ceil(config.image / 2)
    stem_k = 7 if config.image > 64 else 3
    total = 2 * stem_k * stem_k * 3 * config.channels * side * side
    cin = config.channels
    for i, blocks in enumerate(config.stage_blocks()):
        inner, out = config.channels * 2**i * config.width, config.channels * 2**i * 4
        for b in range(blocks):
            stride = 2 if (b == 0 and i > 0) else 1
            out_side = math.ceil(side / stride)
            total += 2 * cin * inner * side * side                 # 1x1 conv1, at the input side
            total += 2 * 9 * inner * inner * out_side * out_side   # 3x3 conv2 (strided)
            total += 2 * inner * out * out_side * out_side          # 1x1 conv3
            if b == 0:
                total += 2 * cin * out * out_side * out_side        # 1x1 projection (strided)
            side, cin = out_side, out
    total += 2 * cin * config.classes
    return float(config.batch * total)


_FORWARD = {"gpt": gpt_forward_flops, "moe": moe_forward_flops, "wresnet": wresnet_forward_flops}


def step_flops(suite: str, config) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward) of a suite's config."""
    if suite not in _FORWARD:
        raise ValueError(f"unknown suite {suite!r}; choose from {sorted(_FORWARD)}")
    return 3.0 * _FORWARD[suite](config)


def throughput_figures(flops_per_step: float, step_s: float, devices: int, peak: float | None,
                       samples: int, tokens: int | None = None) -> dict:
    """samples/s, tokens/s (None without a sequence), achieved model TFLOP/s per device and MFU
    (None without a peak) of one step of ``flops_per_step`` taking ``step_s`` on ``devices``."""
    if step_s <= 0 or devices <= 0:
        raise ValueError(f"step_s ({step_s}) and devices ({devices}) must be positive")
    tflops = flops_per_step / step_s / devices / 1e12
    return {"samples_per_s": samples / step_s, "tokens_per_s": None if tokens is None else tokens / step_s,
            "model_tflops_per_device": tflops, "mfu": None if peak is None else tflops / peak}
