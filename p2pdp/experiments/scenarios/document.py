"""A scenario document's text -> dotted settings and sweep axes, each key known and each
value of its field's type.

A scenario file is TOML (:func:`parse_toml`: an error names the file, line and column); its
top-level keys, section tables and ``[sweep]`` are flattened to ``{"section.field": value}``
and :class:`Axis` es (:func:`_read_document`), public key names only (``training.lambda``),
values coerced to the field's type (int -> float, list -> tuple). An unknown key names the
closest valid one, a value of the wrong type the type (and options) it could take. What the
settings mean together is :class:`p2pdp.experiments.scenarios.scenario.Scenario`'s to check.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from p2pdp.config import (
    SECTIONS,
    ScenarioConfig,
    field_key,
    public_key,
)
from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import OneOf

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

#: Top-level settings of a scenario file (everything of ScenarioConfig but its sections).
_TOP_LEVEL = tuple(f.name for f in dataclasses.fields(ScenarioConfig) if f.name not in SECTIONS)


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis of the grid: ``keys`` (dotted field names) and one value tuple per point.

    A plain axis has one key (``values = ((1,), (2,), (5,))``); a zipped axis has several
    keys that vary together (``values = ((0.1, 0.01), (1.0, 0.1))``).
    """

    keys: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]

    def public(self) -> Axis:
        """The same axis with public key names (``"training.lam"`` -> ``"training.lambda"``)."""
        return Axis(tuple(public_key(k) for k in self.keys), self.values)

    def without(self, key: str) -> Axis | None:
        """This axis with ``key`` removed (``None`` if nothing is left)."""
        if key not in self.keys:
            return self
        keep = [i for i, k in enumerate(self.keys) if k != key]
        if not keep:
            return None
        return Axis(
            tuple(self.keys[i] for i in keep), tuple(tuple(v[i] for i in keep) for v in self.values)
        )


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """The TOML document ``text``; ConfigError naming ``source``, line and column if invalid."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        line, column = getattr(exc, "lineno", None), getattr(exc, "colno", None)
        if line is None:  # Python < 3.14: the position is only in the message
            found = re.search(r"\(at line (\d+), column (\d+)\)", message)
            last_line = text.rsplit("\n", 1)[-1]
            line, column = found.groups() if found else (text.count("\n") + 1, len(last_line) + 1)
        reason = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", message)
        raise ConfigError(f"{source}:{line}:{column}: invalid TOML: {reason}") from None


def _parse_override(override: str) -> dict[str, Any]:
    key, equals, value = override.partition("=")
    if not equals or not key.strip():
        raise ConfigError(f"--set {override}: expected key.path=value")
    for candidate in (value, json.dumps(value.strip())):
        try:
            return tomllib.loads(f"{key.strip()} = {candidate}")
        except tomllib.TOMLDecodeError:
            continue
    raise ConfigError(f"--set {override}: {key.strip()!r} is not a valid dotted key")


def _read_document(document: Mapping[str, Any], where: str) -> tuple[dict[str, Any], list[Axis]]:
    """Flatten a parsed document to ``{"section.field": value}`` and sweep axes, type-checked."""
    settings: dict[str, Any] = {}
    axes: list[Axis] = []
    hints = typing.get_type_hints(ScenarioConfig)
    for key, value in document.items():
        if key in _TOP_LEVEL:
            settings[key] = _coerce(value, hints[key], key, where)
        elif key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {key} must be a table ([{key}]), got {value!r}")
            for name, item in value.items():
                setting_key, hint = _resolve(f"{key}.{name}", item, where)
                settings[setting_key] = _coerce(item, hint, f"{key}.{name}", where)
        elif key == "sweep":
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: sweep must be a table ([sweep]), got {value!r}")
            if not value and where.startswith("--set "):  # merged into the file's: no change
                raise ConfigError(
                    f"{where}: an empty sweep changes nothing (the file's axes stay); to stop "
                    "sweeping a key, --set it to one value or --unset it"
                )
            axes.extend(_read_axis(name, values, where) for name, values in value.items())
        else:
            raise _unknown(where, key, value, [*_TOP_LEVEL, *SECTIONS, "sweep"])
    for key in (k for axis in axes for k in axis.keys if k in settings):
        raise ConfigError(
            f"{where}: {_toml_key(key)} is set both in its table and in [sweep]; keep one"
        )
    return settings, axes


def _read_axis(name: str, values: Any, where: str) -> Axis:
    parts = [part.strip() for part in name.split(",")]
    path = f'sweep."{name}"'
    if not isinstance(values, list):
        raise ConfigError(f"{where}: {path} must be a list of values, got {values!r}")
    resolved = [_resolve(part, values, where) for part in parts]
    rows = []
    for value in values:
        row = value if len(parts) > 1 else [value]
        if len(parts) > 1 and (not isinstance(value, list) or len(value) != len(parts)):
            raise ConfigError(
                f"{where}: {path} must list [{', '.join(parts)}] tuples of {len(parts)} "
                f"values, got {value!r}"
            )
        point = tuple(
            _coerce(v, hint, part, where)
            for v, part, (_, hint) in zip(row, parts, resolved, strict=True)
        )
        if point in rows:  # one grid point twice would run its cells twice under one name
            raise ConfigError(
                f"{where}: {path} lists {value!r} twice; each value is one grid point"
            )
        rows.append(point)
    return Axis(tuple(key for key, _ in resolved), tuple(rows))


def _resolve(dotted: str, value: Any, where: str) -> tuple[str, Any]:
    """``"training.lambda"`` -> (``"training.lambda"``, the type hint of ``lam``).

    Only public names are accepted (``"training.lam"`` fails with "did you mean
    'training.lambda'?"), so a file, ``--set`` and the results all spell a setting one way.
    """
    section, _, name = dotted.partition(".")
    if section not in SECTIONS:
        raise _unknown(where, dotted, value, list(_toml_keys()))
    public_to_field = {
        public_key(f"{section}.{f.name}").partition(".")[2]: f.name
        for f in dataclasses.fields(SECTIONS[section])
    }
    if name not in public_to_field:
        raise _unknown(where, dotted, value, [f"{section}.{n}" for n in public_to_field])
    field_name = public_to_field[name]
    return dotted, typing.get_type_hints(SECTIONS[section])[field_name]


def _default(key: str) -> Any:
    """The default value of the dotted setting ``key`` (or top-level, ``"seed"``)."""
    section, dot, name = field_key(key).partition(".")
    if not dot:
        return next(f.default for f in dataclasses.fields(ScenarioConfig) if f.name == key)
    return getattr(SECTIONS[section](), name)


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _toml_key(key: str) -> str:
    """``"training.lam"`` -> ``"training.lambda"`` (the name a scenario file uses)."""
    return public_key(key)


def _toml_keys() -> Iterable[str]:
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            yield public_key(f"{section}.{f.name}")


#: ``_unknown``'s value for a key given without one (``--unset KEY``).
_NO_VALUE = object()


def _unknown(where: str, key: str, value: Any, valid: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
    given = "" if value is _NO_VALUE else f" (value {value!r})"
    return ConfigError(f"{where}: unknown key {key!r}{given}; {hint}")


def _coerce(value: Any, hint: Any, key: str, where: str) -> Any:
    """Check ``value`` against the field type ``hint``; int -> float, list -> tuple."""
    origin = typing.get_origin(hint)
    if origin is tuple:
        if isinstance(value, list):
            item = typing.get_args(hint)[0]
            return tuple(_coerce(v, item, key, where) for v in value)
    elif origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            if option is not type(None):
                try:
                    return _coerce(value, option, key, where)
                except ConfigError:
                    continue
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, hint):
        return value
    raise ConfigError(f"{where}: {key} must be {_describe(hint)}{_options(key)}, got {value!r}")


def _options(key: str) -> str:
    """`` (one of data, manifest)`` for a setting that takes one of fixed strings, else ``""``:
    a value of the wrong type is told the values it could take."""
    section, dot, name = field_key(key).partition(".")
    if not dot or section not in SECTIONS:
        return ""
    found = [f for f in dataclasses.fields(SECTIONS[section]) if f.name == name]
    constraint = found[0].metadata.get("constraint") if found else None
    if isinstance(constraint, OneOf):
        return f" (one of {', '.join(constraint.options)})"
    return ""


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is tuple:
        return f"a list (each item {_describe(typing.get_args(hint)[0])})"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint) if a is not type(None))
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))
