"""A Wide-ResNet in plain jax (Alpa's Wide-ResNet suite): bottleneck residual blocks, NHWC.

No batch norm (a per-example layer norm over channels after each block keeps activations bounded
and needs no cross-device statistics). Stage ``i`` has ``channels * 2**i`` output filters/4 and
``channels * 2**i * width`` inner filters; the stem is a stride-2 7x7 (3x3 for images <= 64) conv.
Batch: ``{"images": f32[batch, image, image, 3], "labels": int32[batch]}``; softmax cross-entropy.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

_STAGES = {10: (1, 1, 1, 1), 26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}


@dataclasses.dataclass(frozen=True)
class Config:
    image: int = 32
    layers: int = 10           # 10, 26, 50 or 101 (bottleneck blocks per stage from _STAGES)
    channels: int = 16
    width: int = 2
    classes: int = 10
    batch: int = 16

    def stage_blocks(self) -> tuple[int, ...]:
        if self.layers not in _STAGES:
            raise ValueError(f"Wide-ResNet layers must be one of {sorted(_STAGES)}, got {self.layers}")
        return _STAGES[self.layers]


def _conv_params(key, kh, cin, cout, scale=1.0):
    return scale * jax.random.normal(key, (kh, kh, cin, cout), jnp.float32) / math.sqrt(kh * kh * cin)


def init(key, config: Config):
    keys = iter(jax.random.split(key, 2 + 4 * sum(config.stage_blocks())))
    stem_k = 7 if config.image > 64 else 3
    params = {"stem": _conv_params(next(keys), stem_k, 3, config.channels), "stages": []}
    cin = config.channels
    for i, blocks in enumerate(config.stage_blocks()):
        inner, out = config.channels * 2**i * config.width, config.channels * 2**i * 4
        stage = []
        for b in range(blocks):
            block = {"conv1": _conv_params(next(keys), 1, cin, inner),
                     "conv2": _conv_params(next(keys), 3, inner, inner),
                     "conv3": _conv_params(next(keys), 1, inner, out, scale=0.2),
                     "scale": jnp.ones((out,), jnp.float32)}
            if b == 0:
                block["proj"] = _conv_params(next(keys), 1, cin, out)
            stage.append(block)
            cin = out
        params["stages"].append(stage)
    params["head"] = jax.random.normal(next(keys), (cin, config.classes), jnp.float32) / math.sqrt(cin)
    return params


def _conv(x, w, stride=1):
    return jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _norm(x, scale):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


def _block(p, x, stride):
    h = jax.nn.relu(_conv(x, p["conv1"]))
    h = jax.nn.relu(_conv(h, p["conv2"], stride))
    h = _conv(h, p["conv3"])
    shortcut = _conv(x, p["proj"], stride) if "proj" in p else x
    return jax.nn.relu(_norm(h + shortcut, p["scale"]))


def apply(params, images):
    x = jax.nn.relu(_conv(images, params["stem"], 2))
    for i, stage in enumerate(params["stages"]):
        for b, p in enumerate(stage):
            x = _block(p, x, 2 if (b == 0 and i > 0) else 1)
    return jnp.mean(x, axis=(1, 2)) @ params["head"]


def make_loss_fn(config: Config):
    def loss_fn(params, batch):
        logp = jax.nn.log_softmax(apply(params, batch["images"]), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, batch["labels"][:, None], axis=-1))

    return loss_fn


def make_batch(key, config: Config):
    ki, kl = jax.random.split(key)
    return {"images": jax.random.normal(ki, (config.batch, config.image, config.image, 3), jnp.float32),
            "labels": jax.random.randint(kl, (config.batch,), 0, config.classes, jnp.int32)}


def _alpa(layers, channels, width, batch=64):
    return Config(image=224, layers=layers, channels=channels, width=width, classes=1024, batch=batch)


# Alpa's depth and width factor per size; the base channels are chosen so that this model's
# parameter count lands near the nominal size (Alpa's own layer widths differ in detail).
SIZES = {
    "small": Config(),
    "250M": _alpa(50, 128, 2),      # 271M
    "500M": _alpa(50, 176, 2),      # 511M
    "1B": _alpa(50, 256, 2),        # 1.08B
    "2B": _alpa(50, 352, 2),        # 2.03B
    "4B": _alpa(50, 512, 2),        # 4.29B
    "6.8B": _alpa(50, 96, 16),      # 6.87B
    "13B": _alpa(101, 96, 16),      # 13.0B
}
