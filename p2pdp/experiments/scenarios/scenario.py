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

This module holds the scenario and its loading; reading a document's keys and values is
:mod:`p2pdp.experiments.scenarios.document`, the command line's ``--set`` and ``--unset`` over
a file :mod:`p2pdp.experiments.scenarios.overrides`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pdp.config import (
    SECTIONS,
    ScenarioConfig,
    field_key,
    refuse_unread,
    setting_value,
    settings_read,
    unread_reason,
    unread_settings,
)
from p2pdp.core.errors import ConfigError
from p2pdp.experiments.scenarios.disclosure import LAMBDA_SWEPT
from p2pdp.experiments.scenarios.document import (
    _TOP_LEVEL,
    Axis,
    _default,
    _field_names,
    _read_document,
    _toml_key,
    _toml_keys,
    parse_toml,
)
from p2pdp.experiments.scenarios.overrides import _apply_overrides, _apply_unset, _blamed


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
