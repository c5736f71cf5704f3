"""The gossip group sampler: peer sampling, formation protocol and faults behind one seam.

:class:`GossipSampler` is a :class:`~p2pdp.sim.sampler.GroupSampler`. It composes the
Newscast service (:mod:`~p2pdp.sim.gossip.views`), the formation protocol
(:mod:`~p2pdp.sim.gossip.formation`) and the faults (:mod:`~p2pdp.sim.gossip.faults`),
drives all three from one clock process (one SimPy event per tick: churn, lock expiry, the
due view exchanges, the initiations due before the next tick), hands every formed group to
the World and decides when the run is over.

Termination. A peer stops initiating after ``groups.max_failed_attempts`` failures in a
row (it still accepts invitations, and joining a published aggregation makes it try
again): a local rule. The run ends, once no aggregation is in flight, when fewer than g
peers can afford one, after ``groups.max_failed_attempts`` aborted aggregations in a row
(the central sampler's rule, which stops runs whose messages are mostly lost), or when every
peer that can afford one has stopped initiating and no attempt is under way. These are
*global* counts kept by an observer (the seed's CompletionAgent), not part of the protocol:
no peer acts on them.
A network-wide count of failed *formation* attempts would not do: at P = 100,000 hundreds
of attempts fail concurrently while thousands of groups form.

Not used by the gossip sampler: ``groups.max_concurrent_groups`` (concurrency emerges from
the backoff).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from p2pdp.core.rng import Uniforms
from p2pdp.protocols.gossip import stop_reason
from p2pdp.sim.gossip.faults import Faults
from p2pdp.sim.gossip.formation import GroupFormation
from p2pdp.sim.gossip.rounds import RoundFormation, uses_rounds
from p2pdp.sim.gossip.views import TICKS_PER_PERIOD, Newscast, PeerSampling
from p2pdp.sim.overlay import build_overlay

if TYPE_CHECKING:
    from p2pdp.protocols.groups import Group
    from p2pdp.sim.sampler import SamplerWorld

__all__ = ["GossipSampler"]


class GossipSampler:
    """Group sampler from local views only; a :class:`~p2pdp.sim.sampler.GroupSampler`.

    Parameters
    ----------
    world : SamplerWorld
        Reads ``world.config`` (``groups``, ``gossip``, ``network.loss``), ``world.ledger``,
        ``world.transport``; writes ``world.online`` (churn, crashes).
    rng : numpy.random.Generator
        The protocol stream: overlay seed, views, phases, backoffs, nonces, faults.

    Attributes
    ----------
    done : simpy.Event
        Succeeds with ``stop_reason`` when the run is over.
    peer_sampling : PeerSampling
        Views and view exchanges (``views``: the :class:`Newscast` views).
    formation : GroupFormation or RoundFormation
        Every peer's state in the formation protocol, advanced message by message (the
        reference) or in rounds over arrays (:mod:`~p2pdp.sim.gossip.rounds`, large P).
    faults : Faults
        Churn and crashes.
    attempts_started, attempts_failed, groups_started : int
        Formation attempts, those that did not form a group, and groups handed to the world.
    formation_messages, gossip_messages : int
        Messages sent by the formation protocol and by view exchanges (also counted, per
        sender, in ``world.transport``).
    """

    #: The settings of gossip group formation it reads (:mod:`p2pdp.core.reads`).
    reads: ClassVar[tuple[str, ...]] = (
        "gossip.overlay",
        "gossip.allow_disconnected",
        "gossip.view_size",
        "gossip.gossip_period",
        "gossip.backoff",
        "gossip.invite_timeout",
        "gossip.lock_timeout",
        "gossip.max_retries",
        "gossip.formation",
        "gossip.churn",
        "gossip.curator_crash_probability",
        "gossip.member_crash_probability",
    )

    def __init__(self, world: SamplerWorld, *, rng: np.random.Generator) -> None:
        self.world = world
        self.env = world.env
        self.params = world.config.gossip
        self.group_size = world.config.groups.group_size
        self.max_failed = world.config.groups.max_failed_attempts
        # the order of construction is the order of the draws from rng: keep it
        self.overlay = build_overlay(self.params, world.ledger.n_peers, rng=rng)
        self.peer_sampling = PeerSampling(world, self.overlay, self.params, rng=rng)
        uniforms = Uniforms(rng)  # shared by the protocol and the faults
        driver = {
            "uniform": uniforms.draw,
            "take": uniforms.take,
            "rng": rng,
            "on_formed": self._group_formed,
            "on_attempt_over": self._check_done,
        }
        views = self.peer_sampling.views
        self.formation: GroupFormation | RoundFormation = (
            RoundFormation(world, views, on_formed_many=self._groups_formed, **driver)
            if uses_rounds(world.config)
            else GroupFormation(world, views, **driver)
        )
        self.faults = Faults(world, self.params, uniform=uniforms.draw, rng=rng, take=uniforms.take)
        self.in_flight = 0
        self.aborted_in_a_row = 0  # aborted aggregations since the last release; observer only
        self.groups_started = 0
        self.stop_reason = ""
        self.done = world.env.event()

    # -- the sampler interface ---------------------------------------------------------------
    def start(self, ready: list[int], n_not_ready: int) -> None:
        """Begin with the peers ``ready`` at time 0 (the others are still training)."""
        self.formation.become_free_all(np.asarray(ready, dtype=np.int64))
        self.env.process(self._clock())
        self._check_done()

    def peer_ready(self, peer: int) -> None:
        self.formation.become_free(peer)

    def group_finished(self, group: Group, *, published: bool) -> None:
        """Members become free again, or retire if they cannot afford another aggregation."""
        self.in_flight -= 1
        self.aborted_in_a_row = 0 if published else self.aborted_in_a_row + 1
        self.formation.members_back(group.members, published=published)
        self._check_done()

    def groups_finished(self, groups: list[Group]) -> None:
        """:meth:`group_finished` of ``groups``, all published at this instant, in this order,
        in one call: the same state and the same backoff draws (members in order) as the calls
        one after the other, whose stop tests in between cannot stop the run: the later
        groups' members are still solvent and in flight (at least g peers can afford an
        aggregation and a group is in flight), and a publication resets the aborts in a row.
        """
        self.in_flight -= len(groups)
        self.aborted_in_a_row = 0
        members = np.concatenate([group.members for group in groups])
        self.formation.members_back(members, published=True)
        self._check_done()

    # -- counters of the parts ---------------------------------------------------------------
    @property
    def views(self) -> Newscast:
        return self.peer_sampling.views

    @property
    def attempts_started(self) -> int:
        return self.formation.attempts_started

    @property
    def attempts_failed(self) -> int:
        return self.formation.attempts_failed

    @property
    def formation_messages(self) -> int:
        return self.formation.formation_messages

    @property
    def gossip_messages(self) -> int:
        return self.peer_sampling.gossip_messages

    # -- composition -------------------------------------------------------------------------
    def _group_formed(self, members: np.ndarray, curator: int) -> None:
        """The formation protocol agreed on a group: inject its faults, start it."""
        self.groups_started += 1
        self.in_flight += 1
        self.faults.inject_crashes(members, curator)
        self.world.start_group(members, curator, announce=False)

    def _groups_formed(self, groups: np.ndarray, curators: np.ndarray) -> None:
        """:meth:`_group_formed` of each of ``groups`` ((k, g) members, (k,) curators), in
        order, for the driver in rounds: it runs only where no crash can happen
        (:func:`~p2pdp.sim.gossip.rounds.uses_rounds`), so the faults are only their draws,
        made at once (nothing else draws from the protocol stream while the world starts
        groups)."""
        self.groups_started += len(groups)
        self.in_flight += len(groups)
        self.faults.pass_crashes(len(groups), self.group_size)
        self.world.start_groups(groups, curators)

    def _clock(self):
        """The one process behind the gossip, the timers and churn: one step per tick."""
        tick = self.params.gossip_period / TICKS_PER_PERIOD
        formation, peer_sampling = self.formation, self.peer_sampling
        k = 0
        while not self.done.triggered:
            formation.rejoin(self.faults.apply_churn())
            formation.expire_locks()
            peer_sampling.exchange_round(peer_sampling.due(k), tick=tick, silent=formation.retired)
            formation.advance(tick)
            k += 1
            yield self.env.timeout(tick)

    def _check_done(self) -> None:
        """The observer's stop test (global counters; no peer acts on them)."""
        if self.done.triggered:
            return
        if not self.stop_reason:
            formation = self.formation
            self.stop_reason = stop_reason(
                solvent=formation.n_solvent,
                aborted_in_a_row=self.aborted_in_a_row,
                trying=formation.n_trying,
                under_way=formation.attempts_in_flight + self.in_flight,
                group_size=self.group_size,
                max_failed=self.max_failed,
            )
            formation.stopped = bool(self.stop_reason)
        if self.stop_reason and self.in_flight == 0:
            self.done.succeed(self.stop_reason)
