"""The one-shot protocol's parties as transport-free machines: member, curator, central sampler.

Each machine is told what happened to its party (a message arrived, its timer ran out, a group
it started finished) and answers with what that party does: messages to send
(:class:`~p2pdp.protocols.groups.Send`, in order), timers to set (:class:`Timer`) and
decisions (:class:`Start`, :class:`Collect`, :class:`Charge`, :class:`Release`,
:class:`Publish`, :class:`Abort`, :class:`Stop`). It never touches a socket, a SimPy event, the
budget ledger, the noise or another party's state: a driver delivers messages and time to it
and carries out its effects with what the driver owns, in the order given (the guide's layout
page draws which driver drives which machine).

The decisions live here once:

- **when a curator releases, and what comes first** (:meth:`Curator.collect`): a group whose
  curator holds every contribution, still collecting, with its curator online, is charged
  (every member, all or nothing, before any noise is drawn), released and published to its
  members or to everyone, in that order; else it is aborted (curator offline, collect
  timeout, or a newer assignment of its curator: nobody charged);
- **what a party accepts, from whom, once** (:meth:`Curator.receive`, :meth:`Member.assign`,
  :meth:`Member.share`, :meth:`Member.publication`): an assignment from the sampler, in
  group order, to a member; a submission or partial sum from another member of a group the
  curator collects, once, claiming at least the public minimum of records, before the
  curator's timer ran out; a share from another member of its group, once, never one of an
  older group than the member's latest; a group publication from the group's curator, once.
  Anything else raises :class:`Refused` (a driver counts it, or, in simulation where every
  party is honest, never sees it), or :class:`Late` for a contribution the curator would
  have accepted had it come before its group ended (a message lost, not one refused);
- **who may join a group, when a group starts and when the run stops** (:class:`Sampler`):
  groups of ``g`` idle solvent peers while fewer than ``max_concurrent_groups`` are in flight,
  the members that can afford one more aggregation back to the pool once their group
  finished, and the stop, once no group is in flight, after ``max_failed_attempts`` aborts in
  a row or when fewer than ``g`` peers can afford another aggregation (none still training).

How a driver carries the effects out: :class:`~p2pdp.sim.world.World` charges its
:class:`~p2pdp.privacy.accounting.BudgetLedger`, releases through the run's
:class:`~p2pdp.privacy.release.Releaser` and publishes through its simulated transport;
:class:`~p2pdp.net.host.PeerHost` releases and publishes over TCP and carries the charge to the
ledger's owner, the coordinator, in its ``DONE`` report; the batched driver
(:func:`~p2pdp.sim.waves.run_waves`) asks :meth:`Curator.wave` once per wave of groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from p2pdp.core.rng import Uniforms
from p2pdp.protocols.groups import (
    PARTIAL,
    SAMPLER,
    SUBMIT,
    Group,
    GroupPool,
    Step,
    failed_in_a_row,
    too_few_solvent,
)

__all__ = [
    "COLLECT_TIMEOUT",
    "CURATOR_OFFLINE",
    "ENDED_WINDOW",
    "REASSIGNED",
    "Abort",
    "Charge",
    "Collect",
    "Curator",
    "Late",
    "Member",
    "Publish",
    "Refused",
    "Release",
    "Sampler",
    "Start",
    "Stop",
    "Timer",
]

#: Why a group ends without a release (its ``aborted`` reason).
CURATOR_OFFLINE = "curator offline"
COLLECT_TIMEOUT = "collect timeout"
REASSIGNED = "its curator was assigned a newer group"


#: How many ended groups (released or aborted) a :class:`Curator` remembers, and how many
#: groups its peers took shares of before a later one a :class:`Member` remembers, to tell a
#: late contribution (:class:`Late`) from one outside the protocol (:class:`Refused`): a
#: fixed window of the most recent, so their memory does not grow with the run. Only
#: assignments (the sampler's) make groups, so no sender can push an honest group out.
ENDED_WINDOW = 1024


class Refused(ValueError):
    """A message the protocol's state does not let its receiver accept (from a party that
    may not send it, for a group it is not in, a second time)."""


class Late(Refused):
    """A contribution its receiver would have accepted had it come in time: a submission or
    partial sum from another member of a group that ended at its curator (its timer ran
    out, it was aborted or released), its first, claiming at least the public minimum; or a
    share from another member of a group its receiver left for a later one, its first. A
    message lost in the protocol's sense (its driver counts it with the lost ones), not one
    outside the protocol; still not accepted."""


# -- effects ------------------------------------------------------------------------------------
class Timer(NamedTuple):
    """Set the curator's collection timer of ``group``: deliver :meth:`Curator.timer` after
    ``after`` seconds (of the driver's clock) unless the group ended first."""

    group: Group
    after: float


class Collect(NamedTuple):
    """The curator of ``group`` holds every contribution: deliver :meth:`Curator.collect`
    (at once, or as the driver's next event at this instant)."""

    group: Group


class Charge(NamedTuple):
    """Spend one aggregation of every member of ``members`` ((k,) int, a group's, or a wave's
    flat), all or nothing: a member that cannot afford it stops the run. Always comes before
    the :class:`Release` it pays for, so no noise is drawn for a group with a broke member."""

    members: np.ndarray | Sequence[int]


class Release(NamedTuple):
    """Release the noisy aggregate of ``group`` (its curator's statistic first, then the
    others' as :attr:`Group.submitted` orders them) through the run's one release path."""

    group: Group


class Publish(NamedTuple):
    """Send ``group``'s release to its other members, or (``everyone``) to every other peer.
    Post-processing: costs no budget."""

    group: Group
    everyone: bool


class Abort(NamedTuple):
    """``group`` ends without a release: nothing released, nobody charged (``reason``)."""

    group: Group
    reason: str


class Start(NamedTuple):
    """The central sampler starts a group of ``members`` ((g,) int64) led by ``curator``."""

    members: np.ndarray
    curator: int


class Stop(NamedTuple):
    """The run is over (no group in flight): ``reason``, the rows' ``stop_reason``."""

    reason: str


# -- the member ---------------------------------------------------------------------------------
class Member:
    """The member side of the peers a driver runs (every peer in simulation, a host's on the
    network): what each accepts from whom, once, and what it sends.

    Parameters
    ----------
    sizes : sequence or dict of int
        ``sizes[peer]``: the shard size of every peer this machine runs (public inside a
        group).
    everyone : bool
        ``publication.mode == "full"``: no member expects its group's publication in
        particular (every peer receives every release).

    Attributes
    ----------
    last_group : dict
        peer -> the last group it was assigned (groups are numbered in the order formed).
    expected : dict
        peer -> {group: curator}: the group publications it may still receive.
    """

    def __init__(self, sizes: Sequence[int] | dict[int, int], *, everyone: bool) -> None:
        self.sizes = sizes
        self.everyone = everyone
        self.last_group: dict[int, int] = {}
        self.expected: dict[int, dict[int, int]] = {}
        self._shares: dict[int, tuple[Group, set[int]]] = {}  # peer -> (group, share senders)
        # (peer, group) -> (group, share senders): the last ENDED_WINDOW groups whose shares
        # a peer took before a later one, oldest first (a share for them is late)
        self._shared: dict[tuple[int, int], tuple[Group, set[int]]] = {}

    def assign(self, peer: int, group: Group, sender: int = SAMPLER) -> None:
        """An ``ASSIGN`` of ``group`` reached ``peer`` from ``sender``: accepted from the
        sampler, by a member, for a group after the last one it was assigned; it joins
        (:meth:`join`), then contributes (:meth:`contribute`)."""
        if sender != SAMPLER:
            raise Refused("an assignment must come from the coordinator")
        if peer not in group.members.tolist():
            raise Refused(f"assigned to group {group.group_id} without being a member")
        if group.group_id <= self.last_group.get(peer, -1):
            raise Refused(f"assignment to group {group.group_id} replayed or out of order")
        self.join(peer, group)

    def join(self, peer: int, group: Group) -> None:
        """``peer`` is a member of ``group`` (assigned, or agreed among members): under
        group publication it expects the release from the curator; with secure aggregation
        it takes shares of this group from now on."""
        self.last_group[peer] = group.group_id
        if peer != group.curator and not self.everyone:
            self.expected.setdefault(peer, {})[group.group_id] = group.curator
        if group.secure and self.sharing(peer) != group.group_id:
            self._take_shares(peer, group)

    def _take_shares(self, peer: int, group: Group) -> tuple[Group, set[int]]:
        """``peer`` takes ``group``'s shares from now on; the group whose it took before is
        remembered (:data:`ENDED_WINDOW` of them in all, the oldest forgotten)."""
        older = self._shares.get(peer)
        if older is not None:
            self._shared[peer, older[0].group_id] = older
            if len(self._shared) > ENDED_WINDOW:
                del self._shared[next(iter(self._shared))]
        current = self._shares[peer] = (group, set())
        return current

    def contribute(self, peer: int, group: Group) -> Step:
        """``peer`` contributes to the group it joined: its statistic to the curator, or one
        share to every other member (:meth:`Group.contribute`); ``ready``: the curator
        (``peer`` itself) holds every contribution (deliver :meth:`Curator.collect`)."""
        return group.contribute(peer, self.sizes[peer])

    def sharing(self, peer: int) -> int | None:
        """The group whose shares ``peer`` takes now (secure aggregation), or None."""
        current = self._shares.get(peer)
        return None if current is None else current[0].group_id

    def share_group(self, peer: int, group_id: int) -> Group | None:
        """The group ``group_id`` if ``peer`` takes its shares now, or took them before a
        later group's (among the last :data:`ENDED_WINDOW`: a share for it is judged by
        :meth:`share`, :class:`Late` or :class:`Refused`); else None."""
        current = self._shares.get(peer)
        if current is not None and current[0].group_id == group_id:
            return current[0]
        past = self._shared.get((peer, group_id))
        return None if past is None else past[0]

    def share(self, peer: int, group: Group, sender: int) -> Step:
        """A ``SHARE`` of ``group`` from ``sender`` reached ``peer``, a member: accepted from
        another member, once, unless ``peer`` takes a later group's shares already; with one
        from every other member, ``peer`` sends its partial sum to the curator
        (:meth:`Group.on_share`). A share may come before ``peer`` joined (a driver that
        delivers it then counts it then: the simulator; the network host keeps it until the
        assignment, see :meth:`sharing`). A first share from another member of a group
        ``peer`` took shares of before a later one's (:meth:`share_group`) raises
        :class:`Late`: its sender's honest message came too late."""
        members = group.members.tolist()
        if sender == peer or sender not in members or peer not in members:
            raise Refused(f"share from {sender} to {peer}, not both members of {group.group_id}")
        current = self._shares.get(peer)
        late = False
        if current is None or current[0].group_id != group.group_id:
            if current is not None and current[0].group_id > group.group_id:
                current = self._shared.get((peer, group.group_id))
                if current is None:
                    raise Refused(f"a share of group {group.group_id} after a later group's")
                late = True
            else:
                current = self._take_shares(peer, group)
        senders = current[1]
        if sender in senders:
            raise Refused(f"a second share from {sender} (replayed)")
        senders.add(sender)
        if late:
            raise Late(f"a share of group {group.group_id} from {sender} after a later group's")
        return group.on_share(peer, self.sizes[peer])

    def publication(self, peer: int, group_id: int, sender: int) -> None:
        """A ``group`` publication of ``group_id`` from ``sender`` reached ``peer``: accepted
        from that group's curator, once (``Refused`` else)."""
        expected = self.expected.get(peer, {})
        if expected.get(group_id) != sender:
            raise Refused(
                f"a publication of group {group_id} from {sender}, not its curator for {peer} "
                "(or a second one)"
            )
        del expected[group_id]


# -- the curator --------------------------------------------------------------------------------
class Curator:
    """The curator side of the peers a driver runs: which groups each collects, what it
    accepts, and what it does with a complete group (the module docstring).

    Parameters
    ----------
    everyone : bool
        ``publication.mode == "full"``: a release goes to every other peer.
    min_shard_size : int
        The public lower bound on shard sizes: a contribution claiming fewer is refused.

    Attributes
    ----------
    groups : dict
        group id -> the :class:`~p2pdp.protocols.groups.Group` a curator run here collects.
    """

    def __init__(self, *, everyone: bool, min_shard_size: int = 1) -> None:
        self.everyone = everyone
        self.min_shard_size = min_shard_size
        self.groups: dict[int, Group] = {}
        self._current: dict[int, int] = {}  # curator -> the group it collects
        # the last ENDED_WINDOW groups that ended here, oldest first -> senders of late
        # contributions (so a second late copy is a replay)
        self._ended: dict[int, tuple[Group, set[int]]] = {}

    def joined(self, peer: int, group: Group, timeout: float | None) -> list[Abort | Timer]:
        """A peer run here joined ``group``: a group it curates from before is over (a curator
        collects one group at a time, and a peer is in one group at a time: that group was
        aborted, :data:`REASSIGNED`); if it curates ``group``, it collects it, its collection
        timer running ``timeout`` seconds (None: the driver knows every group completes, no
        timer)."""
        effects: list[Abort | Timer] = []
        older = self._current.get(peer)
        if older is not None and older in self.groups:
            effects.append(self._end(self.groups[older], REASSIGNED))
        if peer == group.curator:
            self.groups[group.group_id] = group
            self._current[peer] = group.group_id
            if timeout is not None:
                effects.append(Timer(group, timeout))
        return effects

    def collecting(self, curator: int, group_id: int) -> bool:
        """Whether ``curator`` collects ``group_id`` now."""
        group = self.groups.get(group_id)
        return group is not None and group.curator == curator

    def collected(self, curator: int, group_id: int) -> bool:
        """Whether ``curator`` collected ``group_id`` until it ended (released or aborted),
        among the last :data:`ENDED_WINDOW` groups ended here: a contribution for it is
        judged by :meth:`receive` (:class:`Late` or :class:`Refused`)."""
        ended = self._ended.get(group_id)
        return ended is not None and ended[0].curator == curator

    def receive(self, kind: str, group_id: int, sender: int, size: int) -> list[Collect]:
        """A ``SUBMIT`` or ``PARTIAL`` (``kind``) of ``group_id`` from ``sender``, who claims
        ``size`` records, reached its curator: accepted from another member of a group the
        curator collects, once, with ``size`` at least the public minimum; ``[Collect]``
        once the curator holds every contribution. One that would have been accepted but
        for its group having ended (among the last :data:`ENDED_WINDOW`) raises
        :class:`Late`; anything else, :class:`Refused` (a group never collected here or
        forgotten, a sender outside the group, a second copy, a size below the minimum)."""
        if kind not in (SUBMIT, PARTIAL):
            raise Refused(f"a curator receives no {kind!r}")
        group = self.groups.get(group_id)
        late: set[int] | None = None
        if group is None:
            if group_id not in self._ended:
                raise Refused(f"{kind} of group {group_id}, which no curator here collects")
            group, late = self._ended[group_id]
        if sender == group.curator or sender not in group.members.tolist():
            raise Refused(f"{kind} from {sender} to {group.curator} outside its group")
        if sender in (group.partial_sizes if kind == PARTIAL else group.submitted) or (
            late is not None and sender in late
        ):
            raise Refused(f"a second {kind} from {sender} (replayed)")
        if size < self.min_shard_size:
            raise Refused(f"shard size {size} below the public minimum {self.min_shard_size}")
        if late is not None:
            late.add(sender)
            raise Late(f"{kind} of group {group_id} from {sender} after the group ended")
        ready = group.on_submit(sender, size) if kind == SUBMIT else group.on_partial(sender, size)
        return [Collect(group)] if ready else []

    def collect(
        self, group: Group, *, online: bool = True
    ) -> list[Charge | Release | Publish | Abort]:
        """The curator holds every contribution of ``group`` (``online``: it is up): unless
        the group ended already (timed out), charge, release and publish, in that order;
        offline, abort it."""
        if group.ended:
            return []
        if not online:
            return [self._end(group, CURATOR_OFFLINE)]
        self._forget(group)
        return [Charge(group.members), Release(group), Publish(group, self.everyone)]

    def timer(self, group: Group) -> list[Abort]:
        """``group``'s collection timer ran out: abort it unless it ended first."""
        return [] if group.ended else [self._end(group, COLLECT_TIMEOUT)]

    def wave(self, members: list[int]) -> Charge:
        """A wave of groups whose curators all hold every contribution at one instant, online
        (the batched driver, :mod:`p2pdp.sim.waves`: no group can end otherwise there),
        decided at once: charge every member of ``members`` (the wave's, flat, group after
        group) before any of its noise is drawn; then each group is released and published
        (to :attr:`everyone` or its members) in the order the groups were drawn."""
        return Charge(members)

    def _end(self, group: Group, reason: str) -> Abort:
        self._forget(group)
        return Abort(group, reason)

    def _forget(self, group: Group) -> None:
        group.ended = True
        self.groups.pop(group.group_id, None)
        self._ended.setdefault(group.group_id, (group, set()))
        if len(self._ended) > ENDED_WINDOW:  # the oldest ended group is forgotten
            del self._ended[next(iter(self._ended))]
        if self._current.get(group.curator) == group.group_id:
            del self._current[group.curator]


# -- the central sampler ------------------------------------------------------------------------
class Sampler:
    """The central sampler (the seed's GroupAgent): who may join a group, when a group starts,
    when the run stops.

    Parameters
    ----------
    uniforms : Uniforms
        The protocol stream (:class:`~p2pdp.core.rng.Uniforms`): every draw of groups and
        curators (:class:`~p2pdp.protocols.groups.GroupPool`).
    group_size, max_concurrent, max_failed : int
        ``groups.group_size`` (g), ``groups.max_concurrent_groups``,
        ``groups.max_failed_attempts``.

    Attributes
    ----------
    pool : GroupPool
        The idle peers that can afford one more aggregation.
    in_flight, not_ready, failed : int
        Groups started and not finished; peers still training; aborts in a row.
    stop_reason : str
        Set once the sampler decided to start no more groups.
    """

    def __init__(
        self, uniforms: Uniforms, *, group_size: int, max_concurrent: int, max_failed: int
    ) -> None:
        self.pool = GroupPool(uniforms)
        self.group_size = group_size
        self.max_concurrent = max_concurrent
        self.max_failed = max_failed
        self.in_flight = 0
        self.not_ready = 0
        self.failed = 0
        self.stop_reason = ""
        self.stopped = False

    def start(self, ready: list[int], n_not_ready: int) -> None:
        """The run begins: ``ready`` peers are idle and solvent, ``n_not_ready`` still train
        (each comes with :meth:`peer_ready`). Then :meth:`fill`."""
        self.pool.add(ready)
        self.not_ready = n_not_ready

    def peer_ready(self, peer: int) -> None:
        """``peer`` finished training: idle and solvent. Then :meth:`fill`."""
        self.not_ready -= 1
        self.pool.add([peer])

    def fill(self) -> list[Start | Stop]:
        """What the sampler does now: start groups while fewer than ``max_concurrent`` are in
        flight, ``g`` peers are idle and fewer than ``max_failed`` aborts came in a row;
        ``Stop`` (once) when it will start no more and none is in flight."""
        if self.stopped:
            return []
        g = self.group_size
        effects: list[Start | Stop] = []
        while (
            self.in_flight < self.max_concurrent
            and len(self.pool) >= g
            and self.failed < self.max_failed
        ):
            members, curator = self.pool.draw(g)
            self.in_flight += 1
            effects.append(Start(members, curator))
        if self.failed >= self.max_failed:
            self.stop_reason = failed_in_a_row(self.max_failed)
        elif self.in_flight == 0 and self.not_ready == 0 and len(self.pool) < g:
            self.stop_reason = too_few_solvent(g)
        if self.stop_reason and self.in_flight == 0:
            self.stopped = True
            effects.append(Stop(self.stop_reason))
        return effects

    def wave_size(self) -> int:
        """Groups :meth:`fill` would start now, all of them finishing before the next wave
        (the batched driver draws them itself, :meth:`GroupPool.draw_many`, and calls
        :meth:`wave_finished`)."""
        if self.stop_reason or self.failed >= self.max_failed:
            return 0
        return max(0, min(self.max_concurrent - self.in_flight, len(self.pool) // self.group_size))

    def finished(self, members: np.ndarray, *, published: bool, solvent: np.ndarray) -> None:
        """The group of ``members`` ((k,) int) ended, published or aborted; ``solvent`` (k,)
        bool says which of them can afford one more aggregation (and may still take part):
        those go back to the pool unless the sampler decided to stop. Then :meth:`fill`."""
        self.in_flight -= 1
        self.failed = 0 if published else self.failed + 1
        if not self.stop_reason:
            self.pool.add(members[solvent].tolist())

    def wave_finished(self, solvent: list[int]) -> None:
        """A wave of groups the batched driver started (:meth:`wave_size`) was published;
        ``solvent`` are their members still solvent, in draw order (back to the pool)."""
        self.failed = 0
        self.pool.add(solvent)

    def stop(self) -> Stop:
        """The batched driver ran out of waves: the stop :meth:`fill` would decide then."""
        assert self.in_flight == 0 and self.not_ready == 0 and not self.stopped
        self.stopped = True
        self.stop_reason = (
            failed_in_a_row(self.max_failed)
            if self.failed >= self.max_failed
            else too_few_solvent(self.group_size)
        )
        return Stop(self.stop_reason)

    def remove(self, peers: set[int]) -> None:
        """``peers`` left the run for good (their host was lost)."""
        self.pool.remove(peers)
