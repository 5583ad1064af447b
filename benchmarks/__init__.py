"""Benchmark suites (never run by CI): models with size presets, hand-written baselines, reports."""
