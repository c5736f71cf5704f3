"""The command line over a scenario file: ``--unset KEY`` and ``--set KEY=VALUE`` applied to
the file's settings and sweep axes, and the error that names the argument that caused it.

:func:`~p2pdp.experiments.scenarios.scenario.parse_scenario` applies the ``--unset`` keys
(:func:`_apply_unset`), then the ``--set`` overrides in order (:func:`_apply_overrides`),
recording which argument last changed each key; when the result is invalid only because of
them, :func:`_blamed` names those arguments and, for keys whose zipped sweep axis they broke
up, how to set them together.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from p2pdp.core.errors import ConfigError
from p2pdp.experiments.scenarios.document import (
    _NO_VALUE,
    _TOP_LEVEL,
    Axis,
    _default,
    _parse_override,
    _read_document,
    _toml_keys,
    _unknown,
)


def _apply_unset(
    settings: dict[str, Any],
    axes: list[Axis],
    unset: Sequence[str],
    *,
    source: str,
    origin: dict[str, str],
    loose: dict[str, str],
) -> list[Axis]:
    """Drop each ``--unset`` key from ``settings`` (in place) and from the sweep: the axes
    left; records in ``origin`` the argument that dropped each key and in ``loose`` the keys
    it left swept on their own (see
    :func:`~p2pdp.experiments.scenarios.scenario.parse_scenario`)."""
    for name in unset:
        where = f"--unset {name}"
        key = _unset_key(name, where)
        if key in origin:  # dropped by an earlier --unset: the file does set it
            raise ConfigError(f"{where} is given twice; drop one")
        if key not in settings and not any(key in axis.keys for axis in axes):
            raise ConfigError(
                f"{where}: {source} does not set {key}, so it already has its default "
                f"({_default(key)!r}); drop the --unset"
            )
        settings.pop(key, None)
        axes = _without_key(axes, key, where, loose)
        origin[key] = where
    return axes


def _apply_overrides(
    settings: dict[str, Any],
    axes: list[Axis],
    overrides: Sequence[str],
    origin: dict[str, str],
    released: dict[str, str],
    loose: dict[str, str],
) -> list[Axis]:
    """Apply each ``--set`` override to ``settings`` (in place) and to the sweep: the axes
    left; records in ``origin``, ``released`` and ``loose`` which argument set each key, took
    its zipped axis away or left its zipped partner swept alone (see
    :func:`~p2pdp.experiments.scenarios.scenario.parse_scenario`)."""
    for override in overrides:
        where = f"--set {override}"
        override_settings, override_axes = _read_document(_parse_override(override), where)
        swept = [k for axis in override_axes for k in axis.keys]
        kept = []
        for axis in axes:
            if any(key in axis.keys for key in swept):  # a new axis replaces the whole old one
                released.update({k: where for k in axis.keys if k not in swept})
            else:
                kept.append(axis)
        for key in override_settings:  # a plain setting leaves its zipped partners swept
            kept = _without_key(kept, key, where, loose)
        for key in [*override_settings, *swept]:
            origin[key] = where
            released.pop(key, None)
            loose.pop(key, None)
        settings.update(override_settings)
        axes = [*kept, *override_axes]
    return axes


def _blamed(
    error: ConfigError,
    source: str,
    arguments: Sequence[str],
    file_only: tuple[dict[str, Any], list[Axis]],
    *,
    origin: dict[str, str],
    released: dict[str, str],
    loose: dict[str, str],
) -> ConfigError:
    """``error`` (a scenario the command-line ``arguments`` made invalid) naming the
    arguments it mentions, with hints for the keys whose sweep they changed and those that
    come from the file."""
    message = str(error).removeprefix(f"{source}: ")
    mentioned = {where for key, where in origin.items() if _mentions(message, key)}
    blamed = [where for where in arguments if where in mentioned] or arguments
    hints = [
        f"{key} is no longer swept because {where} replaced the sweep axis it shared, so "
        f"it has its base value; set it too (--set {key}=VALUE) or sweep both together "
        f"(--set 'sweep.\"{','.join(_zipped_with(key, file_only[1]))}\"=[[...], ...]')"
        for key, where in released.items()
        if _mentions(message, key)
    ]
    hints += [
        f"{key} is still swept on its own because {where} fixed the other key of their "
        f"zipped axis; set it too (--set {key}=VALUE) or sweep both together"
        for key, where in loose.items()
        if _mentions(message, key)
    ]
    hints += [
        f"{key} = {value!r} comes from {source}"
        for key, value in file_only[0].items()
        if key not in origin and _mentions(message, key)
    ]
    hint = f" ({'; '.join(hints)})" if hints else ""
    return ConfigError(f"{', '.join(blamed)}: {message}{hint}")


def _unset_key(name: str, where: str) -> str:
    """The setting ``--unset name`` names (a dotted public name, or ``seed``...); ConfigError
    naming the closest valid key if there is none."""
    key = name.strip()
    valid = [*_TOP_LEVEL, *_toml_keys()]
    if key not in valid:
        raise _unknown(where, key, _NO_VALUE, valid)
    return key


def _without_key(axes: Sequence[Axis], key: str, where: str, loose: dict[str, str]) -> list[Axis]:
    """``axes`` with ``key`` no longer swept; its zipped partners stay swept, and ``loose``
    records that ``where`` left them on their own."""
    kept = []
    for axis in axes:
        if key in axis.keys:
            loose.update({k: where for k in axis.keys if k != key})
        left = axis.without(key)
        if left is not None:
            kept.append(left)
    return kept


def _mentions(message: str, key: str) -> bool:
    """True if ``message`` names the dotted setting ``key`` (not just a longer key, nor a
    quoted value or hyphenated name such as ``'seed-laplace'``). A top-level key, a plain
    word (``seed``, ``name``), counts only as ``key =`` or ``key must``."""
    name = rf"(?<![\w.'\-]){re.escape(key)}(?![\w'\-])"
    if "." not in key:
        name += r"(?=\s*=|\s+must\b)"
    return re.search(name, message) is not None


def _zipped_with(key: str, axes: Sequence[Axis]) -> tuple[str, ...]:
    """The keys of the axis holding ``key`` (``(key,)`` if none does)."""
    return next((axis.keys for axis in axes if key in axis.keys), (key,))
