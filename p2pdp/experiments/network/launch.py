"""The network runtime's processes: what each host process computes, and how they start.

``simulate(config, runtime="network")`` builds a :class:`p2pdp.net.coordinator.NetworkWorld`
here. Each host is an OS process that serves its own peers' statistics
(:func:`p2pdp.net.host_process.serve`), started once per run and serving every cell of it,
each cell a session of its own (:class:`RunHosts`, :func:`run_hosts`). Peers are split evenly, in id
order, over the host processes.
Where a hosts file gives each host its ``data`` (a per-host shard file written by ``p2pdp
split``, :mod:`p2pdp.experiments.network.shards`), the host reads only that file and trains only its
own peers' models: it never derives, opens or receives another peer's rows or model. Without
it (a host count, or a hosts file without ``data``), each host derives the whole fold from the
seed as the simulator does (every peer's data and local model: a simulation shortcut) and
keeps only its own peers' statistics.

By default the process that runs :func:`~p2pdp.experiments.run.simulation.simulate` (the
coordinator) is also the experimenter who scores the run: it derives the fold itself to score
every peer's ensemble on the test rows, the centralised reference and the releases'
``noise_norm`` (analysis columns, never sent to any host). With per-host data, a hosts file's
``score = false`` makes a coordinator that opens no data at all: it learns the statistics'
length from the hosts and leaves those columns empty
(:data:`~p2pdp.experiments.run.oneshot.UNSCORED`). Either way the coordinator's protocol code
(:class:`~p2pdp.net.coordinator.NetworkWorld`) reads no training data.

Where the hosts run is ``P2PDP_NETWORK_HOSTS`` (the CLI's ``--hosts``, checked by
:func:`hosts_plan`): unset, one per CPU core on this machine; a number, that many on this
machine (``spawn``; an integer from 1 to the number of peers); the path of a hosts file
(:func:`read_hosts_file`), one per entry, each started by the entry's command (e.g. over
``ssh`` on another machine), which reads its cells' launch bundles (:func:`host_from_stdin`)
on its standard input.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import contextvars
import logging
import multiprocessing
import os
import pickle
import select
import shlex
import signal
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig, refuse_unread, settings_read, unread_settings
from p2pdp.core.errors import ConfigError, NetworkRunError, P2PDPError
from p2pdp.core.parallel import worker_signals
from p2pdp.core.rng import generator, os_generator
from p2pdp.experiments.scenarios.scenario import parse_toml
from p2pdp.net.coordinator import NetworkWorld, check_supported
from p2pdp.net.gossip_host import GossipSetup
from p2pdp.net.host_process import serve
from p2pdp.net.hosts import EXPLAINED, HostError, HostSettings, Ticket, hosts_of
from p2pdp.net.iterative_coordinator import check_iterative
from p2pdp.net.tls import Authority
from p2pdp.privacy.accounting import BudgetLedger
from p2pdp.privacy.release import Releaser
from p2pdp.sim.world import budget_ledger
from p2pdp.tasks import (
    check_min_shard_size,
    make_task,
    prepared,
    prepared_own,
    release_path,
    sensitivity_of,
    task_statistics,
)

__all__ = [
    "HostsFile",
    "RunHosts",
    "check_network_settings",
    "coordinator_scores",
    "host_from_stdin",
    "host_main",
    "hosts_flag",
    "hosts_plan",
    "network_hosts",
    "network_session",
    "network_world",
    "read_hosts_file",
    "run_hosts",
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
    plan, source = None, f"--hosts (P2PDP_NETWORK_HOSTS) = {setting!r}"
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


class _Command:
    """A host started by a hosts file's command, with the process interface the coordinator
    uses (``join``, ``is_alive``, ``kill``, ``pid``). The command runs in a session of its
    own, so that killing it kills what it started too (a shell's children, ssh). It reads
    its cells' launch bundles on its standard input (one pickle each) and writes one byte on
    its standard output when a cell is over (:func:`host_from_stdin`)."""

    def __init__(self, host: int, command: Sequence[str]) -> None:
        self.name = f"host {host} ({shlex.join(command)})"
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
            )
        except OSError as error:
            raise NetworkRunError(f"network runtime: {self.name} cannot start: {error}") from None
        self.pid = self.process.pid

    def send(self, bundle: dict[str, Any]) -> None:
        """Start a cell: its launch bundle on the host's standard input."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(pickle.dumps(bundle))
            self.process.stdin.flush()
        except BrokenPipeError:  # it exited: is_alive says so
            pass

    def close(self) -> None:
        """No more cells: the host exits once its cell is over (end of its input)."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except BrokenPipeError:
            pass

    def finished(self, timeout: float | None) -> bool:
        """Whether the host said its cell is over (or exited) within ``timeout`` s."""
        out = self.process.stdout
        assert out is not None
        if not select.select([out], [], [], timeout)[0]:
            return False
        return os.read(out.fileno(), 1) in (b".", b"")  # "over", or the end: it exited

    def join(self, timeout: float | None = None) -> None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def is_alive(self) -> bool:
        return self.process.poll() is None

    @property
    def exitcode(self) -> int | None:
        """None while it runs; its exit status, or ``-signal`` if a signal killed it."""
        return self.process.poll()

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone, with everything it started
            pass
        self.process.wait()

    def __str__(self) -> str:
        return self.name


class _Spawned:
    """A host spawned from this Python process (``multiprocessing``): its cells' launch
    bundles and the end of each travel on a pipe of its own; the interface of
    :class:`_Command`."""

    def __init__(self, host: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.name = f"host {host} (spawned from this Python process)"
        self.process = context.Process(
            target=_host_loop, args=(theirs,), name=self.name, daemon=True
        )
        self.process.start()
        theirs.close()  # the host holds the only other end: it sees the end of this process
        self.pid = self.process.pid

    def send(self, bundle: dict[str, Any]) -> None:
        try:
            self.connection.send(bundle)
        except OSError:  # it exited: is_alive says so
            pass

    def close(self) -> None:
        """No more cells: the host exits once its cell is over (None: the end of its input)."""
        self.send(None)  # type: ignore[arg-type]

    def finished(self, timeout: float | None) -> bool:
        try:
            if not self.connection.poll(timeout):
                return False
            self.connection.recv()
        except (EOFError, OSError):  # it exited
            pass
        return True

    def join(self, timeout: float | None = None) -> None:
        self.process.join(timeout)

    def is_alive(self) -> bool:
        return self.process.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()
        self.process.join()

    def __str__(self) -> str:
        return self.name


class _Cell:
    """One cell's view of a host process that serves every cell of a run
    (:class:`RunHosts`): alive until the host says the cell is over; ``kill`` kills the
    process (the next cell starts another)."""

    def __init__(self, host: _Command | _Spawned, *, last: bool) -> None:
        self.host, self.name, self.pid = host, host.name, host.pid
        self.over = False
        self.last = last  # the host's last cell: it exits after it
        if last:
            host.close()

    def join(self, timeout: float | None = None) -> None:
        if not self.over:
            self.over = self.host.finished(timeout)
        if self.over and self.last:
            self.host.join(timeout)

    def is_alive(self) -> bool:
        return not self.over and self.host.is_alive()

    @property
    def exitcode(self) -> int | None:
        return self.host.exitcode

    def kill(self) -> None:
        self.over = True
        self.host.kill()

    def __str__(self) -> str:
        return self.name


class RunHosts:
    """The host processes of a network run: started once, at the first cell that needs
    them, they serve every cell (each a fresh protocol session: its own launch bundle,
    enrollment, CA and TLS identities, sockets and state), and stop at :meth:`close` (the
    end of the run, an interrupt, an error), or by themselves when this process dies (the
    end of their input: :func:`host_from_stdin`, :func:`_host_loop`).

    A host killed or lost in a cell is started afresh for the next; so are all of them when
    a cell needs another number of hosts, or other commands (another ``n_peers``).
    """

    def __init__(self) -> None:
        self.hosts: dict[int, _Command | _Spawned] = {}
        self.plan: tuple[int, HostsFile | None] | None = None
        self.started = 0  # host processes started (a measure: once per host per run)

    def launch(
        self,
        host: int,
        plan: tuple[int, HostsFile | None],
        bundle: dict[str, Any],
        *,
        last: bool = False,
    ) -> _Cell:
        """Host ``host`` of ``plan`` (:func:`hosts_plan`) serves the cell of ``bundle``
        (``last``: and then exits)."""
        if plan != self.plan:
            self.close()
            self.plan = plan
        process = self.hosts.get(host)
        if process is None or not process.is_alive():
            hosts_file = plan[1]
            process = self.hosts[host] = (
                _Command(host, hosts_file.commands[host]) if hosts_file else _Spawned(host)
            )
            self.started += 1
        process.send(bundle)
        return _Cell(process, last=last)

    def close(self) -> None:
        """Stop every host: the end of its input, then (after a few seconds) a kill."""
        for process in self.hosts.values():
            process.close()
        for process in self.hosts.values():
            process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
        self.hosts.clear()


_RUN_HOSTS: contextvars.ContextVar[RunHosts | None] = contextvars.ContextVar(
    "p2pdp_run_hosts", default=None
)


@contextlib.contextmanager
def run_hosts() -> Iterator[RunHosts]:
    """Within it, every network cell of this process is served by the same host processes
    (:class:`RunHosts`), stopped on the way out (an exception included); outside, each
    network run starts its own and stops them when it ends."""
    hosts = RunHosts()
    token = _RUN_HOSTS.set(hosts)
    try:
        yield hosts
    finally:
        _RUN_HOSTS.reset(token)
        hosts.close()


def _settings(
    config: ScenarioConfig, releaser: Releaser | None, hosts: int, allowed: tuple[str, ...] = ()
) -> HostSettings:
    """What every host knows of the run; ``releaser`` None: the coordinator's, which holds
    no statistic (it reads none of what the releases' dimension decides)."""
    affords = {}
    if releaser is not None:
        ledger = budget_ledger(config, releaser, config.partition.n_peers)
        affords = dict(releases_per_peer=int(ledger.max_aggregations))
    return HostSettings(
        n_peers=config.partition.n_peers,
        hosts=hosts,
        full_publication=config.publication.mode == "full",
        min_shard_size=config.privacy.min_shard_size or 1,
        collect_timeout=config.groups.collect_timeout,
        # waits for a frame, a connection or a report: as long as a group, within [1, 10] s
        timeout=min(10.0, max(1.0, config.groups.collect_timeout)),
        seeded_noise=config.network.seeded_noise,
        group_size=config.groups.group_size,
        max_concurrent=config.groups.max_concurrent_groups,
        allowed=allowed,
        **affords,
    )


def check_network_settings(config: ScenarioConfig) -> None:
    """ConfigError naming a setting of ``config`` the network runtime does not run, or a host
    count it cannot have (:func:`hosts_plan`), before anything starts (the runner checks every
    grid point first, :func:`~p2pdp.experiments.run.simulation.simulate` its config)."""
    from p2pdp.privacy.mechanisms import mechanism_class
    from p2pdp.tasks import check_own_rows

    _, plan = hosts_plan(config.partition.n_peers)
    if plan is not None and not plan.score and config.protocol.iterative:
        raise ConfigError(
            f"protocol.name = {config.protocol.name!r} cannot run with a coordinator that holds "
            "no data (a hosts file's score = false): its rounds table measures every round's "
            "models on the test rows"
        )
    if plan is not None and plan.data:  # each host prepares its peers from its own rows
        task = make_task(config)
        check_own_rows(task)
        if not plan.score and not callable(getattr(task, "score_columns", None)):
            raise ConfigError(
                f"task.name = {task.name!r} cannot run with a coordinator that holds no data "
                "(a hosts file's score = false): the task declares no score_columns(), the "
                "columns to leave empty"
            )
    # the simulated transport model (network.*): the runtime reads none of it (NetworkWorld's
    # reads), refused here too for a config built in Python (no scenario file checked it)
    read = settings_read(config, "network")
    refuse_unread(
        [key for key in unread_settings(config, read) if key.startswith("network.")], config, read
    )
    if config.protocol.iterative:
        check_iterative(config)
        return
    if config.groups.sampler == "gossip":  # the hosts build the overlay: check it here, once
        from p2pdp.sim.overlay import check_overlay

        check_overlay(config.gossip, config.partition.n_peers)
    check_supported(
        config,
        scale_family=bool(
            getattr(mechanism_class(config.privacy.mechanism), "scale_family", False)
        ),
        per_release=config.privacy.needs_records,
    )


def network_world(
    config: ScenarioConfig,
    releaser: Releaser | Callable[[int], Releaser],
    statistics: np.ndarray | None,
    *,
    rngs: dict[str, np.random.Generator],
    fold: int,
    repetition: int,
    observers: Sequence[Any] = (),
) -> NetworkWorld:
    """The coordinator of a network run of ``config``.

    ``statistics`` (P, d): every peer's, only for ``d`` and the releases' ``noise_norm``
    (analysis); None for a coordinator that holds no data (a hosts file's ``score =
    false``): then the hosts say ``d`` and ``releaser(d)`` makes the run's releaser.
    """
    n_peers = config.partition.n_peers

    def ledger(dim: int) -> BudgetLedger:
        made = releaser(dim) if callable(releaser) else releaser
        check_supported(
            config,
            scale_family=bool(getattr(made.mechanism, "scale_family", False)),
            per_release=statistics is not None and statistics.ndim == 3,
        )  # the mechanism as built (a plug-in's from_config may differ from its class)
        return budget_ledger(config, made, n_peers)

    exact = None
    if statistics is not None:  # analysis only: the noise each release carries
        made = releaser(statistics.shape[-1]) if callable(releaser) else releaser

        def exact(members: np.ndarray) -> np.ndarray:
            return made.exact(statistics[members])

    session = network_session(config, fold=fold, repetition=repetition)
    allowed = session.pop("allowed")
    return NetworkWorld(
        config,
        n_peers=n_peers,
        dim=None if statistics is None else statistics.shape[-1],
        ledger=ledger,
        rngs=rngs,
        settings=_settings(config, None, session["hosts"], allowed),
        observers=observers,
        exact=exact,
        **session,
    )


def network_session(config: ScenarioConfig, *, fold: int, repetition: int) -> dict[str, Any]:
    """What a coordinator of one cell needs to start its hosts, whatever the protocol:
    ``launch`` (host, ticket) -> process (the run's hosts, :class:`RunHosts`, or this cell's
    own), ``hosts``, the cell's ``authority``, ``bind`` and the listeners' ``allowed``
    addresses."""
    hosts, plan = hosts_plan(config.partition.n_peers)
    if plan is None:  # spawned hosts import the main script again
        _check_main_guard()
    shared = _RUN_HOSTS.get()
    served = shared if shared is not None else RunHosts()  # this run's only cell

    def launch(host: int, ticket: Ticket) -> Any:
        # the launch bundle: no private key (each host makes its own), a one-time token
        bundle = dict(config=config, fold=fold, repetition=repetition, host=host, hosts=hosts,
                      ticket=ticket)  # fmt: skip
        if plan is not None:
            bundle.update(coordinator=plan.coordinator, address=plan.addresses[host],
                          allowed=plan.allowed)  # fmt: skip
            if plan.data:
                bundle.update(data=plan.data[host])
        # without a run's hosts (simulate called alone) the host exits after this cell
        return served.launch(host, (hosts, plan), bundle, last=shared is None)

    return {
        "launch": launch,
        "hosts": hosts,
        "authority": Authority(hosts),  # its keys stay in this process
        "bind": plan.bind if plan else "127.0.0.1",
        "allowed": plan.allowed if plan else (),
    }


def _is_main_test(test: ast.expr) -> bool:
    """``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, *test.comparators]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def _check_main_guard() -> None:
    """Exit with one line if this process runs its main script's top level outside
    ``if __name__ == "__main__":``: each spawned host would import that script again and
    start the run again (a traceback per host). Nothing is checked without a script file
    (an interactive session, ``python -c``, a notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame: types.FrameType | None = sys._getframe()
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and main is not None and frame.f_globals is vars(main)
    ):
        frame = frame.f_back
    if frame is None or path is None:
        return
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return
    raise SystemExit(
        f"p2pdp: error: the network runtime was started at the top level of {path} (line "
        f'{line}): put that under `if __name__ == "__main__":` (each host process imports '
        "the main script again, and would start the run again)"
    )


def host_main(
    config: ScenarioConfig,
    fold: int,
    repetition: int,
    host: int,
    hosts: int,
    ticket: Ticket,
    coordinator: str = "127.0.0.1",
    address: str = "127.0.0.1",
    allowed: tuple[str, ...] = (),
    data: str | None = None,
    kept: dict[tuple, Any] | None = None,
) -> None:
    """Host process ``host`` of ``hosts``, one cell: its peers' statistics (from its own
    shard file ``data``, else from the whole fold derived from the seed), enroll with
    ``ticket`` (a key pair of its own, made here) and serve them on ``address`` until the
    coordinator at ``coordinator`` ends the cell (mutual TLS), accepting connections only
    from ``allowed`` (if any). ``kept``: the previous cell's statistics, reused if this cell
    has the same training key (cleared and refilled otherwise)."""
    logging.basicConfig(level=logging.WARNING, format=f"host {host}: %(message)s")
    worker_signals()  # a Ctrl-C is the coordinator's to handle: it ends the run, and the hosts
    if config.protocol.iterative:
        from p2pdp.experiments.network.iterative import iterative_host_main

        iterative_host_main(config, fold, repetition, host, hosts, ticket, coordinator=coordinator,
                            address=address, allowed=allowed, data=data)  # fmt: skip
        return
    task = make_task(config)
    try:
        key = (task.training_key(fold=fold, repetition=repetition), host, hosts, data)
        if kept is None or key not in kept:
            made = _own_statistics(task, config, fold, repetition, host, hosts, data)
            if kept is not None:  # one training key at a time: a run's cells come by key
                kept.clear()
                kept[key] = made
        else:
            made = kept[key]
        peers, own, own_sizes, bounds = made
        if config.privacy.min_shard_size is not None:  # its own peers', named by their ids
            sizes = np.full(config.partition.n_peers, config.privacy.min_shard_size)
            sizes[peers] = own_sizes
            check_min_shard_size(sizes, config.privacy.min_shard_size)
    except P2PDPError as error:  # one line, not a traceback: it names what to fix
        print(f"p2pdp host {host}: {error}", file=sys.stderr)
        sys.exit(EXPLAINED)
    _, releaser, rngs = release_path(config, task, own.shape[-1], fold=fold, repetition=repetition)
    gossip = None
    if config.groups.sampler == "gossip":
        gossip = _gossip_setup(config, peers, releaser, rngs["protocol"], host, fold, repetition)
    try:
        asyncio.run(
            serve(
                peers,
                own,
                own_sizes,
                releaser=releaser,
                sensitivity=sensitivity_of(task, config.privacy.min_shard_size),
                settings=_settings(config, releaser, hosts, allowed),
                host_index=host,
                ticket=ticket,
                coordinator=coordinator,
                address=address,
                data_dependent_bounds=bounds,
                gossip=gossip,
            )
        )
    except (HostError, P2PDPError) as error:  # one line, not a traceback: it names what to fix
        print(f"p2pdp host {host}: {error}", file=sys.stderr)
        sys.exit(EXPLAINED)


def _gossip_setup(
    config: ScenarioConfig,
    peers: np.ndarray,
    releaser: Releaser,
    protocol: np.random.Generator,
    host: int,
    fold: int,
    repetition: int,
) -> GossipSetup:
    """What host ``host`` needs to run its ``peers``' gossip formation: their first views
    (the simulator's bootstrap from the overlay, both drawn from the run's protocol stream as
    the simulator draws them: public, every host derives the same), and the host's formation
    stream: from the OS CSPRNG, or with ``network.seeded_noise`` from the seed (per host)."""
    from p2pdp.sim.gossip.views import Newscast, merge_views
    from p2pdp.sim.overlay import build_overlay

    n_peers = config.partition.n_peers
    views = Newscast(build_overlay(config.gossip, n_peers, rng=protocol),
                     config.gossip.view_size, rng=protocol)  # fmt: skip
    seeded = config.network.seeded_noise
    ledger = budget_ledger(config, releaser, n_peers)
    return GossipSetup(
        params=config.gossip,
        group_size=config.groups.group_size,
        max_failed=config.groups.max_failed_attempts,
        collect_timeout=config.groups.collect_timeout,
        ids=views.ids[peers],
        stamps=views.stamps[peers],
        merge=merge_views,
        rng=generator(config.seed, "gossip host", host, fold, repetition)
        if seeded
        else os_generator(),
        solvent=bool(ledger.max_aggregations),
    )


def _own_statistics(
    task: Any,
    config: ScenarioConfig,
    fold: int,
    repetition: int,
    host: int,
    hosts: int,
    data: str | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Host ``host``'s peers (m,), their statistics (m, d), shard sizes (m,) and whether
    their rows were scaled with bounds fitted on the pooled training fold: from its shard
    file ``data`` alone, or (None) from the whole fold, keeping its own."""
    from p2pdp.experiments.network.shards import read_host_shards

    n_peers = config.partition.n_peers
    if data is not None:
        rows = read_host_shards(
            data, config, host=host, hosts=hosts, fold=fold, repetition=repetition
        )
        trained = prepared_own(
            task,
            rows.X,
            rows.y,
            rows.shards,
            data_dependent_bounds=rows.data_dependent_bounds,
            fold=fold,
            repetition=repetition,
        )
        statistics, sizes = task_statistics(task, trained, len(rows.peers))
        return rows.peers, statistics, sizes, rows.data_dependent_bounds
    whole = prepared(task, fold=fold, repetition=repetition)
    statistics, sizes = task_statistics(task, whole, n_peers)
    peers = np.flatnonzero(hosts_of(n_peers, hosts) == host)
    bounds = bool(getattr(getattr(whole, "fold", None), "data_dependent_bounds", False))
    return peers, statistics[peers].copy(), sizes[peers].copy(), bounds


def _host_loop(connection: Any) -> None:
    """A spawned host (:class:`_Spawned`): serve the cells whose launch bundles arrive on
    ``connection``, saying when each is over, until its other end closes (the run is over,
    or the coordinator died)."""
    _serve_cells(_received_bundles(connection), lambda: connection.send(None))


def _received_bundles(connection: Any) -> Iterator[dict[str, Any]]:
    """The bundles on ``connection`` until None or its end."""
    while True:
        try:
            bundle = connection.recv()
        except (EOFError, OSError):
            return
        if bundle is None:
            return
        yield bundle


def _serve_cells(bundles: Iterator[dict[str, Any]], over: Callable[[], object]) -> None:
    """Serve each cell of ``bundles`` (:func:`host_main`), calling ``over()`` after each;
    what a cell prepared is kept for the next cell of the same training key."""
    kept: dict[tuple, Any] = {}
    for bundle in bundles:
        host_main(**bundle, kept=kept)
        over()


def host_from_stdin() -> None:
    """A host started by a hosts file's command: its cells' launch bundles (each pickled by
    the coordinator that started it, the only party that writes to this process's standard
    input) name its run, fold, index, ticket (:class:`~p2pdp.net.hosts.Ticket`: no private
    key) and addresses. It writes one byte on its standard output when a cell is over (what
    it prints goes to its standard error), and exits at the end of its input."""
    done = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def bundles() -> Iterator[dict[str, Any]]:
        while True:
            try:
                yield pickle.load(sys.stdin.buffer)
            except EOFError:
                return

    _serve_cells(bundles(), lambda: done.write(b"."))


if __name__ == "__main__":
    host_from_stdin()
