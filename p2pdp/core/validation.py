"""Validators shared by every module: each raises ConfigError naming the field and the value.

Config sections (:mod:`p2pdp.config`) declare their constraints with these; functions that
take numbers from users (mechanisms, accountants, audits) check them with the same code, so a
value is judged and reported the same way wherever it enters.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2pdp.core.errors import ConfigError


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


# --- declarative constraints of config fields -------------------------------------------------
# Each config field declares its constraint next to its default
# (``field(default=..., metadata=check(Positive()))``) and :func:`validate_fields` applies them,
# so a setting's rule is written once and reported the same way everywhere:
# ``privacy.epsilon must be > 0 and finite, got -1``.


#: Largest integer a setting may take: 2^53, counted exactly by int64 and float64 alike.
MAX_INTEGER = 2**53


def invalid(key: str, requirement: str, value: object) -> ConfigError:
    """The error for setting ``key`` whose ``value`` is not ``requirement``."""
    return ConfigError(f"{key} must be {requirement}, got {value!r}")


def as_list(key: str, value: object) -> tuple:
    """A list setting as a tuple; a lone string or number is refused (write ``[...]``)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
        raise invalid(key, f"a list such as [{value!r}]", value)
    return tuple(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Constraint:
    """A rule one config value must satisfy; :meth:`check` raises ConfigError naming ``key``."""

    def check(self, key: str, value: Any) -> None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Positive(Constraint):
    """A number > 0 (finite unless ``allow_inf``)."""

    allow_inf: bool = False

    def check(self, key: str, value: Any) -> None:
        ok = _is_number(value) and value > 0 and not math.isnan(value)
        if not ok or (math.isinf(value) and not self.allow_inf):
            raise invalid(key, "> 0" + ("" if self.allow_inf else " and finite"), value)


@dataclass(frozen=True, slots=True)
class NonNegative(Constraint):
    """A finite number >= 0."""

    def check(self, key: str, value: Any) -> None:
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise invalid(key, ">= 0 and finite", value)


@dataclass(frozen=True, slots=True)
class IntAtLeast(Constraint):
    """An integer (not a bool) >= ``low``."""

    low: int

    def check(self, key: str, value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < self.low:
            raise invalid(key, f"an integer >= {self.low}", value)
        if value > MAX_INTEGER:  # past what numpy's int64 and float64 count exactly
            raise invalid(key, f"an integer in [{self.low}, 2^53]", value)


@dataclass(frozen=True, slots=True)
class Probability(Constraint):
    """A number in [0, 1) (``open_upper``) or [0, 1]."""

    open_upper: bool = True

    def check(self, key: str, value: Any) -> None:
        inside = _is_number(value) and (
            0.0 <= value < 1.0 if self.open_upper else 0.0 <= value <= 1.0
        )
        if not inside:
            raise invalid(key, "in [0, 1)" if self.open_upper else "in [0, 1]", value)


@dataclass(frozen=True, slots=True)
class Interval(Constraint):
    """A finite number between ``low`` and ``high`` (each end open or closed)."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def check(self, key: str, value: Any) -> None:
        inside = _is_number(value) and math.isfinite(value)
        if inside:
            inside = (value > self.low if self.low_open else value >= self.low) and (
                value < self.high if self.high_open else value <= self.high
            )
        if not inside:
            interval = (
                f"{'(' if self.low_open else '['}{self.low:g}, "
                f"{self.high:g}{')' if self.high_open else ']'}"
            )
            raise invalid(key, f"in {interval}", value)


@dataclass(frozen=True, slots=True)
class OneOf(Constraint):
    """One of a fixed tuple of strings."""

    options: tuple[str, ...]

    def check(self, key: str, value: Any) -> None:
        if value not in self.options:
            raise ConfigError(f"{key} must be one of {', '.join(self.options)}; got {value!r}")


@dataclass(frozen=True, slots=True)
class FileName(Constraint):
    """A plain file name: not empty, ``.`` or ``..``, without a path separator or NUL."""

    def check(self, key: str, value: Any) -> None:
        if (
            not isinstance(value, str)
            or value in ("", ".", "..")
            or any(c in value for c in ("/", "\\", "\0"))
        ):
            raise invalid(key, "a plain file name (no '/', '\\', '.' or '..')", value)


@dataclass(frozen=True, slots=True)
class Boolean(Constraint):
    """``True`` or ``False`` (not 0 or 1)."""

    def check(self, key: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise invalid(key, "true or false", value)


@dataclass(frozen=True, slots=True)
class ComponentName(Constraint):
    """A registered component of ``kind`` or an importable ``package.module:Name``."""

    kind: str
    extra: tuple[str, ...] = ()  # further accepted values, e.g. "auto"

    def check(self, key: str, value: Any) -> None:
        from p2pdp.core import components

        if value not in self.extra:
            components.check(self.kind, value, key)


@dataclass(frozen=True, slots=True)
class Optional(Constraint):
    """``None``, or a value satisfying ``inner``."""

    inner: Constraint

    def check(self, key: str, value: Any) -> None:
        if value is not None:
            self.inner.check(key, value)


@dataclass(frozen=True, slots=True)
class AllOf(Constraint):
    """Every constraint of ``parts``, in order."""

    parts: tuple[Constraint, ...]

    def check(self, key: str, value: Any) -> None:
        for part in self.parts:
            part.check(key, value)


def check(constraint: Constraint) -> dict[str, Constraint]:
    """Field metadata declaring ``constraint``: ``field(default=1.0, metadata=check(...))``."""
    return {"constraint": constraint}


def validate_fields(instance: Any, section: str, names: Mapping[str, str] | None = None) -> None:
    """Check every field of dataclass ``instance`` against its declared constraint.

    ``section`` prefixes the keys in messages (``"privacy"`` -> ``privacy.epsilon``);
    ``names`` maps attribute names to the public names users type (``lam`` -> ``lambda``).
    """
    for item in dataclasses.fields(instance):
        constraint = item.metadata.get("constraint")
        if constraint is not None:
            name = (names or {}).get(item.name, item.name)
            key = f"{section}.{name}" if section else name
            constraint.check(key, getattr(instance, item.name))


class Derived(float):
    """A float setting computed from other settings (e.g. ``privacy.delta_per_aggregation``).

    It compares, prints and computes like the float it holds; its type only tells
    ``__post_init__`` to compute it again when a copy changes the settings it depends on, and
    the refusal of unread settings to count it as a default (:func:`p2pdp.config.unread_settings`).
    """

    __slots__ = ()
