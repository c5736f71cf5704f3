"""How many host processes a network run has, and where they run.

``P2PDP_NETWORK_HOSTS`` (the CLI's ``--hosts``, checked by :func:`hosts_plan`): unset, one per
CPU core on this machine; a number, that many on this machine (``spawn``; an integer from 1 to
the number of peers); the path of a hosts file (:func:`read_hosts_file`, a :class:`HostsFile`),
one host per entry, each started by the entry's command (e.g. over ``ssh`` on another
machine), with its per-host ``data`` and whether the coordinator scores the run.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2pdp.core.errors import ConfigError
from p2pdp.core.scoped import scoped
from p2pdp.experiments.scenarios.document import parse_toml

__all__ = [
    "HostsFile",
    "coordinator_scores",
    "hosts_flag",
    "hosts_given",
    "hosts_plan",
    "network_hosts",
    "read_hosts_file",
]


#: The command that starts a host from a hosts file when its entry gives none.
HOST_COMMAND = (sys.executable, "-m", "p2pdp.experiments.network")


@dataclass(frozen=True)
class HostsFile:
    """Where the host processes of a network run live (a hosts file, :func:`read_hosts_file`).

    Attributes
    ----------
    coordinator : str
        The address the hosts reach the coordinator at (this machine, as they see it).
    bind : str
        The address the coordinator listens on.
    addresses : tuple of str
        Per host: where its peers listen, and the others connect to them.
    commands : tuple of tuple of str
        Per host: the command that starts it; it reads its launch bundle on standard input.
    allowlist : bool
        Every listener of the run accepts connections only from ``coordinator`` and the
        hosts' ``addresses``.
    data : tuple of str
        Per host: the manifest of its shard file (``p2pdp split``), as the host process sees
        the path; empty: the hosts derive the fold from the seed.
    score : bool
        The coordinator scores the run (derives the fold from the seed to score every peer's
        ensemble on the test rows, the centralised reference and the releases' noise norm).
        False (only with ``data``): it opens no data at all, and those columns are empty
        (:data:`~p2pdp.experiments.run.oneshot.UNSCORED`).
    """

    coordinator: str
    bind: str
    addresses: tuple[str, ...]
    commands: tuple[tuple[str, ...], ...]
    allowlist: bool = False
    data: tuple[str, ...] = ()
    score: bool = True

    @property
    def allowed(self) -> tuple[str, ...]:
        """The addresses every listener accepts (empty: any), from ``allowlist``."""
        return (self.coordinator, *self.addresses) if self.allowlist else ()


def read_hosts_file(path: str | os.PathLike[str]) -> HostsFile:
    """Read a hosts file: ConfigError naming the file, the entry, the key and the value.

    Format (TOML)::

        coordinator = "10.0.0.1"   # how the hosts reach this machine
        bind = "10.0.0.1"          # where the coordinator listens (default: 127.0.0.1)
        allowlist = true           # accept connections only from these addresses
        score = false              # this machine holds no data: it does not score the run

        [[host]]
        address = "10.0.0.2"       # where this host's peers listen
        command = ["ssh", "10.0.0.2", "python", "-m", "p2pdp.experiments.network"]
        data = "/data/p2pdp/host-0.json"   # its shard file's manifest, on that machine

    ``command`` defaults to this Python, ``-m p2pdp.experiments.network``, on this machine.
    ``data`` (every entry or none): the manifest ``p2pdp split`` wrote for that host, a path
    the host process opens itself (the coordinator never reads it). ``score`` (default
    true): false, only with every host's ``data``, makes a coordinator that opens no data at
    all (the test-set scores, the centralised reference and the releases' ``noise_norm`` are
    then empty, the reason in ``score_note``).
    """
    where = os.fspath(path)
    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:  # a folder, a binary file
        raise ConfigError(f"hosts file {where}: cannot read it as text ({error})") from None
    document = parse_toml(source, f"hosts file {where}")

    def text(table: dict[str, Any], key: str, name: str, default: str | None = None) -> str:
        value = table.get(key, default)
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"hosts file {where}: {name} must be a non-empty string, got {value!r}"
            )
        return value

    unknown = set(document) - {"coordinator", "bind", "host", "allowlist", "score"}
    if unknown:
        raise ConfigError(f"hosts file {where}: unknown key {sorted(unknown)[0]!r}")
    entries = document.get("host")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"hosts file {where}: needs at least one [[host]] entry")
    addresses, commands, data = [], [], []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(
                f"hosts file {where}: host[{i}] must be a table ([[host]] with an address), "
                f"got {entry!r}"
            )
        unknown = set(entry) - {"address", "command", "data"}
        if unknown:
            raise ConfigError(f"hosts file {where}: unknown key host[{i}].{sorted(unknown)[0]}")
        addresses.append(text(entry, "address", f"host[{i}].address"))
        command = entry.get("command", list(HOST_COMMAND))
        if not (isinstance(command, list) and command and all(isinstance(w, str) for w in command)):
            raise ConfigError(
                f"hosts file {where}: host[{i}].command must be a list of strings, got {command!r}"
            )
        commands.append(tuple(command))
        if "data" in entry:
            data.append(text(entry, "data", f"host[{i}].data"))
    if data and len(data) != len(entries):
        missing = next(i for i, entry in enumerate(entries) if "data" not in entry)
        raise ConfigError(
            f"hosts file {where}: host[{missing}].data is missing: give every host its data "
            "(p2pdp split) or none"
        )
    allowlist = document.get("allowlist", False)
    if not isinstance(allowlist, bool):
        raise ConfigError(f"hosts file {where}: allowlist must be true or false, got {allowlist!r}")
    score = document.get("score", True)
    if not isinstance(score, bool):
        raise ConfigError(f"hosts file {where}: score must be true or false, got {score!r}")
    if not score and not data:
        raise ConfigError(
            f"hosts file {where}: score = false needs every host's data (p2pdp split): without "
            "it each host derives the whole data set, so a coordinator without it would hide "
            "the scores and keep no data from anyone"
        )
    return HostsFile(
        coordinator=text(document, "coordinator", "coordinator"),
        bind=text(document, "bind", "bind", "127.0.0.1"),
        addresses=tuple(addresses),
        commands=tuple(commands),
        allowlist=allowlist,
        data=tuple(data),
        score=score,
    )


#: What the user set that ``P2PDP_NETWORK_HOSTS`` carries, as messages name it: the
#: variable itself, or the command line's ``--hosts`` inside :func:`hosts_given`.
_HOSTS_NAME: contextvars.ContextVar[str] = contextvars.ContextVar(
    "hosts_name", default="P2PDP_NETWORK_HOSTS"
)


@contextlib.contextmanager
def hosts_given(value: str, name: str = "--hosts") -> Iterator[None]:
    """``P2PDP_NETWORK_HOSTS`` set to ``value`` while the block runs, and messages about it
    naming ``name`` (what the user wrote), not a variable they never set."""
    before = os.environ.get("P2PDP_NETWORK_HOSTS")
    os.environ["P2PDP_NETWORK_HOSTS"] = value
    try:
        with scoped(_HOSTS_NAME, name):
            yield
    finally:
        if before is None:
            del os.environ["P2PDP_NETWORK_HOSTS"]
        else:
            os.environ["P2PDP_NETWORK_HOSTS"] = before


def _hosts_setting() -> str:
    return os.environ.get("P2PDP_NETWORK_HOSTS", "").strip()


def _is_number(setting: str) -> bool:
    try:
        float(setting)
    except ValueError:
        return False
    return True


def hosts_flag() -> str | None:
    """The ``--hosts`` value that repeats this process's hosts (``P2PDP_NETWORK_HOSTS``): a
    count, or a hosts file's absolute path; None for the default (one per core)."""
    setting = _hosts_setting()
    if not setting or _is_number(setting):
        return setting or None
    return os.path.abspath(setting)


def hosts_plan(n_peers: int) -> tuple[int, HostsFile | None]:
    """How many host processes a run of ``n_peers`` peers has, and the hosts file saying
    where they run (None: on this machine).

    ``P2PDP_NETWORK_HOSTS`` (the CLI's ``--hosts``) unset: one per CPU core, at most one per
    peer; a number (anything ``float`` reads): that many, an integer in ``[1, n_peers]``; else
    the path of a hosts file (:func:`read_hosts_file`), one per entry, at most ``n_peers``.

    Raises
    ------
    ConfigError
        Naming the setting and its value: not an integer >= 1, more hosts than peers, or a
        hosts file that cannot be read or is malformed.
    """
    setting = _hosts_setting()
    if not setting:
        return max(1, min(os.cpu_count() or 1, n_peers)), None
    plan, source = None, f"{_HOSTS_NAME.get()} = {setting!r}"
    if _is_number(setting):
        count = int(setting) if setting.lstrip("+-").isdigit() else 0
        if count < 1:
            raise ConfigError(
                f"{source}: the number of network hosts must be an integer >= 1 (or give the "
                "path of a hosts file)"
            )
    elif not Path(setting).is_file():
        raise ConfigError(
            f"{source}: neither a number of hosts (an integer >= 1) nor the path of a hosts "
            "file (no such file)"
        )
    else:
        plan, source = read_hosts_file(setting), f"the hosts file {setting}"
        count = len(plan.addresses)
    if count > n_peers:
        raise ConfigError(
            f"{source} gives {count} hosts for partition.n_peers = {n_peers}: at most one "
            "host per peer"
        )
    return count, plan


def network_hosts(n_peers: int) -> int:
    """Host processes for a run of ``n_peers`` peers (:func:`hosts_plan`)."""
    return hosts_plan(n_peers)[0]


def coordinator_scores(n_peers: int) -> bool:
    """Whether the coordinator of a network run of ``n_peers`` peers scores it (derives the
    data): false only when a hosts file says ``score = false`` (:func:`hosts_plan`)."""
    plan = hosts_plan(n_peers)[1]
    return plan is None or plan.score
