"""Gossip group formation on the real network: one host's driver of its peers' formation.

The protocol is :class:`~p2pdp.protocols.gossip.GossipFormation` (states, locks, backoffs,
invitations, commit-reveal, giving up), the machine the simulator drives
(:mod:`p2pdp.sim.gossip.formation`). Here each host process runs one machine for its own peers
(:class:`HostFormation`): the machine decides, this driver only delivers frames and time
(asyncio timers for the attempts' :class:`~p2pdp.protocols.gossip.StartTimer`, a tick every
``gossip.gossip_period / 10`` seconds for lock expiry, view exchanges and the initiations due)
and carries out what the machine decided. Another host's peers are never read: the machine's
arrays hold this host's peers' states only (the others' entries are never touched).

Frames between peers (each on the receiver peer's socket, mutual TLS):

``formation``
    One formation message, its ``step`` one of the protocol's kinds (``invite``, ``accept``,
    ``decline``, ``group``, ``reveal``, ``start``, ``ack``, ``release``), naming its
    ``sender``, ``receiver``, the attempt (``initiator``, ``attempt``) and a ``copy`` number
    (the sender's n-th frame of this step to this receiver for this attempt: a re-sent
    invitation is a new copy, a replayed frame is not).
``view`` / ``view-reply``
    A Newscast view exchange (:mod:`p2pdp.net.gossip_views`, a base of :class:`HostFormation`).

What a host accepts. A frame is accepted only from the host that runs its ``sender``
(certificate name, :meth:`p2pdp.net.host.PeerHost.handle`), for a peer of this host (the
socket it arrived on is its ``receiver``'s); a formation frame only for an attempt the
protocol state knows: a reply (``accept``, ``decline``, ``reveal``, ``ack``) only to an
attempt this host's peer initiated, from a peer it invited; an initiator's message (``group``,
``start``, ``release``) only from the initiator, for an attempt that invited the receiver (an
``invite`` opens it); each ``(step, sender, receiver, copy)`` once. A view reply only from the
partner the exchange asked, once; a view request once per sender's sequence number. Whatever
else is refused (:class:`~p2pdp.net.wire.ProtocolError`, counted by the host under its kind).
Buffers are bounded: at most :data:`ATTEMPTS_PER_PEER` attempts per own peer are remembered
(oldest forgotten first), each with at most ``g x steps x copies`` frames seen; view sequence
numbers per (sender, own peer).

Commit-reveal, for real. The simulator models the commitments (a nonce read through
``REVEAL``); here they are real: a member that accepts draws a 16-byte salt from the OS
CSPRNG, commits ``SHA-256(context, nonce, salt)`` and signs the commitment (Ed25519, its
host's key; the public keys travel from each host's ``hello`` to every host in the
coordinator's ``directory``, over the coordinator's mutual-TLS connections). The initiator
commits its own nonce the same way before ``GROUP`` (which carries every member's signed
commitment: each member checks every signature and its own commitment), ``REVEAL`` carries a
nonce and its salt, ``START`` every nonce and salt (each member checks them against the
commitments). The initiator's host reports the formed group to the coordinator with that
evidence (``formed``); the coordinator checks the signatures and commitments itself and
elects the curator ``members[sum(nonces) mod g]`` (:func:`p2pdp.net.commitments.elect`,
where the commitments, signatures and checks are): an initiator cannot
forge a member's commitment or choose the curator. (The simulator's initiator, an honest
model, draws its own nonce before ``GROUP`` but commits to nothing: here it commits first.)

The rest of the run is the coordinator's (:mod:`p2pdp.net.coordinator`): it assigns each
reported group exactly as a central one (the one-shot member and curator machines, charges
and releases unchanged), tells the members' hosts when it ended (``ended``: published or not,
and which members can afford another aggregation: the ledger is the coordinator's), and ends
the run as the simulator's observer does, from each host's ``status`` (peers still initiating,
attempts in flight).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from p2pdp.core.rng import Uniforms
from p2pdp.net.commitments import (
    HASH_BYTES,
    SALT_BYTES,
    SIGNATURE_BYTES,
    check_reveal,
    check_signatures,
    commitment,
    member_list,
    statement,
)
from p2pdp.net.failures import Failure
from p2pdp.net.gossip_views import VIEW, VIEW_REPLY, ViewExchange
from p2pdp.net.wire import ProtocolError, integer
from p2pdp.protocols.gossip import (
    ACCEPT,
    ACK,
    DECLINE,
    GROUP,
    IN_GROUP,
    INITIATING,
    INVITE,
    RELEASE,
    REVEAL,
    START,
    Attempt,
    Envelope,
    GossipFormation,
    StartTimer,
)

__all__ = [
    "ENDED",
    "FORMATION",
    "FORMED",
    "HALT",
    "PEER_KINDS",
    "STATUS",
    "VIEW",
    "VIEW_REPLY",
    "GossipSetup",
    "HostFormation",
]

log = logging.getLogger(__name__)

#: Frame kinds between peers: a formation message, a view exchange's request and reply
#: (:mod:`p2pdp.net.gossip_views`).
FORMATION = "formation"
PEER_KINDS = (FORMATION, VIEW, VIEW_REPLY)
#: Control kinds: a formed group (host -> coordinator), a group's end (coordinator -> the
#: members' hosts), a host's formation status (host -> coordinator), the run's stop
#: (coordinator -> hosts: no peer initiates any more).
FORMED, ENDED, STATUS, HALT = "formed", "ended", "status", "halt"
STEPS = (INVITE, ACCEPT, DECLINE, GROUP, REVEAL, START, ACK, RELEASE)
#: Steps a member sends to the initiator; the others the initiator sends to a member.
TO_INITIATOR = frozenset((ACCEPT, DECLINE, REVEAL, ACK))
#: Attempts remembered per own peer (its own as initiator, others' it was invited to).
ATTEMPTS_PER_PEER = 8


@dataclass(frozen=True)
class GossipSetup:
    """What a host needs to run its peers' formation (made by the experiment's host code).

    Attributes
    ----------
    params : GossipConfig
        ``backoff``, ``invite_timeout``, ``lock_timeout``, ``max_retries``, ``view_size``,
        ``gossip_period``.
    group_size, max_failed : int
        ``groups.group_size``, ``groups.max_failed_attempts``.
    collect_timeout : float
        ``groups.collect_timeout`` (a committed member's lock lasts that much longer).
    ids, stamps : (k, c) arrays
        The host's peers' first views (row i: its i-th peer's; -1 / -inf: empty), stamps in
        seconds relative to the start of formation (the simulator's bootstrap, from the
        overlay of the run's protocol stream: public).
    merge : callable
        ``merge(ids, stamps, owners, view_size)``: Newscast's merge
        (:func:`p2pdp.sim.gossip.views.merge_views`).
    rng : numpy.random.Generator
        The host's formation stream (phases, partners, backoffs, nonces, invitation order):
        from the OS CSPRNG by default, from the run's seed with ``network.seeded_noise``.
    solvent : bool
        Whether a peer's budget affords one aggregation at the start.
    """

    params: Any
    group_size: int
    max_failed: int
    collect_timeout: float
    ids: np.ndarray
    stamps: np.ndarray
    merge: Callable[..., tuple[np.ndarray, np.ndarray]]
    rng: np.random.Generator
    solvent: bool = True

    @property
    def frame_bytes(self) -> int:
        """The largest frame of formation or views (bytes): a ``group`` or ``start``
        (per member an id, a commitment and a signature, or a nonce and a salt; ~10 bytes of
        msgpack each), a view (per entry a peer and a stamp), and 1 KiB of fields."""
        per_member = 9 + HASH_BYTES + SIGNATURE_BYTES + 10
        per_entry = 9 + 9 + 4
        return max(self.group_size * per_member, (self.params.view_size + 1) * per_entry) + 1024

    @property
    def tick(self) -> float:
        """Seconds between two steps of the host's clock (the simulator's tick)."""
        return float(self.params.gossip_period) / TICKS_PER_PERIOD


#: Ticks per gossip period (each own peer exchanges views at one of them: its phase).
TICKS_PER_PERIOD = 10


class _Machine(GossipFormation):
    """The formation machine with network-wide attempt ids (``k * hosts + host``) and the
    initiator's own view of a complete group: every ``ACK`` in (the simulator also reads
    the members' states, which another host's peers keep to themselves)."""

    def __init__(self, host: int, hosts: int, **arguments: Any) -> None:
        super().__init__(**arguments)
        self._host, self._hosts = host, hosts

    def _new_attempt_id(self) -> int:
        return super()._new_attempt_id() * self._hosts + self._host

    def _can_start(self, attempt: Attempt) -> bool:
        return (
            not self.stopped
            and self._tied(attempt.initiator, attempt, INITIATING)
            and len(attempt.replies) == len(attempt.accepted)
        )


@dataclass(eq=False)
class _Record:
    """What this host knows of one attempt: the machine's :class:`Attempt` (a copy for an
    attempt another host's peer initiated), whom it invited (initiator) or which own peers
    it invited (member), the group's commitments, signatures and salts, the frames seen
    (``(step, sender, receiver, copy)``: at most 8 steps x g members x the copy bound) and
    sent per ``(step, sender, receiver)``."""

    attempt: Attempt
    invited: set[int] = field(default_factory=set)
    members: list[int] = field(default_factory=list)
    committed: dict[int, bytes] = field(default_factory=dict)
    signatures: dict[int, bytes] = field(default_factory=dict)
    salts: dict[int, bytes] = field(default_factory=dict)
    seen: set[tuple[str, int, int, int]] = field(default_factory=set)
    sent: dict[tuple[str, int, int], int] = field(default_factory=dict)


class _Timer:
    """An attempt's timer on the event loop's clock: ``fired`` once its time has come."""

    __slots__ = ("at", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self.loop, self.at = loop, loop.time() + seconds

    @property
    def fired(self) -> bool:
        return self.loop.time() >= self.at


class HostFormation(ViewExchange):
    """One host's side of gossip group formation: its peers' machine, views and attempts.

    Parameters
    ----------
    peers : list of int
        The peers this host runs.
    setup : GossipSetup
    host : int
        This host's index.
    host_of : (P,) int array
        Every peer's host.
    send : callable
        ``send(kind, sender, receiver, message)``: one frame to a peer (the host's outbox).
    report : callable
        ``report(message)``: a control frame to the coordinator.
    key : Ed25519PrivateKey
        This host's signing key (its public half went out in its ``hello``).
    failure : Failure, optional
        Where a fault of its clock, an attempt's coroutine or a timer goes (the host's:
        it ends the host's run, :mod:`p2pdp.net.failures`); by default one of its own.
    """

    def __init__(
        self,
        peers: list[int],
        setup: GossipSetup,
        *,
        host: int,
        host_of: np.ndarray,
        send: Callable[[str, int, int, dict[str, Any]], None],
        report: Callable[[dict[str, Any]], None],
        key: Ed25519PrivateKey,
        failure: Failure | None = None,
    ) -> None:
        self.failure = Failure() if failure is None else failure
        self.peers, self.own = list(peers), set(peers)
        self.setup, self.params = setup, setup.params
        self.host, self.host_of = host, host_of
        self.n_peers = host_of.size
        self._send, self._report, self._key = send, report, key
        self.keys: list[Ed25519PublicKey] = []  # every host's, from the directory
        self.rng = setup.rng
        self.solvent = np.full(self.n_peers, setup.solvent)
        self._start = time.monotonic()
        self.machine = _Machine(
            host,
            int(host_of.max()) + 1,
            group_size=setup.group_size,
            max_failed=setup.max_failed,
            params=setup.params,
            collect_timeout=setup.collect_timeout,
            views=self,
            clock=self.now,
            online=np.ones(self.n_peers, dtype=bool),
            can_afford=lambda peers: self.solvent[np.asarray(peers, dtype=np.int64)],
            solvent=len(self.peers) if setup.solvent else 0,
            uniform=Uniforms(self.rng).draw,
            rng=self.rng,
        )
        # views: own rows only, stamps on this host's clock (seconds since the start)
        self.ids = {p: setup.ids[i].astype(np.int64) for i, p in enumerate(self.peers)}
        self.stamps = {p: setup.stamps[i].astype(np.float64) for i, p in enumerate(self.peers)}
        self.phase = dict(
            zip(
                self.peers,
                self.rng.integers(TICKS_PER_PERIOD, size=len(peers)).tolist(),
                strict=True,
            )
        )
        self._view_seq = 0
        # own peer -> {seq: partner} of its last ASKED view requests not answered yet
        self._asked: dict[int, OrderedDict[int, int]] = {p: OrderedDict() for p in self.peers}
        self._late: dict[int, OrderedDict[int, int]] = {p: OrderedDict() for p in self.peers}
        self._last_seq: dict[tuple[int, int], int] = {}  # (sender, own peer) -> its last seq
        cap = ATTEMPTS_PER_PEER * max(1, len(self.peers))
        self._cap = cap
        self.attempts: OrderedDict[int, _Record] = OrderedDict()  # own initiators' attempts
        self.invites: OrderedDict[tuple[int, int], _Record] = OrderedDict()  # others'
        self._wakes: dict[int, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.ended = 0  # ``ended`` frames carried out (the coordinator's stop test reads it)
        self._last_status: tuple[int, int, int] | None = None

    def now(self) -> float:
        """Seconds since this host's formation began (its own clock)."""
        return time.monotonic() - self._start

    # -- what the host calls ---------------------------------------------------------------
    def start(self, keys: list[Ed25519PublicKey]) -> None:
        """Every host's signing key is known (the directory): the peers become free and the
        clock starts."""
        self.keys = keys
        self._start = time.monotonic()
        for peer in self.peers:
            if self.solvent[peer]:
                self.machine.become_free(peer)
        self._spawn("its formation clock", self._clock())
        self._flush()

    def halt(self) -> None:
        """The coordinator stopped the run: no peer initiates any more."""
        self.machine.stopped = True
        self.machine.initiate_at[:] = np.inf
        self._flush()

    def assigned(self, peer: int) -> None:
        """``peer`` was assigned its group's aggregation: no longer locked by formation."""
        machine = self.machine
        machine.state[peer], machine.bound[peer], machine.lock_until[peer] = IN_GROUP, -1, np.inf

    def group_ended(self, message: dict[str, Any]) -> None:
        """An ``ended`` frame: this host's members of a group whose aggregation ended, whether
        it published, and which of them can afford another aggregation."""
        members = [integer(m, "member", 0, self.n_peers) for m in message["members"]]
        solvent, published = message["solvent"], message["published"]
        if not set(members) <= self.own or not isinstance(published, bool):
            raise ProtocolError("an end of a group of another host's peers")
        if not isinstance(solvent, list) or len(solvent) != len(members):
            raise ProtocolError("one solvency flag per member")
        self.solvent[members] = [bool(s) for s in solvent]
        self.machine.members_back(np.array(members, dtype=np.int64), published=published)
        self.ended += 1
        self._flush()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _spawn(self, where: str, coroutine: Any) -> None:
        task = self.failure.spawn(where, coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- time ------------------------------------------------------------------------------
    async def _clock(self) -> None:
        """One step per tick: expire locks, the due view exchanges, schedule the initiations
        due before the next tick (each at its own time)."""
        loop = asyncio.get_running_loop()
        tick, k = self.setup.tick, 0
        while True:
            self.machine.expire_locks()
            due = [p for p in self.peers if self.phase[p] == k % TICKS_PER_PERIOD]
            for peer in self.rng.permutation(np.array(due, dtype=np.int64)).tolist():
                self._ask_view(peer)
            now = self.now()
            for peer, at in self.machine.due(now + tick):
                initiate = self.failure.call(f"peer {peer}'s initiation", self._initiate)
                loop.call_later(max(0.0, at - now), initiate, peer, at)
            self._flush()
            k += 1
            await asyncio.sleep(tick)

    def _initiate(self, peer: int, at: float) -> None:
        attempt = self.machine.initiate(peer, at)
        if attempt is not None:
            self._remember(self.attempts, attempt.attempt_id, _Record(attempt))
            self._spawn(f"peer {peer}'s attempt {attempt.attempt_id}", self._drive(attempt))
        self._flush()

    async def _drive(self, attempt: Attempt) -> None:
        """The initiator's coroutine on the event loop: its effects are carried out before
        each of its commands, in order."""
        coroutine = self.machine.run_attempt(attempt)
        loop = asyncio.get_running_loop()
        reply: Any = None
        while True:
            try:
                command = coroutine.send(reply)
            except StopIteration:
                break
            self._flush()
            if isinstance(command, StartTimer):
                reply = _Timer(loop, command.seconds)
                continue
            wake = self._wakes[attempt.attempt_id] = asyncio.Event()
            left = command.timer.at - loop.time()  # type: ignore[attr-defined]
            if left > 0:
                try:
                    await asyncio.wait_for(wake.wait(), left)
                except TimeoutError:
                    pass
            reply = None
        self._wakes.pop(attempt.attempt_id, None)
        self._flush()

    # -- effects ---------------------------------------------------------------------------
    def _flush(self) -> None:
        """Carry out the machine's effects, in order; then tell the coordinator if this
        host's formation status changed."""
        for kind, value in self.machine.effects():
            if kind == "send":
                self._send_step(value)
            elif kind == "wake":
                wake = self._wakes.get(value.attempt_id)
                if wake is not None:
                    wake.set()
            elif kind == "formed":
                self._formed(int(value[0][0]))
        machine = self.machine
        status = (machine.n_trying, machine.attempts_in_flight, self.ended)
        if status != self._last_status:
            self._last_status = status
            self._report(
                {
                    "kind": STATUS,
                    "host": self.host,
                    "trying": status[0],
                    "attempts": status[1],
                    "ended": status[2],
                }
            )

    def _record_of(self, envelope: Envelope) -> _Record:
        attempt = envelope.attempt
        if attempt.initiator in self.own:
            return self.attempts[attempt.attempt_id]
        return self.invites[(attempt.initiator, attempt.attempt_id)]

    def _send_step(self, envelope: Envelope) -> None:
        step, sender, receiver, attempt = (
            envelope.kind, envelope.sender, envelope.receiver, envelope.attempt)  # fmt: skip
        record = self._record_of(envelope)
        ids = (attempt.initiator, attempt.attempt_id)
        fields: dict[str, Any] = {}
        if step == INVITE:
            record.invited.add(receiver)
        elif step == ACCEPT:  # a member commits to its nonce, signed by this host
            fields = self._commit(record, sender)
        elif step == DECLINE:
            fields = {"retired": bool(envelope.payload)}
        elif step == GROUP:
            self._commit(record, attempt.initiator)
            record.members = [attempt.initiator, *attempt.accepted]
            fields = {
                "members": record.members,
                "commitments": [record.committed[m] for m in record.members],
                "signatures": [record.signatures[m] for m in record.members],
            }
        elif step == REVEAL:
            fields = {"nonce": envelope.payload, "salt": record.salts[sender]}
        elif step == START:
            fields = self._openings(record)
        key = (step, sender, receiver)
        record.sent[key] = copy = record.sent.get(key, 0) + 1
        self._send(
            FORMATION,
            sender,
            receiver,
            {"kind": FORMATION, "step": step, "sender": sender, "receiver": receiver,
             "initiator": ids[0], "attempt": ids[1], "copy": copy, **fields},
        )  # fmt: skip

    def _commit(self, record: _Record, member: int) -> dict[str, Any]:
        """``member``'s signed commitment to its nonce, made once per attempt: a member
        invited to the same attempt again (its lock ran out before its acceptance arrived)
        keeps the nonce it drew first (the machine's rule), so it accepts again with the
        same commitment."""
        attempt = record.attempt
        if member not in record.salts:
            salt = os.urandom(SALT_BYTES)
            ids = (attempt.initiator, attempt.attempt_id)
            committed = commitment(*ids, member, attempt.nonces[member], salt)
            record.salts[member], record.committed[member] = salt, committed
            record.signatures[member] = self._key.sign(statement(*ids, member, committed))
        return {"commitment": record.committed[member], "signature": record.signatures[member]}

    def _openings(self, record: _Record) -> dict[str, Any]:
        attempt = record.attempt
        nonces = {attempt.initiator: attempt.nonces[attempt.initiator], **attempt.revealed}
        return {
            "nonces": [nonces[m] for m in record.members],
            "salts": [record.salts[m] for m in record.members],
        }

    def _formed(self, initiator: int) -> None:
        """This host's initiator holds every ``ACK``: report the group and its evidence."""
        record = next(
            r for r in reversed(self.attempts.values()) if r.attempt.initiator == initiator
        )
        attempt = record.attempt
        self._report(
            {
                "kind": FORMED,
                "host": self.host,
                "initiator": initiator,
                "attempt": attempt.attempt_id,
                "members": record.members,
                "commitments": [record.committed[m] for m in record.members],
                "signatures": [record.signatures[m] for m in record.members],
                **self._openings(record),
            }
        )

    def _remember(self, table: OrderedDict, key: Any, record: _Record) -> None:
        """Keep ``record`` under ``key``; beyond the cap, forget the oldest record that no own
        peer is tied to any more (its attempt over: a late answer to it is then refused);
        ProtocolError (``record`` not kept) if every one is still in use."""
        table[key] = record
        while len(table) > self._cap:
            old = next((k for k, r in table.items() if k != key and not self._in_use(r)), None)
            if old is None:
                del table[key]
                raise ProtocolError("every attempt this host remembers is still under way")
            del table[old]

    def _in_use(self, record: _Record) -> bool:
        """An own peer is still tied to ``record``'s attempt (initiating it, or locked or
        committed to it), or its initiator's coroutine still runs it."""
        attempt, bound = record.attempt, self.machine.bound
        tied = record.invited | ({attempt.initiator} & self.own)
        return (attempt.initiator in self.own and attempt.active) or any(
            bound[peer] == attempt.attempt_id for peer in tied & self.own
        )

    # -- frames ----------------------------------------------------------------------------
    def handle(self, peer: int, message: dict[str, Any]) -> None:
        """A frame for own peer ``peer`` (its sender's host already checked by the host);
        ProtocolError if the protocol state does not allow it."""
        kind = message["kind"]
        if integer(message["receiver"], "receiver", 0, self.n_peers) != peer:
            raise ProtocolError(f"a frame for peer {message['receiver']} on peer {peer}'s socket")
        if kind == FORMATION:
            self._on_formation(peer, message)
        elif kind == VIEW:
            self._on_view(peer, message)
        else:
            self._on_view_reply(peer, message)
        self._flush()

    def _on_formation(self, peer: int, message: dict[str, Any]) -> None:
        step = message["step"]
        if step not in STEPS:
            raise ProtocolError(f"unknown formation step {step!r:.40}")
        sender = integer(message["sender"], "sender", 0, self.n_peers)
        initiator = integer(message["initiator"], "initiator", 0, self.n_peers)
        attempt_id = integer(message["attempt"], "attempt")
        copy = integer(message["copy"], "copy", 1, 4 * (self.params.max_retries + 2))
        if step in TO_INITIATOR:
            record = self.attempts.get(attempt_id)
            if peer != initiator or record is None or record.attempt.initiator != initiator:
                raise ProtocolError(f"a {step} for unknown attempt ({initiator}, {attempt_id})")
            if sender not in record.invited:
                raise ProtocolError(f"a {step} from {sender}, not invited to this attempt")
        else:
            if sender != initiator:
                raise ProtocolError(f"a {step} from {sender}, not the attempt's initiator")
            if initiator in self.own:  # initiator and member on this host: one record
                record = self.attempts.get(attempt_id)
                if record is not None and record.attempt.initiator != initiator:
                    record = None
            else:
                key = (initiator, attempt_id)
                record = self.invites.get(key)
                if step == INVITE and record is None:
                    record = _Record(Attempt(attempt_id, initiator))
                    self._remember(self.invites, key, record)
            if record is None or (step != INVITE and peer not in record.invited):
                raise ProtocolError(f"a {step} for unknown attempt ({initiator}, {attempt_id})")
        seen = (step, sender, peer, copy)
        if seen in record.seen:
            raise ProtocolError(f"a second copy of {step} {copy} from {sender}")
        payload = self._check_step(step, sender, peer, record, message)
        record.seen.add(seen)
        if step == INVITE:
            record.invited.add(peer)
        self.machine.handle(Envelope(step, sender, peer, record.attempt, payload))

    def _check_step(
        self, step: str, sender: int, peer: int, record: _Record, message: dict[str, Any]
    ) -> int:
        """Check a step's evidence (signatures, commitments); the machine's payload."""
        attempt = record.attempt
        ids = (attempt.initiator, attempt.attempt_id)
        if step == DECLINE:
            retired = message["retired"]
            if not isinstance(retired, bool):
                raise ProtocolError("retired must be a bool")
            return int(retired)
        if step == ACCEPT:
            (accepted,) = check_signatures(
                self.keys, self.host_of, ids, [sender],
                [message["commitment"]], [message["signature"]],
            )  # fmt: skip
            if record.committed.get(sender, accepted) != accepted:
                raise ProtocolError(f"member {sender} changed its commitment")
            record.committed[sender] = accepted
            record.signatures[sender] = message["signature"]
        elif step == GROUP:
            members = member_list(message["members"], self.n_peers, self.setup.group_size, ids[0])
            if peer not in members:
                raise ProtocolError(f"a group without its receiver {peer}")
            committed = check_signatures(
                self.keys, self.host_of, ids, members,
                message["commitments"], message["signatures"],
            )  # fmt: skip
            own = record.committed.get(peer)
            if own is not None and committed[members.index(peer)] != own:
                raise ProtocolError("the group does not carry the receiver's commitment")
            record.members, record.committed = members, dict(zip(members, committed, strict=True))
        elif step == REVEAL:
            if sender not in record.committed:
                raise ProtocolError(f"a reveal from {sender}, which committed to nothing")
            nonce = check_reveal(ids, sender, message["nonce"], message["salt"],
                                  record.committed[sender])  # fmt: skip
            record.salts[sender] = message["salt"]
            return nonce
        elif step == START:
            if not record.members:
                raise ProtocolError("a start before its group")
            nonces, salts = message["nonces"], message["salts"]
            if not isinstance(nonces, list) or not isinstance(salts, list):
                raise ProtocolError("nonces and salts must be lists")
            if not len(nonces) == len(salts) == len(record.members):
                raise ProtocolError("one nonce and one salt per member")
            for member, nonce, salt in zip(record.members, nonces, salts, strict=True):
                check_reveal(ids, member, nonce, salt, record.committed[member])
        return 0
