"""The batched driver of the one-shot protocol: whole waves of groups per Python call.

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
- each curator charges its members on the ledger (:meth:`BudgetLedger.spend_drawn
  <p2pdp.privacy.accounting.BudgetLedger.spend_drawn>`: the pool holds distinct solvent ids,
  so only the budget is checked, and a broke member is still refused, all or nothing; the
  members still solvent go back to the pool at the wave's end, in draw order), then draws its
  noise from the run's stream through the one release path (:meth:`Releaser.release
  <p2pdp.privacy.release.Releaser.release>`'s draw and record, in release order: the same
  draws from the same generator), so the budget is charged before any noise is drawn; the
  sensitivity, a function of the members' sizes, is asked once per distinct sizes;
- the observers see ``group_started`` for every group of the wave at ``T`` and ``released``
  for each at the collection instant, in the same order and with the same ledger state as in
  the SimPy world (``world.env.now`` reads the wave's instant);
- the exact aggregates (the only heavy arithmetic) are summed for many groups at once, in the
  same order per group (the curator's row, then the members'), and published with the noise,
  so ``world.published``, ``shared``, ``receipts`` and ``release_members`` grow by chunks
  (observers read what their hooks pass, the clock and the ledger:
  :class:`~p2pdp.sim.world.WorldObserver`);
- receipts, message and byte counters, ``sim_time`` and the stop reason are what the
  transport and completion monitor would have recorded (a ``PUBLISH`` of one wave reaches its
  members before the next wave's curators collect).

Every other configuration (message loss, random latencies, churn and gossip formation, a
sampler of your own, simulated training time, secure aggregation, a mechanism that defines
its own release or a per-release statistic, an aggregate other than mean or sum) runs on the
per-message SimPy world, which stays the reference: ``tests/test_waves.py`` runs both on
worlds where both apply and compares every output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from p2pdp.privacy.release import LINEAR_AGGREGATES
from p2pdp.protocols.groups import HEADER_BYTES, Group, too_few_solvent
from p2pdp.sim.central import CentralSampler

if TYPE_CHECKING:  # the world imports this module
    from p2pdp.sim.world import World

__all__ = ["DRIVERS", "batched_obstacle", "run_waves"]

#: How a one-shot simulation is driven: ``"auto"`` (batched where :func:`batched_obstacle`
#: finds nothing in the way, else the SimPy world), ``"reference"`` (always the SimPy world),
#: ``"batched"`` (refused where it does not apply).
DRIVERS = ("auto", "reference", "batched")

#: Releases published at a time: their exact aggregates are summed in one array operation
#: (the (n, g, d) gather stays a few MB) and what the driver holds for them is freed.
_CHUNK = 1024


def batched_obstacle(world: World) -> str:
    """Why :func:`run_waves` cannot drive ``world`` (a setting and its value), or ``""``.

    Called once the world's sampler, ledger and releaser exist and before it runs.
    """
    config = world.config
    network = config.network
    releaser = world.releaser
    if type(world.sampler) is not CentralSampler:
        return f"groups.sampler = {config.groups.sampler!r} (only 'central' is batched)"
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


def run_waves(world: World) -> None:
    """Run ``world`` to its end wave by wave (see the module docstring); it must be a world
    :func:`batched_obstacle` accepts, built and not yet run.

    Leaves the world as :meth:`World.run <p2pdp.sim.world.World.run>` would: ``published``,
    ``shared``, ``releases``, ``release_members``, ``receipts``, the ledger, the transport's
    counters, the monitor's ``aggregations``, ``end_time`` and ``stop_reason`` and the
    sampler's pool and state. ``world.env.now`` ends at the last collection (the SimPy world
    also runs the last wave's publication messages).
    """
    config = world.config
    env, ledger, releaser = world.env, world.ledger, world.releaser
    sampler, monitor, observers = world.sampler, world.monitor, world.observers
    assert isinstance(sampler, CentralSampler)  # batched_obstacle says so
    pool = sampler.pool
    g = config.groups.group_size
    limit = config.groups.max_concurrent_groups
    full = config.publication.mode == "full"
    latency, bandwidth = config.network.latency_mean, config.network.bandwidth
    assign_delay = latency + HEADER_BYTES / bandwidth  # Transport.delay of one ASSIGN
    submit_delay = latency + world.model_bytes / bandwidth  # ... and of one SUBMIT
    sizes = world.shard_sizes.tolist()
    sensitivity, draw, record = world.sensitivity, releaser.noise.draw, releaser.record
    spend = ledger.spend_drawn  # the pool holds distinct solvent ids: only the budget is checked
    releases = world.releases
    scales: dict[tuple[int, ...], float] = {}
    pending = _Pending()  # what no observer reads, published by chunks
    now = env.now  # 0: every peer is ready at the start
    while True:
        k = min(limit, len(pool) // g)
        if k == 0:
            break
        env._now = now  # what observers read as world.env.now (simpy keeps it there)
        drawn, curators = pool.draw_many(g, k)
        wave: list[Group] = []
        for members, curator in zip(drawn, curators, strict=True):
            members_array = np.array(members, dtype=np.int64)
            group = Group(world._next_group, members_array, curator, started=now)
            world._next_group += 1
            wave.append(group)
            for observer in observers:
                observer.group_started(world, group)
        now = now + assign_delay  # the members get their ASSIGN ...
        if g > 1:
            now = now + submit_delay  # ... and the curators every SUBMIT
        env._now = now
        solvent: list[int] = []  # who can afford another aggregation, in member order
        for group, members in zip(wave, drawn, strict=True):
            curator = group.curator
            order = members if g == 1 else [curator, *[m for m in members if m != curator]]
            group.submitted, group.sizes = order, [sizes[m] for m in order]
            group.ended = True
            solvent.extend(spend(members))  # charged before the noise is drawn
            key = tuple(group.sizes)  # a pure function of the sizes: computed once per sizes
            scale = scales.get(key)
            if scale is None:
                scale = scales[key] = sensitivity(group.sizes)
            noise = draw(scale)
            release = record(g, group.sizes, scale, math.sqrt(float(noise @ noise)))
            releases.append(release)
            for observer in observers:
                observer.released(world, group, release)
            pending.rows.append(order)
            pending.members.append(members)
            pending.noises.append(noise)
        pending.waves.append(k)
        monitor.aggregations += k
        pool.add(solvent)
        if len(pending.rows) >= _CHUNK:
            _publish(world, pending, full=full)

    sampler.stop_reason = monitor.stop_reason = too_few_solvent(g)
    sampler.done.succeed(sampler.stop_reason)  # as the sampler would (nothing waits on it)
    monitor.end_time = now
    if pending.rows:
        _publish(world, pending, full=full)


@dataclass(slots=True)
class _Pending:
    """Releases made and not yet published: each one's statistics rows (curator, then the
    other members in member order), members (in member order) and noise, and the number of
    groups of each wave."""

    rows: list[list[int]] = field(default_factory=list)
    members: list[list[int]] = field(default_factory=list)
    noises: list[np.ndarray] = field(default_factory=list)
    waves: list[int] = field(default_factory=list)


def _publish(world: World, pending: _Pending, *, full: bool) -> None:
    """Publish the ``pending`` releases (then forget them) and record what the transport
    would have: who holds each release and the messages sent.

    Each release is its exact aggregate, summed over the same rows in the same order as
    :meth:`Releaser.exact <p2pdp.privacy.release.Releaser.exact>`, plus its noise. Under group
    publication the curators keep their copy and the ``PUBLISH`` of one wave reaches the
    other members before the next wave's curators collect, so a wave's receipts are its
    curators' (in draw order) then its other members' (group by group, in member order),
    as in the SimPy world. The transport counts one ``ASSIGN`` per member (from the
    sampler), one ``SUBMIT`` per other member and the curator's publication: ``g - 1``
    messages, or one broadcast to the ``P - 1`` others.
    """
    first = len(world.published)
    index = np.array(pending.rows, dtype=np.int64)  # (n, g)
    n, g = index.shape
    total = world.statistics[index].sum(axis=1)  # (n, g, d) -> (n, d), each group in order
    exact = total / g if world.releaser.aggregate == "mean" else total
    world.published.extend(exact + np.stack(pending.noises))
    world.shared.extend([full] * n)
    world.release_members.extend(np.array(pending.members, dtype=np.int64))
    if not full:
        wave = np.repeat(np.arange(len(pending.waves)), pending.waves)  # (n,)
        others = index[:, 1:].ravel()  # group by group, in member order
        peers = np.concatenate([index[:, 0], others])
        releases = np.concatenate([np.arange(n), np.repeat(np.arange(n), g - 1)])
        curator_first = np.concatenate([np.zeros(n, np.int8), np.ones(others.size, np.int8)])
        order = np.lexsort((curator_first, wave[releases]))  # stable: keeps the draw order
        receipts = zip(peers[order].tolist(), (releases[order] + first).tolist(), strict=True)
        world.receipts.extend(receipts)
    pending.rows.clear()
    pending.members.clear()
    pending.noises.clear()
    pending.waves.clear()

    transport = world.transport
    sent = transport.messages_sent
    np.add.at(sent, index[:, 1:].ravel(), 1)  # SUBMIT
    np.add.at(transport.bytes_sent, index[:, 1:].ravel(), world.model_bytes)
    published = (sent.size - 1) if full else g - 1  # messages per publication
    np.add.at(sent, index[:, 0], published)
    np.add.at(transport.bytes_sent, index[:, 0], published * world.model_bytes)
    transport.control_messages += n * g
    if full:
        transport.broadcasts += n
