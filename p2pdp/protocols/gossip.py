"""Gossip group formation as a transport-free state machine: invitations, commit-reveal, locks.

Every peer's side of the protocol below (a peer's state, its locks and timers, the attempts it
initiates) with no transport, clock or event loop in it. A driver (the SimPy one is
:mod:`p2pdp.sim.gossip.formation`) tells it the time (``clock``), delivers each message
(:meth:`GossipFormation.handle`), runs each attempt's coroutine
(:meth:`GossipFormation.run_attempt`: it yields :class:`StartTimer` and :class:`Wait`
commands), and after every call carries out the effects it queued, in order
(:meth:`GossipFormation.effects`): messages to send, attempts to wake, groups formed,
attempts over. For large P, :mod:`p2pdp.sim.gossip.rounds` keeps the peers' state here and
advances every attempt by one round trip per tick over arrays instead (a different random
process with the same guarantees; this per-message form is its reference).

Group formation (messages through the transport; c.f. GroupsConfig/GossipConfig)
    A free peer (not initiating, not locked, not in a group) that can afford one more
    aggregation waits an exponential backoff (mean ``gossip.backoff``) and initiates:

    1. ``INVITE`` to g - 1 random members of its view. A candidate accepts only if it is free,
       online and solvent (``can_afford``); it then locks itself to this group
       and answers ``ACCEPT`` with a signed commitment ``H(nonce)`` to a random nonce, else
       ``DECLINE``. A refusal is replaced by another view member at once; each retry round
       asks the peers that entered the view meanwhile, then again the silent and refusing.
    2. ``GROUP``: the member list (order fixed now) and every signed commitment, to each
       member; each member answers ``REVEAL`` with its signed nonce.
    3. ``START``: every revealed nonce, to each member, who checks them against the
       commitments, computes the curator ``members[sum(nonces) mod g]`` and answers ``ACK``
       (it is now committed to submit its model).
    4. With every ``ACK`` in, :meth:`~p2pdp.sim.world.World.start_group` runs the
       aggregation (members submit to the curator, who checks and spends budgets, releases,
       publishes).

    Curator election: the list order and every commitment are fixed before any nonce is
    revealed, so a member that changes its own nonce cannot steer the sum; the curator is
    uniform if any one member is honest. The initiator relays commitments and nonces, which
    is safe because they are signed by their authors. What remains is the veto of the last
    revealer (it can abort, not choose); that is inherent to commit-reveal. Steps 2-3 are the
    extra round trips this costs: 4 (g - 1) messages on top of the 2 (g - 1) of step 1.
    The initiator's own nonce must be committed too, or it could pick it after the reveals:
    the network driver sends the initiator's signed commitment with ``GROUP``
    (:mod:`p2pdp.net.gossip_host`); this machine, which models honest peers, draws it before
    ``GROUP`` and carries no commitment for it (it changes no draw and no row of a simulated
    run, where no peer lies).

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

Contention. Concurrent initiators compete for the same free peers. A peer's backoff mean
doubles with each failure in a row it saw (its attempts that did not form, its aggregations
that aborted; up to ``BACKOFF_DOUBLINGS`` times) and resets when it joins a published
aggregation; a peer that declines because it cannot afford another aggregation says so,
and the initiator drops it from its view.

Giving up (a local rule). A peer stops initiating after ``groups.max_failed_attempts``
failures in a row (it still accepts invitations, and joining a published aggregation makes
it try again). When the whole run ends is decided by an observer, not by the protocol (see
:mod:`p2pdp.sim.gossip.sampler`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from p2pdp.protocols.groups import failed_in_a_row, stopped_initiating, too_few_solvent

__all__ = [
    "ACCEPT",
    "ACK",
    "DECLINE",
    "GROUP",
    "INVITE",
    "RELEASE",
    "REVEAL",
    "START",
    "Attempt",
    "Envelope",
    "GossipFormation",
    "StartTimer",
    "Wait",
    "elected",
    "stop_reason",
]

#: A peer's mean backoff doubles after each failure in a row, at most this many times.
BACKOFF_DOUBLINGS = 3

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


def elected(members: list[int], nonces: list[int]) -> int:
    """The curator of a formed group: ``members[sum(nonces) mod g]``, ``members`` in the
    order fixed before any nonce was revealed (initiator first). The one rule of both
    drivers: the simulator's (:meth:`GossipFormation._start`) and the network coordinator's
    check of a formed report (:func:`p2pdp.net.commitments.elect`)."""
    return int(members[sum(nonces) % len(members)])


def stop_reason(
    *,
    solvent: int,
    aborted_in_a_row: int,
    trying: int,
    under_way: int,
    group_size: int,
    max_failed: int,
) -> str:
    """Why a gossip run stops, or "" while it goes on: the observer's rule, not the protocol's
    (no peer acts on it; the seed's CompletionAgent). The one rule of both drivers, fed the
    counts each keeps: the simulator's observer (:class:`p2pdp.sim.gossip.sampler.
    GossipSampler`) and the network coordinator (its gossip loop, from the ledger and the
    hosts' ``status`` reports).

    In order: fewer than ``group_size`` peers can afford another aggregation
    (:func:`~p2pdp.protocols.groups.too_few_solvent`); ``max_failed`` aggregations in a row
    aborted (:func:`~p2pdp.protocols.groups.failed_in_a_row`, the central sampler's rule,
    which stops runs whose messages are mostly lost); no peer initiates and nothing is under
    way (:func:`~p2pdp.protocols.groups.stopped_initiating`).

    Parameters
    ----------
    solvent : int
        Peers that can afford one more aggregation (beyond the charges a driver holds back).
    aborted_in_a_row : int
        Aggregations aborted since the last release.
    trying : int
        Peers still initiating (not given up after ``max_failed`` failures in a row); a driver
        that has not heard from some peers yet counts them here.
    under_way : int
        Formation attempts and aggregations in flight, and anything else that may make a
        peer initiate again (on the network: an ``ended`` frame a host has not carried out).
    group_size, max_failed : int
        ``groups.group_size`` and ``groups.max_failed_attempts``.
    """
    if solvent < group_size:
        return too_few_solvent(group_size)
    if aborted_in_a_row >= max_failed:
        return failed_in_a_row(max_failed)
    if trying == 0 and under_way == 0:
        return stopped_initiating(max_failed)
    return ""


@dataclass(slots=True, eq=False)
class Attempt:
    """One group being formed, as its initiator tracks it.

    ``nonces`` holds each member's secret nonce (drawn when it first accepts, kept if it is
    invited to the attempt again; the initiator's when it sends ``GROUP``): simulation
    bookkeeping, read only through ``REVEAL`` messages.
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
    active: bool = True


@dataclass(slots=True)
class Envelope:
    """One formation message: ``kind`` from ``sender`` to ``receiver`` about ``attempt``."""

    kind: str
    sender: int
    receiver: int
    attempt: Attempt
    payload: int = 0


class Timer(Protocol):
    """A driver's timer handle: ``fired`` once its time has come and gone."""

    @property
    def fired(self) -> bool: ...


class StartTimer(NamedTuple):
    """Command of an attempt's coroutine: start a timer of ``seconds``; the driver sends back
    its :class:`Timer` handle."""

    seconds: float


class Wait(NamedTuple):
    """Command of an attempt's coroutine: wait until a reply wakes the attempt (an effect
    ``("wake", attempt)``) or ``timer`` fires."""

    timer: Timer


class Views(Protocol):
    """The peer-sampling service formation reads: a peer's view, and forgetting a peer."""

    def view(self, peer: int) -> np.ndarray: ...

    def forget(self, peer: int, other: int) -> None: ...


class GossipFormation:
    """Every peer's side of the formation protocol: states, locks, timers, attempts.

    Parameters
    ----------
    group_size, max_failed : int
        ``groups.group_size``, ``groups.max_failed_attempts``.
    params : GossipConfig
        ``gossip.backoff``, ``lock_timeout``, ``invite_timeout``, ``max_retries``.
    collect_timeout : float
        ``groups.collect_timeout`` (a committed member's lock lasts that much longer).
    views : Views
        Whom an initiator invites; it forgets the peers that retired.
    clock : callable
        ``clock()``: the driver's time (seconds).
    online : (P,) bool array
        Which peers are up (the driver's; a peer that is down handles nothing).
    can_afford : callable
        ``can_afford(peers) -> (k,) bool``: which peers' budgets cover one more aggregation.
    solvent : int
        Peers that can afford an aggregation at the start.
    uniform : callable
        ``uniform()`` gives the next buffered uniform of the protocol stream (backoffs,
        nonces), shared with the faults.
    rng : numpy.random.Generator
        The protocol stream (the order of invitations).
    take : callable, optional
        ``take(n)``: the next ``n`` values of ``uniform()`` at once
        (:meth:`Uniforms.take <p2pdp.core.rng.Uniforms.take>`); None: ``n`` calls.

    Attributes
    ----------
    state : (P,) int8 array
        Each peer's protocol state (``TRAINING``, ``FREE``, ``INITIATING``, ``LOCKED``,
        ``COMMITTED``, ``IN_GROUP``, ``RETIRED``).
    initiate_at, lock_until : (P,) float arrays
        A free peer's next initiation; a locked or committed peer's lock expiry (inf: none).
    stopped : bool
        Set by the observer when the run ends: no peer initiates or starts a group any more.
    attempts_started, attempts_failed, attempts_in_flight : int
        Formation attempts: all, those that did not form a group, those under way.
    formation_messages : int
        Messages sent by the protocol.
    n_solvent, n_trying : int
        Peers that can afford another aggregation, and those of them still initiating:
        global counts for the observer; no peer acts on them.
    """

    def __init__(
        self,
        *,
        group_size: int,
        max_failed: int,
        params: Any,
        collect_timeout: float,
        views: Views,
        clock: Callable[[], float],
        online: np.ndarray,
        can_afford: Callable[[Any], np.ndarray],
        solvent: int,
        uniform: Callable[[], float],
        rng: np.random.Generator,
        take: Callable[[int], list[float]] | None = None,
    ) -> None:
        self.group_size = group_size
        self.max_failed = max_failed
        self.params = params
        self.collect_timeout = collect_timeout
        self.views = views
        self.clock = clock
        self.online = online
        self.can_afford = can_afford
        self.rng = rng
        self._uniform = uniform
        self._take = take or (lambda n: [uniform() for _ in range(n)])
        n_peers = online.size
        self.state = np.full(n_peers, TRAINING, dtype=np.int8)
        self.bound = np.full(n_peers, -1, dtype=np.int64)  # attempt a peer is tied to
        self.initiate_at = np.full(n_peers, np.inf)
        self.lock_until = np.full(n_peers, np.inf)
        self.failures = np.zeros(n_peers, dtype=np.int64)
        self._next_attempt = 0
        self.n_solvent = solvent  # observer only
        self.n_trying = solvent  # solvent peers still initiating; observer only
        self.attempts_in_flight = 0
        self.attempts_started = self.attempts_failed = 0
        self.formation_messages = 0
        self.stopped = False
        self._effects: list[tuple[str, Any]] = []
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

    def effects(self) -> list[tuple[str, Any]]:
        """What the calls since the last one decided, in order, and forget it: ``("send",
        Envelope)``, ``("wake", Attempt)``, ``("formed", (members, curator))`` (members:
        (g,) int64, initiator first) and ``("over", Attempt)``."""
        effects, self._effects = self._effects, []
        return effects

    # -- what the driver calls ---------------------------------------------------------------
    def handle(self, message: Envelope) -> None:
        """``message`` reached its (online) receiver."""
        self._handlers[message.kind](message)

    def members_back(self, members: np.ndarray, *, published: bool) -> None:
        """A group's aggregation ended: its members become free, or retire if broke.

        Array form of, per member in order: count the success or failure, then
        :meth:`become_free` or retire (the backoffs draw the protocol's uniforms in member
        order, as one call per member would)."""
        solvent = self.can_afford(members)
        failures, max_failed = self.failures, self.max_failed
        if published:
            self.n_trying += int(np.count_nonzero(failures[members] >= max_failed))
            failures[members] = 0
        else:
            failures[members] += 1
            self.n_trying -= int(np.count_nonzero(failures[members] == max_failed))
        broke, free = members[~solvent], members[solvent]
        self.state[broke] = RETIRED
        self.bound[broke] = -1
        self.n_solvent -= int(broke.size)
        self.n_trying -= int(np.count_nonzero(failures[broke] < max_failed))
        self.become_free_all(free)

    def become_free(self, peer: int) -> None:
        """``peer`` is idle and can afford an aggregation: it schedules an initiation."""
        self.state[peer] = FREE
        self.bound[peer] = -1
        self.lock_until[peer] = np.inf
        self._schedule_initiation(peer)

    def become_free_all(self, peers: np.ndarray) -> None:
        """:meth:`become_free` of each of ``peers`` (distinct ids), in order, at once: the
        same states and the same backoff draws."""
        self.state[peers] = FREE
        self.bound[peers] = -1
        self.lock_until[peers] = np.inf
        self.initiate_at[peers] = np.inf
        if self.stopped:
            return
        failures = self.failures
        trying = peers[failures[peers] < self.max_failed]
        # _schedule_initiation's arithmetic, in its order: now - (backoff 2^doublings) log1p(-u),
        # log1p by the math module as there, the rest correctly rounded operations (ldexp
        # scales by a power of two exactly): the same floats, without a Python loop
        means = np.ldexp(self.params.backoff, np.minimum(failures[trying], BACKOFF_DOUBLINGS))
        uniforms = self._take(trying.size)
        logs = np.fromiter(map(math.log1p, map(operator.neg, uniforms)), float, trying.size)
        self.initiate_at[trying] = self.clock() - means * logs

    def expire_locks(self) -> None:
        """Free the peers whose lock ran out (its group never started)."""
        self.become_free_all(np.flatnonzero(self.lock_until <= self.clock()))

    def due(self, horizon: float) -> list[tuple[int, float]]:
        """``(peer, at)`` of the initiations due before ``horizon`` (the driver calls
        :meth:`initiate` at each ``at``)."""
        peers = np.flatnonzero(self.initiate_at < horizon).tolist()
        return [(peer, float(self.initiate_at[peer])) for peer in peers]

    def initiate(self, peer: int, at: float) -> Attempt | None:
        """``peer``'s initiation scheduled for ``at`` is due: its new attempt (the driver runs
        :meth:`run_attempt`), or None (rescheduled since, busy, stopped or offline)."""
        if self.initiate_at[peer] != at:  # rescheduled since
            return None
        self.initiate_at[peer] = np.inf
        if self.state[peer] != FREE or self.stopped or not self.online[peer]:
            return None
        attempt = Attempt(self._new_attempt_id(), peer)
        self.attempts_started += 1
        self.attempts_in_flight += 1
        self.state[peer] = INITIATING
        self.bound[peer] = attempt.attempt_id
        return attempt

    def _new_attempt_id(self) -> int:
        """The id of the next attempt this machine starts: 0, 1, ... (a driver whose
        machines run side by side, one per host, makes them unique across hosts)."""
        attempt_id = self._next_attempt
        self._next_attempt += 1
        return attempt_id

    def rejoin(self, peers: np.ndarray) -> None:
        """``peers`` came back online: the free ones schedule an initiation again."""
        for peer in peers[self.state[peers] == FREE].tolist():
            self._schedule_initiation(peer)

    def retired(self, peers: np.ndarray) -> np.ndarray:
        """Bool mask (k,): which of ``peers`` retired (cannot afford another aggregation)."""
        return self.state[peers] == RETIRED

    # -- a peer's backoff, failures in a row and retirement ------------------------------------
    def _schedule_initiation(self, peer: int) -> None:
        """Exponential backoff, its mean doubled per failure in a row of this peer."""
        if self.stopped or self.failures[peer] >= self.max_failed:
            self.initiate_at[peer] = np.inf
            return
        mean = self.params.backoff * 2.0 ** min(int(self.failures[peer]), BACKOFF_DOUBLINGS)
        self.initiate_at[peer] = self.clock() - mean * math.log1p(-self._uniform())

    def _failed(self, peer: int) -> None:
        self.failures[peer] += 1
        if self.failures[peer] == self.max_failed:
            self.n_trying -= 1

    # -- messages ----------------------------------------------------------------------------
    def _send(self, kind: str, sender: int, receiver: int, attempt: Attempt, payload=0) -> None:
        self.formation_messages += 1
        self._effects.append(("send", Envelope(kind, sender, receiver, attempt, payload)))

    def _wake(self, attempt: Attempt) -> None:
        self._effects.append(("wake", attempt))

    def _tied(self, peer: int, attempt: Attempt, *states: int) -> bool:
        return self.bound[peer] == attempt.attempt_id and self.state[peer] in states

    # candidate / member side
    def _on_invite(self, message: Envelope) -> None:
        peer, attempt = message.receiver, message.attempt
        if self._tied(peer, attempt, LOCKED):  # a re-sent invitation
            self._send(ACCEPT, peer, message.sender, attempt)
        elif self.state[peer] == FREE and self.can_afford([peer])[0]:
            self.state[peer] = LOCKED
            self.bound[peer] = attempt.attempt_id
            self.lock_until[peer] = self.clock() + self.params.lock_timeout
            # invited again to this attempt after its lock ran out, it keeps the nonce it
            # drew first (on the network, committed to): the draw is still taken and dropped
            # so every later draw of the stream stays in place
            nonce = int(self._uniform() * 2**53)
            attempt.nonces.setdefault(peer, nonce)
            self._send(ACCEPT, peer, message.sender, attempt)
        else:  # busy, or retired: then the payload says so and the initiator forgets it
            self._send(DECLINE, peer, message.sender, attempt, int(self.state[peer] == RETIRED))

    def _on_group(self, message: Envelope) -> None:
        peer, attempt = message.receiver, message.attempt
        if self._tied(peer, attempt, LOCKED):
            self.lock_until[peer] = self.clock() + self.params.lock_timeout
            self._send(REVEAL, peer, message.sender, attempt, attempt.nonces[peer])

    def _on_start(self, message: Envelope) -> None:
        peer, attempt = message.receiver, message.attempt
        if self._tied(peer, attempt, LOCKED, COMMITTED):
            self.state[peer] = COMMITTED
            seconds = self.params.lock_timeout + self.collect_timeout
            self.lock_until[peer] = self.clock() + seconds
            self._send(ACK, peer, message.sender, attempt)

    def _on_release(self, message: Envelope) -> None:
        if self._tied(message.receiver, message.attempt, LOCKED, COMMITTED):
            self.become_free(message.receiver)

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

    # -- the initiator's coroutine -----------------------------------------------------------
    def run_attempt(self, attempt: Attempt) -> Generator[StartTimer | Wait, Any, None]:
        """The initiator's side of ``attempt``, as a coroutine of driver commands: it yields
        :class:`StartTimer` (the driver sends back the timer) and :class:`Wait`."""
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
        self._effects.append(("over", attempt))

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
            deadline = yield StartTimer(self.params.invite_timeout)
            while len(attempt.accepted) < need and self.online[initiator] and not deadline.fired:
                while len(attempt.accepted) + len(attempt.pending) < need and attempt.pool:
                    candidate = attempt.pool.pop()
                    attempt.pending.add(candidate)
                    self._send(INVITE, initiator, candidate, attempt)
                yield Wait(deadline)
            if len(attempt.accepted) == need:
                return True
            if not self.online[initiator]:
                return False
        return False

    def _request_phase(self, attempt: Attempt, kind: str):
        """Send ``kind`` to every member and collect their replies, re-sending to the silent."""
        attempt.phase, attempt.replies = kind, {}
        for _ in range(self.params.max_retries + 1):
            if not self.online[attempt.initiator]:
                return False
            for member in attempt.accepted:
                if member not in attempt.replies:
                    self._send(kind, attempt.initiator, member, attempt)
            deadline = yield StartTimer(self.params.invite_timeout)
            while len(attempt.replies) < len(attempt.accepted) and not deadline.fired:
                yield Wait(deadline)
            if len(attempt.replies) == len(attempt.accepted):
                return True
        return False

    def _can_start(self, attempt: Attempt) -> bool:
        return (
            not self.stopped
            and bool(self.online[attempt.initiator])
            and self._tied(attempt.initiator, attempt, INITIATING)
            and all(self._tied(m, attempt, COMMITTED) for m in attempt.accepted)
        )

    def _start(self, attempt: Attempt) -> None:
        attempt.active = False
        members = np.array([attempt.initiator, *attempt.accepted], dtype=np.int64)
        curator = elected(
            members.tolist(), [attempt.nonces[attempt.initiator], *attempt.revealed.values()]
        )
        self.state[members] = IN_GROUP
        self.bound[members] = -1
        self.lock_until[members] = np.inf
        self._effects.append(("formed", (members, curator)))

    def _abandon(self, attempt: Attempt) -> None:
        """The group did not form: release its members (nobody is charged)."""
        attempt.active = False
        self.attempts_failed += 1
        initiator = attempt.initiator
        if self.online[initiator]:
            for member in attempt.accepted:
                self._send(RELEASE, initiator, member, attempt)
        self._failed(initiator)
        if self._tied(initiator, attempt, INITIATING):
            self.become_free(initiator)
