"""Peer sampling for gossip group formation: Newscast views and their vectorised exchange.

Peer sampling (Newscast, Jelasity et al. 2003/2007)
    Views start as c random overlay neighbours (:mod:`p2pdp.sim.overlay`). Every
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
    tick serves lock expiry and churn (the clock of
    :class:`~p2pdp.sim.gossip.sampler.GossipSampler`); initiations keep their exact
    (continuous) times.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from p2pdp.protocols.groups import HEADER_BYTES
from p2pdp.sim.overlay import Overlay

if TYPE_CHECKING:
    from p2pdp.protocols.settings import GossipConfig
    from p2pdp.sim.sampler import SamplerWorld

__all__ = [
    "ID_BYTES",
    "STAMP_BYTES",
    "TICKS_PER_PERIOD",
    "Newscast",
    "PeerSampling",
    "bootstrap_views",
    "merge_views",
]

#: Ticks per gossip period: the resolution of the peers' gossip phases, of lock expiry and
#: of churn (initiations keep their exact times).
TICKS_PER_PERIOD = 10
#: :meth:`Newscast.exchange` merges a batch of exchanges sharing no peer in numpy from this
#: many on, and the rest one by one in Python.
_BATCH_FROM = 16
#: :meth:`Newscast.exchange` applies a call of at least this many exchanges one after the other
#: in compiled code (:mod:`p2pdp.sim.gossip.compiled`, the same views), fewer in numpy: the
#: compiled kernel's first use in a process costs numba's import (~0.5 s) and the kernel's
#: compilation (~1.4 s; ~0.3 s once numba's disk cache holds it), which only ticks of ~10^4
#: exchanges (10^5 peers: 4.1 million exchanges in a run) repay.
COMPILED_FROM = 2_000
#: Wire sizes (bytes) of a view entry: peer id, timestamp.
ID_BYTES, STAMP_BYTES = 4, 8


def merge_views(
    ids: np.ndarray, stamps: np.ndarray, owners: np.ndarray, view_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Newscast merge: per row, the ``view_size`` freshest distinct entries, owner excluded.

    The general form (any rows, repeats anywhere); :meth:`Newscast.exchange` merges two views
    faster with what it knows of them, to the same result.

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
    draws = rng.random(rows.size)
    if rows.size and np.all(degrees == degrees[0]):  # a regular overlay: rows of one length
        within = np.argsort(draws.reshape(n_peers, -1), axis=1, kind="stable")
        order = (within + overlay.indptr[:-1, None]).ravel()  # lexsort's order, sooner
    else:
        order = np.lexsort((draws, rows))  # rows kept in place, shuffled within
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

    def forget_all(self, peers: np.ndarray, others: np.ndarray) -> None:
        """:meth:`forget` ``others[k]`` from ``peers[k]``'s view for every k at once (pairs
        may share a peer; the result is that of the calls one after the other). From
        ``COMPILED_FROM * TICKS_PER_PERIOD`` peers on (where a tick's exchanges load the
        compiled code anyway), one after the other in compiled code."""
        if not peers.size:
            return
        if self.ids.shape[0] >= COMPILED_FROM * TICKS_PER_PERIOD:
            from p2pdp.sim.gossip import compiled

            compiled.forget_all(self.ids, self.stamps, peers, others)
            return
        rows, inverse = np.unique(peers, return_inverse=True)
        hits = self.ids[peers] == others[:, None]  # (k, c): where each pair's entry sits
        drop = np.zeros((rows.size, self.view_size), dtype=bool)
        np.logical_or.at(drop, inverse, hits)
        order = np.argsort(drop, axis=1, kind="stable")  # kept entries first, in order
        ids = np.take_along_axis(self.ids[rows], order, 1)
        stamps = np.take_along_axis(self.stamps[rows], order, 1)
        dropped = np.take_along_axis(drop, order, 1)
        ids[dropped], stamps[dropped] = -1, -np.inf
        self.ids[rows], self.stamps[rows] = ids, stamps

    def partners(self, peers: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
        """A uniformly random view member per peer, (n,) int; -1 for an empty view. From
        :data:`COMPILED_FROM` peers on, in compiled code (the same partners)."""
        uniforms = rng.random(peers.size)
        if peers.size >= COMPILED_FROM:
            from p2pdp.sim.gossip.compiled import partners_of

            return partners_of(self.ids, peers, uniforms)
        counts = np.count_nonzero(self.ids[peers] >= 0, axis=1)
        slot = np.minimum((uniforms * counts).astype(np.int64), self.view_size - 1)
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
        share no peer are merged at once, which gives the sequential result; once a batch
        would hold fewer than ``_BATCH_FROM`` exchanges (the chains of popular partners), the
        rest are merged one after the other in Python (:meth:`_merge_one`, the same result:
        each of numpy's calls costs more than merging one exchange). From
        :data:`COMPILED_FROM` exchanges on, all are merged one after the other in compiled
        code instead (:func:`~p2pdp.sim.gossip.compiled.exchange_in_order`, the same views).
        """
        if initiators.size >= COMPILED_FROM:
            from p2pdp.sim.gossip.compiled import exchange_in_order

            exchange_in_order(
                self.ids,
                self.stamps,
                initiators,
                partners,
                initiator_stamps,
                partner_stamps,
                reply_delivered,
            )
            return
        first = self._first
        todo = np.arange(initiators.size)
        while todo.size:
            a, b = initiators[todo], partners[todo]
            k = np.arange(todo.size)
            nodes = np.concatenate([a, b])
            first[nodes] = todo.size
            np.minimum.at(first, nodes, np.concatenate([k, k]))
            batch = (first[a] == k) & (first[b] == k)  # each peer's earliest exchange
            if np.count_nonzero(batch) < _BATCH_FROM:
                break
            self._merge(
                a[batch],
                b[batch],
                initiator_stamps[todo[batch]],
                partner_stamps[todo[batch]],
                reply_delivered[todo[batch]],
            )
            todo = todo[~batch]
        for a_k, b_k, stamp_a, stamp_b, both in zip(
            initiators[todo].tolist(),
            partners[todo].tolist(),
            initiator_stamps[todo].tolist(),
            partner_stamps[todo].tolist(),
            reply_delivered[todo].tolist(),
            strict=True,
        ):
            self._merge_one(a_k, b_k, stamp_a, stamp_b, both)

    def _merge_one(self, a: int, b: int, stamp_a: float, stamp_b: float, both: bool) -> None:
        """:meth:`_merge` of the one exchange ``a <-> b``, in Python: every id of the two
        views and the two fresh descriptors at its freshest stamp, those with a finite stamp
        freshest first (finite stamps are distinct), each owner's first ``c`` but itself."""
        ids, stamps, c = self.ids, self.stamps, self.view_size
        fresh: dict[int, float] = {}
        for peer, stamp in zip(
            [*ids[a].tolist(), a, *ids[b].tolist(), b],
            [*stamps[a].tolist(), stamp_a, *stamps[b].tolist(), stamp_b],
            strict=True,
        ):
            if peer >= 0 and stamp > fresh.get(peer, -math.inf):
                fresh[peer] = stamp
        union = sorted(
            ((stamp, peer) for peer, stamp in fresh.items() if stamp > -math.inf), reverse=True
        )
        for owner in (b, a) if both else (b,):
            kept = [entry for entry in union if entry[1] != owner][:c]
            kept += [(-math.inf, -1)] * (c - len(kept))
            stamps[owner] = [stamp for stamp, _ in kept]
            ids[owner] = [peer for _, peer in kept]

    def _merge(
        self,
        a: np.ndarray,
        b: np.ndarray,
        stamp_a: np.ndarray,
        stamp_b: np.ndarray,
        both: np.ndarray,
    ) -> None:
        """:func:`merge_views` of the exchanges ``a[k] <-> b[k]`` (no peer twice), for ``b``
        and, where ``both``, for ``a``; same result, faster.

        What it uses: a view holds distinct ids and never its owner, so each side (view plus
        the fresh descriptor of its owner, (n, c + 1)) is distinct and a repeat pairs an entry
        of one side with one of the other (an (n, c + 1, c + 1) comparison instead of sorting
        by id); the union, sorted freshest first, serves both owners (each drops itself: at
        most one entry); two ids never share a finite stamp (continuous draws), so the order,
        hence the result, is unique.
        """
        c = self.view_size
        ids_a = np.concatenate([self.ids[a], a[:, None]], axis=1, dtype=np.int32)
        ids_b = np.concatenate([self.ids[b], b[:, None]], axis=1, dtype=np.int32)
        stamps_a = np.concatenate([self.stamps[a], stamp_a[:, None]], axis=1)
        stamps_b = np.concatenate([self.stamps[b], stamp_b[:, None]], axis=1)
        # the staler copy of a repeated id (a's, on a tie); empty slots never match
        same = ids_a[:, :, None] == np.where(ids_b < 0, -2, ids_b)[:, None, :]
        match = same.argmax(axis=2)  # the b-side slot of a's entry, where repeated
        pair = np.arange(a.size)[:, None]  # (fancy indices: cheaper than take_along_axis)
        repeated = same[pair, np.arange(c + 1), match]  # b's side holds an id at most once
        b_stamp = stamps_b[pair, match]
        stale_a = repeated & (b_stamp > stamps_a)
        stale_b = np.zeros_like(repeated)
        row, column = np.nonzero(repeated & ~stale_a)
        stale_b[row, match[row, column]] = True
        stale = np.concatenate([stale_a, stale_b], axis=1)
        ids = np.concatenate([ids_a, ids_b], axis=1)
        stamps = np.concatenate([stamps_a, stamps_b], axis=1)
        stale |= (ids < 0) | (stamps == -np.inf)
        stamps[stale], ids[stale] = -np.inf, -1
        top = np.argsort(-stamps, axis=1)[:, : c + 1]
        ids, stamps = ids[pair, top], stamps[pair, top]
        for owners, rows in ((b, slice(None)), (a[both], both)):
            own = ids[rows] == owners[:, None]
            drop = np.where(own.any(axis=1), own.argmax(axis=1), c)  # itself, or the last
            keep = np.arange(c + 1) != drop[:, None]
            self.ids[owners] = ids[rows][keep].reshape(-1, c)
            self.stamps[owners] = stamps[rows][keep].reshape(-1, c)


class PeerSampling:
    """The Newscast service over the world's transport: views, gossip phases, exchange rounds.

    Parameters
    ----------
    world : SamplerWorld
        Reads ``world.env``, ``world.online`` and ``world.config.network.loss``; counts the
        view messages per sender in ``world.transport``.
    overlay : Overlay
        Bootstraps the views.
    params : GossipConfig
        ``view_size`` (c).
    rng : numpy.random.Generator
        The protocol stream: first views, phases, partners, losses, timestamp jitter.

    Attributes
    ----------
    views : Newscast
        Every peer's view.
    phase : (P,) int array
        Each peer's tick within a gossip period, in ``[0, TICKS_PER_PERIOD)``.
    gossip_messages : int
        View messages sent (requests and replies; also counted in ``world.transport``).
    message_bytes : int
        Size of one view message: header, c entries and the sender's own descriptor.
    """

    def __init__(
        self,
        world: SamplerWorld,
        overlay: Overlay,
        params: GossipConfig,
        *,
        rng: np.random.Generator,
    ) -> None:
        self.world = world
        self.rng = rng
        self.views = Newscast(overlay, params.view_size, rng=rng)
        self.phase = rng.integers(TICKS_PER_PERIOD, size=overlay.n_peers)
        order = np.argsort(self.phase, kind="stable")
        counts = np.bincount(self.phase, minlength=TICKS_PER_PERIOD)
        self._by_phase = np.split(order, np.cumsum(counts))
        self.gossip_messages = 0
        self.message_bytes = HEADER_BYTES + (params.view_size + 1) * (ID_BYTES + STAMP_BYTES)

    def due(self, tick_index: int) -> np.ndarray:
        """The peers whose phase is tick ``tick_index`` of its period, (n,) int, ascending."""
        return self._by_phase[tick_index % TICKS_PER_PERIOD]

    def exchange_round(
        self,
        peers: np.ndarray,
        *,
        tick: float,
        silent: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        """One tick: every online peer of ``peers`` exchanges views with a view member.

        Parameters
        ----------
        peers : (n,) int array
            The peers due at this tick (:meth:`due`); offline ones skip their turn.
        tick : float
            Length of a tick in seconds; fresh descriptors are stamped uniformly within it.
        silent : callable
            Maps (k,) peer ids to a (k,) bool mask of the peers that no longer advertise
            themselves (they cannot afford another aggregation): their descriptors carry
            the stamp -inf and are not merged.
        """
        world, rng, now = self.world, self.rng, self.world.env.now
        peers = rng.permutation(peers[world.online[peers]])
        partners = self.views.partners(peers, rng=rng)
        initiators, partners = peers[partners >= 0], partners[partners >= 0]
        transport, loss = world.transport, world.config.network.loss
        delivered = world.online[partners] & (rng.random(initiators.size) >= loss)
        a, b = initiators[delivered], partners[delivered]
        reply_delivered = rng.random(a.size) >= loss
        if initiators.size >= COMPILED_FROM:  # where the exchanges are compiled: one pass
            from p2pdp.sim.gossip.compiled import count_sent

            for senders in (initiators, b):
                count_sent(
                    transport.messages_sent, transport.bytes_sent, senders, self.message_bytes
                )
        else:
            transport.messages_sent[initiators] += 1  # initiators are distinct
            transport.bytes_sent[initiators] += self.message_bytes
            np.add.at(transport.messages_sent, b, 1)
            np.add.at(transport.bytes_sent, b, self.message_bytes)
        transport.lose(np.concatenate([initiators[~delivered], b[~reply_delivered]]))
        self.gossip_messages += initiators.size + a.size
        stamps = now + rng.random((2, a.size)) * tick  # jitter within the tick
        stamps[0, silent(a)] = -np.inf  # retired peers do not advertise
        stamps[1, silent(b)] = -np.inf
        self.views.exchange(a, b, stamps[0], stamps[1], reply_delivered)
