"""Byte sizes written by people (``"16GiB"``, ``"512MB"``): parsed for the options and the plugin's
environment alike. Pure string parsing (no jax, no C++ core)."""
from __future__ import annotations

import re

_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1,
          "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15,
          "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30,
          "ti": 2**40, "tib": 2**40, "pi": 2**50, "pib": 2**50}


def parse_bytes(text: str, name: str, error: type[Exception]) -> int:
    """``"16GiB"``, ``"512MB"``, ``"1.5G"``, ``"1048576"`` -> bytes (binary Ki/Mi/Gi, decimal K/M/G).

    ``name``: what the text was given as (e.g. ``ALPA_PASS_MEMORY_BUDGET``), named in the message
    of ``error`` (an exception class) raised for text that is not a whole number of bytes.
    """
    m = _BYTES.match(text)
    unit = (m.group(2) or "").lower() if m else None
    if m is None or unit not in _UNITS:
        raise error(f"{name}={text!r} is not a size; write a number with an optional unit, "
                    f"e.g. '16GiB', '512MB', '1.5G' or '1048576' (bytes)")
    value = float(m.group(1)) * _UNITS[unit]
    if value != int(value):
        raise error(f"{name}={text!r} is not a whole number of bytes")
    return int(value)
