"""The group-sampler seam: built-ins satisfy the protocol, and a sampler written from its
docstring alone runs in the real World."""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.config import ScenarioConfig
from p2pdp.core.rng import Uniforms
from p2pdp.experiments.run.simulation import simulate
from p2pdp.sim import world as world_module
from p2pdp.sim.central import CentralSampler
from p2pdp.sim.gossip import GossipSampler
from p2pdp.sim.sampler import GroupSampler
from tests.conftest import tiny_config


def config(
    *, sampler="central", n_peers=12, group_size=4, ratio=3, seconds_per_row=0.0, loss=0.0, seed=3
) -> ScenarioConfig:
    return tiny_config(
        seed=seed,
        data={"synthetic_rows": 240, "synthetic_test_rows": 100},
        partition={"n_peers": n_peers},
        training={"seconds_per_row": seconds_per_row},
        privacy={"epsilon": 1.0, "epsilon_per_aggregation": 1.0 / ratio},
        groups={"sampler": sampler, "group_size": group_size, "max_failed_attempts": 5},
        network={"latency": "exponential", "loss": loss},
        gossip={"gossip_period": 1.0, "backoff": 2.0, "invite_timeout": 0.3, "lock_timeout": 2.0},
        publication={"mode": "group"},
        evaluation={"split": "fixed"},
    )


@pytest.mark.parametrize(("name", "cls"), [("central", CentralSampler), ("gossip", GossipSampler)])
def test_the_configured_builtin_is_built_and_satisfies_the_protocol(monkeypatch, name, cls):
    built = []
    make_sampler = world_module.make_sampler

    def spy(world, *, rng):
        built.append(make_sampler(world, rng=rng))
        return built[-1]

    monkeypatch.setattr(world_module, "make_sampler", spy)
    result = simulate(config(sampler=name))
    (sampler,) = built
    assert type(sampler) is cls and isinstance(sampler, GroupSampler)
    assert sampler.done.triggered and sampler.done.value == result.stop_reason


@pytest.mark.parametrize("name", ["central", "gossip"])
def test_no_builtin_starts_a_group_once_it_decided_to_stop(monkeypatch, name):
    """Lossy runs stop after 5 aborted aggregations in a row, while other groups may be in
    flight: from the stop decision on, no group may start (the protocol's termination)."""
    late: list[str] = []
    start_group = world_module.World.start_group

    def start(self, members, curator, **kwargs):
        if self.sampler.stop_reason or self.sampler.done.triggered:
            late.append(self.sampler.stop_reason)
        return start_group(self, members, curator, **kwargs)

    monkeypatch.setattr(world_module.World, "start_group", start)
    reasons = set()
    for seed in range(4):
        scenario = config(sampler=name, n_peers=20, group_size=3, ratio=10, loss=0.4, seed=seed)
        reasons.add(simulate(scenario).stop_reason)
    assert "5 aggregations in a row failed" in reasons  # the rule under test did fire
    assert late == []


class BlocksSampler:
    """Written from the :class:`GroupSampler` docstring only: one group at a time, the g
    lowest-numbered idle solvent peers, the lowest of them curator."""

    def __init__(self, world, *, rng):
        self.world = world
        self.idle: list[int] = []
        self.not_ready = 0
        self.in_flight = 0
        self.started: list[list[int]] = []
        self.finished: list[tuple[int, bool]] = []
        self.ready_at: dict[int, float] = {}
        self.done_at = -1.0
        self.done = world.env.event()

    def start(self, ready, n_not_ready):
        self.idle.extend(ready)
        self.not_ready = n_not_ready
        self._next()

    def peer_ready(self, peer):
        self.ready_at[peer] = self.world.env.now
        self.not_ready -= 1
        self.idle.append(peer)
        self._next()

    def group_finished(self, group, *, published):
        self.in_flight -= 1
        self.finished.append((group.group_id, published))
        solvent = self.world.ledger.can_afford(group.members)
        self.idle.extend(group.members[solvent].tolist())
        self._next()

    def _next(self):
        g = self.world.config.groups.group_size
        self.idle.sort()
        if self.in_flight or self.done.triggered:
            return
        if len(self.idle) >= g:
            members = np.array(self.idle[:g], dtype=np.int64)
            del self.idle[:g]
            self.in_flight += 1
            self.started.append(members.tolist())
            self.world.start_group(members, int(members[0]), announce=True)
        elif self.not_ready == 0:
            self.done_at = self.world.env.now
            self.done.succeed("blocks: fewer than g idle peers can pay")


def test_a_sampler_written_from_the_protocol_runs_in_the_world(monkeypatch):
    """P = 12, g = 4, 3 aggregations per peer: blocks 0-3, 4-7, 8-11, three times each."""
    samplers = []

    def factory(world, *, rng):
        samplers.append(BlocksSampler(world, rng=rng))
        return samplers[-1]

    monkeypatch.setattr(world_module, "make_sampler", factory)
    scenario = config(seconds_per_row=0.5)  # every peer trains first: peer_ready path
    with monkeypatch.context() as patch:
        worlds = []
        run = world_module.World.run
        patch.setattr(world_module.World, "run", lambda self: (worlds.append(self), run(self)))
        result = simulate(scenario)
    (sampler,), (world,) = samplers, worlds
    assert isinstance(sampler, GroupSampler)
    blocks = [list(range(start, start + 4)) for start in (0, 4, 8)]
    assert sampler.started == [block for block in blocks for _ in range(3)]
    assert sampler.finished == [(group_id, True) for group_id in range(9)]  # once per group
    assert sampler.ready_at == {
        peer: 0.5 * int(size) for peer, size in enumerate(world.shard_sizes)
    }
    assert result.stop_reason == "blocks: fewer than g idle peers can pay"
    assert result.sim_time == sampler.done_at > 0.5 * world.shard_sizes.max()
    assert result.aggregations == 9 and result.aborted_groups == 0
    np.testing.assert_array_equal(result.aggregations_per_peer, np.full(12, 3))


def test_uniforms_come_from_the_generator_one_batch_at_a_time():
    rng, reference = np.random.default_rng(5), np.random.default_rng(5)
    uniform = Uniforms(rng, batch=4).draw
    values = [uniform() for _ in range(4)]
    batch = reference.random(4)
    assert sorted(values) == sorted(batch.tolist())  # this batch, each value once
    assert rng.random() == reference.random()  # four values took exactly one batch
    assert uniform() not in values and 0.0 <= uniform() < 1.0  # a fresh batch
    again = Uniforms(np.random.default_rng(5), batch=4).draw
    assert [again() for _ in range(4)] == values  # seeded: reproducible
