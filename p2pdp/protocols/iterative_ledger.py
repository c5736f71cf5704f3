"""An iterative run's records: the one place its privacy comes from, on every runtime.

A driver passes every effect of :mod:`p2pdp.protocols.iterative_peer` that is a record
(:class:`~p2pdp.protocols.iterative_peer.Stepped`,
:class:`~p2pdp.protocols.iterative_peer.Averaged`, :class:`~p2pdp.protocols.iterative_peer.Late`,
:class:`~p2pdp.protocols.iterative_peer.Received`) to an :class:`IterativeLedger`, and the
batched protocol its whole arrays: ``ledger.steps`` (P,) (local DP:
:meth:`StepPrivacy.epsilon <p2pdp.protocols.iterative.StepPrivacy.epsilon>` of it),
``ledger.averaged`` (messages averaged: ``messages sent - averaged`` are the lost and late
ones) and :meth:`IterativeLedger.trace` (the :class:`~p2pdp.protocols.views.ViewTrace` of
network DP and correlated noise: every round's stepping peers, every exchange's averaged and
late messages).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from p2pdp.protocols.iterative_peer import Averaged, Effect, Late, Stepped
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.views import ViewTrace

__all__ = ["IterativeLedger"]


class IterativeLedger:
    """A run's records, from the machines' effects or the batched protocol's arrays alike.

    Parameters
    ----------
    mixing : Mixing
        The overlay (edge ``e`` of row ``i`` carries ``indices[e]``'s model to ``i``).
    exchanges : int
        Exchanges per round (synchronous protocols).
    trace : bool
        Keep every step's peers and every exchange's masks (for :meth:`trace`); otherwise
        only the counts.

    Attributes
    ----------
    steps : (P,) int64
        Private steps each peer took: its local DP is ``privacy.epsilon(steps)``.
    averaged : int
        Messages averaged (on time); ``messages sent - averaged`` were lost or late.
    late : int
        Messages read after their deadline.
    """

    def __init__(self, mixing: Mixing, *, exchanges: int = 1, trace: bool = False) -> None:
        self.mixing = mixing
        self.exchanges = exchanges
        self.keep = trace
        self.steps = np.zeros(mixing.n_peers, dtype=np.int64)
        self.averaged = 0
        self.late = 0
        self._stepped: dict[int, list[int]] = {}
        self._delivered: dict[tuple[int, int], np.ndarray] = {}
        self._late: dict[tuple[int, int], np.ndarray] = {}
        self._edge: dict[tuple[int, int], int] | None = None

    def edge(self, receiver: int, sender: int) -> int:
        """The index of the edge carrying ``sender``'s model to ``receiver``."""
        if self._edge is None:
            receivers, senders = self.mixing.receivers.tolist(), self.mixing.indices.tolist()
            self._edge = {
                (r, s): e for e, (r, s) in enumerate(zip(receivers, senders, strict=True))
            }
        return self._edge[(receiver, sender)]

    def _mask(self, store: dict[tuple[int, int], np.ndarray], key: tuple[int, int]) -> np.ndarray:
        if key not in store:
            store[key] = np.zeros(self.mixing.indices.size, dtype=bool)
        return store[key]

    # the batched protocol's records (whole arrays)
    def stepped(self, round_: int, peers: np.ndarray) -> None:
        """``peers`` stepped in ``round_`` (the batched protocol)."""
        self.steps[peers] += 1
        if self.keep:
            self._stepped.setdefault(round_, []).extend(np.asarray(peers).tolist())

    def exchanged(
        self, round_: int, exchange: int, delivered: np.ndarray, late: np.ndarray
    ) -> None:
        """The (E,) masks of the messages of ``(round_, exchange)`` averaged and late."""
        self.averaged += int(np.count_nonzero(delivered))
        self.late += int(np.count_nonzero(late))
        if self.keep:
            self._mask(self._delivered, (round_, exchange))[:] |= delivered
            self._mask(self._late, (round_, exchange))[:] |= late

    # the machines' records (one effect at a time)
    def take(self, effects: Iterable[Effect]) -> None:
        """Record the records among a machine's ``effects`` (others are ignored)."""
        for effect in effects:
            if isinstance(effect, Stepped):
                self.steps[effect.peer] += 1
                if self.keep:
                    self._stepped.setdefault(effect.round, []).append(effect.peer)
            elif isinstance(effect, Averaged):
                self.averaged += len(effect.senders)
                if self.keep:
                    mask = self._mask(self._delivered, (effect.round, effect.exchange))
                    for sender in effect.senders:
                        mask[self.edge(effect.peer, sender)] = True
            elif isinstance(effect, Late):
                self.late += 1
                if self.keep:
                    mask = self._mask(self._late, (effect.round, effect.exchange))
                    mask[self.edge(effect.peer, effect.sender)] = True

    def trace(self, rounds: int) -> ViewTrace:
        """The run as :mod:`p2pdp.protocols.network_dp` reads it: per round, the stepping
        peers (increasing), then each exchange's averaged and late masks."""
        if not self.keep:
            raise ValueError("this ledger keeps no trace (trace=False)")
        trace = ViewTrace()
        empty = np.zeros(self.mixing.indices.size, dtype=bool)
        for round_ in range(1, rounds + 1):
            trace.step(np.sort(np.array(self._stepped.get(round_, []), dtype=np.int64)))
            for exchange in range(self.exchanges):
                key = (round_, exchange)
                trace.exchange(self._delivered.get(key, empty), self._late.get(key, empty))
        return trace
