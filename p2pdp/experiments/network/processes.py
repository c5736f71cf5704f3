"""The coordinator's handles on a network run's host processes.

A host is started by a hosts file's command (:class:`_Command`, a process in a session of its
own, whose launch bundles travel on its standard input) or spawned from this Python process
(:class:`_Spawned`, on a pipe); either serves every cell of a run, each cell seeing it as a
:class:`_Cell`. :class:`RunHosts` keeps them for a whole run (:func:`run_hosts`, which the
runner enters) and stops them at its end. What a host process runs is
:mod:`p2pdp.experiments.network.host`.
"""

from __future__ import annotations

import contextlib
import contextvars
import multiprocessing
import os
import pickle
import select
import shlex
import signal
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

from p2pdp.core.errors import NetworkRunError
from p2pdp.experiments.network.host import _host_loop
from p2pdp.experiments.network.hosts_file import HostsFile

__all__ = ["RunHosts", "run_hosts"]


class _Command:
    """A host started by a hosts file's command, with the process interface the coordinator
    uses (``join``, ``is_alive``, ``kill``, ``pid``). The command runs in a session of its
    own, so that killing it kills what it started too (a shell's children, ssh). It reads
    its cells' launch bundles on its standard input (one pickle each) and writes one byte on
    its standard output when a cell is over
    (:func:`~p2pdp.experiments.network.host.host_from_stdin`)."""

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
    end of their input: :func:`~p2pdp.experiments.network.host.host_from_stdin`,
    :func:`~p2pdp.experiments.network.host._host_loop`).

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
        """Host ``host`` of ``plan`` (:func:`~p2pdp.experiments.network.hosts_file.hosts_plan`)
        serves the cell of ``bundle`` (``last``: and then exits)."""
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
