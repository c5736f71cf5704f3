"""The SimPy world: peers, a central group sampler, curators, a completion monitor.

The world drives the one-shot parties' transport-free machines (:mod:`p2pdp.protocols.oneshot`:
every peer's member and curator side; the central sampler's through
:class:`~p2pdp.sim.central.CentralSampler`): it delivers each message they send through the
simulated transport and each timer on the SimPy clock, and carries out their decisions with
what it owns (:meth:`World.carry_out`: the ledger charges, the releaser releases, the
transport publishes). Protocol of one aggregation (the seed's Algorithms 1 and 2, with
DESIGN.md's fixes):

1. The group sampler (:mod:`p2pdp.sim.sampler`; by default the seed's GroupAgent,
   :class:`~p2pdp.sim.central.CentralSampler`) draws ``g`` peers uniformly at random
   from the idle peers whose remaining budget covers one more aggregation, picks the curator
   uniformly among them, and sends each member an ``ASSIGN`` message.
2. A member that receives ``ASSIGN`` sends its local model and shard size to the curator.
   (With secure aggregation, members exchange additive shares instead and the curator only
   receives partial sums; see :mod:`p2pdp.privacy.secure_aggregation`.)
3. The curator (:meth:`World.collected`) waits until all ``g`` models arrived (or
   ``collect_timeout`` passes: :meth:`World.timed_out` aborts the group and nobody is charged,
   since nothing was released), **checks and spends** every member's budget (all or nothing:
   a member that cannot afford it stops the run before any noise is drawn), asks the task for
   the group's sensitivity and releases the aggregate through the one release path
   (:class:`p2pdp.privacy.release.Releaser`: plaintext or secure).
4. The published model goes to the members (``group`` publication) or, as one broadcast, to
   every peer (``full`` publication). Publication is post-processing: it costs no budget.
5. The :class:`CompletionMonitor` (the seed's CompletionAgent) ends the run when fewer than
   ``g`` peers can still afford an aggregation and no group is in flight.

The noise draws come from a dedicated stream, so the same seed gives the same models whatever
the publication mode.

The world is task-agnostic: it moves each peer's statistic (a row of ``statistics``: a model,
a count, ...) and never looks inside it; the task (:mod:`p2pdp.tasks`) gives the group's
sensitivity and the aggregate, and scores the run afterwards. Observers
(:class:`WorldObserver`) are told of every group started, released and aborted, every lost
message and every peer going offline or online, without reading the world's internals.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import simpy

from p2pdp.config import ScenarioConfig
from p2pdp.core.boundary import calling, check_methods, is_builtin, problem
from p2pdp.core.columns import Ragged, Rows
from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import OneOf
from p2pdp.privacy.accounting import BudgetLedger, make_accountant
from p2pdp.privacy.release import Releaser, ReleaseRecord, ReleaseTable
from p2pdp.protocols.groups import (
    ASSIGN,
    CARRIES_MODEL,
    HEADER_BYTES,
    PUBLISH,
    SHARE,
    Group,
    Step,
    model_bytes,
)
from p2pdp.protocols.oneshot import (
    Abort,
    Charge,
    Collect,
    Curator,
    Member,
    Publish,
    Release,
    Timer,
)
from p2pdp.sim.central import CentralSampler
from p2pdp.sim.group_batches import GroupBatches
from p2pdp.sim.sampler import GroupSampler
from p2pdp.sim.transport import Environment, Transport
from p2pdp.sim.waves import DRIVERS, batched_obstacle, run_waves

__all__ = ["CompletionMonitor", "Message", "Peer", "World", "WorldObserver", "budget_ledger"]


@dataclass(slots=True)
class Message:
    """A protocol message in simulation: ``kind``, ``sender`` (peer id, or SAMPLER), the
    :class:`~p2pdp.protocols.groups.Group` it belongs to, and ``payload``.

    ``payload`` is the index of the published release for ``PUBLISH`` (else -1). What the
    other kinds carry on the wire the world reads from its arrays on delivery: the sender's
    statistic and shard size (``SUBMIT``; its shard size for ``PARTIAL``); the arithmetic of
    ``SHARE`` and ``PARTIAL`` is done in one vectorised call at the curator (see
    :class:`p2pdp.privacy.release.Releaser`).
    """

    kind: str
    sender: int
    group: Group
    payload: int = -1


class WorldObserver:
    """Hooks the world calls as things happen; override the ones you need (all no-ops here).

    Observers read what the hooks pass and public world state (``world.env.now``,
    ``world.ledger``); they must not change the world. :mod:`p2pdp.records` builds the
    ``releases`` table on them.
    """

    def group_started(self, world: World, group: Group) -> None:
        """A group's members were told to submit (or, decentralised, agreed to)."""

    def released(self, world: World, group: Group, record: ReleaseRecord) -> None:
        """The group's noisy aggregate was released and its members charged."""

    def released_many(
        self,
        world: World,
        times: list[float],
        group_ids: list[int],
        curators: list[int],
        records: list[ReleaseRecord],
    ) -> None:
        """Releases told after the fact, in release order: what :meth:`released` would do at
        each (``times`` being what ``world.env.now`` read then).

        Override it only where :meth:`released` reads nothing but the clock, the group's
        ``group_id`` and ``curator`` and the record (not the ledger). The central sampler's
        batched driver (:func:`p2pdp.sim.waves.run_waves`) then calls it, for chunks of
        releases, instead of :meth:`released`, when no observer overrides
        :meth:`group_started` and every one overriding :meth:`released` overrides this too
        (it skips the per-release work nobody reads at once: noise, records, ledger writes).
        """
        raise NotImplementedError  # never called where not overridden

    def aborted(self, world: World, group: Group, reason: str) -> None:
        """The group ended without a release (nobody charged)."""

    def message_lost(self, world: World, sender: int) -> None:
        """A message from ``sender`` (-1: the central sampler) was lost or hit an offline peer."""

    def peer_offline(self, world: World, peer: int) -> None:
        """``peer`` left the network (churn or crash)."""

    def peer_online(self, world: World, peer: int) -> None:
        """``peer`` came back."""


def _overriding(observers: Sequence[WorldObserver], *hooks: str) -> tuple[WorldObserver, ...]:
    """The observers whose class overrides one of ``hooks`` (the others would do nothing)."""
    return tuple(
        observer
        for observer in observers
        if any(getattr(type(observer), hook) is not getattr(WorldObserver, hook) for hook in hooks)
    )


class Peer:
    """A peer: reacts to the messages delivered to it.

    A message is handled when its delivery event fires (:meth:`receive`, an actor served by
    the event loop) rather than through a :class:`simpy.Store` and a waiting process; messages
    arriving at one instant share their event (:meth:`Transport.send
    <p2pdp.sim.transport.Transport.send>`).
    The peer's model and shard size are row ``peer_id`` of the world's arrays, its budget row
    ``peer_id`` of the shared, vectorised :class:`BudgetLedger`, and its ensemble the world's
    receipt log. A peer with simulated training time runs a SimPy process that makes it
    available to the group sampler only when its training is done.
    """

    __slots__ = ("peer_id", "world")

    def __init__(self, world: World, peer_id: int, ready_at: float) -> None:
        self.world = world
        self.peer_id = peer_id
        if ready_at > 0:
            world.env.process(self.train(ready_at))

    def train(self, seconds: float):
        yield self.world.env.timeout(seconds)  # simulated local training
        self.world.sampler.peer_ready(self.peer_id)

    def receive(self, message: Message) -> None:
        world = self.world
        kind, group = message.kind, message.group
        if not world.online[self.peer_id]:  # arrived while this peer was offline
            world.transport.lose(message.sender)
        elif kind == PUBLISH:
            world.member.publication(self.peer_id, group.group_id, message.sender)
            world.receipts.append((self.peer_id, message.payload))
        elif kind == ASSIGN:
            world.submit(self.peer_id, group)
        elif group.ended:  # the group already timed out: the curator dropped it
            return
        elif kind == SHARE:
            world.step(group, world.member.share(self.peer_id, group, message.sender))
        else:  # SUBMIT, PARTIAL: the curator's
            sender = message.sender
            world.carry_out(
                world.curator.receive(kind, group.group_id, sender, int(world.shard_sizes[sender]))
            )


class CompletionMonitor:
    """The seed's CompletionAgent: counts published aggregations and records the end."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.aggregations = 0
        self.aborted = 0
        self.end_time = 0.0
        self.stop_reason = ""
        world.env.process(self.run())

    def notify(self, *, published: bool) -> None:
        if published:
            self.aggregations += 1
        else:
            self.aborted += 1

    def run(self):
        self.stop_reason = yield self.world.sampler.done
        self.end_time = float(self.world.env.now)


class World:
    """One simulated network: the environment, transport, peers, sampler, ledger and logs.

    Parameters
    ----------
    config : ScenarioConfig
    statistics : (P, d) or (P, R, d) array
        Each peer's local statistic (for the logistic task: its exact local model, trained
        before the simulation starts). (P, R, d): a fresh statistic per release, peer ``j``
        submits ``statistics[j, r]`` to its ``r``-th release (``r`` = releases it has joined);
        required by a mechanism that ``needs_records`` (a private posterior sample per
        release), refused otherwise.
    shard_sizes : (P,) int array
        Records each peer holds (public inside a group: sensitivities depend on them).
    releaser : Releaser
        The one release path (mechanism, aggregate, plaintext or secure).
    sensitivity : callable
        ``sensitivity(sizes) -> float``: L2 sensitivity of the aggregate of a group whose
        members hold ``sizes`` records (the task's :meth:`~p2pdp.tasks.Task.sensitivity`).
    rngs : dict
        Generators ``"protocol"`` (sampling, curator choice) and ``"network"`` (latency, loss).
    observers : sequence of WorldObserver
        Told of every group, release, abort, lost message and churn event.
    driver : "auto", "reference" or "batched"
        How :meth:`run` advances the protocol: ``"reference"`` event by event in SimPy,
        ``"batched"`` without messages (:mod:`p2pdp.sim.waves`: wave by wave in arrays under
        the central sampler, one event per batch of groups started at one instant under
        gossip forming its groups in rounds; same outputs, refused where it does not apply),
        ``"auto"`` batched where it applies. :attr:`batched` says which one runs.
    """

    def __init__(
        self,
        config: ScenarioConfig,
        statistics: np.ndarray,
        shard_sizes: np.ndarray,
        *,
        releaser: Releaser,
        sensitivity: Callable[[list[int]], float],
        rngs: dict[str, np.random.Generator],
        observers: Sequence[WorldObserver] = (),
        driver: str = "auto",
    ) -> None:
        OneOf(DRIVERS).check("driver", driver)
        self.config = config
        # Counting events costs a little per event; it pays only where messages can coalesce.
        self.env = Environment() if config.network.latency == "constant" else simpy.Environment()
        self.statistics = statistics
        self.shard_sizes = np.asarray(shard_sizes, dtype=np.int64)
        n_peers, dim = statistics.shape[0], statistics.shape[-1]
        per_release = statistics.ndim == 3
        if per_release != bool(getattr(releaser.mechanism, "needs_records", False)):
            raise ConfigError(
                f"privacy.mechanism = {releaser.name!r} "
                + (
                    "needs a fresh statistic per peer and release drawn from the peer's "
                    f"records ((P, R, d)); the task {config.task.name!r} gives shape "
                    f"{statistics.shape}"
                    if not per_release
                    else f"takes one statistic per peer ((P, d)), got shape {statistics.shape}"
                )
            )
        self.releaser = releaser
        self.sensitivity = sensitivity
        self.observers = tuple(observers)
        self.dim = dim
        self.model_bytes = model_bytes(dim)
        self.ledger = budget_ledger(config, releaser, n_peers)
        self.transport = Transport(self.env, config.network, n_peers, rng=rngs["network"])
        # Per-message and per-peer hooks are called only on observers that override them,
        # so an observer of releases costs nothing when messages are lost or peers churn.
        self._lost_observers = _overriding(self.observers, "message_lost")
        self._churn_observers = _overriding(self.observers, "peer_offline", "peer_online")
        # Whether every observer can be told of releases after the fact (run_waves): none
        # overrides group_started, and each one overriding released overrides released_many.
        told = {id(observer) for observer in _overriding(self.observers, "released_many")}
        self.told_after = not _overriding(self.observers, "group_started") and all(
            id(observer) in told for observer in _overriding(self.observers, "released")
        )
        if self._lost_observers:
            self.transport.on_lost = self.notify_lost
        self.online = np.ones(n_peers, dtype=bool)  # a group sampler with churn updates it
        self.sampler = make_sampler(self, rng=rngs["protocol"])
        # No message is lost and no peer goes offline (the sampler says it models no faults):
        # every group completes, so the curators need no collection timeout.
        self._reliable = config.network.loss == 0 and getattr(self.sampler, "faults", True) is False
        self._check_groups = not is_builtin(self.sampler)
        self.monitor = CompletionMonitor(self)
        self.groups: dict[int, Group] = {}
        # the parties' machines (p2pdp.protocols.oneshot): the world runs every peer
        full = config.publication.mode == "full"
        self.member = Member(self.shard_sizes.tolist(), everyone=full)
        self.curator = Curator(everyone=full)
        # what the run keeps per release, as arrays (p2pdp.core.columns): no object per release
        self.published = Rows((dim,), np.float64)  # (K, d): one array every receiver shares
        self.releases = ReleaseTable()
        self.shared = Rows((), bool)
        self.release_members = Ragged()  # members behind each release (public)
        self.receipts = Rows((2,), np.int64)  # (peer, release) beyond the shared ones
        self._next_group = 0
        obstacle = "" if driver == "reference" else batched_obstacle(self)
        if driver == "batched" and obstacle:
            raise ConfigError(f"driver = 'batched' does not apply to this run: {obstacle}")
        self.batched = not obstacle and driver != "reference"
        # a decentralised sampler's groups, batched per instant (the central one: run_waves)
        central = type(self.sampler) is CentralSampler
        self._batches = GroupBatches(self) if self.batched and not central else None
        ready_at = self.shard_sizes * config.training.seconds_per_row
        # the receivers of messages: the batched driver sends none
        self.peers = (
            [] if self.batched else [Peer(self, j, float(ready_at[j])) for j in range(n_peers)]
        )
        ready = np.flatnonzero(ready_at <= 0).tolist() if self.ledger.max_aggregations else []
        self.sampler.start(ready, int(np.count_nonzero(ready_at > 0)))

    # -- observers ---------------------------------------------------------------------------
    def notify_lost(self, sender: int) -> None:
        for observer in self._lost_observers:
            observer.message_lost(self, sender)

    def set_online(self, peers: np.ndarray, online: bool) -> None:
        """Mark ``peers`` online or offline (churn, crashes) and tell the observers."""
        self.online[peers] = online
        for observer in self._churn_observers:
            for peer in np.atleast_1d(peers).tolist():
                (observer.peer_online if online else observer.peer_offline)(self, peer)

    # -- group lifecycle --------------------------------------------------------------------
    def start_groups(self, groups: np.ndarray, curators: np.ndarray) -> None:
        """:meth:`start_group` with ``announce=False`` of each of ``groups`` ((k, g) members,
        agreed on) led by ``curators`` ((k,)), in order; batched at once where no observer
        must see each start (:meth:`GroupBatches.start_many
        <p2pdp.sim.group_batches.GroupBatches.start_many>`)."""
        if self._batches is not None and not self._check_groups and self.told_after:
            self._batches.start_many(groups, curators)
            return
        for members, curator in zip(groups, curators.tolist(), strict=True):
            self.start_group(members, curator, announce=False)

    def start_group(self, members: np.ndarray, curator: int, *, announce: bool = True) -> Group:
        """Start an aggregation of ``members`` led by ``curator``.

        ``announce``: the central sampler tells every member its group with an ``ASSIGN``
        message; a decentralised protocol whose members already agreed passes False and the
        members submit at once.
        """
        if self._check_groups:
            members = self._checked_group(members, curator)
        if self._batches is not None:  # agreed groups on a fault-free world: batched
            assert not announce  # only the central sampler announces (it runs run_waves)
            return self._batches.start(members, curator)
        group = Group(
            self._next_group,
            members,
            curator,
            secure=self.config.privacy.secure_aggregation,
            started=self.env.now,
        )
        self._next_group += 1
        self.groups[group.group_id] = group
        for observer in self.observers:
            observer.group_started(self, group)
        if announce:
            self.step(group, Step(group.assignments(), False))
        else:
            for member in members.tolist():
                self.submit(member, group)
        # The curator collects it (the simulator's peers are in one group at a time: only
        # the curator's part does anything); its timer, unless every group completes.
        timeout = None if self._reliable else self.config.groups.collect_timeout
        self.carry_out(self.curator.joined(curator, group, timeout))
        return group

    def _checked_group(self, members: np.ndarray, curator: int) -> np.ndarray:
        """The sampler's group as an int array, if its members are distinct peers and the
        curator one of them; else a ComponentError naming the sampler. (Python sets, not
        numpy: a group is small, and this runs once per group.)"""
        array = np.asarray(members)
        ids = array.tolist() if array.ndim == 1 and array.dtype.kind in "iu" else None
        distinct = set(ids) if ids else set()
        if (
            not ids
            or len(distinct) != len(ids)
            or curator not in distinct
            or min(ids) < 0
            or max(ids) >= self.online.size
        ):
            raise problem(
                "sampler",
                self.sampler,
                "start_group",
                f"formed the group {array.tolist()!r} with curator {curator!r}: a group is "
                f"distinct peer ids in [0, {self.online.size}) that include its curator",
            )
        return array

    def submit(self, member: int, group: Group) -> None:
        """``member`` joins ``group`` and contributes: its statistic to the curator, or (secure
        aggregation) one additive share of its noisy, fixed-point encoded contribution to
        every other member (:mod:`p2pdp.privacy.secure_aggregation`). An offline (crashed)
        member sends nothing. (A late ``ASSIGN`` of a group already over is answered, as the
        simulator's trusted sampler sent it: :meth:`~p2pdp.protocols.oneshot.Member.join`,
        not :meth:`~p2pdp.protocols.oneshot.Member.assign`.)"""
        if self.online[member]:
            self.member.join(member, group)
            self.step(group, self.member.contribute(member, group))

    def step(self, group: Group, step: Step) -> None:
        """Send the messages a party's machine decided, in order, through the transport; if
        the curator now holds every contribution, it collects (next event at this instant)."""
        send, peers = self.transport.send, self.peers
        message = None  # one Message per run of (kind, sender): receivers never change it
        for kind, sender, receiver in step.sends:
            if message is None or message.kind != kind or message.sender != sender:
                message = Message(kind, sender, group)
                n_bytes = self.model_bytes if kind in CARRIES_MODEL else HEADER_BYTES
            send(sender, peers[receiver].receive, message, n_bytes, coalesce=True)
        if step.ready:
            self.carry_out((Collect(group),))

    def carry_out(self, effects: Sequence[object]) -> None:
        """Carry out a machine's effects (:mod:`p2pdp.protocols.oneshot`), in order, with what
        the world owns: its clock (timers, collections: SimPy events), the budget ledger
        (charges), the release path (releases) and the transport (publications)."""
        released = None
        for effect in effects:
            if isinstance(effect, Collect):
                event = self.env.timeout(0)  # where SimPy would have collected it
                event.callbacks.append(functools.partial(self._collected, effect.group))
            elif isinstance(effect, Timer):
                event = self.env.timeout(effect.after)
                event.callbacks.append(functools.partial(self._timed_out, effect.group))
            elif isinstance(effect, Charge):
                # all or nothing: a member that cannot afford it stops the run, no noise drawn
                self.ledger.spend(effect.members)
            elif isinstance(effect, Release):
                released = self._release(effect.group)
            elif isinstance(effect, Publish):
                assert released is not None  # a Release comes first
                self.publish(effect.group, released)
                self.finish_group(effect.group, published=True)
            elif isinstance(effect, Abort):
                self.abort(effect.group, effect.reason)
            else:
                raise TypeError(f"the world carries out no {effect!r}")

    def _release(self, group: Group) -> np.ndarray:
        """Release ``group`` (charged already): the noisy aggregate, logged and observed."""
        released, record = self.release(group)
        self.releases.append(record)
        self.release_members.append(group.members)
        for observer in self.observers:
            observer.released(self, group, record)
        return released

    def release(self, group: Group) -> tuple[np.ndarray, ReleaseRecord]:
        """The group's noisy aggregate through the one release path."""
        sensitivity = self.sensitivity(group.sizes)
        curator = group.submitted.index(group.curator)
        rows = np.array(group.submitted)  # an index array is faster than a list here
        if self.statistics.ndim == 3:  # each member's statistic for this release: the
            # ledger already counts it, so its index among the member's releases is count - 1
            statistics = self.statistics[rows, self.ledger.aggregations(rows) - 1]
        else:
            statistics = self.statistics[rows]
        return self.releaser.release(
            statistics,
            group.sizes,
            sensitivity,
            curator=curator,
            group=group.group_id,
            members=group.submitted,
        )

    def publish(self, group: Group, model: np.ndarray) -> None:
        """Release ``model`` to the group or to everyone (post-processing: no budget)."""
        index = len(self.published)
        self.published.append(model)
        if self.config.publication.mode == "full":
            everyone = bool(self.online.all())
            recipients = [] if everyone else np.flatnonzero(self.online).tolist()
            self.shared.append(everyone)

            def deliver() -> None:  # offline peers miss a broadcast
                self.receipts.extend([(peer, index) for peer in recipients])

            n_recipients = len(self.peers) if everyone else len(recipients)
            self.transport.broadcast(group.curator, n_recipients - 1, self.model_bytes, deliver)
            return
        self.shared.append(False)
        self.receipts.append((group.curator, index))  # the curator already holds the model
        message = Message(PUBLISH, group.curator, group, index)  # the same for every member
        for _, sender, receiver in group.publications():
            self.transport.send(
                sender, self.peers[receiver].receive, message, self.model_bytes, coalesce=True
            )

    def collected(self, group: Group) -> None:
        """The seed's Algorithm 1 at the curator, once every member's statistic arrived
        (:meth:`Curator.collect <p2pdp.protocols.oneshot.Curator.collect>` decides)."""
        self.carry_out(self.curator.collect(group, online=bool(self.online[group.curator])))

    def timed_out(self, group: Group) -> None:
        """``collect_timeout`` passed (:meth:`Curator.timer
        <p2pdp.protocols.oneshot.Curator.timer>`: aborted unless it was collected)."""
        self.carry_out(self.curator.timer(group))

    def _collected(self, group: Group, _: object) -> None:
        self.collected(group)

    def _timed_out(self, group: Group, _: object) -> None:
        self.timed_out(group)

    def abort(self, group: Group, reason: str) -> None:
        """End ``group`` without a release: nothing released, nobody charged."""
        for observer in self.observers:
            observer.aborted(self, group, reason)
        self.finish_group(group, published=False)

    def finish_group(self, group: Group, *, published: bool) -> None:
        del self.groups[group.group_id]
        self.monitor.notify(published=published)
        self.sampler.group_finished(group, published=published)

    def run(self) -> None:
        """Run until no group can form and every message in flight has been delivered."""
        if self._batches is not None:
            with self._batches.running():  # its releases made by chunks, beside the clock
                self.env.run()
        elif self.batched:
            run_waves(self)
        else:
            self.env.run()


def budget_ledger(config: ScenarioConfig, releaser: Releaser, n_peers: int) -> BudgetLedger:
    """Every peer's budget for a run of ``config`` whose releases go through ``releaser``."""
    privacy = config.privacy
    assert privacy.delta_per_aggregation is not None  # PrivacyConfig derives it if not given
    return BudgetLedger(
        n_peers,
        epsilon_total=privacy.epsilon,
        epsilon_per_aggregation=privacy.step_epsilon,
        delta_total=privacy.delta,
        delta_per_aggregation=privacy.delta_per_aggregation,
        accountant=make_accountant(privacy.resolved_accountant),
        event=releaser.mechanism.budget_event(releaser.dim),
    )


def make_sampler(world: World, *, rng: np.random.Generator) -> GroupSampler:
    """The group sampler ``world.config.groups.sampler`` names (a built-in or an import string).

    Built-ins resolve lazily through the registry (gossip imports networkx only when used).
    """
    from p2pdp.core.components import resolve

    factory = resolve("sampler", world.config.groups.sampler, key="groups.sampler")
    with calling("sampler", factory, "__init__"):
        sampler = factory(world, rng=rng)
    check_methods(sampler, "sampler", SAMPLER_METHODS, "p2pdp.sim.sampler.GroupSampler")
    return sampler


#: What the world calls on a sampler (see :class:`~p2pdp.sim.sampler.GroupSampler`).
SAMPLER_METHODS = ("start", "peer_ready", "group_finished")
