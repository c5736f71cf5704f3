"""Faults of gossip group formation: churn and crashes, through ``world.set_online``.

Faults (``gossip.churn`` and the crash probabilities) set ``world.online``: an offline peer
neither sends nor receives (messages reaching it are counted lost), the curator aborts if it
is offline when collection ends, and full publication reaches only the online peers.

Churn
    With ``gossip.churn``, every peer alternates online sessions and offline downtimes, both
    log-normal (medians ``gossip.session_median`` and ``gossip.downtime_median`` seconds,
    log standard deviations ``gossip.session_sigma`` and ``gossip.downtime_sigma``). The
    first switch of each peer falls uniformly within its first session, so the network
    starts in a mixed state. Switches are applied at the gossip clock's ticks.
Crashes
    When a group starts, one member other than the curator crashes with probability
    ``gossip.member_crash_probability`` (before it submits: its group aborts), and the
    curator with probability ``gossip.curator_crash_probability``. A crashed peer stays
    offline for one downtime, then returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # the world imports the gossip package lazily
    from p2pdp.protocols.settings import GossipConfig

__all__ = ["Faults", "OnlineState"]


class OnlineState(Protocol):
    """What the faults switch: a world's ``online`` mask, clock and ``set_online`` (the
    one-shot :class:`~p2pdp.sim.world.World`, or the iterative protocols' driver)."""

    online: np.ndarray
    env: Any

    def set_online(self, peers: np.ndarray, online: bool) -> None: ...


class Faults:
    """Which peers are online: churn sessions, downtimes and crashes.

    Parameters
    ----------
    world : OnlineState
        Sets ``world.online`` through ``world.set_online`` (observers are told); reads
        ``world.env.now``.
    params : GossipConfig
        ``churn``, the session and downtime distributions, the crash probabilities.
    uniform : callable
        ``uniform()`` gives the next buffered uniform of the protocol stream
        (:class:`~p2pdp.core.rng.Uniforms`), shared with the formation protocol.
    rng : numpy.random.Generator
        The protocol stream: first switches, session lengths, downtimes.
    take : callable, optional
        ``take(n)`` gives the next ``n`` uniforms of ``uniform``'s stream at once
        (:meth:`Uniforms.take <p2pdp.core.rng.Uniforms.take>`), for :meth:`pass_crashes`.

    Attributes
    ----------
    next_change : (P,) float array
        Each peer's next online/offline switch (simulated seconds; inf: none scheduled).
    """

    def __init__(
        self,
        world: OnlineState,
        params: GossipConfig,
        *,
        uniform: Callable[[], float],
        rng: np.random.Generator,
        take: Callable[[int], list[float]] | None = None,
    ) -> None:
        self.world = world
        self.params = params
        self.rng = rng
        self._uniform = uniform
        self._take = take
        n_peers = world.online.size
        self.next_change = np.full(n_peers, np.inf)
        if params.churn:
            self.next_change = rng.random(n_peers) * self.session_lengths(n_peers)

    def session_lengths(self, n: int) -> np.ndarray:
        """``n`` online session lengths (s), log-normal."""
        p = self.params
        return self.rng.lognormal(math.log(p.session_median), p.session_sigma, size=n)

    def downtimes(self, n: int) -> np.ndarray:
        """``n`` offline downtimes (s), log-normal."""
        p = self.params
        return self.rng.lognormal(math.log(p.downtime_median), p.downtime_sigma, size=n)

    def apply_churn(self) -> np.ndarray:
        """Switch the peers whose time has come; return those that came back online, (k,)."""
        now = self.world.env.now
        due = np.flatnonzero(self.next_change <= now)
        if not due.size:
            return due
        online = self.world.online
        leaving, returning = due[online[due]], due[~online[due]]
        self.world.set_online(leaving, False)
        self.next_change[leaving] = now + self.downtimes(leaving.size)
        self.world.set_online(returning, True)
        self.next_change[returning] = (
            now + self.session_lengths(returning.size) if self.params.churn else np.inf
        )
        return returning

    def crash(self, peer: int) -> None:
        """``peer`` goes offline now, for one downtime."""
        self.world.set_online(np.array([peer]), False)
        self.next_change[peer] = self.world.env.now + self.downtimes(1)[0]

    def pass_crashes(self, n_groups: int, group_size: int) -> None:
        """:meth:`inject_crashes` of ``n_groups`` groups of ``group_size`` (distinct members)
        one after the other where both crash probabilities are 0: no crash, only its draws
        (the member's, if the group has another member, and the curator's), with ``take``."""
        params = self.params
        assert params.member_crash_probability == params.curator_crash_probability == 0
        assert self._take is not None
        self._take(n_groups * (2 if group_size > 1 else 1))

    def inject_crashes(self, members: np.ndarray, curator: int) -> None:
        """Crash a member (before it submits) and/or the curator, with the configured odds."""
        params = self.params
        others = members[members != curator]
        if others.size and self._uniform() < params.member_crash_probability:
            self.crash(int(others[int(self._uniform() * others.size)]))
        if self._uniform() < params.curator_crash_probability:
            self.crash(curator)
