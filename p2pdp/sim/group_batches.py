"""Gossip groups formed in rounds, run in batches: the one-shot protocol of many groups at once.

Where every observer of a gossip run is told of releases after the fact (``world.told_after``),
a batch of groups formed in rounds skips the one-shot messages: its members are charged at once
(:meth:`p2pdp.protocols.oneshot.Curator.wave`, the decision of the protocol) and its releases
are made a chunk at a time by the central sampler's machinery (:func:`p2pdp.sim.waves.run_waves`'
chunks: with two or more local workers, in one forked process beside the clock), with the same
noise in the same order as the per-message world.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

import numpy as np

from p2pdp.core.parallel import current_workers, forked_worker
from p2pdp.protocols.groups import Group
from p2pdp.protocols.oneshot import Charge
from p2pdp.sim import waves
from p2pdp.sim.transport import Environment
from p2pdp.sim.waves import (
    BatchedWorld,
    _formed_in_rounds,
    _Pending,
    _released,
    _Releases,
    _reserve,
    frozen_heap,
)

if TYPE_CHECKING:
    from p2pdp.sim.gossip.sampler import GossipSampler


class _Batch:
    """Groups started one after another, with nothing scheduled in between, whose curators
    collect at the same instant ``at`` (``mark``: ``env.scheduled`` after its event)."""

    __slots__ = ("at", "groups", "mark")

    def __init__(self, at: float, mark: int) -> None:
        self.at = at
        self.mark = mark
        self.groups: list[Group] = []


class GroupBatches:
    """The batched driver of groups a decentralised sampler agreed on: per batch of one
    instant, not per message (the gossip sampler forming its groups in rounds).

    In the SimPy world such a group (:meth:`World.start_group
    <p2pdp.sim.world.World.start_group>` with ``announce=False``) costs a ``SUBMIT`` event per
    other member, the curator's collection event, and a ``PUBLISH`` event per other member.
    On a world :func:`batched_obstacle` accepts (constant latency ``L``, bandwidth ``B``, no
    loss, no churn or crash, no training time, plaintext), every ``SUBMIT`` of a group
    started at ``T`` reaches its curator at ``T + D`` (``D = L + M/B``; a group of one is ready
    at ``T``) and every ``PUBLISH`` of a release at ``C`` its member at ``C + D``. Groups
    started one after another at ``T`` with nothing scheduled in between (a tick's groups)
    therefore form a run of consecutive events at ``T + D`` in SimPy's queue, and their
    collections a run of consecutive events after them: :meth:`start` gives such a batch
    one event where the first ``SUBMIT`` would be, and that event collects the whole batch
    in order, at once when no other event shares its instant, else from one event scheduled
    then (where the first collection would be). Releases therefore happen in the SimPy
    world's order, ties included, and draw the same noise.

    Collecting a group does what :meth:`World.collected <p2pdp.sim.world.World.collected>`
    does, in the same order: charge the members (:meth:`BudgetLedger.spend
    <p2pdp.privacy.accounting.BudgetLedger.spend>`), draw the noise through the one release
    path (:class:`~p2pdp.privacy.release.Releaser`'s stream and record), log the release, tell
    the observers and publish; then the batch's groups end (:meth:`World.finish_group
    <p2pdp.sim.world.World.finish_group>`), the sampler taking their members back in one call
    (:meth:`GossipSampler.groups_finished
    <p2pdp.sim.gossip.sampler.GossipSampler.groups_finished>`: same state, same draws) at the
    instant they would be freed, after the batch's releases (an observer reading the
    formation's state, not the world's, during a batch's releases would see the difference).
    The exact aggregates are summed :data:`~p2pdp.sim.waves.RELEASE_CHUNK` releases at a time
    (:func:`~p2pdp.sim.waves._released`, same order per group as
    :meth:`Releaser.exact <p2pdp.privacy.release.Releaser.exact>`), with two or more local
    workers in one forked process while the clock runs on: run the world's clock inside
    :meth:`running`. Where every observer can be told of the releases after the
    fact (``world.told_after``, as in :func:`run_waves`), a batch's curators decide and charge
    its members at once (:meth:`Curator.wave <p2pdp.protocols.oneshot.Curator.wave>`: the
    batch's members are distinct, each in one group), and the rest of each release
    (sensitivity, noise, record, release log, ``released_many``) is made with its aggregate,
    ``RELEASE_CHUNK`` releases at a time, drawing the same noise in the same order
    (:meth:`NoiseStream.draw_many <p2pdp.privacy.release.NoiseStream.draw_many>`: nothing
    else draws from that stream meanwhile). Group publication appends the members' receipts from one
    event per batch at ``C + D``; a full publication reaches every peer (all online), which
    the SimPy world records as no receipt, so it schedules nothing. The transport's counters
    are those the messages would have added.
    """

    def __init__(self, world: BatchedWorld) -> None:
        config = world.config
        self.world = world
        assert isinstance(world.env, Environment)  # a constant latency (batched_obstacle)
        self.env = world.env  # it counts the events it schedules
        self.group_size = g = config.groups.group_size
        self.full = world.curator.everyone
        network = config.network
        # Transport.delay of one model-sized message (SUBMIT, PUBLISH)
        self.delay = float(network.latency_mean) + world.model_bytes / network.bandwidth
        self._collect_after = self.delay if g > 1 else 0.0  # a group of one is ready at once
        self._open: _Batch | None = None
        # told after the fact: a batch's members charged at once, its releases made by chunks
        self._deferred = world.told_after
        self._pending: _Pending | None = None  # while running()
        self._chunk = waves.RELEASE_CHUNK
        assert _formed_in_rounds(world)  # the one sampler batched here (batched_obstacle)
        self._finished = cast("GossipSampler", world.sampler).groups_finished
        # each release charges g distinct peers one aggregation: the release arrays are
        # written in place as they grow, as run_waves's are (not copied at each doubling)
        ledger = world.ledger
        _reserve(world, ledger.n_peers * ledger.max_aggregations // max(g, 1))

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Run the world's clock inside this block (``world.env.run()``): on entry, the
        releases' maker (:class:`~p2pdp.sim.waves._Releases`, ``RELEASE_CHUNK`` releases a
        chunk, read now) and, with local workers
        (:func:`~p2pdp.core.parallel.current_workers` > 1), the forked process that makes
        them while the clock runs on (:func:`~p2pdp.core.parallel.forked_worker`, as
        :func:`~p2pdp.sim.waves.run_waves`); on a normal exit, the last releases are
        published and the run's noise stream moved to where the worker's copy stopped."""
        world = self.world
        self._chunk = chunk = waves.RELEASE_CHUNK  # read at the call: one size, both drivers
        releases = _Releases(world, deferred=self._deferred, capacity=chunk)
        with (
            frozen_heap(),  # as run_waves: no collection traverses the world's objects
            forked_worker(_released, releases, workers=current_workers()) as submit,
        ):
            pending = _Pending(submit, releases, len(world.releases), announced=False)
            self._pending = pending
            yield
            if pending.curators:
                pending.publish(world)
            pending.flush(world)
            if self._deferred:  # the noise was drawn from the worker's copy of the stream
                world.releaser.noise.restore(submit(None)())
        self._pending = None

    def start(self, members: np.ndarray, curator: int) -> Group:
        """Start the group ``members`` (distinct ids, ``curator`` among them) agreed on."""
        world, env = self.world, self.env
        group = Group(world._next_group, members, curator, started=env.now)
        world._next_group += 1
        world.groups[group.group_id] = group
        for observer in world.observers:
            observer.group_started(world, group)
        self._batch().groups.append(group)
        return group

    def start_many(self, groups: np.ndarray, curators: np.ndarray) -> None:
        """:meth:`start` of each of ``groups`` ((k, g) members) led by ``curators`` ((k,)), in
        order, where no observer is told of a start (``world.told_after``): the groups of one
        instant, started one after another with nothing scheduled in between, join one
        batch."""
        world, now = self.world, self.env.now
        first = world._next_group
        made = [
            Group(first + i, members, curator, started=now)
            for i, (members, curator) in enumerate(zip(groups, curators.tolist(), strict=True))
        ]
        world._next_group += len(made)
        world.groups.update((group.group_id, group) for group in made)
        if made:
            self._batch().groups.extend(made)

    def _batch(self) -> _Batch:
        """The batch a group started now joins: the open one if it collects at the same
        instant and nothing was scheduled since, else a new one with its event."""
        env = self.env
        at = env.now + self._collect_after  # when SimPy would schedule its first event
        batch = self._open
        if batch is None or batch.at != at or batch.mark != env.scheduled:
            batch = _Batch(at, 0)
            env.timeout(self._collect_after).callbacks.append(lambda _: self._arrived(batch))
            batch.mark = env.scheduled
            self._open = batch
        return batch

    def _arrived(self, batch: _Batch) -> None:
        """The batch's ``SUBMIT`` s are in (a group of one: its statistic is): collect now if
        no other event shares this instant, else where the first collection's event would be."""
        env = self.env
        if self._open is batch:
            self._open = None
        if self.group_size == 1 or env.peek() > env.now:
            self._collect(batch)
        else:
            env.timeout(0).callbacks.append(lambda _: self._collect(batch))

    def _collect(self, batch: _Batch) -> None:
        """Every curator of ``batch`` collects, in order (:meth:`World.collected`)."""
        world = self.world
        receipts = world.receipts
        members_receipts: list[tuple[int, int]] = []
        if self.group_size > 1 and not self.full:  # where the first PUBLISH's event would be
            later = self.env.timeout(self.delay)
            later.callbacks.append(lambda _: receipts.extend(members_receipts))
        collect = self._collect_deferred if self._deferred else self._collect_each
        collect(batch.groups, members_receipts)
        for group in batch.groups:  # World.finish_group, the sampler's part at once
            del world.groups[group.group_id]
            world.monitor.notify(published=True)
        self._finished(batch.groups)

    def _collect_each(self, groups: list[Group], members_receipts: list[tuple[int, int]]) -> None:
        """Each group's release made now, in order: charge, then noise, record, observers
        (:meth:`_Releases.release <p2pdp.sim.waves._Releases.release>`); its aggregate is
        made with its chunk's."""
        world, pending = self.world, self._pending
        assert pending is not None  # inside running()
        spend, collect = world.ledger.spend, world.curator.collect
        release = pending.releases.release
        now = float(self.env.now)
        for group in groups:
            # the curator's decision (every member online here: charge, release, publish)
            charge = collect(group)[0]
            assert isinstance(charge, Charge)
            spend(charge.members)  # charged before the noise is drawn
            index = pending.first + len(pending.curators)  # its release
            members = group.members.tolist()
            pending.noises.append(release(group, members))  # group.submitted: curator first
            self._receipts(group.curator, group.submitted, index, members_receipts)
            self._pend(members, [group.curator], [group.group_id], now)

    def _collect_deferred(
        self, groups: list[Group], members_receipts: list[tuple[int, int]]
    ) -> None:
        """The batch's curators charge its members at once; the rest of their releases is
        made with their chunk (their noise is drawn then, in the same order)."""
        world, pending = self.world, self._pending
        assert pending is not None  # inside running()
        members = np.stack([group.members for group in groups])  # (k, g), group after group
        flat = members.ravel().tolist()
        charge = world.curator.wave(flat)  # every curator online, ...
        world.ledger.spend(charge.members)  # ... every member distinct: charged before noise
        curators = [group.curator for group in groups]
        for group in groups:
            group.ended = True
        if not self.full:  # (full publication: no receipt)
            # each release's rows: its curator, then the other members in their order
            firsts = np.argsort(members != np.array(curators)[:, None], axis=1, kind="stable")
            orders = np.take_along_axis(members, firsts, axis=1).tolist()
            index = pending.first + len(pending.curators)  # the batch's first release
            for offset, (curator, order) in enumerate(zip(curators, orders, strict=True)):
                self._receipts(curator, order, index + offset, members_receipts)
        self._pend(flat, curators, [group.group_id for group in groups], float(self.env.now))

    def _pend(self, flat: list[int], curators: list[int], group_ids: list[int], now: float) -> None:
        """Add releases collected at ``now`` (their members ``flat``, group after group) to
        the pending ones, publishing a chunk (:meth:`_Pending.publish
        <p2pdp.sim.waves._Pending.publish>`) each time ``RELEASE_CHUNK`` are pending."""
        pending, chunk, g = self._pending, self._chunk, self.group_size
        assert pending is not None  # inside running()
        done, k = 0, len(curators)
        while done < k:
            take = min(k - done, chunk - len(pending.curators))
            pending.members.extend(flat[done * g : (done + take) * g])
            pending.curators.extend(curators[done : done + take])
            pending.group_ids.extend(group_ids[done : done + take])
            pending.waves.append(take)
            pending.times.append(now)
            done += take
            if len(pending.curators) >= chunk:
                pending.publish(self.world)

    def _receipts(
        self, curator: int, order: list[int], index: int, members: list[tuple[int, int]]
    ) -> None:
        """Group publication: the curator holds release ``index`` now, its other members
        (``order[1:]``) once the ``PUBLISH`` arrives (appended to ``members``)."""
        if not self.full:
            self.world.receipts.append((curator, index))
            members.extend((member, index) for member in order[1:])
