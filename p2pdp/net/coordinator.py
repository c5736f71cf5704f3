"""The coordinator of a network run: the central sampler, over TCP, and the run's bookkeeping.

:class:`NetworkWorld` is the network runtime's counterpart of :class:`p2pdp.sim.world.World`:
after :meth:`NetworkWorld.run` it holds the same outputs (published models, receipts,
release records, the budget ledger, message counters), so the experiment code scores a
network run exactly as it scores a simulated one.

The run: start the host processes (:mod:`p2pdp.net.host_process`), each with a
:class:`~p2pdp.net.hosts.Ticket` (no private key: a one-time token and the run's CA
certificate); sign each host's certificate signing request once, for the host index its token
was made for (:meth:`~p2pdp.net.tls.Authority.enroll`; a wrong or spent token, a request for
another identity and any other frame on the enrollment listener are refused and counted
``enroll``, and that listener closes once every host enrolled); learn every peer's port, send
everyone the directory; then, up to ``groups.max_concurrent_groups`` at a time (one: the
seed's sequential GroupAgent), start the groups the central sampler's machine decides on
(:class:`~p2pdp.protocols.oneshot.Sampler`, the simulator's, on the same protocol stream: the
same groups), send each member an ``ASSIGN`` frame, and wait for the curator's ``DONE``
report. A reported release charges every member (the ledger is the coordinator's: membership
is public) and its solvent members return to the pool. At the end every host reports what
it sent and received (``STATS``).

With ``groups.sampler = "gossip"`` the hosts form the groups themselves
(:mod:`p2pdp.net.gossip_host`): a host reports each group its peer formed (``formed``, with
every member's signed commitment and nonce); the coordinator checks that evidence, elects the
curator from the nonces, runs the group as above, tells the members' hosts when it ended
(``ended``), and stops the run as the simulator's gossip observer does, from the ledger and
each host's ``status`` (then ``halt``).

Faults. An assignment carries ``groups.collect_timeout``: the curator starts its own timer when
the assignment reaches it (its own clock; no clock is shared) and never releases once that ran
out, and the coordinator aborts the group (nobody charged) ``timeout`` seconds of slack after
that long since it sent the assignment (the slack covers the assignment and the report in
transit). A ``DONE`` that still arrives later is charged all the same (a release happened) and
logged as an error: an aborted group's members keep one charge held back for it, and each
group's curator draws the noise of its own index (the group id), never another's. A host process
whose control connection closes before its final report (killed, crashed) is lost: a group with
one of its peers is aborted at once, its peers leave the pool, and the run goes on without them
(their receipts and counts are lost with them: the ``wire`` table counts ``hosts lost``, the row
``hosts_lost``). A host that does not answer the final ``FINISH`` in time is killed and counted
the same way. ``transport.messages_lost`` (the row's ``messages_lost``) counts the run's frames that
were undeliverable or reached a curator past its group's timer
(:data:`~p2pdp.net.bookkeeping.LOST`), as every party that reported counted them, and the honest
publications refused because a forged copy with their group's id came first
(:data:`~p2pdp.net.hosts.PRE_EMPTED`); ``transport.messages_refused`` (the row's
``messages_refused``) the messages refused as outside the protocol
(:data:`~p2pdp.net.bookkeeping.REFUSED`). A host that exits or never connects while the hosts start
fails the run (:class:`~p2pdp.core.errors.NetworkRunError`, naming the host and its command).
So does a fault in a party's own code (not a refusal), the coordinator's callbacks' or one a
host reports (``failed``): at once, naming where it happened, every host stopped
(:mod:`p2pdp.net.failures`).

Around this module: the hosts' enrollment and control frames, and what the coordinator
accepts on them, are its base :class:`p2pdp.net.control.HostControl`; the groups gossip
formation brings, and the gossip run's stop, its base
:class:`p2pdp.net.gossip_coordinator.GossipGroups`; the run's clock and counts
:mod:`p2pdp.net.bookkeeping`.

What the coordinator sees: the groups it formed, the released models and their public records
(sensitivity, noise scale; ``noise_norm`` is analysis-only, as in the simulator). It never sees
a statistic, nor a host's private key (each host makes its own).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import signal
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from p2pdp.config import RUNTIME_READS, ScenarioConfig
from p2pdp.core.errors import ConfigError, NetworkRunError
from p2pdp.core.rng import Uniforms
from p2pdp.net.bookkeeping import LOST, REFUSED, Clock, MessageCounts, Monitor, WireStats
from p2pdp.net.connections import fresh
from p2pdp.net.control import HostControl
from p2pdp.net.failures import Failure
from p2pdp.net.gossip_coordinator import GossipGroups
from p2pdp.net.hosts import (
    DIRECTORY,
    EXPLAINED,
    FINISH,
    HostSettings,
    Ticket,
    hosts_of,
)
from p2pdp.net.tls import Authority, host_name, listen, resolve
from p2pdp.net.wire import encode, frame_bytes
from p2pdp.privacy.accounting import BudgetLedger
from p2pdp.privacy.release import ReleaseRecord
from p2pdp.protocols.groups import ASSIGN, SAMPLER, Group
from p2pdp.protocols.oneshot import COLLECT_TIMEOUT, Sampler, Stop

__all__ = ["NetworkWorld", "check_supported"]

log = logging.getLogger(__name__)

#: Seconds a host may take to start, prepare its peers' data and open their sockets.
STARTUP_TIMEOUT = 300.0
#: While waiting for hosts: the first notice naming the silent ones after NOTICE_AFTER s, then
#: one every NOTICE_EVERY s (a command that neither connects nor exits waits the whole timeout).
NOTICE_AFTER, NOTICE_EVERY = 10.0, 30.0


def check_supported(config: ScenarioConfig, *, scale_family: bool, per_release: bool) -> None:
    """ConfigError naming the first setting the network runtime does not run yet, for the
    one-shot protocol (an iterative one's: :func:`p2pdp.net.iterative_coordinator.
    check_iterative`)."""
    groups = config.groups
    refusals = [
        (
            config.protocol.iterative,
            "protocol.name",
            config.protocol.name,
            "'one-shot' here (iterative protocols: p2pdp.net.iterative_coordinator)",
        ),
        (
            groups.sampler not in ("central", "gossip"),
            "groups.sampler",
            groups.sampler,
            "'central' and 'gossip'",
        ),
        (
            groups.sampler == "gossip" and config.gossip.formation == "rounds",
            "gossip.formation",
            config.gossip.formation,
            "formation by messages ('messages', or 'auto', which means messages there)",
        ),
        (
            groups.sampler == "gossip" and config.gossip.churn,
            "gossip.churn",
            config.gossip.churn,
            "false (a host that dies is the network's churn)",
        ),
        *(
            (
                groups.sampler == "gossip" and getattr(config.gossip, key) > 0,
                f"gossip.{key}",
                getattr(config.gossip, key),
                "0 (no simulated crashes: kill a host instead)",
            )
            for key in ("curator_crash_probability", "member_crash_probability")
        ),
        (
            config.training.seconds_per_row > 0,
            "training.seconds_per_row",
            config.training.seconds_per_row,
            "0 (peers train before the run)",
        ),
        (
            not scale_family,
            "privacy.mechanism",
            config.privacy.mechanism,
            "a scale family (its curators replay the run's noise stream)",
        ),
        (per_release, "privacy.mechanism", config.privacy.mechanism, "one statistic per peer"),
    ]
    if config.privacy.secure_aggregation and config.privacy.min_shard_size is None:
        raise ConfigError(
            "privacy.secure_aggregation = true on the network runtime needs "
            "privacy.min_shard_size: members draw their noise shares before they know each "
            "other's shard sizes, so the sensitivity must follow a public bound"
        )
    for refused, key, value, supported in refusals:
        if refused:
            raise ConfigError(
                f"{key} = {json.dumps(value)} is not supported by the network runtime yet; it "
                f"runs {supported}"
            )


def _group_id(outcome: tuple[Group, Any, str]) -> int:
    return outcome[0].group_id


def _name(host: int, process: Any) -> str:
    """``host N (its command)``: a started host as the launcher names it."""
    return str(getattr(process, "name", "") or f"host {host}")


def _ended(host: int, process: Any) -> str:
    """How host process ``host`` ended: ``host 1 (false) exited with status 1``."""
    code = getattr(process, "exitcode", None)
    if code is None:
        how = "exited"
    elif code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with status {code}"
    return f"{_name(host, process)} {how}"


class NetworkWorld(HostControl, GossipGroups):
    """One run of the one-shot protocol between host processes; World's outputs after run().

    Parameters
    ----------
    config : ScenarioConfig
    n_peers : int
        P.
    dim : int or None
        The length of a statistic; None for a coordinator that holds no data: then the hosts'
        hellos say it (they must all agree, else :class:`~p2pdp.core.errors.NetworkRunError`
        naming each host's), and so, as :attr:`data_dependent_bounds`, whether any host's
        rows were scaled with bounds fitted on the pooled training fold.
    ledger : BudgetLedger or callable
        The run's ledger (built as the simulator builds it), or ``ledger(dim)`` making it
        once the hosts said ``dim``.
    rngs : dict
        ``"protocol"``: the stream of groups and curators (the simulator's).
    launch : callable
        ``launch(host_index, ticket) -> process`` starts host ``host_index`` (of ``hosts``)
        with its :class:`~p2pdp.net.hosts.Ticket`, or hands this run to a host process that
        serves several (``p2pdp.experiments.network.processes.RunHosts``; then ``process`` is this
        run's view of it, alive until the host says the run is over): it enrolls, connects
        to the coordinator with its new certificate and says where its peers listen; the
        process needs ``join``, ``is_alive`` and ``kill``, and may have a ``name`` (``host N
        (its command)``, for error messages) and an ``exitcode`` (None while it runs,
        ``-signal`` if killed).
    authority : Authority
        The run's CA (:mod:`p2pdp.net.tls`), held here only: it signs each host's certificate
        once, and every other connection is mutual TLS (a host may speak only for itself).
    hosts : int
        Host processes (peers are split evenly among them).
    settings : HostSettings
    observers : sequence
        :class:`~p2pdp.sim.world.WorldObserver`-like: told of groups started, released,
        aborted.
    exact : callable, optional
        ``exact(members) -> (d,)``: a group's aggregate without noise, FOR ANALYSIS ONLY (the
        experiment's process holds every statistic to evaluate the run): fills a release
        record's ``noise_norm`` that its curator could not know (secure aggregation).
    bind : str
        Address the coordinator listens on for the hosts (a hosts file's ``bind``; default
        loopback).
    """

    #: Messages cross a real network: no simulated ``[network]`` setting applies, only where
    #: the noise comes from (:mod:`p2pdp.net.host`; :mod:`p2pdp.core.reads`): the network
    #: runtime's entry of :data:`p2pdp.config.RUNTIME_READS`, where a config's check finds it.
    reads: ClassVar[tuple[str, ...]] = RUNTIME_READS["network"]

    def __init__(
        self,
        config: ScenarioConfig,
        *,
        n_peers: int,
        dim: int | None,
        ledger: BudgetLedger | Callable[[int], BudgetLedger],
        rngs: dict[str, np.random.Generator],
        launch: Callable[[int, Ticket], Any],
        hosts: int,
        settings: HostSettings,
        authority: Authority,
        observers: Sequence[Any] = (),
        exact: Callable[[np.ndarray], np.ndarray] | None = None,
        bind: str = "127.0.0.1",
    ) -> None:
        self.config = config
        self.n_peers, self.dim = n_peers, dim
        self._ledger = ledger
        if dim is not None:
            self._accounting(dim)
        self.data_dependent_bounds = False  # as the hosts say (a coordinator without data)
        self._dims: dict[int, int] = {}  # per host: the length of its statistics (its hello)
        self.launch = launch
        self.n_hosts = hosts
        self.settings = settings
        self.observers = tuple(observers)
        self.exact = exact
        self.bind = bind
        groups = config.groups
        # the central sampler's machine (p2pdp.protocols.oneshot), as the simulator's
        self.sampler = Sampler(
            Uniforms(rngs["protocol"]),
            group_size=groups.group_size,
            max_concurrent=groups.max_concurrent_groups,
            max_failed=groups.max_failed_attempts,
        )
        self._next_group = 0
        self.env = Clock()
        self.monitor = Monitor()
        self.transport = MessageCounts(
            messages_sent=np.zeros(n_peers, dtype=np.int64),
            bytes_sent=np.zeros(n_peers, dtype=np.int64),
        )
        self.wire = WireStats()
        self.published: list[np.ndarray] = []
        self.shared: list[bool] = []
        self.releases: list[ReleaseRecord] = []
        self.release_members: list[np.ndarray] = []
        self.curators: list[int] = []
        self.receipts: list[tuple[int, int]] = []
        self.port = 0  # where the coordinator listens, once it does
        self.ports: list[int] = []
        self.addresses = [""] * hosts  # where each host's peers listen (its HELLO)
        self.processes: list[Any] = []
        self._hosts: dict[int, asyncio.StreamWriter] = {}
        self._hello = asyncio.Event()
        self._stats: dict[int, dict[str, Any]] = {}
        self._all_stats = asyncio.Event()
        self._done: dict[int, asyncio.Future] = {}
        self._in_flight: dict[int, Group] = {}
        self._aborted: dict[int, Group] = {}  # groups aborted whose release never came
        self._held = np.zeros(n_peers, dtype=np.int64)  # per peer: aborted groups' charges
        self.position: dict[int, int] = {}  # group -> index of its release in published
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._used: dict[int, float] = {}  # peer -> when its connection was last used
        self.host_of = hosts_of(n_peers, hosts)
        self.authority = authority
        own = authority.credential
        self._server_tls, self._client_tls = own.context(server=True), own.context(server=False)
        self._enrollment_tls = own.context(server=True, clients=False)
        self._enrollment: asyncio.Server | None = None
        self.lost_hosts: set[int] = set()
        # the first fault of a callback (a control frame's handling, a host's ``failed``)
        self._failure = Failure(NetworkRunError, "network runtime: ")
        # gossip formation (groups.sampler = "gossip"): every host's signing key (its hello),
        # the groups reported formed and not yet started, what each host last said of its
        # formation (trying, attempts, ended frames carried out), ended frames sent per host
        self._signing: dict[int, bytes] = {}
        self._formed: list[tuple[np.ndarray, int]] = []
        self._formed_attempts: set[tuple[int, int]] = set()
        self._status: dict[int, tuple[int, int, int]] = {}
        self._ended_sent = Counter[int]()
        self._wake = asyncio.Event()

    #: The largest control frame before the statistics' length is known: a hello (its peers'
    #: ports, an address).
    _HELLO_BYTES = 4096

    @property
    def control_bytes(self) -> int:
        """The largest control frame a host sends: a release (one model, its group's member
        list), a formed group (per member a commitment, a signature, a nonce, a salt), or its
        final report (per peer its counts; receipts of 16 bytes, at most one
        per aggregation a peer can afford); a hello while ``dim`` is unknown."""
        if self.dim is None:
            return self._HELLO_BYTES + 16 * self.n_peers
        return (
            frame_bytes(self.dim, self.n_peers)
            + 160 * self.config.groups.group_size  # a formed group's evidence (gossip)
            + 40 * self.n_peers
            + 16 * self.n_peers * int(min(self.ledger.max_aggregations, 2**32))
            + 4096
        )

    def _accounting(self, dim: int) -> None:
        """The statistics have ``dim`` entries: the run's ledger."""
        self.dim = dim
        self.ledger = self._ledger(dim) if callable(self._ledger) else self._ledger

    def _agreed_dimension(self) -> None:
        """Every host said its statistics' length (hello): NetworkRunError naming each unless
        they all agree, with the coordinator's own if it has one; else that is ``dim``."""
        dims = set(self._dims.values()) | ({self.dim} if self.dim is not None else set())
        if len(dims) != 1:
            said = ", ".join(f"host {host}: {dim}" for host, dim in sorted(self._dims.items()))
            mine = f" (the coordinator's: {self.dim})" if self.dim is not None else ""
            raise NetworkRunError(
                f"network runtime: the hosts' statistics differ in length ({said}){mine}: "
                "their data are not all this scenario's (the same data set and preprocessing)"
            )
        if self.dim is None:
            self._accounting(dims.pop())

    def wire_rows(self) -> list[dict[str, Any]]:
        """What travelled on the wire (the ``wire`` table of the run)."""
        return self.wire.rows(len(self.lost_hosts))

    def run(self) -> None:
        """Run until no group can form; every host reported and exited (or was killed).
        A fault of the coordinator's own callbacks, or one a host reports (``failed``),
        ends the run at once: :class:`~p2pdp.core.errors.NetworkRunError` naming where it
        happened, every host stopped (:mod:`p2pdp.net.failures`)."""
        asyncio.run(self._failure.race(self._run()))

    async def _run(self) -> None:
        allowed = resolve(self.settings.allowed)
        try:
            server = await listen(
                self._control,  # its faults: HostControl._control reports them
                self.bind,
                self._server_tls,
                pending=self.n_hosts + 8,  # every host at the start, and some slack
                refused=self.wire.refused,
                allowed=allowed,
                per_identity=2,  # a host's control connection, and one to replace it
                total=2 * self.n_hosts,
                first_frame=self.settings.timeout,  # a host says hello at once
                failure=self._failure,
            )
        except OSError as error:
            raise ConfigError(
                f"the coordinator cannot listen on {self.bind!r} (a hosts file's bind): {error}"
            ) from None
        self.port = server.sockets[0].getsockname()[1]
        self._enrollment = enrollment = await listen(
            self._failure.handler("the coordinator's enrollment listener", self._enroll),
            self.bind,
            self._enrollment_tls,
            pending=self.n_hosts + 8,
            refused=self.wire.refused,
            allowed=allowed,
            per_identity=self.n_hosts + 8,  # no client certificate: one name (None) for all
            total=self.n_hosts + 8,
            first_frame=self.settings.timeout,
            failure=self._failure,
        )
        ended = False
        try:
            for i in range(self.n_hosts):  # one by one: if one cannot start, the others stop
                ticket = Ticket(
                    port=self.port,
                    enrollment_port=enrollment.sockets[0].getsockname()[1],
                    token=self.authority.token(i),
                    authority=self.authority.certificate,
                )
                self.processes.append(self.launch(i, ticket))
            await self._wait(self._hello, STARTUP_TIMEOUT, "every host to start")
            self._agreed_dimension()
            directory = encode(
                {
                    "kind": DIRECTORY,
                    "ports": self.ports,
                    "addresses": self.addresses,
                    "signing": [self._signing.get(h, b"") for h in range(self.n_hosts)],
                }
            )
            for host in list(self._hosts):
                self._tell(host, directory, DIRECTORY)
            self.env = Clock()
            gossip = self.config.groups.sampler == "gossip"
            await (self._gossip() if gossip else self._groups())
            self.monitor.end_time = self.env.now
            await self._finish()
            ended = True
        finally:
            server.close()
            enrollment.close()
            for writer in [*self._writers.values(), *self._hosts.values()]:
                writer.close()
            self._stop_processes(wait=ended)  # a failed run does not wait for its hosts

    async def _wait(self, event: asyncio.Event, timeout: float, what: str) -> None:
        """Until ``event`` is set; NetworkRunError (one line naming each host and its command)
        after ``timeout`` s, or as soon as a host process has exited (it will never answer)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline, notice = start + timeout, start + NOTICE_AFTER
        while not event.is_set():
            if loop.time() > notice:  # a host that neither connects nor exits: say who
                notice += NOTICE_EVERY
                silent = [_name(i, p) for i, p in enumerate(self.processes) if i not in self._hosts]
                log.warning(
                    "network runtime: waiting for %s, %.0f s of %.0f s%s",
                    what,
                    loop.time() - start,
                    timeout,
                    f"; not connected yet: {', '.join(silent)}" if silent else "",
                )
            dead = [(i, p) for i, p in enumerate(self.processes) if not p.is_alive()]
            if dead and all(getattr(p, "exitcode", None) == EXPLAINED for _, p in dead):
                raise NetworkRunError(  # each said why in its own line: nothing to add
                    f"network runtime: {'; '.join(_name(i, p) for i, p in dead)} stopped "
                    f"with the error above while waiting for {what}"
                )
            if dead:
                raise NetworkRunError(
                    f"network runtime: {'; '.join(_ended(i, p) for i, p in dead)} while "
                    f"waiting for {what} (its own error, if any, is above): check that a "
                    "hosts file's command starts `python -m p2pdp.experiments.network` and its "
                    "addresses are right; from a script, run under `if __name__ == "
                    '"__main__":` (spawned hosts import the main module again)'
                )
            if loop.time() > deadline:
                silent = [_name(i, p) for i, p in enumerate(self.processes) if i not in self._hosts]
                raise NetworkRunError(
                    f"network runtime: waited {timeout:.0f} s for {what}"
                    + (f"; never connected: {', '.join(silent)}" if silent else "")
                )
            try:
                await asyncio.wait_for(event.wait(), 0.2)
            except TimeoutError:
                pass

    def _stop_processes(self, *, wait: bool) -> None:
        for process in self.processes:
            if wait:
                process.join(timeout=self.settings.timeout)
            if process.is_alive():
                if wait:
                    log.warning("host process %s did not exit: killed", process)
                process.kill()
                process.join()

    def _tell(self, host: int, frame: bytes, kind: str) -> bool:
        """Write the control ``frame`` (of ``kind``) to ``host``, unless the host is lost or its
        control connection is already closing (a host that died: its reader marks it lost,
        and a write to a closed TLS transport raises); whether it was written."""
        writer = self._hosts.get(host)
        if writer is None or host in self.lost_hosts or writer.is_closing():
            return False
        writer.write(frame)
        self.wire.add(kind, len(frame))
        return True

    # -- assignments (the coordinator's frames to peers) --------------------------------------
    async def _send(self, peer: int, message: dict[str, Any]) -> None:
        fresh(self._writers, self._used, peer, self.settings.peer_idle)
        if peer not in self._writers:
            _, self._writers[peer] = await asyncio.wait_for(
                asyncio.open_connection(
                    self.addresses[int(self.host_of[peer])],
                    self.ports[peer],
                    ssl=self._client_tls,
                    server_hostname=host_name(int(self.host_of[peer])),
                ),
                self.settings.timeout,
            )
        frame = encode(message)
        self.wire.add(message["kind"], len(frame))
        writer = self._writers[peer]
        writer.write(frame)
        await asyncio.wait_for(writer.drain(), self.settings.timeout)

    # -- the sampler -------------------------------------------------------------------------
    async def _groups(self) -> None:
        """Drive the central sampler's machine (:class:`p2pdp.protocols.oneshot.Sampler`, the
        simulator's too: the same draws in the same order): start each group it decides on
        (up to ``groups.max_concurrent_groups`` in flight), and tell it how each group ended
        and which members may join another as soon as it ends, then ask it again.

        With more than one group in flight, groups end in the order their curators report,
        and the machine refills at each end. The simulator's constant latency ends a wave's
        groups at one instant and refills once, so with seeded noise (parity) the machine is
        told of a wave's ends only once all of them came, in group order, as the simulator
        tells it: the same groups, releases and rows (docs/guide/network.md)."""
        machine = self.sampler
        machine.start(list(range(self.n_peers)) if self.ledger.max_aggregations else [], 0)
        running: set[asyncio.Task[tuple[Group, dict[str, Any] | None, str]]] = set()
        waves = self.settings.seeded_noise  # parity: refill once per wave, as the simulator
        try:
            while True:
                for effect in machine.fill():
                    if isinstance(effect, Stop):  # no group in flight, none to come
                        self.monitor.stop_reason = effect.reason
                        return
                    group = Group(self._next_group, effect.members, effect.curator,
                                  started=self.env.now)  # fmt: skip
                    self._next_group += 1
                    running.add(asyncio.create_task(self._aggregate(group)))
                if not running:  # the machine neither starts a group nor stops: a bug
                    raise RuntimeError("the sampler started no group and did not stop")
                when = asyncio.ALL_COMPLETED if waves else asyncio.FIRST_COMPLETED
                ended, running = await asyncio.wait(running, return_when=when)
                # a failure of the run's own is raised here; ends at once in group order
                for outcome in sorted((task.result() for task in ended), key=_group_id):
                    solvent = self._conclude(*outcome)
                    machine.finished(outcome[0].members, published=not outcome[2],
                                     solvent=solvent)  # fmt: skip
        finally:
            for task in running:
                task.cancel()

    async def _aggregate(self, group: Group) -> tuple[Group, dict[str, Any] | None, str]:
        """One group: assign it, wait for its curator's ``DONE`` (or abort it: collect timeout
        with slack, a member unreachable or its host lost); the group, the report and why it
        was aborted ("" if it was not), for :meth:`_conclude`."""
        config = self.config
        members, curator = group.members, group.curator
        for observer in self.observers:
            observer.group_started(self, group)
        future = self._done[group.group_id] = asyncio.get_running_loop().create_future()
        self._in_flight[group.group_id] = group
        collect = config.groups.collect_timeout
        assign = {
            "kind": ASSIGN,
            "sender": SAMPLER,
            "group": group.group_id,
            "members": members.tolist(),
            "curator": curator,
            # the curator's draw of the noise stream: the group's own, never reused (with
            # no abort, the release's index, as in the simulator)
            "release": group.group_id,
            "timeout": collect,  # the curator's own timer: it never releases after it
        }
        reason, report = "", None
        try:
            for member in members.tolist():
                await self._send(member, assign)
                self.transport.control_messages += 1
            report = await asyncio.wait_for(future, collect + self.settings.timeout)
            reason = "a member's host was lost" if report is None else ""
        except TimeoutError:
            reason = COLLECT_TIMEOUT
            self._hold(group)
        except OSError as error:  # a member's socket is unreachable
            reason = f"a member is unreachable ({error})"
            self._hold(group)
        finally:
            del self._done[group.group_id], self._in_flight[group.group_id]
        return group, report, reason

    def _conclude(self, group: Group, report: dict[str, Any] | None, reason: str) -> np.ndarray:
        """Charge and keep ``group``'s release (or count its abort); which of its members
        may join another group, (g,) bool."""
        members = group.members
        if reason:
            self.monitor.aborted += 1
            for observer in self.observers:
                observer.aborted(self, group, reason)
        else:
            assert report is not None
            self._released(group, report, full=self.config.publication.mode == "full")
        # who may join another group: those that can afford one more aggregation beyond the
        # charges held back, whose host is still there
        return self._solvent(members)

    def _solvent(self, peers: np.ndarray) -> np.ndarray:
        """Which of ``peers`` can afford one more aggregation beyond the charges held back,
        and are on a host still there."""
        held = self.ledger.aggregations(peers) + self._held[peers]
        return (held < self.ledger.max_aggregations) & ~np.isin(
            self.host_of[peers], list(self.lost_hosts)
        )

    def _released(self, group: Group, report: dict[str, Any], *, full: bool) -> None:
        """The curator released: charge the members, keep the release and its record."""
        self.ledger.spend(group.members)  # refuses (all or nothing) a member that is broke
        record, model = report["record"], report["model"]
        self.position[group.group_id] = len(self.published)
        if math.isnan(record.noise_norm) and self.exact is not None:  # analysis only
            noise = model - self.exact(group.members)
            record = record._replace(noise_norm=float(np.linalg.norm(noise)))
        self.releases.append(record)
        self.release_members.append(group.members.copy())
        self.curators.append(group.curator)
        for observer in self.observers:
            observer.released(self, group, record)
        self.published.append(model)
        self.shared.append(full)  # every peer is online: a full publication reaches everyone
        self.monitor.aggregations += 1

    # -- the end -----------------------------------------------------------------------------
    async def _gather_final_reports(self, finish_frame: Callable[[int], bytes]) -> None:
        """Send every host still in the run its ``FINISH`` frame, wait for the final reports,
        and add each report's wire frames and refusals to :attr:`wire`.

        Parameters
        ----------
        finish_frame
            The encoded ``FINISH`` frame for a host, given its index.

        Notes
        -----
        A host that has not reported ``3 * timeout`` seconds later is lost (and its process
        killed), as one whose connection closed. The subclasses' ``_finish`` then fold in what
        their own protocol counts from :attr:`_stats`.
        """
        for host in list(self._hosts):
            self._tell(host, finish_frame(host), FINISH)
        self._check_all_stats()
        try:
            await asyncio.wait_for(self._all_stats.wait(), self.settings.timeout * 3)
        except TimeoutError:
            for host in set(range(self.n_hosts)) - set(self._stats) - self.lost_hosts:
                self._host_lost(host, "no final report in time")
                self.processes[host].kill()
        for stats in self._stats.values():
            for kind, (frames, n_bytes) in stats["wire"].items():
                self.wire.frames[kind] += int(frames)
                self.wire.bytes[kind] += int(n_bytes)
            for reason, count in stats["refused"].items():
                self.wire.refused[reason] += int(count)

    async def _finish(self) -> None:
        """Tell every host the run is over and how many publications its peers must have
        received; gather what each sent and received."""
        host_of = self.host_of
        expected = np.zeros(self.n_hosts, dtype=np.int64)
        full = self.config.publication.mode == "full"
        for members, curator in zip(self.release_members, self.curators, strict=True):
            receivers = np.arange(self.n_peers) if full else members
            np.add.at(expected, host_of[receivers], 1)
            expected[host_of[curator]] -= 1  # the curator holds its release
        released = [[group, self.curators[position]] for group, position in self.position.items()]
        # which groups were released by whom: hosts count only those receipts (full
        # publication), and the publications of those they refused (pre-empted)
        await self._gather_final_reports(
            lambda host: encode(
                {"kind": FINISH, "publications": int(expected[host]), "released": released}
            )
        )
        for stats in self._stats.values():
            for peer, messages, n_bytes in stats["sent"]:
                self.transport.messages_sent[int(peer)] += int(messages)
                self.transport.bytes_sent[int(peer)] += int(n_bytes)
            if not full:  # (peer, group) pairs; a group's model is at its position
                position = self.position
                self.receipts.extend(
                    (peer, position[group])
                    for peer, group in stats["receipts"].tolist()
                    if group in position
                )
        # the protocol's frames that did not serve: undeliverable, or past their group's timer,
        # as the reporting parties counted them (a lost host's own counts are lost with it);
        # and the publications of released groups refused because a forged copy came first;
        # frames refused as outside the protocol (forged, malformed) are messages_refused,
        # refused connections (strangers', beyond a name's bound) the wire table's only
        self.transport.messages_lost = sum(self.wire.refused[r] for r in LOST)
        self.transport.messages_refused = sum(self.wire.refused[r] for r in REFUSED)
