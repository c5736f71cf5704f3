"""Newscast view exchanges on the network: one host's side of its peers' peer sampling.

A host's gossip formation driver (:class:`p2pdp.net.gossip_host.HostFormation`) keeps its own
peers' views (ids and stamps, the rows of the simulator's :class:`~p2pdp.sim.gossip.views.
Newscast` for those peers only) and exchanges them with other peers over the peers' sockets:

``view`` / ``view-reply``
    The sender's view (at most ``gossip.view_size`` entries ``[peer, stamp]``) and its own
    fresh descriptor (no stamp: it cannot afford another aggregation and does not advertise
    itself); the partner answers with its own view, and each keeps the freshest distinct
    entries of the union (``setup.merge``, the simulator's merge). Stamps are seconds since
    formation began on the stamping host's clock.

What a host accepts: a view request once per sender's sequence number; a view reply only from
the partner the exchange asked, once. A reply slower than :data:`ASKED` more requests is late
(:class:`~p2pdp.protocols.oneshot.Late`, counted ``expired``), not merged; refused after that.
Buffers are bounded: :data:`ASKED` requests per own peer, one sequence number per (sender,
own peer).

:class:`ViewExchange` is a base of :class:`~p2pdp.net.gossip_host.HostFormation`: the views
the formation machine reads (``view``, ``forget``) and the exchange, on the state that class
builds.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from p2pdp.net.wire import ProtocolError, integer
from p2pdp.protocols.gossip import GossipFormation
from p2pdp.protocols.oneshot import Late

__all__ = ["ASKED", "VIEW", "VIEW_REPLY", "ViewExchange"]

#: Frame kinds between peers: a view exchange's request and reply.
VIEW, VIEW_REPLY = "view", "view-reply"
#: View requests a peer remembers until answered (one per gossip period); a reply slower
#: than this many periods is lost (late: :class:`~p2pdp.protocols.oneshot.Late`, counted
#: ``expired`` by the host), not merged, for ASKED more requests; refused after that.
ASKED = 4


class ViewExchange:
    """Own peers' Newscast views and their exchanges (a base of ``HostFormation``, which
    builds the state below)."""

    ids: dict[int, np.ndarray]  # own peer -> (c,) int64 view ids (-1: empty)
    stamps: dict[int, np.ndarray]  # own peer -> (c,) float64 stamps, seconds (-inf: empty)
    params: Any  # GossipConfig
    setup: Any  # GossipSetup (its ``merge``)
    machine: GossipFormation
    rng: np.random.Generator
    n_peers: int
    _send: Callable[[str, int, int, dict[str, Any]], None]
    _view_seq: int
    _asked: dict[int, OrderedDict[int, int]]
    _late: dict[int, OrderedDict[int, int]]
    _last_seq: dict[tuple[int, int], int]
    now: Callable[[], float]  # seconds since this host's formation began

    # -- the machine's Views ---------------------------------------------------------------
    def view(self, peer: int) -> np.ndarray:
        row = self.ids[peer]
        return row[row >= 0]

    def forget(self, peer: int, other: int) -> None:
        keep = self.ids[peer] != other
        kept = int(keep.sum())
        self.ids[peer][:kept], self.stamps[peer][:kept] = (
            self.ids[peer][keep],
            self.stamps[peer][keep],
        )
        self.ids[peer][kept:], self.stamps[peer][kept:] = -1, -np.inf

    # -- views -----------------------------------------------------------------------------
    def _entries(self, peer: int) -> list[list[Any]]:
        used = self.ids[peer] >= 0
        return [
            [int(i), float(s)]
            for i, s in zip(self.ids[peer][used], self.stamps[peer][used], strict=True)
        ]

    def _descriptor(self, peer: int) -> float | None:
        """``peer``'s fresh stamp, or None: it cannot afford another aggregation (it stops
        advertising itself)."""
        return None if self.machine.retired(np.array([peer]))[0] else self.now()

    def _ask_view(self, peer: int) -> None:
        view = self.view(peer)
        if not view.size:
            return
        partner = int(view[min(int(self.rng.random() * view.size), view.size - 1)])
        self._view_seq += 1
        stamp = self._descriptor(peer)
        asked, late = self._asked[peer], self._late[peer]
        asked[self._view_seq] = partner
        if len(asked) > ASKED:  # an answer slower than ASKED periods comes late: lost
            seq, forgotten = asked.popitem(last=False)
            late[seq] = forgotten
            if len(late) > ASKED:
                late.popitem(last=False)
        self._send(VIEW, peer, partner, {"kind": VIEW, "sender": peer, "receiver": partner,
                                         "seq": self._view_seq, "view": self._entries(peer),
                                         "stamp": stamp})  # fmt: skip

    def _parse_view(self, message: dict[str, Any], sender: int) -> list[tuple[int, float]]:
        entries = message["view"]
        if not isinstance(entries, list) or len(entries) > self.params.view_size:
            raise ProtocolError(f"a view of at most {self.params.view_size} entries")
        parsed = []
        for entry in entries:
            if not isinstance(entry, list) or len(entry) != 2:
                raise ProtocolError("a view entry is [peer, stamp]")
            stamp = entry[1]
            if type(stamp) is not float or not math.isfinite(stamp):
                raise ProtocolError("a view stamp must be a finite float")
            parsed.append((integer(entry[0], "view peer", 0, self.n_peers), stamp))
        stamp = message["stamp"]
        if stamp is not None:
            if type(stamp) is not float or not math.isfinite(stamp):
                raise ProtocolError("a descriptor stamp must be a finite float or nil")
            parsed.append((sender, stamp))
        return parsed

    def _merge(self, owner: int, entries: list[tuple[int, float]]) -> None:
        """Newscast: ``owner`` keeps the ``view_size`` freshest distinct entries of its view
        and ``entries`` (never itself)."""
        c = self.params.view_size
        ids = [*self.ids[owner].tolist(), *(e[0] for e in entries)]
        stamps = [*self.stamps[owner].tolist(), *(e[1] for e in entries)]
        pad = max(0, c - len(ids))
        merged_ids, merged_stamps = self.setup.merge(
            np.array([ids + [-1] * pad], dtype=np.int64),
            np.array([stamps + [-np.inf] * pad]),
            np.array([owner]),
            c,
        )
        self.ids[owner], self.stamps[owner] = merged_ids[0].astype(np.int64), merged_stamps[0]

    def _on_view(self, peer: int, message: dict[str, Any]) -> None:
        sender = integer(message["sender"], "sender", 0, self.n_peers)
        seq = integer(message["seq"], "seq")
        if seq <= self._last_seq.get((sender, peer), 0):
            raise ProtocolError(f"a second view request {seq} from {sender}")
        entries = self._parse_view(message, sender)
        self._last_seq[(sender, peer)] = seq
        stamp = self._descriptor(peer)
        reply = {"kind": VIEW_REPLY, "sender": peer, "receiver": sender, "seq": seq,
                 "view": self._entries(peer), "stamp": stamp}  # fmt: skip
        self._send(VIEW_REPLY, peer, sender, reply)
        self._merge(peer, entries)

    def _on_view_reply(self, peer: int, message: dict[str, Any]) -> None:
        sender = integer(message["sender"], "sender", 0, self.n_peers)
        asked, seq = self._asked[peer], message["seq"]
        if type(seq) is int and self._late[peer].get(seq) == sender:
            del self._late[peer][seq]
            raise Late(f"a view reply from {sender} after {ASKED} more requests")
        if type(seq) is not int or asked.get(seq) != sender:
            raise ProtocolError(f"a view reply from {sender}, which was not asked")
        entries = self._parse_view(message, sender)
        del asked[seq]
        self._merge(peer, entries)
