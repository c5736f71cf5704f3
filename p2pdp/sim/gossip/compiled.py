"""The Newscast exchanges of one tick, one after the other, compiled (numba).

:meth:`p2pdp.sim.gossip.views.Newscast.exchange` applies a tick's exchanges in order; in numpy
it merges batches of exchanges that share no peer, at 2-4 us of CPU an exchange in numpy's
gathers, comparisons and sorts (10,000 exchanges a tick, 4.1 million in a run at 10^5 peers).
This module applies them one by one in compiled code instead, at under 1 us an exchange
(measured on the 2-core machine: about a quarter of numpy's time), to the same views: both
are the sequential merge of :meth:`~p2pdp.sim.gossip.views.Newscast._merge_one`. Each side is
put freshest first (a view already is, after its first merge, so the insertion moves little),
the two sides are merged freshest first keeping each peer's first (freshest) copy, and each
owner keeps the first ``c`` entries but itself. It draws nothing and does no arithmetic on
the stamps (it only compares them), so the views it leaves are the numpy path's, entry for
entry (``tests/sim/test_gossip.py``).

This module (hence numba) is imported, and the kernel compiled or loaded from numba's disk
cache, at the first tick of :data:`~p2pdp.sim.gossip.views.COMPILED_FROM` exchanges or more,
so smaller runs pay nothing for it.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["exchange_in_order"]


@numba.njit(cache=True, nogil=True)
def _run(ids, stamps, owner, fresh, peer, stamp):  # pragma: no cover
    """One side (a view and its owner's fresh descriptor) freshest first; its length."""
    n = 0
    for j in range(ids.shape[1] + 1):
        p = owner if j == 0 else ids[owner, j - 1]
        s = fresh if j == 0 else stamps[owner, j - 1]
        if p < 0 or s == -np.inf:
            continue
        i = n  # insertion: a view is freshest first after its first merge, so few moves
        while i > 0 and (stamp[i - 1] < s or (stamp[i - 1] == s and peer[i - 1] < p)):
            peer[i], stamp[i] = peer[i - 1], stamp[i - 1]
            i -= 1
        peer[i], stamp[i] = p, s
        n += 1
    return n


@numba.njit(cache=True, nogil=True)
def _merge_in_order(ids, stamps, a, b, stamp_a, stamp_b, both, seen):  # pragma: no cover
    c = ids.shape[1]
    peer_a, stamp_a_ = np.empty(c + 1, np.int64), np.empty(c + 1, np.float64)
    peer_b, stamp_b_ = np.empty(c + 1, np.int64), np.empty(c + 1, np.float64)
    peer, stamp = np.empty(2 * c + 2, np.int64), np.empty(2 * c + 2, np.float64)
    for k in range(a.size):
        na = _run(ids, stamps, a[k], stamp_a[k], peer_a, stamp_a_)
        nb = _run(ids, stamps, b[k], stamp_b[k], peer_b, stamp_b_)
        # merge the two runs freshest first; a peer's first copy is its freshest
        n = i = j = 0
        while i < na or j < nb:
            take_a = j == nb or (
                i < na
                and (
                    stamp_a_[i] > stamp_b_[j]
                    or (stamp_a_[i] == stamp_b_[j] and peer_a[i] > peer_b[j])
                )
            )
            if take_a:
                p, s = peer_a[i], stamp_a_[i]
                i += 1
            else:
                p, s = peer_b[j], stamp_b_[j]
                j += 1
            if not seen[p]:
                seen[p] = True
                peer[n], stamp[n] = p, s
                n += 1
        for m in range(n):
            seen[peer[m]] = False
        for side in range(2):
            if side == 1 and not both[k]:
                break
            owner = b[k] if side == 0 else a[k]
            kept = 0
            for m in range(n):
                if kept == c:
                    break
                if peer[m] != owner:
                    ids[owner, kept], stamps[owner, kept] = peer[m], stamp[m]
                    kept += 1
            for m in range(kept, c):
                ids[owner, m], stamps[owner, m] = -1, -np.inf


def exchange_in_order(
    ids: np.ndarray,
    stamps: np.ndarray,
    initiators: np.ndarray,
    partners: np.ndarray,
    initiator_stamps: np.ndarray,
    partner_stamps: np.ndarray,
    reply_delivered: np.ndarray,
) -> None:
    """Apply the exchanges ``initiators[k] <-> partners[k]`` in the order k = 0, 1, ... to the
    views ``ids`` (P, c) int32 and ``stamps`` (P, c) float64, in place.

    Each side keeps the ``c`` freshest distinct entries of the two views and the two fresh
    descriptors (a stamp of -inf is not merged), never itself; the partner always merges, the
    initiator only where ``reply_delivered``. Finite stamps are distinct (continuous draws); a
    tie would be broken by the larger id first, as :meth:`Newscast._merge_one` does.
    """
    seen = np.zeros(ids.shape[0], dtype=np.bool_)  # scratch: peers already in the union
    _merge_in_order(
        ids,
        stamps,
        initiators.astype(np.int64, copy=False),
        partners.astype(np.int64, copy=False),
        initiator_stamps.astype(np.float64, copy=False),
        partner_stamps.astype(np.float64, copy=False),
        reply_delivered.astype(np.bool_, copy=False),
        seen,
    )
