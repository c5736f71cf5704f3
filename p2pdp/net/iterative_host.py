"""The iterative protocols (D-PSGD, Muffliato) on the real network: one host process's side.

A host process runs some peers of the run. Each peer is its transport-free machine
(:class:`~p2pdp.protocols.iterative_peer.SynchronousPeer`: its model, its steps, its own
noise and sampling streams, its inbox, what it accepts); this module only delivers it
messages and time, over mutual TLS with the run's CA (:mod:`p2pdp.net.tls`), every message
a :data:`~p2pdp.net.wire.MODEL` frame (:mod:`p2pdp.net.wire`), and passes its effects on:
its sends to the wire, its timers to the clock, its records (steps, averagings, late
models) to the coordinator.

Time. The coordinator's ``START`` says in how many seconds round 1 begins; the host counts
them on its own monotonic clock from the frame's arrival (no clock is shared: hosts start
within the frame's transit time of each other). Round ``r`` begins ``(r - 1) period``
seconds after that (``period`` = ``protocol.round_period``, **wall seconds**): every
machine gets ``on_round`` (its private step, its sends, a timer at the exchange's deadline,
``period / gossip_steps`` later); at a timer, ``on_deadline`` (it averages what arrived in
time by its own Metropolis-Hastings row, then sends the next exchange or ends the round).
The ``now`` a machine is given is the scheduled time in seconds since the start, so its
timers are the schedule's, whatever the event loop's lag. A model that arrives after its
exchange's deadline is **late**: the machine reads it and does not average it (a ``Late``
record, reported to the coordinator for the privacy ledger), as in the simulator.

What a frame must be to reach a machine (else refused, counted under ``model``): from the
host that runs its ``sender`` (its TLS certificate's name), to a peer of this host, well
formed (:func:`~p2pdp.net.wire.parse_model`). The machine then refuses what its state does
not allow (not a neighbour, a second copy, an exchange that does not exist; counted under
its reason). A model for the exchange right after the receiver's (its sender's clock runs a
little ahead) waits here until the receiver enters that exchange, at most one per sender
and receiver (a second is refused as a duplicate); one further ahead is dropped
(``ahead``: an honest sender far ahead, lost). So what the host holds is bounded by its
peers' degrees; a frame is at most ``8 d`` bytes and a little more
(:func:`~p2pdp.net.wire.frame_bytes`); the listener holds at most two connections per host
(:func:`p2pdp.net.tls.listen`).

Noise. By default every peer's streams derive from roots this host draws from the
operating system's CSPRNG (:meth:`StreamSeeds.fresh
<p2pdp.protocols.peer_streams.StreamSeeds.fresh>`), in this process: nothing another
party holds determines the noise, and it never leaves the process. With
``network.seeded_noise = true`` (parity tests, NOT private) the roots come from the run's
seeded streams (:meth:`StreamSeeds.from_rngs
<p2pdp.protocols.peer_streams.StreamSeeds.from_rngs>`), as in the simulator, so every
peer draws the simulator's noise and the run's models are the simulator's.

Pair noise (D-PSGD, ``protocol.pairwise_noise_multiplier > 0``). After the directory, each
host sends every host that runs a neighbour of its peers their X25519 public keys (a
``KEYS`` frame; :mod:`p2pdp.net.pair_keys`), accepts each neighbour's key once, from the
host that runs it, and, once it holds every one, derives each pair's secret, gives its
machines their pair streams and says ``KEYED`` to the coordinator, which starts the rounds
only when every host has. No private key, secret or draw leaves the process.

Reports. After each round the host sends the coordinator a ``ROUND`` report: which of its
peers stepped, per exchange the overlay edges (:class:`~p2pdp.protocols.mixing.Mixing` CSR
positions) into its peers whose model was averaged, how many models each of its peers sent,
the late arrivals since its last report, and its peers' models. The models are for the
coordinator's test-error measurement, the simulator's omniscient measurement of the run,
not a release of the protocol (as the one-shot runtime's scoring).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pdp.net.connections import (
    connect_control,
    ended_or_failed,
    enroll,
    fresh,
    serve_frames,
)
from p2pdp.net.failures import Failure
from p2pdp.net.hosts import FINISH, HELLO, STATS, HostError, Ticket, hosts_of
from p2pdp.net.pair_keys import KEYS, PairKeys
from p2pdp.net.tls import Credential, host_name, identity, listen, resolve
from p2pdp.net.wire import (
    MODEL,
    ModelFrame,
    ProtocolError,
    encode,
    frame_bytes,
    integer,
    model_frame,
    pack_vector,
    parse_model,
    read_frame,
)
from p2pdp.protocols.iterative_peer import (
    Averaged,
    Effect,
    GossipPeer,
    Late,
    Received,
    Send,
    Stepped,
    SynchronousPeer,
    Timer,
)

__all__ = [
    "AHEAD",
    "KEYED",
    "LATE",
    "ROUND",
    "START",
    "IterativeHost",
    "IterativeSettings",
    "serve_iterative",
]

log = logging.getLogger(__name__)

#: A peer's machine: the synchronous protocols' or gossip learning's.
Machine = SynchronousPeer | GossipPeer

#: Control kinds of an iterative run: the coordinator's start (round 1 begins ``delay``
#: seconds after it arrives) and a host's report of one round.
START, ROUND = "start", "round"
#: A host's word to the coordinator that every pair of its peers with a neighbour has its
#: secret (correlated noise): the coordinator starts the rounds once every host said it.
KEYED = "keyed"
#: The ``wire`` table's count of models that arrived past their exchange's deadline (gossip
#: learning: past the time the simulator would deliver them).
LATE = "late"
#: A model more than one exchange ahead of its receiver: dropped here (lost).
AHEAD = "ahead"
#: Models whose receiver's host could not be reached (lost); gossip learning's models that
#: arrive after the run's end (in flight at the end: dropped, as the simulator drops them).
UNREACHABLE, IN_FLIGHT = "unreachable", "in flight"


@dataclass(frozen=True)
class IterativeSettings:
    """What every host knows of an iterative run.

    Attributes
    ----------
    n_peers, hosts : int
        P, and the host processes (peers split evenly in id order, :func:`hosts_of`).
    rounds, exchanges : int
        ``protocol.rounds``; averagings per round (``protocol.gossip_steps`` for Muffliato,
        1 for D-PSGD).
    period : float
        Wall seconds of one round (``protocol.round_period``: its simulated seconds, one to
        one).
    dim : int
        A model's length d.
    timeout : float
        Seconds any wait for a frame's body, a connection or a report may take.
    idle_timeout : float
        Seconds the control connection may stay silent (the run's longest pause).
    allowed : tuple of str
        If not empty, the only addresses the listener accepts (a hosts file's allowlist).
    pair_keys : bool
        D-PSGD with pair noise: the hosts agree their peers' pair secrets
        (:mod:`p2pdp.net.pair_keys`) and say :data:`KEYED` before the rounds start.
    """

    n_peers: int
    hosts: int
    rounds: int
    exchanges: int
    period: float
    dim: int
    timeout: float = 10.0
    idle_timeout: float = 600.0
    allowed: tuple[str, ...] = ()
    pair_keys: bool = False

    def __post_init__(self) -> None:
        counts = {"n_peers": self.n_peers, "rounds": self.rounds, "exchanges": self.exchanges,
                  "dim": self.dim}  # fmt: skip
        for name, value in counts.items():
            if type(value) is not int or value < 1:
                raise ValueError(f"IterativeSettings.{name} must be an integer >= 1, got {value!r}")
        if not 1 <= self.hosts <= self.n_peers:
            raise ValueError(f"IterativeSettings.hosts must be in [1, n_peers], got {self.hosts}")
        for name, seconds in (("period", self.period), ("timeout", self.timeout)):
            if not 0 < seconds < float("inf"):
                raise ValueError(f"IterativeSettings.{name} must be > 0 seconds, got {seconds!r}")

    @property
    def slots(self) -> int:
        """Exchanges in the run."""
        return self.rounds * self.exchanges

    @property
    def peer_idle(self) -> float:
        """Seconds a connection between hosts may stay silent: a round and two timeouts."""
        return self.period + 2 * self.timeout


@dataclass
class _Counters:
    """What this host sent on the wire, and refused."""

    wire: Counter = field(default_factory=Counter)  # kind -> frames sent
    wire_bytes: Counter = field(default_factory=Counter)  # kind -> bytes sent on the wire
    refused: Counter = field(default_factory=Counter)  # reason -> frames refused
    idle_closed: int = 0  # connections closed after peer_idle silent seconds (not refused)


class IterativeHost:
    """Several peers of one iterative run in this process, behind one TLS listener.

    Parameters
    ----------
    machines : dict
        Peer id -> its :class:`~p2pdp.protocols.iterative_peer.SynchronousPeer`, the peers
        this host runs.
    edges : dict
        ``(sender, receiver) -> edge``: the overlay's CSR position of every edge into this
        host's peers (:class:`~p2pdp.protocols.mixing.Mixing`; public).
    settings : IterativeSettings
    report : callable
        ``report(message)`` sends a control frame to the coordinator.
    credential : Credential or None
        This host's TLS identity; None: plain TCP and no sender check (tests of the protocol
        alone).
    pair_keys : PairKeys or None
        Its peers' key pairs for the pair secrets (D-PSGD with pair noise): the machines get
        their pair streams once every neighbour's public key is here (:meth:`offer_keys`).
    """

    def __init__(
        self,
        machines: dict[int, Machine],
        edges: dict[tuple[int, int], int],
        settings: IterativeSettings,
        *,
        report: Callable[[dict[str, Any]], None],
        credential: Credential | None = None,
        pair_keys: PairKeys | None = None,
    ) -> None:
        self.machines = machines
        self.pair_keys = pair_keys
        self.keyed = asyncio.Event()  # every machine has its pair streams
        self.edge = edges
        self.settings = settings
        self.report = report
        self.credential = credential
        self.host_of = hosts_of(settings.n_peers, settings.hosts)
        self._server_tls = credential.context(server=True) if credential else None
        self._client_tls = credential.context(server=False) if credential else None
        self.counters = _Counters()
        self.frame_bytes = frame_bytes(settings.dim, 0)
        if pair_keys is not None:  # a KEYS frame: up to every peer's 32-byte key and more
            self.frame_bytes = max(self.frame_bytes, 64 * settings.n_peers + 1024)
        self.addresses: list[str] = []  # every host's address, from the directory
        self.ports: list[int] = []  # every host's listener, likewise
        self.late: list[list[int]] = []  # [slot, edge] read late since the last report
        self.early: dict[int, dict[int, ModelFrame]] = {p: {} for p in machines}  # by sender
        self.server: asyncio.base_events.Server | None = None
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._used: dict[int, float] = {}
        self._outbox: asyncio.Queue[tuple[int, bytes, int] | None] = asyncio.Queue()
        self._batch: dict[int, list[bytes]] = {}  # host -> frames of the exchange being sent
        self._sending: asyncio.Future | None = None
        self.now = 0.0  # seconds since the start, as scheduled (what machines are given)
        #: The exchange (0-based over the run) the machines are in or last closed (-1 before
        #: round 1): every machine of the host keeps the same schedule.
        self.slot = -1
        # what the current round's events said, for its report
        self._stepped: list[int] = []
        self._averaged: list[list[int]] = [[] for _ in range(settings.exchanges)]
        self._sent = {peer: 0 for peer in machines}  # models each sent this round
        self._timers: set[float] = set()
        self._lost = 0  # models not delivered since the last report
        self.gossip = any(isinstance(m, GossipPeer) for m in machines.values())
        # gossip learning: the loop's time of the start, every peer's phase, the hold (s),
        # the events to come (time, order, a peer's wake-up or a model), a model's arrival
        self._start: float | None = None
        self.phases: np.ndarray | None = None
        self.hold = 0.0
        self._events: list[tuple[float, int, Any]] = []
        self._order = 0
        self._arrival = asyncio.Event()
        self._over = False  # gossip learning: the run's last round ended
        self.failure = Failure(HostError)  # the first fault of its callbacks: ends its run

    # -- sockets -----------------------------------------------------------------------------
    async def listen(self, address: str = "127.0.0.1") -> int:
        """Open this host's listener and start its sender task; its port. A fault of either
        (not a refusal) goes to :attr:`failure`, which ends the host's run
        (:mod:`p2pdp.net.failures`)."""
        self._sending = self.failure.spawn("its sender task", self._sender())
        hosts = self.settings.hosts
        serve = self.failure.handler("a connection from another host", self._serve)
        if self._server_tls is None:  # tests of the protocol alone
            self.server = await asyncio.start_server(serve, address, 0)
        else:
            self.server = await listen(
                serve,
                address,
                self._server_tls,
                pending=hosts + 8,
                refused=self.counters.refused,
                allowed=resolve(self.settings.allowed),
                per_identity=2,  # one connection from each other host, and one to replace it
                total=2 * hosts,
                first_frame=self.settings.timeout,
                failure=self.failure,
            )
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read model frames until the connection closes; a frame that breaks the wire format
        closes this connection only."""
        who = identity(writer)
        try:
            await serve_frames(
                reader,
                lambda message: self.handle(message, who),
                self.settings,
                self.frame_bytes,
                self.counters,
            )
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()

    def handle(self, message: dict[str, Any], who: str | None) -> None:
        """One frame from the party authenticated as ``who`` (its certificate's name; not
        checked without a credential: tests of the protocol alone)."""
        if message.get("kind") == KEYS:
            self._keys(message, who)
            return
        settings = self.settings
        try:
            frame = parse_model(
                message,
                n_peers=settings.n_peers,
                rounds=settings.rounds,
                exchanges=settings.exchanges,
                dim=settings.dim,
            )
            owner = host_name(int(self.host_of[frame.sender]))
            if self.credential is not None and who != owner:
                raise ProtocolError(f"{who!r} sends as peer {frame.sender}")
            if frame.receiver not in self.machines:
                raise ProtocolError(f"peer {frame.receiver} is not on this host")
        except ProtocolError as error:
            self.counters.refused[MODEL if message.get("kind") == MODEL else "unknown"] += 1
            log.warning("refused a frame: %s", error)
            return
        self._deliver(frame)

    # -- pair keys (correlated noise) --------------------------------------------------------
    def offer_keys(self) -> None:
        """Send each host that runs a neighbour of its peers their public keys (one
        :data:`~p2pdp.net.pair_keys.KEYS` frame each: public values only); its machines get
        their pair streams if nothing is awaited."""
        assert self.pair_keys is not None
        me = int(self.host_of[next(iter(self.machines))])
        for host, entries in self.pair_keys.offers().items():
            frame = encode({"kind": KEYS, "host": me, "keys": entries})
            self.counters.wire[KEYS] += 1
            self.counters.wire_bytes[KEYS] += len(frame)
            self._outbox.put_nowait((host, frame, 1))
        self._keyed_if_ready()

    def _keys(self, message: dict[str, Any], who: str | None) -> None:
        """A KEYS frame: its entries kept if the host authenticated as ``who`` runs their
        peers, they neighbour this host's peers and come once (:meth:`PairKeys.accept
        <p2pdp.net.pair_keys.PairKeys.accept>`); else refused, counted under ``keys``. Without
        a credential (tests of the protocol alone) the frame's ``host`` is believed."""
        try:
            if self.pair_keys is None:
                raise ProtocolError("keys in a run without pair noise")
            sender = integer(message.get("host"), "keys host", 0, self.settings.hosts)
            if self.credential is not None and who != host_name(sender):
                raise ProtocolError(f"{who!r} sends keys as host {sender}")
            self.pair_keys.accept(sender, message.get("keys"))
        except ProtocolError as error:
            self.counters.refused[KEYS] += 1
            log.warning("refused a keys frame: %s", error)
            return
        self._keyed_if_ready()

    def _keyed_if_ready(self) -> None:
        """Once every neighbour's key is here: each machine's pair streams, and KEYED."""
        keys = self.pair_keys
        if keys is None or self.keyed.is_set() or not keys.ready:
            return
        for peer, machine in self.machines.items():
            machine.pairs = list(keys.streams(peer))
        self.keyed.set()
        self.report({"kind": KEYED})

    def _deliver(self, frame: ModelFrame) -> None:
        """``frame`` to its receiver's machine, or kept until the receiver enters the next
        exchange (one per sender), or dropped (further ahead: ``ahead``)."""
        machine = self.machines[frame.receiver]
        if isinstance(machine, GossipPeer):
            self._hold(frame)
            return
        exchanges = self.settings.exchanges
        slot = (frame.round - 1) * exchanges + frame.exchange
        following = self.slot + 1
        if slot == following:
            kept = self.early[frame.receiver]
            if frame.sender in kept:
                machine.refused["duplicate"] += 1
            else:
                kept[frame.sender] = frame
            return
        if slot > following:
            self.counters.refused[AHEAD] += 1
            return
        self._effects(
            frame.receiver,
            machine.on_message(self.now, frame.sender, frame.round, frame.exchange, frame.model),
        )

    def _synchronous(self, peer: int) -> SynchronousPeer:
        machine = self.machines[peer]
        assert isinstance(machine, SynchronousPeer)
        return machine

    def _replay(self, peer: int) -> None:
        """The models kept for the exchange ``peer`` just entered, to its machine."""
        kept = self.early[peer]
        if not kept:
            return
        machine = self._synchronous(peer)
        for sender, frame in list(kept.items()):
            slot = (frame.round - 1) * self.settings.exchanges + frame.exchange
            if slot <= self.slot:  # now current (or past): the machine judges it
                del kept[sender]
                self._effects(
                    peer,
                    machine.on_message(self.now, sender, frame.round, frame.exchange, frame.model),
                )

    def _effects(self, peer: int, effects: list[Effect]) -> None:
        """Peer ``peer``'s machine's effects: sends to the wire, timers to the clock, records
        to the round's report."""
        for effect in effects:
            if isinstance(effect, Send):
                self._send(peer, effect)
            elif isinstance(effect, Timer):
                self._timers.add(effect.at)
            elif isinstance(effect, Stepped):
                self._stepped.append(effect.peer)
            elif isinstance(effect, Received):
                self._averaged[0].append(self.edge[(effect.sender, effect.peer)])
            elif isinstance(effect, Averaged):
                self._averaged[effect.exchange].extend(
                    self.edge[(sender, effect.peer)] for sender in effect.senders
                )
            elif isinstance(effect, Late):
                slot = (effect.round - 1) * self.settings.exchanges + effect.exchange
                self.late.append([slot, self.edge[(effect.sender, effect.peer)]])

    def _send(self, sender: int, send: Send) -> None:
        """One model, counted now (as the simulator counts it: a message of ``64 + 8 d``
        bytes), to its receiver's machine at once if it is on this host, else batched for
        its host until :meth:`flush`."""
        self._sent[sender] += 1
        frame = ModelFrame(sender, send.to, send.round, send.exchange, send.model)
        if send.to in self.machines:  # a peer of this host: no socket to cross
            self._deliver(frame)
            return
        encoded = model_frame(frame)
        self.counters.wire[MODEL] += 1
        self.counters.wire_bytes[MODEL] += len(encoded)
        self._batch.setdefault(int(self.host_of[send.to]), []).append(encoded)

    def flush(self) -> None:
        """Hand the sender task what was batched: one write per host."""
        for host, frames in self._batch.items():
            self._outbox.put_nowait((host, b"".join(frames), len(frames)))
        self._batch = {}

    async def _writer(self, host: int) -> asyncio.StreamWriter:
        fresh(self._writers, self._used, host, self.settings.peer_idle)
        if host not in self._writers:
            _, self._writers[host] = await asyncio.wait_for(
                asyncio.open_connection(
                    self.addresses[host],
                    self.ports[host],
                    ssl=self._client_tls,
                    server_hostname=host_name(host) if self._client_tls else None,
                ),
                self.settings.timeout,
            )
        return self._writers[host]

    async def _sender(self) -> None:
        """Write the outbox in order; a host that cannot be reached costs its frames
        (counted ``unreachable``: lost), never this task. Each write is drained (with a
        timeout) before the next: back-pressure, so no backlog grows without bound."""
        while True:
            item = await self._outbox.get()
            if item is None:
                return
            host, frame, n_frames = item
            try:
                writer = await self._writer(host)
                if writer.is_closing():
                    raise ConnectionResetError("connection closed")
                writer.write(frame)
                await asyncio.wait_for(writer.drain(), self.settings.timeout)
            except (OSError, TimeoutError) as error:
                self.counters.refused[UNREACHABLE] += n_frames
                self._lost += n_frames
                self._writers.pop(host, None)
                log.warning("models to host %d not delivered: %s", host, error)

    async def close(self) -> None:
        if self._sending is not None:
            self._sending.cancel()
        if self.server is not None:
            self.server.close()
        for writer in self._writers.values():
            writer.close()

    # -- rounds ------------------------------------------------------------------------------
    async def _until(self, start: float, at: float) -> None:
        """Sleep until ``at`` seconds after ``start`` (the loop's clock); then it is ``at``."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        self.now = at

    async def run(self, start: float) -> None:
        """Every round, paced by the event loop's clock from ``start`` (its ``time()``): the
        machines' rounds and their timers; a ``ROUND`` report after each round."""
        settings = self.settings
        peers = sorted(self.machines)
        if self.pair_keys is not None and not self.keyed.is_set():
            raise ProtocolError("the rounds start before every pair secret is agreed")
        for round_ in range(1, settings.rounds + 1):
            await self._until(start, (round_ - 1) * settings.period)
            for peer in peers:  # models to this host's peers wait until every one is there
                self._effects(peer, self._synchronous(peer).on_round(self.now, round_))
            self.slot = (round_ - 1) * settings.exchanges
            for peer in peers:
                self._replay(peer)
            self.flush()
            while self._timers:  # the exchanges' deadlines, as the machines set them
                at = min(self._timers)
                self._timers.discard(at)
                await self._until(start, at)
                for peer in peers:
                    self._effects(peer, self._synchronous(peer).on_deadline(self.now))
                if self._timers:  # the round's next exchange is open
                    self.slot += 1
                    for peer in peers:
                        self._replay(peer)
                self.flush()
            self._report(round_)

    def _report(self, round_: int) -> None:
        """The ``ROUND`` report of ``round_``: what the machines' records said since the
        last one, and their models."""
        peers = sorted(self.machines)
        late, self.late = self.late, []
        self.report(
            {
                "kind": ROUND,
                "round": round_,
                "stepped": self._stepped,
                "delivered": self._averaged,
                "sent": [self._sent[p] for p in peers],
                "late": late,
                "lost": self._lost,
                "models": pack_vector(np.stack([self.machines[p].model for p in peers])),
            }
        )
        self._stepped = []
        self._averaged = [[] for _ in range(self.settings.exchanges)]
        self._sent = dict.fromkeys(peers, 0)
        self._lost = 0

    def _hold(self, frame: ModelFrame) -> None:
        """Gossip learning: ``frame`` waits until the time the simulator would deliver it,
        its sender's wake-up plus ``hold`` seconds (the loop in :meth:`run_gossip` merges it
        then); one that comes after that time is merged at once (counted late: the order of
        merges may differ from the simulator's), one after the run's end is dropped (in
        flight), one more than a period ahead is dropped (``ahead``)."""
        if self._over or self._start is None or self.phases is None:
            self.counters.refused[IN_FLIGHT] += 1
            return
        settings = self.settings
        sent = float(self.phases[frame.sender]) + (frame.round - 1) * settings.period
        due = sent + self.hold
        if due > self.now + settings.period + self.hold:
            self.counters.refused[AHEAD] += 1
            return
        if due < self.now:
            self.late.append([frame.round - 1, self.edge[(frame.sender, frame.receiver)]])
            due = self.now
        self._order += 1
        heapq.heappush(self._events, (due, self._order, frame))
        self._arrival.set()

    async def run_gossip(self, start: float, phases: np.ndarray, hold: float) -> None:
        """Gossip learning, paced by the loop's clock from ``start``: each peer of this host
        wakes every ``period`` seconds from its phase (``phases`` (P,), every peer's: the
        simulator's schedule) and sends its model to a neighbour (:meth:`GossipPeer.on_wake
        <p2pdp.protocols.iterative_peer.GossipPeer.on_wake>`); a model is merged at its
        sender's wake-up plus ``hold`` seconds (:meth:`_hold`: the simulator's constant
        latency, so the merges come in the simulator's order while the network is faster
        than that); a ``ROUND`` report at every round's end (the models as they are then)."""
        settings = self.settings
        loop = asyncio.get_running_loop()
        self._start, self.phases, self.hold = start, phases, hold
        end = settings.rounds * settings.period
        for peer in self.machines:
            self._order += 1
            heapq.heappush(self._events, (float(phases[peer]), self._order, peer))
        boundary = 1
        while boundary <= settings.rounds:
            at = boundary * settings.period
            if self._events and self._events[0][0] < at:
                at = self._events[0][0]
            self._arrival.clear()
            try:  # until then, or until a model arrives that may be due earlier
                await asyncio.wait_for(self._arrival.wait(), max(0.0, start + at - loop.time()))
                continue
            except TimeoutError:
                pass
            self.now = at
            if not self._events or self._events[0][0] >= boundary * settings.period:
                self._report(boundary)
                boundary += 1
                continue
            _, _, event = heapq.heappop(self._events)
            if isinstance(event, ModelFrame):
                machine = self.machines[event.receiver]
                self._effects(
                    event.receiver,
                    machine.on_message(at, event.sender, event.round, 0, event.model),
                )
            else:  # a wake-up
                machine = self.machines[event]
                assert isinstance(machine, GossipPeer)
                self._effects(event, machine.on_wake(at))
                if at + settings.period < end:
                    self._order += 1
                    heapq.heappush(self._events, (at + settings.period, self._order, event))
            self.flush()
        self._over = True

    def stats(self, host_index: int) -> dict[str, Any]:
        """The final ``STATS`` report: frames per kind, refusals (the host's and its
        machines'), the late models not reported yet. (The models each peer sent are in the
        rounds' reports.)"""
        counters = self.counters
        refused = Counter(counters.refused)
        for machine in self.machines.values():
            refused.update(machine.refused)
        return {
            "kind": STATS,
            "host": host_index,
            "sent": [],
            "wire": {k: [counters.wire[k], counters.wire_bytes[k]] for k in counters.wire},
            "refused": dict(refused),
            "receipts": b"",
            "late": self.late,
        }


async def serve_iterative(
    machines: dict[int, Machine],
    edges: dict[tuple[int, int], int],
    settings: IterativeSettings,
    *,
    host_index: int,
    ticket: Ticket,
    coordinator: str = "127.0.0.1",
    address: str = "127.0.0.1",
    phases: np.ndarray | None = None,
    hold: float = 0.0,
    pair_keys: PairKeys | None = None,
) -> None:
    """Run host ``host_index`` of an iterative run until the coordinator ends it.

    Enrolls (:func:`~p2pdp.net.connections.enroll`: a key pair of its own), opens its listener,
    says ``HELLO`` (every peer of it at the listener's port), waits for the ``DIRECTORY``
    (then, with ``pair_keys``, offers its peers' public keys and says ``KEYED`` once it
    holds every neighbour's) and the ``START``, runs its rounds (:meth:`IterativeHost.run`:
    ``machines`` and their ``edges``, see :class:`IterativeHost`; gossip learning
    :meth:`IterativeHost.run_gossip` with every peer's wake-up ``phases`` and the ``hold``),
    and on ``FINISH`` reports ``STATS``.
    """
    credential = await enroll(host_index, ticket, coordinator, settings.timeout)
    writer: asyncio.StreamWriter | None = None

    def report(message: dict[str, Any]) -> None:
        frame = encode({**message, "host": host_index})
        if message["kind"] != STATS:
            host.counters.wire[message["kind"]] += 1
            host.counters.wire_bytes[message["kind"]] += len(frame)
        assert writer is not None
        writer.write(frame)

    host = IterativeHost(
        machines, edges, settings, report=report, credential=credential, pair_keys=pair_keys
    )
    rounds: asyncio.Future | None = None

    async def control_loop(reader: asyncio.StreamReader, control: asyncio.StreamWriter) -> None:
        """The coordinator's frames, until its ``finish`` or the end of its connection."""
        nonlocal rounds
        loop = asyncio.get_running_loop()
        while True:
            message = await read_frame(reader, timeout=settings.timeout, idle=settings.idle_timeout)
            if message is None:  # the coordinator is gone
                return
            kind = message["kind"]
            if kind == "directory":
                host.ports = [integer(port, "port", 0, 65536) for port in message["ports"]]
                host.ports = [host.ports[int(np.flatnonzero(host.host_of == h)[0])]
                              for h in range(settings.hosts)]  # fmt: skip
                host.addresses = [str(a) for a in message["addresses"]]
                if pair_keys is not None:
                    host.offer_keys()
            elif kind == START and rounds is None:
                delay = message["delay"]
                if type(delay) not in (int, float) or not 0 <= delay <= settings.timeout:
                    raise ProtocolError(f"start delay {delay!r:.40}")
                began = loop.time() + delay
                rounds = host.failure.spawn(
                    "its rounds",
                    host.run(began) if phases is None else host.run_gossip(began, phases, hold),
                )
            elif kind == FINISH:
                if rounds is not None and not rounds.done():
                    rounds.cancel()
                report(host.stats(host_index))
                await asyncio.wait_for(control.drain(), settings.timeout)
                return

    try:
        try:
            port = await host.listen(address)
        except OSError as error:
            raise HostError(f"cannot listen on {address}: {error}") from None
        reader, control = await connect_control(
            coordinator, ticket.port, credential, settings.timeout
        )
        writer = control
        report(
            {
                "kind": HELLO,
                "address": address,
                "ports": [[peer, port] for peer in sorted(machines)],
                "dim": settings.dim,
                "bounds": False,
            }
        )
        await ended_or_failed(
            host.failure, control_loop(reader, control), control, host_index, settings.timeout
        )
    finally:
        if rounds is not None:
            rounds.cancel()
        await host.close()
        if writer is not None:
            writer.close()
