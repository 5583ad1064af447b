"""Benchmark models: size presets for the test GPT and a MoE transformer and a Wide-ResNet.

Every suite module exposes ``SIZES`` (name -> Config; ``"small"`` runs on 8 CPU devices),
``init(key, config)``, ``make_loss_fn(config)``, ``make_batch(key, config)`` and
``megatron_rules`` / ``expert_rules`` where the baselines need to know parameter roles.
"""
