"""The coordinator's side of gossip formation: formed groups checked, run, ended; the stop.

With ``groups.sampler = "gossip"`` the hosts form the groups (:mod:`p2pdp.net.gossip_host`).
A host reports each group its peer formed (``formed``, from the initiator's host, once per
attempt, with every member's signed commitment and nonce); the coordinator checks that
evidence and elects the curator itself (:func:`p2pdp.net.commitments.elect`), runs the group
as a central one, tells the members' hosts when it ended (``ended``: published or not, and
which members can afford another aggregation), and stops the run by the simulator's
observer's rule (:func:`p2pdp.protocols.gossip.stop_reason`) from the ledger and each host's
``status``, then tells the hosts (``halt``).

:class:`GossipGroups` is a base of :class:`p2pdp.net.coordinator.NetworkWorld`, on the state
that class builds (declared below).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.net.bookkeeping import Clock, Monitor, WireStats
from p2pdp.net.commitments import elect, public_key
from p2pdp.net.control import count_field
from p2pdp.net.gossip_host import ENDED, HALT
from p2pdp.net.tls import host_name
from p2pdp.net.wire import ProtocolError, encode
from p2pdp.protocols.gossip import stop_reason
from p2pdp.protocols.groups import Group

__all__ = ["GossipGroups"]


class GossipGroups:
    """Groups the hosts form, run by the coordinator (a base of ``NetworkWorld``)."""

    config: ScenarioConfig
    n_peers: int
    n_hosts: int
    host_of: np.ndarray
    env: Clock
    monitor: Monitor
    wire: WireStats
    lost_hosts: set[int]
    _next_group: int
    _hosts: dict[int, asyncio.StreamWriter]
    _signing: dict[int, bytes]
    _formed: list[tuple[np.ndarray, int]]
    _formed_attempts: set[tuple[int, int]]
    _status: dict[int, tuple[int, int, int]]
    _ended_sent: Counter[int]
    _wake: asyncio.Event

    # NetworkWorld's: which peers can afford another aggregation; run one group; conclude it
    _solvent: Callable[[np.ndarray], np.ndarray]
    _aggregate: Callable[[Group], Coroutine[Any, Any, tuple[Group, dict[str, Any] | None, str]]]
    _conclude: Callable[[Group, dict[str, Any] | None, str], np.ndarray]
    _tell: Callable[[int, bytes, str], bool]  # a control frame to a host still connected

    def _on_formed(self, message: dict[str, Any], who: str | None) -> None:
        """A host reports a group its initiator formed: from the initiator's host, once per
        attempt, with every member's signed commitment and nonce (checked here: the curator
        is elected here, from the nonces, never taken from the report)."""
        initiator = count_field(message["initiator"], "formed initiator", self.n_peers)
        if who != host_name(int(self.host_of[initiator])):
            raise ProtocolError(f"{who!r} reports a group of initiator {initiator}")
        attempt = (initiator, count_field(message["attempt"], "formed attempt"))
        if attempt in self._formed_attempts:
            raise ProtocolError(f"attempt {attempt} reported formed twice")
        keys = [public_key(self._signing[h]) for h in range(self.n_hosts)]
        group_size = self.config.groups.group_size
        members, curator = elect(keys, self.host_of, self.n_peers, group_size, message)
        self._formed_attempts.add(attempt)
        self._formed.append((members, curator))
        self._wake.set()

    def _end(self, members: np.ndarray, *, published: bool, solvent: np.ndarray) -> None:
        """Tell each (remaining) host of ``members`` that their group ended, and which of
        them can afford another aggregation."""
        for host in np.unique(self.host_of[members]).tolist():
            own = self.host_of[members] == host
            frame = encode(
                {
                    "kind": ENDED,
                    "members": members[own].tolist(),
                    "published": published,
                    "solvent": solvent[own].tolist(),
                }
            )
            if self._tell(host, frame, ENDED):
                self._ended_sent[host] += 1

    def _gossip_stop(self, aborted_in_a_row: int, in_flight: int) -> str:
        """The simulator's observer's rule (:func:`p2pdp.protocols.gossip.stop_reason`), fed
        from the ledger and the hosts' reports: why the run stops, or "" if it goes on. A
        live host that has not said anything yet counts as trying; one that has not carried
        out every ``ended`` frame sent to it as something under way (one in transit may make
        its peers try again); a lost host does not count."""
        groups = self.config.groups
        live = sorted(set(range(self.n_hosts)) - self.lost_hosts)
        said = [self._status[host] for host in live if host in self._status]
        behind = sum(self._status[h][2] != self._ended_sent[h] for h in live if h in self._status)
        return stop_reason(
            solvent=int(np.count_nonzero(self._solvent(np.arange(self.n_peers)))),
            aborted_in_a_row=aborted_in_a_row,
            trying=sum(trying for trying, _, _ in said) + len(live) - len(said),
            under_way=in_flight + sum(attempts for _, attempts, _ in said) + behind,
            group_size=groups.group_size,
            max_failed=groups.max_failed_attempts,
        )

    async def _gossip(self) -> None:
        """Gossip formation: the hosts form the groups (:mod:`p2pdp.net.gossip_host`); each group
        reported formed is assigned and run as a central one
        (:meth:`p2pdp.net.coordinator.NetworkWorld._aggregate`), at once, unless one of its members
        is still in another group here or its host is lost (then its members' hosts are told it
        ended unpublished); each end is told to the members' hosts (``ended``). The run stops as the
        simulator's observer stops it (:meth:`_gossip_stop`): the hosts are told (``halt``), the
        groups in flight end."""
        running: set[asyncio.Task[tuple[Group, dict[str, Any] | None, str]]] = set()
        busy: set[int] = set()
        aborted_in_a_row, reason = 0, ""
        try:
            while True:
                formed, self._formed = self._formed, []
                for members, curator in formed:
                    peers = members.tolist()
                    if reason or busy.intersection(peers) or not self._solvent(members).all():
                        if not reason:
                            self._end(members, published=False, solvent=self._solvent(members))
                        continue
                    group = Group(self._next_group, members, curator, started=self.env.now)
                    self._next_group += 1
                    busy.update(peers)
                    running.add(asyncio.create_task(self._aggregate(group)))
                ended = {task for task in running if task.done()}
                running -= ended
                for outcome in sorted(
                    (task.result() for task in ended), key=lambda outcome: outcome[0].group_id
                ):
                    group, aborted = outcome[0], bool(outcome[2])
                    solvent = self._conclude(*outcome)
                    aborted_in_a_row = aborted_in_a_row + 1 if aborted else 0
                    busy.difference_update(group.members.tolist())
                    self._end(group.members, published=not aborted, solvent=solvent)
                if not reason:
                    reason = self._gossip_stop(aborted_in_a_row, len(running))
                    if reason:  # no peer initiates any more; the groups in flight end
                        halt = encode({"kind": HALT})
                        for host in list(self._hosts):
                            self._tell(host, halt, HALT)
                if reason and not running:
                    self.monitor.stop_reason = reason
                    return
                self._wake.clear()
                woken = asyncio.create_task(self._wake.wait())
                await asyncio.wait({*running, woken}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
        finally:
            for task in running:
                task.cancel()
