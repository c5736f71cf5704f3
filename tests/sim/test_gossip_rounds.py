"""Gossip formation in rounds over arrays against the per-message reference.

The two are different random processes (see :mod:`p2pdp.sim.gossip.rounds`): what must hold
in both is tested exactly on every run (the invariants of ``tests/sim/test_gossip.py`` plus the
state of every member when its group starts), what must agree is tested statistically over
seeds, with tolerances.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from p2pdp.config import NetworkConfig
from p2pdp.core.errors import ConfigError
from p2pdp.data.settings import PartitionConfig
from p2pdp.experiments.run.simulation import simulate
from p2pdp.protocols.gossip import IN_GROUP
from p2pdp.protocols.settings import GossipConfig
from p2pdp.sim import world as world_module
from p2pdp.sim.gossip import Newscast, merge_views
from p2pdp.sim.gossip import views as views_module
from p2pdp.sim.gossip.formation import GroupFormation
from p2pdp.sim.gossip.rounds import ROUNDS_FROM_PEERS, RoundFormation, uses_rounds
from p2pdp.sim.gossip.sampler import GossipSampler
from p2pdp.sim.overlay import build_overlay
from tests.sim.test_gossip import check_invariants, recording, scenario


def rounds(**kwargs):
    return scenario(formation="rounds", **kwargs)


@dataclasses.dataclass
class Start:
    """One ``start_group`` call: when, members, curator, and whether every member was online,
    solvent, in this group and bound to no attempt (the world's view at that instant)."""

    time: float
    members: np.ndarray
    curator: int
    ready: bool


@contextmanager
def starts():
    """Record every group start (:class:`Start`)."""
    seen: list[Start] = []
    start = world_module.World.start_group

    def start_(self, members, curator, **kwargs):
        formation = self.sampler.formation
        ready = (
            bool(self.online[members].all())
            and bool(self.ledger.can_afford(members).all())
            and bool(np.all(formation.state[members] == IN_GROUP))
            and bool(np.all(formation.bound[members] == -1))
        )
        seen.append(Start(self.env.now, members.copy(), int(curator), ready))
        return start(self, members, curator, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(world_module.World, "start_group", start_)
        yield seen


# -- selection and settings ----------------------------------------------------------------
def test_auto_uses_rounds_from_the_threshold_on_and_only_without_faults():
    small = scenario(n_peers=30)
    large = dataclasses.replace(small, partition=PartitionConfig(n_peers=ROUNDS_FROM_PEERS))
    assert not uses_rounds(small) and uses_rounds(large)
    lossy = dataclasses.replace(large, network=NetworkConfig(latency="exponential", loss=0.1))
    churn = dataclasses.replace(large, gossip=dataclasses.replace(large.gossip, churn=True))
    assert not uses_rounds(lossy) and not uses_rounds(churn)
    assert uses_rounds(rounds(n_peers=30))
    assert not uses_rounds(dataclasses.replace(large, gossip=GossipConfig(formation="messages")))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss": 0.1}, "gossip.formation = 'rounds' .* got network.loss = 0.1"),
        ({"churn": True}, "got gossip.churn = True"),
        ({"member_crash_probability": 0.2}, "got gossip.member_crash_probability = 0.2"),
    ],
)
def test_rounds_refuse_the_faults_they_do_not_model(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        rounds(**kwargs)


def test_formation_names_field_and_value():
    with pytest.raises(ConfigError, match="gossip.formation must be one of .* got 'fast'"):
        GossipConfig(formation="fast")


def test_the_setting_selects_the_driver_and_rounds_count_their_messages():
    """The wiring: ``formation`` changes what runs, and the rounds' messages are counted."""
    with recording() as log:
        reference = simulate(scenario(n_peers=60, group_size=6, ratio=5, mode="group"))
    assert isinstance(log.world.sampler.formation, GroupFormation)
    with recording() as log:
        result = simulate(rounds(n_peers=60, group_size=6, ratio=5, mode="group"))
    sampler = log.world.sampler
    assert isinstance(sampler.formation, RoundFormation)
    # every group costs at least its 3 round trips (6 (g - 1) messages), counted per sender
    assert sampler.formation_messages >= 6 * 5 * result.aggregations > 0
    counted = log.world.transport.messages_sent.sum()
    assert counted >= sampler.formation_messages + sampler.gossip_messages
    # and it is a different process from the reference with the same seed
    assert result.bytes_sent != reference.bytes_sent


def test_rounds_are_deterministic_and_seeded():
    config = rounds(n_peers=24, group_size=4)
    first, again = simulate(config), simulate(config)
    np.testing.assert_array_equal(first.aggregations_per_peer, again.aggregations_per_peer)
    assert first.sim_time == again.sim_time and first.bytes_sent == again.bytes_sent
    assert simulate(dataclasses.replace(config, seed=2)).bytes_sent != first.bytes_sent


def test_groups_of_one_form_in_rounds():
    """Every peer aggregates alone until its budget is spent (an attempt that needs nobody
    else is complete at once: the invitation wave used to return before marking it)."""
    config = rounds(n_peers=20, group_size=1, ratio=3)
    result = simulate(config)
    assert result.aggregations == 60 and result.stop_reason.startswith("fewer than 1 peers")
    np.testing.assert_array_equal(result.aggregations_per_peer, 3)


@pytest.mark.parametrize("latency", ["exponential", "constant"])  # constant: GroupBatches
@pytest.mark.parametrize("group_size", [1, 4])
def test_groups_started_together_are_the_groups_started_one_by_one(latency, group_size):
    """The groups of a tick go to the sampler in runs (between abandoned attempts), their
    crash draws taken at once: the rows are those of handing them over one at a time."""
    config = dataclasses.replace(
        rounds(n_peers=60, group_size=group_size, ratio=3, max_retries=1),
        network=NetworkConfig(latency=latency),
    )
    one_by_one = GossipSampler._group_formed

    def each(self, groups, curators):
        for members, curator in zip(groups, curators.tolist(), strict=True):
            one_by_one(self, members, curator)

    with recording() as log:
        together = simulate(config)
    assert group_size == 1 or log.world.sampler.attempts_failed > 0  # runs between abandons
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(GossipSampler, "_groups_formed", each)
        alone = simulate(config)
    np.testing.assert_array_equal(together.aggregations_per_peer, alone.aggregations_per_peer)
    assert together.bytes_sent == alone.bytes_sent and together.messages_sent == alone.messages_sent
    assert together.sim_time == pytest.approx(alone.sim_time, rel=1e-12)


# -- what holds exactly ------------------------------------------------------------------------
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_peers=st.integers(6, 40),
    group_fraction=st.floats(0.05, 0.6),
    ratio=st.integers(1, 5),
    mode=st.sampled_from(["group", "full"]),
    overlay=st.sampled_from(["random-regular", "erdos-renyi", "watts-strogatz", "barabasi-albert"]),
    view_size=st.integers(2, 20),
    max_retries=st.integers(0, 3),
    lock_timeout=st.sampled_from([0.15, 2.0]),  # 0.15 s: locks expire while inviting
    seed=st.integers(0, 1000),
)
def test_rounds_keep_every_invariant(
    n_peers, group_fraction, ratio, mode, overlay, view_size, max_retries, lock_timeout, seed
):
    config = rounds(
        n_peers=n_peers,
        group_size=max(1, round(group_fraction * n_peers)),
        ratio=ratio,
        mode=mode,
        seed=seed,
        max_failed=10,
        overlay=overlay,
        degree=4,
        attachment=2,
        allow_disconnected=True,
        view_size=view_size,
        max_retries=max_retries,
        lock_timeout=lock_timeout,
    )
    with recording() as log, starts() as seen:
        result = simulate(config)
    check_invariants(config, result, log)
    assert isinstance(log.world.sampler.formation, RoundFormation)
    g = config.groups.group_size
    assert seen or result.stop_reason  # a run may end before any group (P < 2 g, ...)
    for start in seen:
        assert start.ready and start.members.size == g
        assert start.curator in start.members.tolist()


def test_groups_and_curators_are_uniform_in_rounds():
    """Chi-square of memberships, pairs and curator positions (P = 20, g = 5, 800 groups)."""
    with starts() as seen:
        for seed in range(4):
            simulate(
                rounds(n_peers=20, group_size=5, ratio=40, seed=seed, overlay="watts-strogatz")
            )
    groups = np.array([start.members for start in seen])
    assert groups.shape == (len(seen), 5) and len(seen) >= 600
    halves = [groups[i : i + 80] for i in range(0, len(groups), 160)]  # before budgets bind
    assert stats.chisquare(np.bincount(np.concatenate(halves).ravel(), minlength=20)).pvalue > 0.01
    together = np.zeros((20, 20))
    for members in groups:
        together[np.ix_(members, members)] += 1
    assert stats.chisquare(together[np.triu_indices(20, 1)]).pvalue > 0.01
    # the curator is the nonce sum's member: uniform over the member list's positions
    positions = [start.members.tolist().index(start.curator) for start in seen]
    assert stats.chisquare(np.bincount(positions, minlength=5)).pvalue > 0.01


# -- what agrees statistically -----------------------------------------------------------------
def _runs(formation: str, seeds: range) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {"aggregations": [], "sim_time": [], "messages": []}
    out["start_times"] = []
    for seed in seeds:
        config = scenario(n_peers=100, group_size=10, ratio=10, seed=seed, formation=formation)
        with recording() as log, starts() as seen:
            result = simulate(config)
        sampler = log.world.sampler
        out["aggregations"].append(result.aggregations)
        out["sim_time"].append(result.sim_time)
        out["messages"].append(sampler.formation_messages / result.aggregations)
        out["start_times"].extend(start.time for start in seen)
    return {key: np.asarray(value) for key, value in out.items()}


def test_rounds_agree_with_the_reference_in_distribution():
    """P = 100, g = 10, 10 aggregations per peer, 8 seeds each: same budget arithmetic, same
    pace and cost within tolerances, group start times from the same distribution."""
    reference, rounds_ = _runs("messages", range(8)), _runs("rounds", range(100, 108))
    for runs in (reference, rounds_):
        assert np.all((91 <= runs["aggregations"]) & (runs["aggregations"] <= 100))
    ratio = rounds_["sim_time"].mean() / reference["sim_time"].mean()
    assert 0.85 < ratio < 1.15, ratio
    cost = rounds_["messages"].mean() / reference["messages"].mean()
    assert 0.75 < cost < 1.33, cost
    assert stats.ks_2samp(reference["start_times"], rounds_["start_times"]).pvalue > 0.001


# -- the views' merge ----------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(n_peers=st.integers(3, 30), view_size=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_one_exchange_merges_as_merge_views_for_each_side(n_peers, view_size, seed):
    """Both partners keep the union's freshest distinct entries, themselves excluded."""
    rng = np.random.default_rng(seed)
    overlay = build_overlay(GossipConfig(overlay="erdos-renyi", edge_probability=0.5,
                                         allow_disconnected=True), n_peers, rng=rng)  # fmt: skip
    views = Newscast(overlay, view_size, rng=rng)
    a, b = rng.choice(n_peers, size=2, replace=False)
    stamps = 1.0 + rng.random(2)
    union_ids = np.concatenate([views.ids[a], views.ids[b], [a, b]])[None, :]
    union_stamps = np.concatenate([views.stamps[a], views.stamps[b], stamps])[None, :]
    expected = {
        peer: merge_views(union_ids, union_stamps, np.array([peer]), view_size) for peer in (a, b)
    }
    before = views.ids.copy(), views.stamps.copy()
    # merged in numpy, alone in Python, then compiled
    for batch_from, compiled_from in ((1, 2), (2, 2), (2, 1)):
        views.ids, views.stamps = before[0].copy(), before[1].copy()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(views_module, "_BATCH_FROM", batch_from)
            patch.setattr(views_module, "COMPILED_FROM", compiled_from)
            views.exchange(np.array([a]), np.array([b]), stamps[:1], stamps[1:], np.array([True]))
        for peer, (ids, peer_stamps) in expected.items():
            np.testing.assert_array_equal(views.ids[peer], ids[0])
            np.testing.assert_array_equal(views.stamps[peer], peer_stamps[0])


@settings(max_examples=30, deadline=None)
@given(
    n_peers=st.integers(3, 30),
    view_size=st.integers(1, 8),
    seed=st.integers(0, 10_000),
    compiled=st.booleans(),
)
def test_forgetting_many_at_once_is_forgetting_one_after_the_other(
    n_peers, view_size, seed, compiled
):
    """The rounds' batch of forgets (peers repeated, some entries absent) equals the calls,
    in numpy and in compiled code (what large runs use)."""
    rng = np.random.default_rng(seed)
    overlay = build_overlay(GossipConfig(overlay="erdos-renyi", edge_probability=1.0,
                                         allow_disconnected=True), n_peers, rng=rng)  # fmt: skip
    batched = Newscast(overlay, view_size, rng=rng)
    one_by_one = Newscast(overlay, view_size, rng=np.random.default_rng(0))
    one_by_one.ids, one_by_one.stamps = batched.ids.copy(), batched.stamps.copy()
    n_empty = int(np.count_nonzero(batched.ids < 0))
    peers = rng.integers(n_peers, size=2 * n_peers)
    others = np.where(rng.random(peers.size) < 0.8, batched.ids[peers, 0], rng.integers(n_peers))
    others = np.where(others < 0, rng.integers(n_peers, size=peers.size), others)
    for peer, other in zip(peers.tolist(), others.tolist(), strict=True):
        one_by_one.forget(peer, other)
    with pytest.MonkeyPatch.context() as patch:  # compiled from 0 peers on, or never
        patch.setattr(views_module, "COMPILED_FROM", 0 if compiled else 10**9)
        batched.forget_all(peers, others)
    np.testing.assert_array_equal(batched.ids, one_by_one.ids)
    np.testing.assert_array_equal(batched.stamps, one_by_one.stamps)
    assert np.count_nonzero(batched.ids < 0) > n_empty  # entries were forgotten
