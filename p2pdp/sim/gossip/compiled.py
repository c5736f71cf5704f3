"""The gossip sampler's per-element loops at large P, compiled (numba): the Newscast
exchanges of one tick one after the other, the partners they pick, and the formation in
rounds' forgets, message counts and table appends.

:meth:`p2pdp.sim.gossip.views.Newscast.exchange` applies a tick's exchanges in order; in numpy
it merges batches of exchanges that share no peer, at 2-4 us of CPU an exchange in numpy's
gathers, comparisons and sorts (10,000 exchanges a tick, 4.1 million in a run at 10^5 peers).
This module applies them one by one in compiled code instead, at about 0.3 us of CPU an
exchange (measured at 10^5 peers on the 2-core machine, on a run's own views), to the same
views: both are the sequential merge of :meth:`~p2pdp.sim.gossip.views.Newscast._merge_one`.
Each side is put freshest first (a view already is, after its first merge, so the insertion
moves little), the two sides are merged freshest first keeping each peer's first (freshest)
copy until ``c + 1`` distinct entries are in (each owner keeps the first ``c`` but itself:
at most one of them is the owner). It draws nothing and does no arithmetic on the stamps (it
only compares them), so the views it leaves are the numpy path's, entry for entry
(``tests/sim/test_gossip.py``).

Where the time goes. At 10^5 peers the views (P x c ids and stamps, 24 MB at c = 20) are
larger than the caches and a tick's exchanges touch random rows: the merge used to wait for
about ten cache lines an exchange (0.78 us an exchange, 0.45 us of it with views in cache).
The kernel now asks for the rows of the exchange ``_AHEAD`` places ahead while it merges the
current one (LLVM's ``prefetch`` hint: it reads or writes nothing, so the views are the same
whatever it does), and merges without branching on the data (a side that runs out ends in a
sentinel that every entry beats).

The other kernels do what their numpy forms do, element for element, in one pass:
:func:`partners_of` (the same uniforms, the same float64 product truncated), and for the
formation in rounds :func:`forget_all` (the forgets one after the other), :func:`count_sent`
(``np.add.at`` of the counters) and :func:`append_rows` (the same stable order per row).

This module (hence numba) is imported, and the kernels compiled or loaded from numba's disk
cache, at the first tick of :data:`~p2pdp.sim.gossip.views.COMPILED_FROM` exchanges or more,
and by the formation in rounds from ``COMPILED_FROM * TICKS_PER_PERIOD`` peers on (where
the ticks' exchanges load it anyway), so smaller runs pay nothing for it.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["append_rows", "count_sent", "exchange_in_order", "forget_all", "partners_of"]

#: The kernel asks for the views of the exchange this many places ahead while it
#: merges the current one: a tick's exchanges touch random rows of (P, c) arrays far larger
#: than the caches at 10^5 peers, and the merge no longer waits for them (measured at 10^5
#: peers on the 2-core machine: 0.3 us of CPU an exchange against 0.78 us without).
_AHEAD = 4


@intrinsic
def _prefetch(typingctx, array, index):  # pragma: no cover
    """A hint that ``array.ravel()[index]`` will be read soon (LLVM's ``prefetch``: read,
    kept in every cache level); reads and writes nothing (an index out of range is
    harmless, but the kernel stays in range)."""
    signature = types.void(array, types.intp)

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        byte = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]),
            "llvm.prefetch.p0i8",
        )
        address = builder.bitcast(builder.gep(data, [args[1]]), byte)
        builder.call(function, [address, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return signature, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _prefetch_span(flat, start, length, per_line):  # pragma: no cover
    """Ask for ``flat[start : start + length]`` (``per_line`` elements a cache line)."""
    for offset in range(0, length, per_line):
        _prefetch(flat, start + offset)
    _prefetch(flat, start + length - 1)


@numba.njit(cache=True, nogil=True, inline="always")
def _prefetch_row(flat_ids, flat_stamps, owner, c):  # pragma: no cover
    """Ask for row ``owner`` of the views (flat, rows of ``c``): each of its cache lines."""
    _prefetch_span(flat_ids, owner * c, c, 16)  # int32: 16 a line
    _prefetch_span(flat_stamps, owner * c, c, 8)  # float64: 8 a line


@numba.njit(cache=True, nogil=True, inline="always")
def _run(ids, stamps, owner, fresh, peer, stamp):  # pragma: no cover
    """One side (a view and its owner's fresh descriptor) freshest first, then a sentinel
    (-1, -inf); its length."""
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
    peer[n], stamp[n] = -1, -np.inf  # below every entry: the other side's are taken first
    return n


@numba.njit(cache=True, nogil=True)
def _merge_in_order(ids, stamps, a, b, stamp_a, stamp_b, both, seen):  # pragma: no cover
    c = ids.shape[1]
    flat_ids, flat_stamps = ids.reshape(-1), stamps.reshape(-1)
    peer_a, stamp_a_ = np.empty(c + 2, np.int64), np.empty(c + 2, np.float64)
    peer_b, stamp_b_ = np.empty(c + 2, np.int64), np.empty(c + 2, np.float64)
    peer, stamp = np.empty(2 * c + 2, np.int64), np.empty(2 * c + 2, np.float64)
    for k in range(a.size):
        if k + _AHEAD < a.size:
            _prefetch_row(flat_ids, flat_stamps, a[k + _AHEAD], c)
            _prefetch_row(flat_ids, flat_stamps, b[k + _AHEAD], c)
        na = _run(ids, stamps, a[k], stamp_a[k], peer_a, stamp_a_)
        nb = _run(ids, stamps, b[k], stamp_b[k], peer_b, stamp_b_)
        # merge the two runs freshest first; a peer's first copy is its freshest. Each owner
        # keeps the first c entries but itself, so the first c + 1 distinct ones serve both.
        # (Without branches on the data: the sentinels stand for an exhausted side.)
        n = i = j = 0
        for _ in range(na + nb):
            sa, sb, pa, pb = stamp_a_[i], stamp_b_[j], peer_a[i], peer_b[j]
            take_a = sa > sb or (sa == sb and pa > pb)
            p = pa if take_a else pb
            peer[n], stamp[n] = p, sa if take_a else sb
            i += take_a
            j += not take_a
            n += not seen[p]
            seen[p] = True
            if n > c:
                break
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


@numba.njit(cache=True, nogil=True)
def _partners(ids, peers, uniforms, partners):  # pragma: no cover
    c = ids.shape[1]
    flat_ids = ids.reshape(-1)
    for k in range(peers.size):
        if k + _AHEAD < peers.size:
            _prefetch_span(flat_ids, peers[k + _AHEAD] * c, c, 16)
        peer = peers[k]
        count = 0
        for j in range(c):
            count += ids[peer, j] >= 0
        slot = min(int(uniforms[k] * count), c - 1)
        partners[k] = ids[peer, slot] if count > 0 else -1


@numba.njit(cache=True, nogil=True)
def _forget_all(ids, stamps, peers, others):  # pragma: no cover
    c = ids.shape[1]
    for k in range(peers.size):
        peer, other = peers[k], others[k]
        j = 0
        while j < c and ids[peer, j] != other:
            j += 1
        if j == c:  # not in the view
            continue
        for m in range(j, c - 1):  # the entries after it move up one slot, in order
            ids[peer, m], stamps[peer, m] = ids[peer, m + 1], stamps[peer, m + 1]
        ids[peer, c - 1], stamps[peer, c - 1] = -1, -np.inf


def forget_all(ids: np.ndarray, stamps: np.ndarray, peers: np.ndarray, others: np.ndarray) -> None:
    """:meth:`Newscast.forget_all <p2pdp.sim.gossip.views.Newscast.forget_all>` compiled:
    ``others[k]`` leaves ``peers[k]``'s view (``ids`` (P, c) int32 and ``stamps`` (P, c),
    in place) for k = 0, 1, ... one after the other; a view holds an id at most once, so
    the entries after it move up one slot and the last becomes (-1, -inf)."""
    _forget_all(
        ids, stamps, peers.astype(np.int64, copy=False), others.astype(np.int64, copy=False)
    )


@numba.njit(cache=True, nogil=True)
def _count_sent(messages, sent_bytes, senders, size):  # pragma: no cover
    for k in range(senders.size):
        messages[senders[k]] += 1
        sent_bytes[senders[k]] += size


def count_sent(
    messages: np.ndarray, sent_bytes: np.ndarray, senders: np.ndarray, size: int
) -> None:
    """One message of ``size`` bytes from each entry of ``senders`` (ids may repeat), added
    to the per-peer int64 counters ``messages`` and ``sent_bytes`` in place: what
    ``np.add.at`` of both does."""
    _count_sent(messages, sent_bytes, senders.astype(np.int64, copy=False), size)


@numba.njit(cache=True, nogil=True)
def _append_rows(table, counts, rows, values, order):  # pragma: no cover
    n = rows.size
    for k in range(1, n):
        if rows[k] < rows[k - 1]:
            return False  # not grouped by row
    index = np.empty(n, np.int64)
    start = 0
    while start < n:
        row, end = rows[start], start
        while end < n and rows[end] == row:
            end += 1
        if counts[row] + end - start > table.shape[1]:
            raise IndexError("a row of the table is full")
        for m in range(start, end):  # the row's entries by order; equal orders stay in place
            i = m
            while i > start and order[index[i - 1]] > order[m]:
                index[i] = index[i - 1]
                i -= 1
            index[i] = m
        for m in range(start, end):
            table[row, counts[row] + m - start] = values[index[m]]
        counts[row] += end - start
        start = end
    return True


def append_rows(
    table: np.ndarray, counts: np.ndarray, rows: np.ndarray, values: np.ndarray, order: np.ndarray
) -> bool:
    """Append ``values`` to rows ``rows`` of ``table`` after their ``counts`` used slots, in
    the order of ``order`` within a row (ties: as given), in place; False (and nothing
    written) where ``rows`` is not non-decreasing. What
    :meth:`RoundFormation._append <p2pdp.sim.gossip.rounds.RoundFormation._append>` does."""
    return bool(
        _append_rows(
            table,
            counts,
            rows.astype(np.int64, copy=False),
            values.astype(table.dtype, copy=False),
            order.astype(np.float64, copy=False),
        )
    )


def partners_of(ids: np.ndarray, peers: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """:meth:`Newscast.partners <p2pdp.sim.gossip.views.Newscast.partners>` compiled: per
    peer, the member of its view (``ids`` (P, c) int32, -1: empty) in slot
    ``min(floor(uniforms[k] * count), c - 1)``, ``count`` its entries >= 0, or -1 for an
    empty view; (n,) int64. The same arithmetic as numpy's (a float64 product, truncated)."""
    partners = np.empty(peers.size, dtype=np.int64)
    _partners(ids, peers.astype(np.int64, copy=False), uniforms, partners)
    return partners


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
