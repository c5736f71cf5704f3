"""One aggregation of the one-shot protocol as a transport-free state machine.

The seed's Algorithms 1 and 2 at the level of messages, with DESIGN.md's fixes. A
:class:`Group` holds what the members and the curator of one aggregation know about it; each
method handles one event of one party (a member learnt its group, a message reached the
curator or a member) and returns a :class:`Step`: the messages that party sends now, in
sending order, and whether the curator now holds everything it needs to release. Nothing here
touches SimPy, the transport, the budget ledger or the noise. The parties' machines of
:mod:`p2pdp.protocols.oneshot` (member, curator, central sampler) use it and decide the rest:
what each party accepts, when a group is charged, released, published or aborted, when the
run stops; the drivers (the SimPy world, the batched waves, the network host and
coordinator) move the messages and carry those decisions out.

Messages (``kind``: from -> to, what it carries on the wire):

``ASSIGN``
    sampler -> member: the group (members, curator). Header only.
``SUBMIT``
    member -> curator: the member's statistic and shard size. A model.
``SHARE``
    member -> member (secure aggregation): one additive share of the sender's noisy,
    fixed-point encoded contribution. A model.
``PARTIAL``
    member -> curator (secure aggregation): the sum of the shares the member holds, its own
    included, and the member's shard size. A model.
``PUBLISH``
    curator -> member (``group`` publication): the released model. A model.

The curator's own statistic, share sum and copy of the release never travel: it holds them.
A group of one, with secure aggregation, is its own partial sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from p2pdp.core.rng import Uniforms

__all__ = [
    "ASSIGN",
    "PARTIAL",
    "PUBLISH",
    "SAMPLER",
    "SHARE",
    "SUBMIT",
    "Group",
    "GroupPool",
    "Send",
    "Step",
    "failed_in_a_row",
    "model_bytes",
    "stopped_initiating",
    "too_few_solvent",
]

SAMPLER = -1  # sender id of the central sampler

ASSIGN = "assign"
SUBMIT = "submit"
SHARE = "share"
PARTIAL = "partial"
PUBLISH = "publish"

#: Kinds whose payload is a model-sized vector (the rest are a header).
CARRIES_MODEL = frozenset({SUBMIT, SHARE, PARTIAL, PUBLISH})

#: The simulator's model of a message's size (bytes): a header (ids, kind, group id) and,
#: for a model, its float64 values.
HEADER_BYTES, FLOAT_BYTES = 64, 8


def model_bytes(dim: int) -> int:
    """Simulated size of one model message: ``dim`` float64 values plus a header."""
    return HEADER_BYTES + FLOAT_BYTES * dim


def failed_in_a_row(max_failed: int) -> str:
    """Why a run stops after ``groups.max_failed_attempts`` aborted aggregations in a row
    (every sampler and runtime words it the same: it is a column of the rows)."""
    return f"{max_failed} aggregations in a row failed"


def too_few_solvent(group_size: int) -> str:
    """Why a run stops when fewer than ``g`` peers can afford another aggregation."""
    return f"fewer than {group_size} peers can afford another aggregation"


def stopped_initiating(max_failed: int) -> str:
    """Why a gossip run stops when every peer that can afford an aggregation gave up
    initiating and nothing is under way (the simulator's observer and the network's
    coordinator word it the same)."""
    return (
        "every peer that can afford an aggregation stopped initiating after "
        f"{max_failed} failures in a row"
    )


class Send(NamedTuple):
    """One message to send: ``kind`` from ``sender`` (a peer id, or SAMPLER) to ``receiver``."""

    kind: str
    sender: int
    receiver: int


class Step(NamedTuple):
    """What one event makes its party do: ``sends`` in order, then ``ready``: the curator
    holds every contribution (the driver releases)."""

    sends: Sequence[Send]
    ready: bool


_NOTHING = Step((), False)


@dataclass(slots=True, eq=False)
class Group:
    """An aggregation in flight: members, curator, and what the curator has received.

    Parameters
    ----------
    group_id : int
    members : (g,) int array
        Distinct peer ids, the curator among them; their order is the order of secure
        aggregation's sum.
    curator : int
    secure : bool
        Secure aggregation: members exchange shares and the curator receives partial sums.
    started : float
        When the group started (simulated seconds), for observers.

    Attributes
    ----------
    submitted, sizes : list of int
        Members whose contribution the curator holds, in arrival order (secure: member
        order, once every partial sum arrived), and their shard sizes (public inside the
        group: the sensitivity depends on them).
    ended : bool
        Set by the curator's machine (:class:`~p2pdp.protocols.oneshot.Curator`) when the
        group was collected or aborted (anything later is ignored).
    """

    group_id: int
    members: np.ndarray
    curator: int
    secure: bool = False
    started: float = 0.0
    submitted: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    shares_received: dict[int, int] = field(default_factory=dict)
    partial_sizes: dict[int, int] = field(default_factory=dict)  # secure: curator's view
    ended: bool = False

    def assignments(self) -> list[Send]:
        """The central sampler tells every member its group (one ``ASSIGN`` each)."""
        return [Send(ASSIGN, SAMPLER, member) for member in self.members.tolist()]

    def contribute(self, member: int, size: int) -> Step:
        """``member`` learnt its group (``ASSIGN``, or it agreed to it): it contributes.

        Plain: its statistic goes to the curator (the curator's own stays where it is).
        Secure: one share to every other member. ``size`` is the member's shard size.
        """
        if self.secure:
            others = [m for m in self.members.tolist() if m != member]
            if not others:  # a group of one: its own contribution is its partial sum
                return self._partial_ready(member, size)
            return Step([Send(SHARE, member, other) for other in others], False)
        if member == self.curator:
            return Step((), self.on_submit(member, size))
        return Step([Send(SUBMIT, member, self.curator)], False)

    def on_submit(self, sender: int, size: int) -> bool:
        """The curator holds ``sender``'s statistic (of ``size`` records): ready?"""
        self.submitted.append(sender)
        self.sizes.append(size)
        return len(self.submitted) == len(self.members)

    def on_share(self, member: int, size: int) -> Step:
        """A share reached ``member`` (of ``size`` records); with one from every other member
        it sends its partial sum to the curator."""
        count = self.shares_received.get(member, 0) + 1
        self.shares_received[member] = count
        if count == len(self.members) - 1:
            return self._partial_ready(member, size)
        return _NOTHING

    def _partial_ready(self, member: int, size: int) -> Step:
        if member == self.curator:
            return Step((), self.on_partial(member, size))
        return Step([Send(PARTIAL, member, self.curator)], False)

    def on_partial(self, sender: int, size: int) -> bool:
        """``sender``'s partial sum (it holds ``size`` records) reached the curator: ready
        once it holds every member's."""
        self.partial_sizes[sender] = size
        if len(self.partial_sizes) < len(self.members):
            return False
        members = self.members.tolist()  # member order, as the shares were summed
        self.submitted, self.sizes = members, [self.partial_sizes[m] for m in members]
        return True

    def publications(self) -> list[Send]:
        """``group`` publication: the curator sends the release to every other member."""
        return [Send(PUBLISH, self.curator, m) for m in self.members.tolist() if m != self.curator]


class GroupPool:
    """The central sampler's choices, transport-free: the idle solvent peers and uniform groups.

    Parameters
    ----------
    uniforms : Uniforms
        The protocol stream's uniform floats in [0, 1) (:class:`~p2pdp.core.rng.Uniforms`):
        every choice of the pool comes from it, so the same stream and the same order of
        events give the same groups in any driver.

    Attributes
    ----------
    peers : list of int
        Idle peers that can afford one more aggregation.
    """

    def __init__(self, uniforms: Uniforms) -> None:
        self.peers: list[int] = []
        self._uniform = uniforms.draw
        self._take = uniforms.take

    def __len__(self) -> int:
        return len(self.peers)

    def add(self, peers: list[int]) -> None:
        """``peers`` are idle and solvent (ready at the start, or back from a group)."""
        self.peers.extend(peers)

    def remove(self, peers: set[int]) -> None:
        """Take ``peers`` out of the pool for good (they left the network)."""
        self.peers[:] = [peer for peer in self.peers if peer not in peers]

    def draw(self, g: int) -> tuple[np.ndarray, int]:
        """``g`` distinct idle peers, uniformly at random, taken out of the pool (Floyd's
        algorithm, O(g)), and their curator, uniform among them: ((g,) int64, int)."""
        (members,), (curator,) = self.draw_many(g, 1)
        return np.array(members, dtype=np.int64), curator

    def draw_many(self, g: int, k: int) -> tuple[list[list[int]], list[int]]:
        """``k`` successive :meth:`draw` of ``g`` peers in one call (a wave of the batched
        driver, :mod:`p2pdp.sim.waves`): the same uniforms in the same order, the same groups.

        Each group takes ``g + 1`` uniforms (Floyd's ``g`` picks, then the curator), so the
        wave's are taken at once. Floyd's pick ``j`` (of ``n - g .. n - 1``) is
        ``t = int(u * (j + 1))``, or ``j`` if ``t`` was picked already; when no ``t`` repeats
        (almost always, for ``g`` much smaller than the pool) the picks are the ``t`` in order.

        Returns
        -------
        members : list of k lists of g ints
            Each group's members, in the order :meth:`draw` gives them (the picks' set order).
        curators : list of k ints
        """
        pool = self.peers
        uniforms = self._take(k * (g + 1))
        groups: list[list[int]] = []
        curators: list[int] = []
        for start in range(0, k * (g + 1), g + 1):
            n = len(pool)
            if g == 1:  # Floyd's algorithm with one pick: a uniform index
                t = int(uniforms[start] * n)
                chosen = [pool[t]]
                pool[t] = pool[-1]
                pool.pop()
            else:
                picked = uniforms[start : start + g]
                ts = [int(u * j) for u, j in zip(picked, range(n - g + 1, n + 1), strict=True)]
                picks = set(ts)  # the same set as adding the t one by one
                if len(picks) < g:  # a t repeats: Floyd's rule, pick by pick
                    picks = set()
                    for j, t in zip(range(n - g, n), ts, strict=True):
                        picks.add(j if t in picks else t)
                chosen = [pool[i] for i in picks]
                for i in sorted(picks, reverse=True):  # swap-remove, O(g)
                    pool[i] = pool[-1]
                    pool.pop()
            groups.append(chosen)
            curators.append(chosen[int(uniforms[start + g] * g)])
        return groups, curators

    def draw_in_turn(
        self, g: int, n: int, counts: list[int], most: int
    ) -> tuple[list[int], list[int]]:
        """Up to ``n`` groups of ``g`` drawn one after another, each member charged before the
        next draw: waves of one group each (the batched driver with ``max_concurrent_groups
        = 1``, :mod:`p2pdp.sim.waves`), in one call.

        Each group is :meth:`draw_many` ``(g, 1)`` (the same uniforms, the same picks); then
        each of its members, in member order, has its count in ``counts`` raised by one and,
        if that count is still below ``most``, goes back to the pool. Stops after ``n``
        groups or when fewer than ``g`` peers are idle. Every peer in the pool must be below
        ``most``: a count that would pass it raises ``RuntimeError`` (the caller's bug).

        Returns
        -------
        members : list of int
            The groups' members, flat (``g`` per group, group after group).
        curators : list of int
            One per group.
        """
        pool, take = self.peers, self._take
        members: list[int] = []
        curators: list[int] = []
        offsets = range(g)
        while n > 0 and len(pool) >= g:
            # groups certainly drawn before the pool can fall below g (each takes g peers out
            # and puts at most g back): their uniforms are taken at once, as group after group
            # would take them
            m = min(n, len(pool) // g)
            n -= m
            uniforms = take(m * (g + 1))
            for start in range(0, m * (g + 1), g + 1):
                # draw_many's Floyd step, inlined: a function call per group made this chain
                # (the simulation's critical path) 10 to 20% slower
                size = len(pool)
                first = size - g + 1  # Floyd's pick i draws from [0, first + i)
                ts = [int(uniforms[start + i] * (first + i)) for i in offsets]
                picks = set(ts)
                if len(picks) < g:  # a t repeats: Floyd's rule, pick by pick
                    picks = set()
                    for j, t in zip(range(size - g, size), ts, strict=True):
                        picks.add(j if t in picks else t)
                chosen = [pool[i] for i in picks]
                for i in sorted(picks, reverse=True):  # swap-remove, O(g)
                    pool[i] = pool[-1]
                    pool.pop()
                curators.append(chosen[int(uniforms[start + g] * g)])
                members.extend(chosen)
                for peer in chosen:
                    count = counts[peer] + 1
                    counts[peer] = count
                    if count < most:
                        pool.append(peer)
                    elif count > most:
                        raise RuntimeError(f"peer {peer} was in the pool with no budget left")
        return members, curators
