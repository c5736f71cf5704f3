"""The central group sampler: the seed's GroupAgent (``groups.sampler = "central"``).

One coordinator sees every idle peer. It draws ``g`` peers uniformly at random from the idle
peers whose remaining budget covers one more aggregation, picks the curator uniformly among
them, and hands the group to the World, which sends each member an ``ASSIGN`` message
(through the transport: delayed, possibly lost). At most ``groups.max_concurrent_groups``
groups are in flight at once. The run ends, once no group is in flight, when fewer than
``g`` peers can afford another aggregation (and none is still training) or after
``groups.max_failed_attempts`` aborted aggregations in a row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from p2pdp.core.rng import Uniforms
from p2pdp.protocols.groups import GroupPool, failed_in_a_row, too_few_solvent

if TYPE_CHECKING:
    import simpy

    from p2pdp.protocols.groups import Group
    from p2pdp.sim.sampler import SamplerWorld

__all__ = ["CentralSampler"]


class CentralSampler:
    """The seed's GroupAgent: uniform random disjoint groups from the idle, solvent peers.

    A :class:`~p2pdp.sim.sampler.GroupSampler`.

    Parameters
    ----------
    world : SamplerWorld
        Reads ``world.config.groups`` and ``world.ledger``; starts groups with
        ``world.start_group(..., announce=True)``.
    rng : numpy.random.Generator
        The protocol stream: group members and curators.

    Attributes
    ----------
    done : simpy.Event
        Succeeds with ``stop_reason`` when the run is over.
    pool : GroupPool
        Idle peers that can afford one more aggregation, and the uniform draws of groups
        and curators (:class:`p2pdp.protocols.groups.GroupPool`, shared with the network
        runtime).
    in_flight : int
        Groups started and not yet finished.
    faults : bool
        False: this sampler takes no peer offline (the world may then skip the curators'
        collection timeouts when no message can be lost either).
    """

    #: Reads nothing beyond ``[groups]`` (the protocol's; :mod:`p2pdp.core.reads`).
    reads: ClassVar[tuple[str, ...]] = ()

    faults = False

    def __init__(self, world: SamplerWorld, *, rng: np.random.Generator) -> None:
        self.world = world
        self.rng = rng
        self.pool = GroupPool(Uniforms(rng))  # idle peers that can afford one more
        self.in_flight = 0
        self.not_ready = 0
        self.failed_in_a_row = 0
        self.stop_reason = ""
        self._wake: simpy.Event | None = None
        self.done = world.env.event()

    def start(self, ready: list[int], n_not_ready: int) -> None:
        """Begin with the peers ``ready`` at time 0; ``n_not_ready`` are still training."""
        self.pool.add(ready)
        self.not_ready = n_not_ready
        self.world.env.process(self.run())

    def peer_ready(self, peer: int) -> None:
        self.not_ready -= 1
        self.pool.add([peer])
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self):
        world = self.world
        g = world.config.groups.group_size
        limit = world.config.groups.max_concurrent_groups
        max_failed = world.config.groups.max_failed_attempts
        while True:
            while (
                self.in_flight < limit and len(self.pool) >= g and self.failed_in_a_row < max_failed
            ):
                members, curator = self.pool.draw(g)
                self.in_flight += 1
                world.start_group(members, curator)
            if self.failed_in_a_row >= max_failed:
                self.stop_reason = failed_in_a_row(max_failed)
            elif self.in_flight == 0 and self.not_ready == 0 and len(self.pool) < g:
                self.stop_reason = too_few_solvent(g)
            if self.stop_reason and self.in_flight == 0:
                self.done.succeed(self.stop_reason)
                return
            self._wake = world.env.event()
            yield self._wake

    def group_finished(self, group: Group, *, published: bool) -> None:
        """Return the members that can still afford an aggregation to the idle pool."""
        self.in_flight -= 1
        self.failed_in_a_row = 0 if published else self.failed_in_a_row + 1
        if not self.stop_reason:
            solvent = self.world.ledger.can_afford(group.members)
            self.pool.add(group.members[solvent].tolist())
        self._notify()
