"""The batched drivers of the one-shot protocol: whole waves (or batches) of groups at a time.

Where no message can be lost, delayed at random or sent to an offline peer, the per-message
SimPy world (:class:`p2pdp.sim.world.World`) runs like clockwork: under the central sampler
(:class:`~p2pdp.sim.central.CentralSampler`), a constant latency ``L`` and a bandwidth ``B``,
every peer ready at time 0 and plaintext aggregation, the sampler starts a *wave* of
``k = min(max_concurrent_groups, len(pool) // g)`` groups at an instant ``T``, every
``ASSIGN`` (header, ``H`` bytes) reaches its member at ``T + (L + H/B)``, every ``SUBMIT``
(a model, ``M`` bytes) reaches its curator ``L + M/B`` later (a group of one is ready on its
``ASSIGN``), the curators collect, charge, release and publish in the order the groups were
drawn, and only then does the sampler wake, take the solvent members back (in that order)
and draw the next wave at the collection instant. :func:`run_waves` computes exactly that,
wave by wave, without an event or a message object:

- the groups and curators come from the sampler's own :class:`~p2pdp.protocols.groups.GroupPool`
  (same protocol stream, same order of draws);
- each group is a :class:`~p2pdp.protocols.groups.Group` whose curator holds its own statistic
  first and the other members' in member order (the order their ``SUBMIT`` arrive);
- each curator charges its members (:class:`DrawnCharges`, the
  ledger's counts as a Python list, written to the ledger before anyone can read it: the
  pool holds distinct solvent ids, so only the budget is checked, and a broke member is
  still refused, all or nothing; the members still solvent go back to the pool at the wave's
  end, in draw order), then draws its noise from the run's stream through the one release
  path (:class:`~p2pdp.privacy.release.Releaser`'s noise stream and record, in release
  order: the same draws from the same generator), so the budget is charged before any
  noise is drawn; the sensitivity, a function of the members' sizes, is asked once per
  distinct sizes; where every wave is one group (``max_concurrent_groups = 1``) and the
  releases are made by chunks (below), the pool draws and charges up to a chunk of such
  waves in one call (:meth:`GroupPool.draw_in_turn
  <p2pdp.protocols.groups.GroupPool.draw_in_turn>`: the same draws, without a call per
  wave);
- the observers see ``group_started`` for every group of the wave at ``T`` and ``released``
  for each at the collection instant, in the same order and with the same ledger state as in
  the SimPy world (``world.env.now`` reads the wave's instant). Where every observer can be
  told of the releases after the fact (``world.told_after``: none overrides
  ``group_started``, and each one overriding ``released`` overrides :meth:`released_many
  <p2pdp.sim.world.WorldObserver.released_many>`, as the release log does), the driver
  draws the groups and charges their members, and the rest (sensitivities, noise, records,
  ``released_many``) is done ``RELEASE_CHUNK`` releases at a time, with the same draws in the same
  order; with two or more local workers, in one forked process beside the draws of the next
  groups (:func:`~p2pdp.core.parallel.forked_worker`; its copy of the noise stream draws
  what this one would, and this one is moved to where it stopped);
- the exact aggregates (the only heavy arithmetic) are summed for many groups at once, in the
  same order per group (the curator's row, then the members'), and published with the noise,
  so ``world.published``, ``shared``, ``receipts`` and ``release_members`` grow by chunks
  (observers read what their hooks pass, the clock and the ledger:
  :class:`~p2pdp.sim.world.WorldObserver`);
- receipts, message and byte counters, ``sim_time`` and the stop reason are what the
  transport and completion monitor would have recorded (a ``PUBLISH`` of one wave reaches its
  members before the next wave's curators collect).

The gossip sampler forming its groups in rounds (:mod:`p2pdp.sim.gossip.rounds`: no loss, no
churn, no crash) decides itself when groups start, so it keeps the SimPy clock; on the same
fault-free worlds its groups skip their messages instead
(:class:`~p2pdp.sim.group_batches.GroupBatches`: one event per batch of groups started at one
instant, the collections in the SimPy world's order), and makes their releases through the
same chunks (:class:`_Pending`, :func:`_released`: with two or more local workers, in one
forked process beside the clock).

Every other configuration (message loss, random latencies, churn, gossip formation per
message, a sampler of your own, simulated training time, secure aggregation, a mechanism
that defines its own release or a per-release statistic, an aggregate other than mean or
sum) runs on the per-message SimPy world, which stays the reference: ``tests/sim/test_waves.py``
runs both on worlds where both apply and compares every output.
"""

from __future__ import annotations

import contextlib
import gc
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from p2pdp.core.columns import Ragged, Rows
from p2pdp.core.parallel import current_workers, forked_worker, shared_empty
from p2pdp.privacy.accounting import BudgetLedger
from p2pdp.privacy.release import LINEAR_AGGREGATES
from p2pdp.protocols.groups import HEADER_BYTES, Group
from p2pdp.protocols.oneshot import Curator, Sampler
from p2pdp.sim.central import CentralSampler
from p2pdp.sim.sampler import SamplerWorld

if TYPE_CHECKING:
    from p2pdp.privacy.release import Releaser, ReleaseRecord, ReleaseTable
    from p2pdp.sim.sampler import GroupSampler

__all__ = [
    "DRIVERS",
    "RELEASE_CHUNK",
    "BatchedWorld",
    "DrawnCharges",
    "batched_obstacle",
    "frozen_heap",
    "run_waves",
]

#: How a one-shot simulation is driven: ``"auto"`` (batched where :func:`batched_obstacle`
#: finds nothing in the way, else the SimPy world), ``"reference"`` (always the SimPy world),
#: ``"batched"`` (refused where it does not apply).
DRIVERS = ("auto", "reference", "batched")

#: Releases published at a time, by both batched drivers (central waves here, gossip groups
#: formed in rounds: :mod:`p2pdp.sim.group_batches`, which reads it here at each call, so one
#: patch of it reaches both): their exact aggregates are summed in one array operation (the
#: (n, g, d) gather stays a few MB) and what the driver holds for them is freed.
RELEASE_CHUNK = 1024


class _Monitor(Protocol):
    """What the batched drivers record in the world's completion monitor
    (:class:`~p2pdp.sim.world.CompletionMonitor`)."""

    aggregations: int
    stop_reason: str
    end_time: float

    def notify(self, *, published: bool) -> None: ...


class _Observer(Protocol):
    """The hooks of a :class:`~p2pdp.sim.world.WorldObserver` the batched drivers call."""

    def group_started(self, world: Any, group: Group) -> None: ...

    def released(self, world: Any, group: Group, record: ReleaseRecord) -> None: ...

    def released_many(
        self,
        world: Any,
        times: list[float],
        group_ids: list[int],
        curators: list[int],
        records: list[ReleaseRecord],
    ) -> None: ...


class BatchedWorld(SamplerWorld, Protocol):
    """What the batched drivers read and write on the world (:class:`~p2pdp.sim.world.World`
    is one): its sampler's seam, plus the run's inputs (statistics, shard sizes, release
    path, sensitivity), the logs they append to and the world's count of groups started.

    The world imports this module, which never imports the world (``lint-imports`` refuses
    an import cycle, even one made of imports for typing only).
    """

    sampler: GroupSampler
    curator: Curator
    releaser: Releaser
    sensitivity: Callable[[list[int]], float]
    statistics: np.ndarray
    shard_sizes: np.ndarray
    model_bytes: int
    told_after: bool
    groups: dict[int, Group]
    published: Rows  # (K, d) float64
    releases: ReleaseTable
    shared: Rows  # (K,) bool
    release_members: Ragged
    receipts: Rows  # (R, 2) int64
    _next_group: int

    @property
    def monitor(self) -> _Monitor: ...

    @property
    def observers(self) -> tuple[_Observer, ...]: ...


def batched_obstacle(world: BatchedWorld) -> str:
    """Why :func:`run_waves` cannot drive ``world`` (a setting and its value), or ``""``.

    Called once the world's sampler, ledger and releaser exist and before it runs.
    """
    config = world.config
    network = config.network
    releaser = world.releaser
    if type(world.sampler) is not CentralSampler and not _formed_in_rounds(world):
        return (
            f"groups.sampler = {config.groups.sampler!r} (only 'central' and 'gossip' forming "
            f"its groups in rounds are batched; gossip.formation = {config.gossip.formation!r})"
        )
    if network.latency != "constant":
        return f"network.latency = {network.latency!r} (only 'constant' is batched)"
    if network.loss != 0:
        return f"network.loss = {network.loss!r} (only a loss-free network is batched)"
    if config.privacy.secure_aggregation:
        return "privacy.secure_aggregation = True (its share rounds are simulated per message)"
    if (world.shard_sizes * config.training.seconds_per_row > 0).any():  # World's ready_at
        return (
            f"training.seconds_per_row = {config.training.seconds_per_row!r} (peers become "
            "ready at different instants)"
        )
    if not getattr(releaser.mechanism, "additive", True):
        return f"privacy.mechanism = {releaser.name!r} (it defines its own release)"
    if world.statistics.ndim != 2:
        return f"privacy.mechanism = {releaser.name!r} (a fresh statistic per release)"
    if releaser.aggregate not in LINEAR_AGGREGATES:
        return f"the task's aggregate {releaser.aggregate!r} (only mean and sum are batched)"
    return ""


class DrawnCharges:
    """:meth:`BudgetLedger.spend` for a long run of small groups a driver draws from its pool
    of solvent peers (:func:`run_waves`): the ledger's counts held as a Python list, several
    times cheaper per member than the ledger's array.

    The ids of a group are distinct ids in [0, P) by construction, so only the budget is
    checked (a broke member is refused, all or nothing, as by :meth:`BudgetLedger.spend`).
    The ledger changes only on :meth:`write`: call it before anyone may read the ledger.

    Parameters
    ----------
    ledger : BudgetLedger
        Its counts as they stand now; nothing else may charge it until the last
        :meth:`write`.
    """

    __slots__ = ("_ledger", "_most", "counts")

    def __init__(self, ledger: BudgetLedger) -> None:
        self._ledger = ledger
        self._most = ledger.max_aggregations
        self.counts: list[int] = ledger.aggregations().tolist()

    def spend(self, ids: list[int]) -> list[int]:
        """Charge ``ids`` one aggregation each; returns those that can afford another after
        it (back to the pool), in the order of ``ids``."""
        counts, most = self.counts, self._most
        after = [counts[peer] + 1 for peer in ids]
        if max(after) > most:
            before = np.array(after, dtype=np.int64) - 1
            self._ledger.refuse_broke(np.array(ids, dtype=np.int64), before)
        for peer, count in zip(ids, after, strict=True):
            counts[peer] = count
        return [peer for peer, count in zip(ids, after, strict=True) if count < most]

    def write(self, ids: list[int] | None = None) -> None:
        """Bring the ledger up to date: the counts of ``ids``, or of every peer."""
        counts = self.counts
        if ids is None:
            self._ledger.write_counts(counts)
        else:
            self._ledger.write_counts([counts[peer] for peer in ids], ids)


def run_waves(world: BatchedWorld) -> None:
    """Run ``world`` to its end wave by wave (see the module docstring); it must be a world
    :func:`batched_obstacle` accepts, built and not yet run.

    Leaves the world as :meth:`World.run <p2pdp.sim.world.World.run>` would: ``published``,
    ``shared``, ``releases``, ``release_members``, ``receipts``, the ledger, the transport's
    counters, the monitor's ``aggregations``, ``end_time`` and ``stop_reason`` and the
    sampler's pool and state. ``world.env.now`` ends at the last collection (the SimPy world
    also runs the last wave's publication messages).

    Where an observer must see each event as it happens (not ``world.told_after``), each group and
    release is made for it in turn, the ledger written as it goes. Else the driver only draws
    the groups and charges their members (:class:`DrawnCharges`),
    and each chunk of ``RELEASE_CHUNK`` releases is made at once (:class:`_Releases`: sensitivities,
    noise, aggregates, then records and the observers' ``released_many``), with local workers
    (:func:`~p2pdp.core.parallel.current_workers` > 1) in a forked process while the driver
    draws on (:func:`~p2pdp.core.parallel.forked_worker`).
    """
    config = world.config
    env, releaser = world.env, world.releaser
    sampler, monitor, observers = world.sampler, world.monitor, world.observers
    assert isinstance(sampler, CentralSampler)  # batched_obstacle says so
    machine, curator = sampler.machine, world.curator  # the decisions (protocols.oneshot)
    pool = machine.pool
    g = config.groups.group_size
    limit = config.groups.max_concurrent_groups
    latency, bandwidth = config.network.latency_mean, config.network.bandwidth
    assign_delay = latency + HEADER_BYTES / bandwidth  # Transport.delay of one ASSIGN
    submit_delay = latency + world.model_bytes / bandwidth  # ... and of one SUBMIT
    charges = DrawnCharges(world.ledger)  # the pool holds distinct solvent ids
    spend, most = charges.spend, world.ledger.max_aggregations
    per_event = not world.told_after
    capacity = RELEASE_CHUNK - 1 + min(limit, len(pool) // g)  # releases published at once, at most
    releases = _Releases(world, deferred=not per_event, capacity=max(capacity, 1))
    _reserve(world, len(pool) * most // max(g, 1))
    with (
        frozen_heap(),
        forked_worker(_released, releases, workers=current_workers()) as submit,
    ):
        pending = _Pending(submit, releases, len(world.releases))  # published by chunks
        members_, curators_ = pending.members, pending.curators
        now = env.now  # 0: every peer is ready at the start
        in_turn = limit == 1 and not per_event  # waves of one group, drawn and charged in turn
        if in_turn:
            delays = (assign_delay, submit_delay)
            now = _waves_in_turn(world, machine, pending, charges, g=g, delays=delays)
        while not in_turn:
            k = machine.wave_size()  # the groups the sampler starts now
            if k == 0:
                break
            env._now = now  # what observers read as world.env.now (simpy keeps it there)
            drawn, curators = pool.draw_many(g, k)
            first = world._next_group
            world._next_group += k
            pending.group_ids.extend(range(first, first + k))
            if per_event:
                wave = [
                    Group(first + i, np.array(members, dtype=np.int64), curator, started=now)
                    for i, (members, curator) in enumerate(zip(drawn, curators, strict=True))
                ]
                for group in wave:
                    for observer in observers:
                        observer.group_started(world, group)
            now = now + assign_delay  # the members get their ASSIGN ...
            if g > 1:
                now = now + submit_delay  # ... and the curators every SUBMIT
            env._now = now
            flat = [member for members in drawn for member in members]
            charge = curator.wave(flat)  # charged before the noise is drawn
            solvent = spend(cast("list[int]", charge.members))  # may afford another, in order
            members_.extend(flat)
            if per_event:
                for group, members in zip(wave, drawn, strict=True):
                    charges.write(members)
                    pending.noises.append(releases.release(group, members))
            curators_.extend(curators)
            pending.waves.append(k)
            pending.times.append(float(now))
            monitor.aggregations += k
            machine.wave_finished(solvent)
            if len(curators_) >= RELEASE_CHUNK:
                pending.publish(world)

        charges.write()
        monitor.stop_reason = machine.stop().reason
        sampler.done.succeed(monitor.stop_reason)  # as the sampler would (nothing waits on it)
        monitor.end_time = now
        if curators_:
            pending.publish(world)
        pending.flush(world)
        if not per_event:  # the noise was drawn from the worker's copy of the stream
            releaser.noise.restore(submit(None)())


def _waves_in_turn(
    world: BatchedWorld,
    machine: Sampler,
    pending: _Pending,
    charges: DrawnCharges,
    *,
    g: int,
    delays: tuple[float, float],
) -> float:
    """:func:`run_waves` with one group at a time and no observer told as it goes: groups
    drawn and charged in turn, a chunk at most at once; returns the last collection's time."""
    env, pool, most = world.env, machine.pool, world.ledger.max_aggregations
    assign_delay, submit_delay = delays
    now = env.now  # 0: every peer is ready at the start
    while True:
        flat, curators = pool.draw_in_turn(
            g, RELEASE_CHUNK - len(pending.curators), charges.counts, most
        )
        k = len(curators)
        if k == 0:
            return now
        for _ in range(k):  # each wave's collection instant, as in run_waves' own waves
            now = now + assign_delay
            if g > 1:
                now = now + submit_delay
            pending.times.append(float(now))
        env._now = now
        pending.waves.extend([1] * k)
        pending.members.extend(flat)
        pending.curators.extend(curators)
        pending.group_ids.extend(range(world._next_group, world._next_group + k))
        world._next_group += k
        world.monitor.aggregations += k
        if len(pending.curators) >= RELEASE_CHUNK:
            pending.publish(world)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Inside the block, the garbage collector ignores the objects that exist on entry
    (:func:`gc.freeze`): a run's world, data and models live on, so no collection during the
    run traverses them (a third of the simulation at 10^5 peers), nor, in a forked worker, copies
    their pages."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _formed_in_rounds(world: BatchedWorld) -> bool:
    """Whether ``world``'s sampler is the gossip sampler forming its groups in rounds (a
    fault-free formation: :func:`~p2pdp.sim.gossip.rounds.uses_rounds`)."""
    if world.config.groups.sampler != "gossip":
        return False
    from p2pdp.sim.gossip.rounds import RoundFormation  # loaded: the sampler is built
    from p2pdp.sim.gossip.sampler import GossipSampler

    sampler = world.sampler
    return type(sampler) is GossipSampler and isinstance(sampler.formation, RoundFormation)


class _Sensitivities:
    """The sensitivity of a release as a function of its rows' shard sizes (``sensitivity``,
    a pure function of them), computed once per distinct sizes."""

    __slots__ = ("_known", "_of")

    def __init__(self, sensitivity: Callable[[list[int]], float]) -> None:
        self._of = sensitivity
        self._known: dict[tuple[int, ...], float] = {}

    def __call__(self, sizes: list[int]) -> float:
        key = tuple(sizes)
        scale = self._known.get(key)
        if scale is None:
            scale = self._known[key] = self._of(sizes)
        return scale


#: Chunks of releases that may be in the works at once (:class:`_Pending`).
_AHEAD = 3


class _Releases:
    """How a chunk of the central sampler's releases is made (:func:`_released`), in the
    driver's process or in one forked process (then on its copy of this object and of the
    run's noise stream, which draws the same vectors in the same order: one process makes
    every chunk, in order).

    ``deferred``: the chunks come without their noise (nobody has seen these releases yet):
    their sensitivities and noise are computed with their aggregates. Else :meth:`release`
    made each release as it happened (noise, record, observers).

    A chunk travels in one of ``_AHEAD + 1`` slots of shared memory
    (:func:`~p2pdp.core.parallel.shared_empty`) of ``capacity`` releases: its statistics
    rows ``index`` (slots, capacity, g) in, its ``published`` models (slots, capacity, d)
    out (in: its noise, if not deferred) and, deferred, each one's ``n_min``, ``scales`` and
    ``norms`` (:meth:`Releaser.records <p2pdp.privacy.release.Releaser.records>`) out.
    """

    def __init__(self, world: BatchedWorld, *, deferred: bool, capacity: int) -> None:
        self.world = world
        self.deferred = deferred
        self.statistics = world.statistics
        self.mean = world.releaser.aggregate == "mean"
        self.noise = world.releaser.noise
        self.shard_sizes = world.shard_sizes
        self._sizes = world.shard_sizes.tolist()
        #: the sensitivity of a release whose rows have these shard sizes
        self.scale = _Sensitivities(world.sensitivity)
        slots, g = _AHEAD + 1, world.config.groups.group_size
        self.index = shared_empty((slots, capacity, g), np.int64)
        self.published = shared_empty((slots, capacity, world.statistics.shape[-1]))
        self.n_min = shared_empty((slots, capacity), np.int64)
        self.scales = shared_empty((slots, capacity))
        self.norms = shared_empty((slots, capacity))

    def release(self, group: Group, members: list[int]) -> np.ndarray:
        """Make ``group``'s release now (its members, in member order, are charged): its rows
        and sizes, its noise, its record, the observers' ``released``; returns the noise."""
        world, g = self.world, len(members)
        curator = group.curator
        order = members if g == 1 else [curator, *[m for m in members if m != curator]]
        group.submitted, group.sizes = order, [self._sizes[m] for m in order]
        group.ended = True
        scale = self.scale(group.sizes)
        noise = self.noise.draw(scale)
        release = world.releaser.record(g, group.sizes, scale, math.sqrt(float(noise @ noise)))
        world.releases.append(release)
        for observer in world.observers:
            observer.released(world, group, release)
        return noise


def _released(releases: _Releases, chunk: tuple[int, int] | None) -> Any:
    """Make the ``chunk`` ``(slot, n)`` of ``n`` releases (see :class:`_Releases`): their
    exact aggregates (:func:`_exact`) plus their noise, drawn here if deferred. ``chunk``
    None: the noise stream's state (:meth:`~p2pdp.privacy.release.NoiseStream.state`)."""
    if chunk is None:
        return releases.noise.state()
    slot, n = chunk
    index, published = releases.index[slot, :n], releases.published[slot, :n]
    exact = _exact((releases.statistics, releases.mean), index)
    if not releases.deferred:
        published += exact  # the noise plus the exact aggregate: exact + noise, to the bit
        return None
    sizes = releases.shard_sizes[index]  # (n, g), in row order
    scales = [releases.scale(row) for row in sizes.tolist()]
    noise = releases.noise.draw_many(scales)
    np.add(exact, noise, out=published)
    releases.n_min[slot, :n] = sizes.min(axis=1)
    releases.scales[slot, :n] = scales
    releases.norms[slot, :n] = [math.sqrt(float(row @ row)) for row in noise]
    return None


@dataclass(slots=True)
class _Pending:
    """Releases made and not yet published, in release order (from the ``first``): their
    members (in member order, flat), curators, group ids and, made one by one, noise; each
    wave's (or batch's) number of groups and collection instant; and the chunks ``submit``
    (:func:`forked_worker <p2pdp.core.parallel.forked_worker>` of :func:`_released` on
    ``releases``) is making, with their slot and what their observers need.

    ``announced``: the central sampler's groups, whose ``ASSIGN`` s and receipts are counted
    and recorded at :meth:`publish`; a decentralised sampler's driver
    (:class:`~p2pdp.sim.group_batches.GroupBatches`) sends no ``ASSIGN`` and records its
    receipts at their instants."""

    submit: Callable[[Any], Callable[[], Any]]
    releases: _Releases
    first: int
    announced: bool = True
    members: list[int] = field(default_factory=list)
    curators: list[int] = field(default_factory=list)
    group_ids: list[int] = field(default_factory=list)
    noises: list[np.ndarray] = field(default_factory=list)
    waves: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    chunks: int = 0
    making: deque[tuple[Callable[[], Any], int, int, list[float], list[int], list[int]]] = field(
        default_factory=deque
    )

    def publish(self, world: BatchedWorld) -> None:
        """Send the pending releases to be made (:func:`_released`) and record who holds
        each: the messages counted (:func:`_count_messages`), the shared flags, the release
        members and the receipts; then forget them.

        Under group publication the curators keep their copy and the ``PUBLISH`` of one wave
        reaches the other members before the next wave's curators collect, so a wave's
        receipts are its curators' (in draw order) then its other members' (group by group,
        in member order), as in the SimPy world.
        """
        full = world.curator.everyone
        releases, n = self.releases, len(self.curators)
        members = np.array(self.members, dtype=np.int64).reshape(n, -1)  # (n, g)
        curators = np.array(self.curators, dtype=np.int64)
        g = members.shape[1]
        slot = self.chunks % (_AHEAD + 1)  # its last chunk was published (flush below)
        self.chunks += 1
        index = releases.index[slot, :n]
        if g == 1:
            index[:] = members
        else:  # the curator, then the other members in member order
            index[:, 0] = curators
            index[:, 1:] = members[members != curators[:, None]].reshape(n, g - 1)
        if self.noises:
            releases.published[slot, :n] = self.noises
        times = np.repeat(self.times, self.waves).tolist()
        made = self.submit((slot, n))
        self.making.append((made, slot, n, times, list(self.group_ids), list(self.curators)))
        first = self.first
        self.first += n
        _count_messages(world, index, full=full, assigned=self.announced)
        world.shared.extend([full] * n)
        world.release_members.extend(members)
        if self.announced and not full:
            wave = np.repeat(np.arange(len(self.waves)), self.waves)  # (n,)
            others = index[:, 1:].ravel()  # group by group, in member order
            peers = np.concatenate([index[:, 0], others])
            releases_ = np.concatenate([np.arange(n), np.repeat(np.arange(n), g - 1)])
            curator_first = np.concatenate([np.zeros(n, np.int8), np.ones(others.size, np.int8)])
            order = np.lexsort((curator_first, wave[releases_]))  # stable: keeps the draw order
            world.receipts.extend(np.stack([peers[order], releases_[order] + first], axis=1))
        for values in (
            self.members,
            self.curators,
            self.group_ids,
            self.noises,
            self.waves,
            self.times,
        ):
            values.clear()
        self.flush(world, _AHEAD)

    def flush(self, world: BatchedWorld, ahead: int = 0) -> None:
        """Publish the chunks being made, in order, until at most ``ahead`` are left (if
        deferred, their records and the observers' ``released_many`` too)."""
        releases = self.releases
        while len(self.making) > ahead:
            made, slot, n, times, group_ids, curators = self.making.popleft()
            made()
            world.published.extend(releases.published[slot, :n])  # copied into the store
            if releases.deferred:
                records = world.releaser.records(
                    releases.index.shape[2],
                    releases.n_min[slot, :n].tolist(),
                    releases.scales[slot, :n].tolist(),
                    releases.norms[slot, :n].tolist(),
                )
                world.releases.extend(records)
                for observer in world.observers:
                    observer.released_many(world, times, group_ids, curators, records)


#: Bytes of address space a run's per-release arrays may reserve up front, each (``_reserve``).
_RESERVE_BYTES = 2**33


def _reserve(world: BatchedWorld, most: int) -> None:
    """Reserve the world's per-release arrays for ``most`` releases (at most
    ``_RESERVE_BYTES`` each): the central sampler makes no more than ``P *
    max_aggregations // g`` releases (each charges ``g`` distinct peers one aggregation), so
    the published models (K, d) of ten million releases are written into one array without
    a copy as it grows. Untouched, a reserved row costs no resident memory."""
    if not most:
        return
    g = world.config.groups.group_size
    widest = 8 * max(world.statistics.shape[-1], g, 9)  # bytes: a model, members, a record
    rows = min(most, _RESERVE_BYTES // widest)
    world.published.reserve(rows)
    world.shared.reserve(rows)
    world.releases.reserve(rows)
    world.release_members.reserve(rows, rows * g)


def _exact(shared: tuple[np.ndarray, bool], index: np.ndarray) -> np.ndarray:
    """The exact aggregates of releases whose statistics rows (curator first) are ``index``
    (n, g), shape (n, d): summed over the same rows in the same order as :meth:`Releaser.exact
    <p2pdp.privacy.release.Releaser.exact>` (``shared``: the statistics (P, d) and whether
    the aggregate is the mean)."""
    statistics, mean = shared
    total = statistics[index].sum(axis=1)  # (n, g, d) -> (n, d), each group in order
    return total / index.shape[1] if mean else total


def _count_messages(world: BatchedWorld, index: np.ndarray, *, full: bool, assigned: bool) -> None:
    """Count the messages of the releases whose statistics rows (curator first) are
    ``index`` (n, g): one ``ASSIGN`` per member (from the central sampler; ``assigned``), one
    ``SUBMIT`` per other member and the curator's publication: ``g - 1`` messages, or one
    broadcast to the ``P - 1`` others."""
    n, g = index.shape
    transport = world.transport
    sent = transport.messages_sent
    np.add.at(sent, index[:, 1:].ravel(), 1)  # SUBMIT
    np.add.at(transport.bytes_sent, index[:, 1:].ravel(), world.model_bytes)
    published = (sent.size - 1) if full else g - 1  # messages per publication
    np.add.at(sent, index[:, 0], published)
    np.add.at(transport.bytes_sent, index[:, 0], published * world.model_bytes)
    if assigned:
        transport.control_messages += n * g
    if full:
        transport.broadcasts += n
