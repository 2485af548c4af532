"""Argument checks shared by the library's modules (clear errors naming what was expected)."""
from __future__ import annotations


def positive_int(value, name: str) -> int:
    """``value`` if it is an int >= 1 (bool excluded), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value
