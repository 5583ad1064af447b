"""GPT size presets (Alpa's GPT-3 family, seq 1024, vocab 51200) over ``zoo.gpt``."""
from __future__ import annotations

import dataclasses

from zoo import gpt

Config = gpt.Config
init = gpt.init
make_batch = gpt.make_batch


def make_loss_fn(config: Config):
    return gpt.make_loss_fn(config.heads)


def _alpa(hidden, layers, heads, batch=64):
    return Config(vocab=51200, seq=1024, hidden=hidden, heads=heads, layers=layers, batch=batch, tied=True)


SIZES = {
    "small": Config(vocab=512, seq=64, hidden=128, heads=4, layers=2, batch=16),
    "350M": _alpa(1024, 24, 16),
    "760M": _alpa(1536, 24, 16),
    "1.3B": _alpa(2048, 24, 32),
    "2.6B": _alpa(2560, 32, 32),
    "6.7B": _alpa(4096, 32, 32),
    "15B": _alpa(5120, 48, 40),
    "39B": _alpa(8192, 48, 64),
}

_MEGATRON = {"['wq']": 1, "['wk']": 1, "['wv']": 1, "['w1']": 1, "['b1']": 0,  # column parallel
             "['wo']": 0, "['w2']": 0,                                          # row parallel
             "['wte']": 0, "['lm_head']": 1}                                    # vocabulary parallel


def megatron_dim(path: str) -> int | None:
    """Tensor dim Megatron-LM splits over the tensor-parallel axis for the leaf at ``path``
    (a ``jax.tree_util.keystr`` of a parameter or of its optimizer state), or None (replicated)."""
    for suffix, dim in _MEGATRON.items():
        if path.endswith(suffix):
            return dim
    return None


def with_batch(config: Config, batch: int) -> Config:
    return dataclasses.replace(config, batch=batch)
