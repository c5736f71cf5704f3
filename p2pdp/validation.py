"""Validators shared by every module: each raises ConfigError naming the field and the value.

Config sections (:mod:`p2pdp.config`) declare their constraints with these; functions that
take numbers from users (mechanisms, accountants, audits) check them with the same code, so a
value is judged and reported the same way wherever it enters.
"""

from __future__ import annotations

import math

import numpy as np

from p2pdp.errors import ConfigError


def require_positive(name: str, value: float) -> float:
    """``value`` as a float, or ConfigError unless it is finite and > 0."""
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"{name} must be > 0 and finite, got {value!r}")
    return number


def require_probability(
    name: str,
    value: float,
    *,
    low: float = 0.0,
    high: float = 1.0,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a float, or ConfigError unless it lies in the interval ``low..high``.

    ``low_open`` / ``high_open`` exclude the end points.
    """
    number = float(value)
    above = number > low if low_open else number >= low
    below = number < high if high_open else number <= high
    if not (math.isfinite(number) and above and below):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(f"{name} must be in {interval}, got {value!r}")
    return number


def require_count(name: str, value: int, *, minimum: int = 1) -> int:
    """``value`` as an int, or ConfigError unless it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
