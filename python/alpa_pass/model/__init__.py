"""Alpa's ``alpa.model`` helpers that training scripts import (``model_util.TrainState``,
``model_util.DynamicScale``); Alpa's own model zoo (GPT, BERT, MoE, ...) is not part of alpa_pass."""
from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name == "model_util":
        return importlib.import_module("alpa_pass.model.model_util")
    raise AttributeError(f"module 'alpa_pass.model' has no attribute {name!r} (Alpa's model zoo is not "
                         f"part of alpa_pass; model_util's TrainState and DynamicScale are)")
