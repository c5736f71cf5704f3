"""The iterative protocols (D-PSGD, Muffliato) on the real network: one host process's side.

A host process runs some peers of the run. Each peer is a transport-free machine
(:class:`SyncPeer`: its model, its steps, its noise and sampling streams, its inbox); this
module only delivers it messages and time, over mutual TLS with the run's CA
(:mod:`p2pdp.net.tls`), every message a :data:`~p2pdp.net.wire.MODEL` frame
(:mod:`p2pdp.net.wire`).

Time. The coordinator's ``START`` says in how many seconds round 1 begins; the host counts
them on its own monotonic clock from the frame's arrival (no clock is shared: hosts start
within the frame's transit time of each other). Round ``r`` then lasts
``protocol.round_period`` **wall seconds** from ``start + (r - 1) period``, split into
``gossip_steps`` exchanges of ``period / gossip_steps`` seconds: at a round's start every
peer takes its private step and sends its model to each overlay neighbour; at an exchange's
deadline it averages what arrived in time (its own Metropolis-Hastings row; a neighbour's
weight stays on its own model when that message did not come) and sends for the next
exchange. A model that arrives after its exchange's deadline is **late**: read (counted,
reported to the coordinator for the privacy ledger), never averaged, as in the simulator.

What a frame must be to be accepted (else refused, counted under ``model`` and dropped):
from the host that runs its ``sender`` (its TLS certificate's name), to a peer of this host,
from an overlay neighbour of that peer, for the exchange that peer is in or the next one
(a sender whose clock runs a little ahead), once per sender and exchange; a frame for an
exchange already over is late once, within the last two rounds, and refused after that. So
what a peer buffers is bounded by its degree times two exchanges, what the host keeps of
late frames by its edges times two rounds; a frame is at most ``8 d`` bytes and a little
more (:func:`~p2pdp.net.wire.frame_bytes`); the listener holds at most two connections per
host (:func:`p2pdp.net.tls.listen`).

Noise. By default each peer draws its step's noise and sampling from its own generator,
freshly seeded from the operating system's CSPRNG (:func:`~p2pdp.core.rng.os_generator`),
in this process: the noise never leaves it. With ``network.seeded_noise = true`` (parity
tests, NOT private) every peer takes its row of the run's seeded ``noise`` and ``sampling``
draws exactly as the simulator's population-wide step draws them (:class:`SeededDraws`), so
the run's models equal the simulator's.

Reports. After each round the host sends the coordinator a ``ROUND`` report: which of its
peers stepped, per exchange the overlay edges (:class:`~p2pdp.protocols.mixing.Mixing` CSR
positions) into its peers whose model arrived in time, how many models its peers sent per
exchange, the late arrivals since its last report, and its peers' models. The models are
for the coordinator's test-error measurement, the simulator's omniscient measurement of
the run, not a release of the protocol (as the one-shot runtime's scoring).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pdp.net.host import FINISH, HELLO, STATS, HostError, Ticket, enroll, fresh, hosts_of
from p2pdp.net.tls import COORDINATOR, Credential, host_name, identity, listen, resolve
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
from p2pdp.protocols.groups import model_bytes
from p2pdp.protocols.iterative import IterativeProtocol
from p2pdp.protocols.mixing import Mixing

__all__ = [
    "LATE",
    "ROUND",
    "START",
    "IterativeHost",
    "IterativeSettings",
    "SeededDraws",
    "SyncPeer",
    "serve_iterative",
]

log = logging.getLogger(__name__)

#: Control kinds of an iterative run: the coordinator's start (round 1 begins ``delay``
#: seconds after it arrives) and a host's report of one round.
START, ROUND = "start", "round"
#: The ``wire`` table's count of models that arrived past their exchange's deadline.
LATE = "late"
#: Rounds a late model may be behind the receiver's and still be counted as late once.
LATE_ROUNDS = 2
#: What a machine says of a model it keeps; of honest models it drops (a sender more than
#: one exchange ahead, or one more than LATE_ROUNDS behind): counted under that reason, and
#: lost (neither delivered nor late); anything else it says is a refusal outside the protocol.
KEPT, AHEAD, TOO_LATE = "kept", "ahead", "too late"
DROPPED = (AHEAD, TOO_LATE)


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

    @property
    def slots(self) -> int:
        """Exchanges in the run."""
        return self.rounds * self.exchanges

    def deadline(self, slot: int) -> float:
        """Seconds from the start at which exchange ``slot`` (0-based, over the run) ends."""
        return (slot + 1) * self.period / self.exchanges

    @property
    def peer_idle(self) -> float:
        """Seconds a connection between hosts may stay silent: a round and two timeouts."""
        return self.period + 2 * self.timeout


class SeededDraws:
    """The simulator's population-wide draws of one round, for parity (NOT private).

    The simulator's synchronous step draws, for the ``k`` peers that step, one (k, d) block
    of the run's ``noise`` stream and one mask over every record of the ``sampling`` stream
    (:meth:`~p2pdp.protocols.iterative.IterativeProtocol.step`). A host replays both streams
    (they are the scenario's, derived from its seed) and gives each of its peers its own row
    and records: the draws a peer would see in the simulator. Every peer steps while its
    budget lasts and every peer's budget is the same, so ``k`` is every peer or none.

    Parameters
    ----------
    rngs : dict
        ``noise``, ``sampling``: the run's streams (as the simulator's).
    sizes : (P,) int array
        Every peer's shard size (where each peer's records sit among all of them).
    """

    def __init__(self, rngs: dict[str, np.random.Generator], sizes: np.ndarray) -> None:
        self.rngs = rngs
        self.indptr = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
        self._round = 0
        self._noise = np.zeros((0, 0))
        self._keys = np.zeros(0)

    def draw(self, round_: int, mechanism: Any, dim: int) -> None:
        """Round ``round_``'s draws, once (rounds come in order)."""
        if round_ == self._round:
            return
        self._round = round_
        n_peers = len(self.indptr) - 1
        if mechanism.sampling != "full":
            self._keys = self.rngs["sampling"].random(int(self.indptr[-1]))
        self._noise = mechanism.noise((n_peers, dim), self.rngs["noise"])

    def of(self, peer: int) -> dict[str, Any]:
        """``peer``'s share of this round's draws, as the streams its step reads."""
        return {
            "noise": _Replay(noise=self._noise[peer : peer + 1]),
            "sampling": _Replay(keys=self._keys[self.indptr[peer] : self.indptr[peer + 1]]),
        }


class _Replay:
    """Stands for a generator in one peer's step: returns the draws it was given."""

    def __init__(self, *, noise: np.ndarray | None = None, keys: np.ndarray | None = None):
        self._noise, self._keys = noise, keys

    def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray:
        assert self._noise is not None and self._noise.shape == tuple(size)
        return self._noise

    def random(self, n: int) -> np.ndarray:
        assert self._keys is not None and len(self._keys) == n
        return self._keys


@dataclass
class SyncPeer:
    """One peer of a synchronous iterative protocol (D-PSGD, Muffliato), transport-free.

    It is given the round's start (:meth:`on_round`), messages (:meth:`on_message`) and its
    exchanges' deadlines (:meth:`on_deadline`), and returns the models to send; it never
    touches a socket or a clock. Its state: its model, its private steps, what arrived for
    its current exchange and the next one.

    Attributes
    ----------
    peer : int
    step : IterativeProtocol
        The peer's own protocol over its one shard (its model is ``step.models[0]``; its
        noise and sampling streams ``step.rngs``).
    neighbours : (k,) int array
        Its overlay neighbours, in its Metropolis-Hastings row's order.
    weights : (k,) float array
        Its row's weights ``W[peer, neighbour]``.
    edges : (k,) int array
        The overlay edges (CSR positions of :class:`~p2pdp.protocols.mixing.Mixing`) that
        carry each neighbour's model to it.
    exchanges : int
    draws : SeededDraws, optional
        The simulator's draws (``network.seeded_noise``); None: its own streams.
    """

    peer: int
    step: IterativeProtocol
    neighbours: np.ndarray
    weights: np.ndarray
    edges: np.ndarray
    exchanges: int
    draws: SeededDraws | None = None
    #: The exchange it is in or was last in (0-based over the run; -1 before round 1), and
    #: whether that exchange is still open (its deadline has not passed).
    slot: int = -1
    open: bool = False
    inbox: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)  # slot -> models
    #: (slot, sender) of the models of closed exchanges it read (averaged or late), for the
    #: last LATE_ROUNDS rounds: a second copy is refused
    seen: set[tuple[int, int]] = field(default_factory=set)
    _index: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._index = {int(j): i for i, j in enumerate(self.neighbours)}

    @property
    def model(self) -> np.ndarray:
        """(d,) its current model."""
        return self.step.models[0]

    def _sends(self) -> list[tuple[int, np.ndarray]]:
        return [(int(j), self.model.copy()) for j in self.neighbours]

    def on_round(self, round_: int) -> tuple[bool, list[tuple[int, np.ndarray]]]:
        """Round ``round_`` begins: the private step (while the budget lasts), then the model
        to every neighbour for the round's first exchange. Returns (stepped, sends)."""
        self.slot, self.open = (round_ - 1) * self.exchanges, True
        if self.draws is not None:
            self.draws.draw(round_, self.step.privacy.mechanism, self.model.shape[0])
            self.step.rngs = self.draws.of(self.peer)
        stepped = len(self.step.step()) > 0
        return stepped, self._sends()

    def on_message(self, sender: int, slot: int, model: np.ndarray) -> str:
        """A neighbour's model for exchange ``slot``: :data:`KEPT` (the open exchange or the
        next, averaged at its deadline), :data:`LATE` (an exchange already over, once: read,
        not averaged), :data:`AHEAD` or :data:`TOO_LATE` (dropped), or why it is refused."""
        if sender not in self._index:
            return f"sender {sender} is not a neighbour of peer {self.peer}"
        if slot < self.slot or (slot == self.slot and not self.open):
            if (slot, sender) in self.seen:
                return f"a second model from {sender} for exchange {slot}"
            if slot <= self.slot - LATE_ROUNDS * self.exchanges:
                return TOO_LATE
            self.seen.add((slot, sender))
            return LATE
        if slot > self.slot + 1:
            return AHEAD
        kept = self.inbox.setdefault(slot, {})
        if sender in kept:
            return f"a second model from {sender} for exchange {slot}"
        kept[sender] = model
        return KEPT

    def on_deadline(self) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
        """The open exchange is over: average what arrived in time (a missing neighbour's
        weight stays on this peer's model). Returns the edges delivered and the sends of the
        round's next exchange (none after its last)."""
        arrived = self.inbox.pop(self.slot, {})
        delivered = np.array([int(j) in arrived for j in self.neighbours], dtype=bool)
        model = self.model
        if delivered.any():
            weights = self.weights[delivered]
            mixed = np.zeros_like(model)  # in the row's order, as the simulator's sparse product
            for weight, j in zip(
                weights.tolist(), self.neighbours[delivered].tolist(), strict=True
            ):
                mixed += weight * arrived[j]
            self.step.models[0] = model + mixed - weights.sum() * model
        horizon = self.slot - LATE_ROUNDS * self.exchanges
        self.seen = {key for key in self.seen if key[0] > horizon}
        self.seen.update((self.slot, sender) for sender in arrived)
        if (self.slot + 1) % self.exchanges == 0:  # the round's last: wait for the next round
            self.open = False
            return self.edges[delivered], []
        self.slot += 1
        return self.edges[delivered], self._sends()


@dataclass
class _Counters:
    """What this host's peers sent (the simulator's counts, and on the wire) and refused."""

    messages: np.ndarray  # (P,) models sent per peer
    wire: Counter = field(default_factory=Counter)  # kind -> frames sent
    wire_bytes: Counter = field(default_factory=Counter)  # kind -> bytes sent on the wire
    refused: Counter = field(default_factory=Counter)  # reason -> frames refused


class IterativeHost:
    """Several peers of one iterative run in this process, behind one TLS listener.

    Parameters
    ----------
    machines : dict
        Peer id -> its :class:`SyncPeer`, the peers this host runs.
    mixing : Mixing
        The overlay's weights (public: every host builds them from the seed).
    settings : IterativeSettings
    report : callable
        ``report(message)`` sends a control frame to the coordinator.
    credential : Credential or None
        This host's TLS identity; None: plain TCP and no sender check (tests of the protocol
        alone).
    """

    def __init__(
        self,
        machines: dict[int, SyncPeer],
        mixing: Mixing,
        settings: IterativeSettings,
        *,
        report: Callable[[dict[str, Any]], None],
        credential: Credential | None = None,
    ) -> None:
        self.machines = machines
        self.mixing = mixing
        self.settings = settings
        self.report = report
        self.credential = credential
        self.host_of = hosts_of(settings.n_peers, settings.hosts)
        self._server_tls = credential.context(server=True) if credential else None
        self._client_tls = credential.context(server=False) if credential else None
        self.counters = _Counters(messages=np.zeros(settings.n_peers, dtype=np.int64))
        self.model_bytes = model_bytes(settings.dim)
        self.frame_bytes = frame_bytes(settings.dim, 0)
        self.addresses: list[str] = []  # every host's address, from the directory
        self.ports: list[int] = []  # every peer's port (one per host here), likewise
        self.late: list[list[int]] = []  # [slot, edge] arrived late since the last report
        self._edge: dict[tuple[int, int], int] = {}  # (sender, receiver) -> CSR position
        for peer, machine in machines.items():
            for sender, edge in zip(
                machine.neighbours.tolist(), machine.edges.tolist(), strict=True
            ):
                self._edge[(sender, peer)] = edge
        self.server: asyncio.base_events.Server | None = None
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._used: dict[int, float] = {}
        self._outbox: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        self._batch: dict[int, list[bytes]] = {}  # host -> frames of the exchange being sent
        self._sending: asyncio.Future | None = None

    # -- sockets -----------------------------------------------------------------------------
    async def listen(self, address: str = "127.0.0.1") -> int:
        """Open this host's listener and start its sender task; its port."""
        self._sending = asyncio.ensure_future(self._sender())
        hosts = self.settings.hosts
        if self._server_tls is None:  # tests of the protocol alone
            self.server = await asyncio.start_server(self._serve, address, 0)
        else:
            self.server = await listen(
                self._serve,
                address,
                self._server_tls,
                pending=hosts + 8,
                refused=self.counters.refused,
                allowed=resolve(self.settings.allowed),
                per_identity=2,  # one connection from each other host, and one to replace it
                total=2 * hosts,
                first_frame=self.settings.timeout,
            )
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read model frames until the connection closes; a frame that breaks the wire format
        closes this connection only."""
        who = identity(writer)
        try:
            while True:
                message = await read_frame(
                    reader,
                    timeout=self.settings.timeout,
                    idle=self.settings.peer_idle,
                    max_bytes=self.frame_bytes,
                )
                if message is None:
                    return
                self.handle(message, who)
        except (ProtocolError, TimeoutError, ConnectionError) as error:
            self.counters.refused[type(error).__name__] += 1
            log.warning("refused a connection: %s", error)
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()

    def handle(self, message: dict[str, Any], who: str | None) -> None:
        """One frame from the party authenticated as ``who`` (its certificate's name; not
        checked without a credential: tests of the protocol alone)."""
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

    def _deliver(self, frame: ModelFrame) -> None:
        """``frame`` to its receiver's machine: kept, late (noted for the next report), or
        dropped: counted ``model`` if outside the protocol (not a neighbour, a second copy,
        late again), else under the honest reason (``ahead``, ``too late``)."""
        exchanges = self.settings.exchanges
        slot = (frame.round - 1) * exchanges + frame.exchange
        outcome = self.machines[frame.receiver].on_message(frame.sender, slot, frame.model)
        if outcome == LATE:
            self.late.append([slot, self._edge[(frame.sender, frame.receiver)]])
        elif outcome in DROPPED:
            self.counters.refused[outcome] += 1
        elif outcome != KEPT:
            self.counters.refused[MODEL] += 1
            log.warning("refused a model: %s", outcome)

    def send(self, sender: int, sends: list[tuple[int, np.ndarray]], slot: int) -> None:
        """``sender``'s models of exchange ``slot``: counted now (as the simulator counts
        them: one message of ``64 + 8 d`` bytes each), its own host's delivered at once,
        the others' batched per host until :meth:`flush`."""
        exchanges = self.settings.exchanges
        round_, exchange = slot // exchanges + 1, slot % exchanges
        self.counters.messages[sender] += len(sends)
        for receiver, model in sends:
            frame = ModelFrame(sender, receiver, round_, exchange, model)
            if receiver in self.machines:  # a peer of this host: no socket to cross
                self._deliver(frame)
                continue
            encoded = model_frame(frame)
            self.counters.wire[MODEL] += 1
            self.counters.wire_bytes[MODEL] += len(encoded)
            self._batch.setdefault(int(self.host_of[receiver]), []).append(encoded)

    def flush(self) -> None:
        """Hand the sender task what :meth:`send` batched: one write per host."""
        for host, frames in self._batch.items():
            self._outbox.put_nowait((host, b"".join(frames)))
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
            host, frame = item
            try:
                writer = await self._writer(host)
                if writer.is_closing():
                    raise ConnectionResetError("connection closed")
                writer.write(frame)
                await asyncio.wait_for(writer.drain(), self.settings.timeout)
            except (OSError, TimeoutError) as error:
                self.counters.refused["unreachable"] += 1
                self._writers.pop(host, None)
                log.warning("a model to host %d not delivered: %s", host, error)

    async def close(self) -> None:
        if self._sending is not None:
            self._sending.cancel()
        if self.server is not None:
            self.server.close()
        for writer in self._writers.values():
            writer.close()

    # -- rounds ------------------------------------------------------------------------------
    async def run(self, start: float) -> None:
        """Every round, paced by the event loop's clock from ``start`` (its ``time()``):
        steps and sends at a round's start, averaging at each exchange's deadline, a
        ``ROUND`` report after the round."""
        loop = asyncio.get_running_loop()
        settings = self.settings
        peers = sorted(self.machines)
        for round_ in range(1, settings.rounds + 1):
            first = (round_ - 1) * settings.exchanges
            await asyncio.sleep(
                max(0.0, start + first * settings.period / settings.exchanges - loop.time())
            )
            stepped = []
            sent = [0] * settings.exchanges
            for peer in peers:
                did, sends = self.machines[peer].on_round(round_)
                if did:
                    stepped.append(peer)
                self.send(peer, sends, first)
                sent[0] += len(sends)
            self.flush()
            delivered: list[list[int]] = []
            for exchange in range(settings.exchanges):
                slot = first + exchange
                await asyncio.sleep(max(0.0, start + settings.deadline(slot) - loop.time()))
                edges: list[int] = []
                for peer in peers:
                    arrived, sends = self.machines[peer].on_deadline()
                    edges.extend(arrived.tolist())
                    if sends:
                        self.send(peer, sends, slot + 1)
                        sent[exchange + 1] += len(sends)
                self.flush()
                delivered.append(edges)
            late, self.late = self.late, []
            models = np.stack([self.machines[peer].model for peer in peers])
            self.report(
                {
                    "kind": ROUND,
                    "round": round_,
                    "stepped": stepped,
                    "delivered": delivered,
                    "sent": sent,
                    "late": late,
                    "models": pack_vector(models),
                }
            )

    def stats(self, host_index: int) -> dict[str, Any]:
        """The final ``STATS`` report: models sent per peer (and their simulated bytes),
        frames per kind, refusals, the late models not reported yet."""
        counters = self.counters
        sent = np.flatnonzero(counters.messages)
        return {
            "kind": STATS,
            "host": host_index,
            "sent": [
                [int(p), int(counters.messages[p]), int(counters.messages[p]) * self.model_bytes]
                for p in sent
            ],
            "wire": {k: [counters.wire[k], counters.wire_bytes[k]] for k in counters.wire},
            "refused": dict(counters.refused),
            "receipts": b"",
            "late": self.late,
        }


def _failed(control: asyncio.StreamWriter, rounds: asyncio.Future) -> None:
    """The rounds stopped: if by an error, say so and close the control connection (the
    coordinator counts this host lost and goes on without it)."""
    if not rounds.cancelled() and rounds.exception() is not None:
        log.error("the rounds failed: %r", rounds.exception())
        control.close()


async def serve_iterative(
    machines: dict[int, SyncPeer],
    mixing: Mixing,
    settings: IterativeSettings,
    *,
    host_index: int,
    ticket: Ticket,
    coordinator: str = "127.0.0.1",
    address: str = "127.0.0.1",
    on_start: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Run host ``host_index`` of an iterative run until the coordinator ends it.

    Enrolls (:func:`~p2pdp.net.host.enroll`: a key pair of its own), opens its listener,
    says ``HELLO`` (every peer of it at the listener's port), waits for the ``DIRECTORY``
    and the ``START`` (``on_start(message)`` sees it first: the seeded draws' shard sizes),
    runs its rounds (:meth:`IterativeHost.run`), and on ``FINISH`` reports ``STATS``.
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

    host = IterativeHost(machines, mixing, settings, report=report, credential=credential)
    rounds: asyncio.Future | None = None
    try:
        try:
            port = await host.listen(address)
        except OSError as error:
            raise HostError(f"cannot listen on {address}: {error}") from None
        try:
            reader, control = await asyncio.wait_for(
                asyncio.open_connection(
                    coordinator,
                    ticket.port,
                    ssl=credential.context(server=False),
                    server_hostname=COORDINATOR,
                ),
                settings.timeout,
            )
        except (OSError, TimeoutError) as error:
            raise HostError(f"cannot reach the coordinator at {coordinator}:{ticket.port}: "
                            f"{error or 'timed out'}") from None  # fmt: skip
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
            elif kind == START and rounds is None:
                delay = message["delay"]
                if type(delay) not in (int, float) or not 0 <= delay <= settings.timeout:
                    raise ProtocolError(f"start delay {delay!r:.40}")
                if on_start is not None:
                    on_start(message)
                rounds = asyncio.ensure_future(host.run(loop.time() + delay))
                rounds.add_done_callback(functools.partial(_failed, control))
            elif kind == FINISH:
                if rounds is not None and not rounds.done():
                    rounds.cancel()
                report(host.stats(host_index))
                await asyncio.wait_for(control.drain(), settings.timeout)
                return
    finally:
        if rounds is not None:
            rounds.cancel()
        await host.close()
        if writer is not None:
            writer.close()
