"""Checks where the engine receives a component's output: one line naming what went wrong.

Every component kind (dataset, model, mechanism, accountant, sampler, ensemble rule, task) is
called by the engine at a few places; there, and only there, its output is checked before
the engine uses it: numbers where numbers are expected (finite, numeric, of the right shape),
the right type where a type is expected (a privacy event, the model's weights). A component
that raises an exception other than p2pdp's own, or returns something else, stops the run
with one :class:`~p2pdp.core.errors.ComponentError`:

    mechanism 'my_noise:Mine'.sample returned 58 NaN/inf values in an array of shape (58,)

The checks are vectorised (one ``np.isfinite(...).all()`` per array); the two that would run
once per group (a sampler's group, a task's sensitivity) run for plug-ins only
(:func:`is_builtin`), so a sweep of built-in components pays well under 2% for them all
(``benchmarks/compare_revisions.py``). They guard the engine against mistakes, not against a
malicious plug-in, which runs in-process anyway.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from p2pdp.core.errors import ComponentError, P2PDPError

__all__ = [
    "calling",
    "check_methods",
    "check_number",
    "check_numbers",
    "check_type",
    "component_name",
    "is_builtin",
    "problem",
    "read_only",
]


def read_only(array: np.ndarray) -> np.ndarray:
    """``array`` itself, made read-only: what a component is handed (or what the engine keeps
    fitted) cannot be changed under the arrays that share it."""
    array.flags.writeable = False
    return array


def component_name(component: Any) -> str:
    """``"package.module:Name"`` of a class, function or instance (its class)."""
    target = component if isinstance(component, type) or callable(component) else type(component)
    if not hasattr(target, "__qualname__"):
        target = type(component)
    return f"{target.__module__}:{target.__qualname__}"


def is_builtin(component: Any) -> bool:
    """Whether ``component`` is p2pdp's own (tested with the engine): checks that would run
    once per group, the hot path, are kept for components from outside the package."""
    return component_name(component).startswith("p2pdp.")


def problem(kind: str, component: Any, method: str, what: str) -> ComponentError:
    """``ComponentError("<kind> '<import string>'.<method> <what>")``."""
    return ComponentError(f"{kind} {component_name(component)!r}.{method} {what}")


class calling:
    """Turn an exception raised inside ``component.method`` into a one-line ComponentError.

    ``with calling("mechanism", mechanism, "sample"): noise = mechanism.sample(...)``.
    p2pdp's own errors (a ConfigError a component raises on purpose) pass unchanged; the
    original exception stays attached as ``__cause__`` for debugging. A class, not a
    generator-based context manager: it runs once per group, so it must cost little.
    """

    __slots__ = ("component", "kind", "method")

    def __init__(self, kind: str, component: Any, method: str) -> None:
        self.kind, self.component, self.method = kind, component, method

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> None:
        if error is None or isinstance(error, P2PDPError) or not isinstance(error, Exception):
            return
        what = f"raised {type(error).__name__}: {error}"
        raise problem(self.kind, self.component, self.method, what) from error


def check_numbers(
    value: Any,
    kind: str,
    component: Any,
    method: str,
    *,
    shape: Sequence[int | None] | None = None,
    finite: bool = True,
) -> np.ndarray:
    """``value`` as a float64 array, if it is numeric, of ``shape`` (None: any length there)
    and (``finite``) free of NaN and inf; else a ComponentError saying which."""
    try:
        array = np.asarray(value)
    except Exception as exc:  # e.g. ragged sequences
        raise problem(kind, component, method, f"returned no array ({exc})") from None
    if array.dtype.kind not in "biuf":
        raise problem(
            kind,
            component,
            method,
            f"returned {type(value).__name__} of dtype {array.dtype}, not numbers",
        )
    if shape is not None and (
        array.ndim != len(shape)
        or any(
            want is not None and got != want for got, want in zip(array.shape, shape, strict=True)
        )
    ):
        wanted = "(" + ", ".join("any" if n is None else str(n) for n in shape) + ")"
        raise problem(kind, component, method, f"returned shape {array.shape}, expected {wanted}")
    array = array.astype(np.float64, copy=False)
    if finite and not np.isfinite(array).all():
        bad = int(np.size(array) - np.isfinite(array).sum())
        raise problem(
            kind,
            component,
            method,
            f"returned {bad} NaN/inf values in an array of shape {array.shape}",
        )
    return array


def check_number(
    value: Any, kind: str, component: Any, method: str, *, low: float = 0.0, inf: bool = False
) -> float:
    """``value`` as a float >= ``low``, finite unless ``inf``; else a ComponentError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise problem(kind, component, method, f"returned {value!r}, not a number") from None
    if math.isnan(number) or number < low or (not inf and math.isinf(number)):
        bound = f">= {low:g}" + ("" if inf else ", finite")
        raise problem(kind, component, method, f"returned {number!r}, expected a number {bound}")
    return number


def check_type(value: Any, types: type | tuple[type, ...], kind: str, component: Any, method: str):
    """``value`` unchanged if it is an instance of ``types``; else a ComponentError."""
    if not isinstance(value, types):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise problem(kind, component, method, f"returned {value!r}, not a {names}")
    return value


def check_methods(target: Any, kind: str, methods: Sequence[str], protocol: str) -> None:
    """ComponentError unless ``target`` has every one of ``methods`` (callable)."""
    missing = [name for name in methods if not callable(getattr(target, name, None))]
    if missing:
        raise ComponentError(
            f"{kind} {component_name(target)!r} does not follow the {kind} protocol: it lacks "
            f"{', '.join(missing)} (see {protocol})"
        )
