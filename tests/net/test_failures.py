"""A fault in a party's own callbacks ends a network run with an error naming where it
happened, every host stopped (p2pdp.net.failures); it used to leave the run hanging (an
exception in a connection's handler task is never retrieved).

The runs here start their hosts as threads of this process (so that a patch reaches them),
each on its own event loop and sockets, as a host process would."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import threading
import time

import pytest

from p2pdp.core.errors import NetworkRunError
from p2pdp.experiments.network import host as host_module
from p2pdp.experiments.network.processes import RunHosts
from p2pdp.experiments.run.simulation import simulate
from p2pdp.net.failures import Failure
from p2pdp.net.gossip_coordinator import GossipGroups
from p2pdp.net.gossip_host import HostFormation
from p2pdp.net.host import PeerHost
from p2pdp.net.iterative_host import IterativeHost
from p2pdp.protocols.settings import GossipConfig
from tests.net.helpers import _config
from tests.net.test_network_gossip import _gossip
from tests.net.test_network_iterative import _small

#: Seconds a failing run may take (it fails within a second or two of its fault).
BOUND = 30


class _ThreadHost:
    """A host served by a thread of this process (``host_main``, as a spawned host runs
    it), with a process's interface for the coordinator; ``kill`` cancels its run."""

    def __init__(self, bundle, hosts):
        self.name = f"host {bundle['host']} (a thread)"
        self.exitcode = None
        self.loop = self.task = None
        hosts.append(self)
        self.thread = threading.Thread(target=self._main, args=(bundle,), daemon=True)
        self.thread.start()

    def _main(self, bundle):
        try:
            host_module.host_main(**bundle)
            self.exitcode = 0
        except SystemExit as exit_:
            self.exitcode = exit_.code
        except asyncio.CancelledError:  # killed
            self.exitcode = -signal.SIGKILL

    def is_alive(self):
        return self.thread.is_alive()

    def join(self, timeout=None):
        self.thread.join(BOUND if timeout is None else timeout)

    def kill(self):
        if self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile
                self.loop.call_soon_threadsafe(self.task.cancel)


@pytest.fixture
def thread_hosts(monkeypatch):
    """Every host of a network run started as a :class:`_ThreadHost`; the list of them."""
    hosts: list[_ThreadHost] = []

    def launch(self, host, plan, bundle, *, last=False):
        return _ThreadHost(bundle, hosts)

    def recorded(serve):
        async def serve_recording(*args, **kwargs):
            me = next(h for h in hosts if h.thread is threading.current_thread())
            me.loop, me.task = asyncio.get_running_loop(), asyncio.current_task()
            await serve(*args, **kwargs)

        return serve_recording

    monkeypatch.setattr(RunHosts, "launch", launch)
    monkeypatch.setattr(host_module, "worker_signals", lambda: None)  # not the main thread
    monkeypatch.setattr(host_module, "serve", recorded(host_module.serve))
    yield hosts
    for host in hosts:
        host.kill()
        host.join(5)


@contextlib.contextmanager
def _within(seconds):
    """TimeoutError if the block still runs after ``seconds`` (a run that hangs)."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s: the run hangs")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _injected(*args, **kwargs):
    raise RuntimeError("injected")


def _fails(config, thread_hosts, match):
    """The network run of ``config`` fails with NetworkRunError matching ``match``, in less
    than BOUND seconds, and leaves no host running."""
    start = time.monotonic()
    with _within(BOUND), pytest.raises(NetworkRunError, match=match):
        simulate(config, runtime="network")
    assert time.monotonic() - start < BOUND
    assert thread_hosts
    for host in thread_hosts:
        host.join(5)
        assert not host.is_alive(), f"{host.name} still runs"


def test_a_fault_in_the_coordinators_handling_of_a_formed_group_fails_the_run(
    monkeypatch, thread_hosts
):
    """The lead's mutation: ``_on_formed`` raising made a gossip run hang."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    monkeypatch.setattr(GossipGroups, "_on_formed", _injected)
    _fails(
        _gossip(n_peers=6),
        thread_hosts,
        r"^network runtime: the coordinator, on a 'formed' frame from 'host-\d' failed: "
        "RuntimeError: injected$",
    )


def test_a_fault_in_a_hosts_frame_handler_fails_the_run_naming_the_host_and_peer(
    monkeypatch, thread_hosts
):
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    monkeypatch.setattr(PeerHost, "_on_assign", _injected)
    _fails(
        _config("group"),
        thread_hosts,
        r"^network runtime: host \d failed: HostError: peer \d+'s connection failed: "
        "RuntimeError: injected$",
    )
    # the failing host said why (its own line, status 3); the other one ended or was killed
    assert host_module.EXPLAINED in {h.exitcode for h in thread_hosts}
    assert {h.exitcode for h in thread_hosts} <= {0, host_module.EXPLAINED, -signal.SIGKILL}


def test_a_fault_in_a_hosts_formation_task_fails_the_run(monkeypatch, thread_hosts):
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    monkeypatch.setattr(HostFormation, "_formed", _injected)
    _fails(
        _gossip(n_peers=6),
        thread_hosts,
        r"host \d failed: HostError: peer \d+'s attempt \d+ failed: RuntimeError: injected$",
    )


def test_a_fault_in_an_iterative_hosts_rounds_fails_the_run(monkeypatch, thread_hosts):
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    monkeypatch.setattr(IterativeHost, "_report", _injected)
    config = dataclasses.replace(_small(), gossip=GossipConfig(degree=2))  # a ring
    _fails(config, thread_hosts, r"host \d failed: HostError: its rounds failed: RuntimeError")


def test_the_first_fault_cancels_the_main_coroutine_and_is_raised_naming_where():
    failure = Failure(ValueError, "party: ")
    cleaned = []

    async def main():
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append(True)

    async def run():
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, failure.call("a timer", _injected))
        loop.call_later(0.02, failure.call("a second timer", _injected))
        return await failure.race(main())

    with pytest.raises(ValueError, match="^party: a timer failed: RuntimeError: injected$"):
        asyncio.run(asyncio.wait_for(run(), 5))
    assert cleaned == [True]  # main's finally ran before the error

    async def quick():
        return 7

    assert asyncio.run(Failure().race(quick())) == 7  # no fault: main's result
