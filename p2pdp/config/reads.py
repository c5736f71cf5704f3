"""Which settings apply to a run: what a config's selected components read.

Every component declares what it reads (its ``reads``, :mod:`p2pdp.core.reads`), every table
what its options read for some of their values (its ``option_reads``), and each runtime what it
reads (:data:`RUNTIME_READS`). :func:`settings_read` follows these declarations from the
settings every run reads (:data:`ENGINE_READS`); :func:`check_reads` refuses a setting that
differs from its default although nothing selected reads it (it would change nothing), with a
message (:func:`unread_reason`) naming the components that would read it
(:func:`readers_of`). :class:`p2pdp.config.ScenarioConfig` applies its cross-table rules only
to the settings read; :mod:`p2pdp.config` re-exports every public name here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from p2pdp.config.tables import SECTIONS, TaskConfig, field_key, field_names, public_key
from p2pdp.core import components
from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import When, declared_reads, declares_reads
from p2pdp.core.validation import Derived


class Tables(Protocol):
    """What the analysis reads of a :class:`~p2pdp.config.ScenarioConfig`: its workload and,
    by name (``getattr``), every table of :data:`~p2pdp.config.tables.SECTIONS`."""

    @property
    def task(self) -> TaskConfig: ...


#: Settings every run reads, whatever its components: the grid's seed, repetitions and split
#: (its folds: ``EvaluationConfig.option_reads``), the workload and the number of peers
#: (:mod:`p2pdp.experiments.run.runner`).
ENGINE_READS = (
    "name",
    "seed",
    "repetitions",
    "task.name",
    "partition.n_peers",
    "evaluation.split",
)

#: Settings that name a component, and the component kind they name: the named component's
#: ``reads`` (:mod:`p2pdp.core.reads`) are read while the setting is.
COMPONENT_SETTINGS = {
    "task.name": "task",
    "protocol.name": "protocol",
    "groups.sampler": "sampler",
    "privacy.mechanism": "mechanism",
    "privacy.accountant": "accountant",
    "evaluation.vote": "ensemble",
    "training.model": "model",
    "data.dataset": "dataset",
}

#: The tables a plug-in that declares no ``reads`` is taken to read, by kind (what a component
#: of that kind is given); a task or protocol plug-in may read any table.
UNDECLARED_READS = {
    "dataset": ("data",),
    "model": ("training",),
    "mechanism": ("privacy",),
    "accountant": ("privacy",),
    "sampler": ("groups", "gossip"),
    "ensemble": ("evaluation",),
}


#: What each runtime (``p2pdp run --runtime``) reads besides its components: the simulator's
#: message model (:class:`p2pdp.sim.transport.Transport`) the transport settings (and
#: ``network.latency_sigma`` for the lognormal model, :attr:`NetworkConfig.option_reads`); the
#: network runtime (:class:`p2pdp.net.coordinator.NetworkWorld`), whose messages cross a real
#: network, only where its noise comes from. Declared here as data, which each runtime takes as
#: its ``reads``, so that checking a config loads no runtime.
RUNTIME_READS: dict[str, tuple[str, ...]] = {
    "simulation": ("network.latency", "network.latency_mean", "network.bandwidth", "network.loss"),
    "network": ("network.seeded_noise",),
}


#: Every table's ``option_reads``: settings read only for some values of an option (while the
#: option is read), each declared on its table next to the option's constraint.
_OPTION_ENTRIES: tuple[When, ...] = tuple(
    entry for table in SECTIONS.values() for entry in getattr(table, "option_reads", ())
)


def option_reads(key: str) -> tuple[When, ...]:
    """What the option ``key`` reads for some of its values (e.g. ``partition.scheme = 'file'``
    reads ``partition.path``): its table's ``option_reads`` entries on ``key``."""
    return tuple(entry for entry in _OPTION_ENTRIES if entry.key == key)


#: The same as setting -> value -> settings, for listings (``p2pdp components``, the guide).
OPTION_READS: dict[str, dict[Any, tuple[str, ...]]] = {
    key: {entry.value: entry.keys for entry in option_reads(key)}
    for key in dict.fromkeys(entry.key for entry in _OPTION_ENTRIES)
}


def _reader_of(key: str, value: Any) -> Any:
    """The object declaring what the component ``key = value`` reads (None: not resolvable)."""
    if key == "privacy.accountant" and value == "auto":
        return None
    return components.resolve(COMPONENT_SETTINGS[key], value, key=key)


def _expand(key: str) -> tuple[str, ...]:
    """``"gossip.*"`` -> every setting of ``[gossip]``; a dotted key -> itself."""
    section, _, name = key.partition(".")
    if name == "*":
        return tuple(public_key(f"{section}.{n}") for n in field_names(SECTIONS[section]))
    return (key,)


def setting_value(config: Tables, key: str) -> Any:
    """The value of the dotted setting ``key`` (public name, e.g. ``"training.lambda"``)."""
    section, dot, name = field_key(key).partition(".")
    return getattr(getattr(config, section), name) if dot else getattr(config, section)


def settings_read(config: Tables, runtime: str | None = "simulation") -> dict[str, str]:
    """Every setting that ``config``'s selected components read, and the first reader found.

    Starts from :data:`ENGINE_READS` and the runtime's reads (``runtime = None``: every
    runtime's, for a scenario, which may run on either); a setting naming a component
    (:data:`COMPONENT_SETTINGS`) adds that component's declared ``reads``
    (:mod:`p2pdp.core.reads`), an option (its table's ``option_reads``) the settings of its
    value. A task that does not read ``protocol.name`` runs the one-shot protocol, whose reads
    are added.

    Returns
    -------
    dict
        Public dotted key -> who reads it (``"protocol.name = 'dpsgd'"``, ``"the engine"``).
    """
    read: dict[str, str] = {}
    pending: list[tuple[str, str]] = [(key, "the engine") for key in ENGINE_READS]
    for name in RUNTIME_READS if runtime is None else (runtime,):
        pending += [(key, f"runtime {name!r}") for key in RUNTIME_READS[name]]
    implicit_protocol = False
    while pending:
        key, reader = pending.pop(0)
        for name in _expand(key):
            if name in read:
                continue
            read[name] = reader
            value = setting_value(config, name)
            entries: tuple[Any, ...] = ()
            who = f"{name} = {value!r}"
            if name in COMPONENT_SETTINGS:
                reader_object = _reader_of(name, value)
                entries = declared_reads(reader_object)
                kind = COMPONENT_SETTINGS[name]
                if reader_object is not None and not (
                    declares_reads(reader_object) or components.is_builtin(kind, value)
                ):  # a plug-in that does not say: whatever a component of its kind is given
                    entries = tuple(f"{s}.*" for s in UNDECLARED_READS.get(kind, SECTIONS))
            else:
                entries = option_reads(name)
            for entry in entries:
                if isinstance(entry, When):
                    if entry.holds(setting_value(config, entry.key)):
                        pending += [(k, who) for k in entry.keys]
                else:
                    pending.append((entry, who))
        if not pending and "protocol.name" not in read and not implicit_protocol:
            implicit_protocol = True  # tasks without [protocol] run the one-shot protocol
            one_shot = components.resolve("protocol", "one-shot")
            reader = f"task.name = {config.task.name!r} (one-shot protocol)"
            pending = [(k, reader) for k in declared_reads(one_shot) if isinstance(k, str)]
    return read


def _default_sections() -> dict[str, Any]:
    return {section: cls() for section, cls in SECTIONS.items()}


def unread_settings(config: Tables, read: Any) -> list[str]:
    """Settings of ``config`` that differ from their default and are not in ``read``.

    Only an explicit setting can differ from its default; a value derived from others
    (:class:`Derived`) counts as a default.
    """
    defaults = _default_sections()
    unread = []
    for section in SECTIONS:
        values, default = getattr(config, section), defaults[section]
        for f in dataclasses.fields(values):
            key = public_key(f"{section}.{f.name}")
            value = getattr(values, f.name)
            if key in read or isinstance(value, Derived) or value == getattr(default, f.name):
                continue
            unread.append(key)
    return unread


class _AnythingBut(str):
    """A condition ``!= value`` in messages: its repr reads ``anything but 'none'``."""

    def __repr__(self) -> str:
        return f"anything but {str.__repr__(self)}"


def readers_of(key: str) -> dict[str, list[Any]]:
    """Which settings' values make the dotted setting ``key`` read: setting -> its values
    (built-in components, option values, ``"runtime"`` -> runtimes), for error messages."""

    def names(entries: Any) -> set[str]:
        keys = [k for e in entries for k in (e.keys if isinstance(e, When) else (e,))]
        return {name for k in keys for name in _expand(k)}

    found: dict[str, list[Any]] = {}
    for setting, kind in COMPONENT_SETTINGS.items():
        for name in components.names(kind):
            try:
                entries = declared_reads(components.resolve(kind, name))
            except ConfigError:
                continue
            if key in names(e for e in entries if not isinstance(e, When)):
                found.setdefault(setting, []).append(name)
            for entry in entries:  # read under a condition: name the condition
                if isinstance(entry, When) and key in names([entry]):
                    value = _AnythingBut(entry.value) if entry.negate else entry.value
                    if value not in found.setdefault(entry.key, []):
                        found[entry.key].append(value)
    for entry in _OPTION_ENTRIES:
        if key in names([entry]) and entry.value not in found.setdefault(entry.key, []):
            found[entry.key].append(entry.value)
    for runtime, keys in RUNTIME_READS.items():
        if key in names(keys):
            found.setdefault("runtime", []).append(runtime)
    return found


def check_reads(config: Tables, runtime: str = "simulation") -> dict[str, str]:
    """What ``config``'s components read (:func:`settings_read`); ConfigError if a setting
    that none of them reads differs from its default (it would change nothing)."""
    read = settings_read(config, runtime)
    refuse_unread(unread_settings(config, read), config, read)
    return read


def _here(setting: str, config: Tables, read: dict[str, str]) -> str:
    """What ``config`` has for ``setting``, or which components would read it, for messages."""
    if setting == "runtime":  # not a setting of the file: say where it is chosen
        return " (chosen by `p2pdp run --runtime`, not by the scenario)"
    if setting in read:
        return f" (here {setting_value(config, setting)!r})"
    readers = readers_of(setting)
    return (
        " (itself read only with "
        + "; ".join(f"{s} = {' or '.join(map(repr, values))}" for s, values in readers.items())
        + ")"
    )


def unread_reason(key: str, config: Tables, read: dict[str, str]) -> str:
    """Why nothing ``config`` selects reads the setting ``key``: its value, the components
    that would read it and what ``config`` selects instead (``read``: what it reads), e.g.
    ``"groups.group_size = 1 is read only with protocol.name = 'one-shot' (here 'dpsgd')"``."""
    readers = readers_of(key)
    would = "; ".join(
        f"{setting} = {' or '.join(map(repr, values))}" + _here(setting, config, read)
        for setting, values in readers.items()
    )
    if not readers:
        return f"{key} = {setting_value(config, key)!r} is read by no built-in component"
    if list(readers.get("runtime", ())) == ["simulation"]:  # the simulated transport model
        would = would.removesuffix(")") + (
            "; on the network runtime messages cross a real network, whose latency and loss "
            "are its own: `--unset` it, or emulate them with benchmarks/netns_run.py)"
        )
    return f"{key} = {setting_value(config, key)!r} is read only with {would}"


def refuse_unread(keys: list[str], config: Tables, read: dict[str, str]) -> None:
    """ConfigError naming each of ``keys`` (settings no selected component reads), its value,
    the components that would read it and what this config selects instead."""
    if not keys:
        return
    lines = [unread_reason(key, config, read) for key in keys]
    raise ConfigError(
        f"{'; '.join(lines)}: nothing this scenario selects reads "
        f"{'it' if len(keys) == 1 else 'them'}, so {'it' if len(keys) == 1 else 'they'} "
        f"would change nothing; remove {'it' if len(keys) == 1 else 'them'} or select a "
        f"component that reads {'it' if len(keys) == 1 else 'them'}"
    )
