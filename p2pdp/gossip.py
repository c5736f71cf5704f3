"""Decentralised group formation: Newscast peer sampling and a commit-reveal group protocol.

:class:`GossipSampler` replaces the seed's central GroupAgent (``groups.sampler = "gossip"``).
No component knows every peer: each peer's *view* (``gossip.view_size`` = c entries of
``(peer id, timestamp)``) is its only knowledge of the network, and every protocol message
goes through the world's transport, so it is delayed, lost and counted like any other.

Peer sampling (Newscast, Jelasity et al. 2003/2007)
    Views start as c random overlay neighbours (:mod:`p2pdp.overlay`). Every
    ``gossip.gossip_period`` seconds each online peer sends its view plus a fresh descriptor of
    itself to a uniformly random member of its view; the partner answers with its own view and
    descriptor, and both keep the c freshest distinct entries of the union (never themselves).
    A peer that cannot afford another aggregation keeps relaying views but stops advertising
    itself, so its descriptor ages out and views converge on the peers that can still join
    groups; an offline peer is not refreshed either, so churn cleans views the same way.

    Keeping the freshest entries clusters views (two partners end up with nearly the same
    view), and small views can split the network for good. Measured (random 10-regular
    overlay, 100 periods): c = 10 leaves 500 peers in ~20 disconnected view components,
    c = 15 split 23 of 2,000 peers off after 500 periods, c = 20 stayed connected in every
    run (P = 500 to 5,000, every overlay kind, 500 periods). Use c >= 20 (the default). In-
    degrees are uneven too (c = 20: standard deviation ~8.5 around the mean 20).

    Scale trade-off. One SimPy process drives all exchanges instead of P processes: time is
    cut into ``TICKS_PER_PERIOD`` ticks per period, each peer has a fixed random tick (its
    phase), and at its tick all due exchanges are merged in numpy on (P, c) arrays. Exchanges
    within a tick are applied in conflict-free batches (no peer twice in a batch, each peer's
    exchanges in a random order), which equals applying them one after the other in that
    order, so no merge is lost. What is simplified: an exchange is atomic at its tick (its two
    messages take no time, although they are counted and each can be lost with probability
    ``network.loss``), and the jitter of a peer's period is quantised to a tick (its
    descriptor's timestamp is still jittered uniformly within the tick, which breaks ties
    randomly). With latencies (~50 ms) far below the period (1 s) a view is at most one
    round-trip fresher than in a message-level simulation, and Newscast's properties (random
    views, self-healing) do not depend on that. A per-peer process would cost ~P events per
    period; here a period is ``TICKS_PER_PERIOD`` events and a few vectorised sorts. The same
    tick serves lock expiry and churn; initiations keep their exact (continuous) times.

Group formation (messages through the transport; c.f. GroupsConfig/GossipConfig)
    A free peer (not initiating, not locked, not in a group) that can afford one more
    aggregation waits an exponential backoff (mean ``gossip.backoff``) and initiates:

    1. ``INVITE`` to g - 1 random members of its view. A candidate accepts only if it is free,
       online and solvent (``world.ledger.can_afford``); it then locks itself to this group
       and answers ``ACCEPT`` with a signed commitment ``H(nonce)`` to a random nonce, else
       ``DECLINE``. A refusal is replaced by another view member at once; each retry round
       asks the peers that entered the view meanwhile, then again the silent and refusing.
    2. ``GROUP``: the member list (order fixed now) and every signed commitment, to each
       member; each member answers ``REVEAL`` with its signed nonce.
    3. ``START``: every revealed nonce, to each member, who checks them against the
       commitments, computes the curator ``members[sum(nonces) mod g]`` and answers ``ACK``
       (it is now committed to submit its model).
    4. With every ``ACK`` in, :meth:`World.start_group` runs the aggregation (members submit
       to the curator, who checks and spends budgets, releases, publishes).

    Curator election: the list order and every commitment are fixed before any nonce is
    revealed, so a member that changes its own nonce cannot steer the sum; the curator is
    uniform if any one member is honest. The initiator relays commitments and nonces, which
    is safe because they are signed by their authors. What remains is the veto of the last
    revealer (it can abort, not choose); that is inherent to commit-reveal. Steps 2-3 are the
    extra round trips this costs: 4 (g - 1) messages on top of the 2 (g - 1) of step 1.

    Every step waits ``gossip.invite_timeout`` for replies and re-sends to the silent members
    at most ``gossip.max_retries`` times. A group that cannot complete sends ``RELEASE`` to
    its members; any lock also expires by itself ``gossip.lock_timeout`` seconds after the
    last message of its group (``lock_timeout + groups.collect_timeout`` once committed), so
    a lost ``RELEASE`` or a crashed initiator never blocks a peer. Nobody is charged: budgets
    are only spent by the curator at release. Modelling simplification: the submissions leave
    when the initiator holds every ``ACK`` (a real member submits on ``START``, one latency
    earlier); if an ``ACK`` never arrives, the group is not started (in reality the other
    members would submit and the curator abort after ``collect_timeout``: same outcome, no
    release and no charge, different timing).

Faults (``gossip.churn`` and the crash probabilities) set ``world.online``: an offline peer
neither sends nor receives (messages reaching it are counted lost), the curator aborts if it
is offline when collection ends, and full publication reaches only the online peers.

Contention. Concurrent initiators compete for the same free peers. A peer's backoff mean
doubles with each failure in a row it saw (its attempts that did not form, its aggregations
that aborted; up to ``BACKOFF_DOUBLINGS`` times) and resets when it joins a published
aggregation; a peer that declines because it cannot afford another aggregation says so,
and the initiator drops it from its view.

Termination. A peer stops initiating after ``groups.max_failed_attempts`` failures in a
row (it still accepts invitations, and joining a published aggregation makes it try
again): a local rule. The run ends, once no aggregation is in flight, when fewer than g
peers can afford one, after ``groups.max_failed_attempts`` aborted aggregations in a row
(the central sampler's rule, which stops runs whose messages are mostly lost), or when every
peer that can afford one has stopped initiating and no attempt is under way. These are
*global* counts kept by an observer (the seed's CompletionAgent), not part of the protocol:
no peer acts on them.
A network-wide count of failed *formation* attempts would not do: at P = 100,000 hundreds
of attempts fail concurrently while thousands of groups form.

Not used by the gossip sampler: ``groups.max_concurrent_groups`` (concurrency emerges from
the backoff).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import simpy

from p2pdp.overlay import Overlay, build_overlay
from p2pdp.sim.transport import HEADER_BYTES

if TYPE_CHECKING:  # the world imports this module lazily
    from p2pdp.sim.world import Group, World

__all__ = ["TICKS_PER_PERIOD", "GossipSampler", "Newscast", "bootstrap_views", "merge_views"]

#: Ticks per gossip period: the resolution of the peers' gossip phases, of lock expiry and
#: of churn (initiations keep their exact times).
TICKS_PER_PERIOD = 10
#: A peer's mean backoff doubles after each failure in a row, at most this many times.
BACKOFF_DOUBLINGS = 3
#: Wire sizes (bytes): peer id, timestamp, hash (commitment), nonce, signature (Ed25519).
ID_BYTES, STAMP_BYTES, HASH_BYTES, NONCE_BYTES, SIGNATURE_BYTES = 4, 8, 32, 32, 64

INVITE, ACCEPT, DECLINE, GROUP, REVEAL, START, ACK, RELEASE = (
    "invite",
    "accept",
    "decline",
    "group",
    "reveal",
    "start",
    "ack",
    "release",
)
# Peer states of the formation protocol (a peer's own knowledge of itself).
TRAINING, FREE, INITIATING, LOCKED, COMMITTED, IN_GROUP, RETIRED = range(7)


def merge_views(
    ids: np.ndarray, stamps: np.ndarray, owners: np.ndarray, view_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Newscast merge: per row, the ``view_size`` freshest distinct entries, owner excluded.

    Parameters
    ----------
    ids : (n, m) int array
        Candidate peer ids per row (``m >= view_size``); -1 marks an empty slot.
    stamps : (n, m) float array
        Descriptor timestamps (simulated seconds); -inf marks an empty slot.
    owners : (n,) int array
        The peer whose view each row becomes (its own id is dropped).
    view_size : int
        c, the number of entries kept.

    Returns
    -------
    ids : (n, view_size) int32, stamps : (n, view_size) float64
        Freshest first; a duplicated id keeps its freshest timestamp; unused slots are -1 and
        -inf, after every used one.
    """
    rows = np.arange(ids.shape[0])[:, None]
    empty = (ids < 0) | (ids == owners[:, None]) | (stamps == -np.inf)
    stamps = np.where(empty, -np.inf, stamps)
    ids = np.where(empty, -1, ids)
    order = np.lexsort((-stamps, ids), axis=1)  # by id, then freshest first
    ids, stamps = ids[rows, order], stamps[rows, order]
    stamps[:, 1:][ids[:, 1:] == ids[:, :-1]] = -np.inf  # staler copies of the same id
    top = np.argsort(-stamps, axis=1, kind="stable")[:, :view_size]
    ids, stamps = ids[rows, top].astype(np.int32), stamps[rows, top]
    ids[stamps == -np.inf] = -1
    return ids, stamps


def bootstrap_views(
    overlay: Overlay, view_size: int, *, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """First views: up to ``view_size`` overlay neighbours per peer, chosen at random.

    Returns ``ids`` (P, c) int32 and ``stamps`` (P, c) float64: used entries first, with
    timestamps uniform in (-1, 0] s (descriptors a little older than the start), unused
    slots -1 and -inf.
    """
    n_peers = overlay.n_peers
    degrees = overlay.degrees()
    rows = np.repeat(np.arange(n_peers), degrees)
    order = np.lexsort((rng.random(rows.size), rows))  # rows kept in place, shuffled within
    rank = np.arange(rows.size) - overlay.indptr[rows]
    keep = rank < view_size
    ids = np.full((n_peers, view_size), -1, dtype=np.int32)
    stamps = np.full((n_peers, view_size), -np.inf)
    ids[rows[keep], rank[keep]] = overlay.indices[order[keep]]
    stamps[rows[keep], rank[keep]] = -rng.random(int(keep.sum()))
    return ids, stamps


class Newscast:
    """Every peer's view as (P, c) arrays, and the vectorised view exchange.

    Parameters
    ----------
    overlay : Overlay
        Bootstraps the views (:func:`bootstrap_views`).
    view_size : int
        c >= 1.
    rng : numpy.random.Generator
    """

    def __init__(self, overlay: Overlay, view_size: int, *, rng: np.random.Generator) -> None:
        self.view_size = view_size
        self.ids, self.stamps = bootstrap_views(overlay, view_size, rng=rng)
        self._first = np.empty(overlay.n_peers, dtype=np.int64)  # scratch for batching

    def view(self, peer: int) -> np.ndarray:
        """The peer ids in ``peer``'s view (int32, freshest first after the first exchange)."""
        row = self.ids[peer]
        return row[row >= 0]

    def forget(self, peer: int, other: int) -> None:
        """Remove ``other`` from ``peer``'s view (it left the candidate set), keeping order."""
        keep = self.ids[peer] != other
        n_kept = int(keep.sum())
        self.ids[peer, :n_kept] = self.ids[peer, keep]
        self.stamps[peer, :n_kept] = self.stamps[peer, keep]
        self.ids[peer, n_kept:] = -1
        self.stamps[peer, n_kept:] = -np.inf

    def partners(self, peers: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """A uniformly random view member per peer, (n,) int; -1 for an empty view."""
        counts = np.count_nonzero(self.ids[peers] >= 0, axis=1)
        slot = np.minimum((rng.random(peers.size) * counts).astype(np.int64), self.view_size - 1)
        return np.where(counts > 0, self.ids[peers, slot], -1)

    def exchange(
        self,
        initiators: np.ndarray,
        partners: np.ndarray,
        initiator_stamps: np.ndarray,
        partner_stamps: np.ndarray,
        reply_delivered: np.ndarray,
    ) -> None:
        """Apply the exchanges ``initiators[k] <-> partners[k]`` in the order k = 0, 1, ...

        Both sides merge the union of the two views and the two fresh descriptors
        ``(peer, stamp)`` (a stamp of -inf: the peer does not advertise itself). The partner
        always merges (its request arrived); the initiator only where ``reply_delivered``.
        Each initiator appears at most once; partners may repeat. Batches of exchanges that
        share no peer are merged at once, which gives the sequential result.
        """
        first = self._first
        todo = np.arange(initiators.size)
        while todo.size:
            a, b = initiators[todo], partners[todo]
            k = np.arange(todo.size)
            nodes = np.concatenate([a, b])
            first[nodes] = todo.size
            np.minimum.at(first, nodes, np.concatenate([k, k]))
            batch = (first[a] == k) & (first[b] == k)  # each peer's earliest exchange
            self._merge(
                a[batch],
                b[batch],
                initiator_stamps[todo[batch]],
                partner_stamps[todo[batch]],
                reply_delivered[todo[batch]],
            )
            todo = todo[~batch]

    def _merge(
        self,
        a: np.ndarray,
        b: np.ndarray,
        stamp_a: np.ndarray,
        stamp_b: np.ndarray,
        both: np.ndarray,
    ) -> None:
        ids = np.concatenate([self.ids[a], self.ids[b], a[:, None], b[:, None]], axis=1)
        stamps = np.concatenate(
            [self.stamps[a], self.stamps[b], stamp_a[:, None], stamp_b[:, None]], axis=1
        )
        owners = np.concatenate([b, a[both]])
        new_ids, new_stamps = merge_views(
            np.concatenate([ids, ids[both]]),
            np.concatenate([stamps, stamps[both]]),
            owners,
            self.view_size,
        )
        self.ids[owners] = new_ids
        self.stamps[owners] = new_stamps


@dataclass(slots=True, eq=False)
class Attempt:
    """One group being formed, as its initiator tracks it.

    ``nonces`` holds each member's secret nonce (drawn when it accepts; the initiator's when
    it sends ``GROUP``): simulation bookkeeping, read only through ``REVEAL`` messages.
    """

    attempt_id: int
    initiator: int
    phase: str = INVITE
    accepted: list[int] = field(default_factory=list)
    pending: set[int] = field(default_factory=set)
    pool: list[int] = field(default_factory=list)  # view members to invite
    declined: list[int] = field(default_factory=list)  # refused in this round
    replies: dict[int, int] = field(default_factory=dict)
    nonces: dict[int, int] = field(default_factory=dict)
    revealed: dict[int, int] = field(default_factory=dict)
    wake: simpy.Event | None = None
    active: bool = True


@dataclass(slots=True)
class Envelope:
    kind: str
    sender: int
    receiver: int
    attempt: Attempt
    payload: int = 0


class GossipSampler:
    """Group sampler from local views only; the interface of ``CentralSampler``.

    Parameters
    ----------
    world : World
        Reads ``world.config`` (``groups``, ``gossip``, ``network.loss``), ``world.ledger``,
        ``world.transport``; writes ``world.online`` (churn, crashes).
    rng : numpy.random.Generator
        The protocol stream: overlay seed, views, phases, backoffs, nonces, faults.

    Attributes
    ----------
    done : simpy.Event
        Succeeds with ``stop_reason`` when the run is over.
    attempts_started, attempts_failed, groups_started : int
        Formation attempts, those that did not form a group, and groups handed to the world.
    formation_messages, gossip_messages : int
        Messages sent by the formation protocol and by view exchanges (also counted, per
        sender, in ``world.transport``).
    """

    def __init__(self, world: World, *, rng: np.random.Generator) -> None:
        self.world = world
        self.env = world.env
        self.rng = rng
        self.params = world.config.gossip
        self.group_size = world.config.groups.group_size
        self.max_failed = world.config.groups.max_failed_attempts
        n_peers = world.ledger.n_peers
        self.overlay = build_overlay(self.params, n_peers, rng=rng)
        self.views = Newscast(self.overlay, self.params.view_size, rng=rng)
        self.phase = rng.integers(TICKS_PER_PERIOD, size=n_peers)
        self.state = np.full(n_peers, TRAINING, dtype=np.int8)
        self.bound = np.full(n_peers, -1, dtype=np.int64)  # attempt a peer is tied to
        # timers, served by the tick process (resolution: one tick)
        self.initiate_at = np.full(n_peers, np.inf)  # a free peer's next initiation
        self.lock_until = np.full(n_peers, np.inf)  # a locked or committed peer's lock expiry
        self.failures = np.zeros(n_peers, dtype=np.int64)
        self.next_change = np.full(n_peers, np.inf)  # next online/offline switch
        if self.params.churn:
            self.next_change = rng.random(n_peers) * self._session_lengths(n_peers)
        self._next_attempt = 0
        self.in_flight = 0
        self.n_solvent = int(np.count_nonzero(world.ledger.active_mask()))  # observer only
        self.n_trying = self.n_solvent  # solvent peers still initiating; observer only
        self.aborted_in_a_row = 0  # aborted aggregations since the last release; observer only
        self.attempts_in_flight = 0
        self.attempts_started = self.attempts_failed = self.groups_started = 0
        self.formation_messages = self.gossip_messages = 0
        self.stop_reason = ""
        self.done = world.env.event()
        self._uniforms: list[float] = []
        self._handlers = {
            INVITE: self._on_invite,
            ACCEPT: self._on_accept,
            DECLINE: self._on_decline,
            GROUP: self._on_group,
            REVEAL: self._on_reply,
            START: self._on_start,
            ACK: self._on_reply,
            RELEASE: self._on_release,
        }
        g = self.group_size
        self._bytes = {
            INVITE: HEADER_BYTES,
            ACCEPT: HEADER_BYTES + HASH_BYTES + SIGNATURE_BYTES,
            DECLINE: HEADER_BYTES,
            GROUP: HEADER_BYTES + g * (ID_BYTES + HASH_BYTES + SIGNATURE_BYTES),
            REVEAL: HEADER_BYTES + NONCE_BYTES + SIGNATURE_BYTES,
            START: HEADER_BYTES + g * (NONCE_BYTES + SIGNATURE_BYTES),
            ACK: HEADER_BYTES,
            RELEASE: HEADER_BYTES,
        }
        self._view_bytes = HEADER_BYTES + (self.params.view_size + 1) * (ID_BYTES + STAMP_BYTES)

    # -- the sampler interface ---------------------------------------------------------------
    def start(self, ready: list[int], n_not_ready: int) -> None:
        """Begin with the peers ``ready`` at time 0 (the others are still training)."""
        for peer in ready:
            self._become_free(peer)
        self.env.process(self._clock())
        self._check_done()

    def peer_ready(self, peer: int) -> None:
        self._become_free(peer)

    def group_finished(self, group: Group, *, published: bool) -> None:
        """Members become free again, or retire if they cannot afford another aggregation."""
        self.in_flight -= 1
        self.aborted_in_a_row = 0 if published else self.aborted_in_a_row + 1
        solvent = self.world.ledger.can_afford(group.members).tolist()
        for member, can_afford in zip(group.members.tolist(), solvent, strict=True):
            if published:
                self._succeeded(member)
            else:
                self._failed(member)
            if can_afford:
                self._become_free(member)
            else:
                self._retire(member)
        self._check_done()

    # -- bookkeeping -------------------------------------------------------------------------
    def _uniform(self) -> float:
        if not self._uniforms:
            self._uniforms = self.rng.random(4096).tolist()
        return self._uniforms.pop()

    def _session_lengths(self, n: int) -> np.ndarray:
        p = self.params
        return self.rng.lognormal(math.log(p.session_median), p.session_sigma, size=n)

    def _downtimes(self, n: int) -> np.ndarray:
        p = self.params
        return self.rng.lognormal(math.log(p.downtime_median), p.downtime_sigma, size=n)

    def _become_free(self, peer: int) -> None:
        self.state[peer] = FREE
        self.bound[peer] = -1
        self.lock_until[peer] = np.inf
        self._schedule_initiation(peer)

    def _schedule_initiation(self, peer: int) -> None:
        """Exponential backoff, its mean doubled per failure in a row of this peer."""
        if self.stop_reason or self.failures[peer] >= self.max_failed:
            self.initiate_at[peer] = np.inf
            return
        mean = self.params.backoff * 2.0 ** min(int(self.failures[peer]), BACKOFF_DOUBLINGS)
        self.initiate_at[peer] = self.env.now - mean * math.log1p(-self._uniform())

    def _succeeded(self, peer: int) -> None:
        if self.failures[peer] >= self.max_failed:
            self.n_trying += 1
        self.failures[peer] = 0

    def _failed(self, peer: int) -> None:
        self.failures[peer] += 1
        if self.failures[peer] == self.max_failed:
            self.n_trying -= 1

    def _retire(self, peer: int) -> None:
        self.state[peer] = RETIRED
        self.bound[peer] = -1
        self.n_solvent -= 1
        if self.failures[peer] < self.max_failed:
            self.n_trying -= 1

    def _check_done(self) -> None:
        """The observer's stop test (global counters; no peer acts on them)."""
        if self.done.triggered:
            return
        if not self.stop_reason:
            if self.n_solvent < self.group_size:
                self.stop_reason = (
                    f"fewer than {self.group_size} peers can afford another aggregation"
                )
            elif self.aborted_in_a_row >= self.max_failed:
                self.stop_reason = f"{self.max_failed} aggregations in a row failed"
            elif self.n_trying == 0 and self.attempts_in_flight == 0 and self.in_flight == 0:
                self.stop_reason = (
                    "every peer that can afford an aggregation stopped initiating after "
                    f"{self.max_failed} failures in a row"
                )
        if self.stop_reason and self.in_flight == 0:
            self.done.succeed(self.stop_reason)

    # -- peer sampling and churn -------------------------------------------------------------
    def _clock(self):
        """The one process behind the gossip, the timers and churn: one step per tick."""
        tick = self.params.gossip_period / TICKS_PER_PERIOD
        order = np.argsort(self.phase, kind="stable")
        by_phase = np.split(order, np.cumsum(np.bincount(self.phase, minlength=TICKS_PER_PERIOD)))
        k = 0
        while not self.done.triggered:
            self._apply_churn()
            self._expire_locks()
            self._gossip_round(by_phase[k % TICKS_PER_PERIOD], tick)
            self._start_initiations(tick)
            k += 1
            yield self.env.timeout(tick)

    def _expire_locks(self) -> None:
        """Free the peers whose lock ran out (its group never started)."""
        for peer in np.flatnonzero(self.lock_until <= self.env.now).tolist():
            self._become_free(peer)

    def _start_initiations(self, tick: float) -> None:
        """Initiations due before the next tick, each at its own time (not in lockstep)."""
        now = self.env.now
        for peer in np.flatnonzero(self.initiate_at < now + tick).tolist():
            at = float(self.initiate_at[peer])
            timer = self.env.timeout(max(0.0, at - now))
            timer.callbacks.append(lambda _event, peer=peer, at=at: self._initiate(peer, at))

    def _gossip_round(self, peers: np.ndarray, tick: float) -> None:
        """One tick: every online peer of this phase exchanges views with a view member."""
        world, rng, now = self.world, self.rng, self.env.now
        peers = rng.permutation(peers[world.online[peers]])
        partners = self.views.partners(peers, rng=rng)
        initiators, partners = peers[partners >= 0], partners[partners >= 0]
        transport, loss = world.transport, world.config.network.loss
        delivered = world.online[partners] & (rng.random(initiators.size) >= loss)
        a, b = initiators[delivered], partners[delivered]
        reply_delivered = rng.random(a.size) >= loss
        transport.messages_sent[initiators] += 1  # initiators are distinct
        transport.bytes_sent[initiators] += self._view_bytes
        np.add.at(transport.messages_sent, b, 1)
        np.add.at(transport.bytes_sent, b, self._view_bytes)
        transport.messages_lost += int(initiators.size - a.size + (~reply_delivered).sum())
        self.gossip_messages += initiators.size + a.size
        stamps = now + rng.random((2, a.size)) * tick  # jitter within the tick
        stamps[0, self.state[a] == RETIRED] = -np.inf  # retired peers do not advertise
        stamps[1, self.state[b] == RETIRED] = -np.inf
        self.views.exchange(a, b, stamps[0], stamps[1], reply_delivered)

    def _apply_churn(self) -> None:
        now = self.env.now
        due = np.flatnonzero(self.next_change <= now)
        if not due.size:
            return
        online = self.world.online
        leaving, returning = due[online[due]], due[~online[due]]
        online[leaving] = False
        self.next_change[leaving] = now + self._downtimes(leaving.size)
        online[returning] = True
        self.next_change[returning] = (
            now + self._session_lengths(returning.size) if self.params.churn else np.inf
        )
        for peer in returning[self.state[returning] == FREE].tolist():
            self._schedule_initiation(peer)

    def _crash(self, peer: int) -> None:
        """``peer`` goes offline now, for one downtime."""
        self.world.online[peer] = False
        self.next_change[peer] = self.env.now + self._downtimes(1)[0]

    # -- messages ----------------------------------------------------------------------------
    def _send(self, kind: str, sender: int, receiver: int, attempt: Attempt, payload=0) -> None:
        self.formation_messages += 1
        message = Envelope(kind, sender, receiver, attempt, payload)
        self.world.transport.send(sender, self._deliver, message, self._bytes[kind])

    def _deliver(self, message: Envelope) -> None:
        if not self.world.online[message.receiver]:  # arrived while the receiver was offline
            self.world.transport.messages_lost += 1
            return
        self._handlers[message.kind](message)

    def _wake(self, attempt: Attempt) -> None:
        if attempt.wake is not None and not attempt.wake.triggered:
            attempt.wake.succeed()

    def _tied(self, peer: int, attempt: Attempt, *states: int) -> bool:
        return self.bound[peer] == attempt.attempt_id and self.state[peer] in states

    # candidate / member side
    def _on_invite(self, message: Envelope) -> None:
        peer, attempt = message.receiver, message.attempt
        if self._tied(peer, attempt, LOCKED):  # a re-sent invitation
            self._send(ACCEPT, peer, message.sender, attempt)
        elif self.state[peer] == FREE and self.world.ledger.can_afford([peer])[0]:
            self.state[peer] = LOCKED
            self.bound[peer] = attempt.attempt_id
            self.lock_until[peer] = self.env.now + self.params.lock_timeout
            attempt.nonces[peer] = int(self._uniform() * 2**53)
            self._send(ACCEPT, peer, message.sender, attempt)
        else:  # busy, or retired: then the payload says so and the initiator forgets it
            self._send(DECLINE, peer, message.sender, attempt, int(self.state[peer] == RETIRED))

    def _on_group(self, message: Envelope) -> None:
        peer, attempt = message.receiver, message.attempt
        if self._tied(peer, attempt, LOCKED):
            self.lock_until[peer] = self.env.now + self.params.lock_timeout
            self._send(REVEAL, peer, message.sender, attempt, attempt.nonces[peer])

    def _on_start(self, message: Envelope) -> None:
        peer, attempt = message.receiver, message.attempt
        if self._tied(peer, attempt, LOCKED, COMMITTED):
            self.state[peer] = COMMITTED
            seconds = self.params.lock_timeout + self.world.config.groups.collect_timeout
            self.lock_until[peer] = self.env.now + seconds
            self._send(ACK, peer, message.sender, attempt)

    def _on_release(self, message: Envelope) -> None:
        if self._tied(message.receiver, message.attempt, LOCKED, COMMITTED):
            self._become_free(message.receiver)

    # initiator side
    def _on_accept(self, message: Envelope) -> None:
        attempt, peer = message.attempt, message.sender
        if peer in attempt.accepted:
            return
        if (
            attempt.active
            and attempt.phase == INVITE
            and len(attempt.accepted) < self.group_size - 1
        ):
            attempt.pending.discard(peer)
            if peer in attempt.pool:  # a late answer to a timed-out invitation
                attempt.pool.remove(peer)
            if peer in attempt.declined:  # refused earlier, accepted a later invitation
                attempt.declined.remove(peer)
            attempt.accepted.append(peer)
            if len(attempt.accepted) == self.group_size - 1:
                self._wake(attempt)
        else:  # not needed (any more): unlock it now rather than at its lock timeout
            self._send(RELEASE, attempt.initiator, peer, attempt)

    def _on_decline(self, message: Envelope) -> None:
        attempt, peer, retired = message.attempt, message.sender, message.payload
        if retired:
            self.views.forget(attempt.initiator, peer)
        if attempt.active and attempt.phase == INVITE and peer in attempt.pending:
            attempt.pending.discard(peer)
            if not retired:
                attempt.declined.append(peer)
            if attempt.pool:  # the initiator can invite a replacement
                self._wake(attempt)

    def _on_reply(self, message: Envelope) -> None:
        attempt = message.attempt
        expected = REVEAL if attempt.phase == GROUP else ACK
        if attempt.active and message.kind == expected and message.sender in attempt.accepted:
            attempt.replies[message.sender] = message.payload
            if len(attempt.replies) == len(attempt.accepted):
                self._wake(attempt)

    # -- the initiator's process -------------------------------------------------------------
    def _initiate(self, peer: int, at: float) -> None:
        if self.initiate_at[peer] != at:  # rescheduled since
            return
        self.initiate_at[peer] = np.inf
        if self.state[peer] != FREE or self.stop_reason or not self.world.online[peer]:
            return
        attempt = Attempt(self._next_attempt, peer)
        self._next_attempt += 1
        self.attempts_started += 1
        self.attempts_in_flight += 1
        self.state[peer] = INITIATING
        self.bound[peer] = attempt.attempt_id
        self.env.process(self._run_attempt(attempt))

    def _wait(self, attempt: Attempt, deadline: simpy.Event):
        """Until a message handler wakes the initiator or ``deadline`` fires."""
        attempt.wake = self.env.event()
        yield attempt.wake | deadline

    def _run_attempt(self, attempt: Attempt):
        formed = yield from self._invite_phase(attempt)
        if formed:
            attempt.nonces[attempt.initiator] = int(self._uniform() * 2**53)
            formed = yield from self._request_phase(attempt, GROUP)
        if formed:
            attempt.revealed = dict(attempt.replies)
            formed = yield from self._request_phase(attempt, START)
        if formed and self._can_start(attempt):
            self._start(attempt)
        else:
            self._abandon(attempt)
        self.attempts_in_flight -= 1
        self._check_done()

    def _invite_phase(self, attempt: Attempt):
        """Gather g - 1 acceptances from the initiator's view.

        A refusal is replaced at once by another view member. Each of the ``max_retries``
        further rounds first asks the members that entered the view meanwhile (gossip keeps
        refreshing it), then again the candidates that refused or were silent (they may be
        free by then).
        """
        need = self.group_size - 1
        initiator = attempt.initiator
        asked: set[int] = set()
        for _ in range(self.params.max_retries + 1):
            view = self.views.view(initiator).tolist()
            fresh = [peer for peer in view if peer not in asked]
            asked.update(fresh)
            retry, attempt.pending, attempt.declined = (
                [*attempt.pending, *attempt.declined],
                set(),
                [],
            )
            attempt.pool = [*retry, *self.rng.permutation(fresh).tolist()]  # fresh ones first
            deadline = self.env.timeout(self.params.invite_timeout)
            while (
                len(attempt.accepted) < need
                and self.world.online[initiator]
                and not deadline.processed
            ):
                while len(attempt.accepted) + len(attempt.pending) < need and attempt.pool:
                    candidate = attempt.pool.pop()
                    attempt.pending.add(candidate)
                    self._send(INVITE, initiator, candidate, attempt)
                yield from self._wait(attempt, deadline)
            if len(attempt.accepted) == need:
                return True
            if not self.world.online[initiator]:
                return False
        return False

    def _request_phase(self, attempt: Attempt, kind: str):
        """Send ``kind`` to every member and collect their replies, re-sending to the silent."""
        attempt.phase, attempt.replies = kind, {}
        for _ in range(self.params.max_retries + 1):
            if not self.world.online[attempt.initiator]:
                return False
            for member in attempt.accepted:
                if member not in attempt.replies:
                    self._send(kind, attempt.initiator, member, attempt)
            deadline = self.env.timeout(self.params.invite_timeout)
            while len(attempt.replies) < len(attempt.accepted) and not deadline.processed:
                yield from self._wait(attempt, deadline)
            if len(attempt.replies) == len(attempt.accepted):
                return True
        return False

    def _can_start(self, attempt: Attempt) -> bool:
        return (
            not self.stop_reason
            and bool(self.world.online[attempt.initiator])
            and self._tied(attempt.initiator, attempt, INITIATING)
            and all(self._tied(m, attempt, COMMITTED) for m in attempt.accepted)
        )

    def _start(self, attempt: Attempt) -> None:
        attempt.active = False
        members = np.array([attempt.initiator, *attempt.accepted], dtype=np.int64)
        nonce_sum = attempt.nonces[attempt.initiator] + sum(attempt.revealed.values())
        curator = int(members[nonce_sum % self.group_size])
        self.state[members] = IN_GROUP
        self.bound[members] = -1
        self.lock_until[members] = np.inf
        self.groups_started += 1
        self.in_flight += 1
        self._inject_crashes(members, curator)
        self.world.start_group(members, curator, announce=False)

    def _inject_crashes(self, members: np.ndarray, curator: int) -> None:
        """Crash a member (before it submits) and/or the curator, with the configured odds."""
        params = self.params
        others = members[members != curator]
        if others.size and self._uniform() < params.member_crash_probability:
            self._crash(int(others[int(self._uniform() * others.size)]))
        if self._uniform() < params.curator_crash_probability:
            self._crash(curator)

    def _abandon(self, attempt: Attempt) -> None:
        """The group did not form: release its members (nobody is charged)."""
        attempt.active = False
        self.attempts_failed += 1
        initiator = attempt.initiator
        if self.world.online[initiator]:
            for member in attempt.accepted:
                self._send(RELEASE, initiator, member, attempt)
        self._failed(initiator)
        if self._tied(initiator, attempt, INITIATING):
            self._become_free(initiator)
