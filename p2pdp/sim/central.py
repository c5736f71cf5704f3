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
from p2pdp.protocols.oneshot import Sampler, Start

if TYPE_CHECKING:
    import simpy

    from p2pdp.protocols.groups import Group, GroupPool
    from p2pdp.sim.sampler import SamplerWorld

__all__ = ["CentralSampler"]


class CentralSampler:
    """The seed's GroupAgent: uniform random disjoint groups from the idle, solvent peers.

    A :class:`~p2pdp.sim.sampler.GroupSampler` that drives the central sampler's machine
    (:class:`p2pdp.protocols.oneshot.Sampler`, the network coordinator's too): it tells the
    machine what happened and when, and starts the groups it decides on.

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
    machine : Sampler
        The decisions: who is idle and solvent, when a group starts, when the run stops.
    pool : GroupPool
        The machine's idle peers that can afford one more aggregation, and the uniform draws
        of groups and curators (:class:`p2pdp.protocols.groups.GroupPool`).
    faults : bool
        False: this sampler takes no peer offline (the world may then skip the curators'
        collection timeouts when no message can be lost either).
    """

    #: Reads nothing beyond ``[groups]`` (the protocol's; :mod:`p2pdp.core.reads`).
    reads: ClassVar[tuple[str, ...]] = ()

    faults = False

    def __init__(self, world: SamplerWorld, *, rng: np.random.Generator) -> None:
        groups = world.config.groups
        self.world = world
        self.rng = rng
        self.machine = Sampler(
            Uniforms(rng),
            group_size=groups.group_size,
            max_concurrent=groups.max_concurrent_groups,
            max_failed=groups.max_failed_attempts,
        )
        self._wake: simpy.Event | None = None
        self.done = world.env.event()

    @property
    def pool(self) -> GroupPool:
        return self.machine.pool

    @property
    def stop_reason(self) -> str:
        return self.machine.stop_reason

    def start(self, ready: list[int], n_not_ready: int) -> None:
        """Begin with the peers ``ready`` at time 0; ``n_not_ready`` are still training."""
        self.machine.start(ready, n_not_ready)
        self.world.env.process(self.run())

    def peer_ready(self, peer: int) -> None:
        self.machine.peer_ready(peer)
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def run(self):
        """Wake, ask the machine what to do, do it; until it says stop."""
        world = self.world
        while True:
            for effect in self.machine.fill():
                if type(effect) is Start:
                    world.start_group(effect.members, effect.curator)
                else:
                    self.done.succeed(effect.reason)
                    return
            self._wake = world.env.event()
            yield self._wake

    def group_finished(self, group: Group, *, published: bool) -> None:
        """Tell the machine (and which members can afford another aggregation), and wake."""
        solvent = self.world.ledger.can_afford(group.members)
        self.machine.finished(group.members, published=published, solvent=solvent)
        self._notify()
