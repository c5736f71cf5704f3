"""Scenario files (TOML) -> a validated :class:`Scenario`: a base config plus sweep axes.

A scenario file has top-level ``name``, ``seed`` and ``repetitions``, one table per section of
:data:`p2pdp.config.tables.SECTIONS` (``[data]``, ``[training]`` (key ``lambda``),
``[privacy]``, ...) and an optional ``[sweep]`` table whose keys are dotted settings and whose
lists are grid axes::

    [sweep]
    "groups.group_size" = [1, 2, 5]
    "publication.mode" = ["group", "full"]
    "privacy.epsilon,privacy.epsilon_per_aggregation" = [[0.1, 0.01], [1, 0.1]]

A comma-joined key is a *zipped* axis: its keys vary together (one tuple of values per grid
point) instead of forming a product, e.g. to keep ``epsilon / epsilon_per_aggregation`` fixed.
The grid is the cartesian product of the axes.

The sweep belongs to the scenario alone (:attr:`Scenario.axes`); a
:class:`~p2pdp.config.ScenarioConfig` is one grid point's settings.

Every error is a :class:`~p2pdp.core.errors.ConfigError` naming the file (or the ``--set``
argument), the key path, the bad value and, for an unknown key, the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import itertools
import json
import os
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pdp.config import (
    SECTIONS,
    ScenarioConfig,
    field_key,
    public_key,
    refuse_unread,
    setting_value,
    settings_read,
    unread_reason,
    unread_settings,
)
from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import OneOf
from p2pdp.experiments.scenarios.disclosure import LAMBDA_SWEPT

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


@dataclass(frozen=True, slots=True)
class GridPoint:
    """Grid point number ``index``: the swept ``settings`` and the resulting ``config``."""

    index: int
    settings: dict[str, Any]
    config: ScenarioConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A base config, the sweep axes, and where they came from.

    Parameters
    ----------
    config : ScenarioConfig
        Settings shared by every grid point (the scenario owns the sweep: a config has none).
    axes : tuple of Axis
        Grid axes; the grid is their cartesian product (one point if there are none).
    text : str
        The scenario file's text (recorded in the results manifest).
    source : str
        The file path, or a description, used in error messages and the manifest.
    overrides : tuple of str
        The ``--set`` arguments applied on top of the file.
    unset : tuple of str
        The ``--unset`` keys: settings of the file dropped (before the overrides) so that
        their defaults apply.
    drop_unread : tuple of str
        Settings of the base config that are reset to their defaults, and listed in
        :attr:`dropped`, when no point reads them, instead of refused: the settings of a file
        that only its ``--set`` arguments left unread (:func:`parse_scenario`).

    Attributes
    ----------
    points : tuple of GridPoint
        Every distinct grid point, validated on construction (an invalid combination raises
        :class:`ConfigError` naming the source and the point). A point keeps only the
        settings its components read (:func:`p2pdp.config.settings_read`; the others take
        their defaults and its ``settings`` omit them), so combinations that differ only in
        settings nobody reads there are one point. A setting of the file that no point reads
        is refused.
    unread_axes : tuple of str
        Swept settings that no point reads (their values collapse into one point).
    dropped : tuple of str
        Why each setting of ``drop_unread`` that no point reads was dropped, e.g.
        ``"groups.group_size = 1 is read only with protocol.name = 'one-shot' (here 'dpsgd')"``.
    read : frozenset of str
        Every setting some point reads.
    digest : str
        SHA-256 of the effective settings (base config and axes), hex: equal digests mean
        the same experiment, whatever the file's comments or formatting.
    """

    config: ScenarioConfig
    axes: tuple[Axis, ...] = ()
    text: str = ""
    source: str = "<scenario>"
    overrides: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()
    drop_unread: tuple[str, ...] = ()
    points: tuple[GridPoint, ...] = field(init=False, repr=False, compare=False)
    unread_axes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    dropped: tuple[str, ...] = field(init=False, repr=False, compare=False)
    read: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", tuple(axis.public() for axis in self.axes))
        seen: set[str] = set()
        for axis in self.axes:
            if not axis.values:
                raise ConfigError(
                    f'{self.source}: sweep."{",".join(map(_toml_key, axis.keys))}" has no '
                    "values, so the grid would have zero cells"
                )
            if any(len(values) != len(axis.keys) for values in axis.values):
                raise ConfigError(
                    f"{self.source}: every value of the sweep axis {axis.keys} must be a tuple "
                    f"of {len(axis.keys)} values, got {axis.values}"
                )
            for key in axis.keys:
                section, _, name = field_key(key).partition(".")
                if section not in SECTIONS or name not in _field_names(SECTIONS[section]):
                    raise ConfigError(f"{self.source}: sweep key {key!r} is not a section setting")
                if key in seen:
                    raise ConfigError(f"{self.source}: sweep key {key!r} appears on two axes")
                seen.add(key)
        # A swept lambda is chosen on the data by whoever reads the results: say so in every
        # point (and so in every results row) unless the file explains its own lambda_source.
        fill = {}
        if "training.lambda" in seen and not self.config.training.lambda_source:
            fill = {"training.lambda_source": LAMBDA_SWEPT}
        # A point takes only the settings its components read: the others go back to their
        # defaults (its rows leave them empty), and points that then coincide are one.
        points: dict[ScenarioConfig, GridPoint] = {}
        read_anywhere: set[str] = set()
        for combination in itertools.product(*(a.values for a in self.axes)):
            settings = {
                key: value
                for axis, values in zip(self.axes, combination, strict=True)
                for key, value in zip(axis.keys, values, strict=True)
            }
            try:
                config = with_values(self.config, {**settings, **fill})
                read = settings_read(config, None)  # on either runtime (the runner checks)
                unread = [*unread_settings(config, read), *(k for k in settings if k not in read)]
                if unread:
                    config = with_values(config, {key: _default(key) for key in unread})
                    settings = {k: v for k, v in settings.items() if k not in unread}
            except ConfigError as exc:
                raise ConfigError(f"{self.source}: sweep point {settings}: {exc}") from None
            read_anywhere.update(read)
            if config not in points:
                points[config] = GridPoint(len(points), settings, config)
        object.__setattr__(self, "points", tuple(points.values()))
        object.__setattr__(
            self, "unread_axes", tuple(key for key in self.swept_keys() if key not in read_anywhere)
        )
        object.__setattr__(self, "read", frozenset(read_anywhere))
        fixed = [k for k in unread_settings(self.config, read_anywhere) if k not in seen]
        dropped = [k for k in fixed if k in self.drop_unread]
        read = settings_read(self.config, None) if fixed else {}
        try:
            refuse_unread([k for k in fixed if k not in dropped], self.config, read)
        except ConfigError as exc:
            raise ConfigError(f"{self.source}: {exc}") from None
        # read by no point: resetting them changes no cell, only the base (and the digest)
        object.__setattr__(
            self, "dropped", tuple(unread_reason(k, self.config, read) for k in dropped)
        )
        if dropped:
            object.__setattr__(
                self, "config", with_values(self.config, {k: _default(k) for k in dropped})
            )

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def digest(self) -> str:
        return hashlib.sha256(repr((self.config, self.axes)).encode("utf-8")).hexdigest()

    def swept_keys(self) -> tuple[str, ...]:
        """Every swept setting (public names, e.g. ``"training.lambda"``), in axis order."""
        return tuple(key for axis in self.axes for key in axis.keys)


def scenario_changes(old: Scenario, new: Scenario) -> list[tuple[str, Any, Any]]:
    """How ``new``'s effective settings differ from ``old``'s: ``(key, old value, new value)``
    for each base setting that is not swept in either, then ``('sweep."k1,k2"', old values,
    new values)`` for each sweep axis that differs (``None``: no such axis), then
    ``("sweep order", old, new)`` if the axes that both have are in another order (the order
    numbers the grid points)."""
    swept = {*old.swept_keys(), *new.swept_keys()}
    changes = [
        (key, setting_value(old.config, key), setting_value(new.config, key))
        for key in (*_TOP_LEVEL, *_toml_keys())
        if key not in swept and setting_value(old.config, key) != setting_value(new.config, key)
    ]
    before, after = ({axis.keys: axis.values for axis in s.axes} for s in (old, new))
    changes += [
        (f'sweep."{",".join(keys)}"', before.get(keys), after.get(keys))
        for keys in dict.fromkeys([*before, *after])
        if before.get(keys) != after.get(keys)
    ]
    order = [
        [",".join(keys) for keys in axes if keys in before and keys in after]
        for axes in (before, after)
    ]
    if order[0] != order[1]:  # the grid's order numbers its points
        changes.append(("sweep order", order[0], order[1]))
    return changes


def format_change(change: tuple[str, Any, Any]) -> str:
    """One item of :func:`scenario_changes` as text: ``"evaluation.folds [0] -> [0, 1]"``."""
    key, before, after = change

    def shown(value: Any) -> str:
        if key.startswith("sweep.") and value is not None:  # one tuple per grid value
            value = [v[0] if len(v) == 1 else list(v) for v in value]
        return repr(list(value) if isinstance(value, tuple) else value)

    return f"{key} {shown(before)} -> {shown(after)}"


def with_values(config: ScenarioConfig, settings: Mapping[str, Any]) -> ScenarioConfig:
    """A copy of ``config`` with several dotted settings changed at once.

    Unlike applying :func:`p2pdp.config.with_value` key by key, only the final combination is
    validated, so ``{"privacy.epsilon": 0.01, "privacy.epsilon_per_aggregation": 0.001}`` or
    ``{"partition.n_peers": 10, "groups.group_size": 10}`` never pass through an invalid
    intermediate config. Keys must be known (the loader checks them); public names
    (``"training.lambda"``) and attribute paths (``"training.lam"``) are both accepted.
    """
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in settings.items():
        section, dot, name = field_key(key).partition(".")
        if dot:
            sections.setdefault(section, {})[name] = value
        else:
            top[key] = value
    replaced = {
        section: dataclasses.replace(getattr(config, section), **fields)
        for section, fields in sections.items()
    }
    return dataclasses.replace(config, **top, **replaced)


def with_settings(
    config: ScenarioConfig, settings: Mapping[str, Any], where: str
) -> ScenarioConfig:
    """A copy of ``config`` with ``settings``, shaped like a scenario file (``{"privacy":
    {"epsilon": 1.0}, "seed": 3}``), applied over it as ``--set`` would: unknown keys are
    refused naming the closest valid one, values are type-checked, a sweep is refused (one
    config is one grid point). ``where`` names the caller in errors."""
    values, axes = _read_document(settings, where)
    if axes:
        raise ConfigError(f"{where}: a sweep is several configs; give each setting one value")
    try:
        return with_values(config, values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# --- loading ----------------------------------------------------------------------------------
def shipped_scenarios_dir() -> Path:
    """Directory of the shipped scenarios: ``p2pdp/_scenarios`` (wheel) or ``<repo>/scenarios``."""
    package_dir = Path(__file__).resolve().parents[2]  # p2pdp/, two up from scenarios/
    installed = package_dir / "_scenarios"
    return installed if installed.is_dir() else package_dir.parent / "scenarios"


def find_scenario(name_or_path: str | Path) -> Path:
    """``name_or_path`` if it is a file, else the shipped scenario of that name.

    ``"quickstart"`` and ``"quickstart.toml"`` both find ``scenarios/quickstart.toml``.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError(
            f"scenario {str(name_or_path)!r} is a folder, not a scenario file: give a .toml "
            "file (or a shipped scenario's name)"
        )
    shipped = shipped_scenarios_dir() / f"{path.name.removesuffix('.toml')}.toml"
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    stems = sorted(p.stem for p in shipped_scenarios_dir().glob("*.toml"))
    close = difflib.get_close_matches(path.name.removesuffix(".toml"), stems, n=1)
    hint = f"did you mean {close[0]!r}? " if close and path.parent == Path(".") else ""
    raise ConfigError(
        f"scenario file {str(name_or_path)!r} not found ({hint}no such file; shipped "
        f"scenarios: {', '.join(stems)})"
    )


def load_scenario(
    path: str | Path, overrides: Sequence[str] = (), unset: Sequence[str] = ()
) -> Scenario:
    """Read, check and validate a scenario file.

    Parameters
    ----------
    path : str or Path
        A TOML file, or the name of a shipped scenario (see :func:`find_scenario`).
    overrides : sequence of str
        ``"key.path=value"`` settings applied after the file (see :func:`parse_scenario`).
    unset : sequence of str
        Settings of the file to drop, so that their defaults apply (``--unset``).
    """
    file = find_scenario(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read scenario file: {exc}") from None
    if not overrides and not unset and not parse_toml(text, str(file)):
        raise ConfigError(
            f"{file}: the scenario file sets nothing (it is empty or only comments), so every "
            'setting would take its default; give it a table (e.g. [data] name = "spambase") '
            "or run a shipped scenario (p2pdp run quickstart)"
        )
    return parse_scenario(text, source=str(file), overrides=overrides, unset=unset)


def scenario_from_mapping(document: Mapping[str, Any], *, source: str = "<mapping>") -> Scenario:
    """A scenario from a mapping shaped like a scenario file (tables as dicts, ``sweep``)."""
    settings, axes = _read_document(document, source)
    return _build(settings, axes, text=repr(dict(document)), source=source, overrides=())


def config_of(value: Any) -> ScenarioConfig:
    """The one config ``value`` describes: a ScenarioConfig, a Scenario, a shipped scenario's
    name or a file path, or a mapping like a scenario file. A scenario that sweeps several
    grid points is refused (say which point: ``load_scenario(name).points[i].config``)."""
    if isinstance(value, ScenarioConfig):
        return value
    if isinstance(value, (str, os.PathLike)):
        value = load_scenario(os.fspath(value))
    elif isinstance(value, Mapping):
        value = scenario_from_mapping(value)
    if not isinstance(value, Scenario):
        raise ConfigError(
            "config must be a ScenarioConfig, a scenario name or file, or a mapping shaped like "
            f"a scenario file; got {type(value).__name__}"
        )
    if len(value.points) > 1:
        raise ConfigError(
            f"{value.source} sweeps {len(value.points)} grid points and one config runs one: "
            f"pass load_scenario(...).points[i].config, i in [0, {len(value.points)})"
        )
    return value.points[0].config


def parse_scenario(
    text: str,
    *,
    source: str = "<string>",
    overrides: Sequence[str] = (),
    unset: Sequence[str] = (),
) -> Scenario:
    """Parse scenario TOML ``text``; ``source`` names it in error messages.

    ``unset`` are dotted keys (``--unset groups.group_size``) that the file sets, in its
    tables or in ``[sweep]``: each is dropped, so its default applies; a swept key leaves the
    sweep (the other keys of its zipped axis stay swept, as with a plain ``--set``). They are
    applied before the overrides.

    ``overrides`` are ``"key.path=value"`` strings, applied in order. The value is read as a
    TOML value (``20``, ``1e-3``, ``[1, 2]``, ``true``, ``"full"``), else taken as a string
    (``publication.mode=group``). A plain override (``--set privacy.epsilon=1``) removes that
    key from the sweep; the other keys of its zipped axis stay swept. A sweep override (``--set
    'sweep."privacy.epsilon"=[0.1,1]'``) replaces every axis that contains its keys; the other
    keys of a replaced zipped axis (here ``privacy.epsilon_per_aggregation``) are no longer
    swept and take their base value (the file's table, else the default).

    A setting of the file's tables that the file's cells read but that, after the overrides
    (``--set protocol.name=dpsgd``), no cell reads is dropped (its default applies) and
    explained in :attr:`Scenario.dropped`, instead of refused: it could change no cell.

    Raises
    ------
    ConfigError
        For malformed TOML (with line and column), unknown keys (with the closest valid key),
        values of the wrong type, invalid settings, or an empty axis. An error that only the
        overrides cause names the ``--set KEY=VALUE`` argument(s), not the file.
    """
    settings, axes = _read_document(parse_toml(text, source), source)
    file_only = (dict(settings), list(axes))
    origin: dict[str, str] = {}  # key -> the --set or --unset argument that changed it last
    released: dict[str, str] = {}  # key -> the --set argument that took its zipped axis away
    loose: dict[str, str] = {}  # key -> the argument that fixed or dropped its zipped partner
    axes = _apply_unset(settings, axes, unset, source=source, origin=origin, loose=loose)
    axes = _apply_overrides(settings, axes, overrides, origin, released, loose)
    arguments = [*(f"--unset {name}" for name in unset), *(f"--set {o}" for o in overrides)]
    build = functools.partial(_build, text=text, source=source, overrides=overrides, unset=unset)
    try:
        return build(settings, axes)
    except ConfigError as exc:
        if not arguments:
            raise
        error = exc
    try:
        read_by_file = _build(*file_only, text=text, source=source, overrides=()).read
    except ConfigError:
        raise error from None  # the file alone is already invalid: its error stands
    # the file's settings its cells read, that only the arguments left unread: dropped
    droppable = tuple(k for k in settings if k not in origin and k in read_by_file)
    if droppable:
        try:
            return build(settings, axes, drop_unread=droppable)
        except ConfigError as exc:
            error = exc
    raise _blamed(
        error, source, arguments, file_only, origin=origin, released=released, loose=loose
    ) from None


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
    it left swept on their own (see :func:`parse_scenario`)."""
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
    its zipped axis away or left its zipped partner swept alone (see :func:`parse_scenario`)."""
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


def _build(
    settings: Mapping[str, Any],
    axes: Sequence[Axis],
    *,
    text: str,
    source: str,
    overrides: Sequence[str],
    unset: Sequence[str] = (),
    drop_unread: tuple[str, ...] = (),
) -> Scenario:
    # Swept keys take their first value in the base config, so that a base value that only
    # the sweep makes valid (groups.group_size > the default n_peers, say) is never checked.
    first = {
        key: v
        for axis in axes
        if axis.values
        for key, v in zip(axis.keys, axis.values[0], strict=True)
    }
    try:
        config = with_values(ScenarioConfig(), {**settings, **first})
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return Scenario(
        config=config,
        axes=tuple(axes),
        text=text,
        source=source,
        overrides=tuple(overrides),
        unset=tuple(unset),
        drop_unread=drop_unread,
    )


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
