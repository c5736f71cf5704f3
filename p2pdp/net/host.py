"""Peers as real network endpoints: one OS process hosts several peers, each on its own socket.

A :class:`PeerHost` runs the member and curator sides of the one-shot protocol (the machines
:class:`~p2pdp.protocols.oneshot.Member` and :class:`~p2pdp.protocols.oneshot.Curator`, which
the SimPy world drives too: they decide what a peer accepts and when a curator releases; the
host moves frames, keeps their payloads and carries the decisions out) over TCP on this
machine: every peer listens on its own port, every message is a msgpack frame
(:mod:`p2pdp.net.wire`) written to the receiver's socket, and every wait has a timeout. The
coordinator (:mod:`p2pdp.net.coordinator`) assigns groups; the host only ever reads its own
peers' statistics, and a curator only what its members send it.

What a curator does with a complete group, in order: its own statistic first, then the
others' in the group's member order (the order the simulator's curator receives them under a
constant latency, so both aggregate the same rows in the same order); the task's sensitivity
of their shard sizes; the noisy release through the run's :class:`~p2pdp.privacy.release.
Releaser`; publication to the members (``group``) or to every other peer (``full``); a
``DONE`` report with the release and its public record to the coordinator.

With secure aggregation (:mod:`p2pdp.privacy.secure_aggregation`, for real) no statistic
leaves its peer: each member adds its own noise share to its part of the aggregate, encodes
it in fixed point and sends one additive share (masks from :func:`os.urandom`) to every other
member; a member holding a share from every other sends their sum, its partial sum, to the
curator, which decodes the sum of the partial sums and learns only the noisy aggregate.

Where the noise comes from. By default a curator draws its release's noise, and a secure
member its noise share, from a generator freshly seeded from the operating system's CSPRNG
(:func:`~p2pdp.core.rng.os_generator`), in its own process: nothing another party holds (the
scenario, its seed) determines it, and the noise never leaves that process (a curator reports
``noise_norm`` as NaN; the experiment fills it for analysis from the exact aggregate). With
``seeded_noise`` (``network.seeded_noise = true``, for tests of parity) they come from the
run's seeded streams instead (:meth:`NoiseStream.skip
<p2pdp.privacy.release.NoiseStream.skip>` to the group's index, :meth:`Releaser.member_stream
<p2pdp.privacy.release.Releaser.member_stream>`), so that a network run releases exactly what
the simulator releases: NOT PRIVATE, since anyone who knows the seed can subtract the noise.
Masks always come from the CSPRNG (they cancel, and never change a release).

Around this module: the host's sockets and ordered writes are its base class
(:class:`p2pdp.net.connections.PeerSockets`), the host process that enrolls, says hello and
reports is :func:`p2pdp.net.host_process.serve`, and what every host and the coordinator
share (settings, ticket, control kinds) is :mod:`p2pdp.net.hosts`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pdp.core.rng import os_generator
from p2pdp.net.connections import PeerSockets
from p2pdp.net.failures import Failure
from p2pdp.net.gossip_host import PEER_KINDS, HostFormation
from p2pdp.net.hosts import (
    DONE,
    EXPIRED,
    KINDS,
    PRE_EMPTED,
    STATS,
    HostError,
    HostSettings,
    hosts_of,
)
from p2pdp.net.tls import COORDINATOR, Credential, host_name
from p2pdp.net.wire import (
    ProtocolError,
    encode,
    error_reason,
    frame_bytes,
    integer,
    pack_vector,
    unpack_vector,
)
from p2pdp.privacy.release import Releaser, ReleaseRecord
from p2pdp.privacy.secure_aggregation import FixedPoint, share
from p2pdp.protocols.groups import (
    ASSIGN,
    PARTIAL,
    PUBLISH,
    SAMPLER,
    SHARE,
    SUBMIT,
    Group,
    model_bytes,
)
from p2pdp.protocols.oneshot import (
    Abort,
    Collect,
    Curator,
    Late,
    Member,
    Publish,
    Refused,
    Release,
    Timer,
)

__all__ = ["PeerHost"]

log = logging.getLogger(__name__)


def _sender(message: dict[str, Any]) -> int:
    """A frame's ``sender``: a peer id, or SAMPLER (the coordinator); ProtocolError unless an
    int (see :func:`~p2pdp.net.wire.integer`)."""
    return integer(message["sender"], "sender", SAMPLER)


def _seconds(value: Any) -> float:
    """An assignment's ``timeout``: a finite number of seconds >= 0 (not a bool or a str)."""
    if type(value) not in (int, float) or not 0 <= value < math.inf:
        raise ProtocolError(f"timeout must be a number of seconds >= 0, got {value!r:.40}")
    return float(value)


@dataclass
class _Counters:
    """What this host's peers sent and received (by the simulator's definitions, and on the
    wire)."""

    messages: np.ndarray  # (P,) protocol messages sent per peer, as the simulator counts them
    bytes: np.ndarray  # (P,) simulated bytes (model_bytes per model message)
    wire: Counter = field(default_factory=Counter)  # kind -> frames sent
    wire_bytes: Counter = field(default_factory=Counter)  # kind -> bytes sent on the wire
    publications_received: int = 0
    refused: Counter = field(default_factory=Counter)  # reason -> frames refused
    idle_closed: int = 0  # connections closed after peer_idle silent seconds (not refused)


@dataclass(eq=False)
class _Member:
    """Secure aggregation, one member's side of its current group: the sum of the shares it
    holds (its own first; who sent them is its member machine's)."""

    group: Group
    partial: np.ndarray  # (d,) uint64


class PeerHost(PeerSockets):
    """Several peers of one run in this process, each listening on its own TCP port.

    Parameters
    ----------
    peers : (k,) int array
        The peers this host runs.
    statistics : (k, d) array
        Their statistics (row i is peer ``peers[i]``'s), read by nothing but that peer.
    sizes : (k,) int array
        Their shard sizes.
    releaser : Releaser
        The run's release path; its noise stream is the run's (see the module docstring).
    sensitivity : callable
        ``sensitivity(sizes) -> float``, the task's.
    settings : HostSettings
    report : callable
        ``report(message)`` sends a control frame to the coordinator (``DONE``).
    credential : Credential or None
        This host's TLS identity (:mod:`p2pdp.net.tls`): every socket then requires the
        other side's certificate of this run, and a frame is accepted only from the party
        entitled to send it. None: plain TCP and no such check (tests of the protocol alone).
    """

    def __init__(
        self,
        peers: np.ndarray,
        statistics: np.ndarray,
        sizes: np.ndarray,
        *,
        releaser: Releaser,
        sensitivity: Callable[[list[int]], float],
        settings: HostSettings,
        report: Callable[[dict[str, Any]], None],
        credential: Credential | None = None,
    ) -> None:
        self.peers = [int(p) for p in peers]
        self.host_of = hosts_of(settings.n_peers, settings.hosts)
        self.credential = credential
        self._server_tls = credential.context(server=True) if credential else None
        self._client_tls = credential.context(server=False) if credential else None
        self.row = {peer: i for i, peer in enumerate(self.peers)}
        self.statistics = statistics
        self.sizes = [int(s) for s in sizes]
        # the parties' machines (p2pdp.protocols.oneshot): this host's members and curators
        # decide what they accept and do; the host moves frames and keeps their payloads
        self.member = Member(dict(zip(self.peers, self.sizes, strict=True)),
                             everyone=settings.full_publication)  # fmt: skip
        self.curator = Curator(
            everyone=settings.full_publication, min_shard_size=settings.min_shard_size
        )
        self.releaser = releaser
        self.sensitivity = sensitivity
        self.settings = settings
        self.report = report
        self.dim = statistics.shape[-1]
        self.model_bytes = model_bytes(self.dim)
        self.ports: list[int] = []  # every peer's port, once the coordinator sent them
        self.addresses: list[str] = []  # every host's address, likewise
        self.servers: list[asyncio.base_events.Server] = []
        self.counters = _Counters(
            messages=np.zeros(settings.n_peers, dtype=np.int64),
            bytes=np.zeros(settings.n_peers, dtype=np.int64),
        )
        self.receipts: list[tuple[int, int]] = []
        self.groups: dict[int, tuple[Group, dict[int, np.ndarray]]] = {}  # as curator
        self.members: dict[int, _Member] = {}  # secure: peer -> its side of its group
        # (group, peer) -> {(sender, kind): (message, sender's TLS name)}: before the assignment
        # peer -> {sender: (group, {kind: (message, sender's TLS name))}}: what arrived for a
        # group before the peer's assignment to it
        self.early: dict[int, dict[int, tuple[int, dict[str, tuple[dict[str, Any], Any]]]]]
        self.early = {}
        self.early_held: Counter[int] = Counter()  # sender's host -> messages kept early
        # full publication: (group, sender) -> how many of this host's peers it reached, and
        # sender -> its groups among them (at most releases_per_peer); which pairs were real
        # releases comes with the coordinator's FINISH (``count_released``)
        self.arrivals: Counter[tuple[int, int]] = Counter()
        self.sender_groups: Counter[int] = Counter()
        self.released: set[tuple[int, int]] | None = None
        self.released_received = 0
        # full publication: peer -> sender -> the groups it published to that peer
        self.got: dict[int, dict[int, set[int]]] = defaultdict(dict)
        self.delivered: set[tuple[int, int]] = set()  # group publication: (peer, group)
        # publications refused as a second copy or beyond a sender's groups: (group, sender)
        # -> how many, and per sender how many such groups (bounded like arrivals)
        self.refused_publications: Counter[tuple[int, int]] = Counter()
        self.refused_senders: Counter[int] = Counter()
        self.released_pairs: set[tuple[int, int]] = set()  # (group, curator): the FINISH's
        self.frame_bytes = frame_bytes(self.dim, settings.n_peers)
        self.codec = FixedPoint()
        self.release_index: dict[int, int] = {}  # group -> its noise index (curator)
        self.deadline: dict[int, float] = {}  # group -> when its curator's timer runs out
        self.noise_position = 0  # draws of the run's noise stream consumed or skipped here
        self.noise_origin = releaser.noise.state()  # seeded: where a backward seek restarts
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._used: dict[int, float] = {}  # receiver -> when its connection was last used
        self._outbox: deque[tuple[int | None, Any]] = deque()  # (receiver, frame) or action
        self._connecting: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._sending: asyncio.Future | None = None
        self._more = asyncio.Event()  # set when the outbox has something to write
        self.formation: HostFormation | None = None  # gossip group formation, if the run's
        self.failure = Failure(HostError)  # the first fault of its callbacks: ends its run

    @property
    def last_group(self) -> dict[int, int]:
        """peer -> the last group it was assigned (its member machine's)."""
        return self.member.last_group

    # -- the final report --------------------------------------------------------------------
    def stats(self, host_index: int) -> dict[str, Any]:
        """The ``STATS`` report of this host."""
        counters = self.counters
        sent = np.flatnonzero(counters.messages)
        return {
            "kind": STATS,
            "host": host_index,
            "sent": [[int(p), int(counters.messages[p]), int(counters.bytes[p])] for p in sent],
            "wire": {k: [counters.wire[k], counters.wire_bytes[k]] for k in counters.wire},
            "refused": {
                **counters.refused,
                **({PRE_EMPTED: pre} if (pre := self.pre_empted()) else {}),
            },
            # (peer, release) pairs as int64 bytes: a msgpack list of lists is ~3x larger
            "receipts": np.array(self.receipts, dtype="<i8").reshape(-1, 2).tobytes(),
        }

    # -- the protocol ------------------------------------------------------------------------
    def handle(self, peer: int, message: dict[str, Any], who: str | None = None) -> None:
        """One frame addressed to ``peer``, already known to be a map with a kind, from the
        TLS identity ``who`` (checked when this host uses TLS)."""
        kind = message["kind"]
        try:
            if self.credential is not None:
                self._check_sender(message, who)
            if kind in PEER_KINDS:
                if self.formation is None:
                    raise ProtocolError(f"a {kind!r} frame in a run without gossip formation")
                self.formation.handle(peer, message)
            elif kind in (SUBMIT, SHARE, PARTIAL) and not self._assigned(peer, kind, message):
                self._keep_early(peer, message, who)
            elif kind == ASSIGN:
                self._on_assign(peer, message)
            elif kind == SUBMIT:
                self._on_submit(peer, message)
            elif kind == SHARE:
                self._on_share(peer, message)
            elif kind == PARTIAL:
                self._on_partial(peer, message)
            elif kind == PUBLISH:
                self._on_publish(peer, message)
            else:
                raise ProtocolError(f"unknown kind {kind!r}")
        except Late as error:  # honest, but too late (its group ended; a slow view reply)
            self.counters.refused[EXPIRED] += 1
            log.info("peer %d: a late %r frame, lost: %s", peer, kind, error)
        except (KeyError, TypeError, ValueError, OverflowError, ProtocolError) as error:
            # counted by kind, or as "unknown": a sender cannot grow the counter's keys
            self.counters.refused[kind if kind in KINDS else "unknown"] += 1
            log.warning("peer %d: refused a %r frame: %s", peer, kind[:32], error_reason(error))

    def _on_publish(self, peer: int, message: dict[str, Any]) -> None:
        """A release for ``peer``: from its group's curator, once per group and sender, with
        the group's index. A ``group`` publication is checked against ``peer``'s own
        assignment; a ``full`` one reaches peers outside the group, who cannot know a group's
        curator: each ``(group, sender)`` is taken once per peer, and at most
        ``releases_per_peer`` groups per sender (all a peer can curate), so a sender that
        makes up groups takes only its own places, never another sender's (and never the
        place of a real group of its own it has not made up). A publication refused as a
        second copy, or beyond its sender's groups, is remembered (:meth:`pre_empted`)."""
        group, sender = integer(message["group"], "group"), _sender(message)
        index = message["index"]
        if type(index) is not int or index != group:  # an assignment's index is its group
            raise ProtocolError(f"a publication of group {group} with index {index!r:.40}")
        key = (group, sender)
        if self.settings.full_publication:
            groups = self.got[peer].setdefault(sender, set())
            if group in groups:
                self._turned_away(key)
                raise ProtocolError(f"a publication of group {group} from {sender} replayed")
            if key not in self.arrivals:
                if self.sender_groups[sender] >= self.settings.releases_per_peer:
                    self._turned_away(key)
                    raise ProtocolError(
                        f"a publication of group {group} from {sender}, which has published "
                        f"{self.settings.releases_per_peer} groups here: all a peer can curate"
                    )
                self.sender_groups[sender] += 1
            groups.add(group)
            self.arrivals[key] += 1
            if self.released is not None and key in self.released:
                self.released_received += 1
        else:
            try:
                self.member.publication(peer, group, sender)
            except Refused:
                if (peer, group) in self.delivered:
                    self._turned_away(key)
                raise
            self.delivered.add((peer, group))
            self.receipts.append((peer, group))
        self.counters.publications_received += 1

    def _turned_away(self, key: tuple[int, int]) -> None:
        """Remember a refused publication of ``key`` (group, sender): if that group was
        released by that sender, an honest copy was not delivered (a forged one with its id,
        or a replay, came first). At most ``releases_per_peer`` groups per sender, as
        arrivals."""
        if key in self.refused_publications or (
            self.refused_senders[key[1]] < self.settings.releases_per_peer
        ):
            self.refused_senders[key[1]] += key not in self.refused_publications
            self.refused_publications[key] += 1

    def count_released(self, released: set[tuple[int, int]]) -> None:
        """Full publication, at the end of the run: ``released`` holds the ``(group,
        curator)`` pair of every release (the coordinator's, public); from now on
        :attr:`released_received` counts the publications this host's peers received of
        those groups from their curators (a made-up group, or a real one from another
        sender, counts for nothing)."""
        self.released = released
        self.released_received = sum(self.arrivals.get(pair, 0) for pair in released)

    def pre_empted(self) -> int:
        """Publications of released groups (the coordinator's FINISH names each with its
        curator) that this host's peers refused: a second copy (a forgery with the group's
        id, or a replay, came first) or beyond the curator's groups. Each is a message of
        the run that was not delivered as sent; 0 before the FINISH."""
        released = self.released_pairs
        return sum(n for key, n in self.refused_publications.items() if key in released)

    def _assigned(self, peer: int, kind: str, message: dict[str, Any]) -> bool:
        """Whether ``peer`` was assigned the group of ``message`` in the role it needs: a
        member for a share, its curator for a submission or a partial sum (also once that
        group ended: its machine tells a late contribution from a refused one)."""
        group_id = integer(message["group"], "group")
        if kind == SHARE:  # its group now, or one it took shares of before (late)
            return self.member.share_group(peer, group_id) is not None
        return self.curator.collecting(peer, group_id) or self.curator.collected(peer, group_id)

    def _keep_early(self, peer: int, message: dict[str, Any], who: str | None) -> None:
        """A message for a group ``peer`` is not (yet) assigned to: the coordinator's
        assignment may trail another member's message (different connections), so keep it
        until then. Refused if that group is behind the peer already. At most one group's
        messages per sender (one per kind): an honest sender is in one group at a time and
        only moves forward, so a newer group replaces an older one, and a sender that makes
        up groups only ever takes its own place, never an honest sender's."""
        group_id, sender = integer(message["group"], "group"), _sender(message)
        kind = message["kind"]
        if group_id <= self.last_group.get(peer, -1):
            raise ProtocolError(f"group {group_id} is not one {peer} takes part in now")
        kept = self.early.setdefault(peer, {})
        held = kept.get(sender)
        if held is not None and held[0] > group_id:
            raise ProtocolError(f"{kind} from {sender} for group {group_id} after a later one")
        if held is None or held[0] < group_id:
            if held is not None:
                self._drop_early(peer, sender)
            held = kept[sender] = (group_id, {})
        if kind in held[1]:
            raise ProtocolError(f"a second {kind} from {sender} (replayed)")
        origin = int(self.host_of[sender])
        size = self.settings.group_size  # every member of every group in flight, to each other
        budget = self.settings.max_concurrent * size * (size - 1)
        if self.early_held[origin] >= budget:  # its older groups first: an honest one moved on
            for other, senders in self.early.items():
                for s, (g, _) in list(senders.items()):
                    if g < group_id and self.host_of[s] == origin:
                        self._drop_early(other, s)
        if self.early_held[origin] >= budget:
            raise ProtocolError(f"host {origin} has {budget} messages kept early already")
        held[1][kind] = (message, who)
        self.early_held[origin] += 1

    def _drop_early(self, peer: int, sender: int) -> None:
        """Forget what ``peer`` kept from ``sender`` (counted as refused ``early``)."""
        _, messages = self.early[peer].pop(sender)
        self.counters.refused["early"] += len(messages)
        self.early_held[int(self.host_of[sender])] -= len(messages)

    def _replay_early(self, peer: int, group_id: int) -> None:
        """``peer`` was just assigned ``group_id``: handle what arrived for it before (and
        drop what it kept for earlier groups: they are over for it)."""
        kept = self.early.get(peer, {})
        for sender, (group, messages) in list(kept.items()):
            if group > group_id:
                continue
            if group < group_id:
                self._drop_early(peer, sender)
                continue
            del kept[sender]
            self.early_held[int(self.host_of[sender])] -= len(messages)
            for message, who in messages.values():
                self.handle(peer, message, who)

    def _check_sender(self, message: dict[str, Any], who: str | None) -> None:
        """Refuse a frame whose claimed sender is not what the connection authenticated:
        assignments come from the coordinator, a peer's messages from the host running it."""
        sender = _sender(message)
        if sender != SAMPLER and not 0 <= sender < self.settings.n_peers:
            raise ProtocolError(f"unknown sender {sender}")
        entitled = COORDINATOR if sender == SAMPLER else host_name(int(self.host_of[sender]))
        if who != entitled:
            raise ProtocolError(f"sender {sender} impersonated by {who!r} (expected {entitled})")

    def _group(self, message: dict[str, Any]) -> Group:
        members = np.array([integer(m, "member") for m in message["members"]], dtype=np.int64)
        curator = integer(message["curator"], "curator")
        if curator not in members.tolist() or len(set(members.tolist())) != members.size:
            raise ProtocolError(f"bad group {members.tolist()} with curator {curator}")
        return Group(
            integer(message["group"], "group"), members, curator, secure=self.releaser.secure
        )

    def _on_assign(self, peer: int, message: dict[str, Any]) -> None:
        group = self._group(message)
        timeout = _seconds(message["timeout"])
        release = integer(message["release"], "release") if peer == group.curator else 0
        self.member.assign(peer, group, _sender(message))  # Refused unless it may
        if self.formation is not None:  # its formation lock gives way to the aggregation
            self.formation.assigned(peer)
        if peer == group.curator:  # the group as the coordinator formed it, nobody else
            self.groups[group.group_id] = (group, {})
            self.release_index[group.group_id] = release
        # its older group as curator is over; the curator's own timer, on its own clock (no
        # clock shared with anyone)
        self.carry_out(self.curator.joined(peer, group, timeout))
        if self.releaser.secure:
            self._share(peer, group)
        else:
            self._submit(peer, group)
        self._replay_early(peer, group.group_id)

    def _submit(self, peer: int, group: Group) -> None:
        step = self.member.contribute(peer, group)
        for send in step.sends:  # a member's statistic and size, to the curator
            self.send(
                send,
                group.group_id,
                members=group.members.tolist(),
                curator=group.curator,
                size=self.sizes[self.row[peer]],
                statistic=pack_vector(self.statistics[self.row[peer]]),
            )
        if step.ready:
            self._collect(group)

    def _on_submit(self, peer: int, message: dict[str, Any]) -> None:
        statistic = unpack_vector(message["statistic"], shape=(self.dim,))
        self._contribution(message, statistic)

    def carry_out(self, effects: list[Any]) -> None:
        """Carry out a machine's effects (:mod:`p2pdp.protocols.oneshot`), in order: a timer
        is a deadline on this host's clock (delivered before anything else of its group,
        :meth:`_due`), an abort drops what the curator holds of the group (the coordinator
        aborts it on its own timer), a collection releases (:meth:`_collect`)."""
        for effect in effects:
            if type(effect) is Timer:
                self.deadline[effect.group.group_id] = time.monotonic() + effect.after
            elif type(effect) is Abort:
                self._expire(effect.group.group_id)
            elif type(effect) is Collect:
                self._collect(effect.group)
            else:
                raise TypeError(f"a host carries out no {effect!r} here")

    def _due(self, group_id: int) -> bool:
        """Deliver the curator's timer of ``group_id`` if it ran out (its group is then
        aborted, :meth:`Curator.timer <p2pdp.protocols.oneshot.Curator.timer>`): True if so."""
        if time.monotonic() < self.deadline.get(group_id, math.inf):
            return False
        self.carry_out(self.curator.timer(self.groups[group_id][0]))
        return True

    # -- secure aggregation (p2pdp.privacy.secure_aggregation, for real) ----------------------
    def _share(self, peer: int, group: Group) -> None:
        """``peer`` learnt its group: it adds its own noise share to its part of the
        aggregate, encodes that in fixed point, keeps one additive share and sends one to
        every other member (drawn from the operating system's CSPRNG)."""
        n_members = group.members.size
        statistic = self.statistics[self.row[peer]]
        # The public bound makes the sensitivity known before anyone's size is.
        sensitivity = self.sensitivity([self.settings.min_shard_size] * n_members)
        rng = (
            self.releaser.member_stream(group.group_id, peer)
            if self.settings.seeded_noise
            else os_generator()
        )
        noise = self.releaser.noise_share(sensitivity, n_members, rng=rng)
        contribution = self.releaser.contribution(statistic, n_members, noise)
        if not np.abs(contribution).max() * n_members < self.codec.max_abs:
            raise ProtocolError(  # K such values could wrap the ring: contribute nothing
                f"contribution outside the fixed-point range of a group of {n_members}"
            )
        shares = share(self.codec.encode(contribution), n_members, rng=None)
        self.members[peer] = _Member(group, shares[-1].copy())  # its own share: the remainder
        step = self.member.contribute(peer, group)
        for send, row in zip(step.sends, shares[:-1], strict=True):
            self.send(
                send,
                group.group_id,
                members=group.members.tolist(),
                curator=group.curator,
                share=pack_vector(row, ring=True),
            )
        if step.ready:  # a group of one: its share is its partial sum
            self._collect(group)

    def _on_share(self, peer: int, message: dict[str, Any]) -> None:
        """A share for ``peer``'s current group: add it; with one from every other member,
        send the partial sum (and the shard size) to the curator. (A share for a group it
        took shares of before is late, or refused.)"""
        sender = _sender(message)
        vector = unpack_vector(message["share"], shape=(self.dim,), ring=True)
        group_id = integer(message["group"], "group")
        member = self.members[peer]
        group = member.group
        if group.group_id != group_id:  # one it took shares of before: late, or refused
            past = self.member.share_group(peer, group_id)
            if past is None:  # (_assigned checked it)
                raise ProtocolError(f"a share of group {group_id}, which {peer} was not in")
            group = past
        step = self.member.share(peer, group, sender)  # Late or Refused unless it may
        member.partial += vector  # mod 2^64
        size = self.sizes[self.row[peer]]
        for send in step.sends:
            self.send(
                send,
                group.group_id,
                members=group.members.tolist(),
                curator=group.curator,
                size=size,
                partial=pack_vector(member.partial, ring=True),
            )
        if step.ready:
            self._collect(group)

    def _on_partial(self, peer: int, message: dict[str, Any]) -> None:
        partial = unpack_vector(message["partial"], shape=(self.dim,), ring=True)
        self._contribution(message, partial)

    def _contribution(self, message: dict[str, Any], vector: np.ndarray) -> None:
        """A submission or partial sum (``vector``, parsed) for a group a curator of this
        host collects (:meth:`_assigned` checked it): once its timer is delivered if it ran
        out, the curator's machine accepts it or refuses it (:meth:`Curator.receive
        <p2pdp.protocols.oneshot.Curator.receive>`: from outside the group, a second one, a
        shard size below the public minimum; :class:`~p2pdp.protocols.oneshot.Late` if it
        would have been accepted but its group ended); the host keeps the vector."""
        group_id, sender = integer(message["group"], "group"), _sender(message)
        size = integer(message["size"], "size")
        self._due(group_id)
        effects = self.curator.receive(message["kind"], group_id, sender, size)
        self.groups[group_id][1][sender] = vector
        self.carry_out(effects)

    def _collect(self, group: Group) -> None:
        """The curator holds every contribution: past its timer the group is dropped (counted
        ``expired``: the coordinator has aborted it); else its machine's decisions, in order:
        the charge (carried to the coordinator, which owns the ledger, by the ``DONE``
        report of :meth:`_publish`), the release, the publication."""
        if self._due(group.group_id):
            self.counters.refused[EXPIRED] += 1
            log.warning(
                "curator %d: group %d expired before it completed", group.curator, group.group_id
            )
            return
        released = record = None
        for effect in self.curator.collect(group):
            if type(effect) is Release:
                release = self._release_secure if self.releaser.secure else self._release
                released, record = release(group)
            elif type(effect) is Publish:
                assert released is not None and record is not None  # released first
                self._publish(group, released, record)
            # Charge: the coordinator charges what the DONE report names (it owns the ledger)

    def _release_secure(self, group: Group) -> tuple[np.ndarray, ReleaseRecord]:
        """The curator holds every partial sum (its own is its member side's): their sum mod
        2^64 decodes to the noisy aggregate, the only thing it learns."""
        _, received = self.groups.pop(group.group_id)
        # its own partial sum: its member side is still this group's (a new assignment of the
        # curator expires the group first)
        received[group.curator] = self.members[group.curator].partial
        total = np.sum([received[m] for m in group.submitted], axis=0, dtype=np.uint64)
        released = self.codec.decode(total)
        sensitivity = self.sensitivity(group.sizes)
        record = self.releaser.record(group.members.size, group.sizes, sensitivity, math.nan)
        return released, record

    def _expire(self, group_id: int) -> None:
        """The group's collection deadline passed: the coordinator aborts it, so its curator
        must never release it."""
        self.groups.pop(group_id, None)
        self.release_index.pop(group_id, None)
        self.deadline.pop(group_id, None)

    def _release(self, group: Group) -> tuple[np.ndarray, ReleaseRecord]:
        """The curator holds every statistic: its own first, then the others' in member
        order; the noisy release, its noise from the CSPRNG (or, seeded, from the run's
        noise stream at its group's index)."""
        _, received = self.groups.pop(group.group_id)
        curator = group.curator
        received[curator] = self.statistics[self.row[curator]]
        order = [curator, *(m for m in group.members.tolist() if m != curator)]
        size_of = dict(zip(group.submitted, group.sizes, strict=True))
        sizes = [size_of[m] for m in order]
        rng = None  # seeded: the run's stream, at the draw of the group's index
        if self.settings.seeded_noise:
            self._seek_noise(self.release_index[group.group_id])
        else:
            rng = os_generator()
        released, record = self.releaser.release(
            np.stack([received[m] for m in order]),
            sizes,
            self.sensitivity(sizes),
            curator=0,
            noise_rng=rng,
        )
        if rng is not None:  # the noise stays here: not even its norm is reported
            record = record._replace(noise_norm=math.nan)
        return released, record

    def _seek_noise(self, index: int) -> None:
        """Seeded: move the replica of the run's noise stream to draw ``index`` (its group's),
        backward too: with groups in flight at once, a later group may release first, and
        each group's noise stays the draw of its index whatever the order of releases."""
        noise = self.releaser.noise
        if index < self.noise_position:  # restart from the stream's origin, then skip
            noise.restore(self.noise_origin)
            self.noise_position = 0
        noise.skip(index - self.noise_position)
        self.noise_position = index + 1

    def _publish(self, group: Group, released: np.ndarray, record: Any) -> None:
        """Send the release to the members (``group``) or every other peer (``full``), then
        report it to the coordinator once those frames are written."""
        index = self.release_index.pop(group.group_id)
        del self.deadline[group.group_id]
        curator = group.curator
        if not self.settings.full_publication:
            self.receipts.append((curator, index))
        receivers = (
            [p for p in range(self.settings.n_peers) if p != curator]
            if self.settings.full_publication
            else [m for m in group.members.tolist() if m != curator]
        )
        model = pack_vector(released)
        publication = {"kind": PUBLISH, "sender": curator, "group": group.group_id}
        frame = encode({**publication, "index": index, "model": model})
        self.send_frame(PUBLISH, curator, receivers, frame)
        self.after_sends(
            lambda: self.report(
                {
                    "kind": DONE,
                    "group": group.group_id,
                    "members": group.members.tolist(),
                    "curator": curator,
                    "model": model,
                    "record": record.as_row(),
                }
            )
        )
