"""The batched driver (p2pdp.sim.waves) against the per-message SimPy world it replaces.

Where both apply, every output must be the same: rows, releases, peers, what the observers
see (and when), receipts, published models, message counters. Elsewhere the SimPy world runs.
"""

from __future__ import annotations

import dataclasses
import gc
import math

import numpy as np
import pytest

from p2pdp.config import NetworkConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.parallel import local_workers
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.settings import TrainingConfig
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GossipConfig, GroupsConfig
from p2pdp.sim import waves
from p2pdp.sim.world import WorldObserver
from p2pdp.tasks import make_task
from p2pdp.tasks.pipeline import prepare_peers
from tests.sim.test_gossip import FAST
from tests.sim.test_world import synthetic
from tests.tasks.test_prevalence_tasks import COUNTS, POOLED, _config, _rr


class Recorder(WorldObserver):
    """Everything an observer can see, in order, with the ledger as it stood."""

    def __init__(self) -> None:
        self.world = None
        self.events: list[tuple] = []

    def group_started(self, world, group) -> None:
        self.world = world
        self.events.append(
            ("started", world.env.now, group.group_id, group.curator, group.members.tolist())
        )

    def released(self, world, group, record) -> None:
        self.events.append(
            (
                "released",
                world.env.now,
                group.group_id,
                list(group.submitted),
                list(group.sizes),
                world.ledger.aggregations().tolist(),
                record.as_row(),
            )
        )

    def aborted(self, world, group, reason) -> None:
        self.events.append(("aborted", world.env.now, group.group_id, reason))


class Told(WorldObserver):
    """What an observer told of releases after the fact (``released_many``) sees: the time,
    group id, curator and record of each, in order, and how it was told."""

    def __init__(self) -> None:
        self.world = None
        self.events: list[tuple] = []
        self.told_after = 0

    def released(self, world, group, record) -> None:
        self.world = world
        self.events.append((world.env.now, group.group_id, group.curator, record.as_row()))

    def released_many(self, world, times, group_ids, curators, records) -> None:
        self.world = world
        self.told_after += 1
        rows = (record.as_row() for record in records)
        self.events.extend(zip(times, group_ids, curators, rows, strict=True))


def _same(new, old) -> bool:
    """Equal, floats to 1e-12 relative (the drivers sum and draw the same numbers in the same
    order; the tolerance only allows for a kernel that rounds differently)."""
    if isinstance(old, float) and isinstance(new, float):
        return math.isclose(new, old, rel_tol=1e-12, abs_tol=1e-15) or (
            math.isnan(new) and math.isnan(old)
        )
    if isinstance(old, dict):
        return old.keys() == new.keys() and all(_same(new[k], old[k]) for k in old)
    if isinstance(old, (list, tuple)):
        return len(old) == len(new) and all(_same(a, b) for a, b in zip(new, old, strict=True))
    return bool(new == old)


def _run(config, trained, driver):
    recorder = Recorder()
    result = simulate(config, trained=trained, observers=(recorder,), driver=driver)
    return result, recorder


def _assert_same_run(config) -> tuple:
    trained = make_task(config).prepare(fold=0, repetition=0)
    reference, seen = _run(config, trained, "reference")
    batched, seen_batched = _run(config, trained, "batched")
    assert not seen.world.batched and seen_batched.world.batched
    _assert_same_outputs(reference, seen, batched, seen_batched)
    return reference, seen


def _assert_same_outputs(reference, seen, batched, seen_batched) -> None:
    """Every output of two runs of one configuration is the same (``seen``: Recorders)."""
    row, row_batched = reference.row(), batched.row()
    for column in row:
        if not column.startswith("wall_"):
            assert _same(row_batched[column], row[column]), column
    assert _same(list(batched.release_rows()), list(reference.release_rows()))
    assert _same(list(batched.peer_table()), list(reference.peer_table()))
    assert _same(seen_batched.events, seen.events)
    world, world_batched = seen.world, seen_batched.world
    if world_batched.config.groups.sampler == "central":  # run_waves' clock: its last collection
        assert world_batched.env.now == world_batched.monitor.end_time
    np.testing.assert_array_equal(world_batched.receipts, world.receipts)
    np.testing.assert_array_equal(world_batched.shared, world.shared)
    np.testing.assert_array_equal(world_batched.release_members, world.release_members)
    np.testing.assert_allclose(world_batched.published, world.published, rtol=1e-12, atol=0)
    for counter in ("messages_sent", "bytes_sent"):
        np.testing.assert_array_equal(
            getattr(world_batched.transport, counter), getattr(world.transport, counter)
        )
    for counter in ("control_messages", "broadcasts", "messages_lost"):
        assert getattr(world_batched.transport, counter) == getattr(world.transport, counter)
    np.testing.assert_array_equal(world_batched.ledger.aggregations(), world.ledger.aggregations())
    (state, unit), (state_batched, unit_batched) = (
        w.releaser.noise.state() for w in (world, world_batched)
    )
    assert state_batched == state  # the noise stream is where the SimPy world left it
    np.testing.assert_array_equal(unit_batched, unit)
    assert world_batched.monitor.end_time == world.monitor.end_time
    assert world_batched.monitor.aggregations == world.monitor.aggregations
    if hasattr(world.sampler, "pool"):  # the central sampler's idle peers
        assert world_batched.sampler.pool.peers == world.sampler.pool.peers
    assert world_batched.sampler.done.value == world.sampler.done.value


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("mode", ["group", "full"])
@pytest.mark.parametrize(
    ("n_peers", "group_size", "concurrent", "epsilon_per_aggregation"),
    [
        (20, 5, 1, 0.25),  # up to 4 aggregations each
        (23, 5, 3, 0.3),  # 3 each at most; 23 peers in groups of 5: some are left over
        (17, 1, 4, 0.45),  # groups of one (ready on their ASSIGN), 2 each
        (30, 4, 100, 0.15),  # every group of a wave at once, up to 6 each
        (31, 7, 2, 0.2),
    ],
)
def test_batched_driver_gives_the_reference_outputs(
    seed, mode, n_peers, group_size, concurrent, epsilon_per_aggregation, monkeypatch
):
    monkeypatch.setattr(waves, "RELEASE_CHUNK", 2 + seed)  # publish in several chunks, one partial
    config = synthetic(
        n_peers=n_peers,
        epsilon=1.0,
        epsilon_per_aggregation=epsilon_per_aggregation,
        mode=mode,
        rows=20 * n_peers + 7 * seed,  # uneven shards: sizes and sensitivities differ
        seed=seed,
        groups=GroupsConfig(group_size=group_size, max_concurrent_groups=concurrent),
        network=NetworkConfig(latency_mean=0.01 * seed, bandwidth=1e5 if seed > 1 else math.inf),
    )
    reference, seen = _assert_same_run(config)
    assert reference.aggregations > 1 and seen.world.monitor.end_time > 0  # the test ran waves
    counts = reference.aggregations_per_peer
    if (seed, n_peers) in ((2, 20), (3, 23), (1, 31)):  # budgets that run out unevenly
        assert counts.min() < counts.max()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("mode", "group_size", "concurrent", "seed"),
    [
        ("full", 5, 1, 1),
        ("group", 5, 3, 2),
        ("group", 1, 4, 3),
        ("full", 4, 100, 4),
        ("group", 3, 1, 5),  # waves of one group (drawn and charged in turn) ...
        ("full", 1, 1, 6),  # ... of one peer
    ],
)
def test_releases_told_after_the_fact_give_the_reference_outputs(
    mode, group_size, concurrent, seed, workers, monkeypatch
):
    """With no observer that must see each event (only ones with ``released_many``), the
    batched driver makes its releases a chunk at a time, in a forked process with two local
    workers: the same outputs, the same rows of the release log, the same observed releases,
    the noise stream left at the same point."""
    monkeypatch.setattr(waves, "RELEASE_CHUNK", 3 + seed)  # several chunks, one partial
    monkeypatch.setattr(waves, "_AHEAD", seed % 3)  # chunks published later (or at once)
    config = synthetic(
        n_peers=37,
        epsilon=1.0,
        epsilon_per_aggregation=0.2,
        mode=mode,
        rows=20 * 37 + 7 * seed,  # uneven shards: sizes and sensitivities differ
        seed=seed,
        groups=GroupsConfig(group_size=group_size, max_concurrent_groups=concurrent),
        network=NetworkConfig(latency_mean=0.01 * seed, bandwidth=1e5),
    )
    trained = make_task(config).prepare(fold=0, repetition=0)
    runs = []
    for driver in ("reference", "batched"):
        told = Told()
        with local_workers(workers):
            runs.append((simulate(config, trained=trained, observers=(told,), driver=driver), told))
    (reference, seen), (batched, seen_batched) = runs
    assert seen_batched.world.batched and seen_batched.told_after > 2 and not seen.told_after
    _assert_same_outputs(reference, seen, batched, seen_batched)
    assert reference.aggregations > 10


def _gaussian(config, **privacy):
    return dataclasses.replace(
        config, privacy=PrivacyConfig(mechanism="gaussian", delta=1e-5, **privacy)
    )


def test_batched_driver_gives_the_reference_outputs_with_gaussian_noise_and_the_pld_accountant():
    config = synthetic(
        n_peers=24, rows=500, groups=GroupsConfig(group_size=6, max_concurrent_groups=2)
    )
    config = _gaussian(config, epsilon=2.0, epsilon_per_aggregation=0.5, accountant="pld")
    reference, _ = _assert_same_run(config)
    assert reference.aggregations > 4


@pytest.mark.parametrize(
    "config",
    [
        _config(COUNTS, "privacy.epsilon_per_aggregation=0.25", "groups.max_concurrent_groups=3"),
        _rr("groups.max_concurrent_groups=2"),
    ],
    ids=["laplace-counts-summed", "randomized-response"],
)
def test_batched_driver_gives_the_reference_outputs_for_the_count_tasks(config):
    reference, _ = _assert_same_run(config)  # d = 1: one count per peer, summed
    assert reference.aggregations > 4


def test_a_mechanism_that_defines_its_own_release_runs_on_the_simpy_world():
    config = _config(POOLED, "partition.n_peers=60")
    _, seen = _run(config, make_task(config).prepare(fold=0, repetition=0), "auto")
    assert not seen.world.batched
    with pytest.raises(ConfigError, match="driver = 'batched'.*privacy.mechanism = 'pooled-test'"):
        simulate(config, driver="batched")


#: Settings the batched driver does not apply to, and the field its refusal names.
NOT_BATCHED = [
    ({"network": NetworkConfig(loss=0.1)}, "network.loss"),
    ({"network": NetworkConfig(latency="lognormal")}, "network.latency"),
    ({"network": NetworkConfig(latency="exponential")}, "network.latency"),
    ({"privacy": {"secure_aggregation": True}}, "privacy.secure_aggregation"),
    ({"training": TrainingConfig(seconds_per_row=0.01)}, "training.seconds_per_row"),
    (
        {
            "groups": GroupsConfig(group_size=5, sampler="gossip"),
            "gossip": GossipConfig(churn=True),
        },
        "groups.sampler",
    ),
]


@pytest.mark.parametrize(("settings", "field"), NOT_BATCHED)
def test_other_configurations_run_on_the_simpy_world(settings, field):
    settings = dict(settings)
    privacy = settings.pop("privacy", None)
    config = synthetic(n_peers=20, **settings)
    if privacy is not None:
        config = _gaussian(config, epsilon=1.0, epsilon_per_aggregation=0.25, **privacy)
    trained = prepare_peers(config, fold=0)
    auto, seen = _run(config, trained, "auto")
    assert not seen.world.batched  # auto chose the SimPy world
    reference, _ = _run(config, trained, "reference")
    row, row_auto = reference.row(), auto.row()
    assert {k: v for k, v in row_auto.items() if not k.startswith("wall_")} == {
        k: v for k, v in row.items() if not k.startswith("wall_")
    }
    with pytest.raises(ConfigError, match=f"driver = 'batched'.*{field}"):
        simulate(config, trained=trained, driver="batched")


def test_auto_batches_where_it_applies():
    config = synthetic(n_peers=20)
    _, seen = _run(config, prepare_peers(config, fold=0), "auto")
    assert seen.world.batched


def test_an_unknown_driver_is_refused_by_name():
    with pytest.raises(ConfigError, match="driver must be one of auto, reference, batched"):
        simulate(synthetic(n_peers=20), driver="fast")


@pytest.mark.parametrize(
    ("settings", "runtime", "why"),
    [
        ({}, "network", "network runtime"),
        # (an iterative protocol takes driver = "reference": protocols/test_iterative_peers.py)
    ],
)
def test_a_driver_is_refused_where_it_would_change_nothing(settings, runtime, why):
    config = _gaussian(synthetic(n_peers=20), epsilon=1.0, epsilon_per_aggregation=0.25)
    config = dataclasses.replace(config, **settings)
    with pytest.raises(ConfigError, match=f"driver = 'reference'.*{why}"):
        simulate(config, runtime=runtime, driver="reference")


# -- gossip groups formed in rounds (GroupBatches) -----------------------------------------
def _gossip(*, n_peers, group_size, mode, latency, bandwidth, seed=1, **sections):
    """Gossip forming its groups in rounds on a fault-free world with a constant latency."""
    return synthetic(
        n_peers=n_peers,
        epsilon=1.0,
        epsilon_per_aggregation=0.2,
        mode=mode,
        rows=20 * n_peers + 7 * seed,  # uneven shards: sizes and sensitivities differ
        seed=seed,
        groups=GroupsConfig(
            sampler="gossip", group_size=group_size, collect_timeout=1.0, max_failed_attempts=8
        ),
        gossip=GossipConfig(formation="rounds", **FAST),
        network=NetworkConfig(latency_mean=latency, bandwidth=bandwidth),
        **sections,
    )


class FormationState(WorldObserver):
    """The formation protocol's state as each group starts: who is free and when each free
    peer initiates next (the backoffs members draw when they are freed)."""

    def __init__(self) -> None:
        self.states: list[tuple] = []

    def group_started(self, world, group) -> None:
        formation = world.sampler.formation
        self.states.append(
            (
                world.env.now,
                formation.n_solvent,
                formation.n_trying,
                formation.stopped,
                formation.state.tolist(),
                formation.initiate_at.tolist(),
            )
        )


@pytest.mark.parametrize("mode", ["group", "full"])
@pytest.mark.parametrize(
    ("n_peers", "group_size", "latency", "bandwidth"),
    [
        (300, 5, 0.05, 1e5),  # collections between two ticks
        (400, 2, 0.1, math.inf),  # every collection ties with the clock's next tick (0.1 s)
        (250, 1, 0.02, 1e5),  # groups of one: collected at once
        (300, 5, 0.0, math.inf),  # submissions and publications take no time
        (1200, 5, 0.03, 1e6),
    ],
)
def test_gossip_groups_formed_in_rounds_are_batched_with_the_reference_outputs(
    mode, n_peers, group_size, latency, bandwidth, monkeypatch
):
    monkeypatch.setattr(waves, "RELEASE_CHUNK", 7)  # publish in several chunks, one partial
    config = _gossip(
        n_peers=n_peers, group_size=group_size, mode=mode, latency=latency, bandwidth=bandwidth
    )
    trained = make_task(config).prepare(fold=0, repetition=0)
    runs = []
    for driver in ("reference", "batched"):
        recorder, formation = Recorder(), FormationState()
        result = simulate(config, trained=trained, observers=(recorder, formation), driver=driver)
        runs.append((result, recorder, formation))
    (reference, seen, states), (batched, seen_batched, states_batched) = runs
    assert not seen.world.batched and seen_batched.world.batched
    assert states_batched.states == states.states
    _assert_same_outputs(reference, seen, batched, seen_batched)
    assert reference.aggregations > 2 * n_peers // group_size  # peers ran several groups
    events = seen.events
    assert len({event[1] for event in events if event[0] == "released"}) > 10  # many instants
    sampler, sampler_batched = seen.world.sampler, seen_batched.world.sampler
    assert sampler_batched.attempts_started == sampler.attempts_started
    assert sampler_batched.formation_messages == sampler.formation_messages
    assert sampler_batched.gossip_messages == sampler.gossip_messages
    formation, formation_batched = sampler.formation, sampler_batched.formation
    for name in ("state", "initiate_at", "failures", "lock_until"):  # as the run left them
        np.testing.assert_array_equal(getattr(formation_batched, name), getattr(formation, name))
    assert formation_batched.n_trying == formation.n_trying


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("mode", "n_peers", "group_size", "latency", "gaussian", "ahead"),
    [
        ("group", 300, 5, 0.05, False, 3),
        ("full", 400, 2, 0.1, False, 1),  # collections tie with the clock's next tick
        ("group", 250, 1, 0.02, False, 0),  # groups of one
        ("full", 300, 5, 0.05, True, 2),  # a scale family other than Laplace
    ],
)
def test_gossip_releases_told_after_the_fact_give_the_reference_outputs(
    mode, n_peers, group_size, latency, gaussian, ahead, workers, monkeypatch
):
    """With only observers told after the fact, the gossip groups' batches are charged at once
    and their releases made a chunk at a time, in a forked process with two local workers:
    the same outputs, release log, observed releases, formation state and noise stream as the
    per-message world."""
    monkeypatch.setattr(waves, "RELEASE_CHUNK", 7)  # several chunks, one partial
    monkeypatch.setattr(waves, "_AHEAD", ahead)  # chunks published later (or at once)
    config = _gossip(
        n_peers=n_peers, group_size=group_size, mode=mode, latency=latency, bandwidth=1e5
    )
    if gaussian:
        config = _gaussian(config, epsilon=1.0, epsilon_per_aggregation=0.2)
    trained = make_task(config).prepare(fold=0, repetition=0)
    runs = []
    for driver in ("reference", "batched"):
        told = Told()
        with local_workers(workers):
            runs.append((simulate(config, trained=trained, observers=(told,), driver=driver), told))
    (reference, seen), (batched, seen_batched) = runs
    assert seen_batched.world.batched and seen_batched.told_after > 2 and not seen.told_after
    _assert_same_outputs(reference, seen, batched, seen_batched)
    assert reference.aggregations > 2 * n_peers // group_size
    formation, formation_batched = (
        seen.world.sampler.formation,
        seen_batched.world.sampler.formation,
    )
    for name in ("state", "initiate_at", "failures", "lock_until"):
        np.testing.assert_array_equal(getattr(formation_batched, name), getattr(formation, name))


def _broken_exact(*_args):
    raise ConfigError("statistics = broken on purpose")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failure_making_the_gossip_releases_is_raised_not_hung(workers, monkeypatch):
    """The gossip groups' releases made in the forked worker (or here, one worker): its error
    reaches the run, which ends."""
    monkeypatch.setattr(waves, "_exact", _broken_exact)  # before the worker forks
    config = _gossip(n_peers=300, group_size=5, mode="full", latency=0.05, bandwidth=1e5)
    with local_workers(workers), pytest.raises(ConfigError, match="broken on purpose"):
        simulate(config, driver="batched")


class HeapFrozen(WorldObserver):
    """Whether the collector ignored the run's objects (``gc.freeze``) at each group start."""

    def __init__(self) -> None:
        self.frozen: list[bool] = []

    def group_started(self, world, group) -> None:
        self.frozen.append(gc.get_freeze_count() > 0)


def test_gossip_groups_batched_run_with_the_world_out_of_the_collectors_reach():
    """As the central sampler's waves: no collection traverses the world's objects (at 10^5
    peers, a gossip run's collections took 1 s of its CPU), and the heap is thawed after."""
    config = _gossip(n_peers=60, group_size=5, mode="full", latency=0.05, bandwidth=1e5)
    heap = HeapFrozen()
    result = simulate(config, observers=(heap,), driver="batched")
    assert result.aggregations > 0 and len(heap.frozen) >= result.aggregations
    assert all(heap.frozen)
    assert gc.get_freeze_count() == 0


#: Gossip worlds the batched driver does not apply to, and the field its refusal names (loss,
#: churn and crashes keep ``gossip.formation = "auto"`` per message: rounds refuse faults).
AUTO = GossipConfig(**FAST)
NOT_BATCHED_GOSSIP = [
    ({"network": NetworkConfig(loss=0.1), "gossip": AUTO}, "gossip.formation = 'auto'"),
    ({"gossip": GossipConfig(churn=True, **FAST)}, "gossip.formation = 'auto'"),
    ({"gossip": GossipConfig(member_crash_probability=0.1, **FAST)}, "gossip.formation"),
    ({"network": NetworkConfig(latency="exponential")}, "network.latency = 'exponential'"),
    ({"privacy": {"secure_aggregation": True}}, "privacy.secure_aggregation"),
    ({"training": TrainingConfig(seconds_per_row=0.001)}, "training.seconds_per_row"),
]


@pytest.mark.parametrize(("settings", "field"), NOT_BATCHED_GOSSIP)
def test_other_gossip_worlds_run_per_message(settings, field):
    config = _gossip(n_peers=60, group_size=4, mode="group", latency=0.05, bandwidth=1e5)
    settings = dict(settings)
    privacy = settings.pop("privacy", None)
    config = dataclasses.replace(config, **settings)
    if privacy is not None:
        config = _gaussian(config, epsilon=1.0, epsilon_per_aggregation=0.2, **privacy)
    trained = prepare_peers(config, fold=0)
    auto, seen = _run(config, trained, "auto")
    assert not seen.world.batched and seen.world.peers  # per message: peers receive them
    reference, _ = _run(config, trained, "reference")
    assert {k: v for k, v in auto.row().items() if not k.startswith("wall_")} == {
        k: v for k, v in reference.row().items() if not k.startswith("wall_")
    }
    assert reference.aggregations > 0
    with pytest.raises(ConfigError, match=f"driver = 'batched'.*{field}"):
        simulate(config, trained=trained, driver="batched")
