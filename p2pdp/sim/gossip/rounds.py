"""Gossip group formation in rounds over arrays, for large P (``gossip.formation = "rounds"``).

The same protocol as :mod:`p2pdp.protocols.gossip` (invitations and locks, commit-reveal
curator election, retries, backoff, retirement), every peer's state in the same arrays, but no
message is an event: at each tick of the sampler's clock every attempt under way advances by
one round trip, all attempts of the tick at once, in numpy. :class:`RoundFormation` is used
from ``ROUNDS_FROM_PEERS`` peers on (``gossip.formation = "auto"``) or when asked for; the
per-message driver (:class:`~p2pdp.sim.gossip.formation.GroupFormation`) stays the reference.

One tick (``gossip.gossip_period / TICKS_PER_PERIOD``, 0.1 s by default) is one round trip:

1. An attempt whose ``ACK`` s are in starts its group if the run is not stopped and its
   initiator and every member are still bound to it (else it is abandoned: ``RELEASE``).
2. ``START`` / ``ACK``: the members commit (lock ``lock_timeout + collect_timeout``).
3. ``GROUP`` / ``REVEAL``: the members refresh their locks and reveal their nonces; the
   curator is ``members[sum(nonces) mod g]``, members in the order they accepted, the
   initiator first (the reference's rule).
4. The free peers whose initiation falls before the next tick initiate: their pools are their
   views in a random order.
5. An invitation wave: every attempt still inviting asks as many peers of its pool as it
   lacks. A candidate that is free and can afford an aggregation accepts one invitation (the
   one that arrives first, a uniform random order of its invitations) and locks itself; every
   other invitation is declined (a retired candidate says so and is forgotten). A pool that runs
   out waits for the ``invite_timeout`` of its retry round; the next round asks the view members
   not asked yet, then the decliners again, at most ``max_retries`` more rounds; then the
   attempt is abandoned.

Messages are counted per sender in the world's transport (the reference's kinds and sizes) but
take no simulated time: a round trip is one tick. How it compares with the reference (tests in
``tests/sim/test_gossip_rounds.py``):

- It is a different random process, not the same one in other clothes: initiations are
  rounded to ticks, messages have no individual latencies (a tick stands for every round trip,
  0.1 s against ~0.1 s for two exponential latencies of mean 50 ms), concurrent invitations to
  one peer are ordered uniformly at random rather than by sampled latencies, and a member that
  lost its lock aborts its group at once instead of after the reference's timeouts. Rows of a
  scenario therefore differ between the two, as between two seeds.
- What holds exactly in both: the groups started have g distinct members, each free, unlocked
  by any other attempt, online and solvent when it accepted; a peer is in at most one group at a
  time; budgets are only spent at release; the curator is fixed by the members' nonces, all
  committed before any is revealed.
- What agrees statistically (tested on small P): uniform membership and curators, the number of
  aggregations, the simulated time to the last one, messages per aggregation.

Faults are not modelled here: a message is never lost and no peer goes offline, so a
scenario with ``network.loss``, ``gossip.churn`` or a crash probability is refused with
``"rounds"`` and runs the reference with ``"auto"``. Under a constant latency the groups formed
in rounds also skip the one-shot protocol's messages
(:class:`~p2pdp.sim.group_batches.GroupBatches`, the world's batched driver: the same
releases as their ``SUBMIT`` and ``PUBLISH`` messages).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from p2pdp.config import gossip_faults
from p2pdp.protocols.gossip import (
    ACCEPT,
    ACK,
    COMMITTED,
    DECLINE,
    FREE,
    GROUP,
    IN_GROUP,
    INITIATING,
    INVITE,
    LOCKED,
    RELEASE,
    RETIRED,
    REVEAL,
    START,
)
from p2pdp.sim.gossip import views as peer_sampling
from p2pdp.sim.gossip.formation import FormationDriver

if TYPE_CHECKING:
    from p2pdp.config import ScenarioConfig
    from p2pdp.sim.gossip.views import Newscast
    from p2pdp.sim.sampler import SamplerWorld

__all__ = ["ROUNDS_FROM_PEERS", "RoundFormation", "uses_rounds"]

#: ``gossip.formation = "auto"`` advances formation in rounds from this many peers on
#: (fault-free runs only). Below it the per-message reference costs little; every shipped
#: scenario runs below it, so their rows are the reference's.
ROUNDS_FROM_PEERS = 10_000

# Phases of an attempt under way, in the order it goes through them.
_INVITING, _GROUP, _START, _ACKED = range(4)
_OVER = -1  # an attempt that ended (its row is dropped later)


def uses_rounds(config: ScenarioConfig) -> bool:
    """Whether the gossip sampler of ``config`` advances formation in rounds."""
    formation = config.gossip.formation
    if formation == "auto":
        return config.partition.n_peers >= ROUNDS_FROM_PEERS and not gossip_faults(config)
    return formation == "rounds"


class _Attempts:
    """The attempts under way, as arrays (one row per attempt, in the order they began).

    ``accepted`` (A, g - 1): members in the order they accepted (-1: none yet); ``pool``
    (A, W): whom to invite, from ``position`` on; ``declined`` (A, W): who declined in this
    retry round; ``asked`` (A, W): every view member asked so far (W = the most a pool can
    hold: ``(max_retries + 1) c``). ``deadline``: the tick that ends the retry round;
    ``nonce_sum``: the revealed nonces' sum mod g.

    Each field is a view of the first rows of a buffer with room to grow, so appending does
    not copy the rows under way; an attempt that is over is marked ``_OVER`` in ``phase`` and
    its row dropped once over rows are at least half of them (a row's index stays valid until
    then; the rows under way keep their order either way).
    """

    FIELDS = (
        "id", "initiator", "phase", "n_accepted", "position", "pool_size", "n_declined",
        "n_asked", "retry", "deadline", "nonce_sum", "accepted", "pool", "declined", "asked",
    )  # fmt: skip

    id: np.ndarray
    initiator: np.ndarray
    phase: np.ndarray
    n_accepted: np.ndarray
    position: np.ndarray
    pool_size: np.ndarray
    n_declined: np.ndarray
    n_asked: np.ndarray
    retry: np.ndarray
    deadline: np.ndarray
    nonce_sum: np.ndarray
    accepted: np.ndarray
    pool: np.ndarray
    declined: np.ndarray
    asked: np.ndarray

    def __init__(self, group_size: int, width: int) -> None:
        self.width = width
        columns = {"accepted": group_size - 1, "pool": width, "declined": width, "asked": width}
        self._buffers = {
            name: np.zeros((0, *([columns[name]] if name in columns else [])), dtype=np.int64)
            for name in self.FIELDS
        }
        self._rows = 0  # rows in use, over ones included
        self._over = 0  # rows marked over, not yet dropped
        self._expose()

    def __len__(self) -> int:
        return self._rows

    def _expose(self) -> None:
        for name, buffer in self._buffers.items():
            setattr(self, name, buffer[: self._rows])

    def end(self, rows: np.ndarray) -> None:
        """Attempts ``rows`` (distinct, under way) are over; drop the over rows if they are
        at least half of them."""
        self.phase[rows] = _OVER
        self._over += int(rows.size)
        if 2 * self._over >= self._rows:
            live = self.phase != _OVER
            n = int(np.count_nonzero(live))
            for buffer in self._buffers.values():
                buffer[:n] = buffer[: self._rows][live]
            self._rows, self._over = n, 0
            self._expose()

    def extend(self, other: dict[str, np.ndarray]) -> None:
        """Append attempts given as a full set of fields."""
        n = int(other["id"].size)
        rows = self._rows + n
        if rows > self._buffers["id"].shape[0]:  # grow: twice what is needed
            for name, buffer in self._buffers.items():
                grown = np.empty((2 * rows, *buffer.shape[1:]), dtype=buffer.dtype)
                grown[: self._rows] = buffer[: self._rows]
                self._buffers[name] = grown
        for name, buffer in self._buffers.items():
            buffer[self._rows : rows] = other[name]
        self._rows = rows
        self._expose()


class RoundFormation(FormationDriver):
    """The formation protocol advanced in rounds over arrays; same interface as
    :class:`~p2pdp.sim.gossip.formation.GroupFormation` (parameters:
    :class:`~p2pdp.sim.gossip.formation.FormationDriver`). Messages are counted in
    ``world.transport``, not carried; ``rng`` also draws the pool orders and the nonces.
    ``on_formed_many(groups, curators)``: the groups formed one after the other with nothing
    in between ((k, g) members, initiators first, and (k,) curators), in one call that does
    what ``on_formed`` of each would (``on_formed`` is not called)."""

    def __init__(
        self,
        world: SamplerWorld,
        views: Newscast,
        *,
        on_formed_many: Callable[[np.ndarray, np.ndarray], None],
        **driver: Any,
    ) -> None:
        super().__init__(world, views, **driver)
        self._on_formed_many = on_formed_many
        # counts and appends in compiled code where the view exchanges load it anyway
        compiled_from = peer_sampling.COMPILED_FROM * peer_sampling.TICKS_PER_PERIOD
        self._compiled = world.online.size >= compiled_from
        self.newscast = views
        width = (self.params.max_retries + 1) * self.params.view_size
        self._attempts = _Attempts(self.group_size, width)
        self._tick_index = 0
        self._round_ticks = 0  # ticks per retry round, set at the first tick

    # -- the driver's call -------------------------------------------------------------------
    def advance(self, tick: float) -> None:
        """One tick of ``tick`` seconds: every attempt under way advances by one round trip,
        and the initiations due before the next tick begin (with their first wave)."""
        if not self._round_ticks:
            self._round_ticks = max(1, math.ceil(self.params.invite_timeout / tick - 1e-9))
        attempts = self._attempts
        self._start_acked(np.flatnonzero(attempts.phase == _ACKED))
        self._commit(np.flatnonzero(attempts.phase == _START))
        self._reveal(np.flatnonzero(attempts.phase == _GROUP))
        self._initiate_due(self.clock() + tick)
        self._invite_wave()
        self._tick_index += 1

    # -- counting ----------------------------------------------------------------------------
    def _count(self, kind: str, senders: np.ndarray) -> None:
        """Messages of ``kind`` sent by ``senders`` (one per entry; ids may repeat)."""
        transport = self.world.transport
        if self._compiled:
            from p2pdp.sim.gossip import compiled

            compiled.count_sent(
                transport.messages_sent, transport.bytes_sent, senders, self._bytes[kind]
            )
        else:
            np.add.at(transport.messages_sent, senders, 1)
            np.add.at(transport.bytes_sent, senders, self._bytes[kind])
        self.formation_messages += int(senders.size)

    def _members_tied(self, rows: np.ndarray, *states: int) -> np.ndarray:
        """(k,) bool: every accepted member of attempts ``rows`` is bound to it in ``states``."""
        attempts = self._attempts
        members = attempts.accepted[rows]
        tied = (self.bound[members] == attempts.id[rows, None]) & np.isin(
            self.state[members], states
        )
        return tied.all(axis=1)

    # -- the phases after the invitations ----------------------------------------------------
    def _start_acked(self, rows: np.ndarray) -> None:
        """Every ``ACK`` is in: start the group, or abandon it if a member is not bound."""
        if not rows.size:
            return
        attempts = self._attempts
        initiators = attempts.initiator[rows]
        ok = self._members_tied(rows, COMMITTED) & self.online[initiators] & (not self.stopped)
        ok &= (self.state[initiators] == INITIATING) & (self.bound[initiators] == attempts.id[rows])
        # the groups that start, all at once: their peers are bound to them alone, so no
        # abandoned attempt below reads or frees them
        groups = np.concatenate([initiators[ok, None], attempts.accepted[rows[ok]]], axis=1)
        chosen = attempts.nonce_sum[rows[ok]] % self.group_size
        curators = groups[np.arange(groups.shape[0]), chosen]
        self.state[groups] = IN_GROUP
        self.bound[groups] = -1
        self.lock_until[groups] = np.inf
        # in row order: the abandons' draws and the world's events keep theirs; the groups
        # between two abandons go to the sampler in one call
        started = 0
        for k, position in enumerate(np.flatnonzero(~ok).tolist()):
            if position - k > started:  # position - k groups start before this abandon
                end = position - k
                self._on_formed_many(groups[started:end], curators[started:end])
                started = end
            self._abandon_row(int(rows[position]))
        if started < groups.shape[0]:
            self._on_formed_many(groups[started:], curators[started:])
        self._finish(rows)

    def _commit(self, rows: np.ndarray) -> None:
        """``START`` to the members, ``ACK`` back: they commit to submit."""
        if not rows.size:
            return
        attempts = self._attempts
        ok = self._members_tied(rows, LOCKED)
        committing = rows[ok]
        members = attempts.accepted[committing].ravel()
        self._count(START, np.repeat(attempts.initiator[committing], self.group_size - 1))
        self._count(ACK, members)
        self.state[members] = COMMITTED
        self.lock_until[members] = self.clock() + self.params.lock_timeout + self.collect_timeout
        attempts.phase[committing] = _ACKED
        self._abandon_rows(rows[~ok])  # last: it drops rows

    def _reveal(self, rows: np.ndarray) -> None:
        """``GROUP`` (member list and commitments) to the members, ``REVEAL`` back."""
        if not rows.size:
            return
        attempts = self._attempts
        ok = self._members_tied(rows, LOCKED)
        revealing = rows[ok]
        members = attempts.accepted[revealing].ravel()
        self._count(GROUP, np.repeat(attempts.initiator[revealing], self.group_size - 1))
        self._count(REVEAL, members)
        self.lock_until[members] = self.clock() + self.params.lock_timeout
        nonces = self.rng.integers(0, 2**53, size=revealing.size) % self.group_size  # initiator
        attempts.nonce_sum[revealing] = (attempts.nonce_sum[revealing] + nonces) % self.group_size
        attempts.phase[revealing] = _START
        self._abandon_rows(rows[~ok])  # last: it drops rows

    # -- ending attempts ---------------------------------------------------------------------
    def _abandon_rows(self, rows: np.ndarray) -> None:
        for row in rows.tolist():
            self._abandon_row(row)
        self._finish(rows)

    def _abandon_row(self, row: int) -> None:
        """The group did not form: ``RELEASE`` its members (nobody is charged)."""
        attempts = self._attempts
        self.attempts_failed += 1
        initiator, attempt_id = int(attempts.initiator[row]), int(attempts.id[row])
        members = attempts.accepted[row, : attempts.n_accepted[row]]
        self._count(RELEASE, np.full(members.size, initiator))
        for member in members[self.bound[members] == attempt_id].tolist():
            self.become_free(member)
        self._failed(initiator)
        if self.state[initiator] == INITIATING and self.bound[initiator] == attempt_id:
            self.become_free(initiator)

    def _finish(self, rows: np.ndarray) -> None:
        """Attempts ``rows`` are over: drop them, tell the observer once (what it reads of
        attempts is how many are in flight, and only whether none is: the same as once per
        attempt, the count falling one at a time)."""
        if not rows.size:
            return
        self._attempts.end(rows)
        self.attempts_in_flight -= int(rows.size)
        self._on_attempt_over()

    # -- the invitations ---------------------------------------------------------------------
    def _initiate_due(self, horizon: float) -> None:
        """The free, online peers due to initiate before ``horizon`` start attempts."""
        due = np.flatnonzero(self.initiate_at < horizon)
        if not due.size:
            return
        due = due[np.argsort(self.initiate_at[due], kind="stable")]
        self.initiate_at[due] = np.inf
        if self.stopped:
            return
        due = due[(self.state[due] == FREE) & self.online[due]]
        n = due.size
        if not n:
            return
        ids = np.arange(self._next_attempt, self._next_attempt + n, dtype=np.int64)
        self._next_attempt += n
        self.attempts_started += n
        self.attempts_in_flight += n
        self.state[due] = INITIATING
        self.bound[due] = ids
        width, g = self._attempts.width, self.group_size
        views = self.newscast.ids[due].astype(np.int64)
        order = np.argsort(np.where(views >= 0, self.rng.random(views.shape), 2.0), axis=1)
        pool = np.full((n, width), -1, dtype=np.int64)
        pool[:, : views.shape[1]] = np.take_along_axis(views, order, axis=1)
        sizes = np.count_nonzero(views >= 0, axis=1)
        zeros = np.zeros(n, dtype=np.int64)
        self._attempts.extend(
            {
                "id": ids,
                "initiator": due.astype(np.int64),
                "phase": np.full(n, _INVITING, dtype=np.int64),
                "n_accepted": zeros,
                "position": zeros,
                "pool_size": sizes,
                "n_declined": zeros,
                "n_asked": sizes,
                "retry": zeros,
                "deadline": np.full(n, self._tick_index + self._round_ticks, dtype=np.int64),
                "nonce_sum": zeros,
                "accepted": np.full((n, g - 1), -1, dtype=np.int64),
                "pool": pool,
                "declined": np.full((n, width), -1, dtype=np.int64),
                "asked": pool.copy(),
            }
        )

    def _next_rounds(self, rows: np.ndarray) -> None:
        """Start the next retry round of attempts ``rows`` (each has one left): the view
        members not asked yet, in a random order, then the decliners of the last round."""
        attempts, width = self._attempts, self._attempts.width
        views = self.newscast.ids[attempts.initiator[rows]].astype(np.int64)
        asked = attempts.asked[rows]
        fresh = (views >= 0) & ~(views[:, :, None] == asked[:, None, :]).any(axis=2)
        order = np.argsort(np.where(fresh, self.rng.random(views.shape), 2.0), axis=1)
        fresh_first = np.where(
            np.take_along_axis(fresh, order, 1), np.take_along_axis(views, order, 1), -1
        )
        pool = np.concatenate([fresh_first, attempts.declined[rows]], axis=1)
        attempts.pool[rows] = _packed(pool, width)  # at most (retry + 1) c peers each
        attempts.asked[rows] = _packed(np.concatenate([asked, fresh_first], axis=1), width)
        attempts.pool_size[rows] = np.count_nonzero(attempts.pool[rows] >= 0, axis=1)
        attempts.n_asked[rows] += np.count_nonzero(fresh, axis=1)
        attempts.position[rows] = 0
        attempts.declined[rows], attempts.n_declined[rows] = -1, 0
        attempts.retry[rows] += 1
        attempts.deadline[rows] = self._tick_index + self._round_ticks

    def _invite_wave(self) -> None:
        """Every inviting attempt asks the peers it lacks; candidates accept one each."""
        attempts = self._attempts
        inviting = np.flatnonzero(attempts.phase == _INVITING)
        # retry rounds whose timeout has come; abandon the attempts with none left
        late = inviting[attempts.deadline[inviting] <= self._tick_index]
        over = attempts.retry[late] >= self.params.max_retries
        self._next_rounds(late[~over])
        if over.any():
            self._abandon_rows(late[over])
            attempts = self._attempts
            inviting = np.flatnonzero(attempts.phase == _INVITING)
        need = self.group_size - 1 - attempts.n_accepted[inviting]
        asks = np.minimum(need, attempts.pool_size[inviting] - attempts.position[inviting])
        slots = np.arange(self.group_size - 1)
        rows_2d = np.broadcast_to(inviting[:, None], (inviting.size, slots.size))
        columns = attempts.position[inviting, None] + slots
        chosen = slots < asks[:, None]
        rows, candidates = rows_2d[chosen], attempts.pool[rows_2d[chosen], columns[chosen]]
        attempts.position[inviting] += asks
        if rows.size:
            self._invitations(rows, candidates)
        complete = inviting[attempts.n_accepted[inviting] == self.group_size - 1]
        attempts.phase[complete] = _GROUP  # (a group of one is complete at once)

    def _invitations(self, rows: np.ndarray, candidates: np.ndarray) -> None:
        """Attempts ``rows`` invite ``candidates`` (one each); candidates accept one each."""
        attempts = self._attempts
        initiators = attempts.initiator[rows]
        self._count(INVITE, initiators)
        # candidates: free, online and solvent ones accept the first invitation to arrive
        arrival = self.rng.random(rows.size)
        free = (self.state[candidates] == FREE) & self.online[candidates]
        free[free] = self.can_afford(candidates[free])
        eligible = np.flatnonzero(free)
        by_candidate = eligible[np.lexsort((arrival[eligible], candidates[eligible]))]
        first = np.ones(by_candidate.size, dtype=bool)
        first[1:] = candidates[by_candidate[1:]] != candidates[by_candidate[:-1]]
        accepted = np.zeros(rows.size, dtype=bool)
        accepted[by_candidate[first]] = True
        winners = np.flatnonzero(accepted)
        losers = np.flatnonzero(~accepted)
        self._count(ACCEPT, candidates[winners])
        self._count(DECLINE, candidates[losers])
        # the winners lock themselves to their attempt and commit to a nonce
        members, to_rows = candidates[winners], rows[winners]
        self.state[members] = LOCKED
        self.bound[members] = attempts.id[to_rows]
        self.lock_until[members] = self.clock() + self.params.lock_timeout
        nonces = self.rng.integers(0, 2**53, size=winners.size) % self.group_size
        np.add.at(attempts.nonce_sum, to_rows, nonces)
        attempts.nonce_sum[to_rows] %= self.group_size
        self._append(attempts.accepted, attempts.n_accepted, to_rows, members, arrival[winners])
        # decliners: retired ones are forgotten, the others asked again next round
        retired = self.state[candidates[losers]] == RETIRED
        self.newscast.forget_all(initiators[losers[retired]], candidates[losers[retired]])
        busy = losers[~retired]
        self._append(attempts.declined, attempts.n_declined, rows[busy], candidates[busy], None)

    def _append(
        self,
        table: np.ndarray,
        counts: np.ndarray,
        rows: np.ndarray,
        values: np.ndarray,
        order: np.ndarray | None,
    ) -> None:
        """Append ``values`` to rows ``rows`` of ``table`` after its ``counts`` used slots,
        in the order of ``order`` within a row (None: as given)."""
        if not rows.size:
            return
        if self._compiled:  # rows come grouped (ascending): then one pass, compiled
            from p2pdp.sim.gossip import compiled

            ranks = np.zeros(rows.size) if order is None else order
            if compiled.append_rows(table, counts, rows, values, ranks):
                return
        sort = np.lexsort((order, rows)) if order is not None else np.argsort(rows, kind="stable")
        rows, values = rows[sort], values[sort]
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        rank = np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size]))
        table[rows, counts[rows] + rank] = values
        np.add.at(counts, rows, 1)


def _packed(table: np.ndarray, width: int) -> np.ndarray:
    """Each row's entries >= 0 first, in their order, then -1: (n, width) (no row of
    ``table`` holds more than ``width`` entries >= 0)."""
    order = np.argsort(table < 0, axis=1, kind="stable")
    return np.take_along_axis(table, order, axis=1)[:, :width]
