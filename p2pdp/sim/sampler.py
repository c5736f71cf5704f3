"""The group-sampler seam: what the World gives a sampler and what it expects back.

A group sampler decides **who aggregates with whom, and when**. The World owns everything
else: the transport, the budget ledger, the curators that collect, release and publish, and
the completion monitor. Two samplers ship: :class:`p2pdp.sim.central.CentralSampler` (the
seed's GroupAgent, one coordinator that sees every idle peer) and
:class:`p2pdp.sim.gossip.GossipSampler` (decentralised formation from local views). Both
implement :class:`GroupSampler`; so can yours.

A sampler sees the world through :class:`SamplerWorld`, the part of
:class:`~p2pdp.sim.world.World` it may use: the world imports its samplers, and they import
this module, never the world (``lint-imports`` refuses an import cycle, even one made of
imports for typing only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import simpy

    from p2pdp.config import ScenarioConfig
    from p2pdp.privacy.accounting import BudgetLedger
    from p2pdp.protocols.groups import Group
    from p2pdp.sim.transport import Transport

__all__ = ["GroupSampler", "SamplerFactory", "SamplerWorld"]


class SamplerWorld(Protocol):
    """What a group sampler may use on the world (:class:`~p2pdp.sim.world.World` is one).

    :class:`GroupSampler` says how to use each: ``env``, ``config``, ``ledger``, ``online``,
    ``transport`` and :meth:`start_group`; :meth:`set_online` is how a sampler that models
    faults writes ``online`` (the world tells its observers).
    """

    env: simpy.Environment
    config: ScenarioConfig
    ledger: BudgetLedger
    online: np.ndarray
    transport: Transport

    def start_group(self, members: np.ndarray, curator: int, *, announce: bool = True) -> Group:
        """Hand the group ``members`` led by ``curator`` to the world, which aggregates it."""
        ...

    def start_groups(self, groups: np.ndarray, curators: np.ndarray) -> None:
        """:meth:`start_group` with ``announce=False`` of each of ``groups`` ((k, g) members,
        agreed on) led by ``curators`` ((k,)), in order."""
        ...

    def set_online(self, peers: np.ndarray, online: bool) -> None:
        """Mark ``peers`` online or offline (churn, crashes) and tell the observers."""
        ...


@runtime_checkable
class GroupSampler(Protocol):
    """Forms the aggregation groups of one simulated run.

    **Construction.** The World builds its sampler once, as ``Sampler(world, rng=rng)`` (see
    :class:`SamplerFactory`), after its environment, configuration, ledger, transport and
    ``online`` array exist and before any peer does (so do not touch ``world.peers``). ``rng``
    is the run's ``"protocol"`` stream: draw *every* random choice of the sampler from it
    (and from nothing else: not ``numpy.random``, not the world's other streams), so that a
    seed reproduces the run and other components' streams stay untouched. ``done`` must exist
    when the constructor returns (the completion monitor waits on it).

    **What the sampler may use on the world** (``world`` is a :class:`SamplerWorld`: the
    :class:`~p2pdp.sim.world.World`):

    ``world.env`` : simpy.Environment
        The simulated clock: start processes, set timeouts, read ``env.now`` (seconds).
    ``world.config`` : ScenarioConfig
        Read only. ``config.groups`` (``group_size`` g, ``max_concurrent_groups``,
        ``max_failed_attempts``, ``collect_timeout``), ``config.gossip`` and
        ``config.network`` hold the settings of the built-in samplers.
    ``world.ledger`` : BudgetLedger
        Read only: ``ledger.can_afford(peers)`` gives a (k,) bool array, True where a peer's
        remaining budget covers one more aggregation; ``ledger.active_mask()`` the same for
        every peer; ``ledger.n_peers`` is P. Never ``check`` or ``spend``: the curator
        charges the members when it releases, and only then.
    ``world.online`` : (P,) bool array
        Which peers are up. A sampler that models faults may write it (churn, crashes): an
        offline peer sends and receives nothing (messages reaching it are counted lost), a
        curator offline when collection ends aborts its group, and full publication reaches
        only the online peers.
    ``world.transport`` : Transport
        For the sampler's own protocol messages: ``transport.send(sender, deliver, message,
        n_bytes)`` delays the message by the configured latency, may lose it, counts it
        against ``sender`` and calls ``deliver(message)`` on arrival. A sampler that
        simulates many messages at once may update the counters ``messages_sent`` and
        ``bytes_sent`` ((P,) int arrays, per sender) and ``messages_lost`` directly.
    ``world.start_group(members, curator, *, announce)``
        Hands a group to the World, which runs the aggregation: members submit their local
        statistic to ``curator`` (or secret shares of it), the curator waits at most
        ``groups.collect_timeout`` seconds, checks every member's budget, releases the noisy
        aggregate, charges the members and publishes. ``members`` is a (k,) int64 array of
        distinct peer ids (normally k = g: the results report ``groups.group_size``; the
        sensitivity is computed from the actual group, so other sizes stay private),
        ``curator`` one of them. ``announce=True``: the World sends each member an
        ``ASSIGN`` message from the coordinator (sender -1) through the transport (delayed,
        possibly lost: a lost ``ASSIGN`` makes the group time out). ``announce=False``: the
        members already agreed among themselves (a decentralised protocol) and submit at once.

    **Invariants a sampler must keep** (the tests of the built-in samplers check them):

    - *Disjoint groups in flight*: a peer is in at most one group between ``start_group``
      and that group's ``group_finished``; a group's members are distinct.
    - *Only solvent peers*: every member can afford the aggregation when its group starts
      (``world.ledger.can_afford(members).all()``). Budgets change only when a group is
      published, so re-check a group's members in ``group_finished`` before using them
      again. (The curator also checks and raises
      :class:`~p2pdp.core.errors.BudgetExhaustedError` rather than overspend: a sampler that
      breaks this invariant crashes the run, it cannot leak privacy.)
    - *Termination*: ``done`` must eventually succeed, exactly once, and only when no group
      is in flight (every started group has finished); after it, start no group and end
      every process the sampler started, since the run lasts until the event queue is empty.
      Stop when fewer than g peers can afford another aggregation, and also on a rule of
      your own that ends runs that no longer make progress (the built-ins stop after
      ``groups.max_failed_attempts`` aborted aggregations in a row), or lossy runs never end.

    Attributes
    ----------
    done : simpy.Event
        Succeeds with the stop reason (a short sentence, ``str``) when the run is over. The
        completion monitor records it as the run's ``stop_reason`` and the time it succeeds
        as ``sim_time``.
    faults : bool, optional
        Set it to False only if the sampler never writes ``world.online`` (no churn, no
        crashes): with a loss-free network every group then completes, and the curators skip
        their collection timeouts (one event per group fewer). Missing means True.
    """

    done: simpy.Event

    def start(self, ready: list[int], n_not_ready: int) -> None:
        """Begin the run; called once, at time 0, before the event loop runs.

        Parameters
        ----------
        ready : list of int
            Peers that are idle and can afford an aggregation now (their local training
            takes no simulated time), in increasing order. Empty when no peer can afford
            even one aggregation.
        n_not_ready : int
            Peers still training: each of them is announced later by exactly one
            :meth:`peer_ready` call. The run must not end for lack of peers while some are.

        Start your own SimPy processes here (or form the first groups directly); if no
        group can ever form, succeed ``done`` (possibly right away).
        """
        ...

    def peer_ready(self, peer: int) -> None:
        """``peer`` finished its simulated local training and is idle from now on.

        Called at time ``shard_size * training.seconds_per_row`` for each of the
        ``n_not_ready`` peers of :meth:`start`. The peer has joined no aggregation yet, so
        it can afford one unless the ledger affords none at all (``ready`` was then empty).
        """
        ...

    def group_finished(self, group: Group, *, published: bool) -> None:
        """The aggregation of ``group`` ended; its members are free again.

        Called exactly once for every group passed to ``world.start_group``, from the
        curator's process. Read ``group.members`` ((k,) int64), ``group.curator`` and
        ``group.group_id`` only.

        Parameters
        ----------
        group : Group
        published : bool
            True: the aggregate was released and every member has been charged (some may
            no longer afford another aggregation). False: the group was aborted (a message
            was lost, a member or the curator crashed, collection timed out); nothing was
            released and nobody was charged.
        """
        ...


class SamplerFactory(Protocol):
    """How the World builds its sampler: a :class:`GroupSampler` class is one.

    ``factory(world, rng=rng)`` returns the run's sampler; see :class:`GroupSampler` for
    what ``world`` offers and ``rng`` is for.
    """

    def __call__(self, world: SamplerWorld, *, rng: np.random.Generator) -> GroupSampler: ...
