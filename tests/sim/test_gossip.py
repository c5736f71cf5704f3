"""Gossip group formation: Newscast views, the formation protocol, faults, invariants."""

from __future__ import annotations

import copy
import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.sparse import csr_array
from scipy.sparse.csgraph import connected_components

from p2pdp.config import NetworkConfig, ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.settings import EvaluationConfig
from p2pdp.protocols.settings import GossipConfig
from p2pdp.sim import world as world_module
from p2pdp.sim.gossip import Newscast, bootstrap_views, merge_views
from p2pdp.sim.gossip import compiled as compiled_module
from p2pdp.sim.gossip import views as views_module
from p2pdp.sim.overlay import build_overlay
from p2pdp.sim.transport import Transport
from tests.conftest import tiny_config

FAST = {"gossip_period": 1.0, "backoff": 2.0, "invite_timeout": 0.3, "lock_timeout": 2.0}


def scenario(
    *,
    n_peers=30,
    group_size=5,
    ratio=4,
    mode="group",
    loss=0.0,
    seed=1,
    max_failed=20,
    **gossip,
) -> ScenarioConfig:
    """A small synthetic world with the gossip sampler and fast protocol timers."""
    return tiny_config(
        seed=seed,
        data={"synthetic_rows": max(200, 10 * n_peers), "synthetic_test_rows": 100},
        partition={"n_peers": n_peers},
        privacy={"epsilon": 1.0, "epsilon_per_aggregation": 1.0 / ratio},
        groups={
            "sampler": "gossip",
            "group_size": group_size,
            "collect_timeout": 1.0,
            "max_failed_attempts": max_failed,
        },
        network={"latency": "exponential", "loss": loss},
        gossip={**FAST, **gossip},
        publication={"mode": mode},
        evaluation=EvaluationConfig(split="fixed"),
    )


@dataclass
class Log:
    """What :func:`recording` saw: the world, started and published groups, lost publications."""

    world: world_module.World | None = None
    started: list[np.ndarray] = field(default_factory=list)
    published: list[tuple[np.ndarray, int, np.ndarray]] = field(default_factory=list)
    publications_lost: int = 0
    overlap: bool = False


@contextmanager
def recording():
    """Observe the next runs: every group started/published, and every PUBLISH message lost."""
    log = Log()
    busy: set[int] = set()
    world_cls = world_module.World
    run, start, finish, publish = (
        world_cls.run,
        world_cls.start_group,
        world_cls.finish_group,
        world_cls.publish,
    )
    send, receive = Transport.send, world_module.Peer.receive

    def run_(self):
        log.world = self
        run(self)

    def start_(self, members, curator, **kwargs):
        log.overlap |= not busy.isdisjoint(members.tolist())
        busy.update(members.tolist())
        log.started.append(members.copy())
        return start(self, members, curator, **kwargs)

    def finish_(self, group, *, published):
        busy.difference_update(group.members.tolist())
        return finish(self, group, published=published)

    def publish_(self, group, model):  # members, contributors, who was online at release
        log.published.append((group.members.copy(), len(group.sizes), self.online.copy()))
        return publish(self, group, model)

    def send_(self, sender, deliver, message, n_bytes, **kwargs):
        before = self.messages_lost
        send(self, sender, deliver, message, n_bytes, **kwargs)
        kind = getattr(message, "kind", None)
        log.publications_lost += kind == world_module.PUBLISH and self.messages_lost > before

    def receive_(self, message):
        offline = not self.world.online[self.peer_id]
        log.publications_lost += message.kind == world_module.PUBLISH and offline
        receive(self, message)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(world_cls, "run", run_)
        patch.setattr(world_cls, "start_group", start_)
        patch.setattr(world_cls, "finish_group", finish_)
        patch.setattr(world_cls, "publish", publish_)
        patch.setattr(Transport, "send", send_)
        patch.setattr(world_module.Peer, "receive", receive_)
        yield log


# -- configuration -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overlay": "ring"}, "gossip.overlay must be one of"),
        ({"degree": 0}, "gossip.degree must be an integer >= 1, got 0"),
        ({"edge_probability": 0.0}, "gossip.edge_probability must be > 0"),
        ({"edge_probability": 1.5}, r"gossip.edge_probability must be in \[0, 1\], got 1.5"),
        ({"rewiring": -0.1}, "gossip.rewiring"),
        ({"view_size": 0}, "gossip.view_size"),
        ({"gossip_period": 0.0}, "gossip.gossip_period must be > 0"),
        ({"invite_timeout": float("nan")}, "gossip.invite_timeout"),
        ({"max_retries": -1}, "gossip.max_retries must be an integer >= 0, got -1"),
        ({"churn": "yes"}, "gossip.churn must be true or false, got 'yes'"),
        ({"session_sigma": -1.0}, "gossip.session_sigma"),
        ({"curator_crash_probability": 2.0}, "gossip.curator_crash_probability"),
    ],
)
def test_gossip_config_names_key_and_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        GossipConfig(**kwargs)


# -- Newscast views ------------------------------------------------------------------------
def merge_reference(ids, stamps, owner, view_size):
    """One row, written plainly: freshest stamp per id, owner and empties dropped, top c."""
    best: dict[int, float] = {}
    for peer, stamp in zip(ids.tolist(), stamps.tolist(), strict=True):
        if peer >= 0 and peer != owner and stamp > -np.inf and stamp > best.get(peer, -np.inf):
            best[peer] = stamp
    return sorted(best.items(), key=lambda item: -item[1])[:view_size]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    width=st.integers(1, 12),
    view_size=st.integers(1, 8),
    seed=st.integers(0, 10_000),
)
def test_merge_views_keeps_the_freshest_distinct_entries(rows, width, view_size, seed):
    width = max(width, view_size)
    rng = np.random.default_rng(seed)
    ids = rng.integers(-1, 8, size=(rows, width))
    stamps = rng.permutation(rows * width).reshape(rows, width).astype(float)  # no ties
    stamps[rng.random((rows, width)) < 0.2] = -np.inf
    owners = rng.integers(0, 8, size=rows)
    got_ids, got_stamps = merge_views(ids, stamps, owners, view_size)
    assert got_ids.shape == got_stamps.shape == (rows, view_size)
    for r in range(rows):
        expected = merge_reference(ids[r], stamps[r], owners[r], view_size)
        used = got_ids[r] >= 0
        kept = zip(got_ids[r][used].tolist(), got_stamps[r][used].tolist(), strict=True)
        assert list(kept) == expected
        assert np.all(got_ids[r][~used] == -1) and np.all(np.isneginf(got_stamps[r][~used]))
        assert np.all(used[: len(expected)])  # used slots come first


def test_bootstrap_views_are_random_overlay_neighbours():
    rng = np.random.default_rng(3)
    overlay = build_overlay(GossipConfig(overlay="barabasi-albert", attachment=3), 400, rng=rng)
    ids, stamps = bootstrap_views(overlay, 8, rng=rng)
    for peer in range(overlay.n_peers):
        row = ids[peer][ids[peer] >= 0]
        assert len(row) == min(8, overlay.degrees()[peer]) == len(set(row.tolist()))
        assert set(row.tolist()) <= set(overlay.neighbours(peer).tolist())
        assert np.all(np.isfinite(stamps[peer][: len(row)]))
        assert np.all((stamps[peer][: len(row)] <= 0) & (stamps[peer][: len(row)] > -1))
    hub = int(np.argmax(overlay.degrees()))  # a hub shows a different sample of its neighbours
    assert not np.array_equal(ids[hub], bootstrap_views(overlay, 8, rng=rng)[0][hub])


@pytest.mark.parametrize("view_size", [4, 10, 12])
@pytest.mark.parametrize("overlay", ["random-regular", "barabasi-albert"])
def test_bootstrap_views_shuffle_each_peers_neighbours_by_its_draws(overlay, view_size):
    """Each peer's first views are its neighbours ordered by one uniform each, drawn in
    the overlay's order (a stable sort by peer, then draw): the same views whether the
    overlay is regular (its rows sorted as one table) or not."""
    config = GossipConfig(overlay=overlay, degree=10, attachment=3)
    graph = build_overlay(config, 300, rng=np.random.default_rng(5))
    ids, _ = bootstrap_views(graph, view_size, rng=np.random.default_rng(6))
    draws = np.random.default_rng(6).random(graph.indices.size)
    for peer in range(graph.n_peers):
        span = slice(graph.indptr[peer], graph.indptr[peer + 1])
        shuffled = graph.indices[span][np.argsort(draws[span], kind="stable")][:view_size]
        np.testing.assert_array_equal(ids[peer][ids[peer] >= 0], shuffled)


@settings(max_examples=30, deadline=None)
@given(n_peers=st.integers(3, 12), n_pairs=st.integers(1, 12), seed=st.integers(0, 10_000))
def test_batched_exchange_equals_the_sequential_exchanges(n_peers, n_pairs, seed):
    """Partners repeat and initiators are partners too: batching must not lose a merge."""
    rng = np.random.default_rng(seed)
    config = GossipConfig(overlay="erdos-renyi", edge_probability=1.0)
    overlay = build_overlay(config, n_peers, rng=rng)
    batched = Newscast(overlay, 4, rng=np.random.default_rng(seed))
    sequential = Newscast(overlay, 4, rng=np.random.default_rng(seed))
    initiators = rng.permutation(n_peers)[: min(n_pairs, n_peers)]
    partners = (initiators + rng.integers(1, n_peers, size=initiators.size)) % n_peers
    stamps = rng.random((2, initiators.size)) + 1.0
    stamps[1, rng.random(initiators.size) < 0.3] = -np.inf  # some partners do not advertise
    reply = rng.random(initiators.size) < 0.7
    batched.exchange(initiators, partners, stamps[0], stamps[1], reply)
    for k in range(initiators.size):
        one = slice(k, k + 1)
        sequential.exchange(
            initiators[one], partners[one], stamps[0, one], stamps[1, one], reply[one]
        )
    np.testing.assert_array_equal(batched.ids, sequential.ids)
    np.testing.assert_array_equal(batched.stamps, sequential.stamps)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exchanges_merged_in_numpy_one_by_one_in_python_or_compiled_give_the_same_views(
    seed, monkeypatch
):
    """Every exchange merged in batches (numpy), every one alone (Python) or all in order in
    compiled code: same views, over rounds where views fill, hubs form and some peers do not
    advertise themselves; and the same partners chosen in numpy and in compiled code."""
    rng = np.random.default_rng(seed)
    n, c = 400, 6
    overlay = build_overlay(GossipConfig(overlay="barabasi-albert", attachment=3), n, rng=rng)
    paths = {"numpy": (1, n + 1), "python": (n + 1, n + 1), "compiled": (n + 1, 1)}
    views = {name: Newscast(overlay, c, rng=np.random.default_rng(seed)) for name in paths}
    merged = dict.fromkeys(paths, 0)
    counted = {"numpy": (Newscast, "_merge"), "python": (Newscast, "_merge_one"),
               "compiled": (compiled_module, "exchange_in_order")}  # fmt: skip
    for name, (owner, method) in counted.items():  # count what each path merges, to see it ran
        original = getattr(owner, method)

        def counting(*args, _original=original, _name=name):
            merged[_name] += np.size(args[2] if _name == "compiled" else args[1])
            return _original(*args)

        monkeypatch.setattr(owner, method, counting)
    for period in range(12):
        peers = rng.permutation(n)
        chosen = {}  # the partners drawn in numpy and in compiled code, from the same stream
        for name, compiled_from in (("compiled", 1), ("numpy", n + 1)):
            monkeypatch.setattr(views_module, "COMPILED_FROM", compiled_from)
            draws = copy.deepcopy(rng) if name == "compiled" else rng
            chosen[name] = views["numpy"].partners(peers, rng=draws)
        np.testing.assert_array_equal(chosen["compiled"], chosen["numpy"])
        partners = chosen["numpy"]
        keep = partners >= 0
        peers, partners = peers[keep], partners[keep]
        stamps = period + rng.random((2, peers.size))
        stamps[rng.random((2, peers.size)) < 0.05] = -np.inf  # retired: not advertised
        reply = rng.random(peers.size) < 0.9
        for name, (batch_from, compiled_from) in paths.items():
            monkeypatch.setattr(views_module, "_BATCH_FROM", batch_from)
            monkeypatch.setattr(views_module, "COMPILED_FROM", compiled_from)
            views[name].exchange(peers, partners, stamps[0], stamps[1], reply)
        for name in ("python", "compiled"):
            np.testing.assert_array_equal(views[name].ids, views["numpy"].ids)
            np.testing.assert_array_equal(views[name].stamps, views["numpy"].stamps)
    assert merged["numpy"] == merged["python"] == merged["compiled"] > 12 * n * 0.9
    assert np.count_nonzero(views["numpy"].ids < 0) < n  # views filled up


@pytest.mark.parametrize("formation", ["messages", "rounds"])
def test_a_run_with_its_exchanges_compiled_gives_the_rows_of_numpys(formation, monkeypatch):
    """The compiled exchanges are wired where a run exchanges views: forcing them on every
    tick (and off) changes nothing a run reports (a large run turns them on by itself)."""
    config = scenario(n_peers=60, group_size=5, ratio=4, formation=formation)
    if formation == "rounds":  # rounds: fault-free, constant latency
        config = dataclasses.replace(config, network=NetworkConfig(latency_mean=0.05))
    calls = []
    original = compiled_module.exchange_in_order
    monkeypatch.setattr(
        compiled_module, "exchange_in_order", lambda *a: calls.append(1) or original(*a)
    )
    results = []
    for compiled_from in (10**9, 1):
        monkeypatch.setattr(views_module, "COMPILED_FROM", compiled_from)
        results.append(simulate(config))
    assert len(calls) > 50  # every tick of the second run, none of the first
    assert results[0].aggregations > 0
    numpy_row, compiled_row = (
        {key: value for key, value in result.row().items() if not key.startswith("wall_")}
        for result in results
    )
    assert compiled_row.keys() == numpy_row.keys()
    for key, value in numpy_row.items():
        if isinstance(value, float):
            assert compiled_row[key] == pytest.approx(value, rel=1e-12, nan_ok=True), key
        else:
            assert compiled_row[key] == value, key


def test_views_mix_away_from_the_overlay():
    """From a ring lattice, views become uniform samples of the network and stay connected."""
    n, c = 500, 20
    rng = np.random.default_rng(7)
    ring = build_overlay(
        GossipConfig(overlay="watts-strogatz", degree=10, rewiring=0.0), n, rng=rng
    )
    views = Newscast(ring, c, rng=rng)
    for period in range(1, 31):
        peers = rng.permutation(n)
        partners = views.partners(peers, rng=rng)
        stamps = period + rng.random((2, n))
        views.exchange(peers, partners, stamps[0], stamps[1], np.ones(n, dtype=bool))
    ring_distance = np.abs(views.ids - np.arange(n)[:, None])
    ring_distance = np.minimum(ring_distance, n - ring_distance)
    assert np.mean(ring_distance <= 5) < 0.04  # 1.0 at the start, 10/499 if uniform
    assert abs(ring_distance.mean() - n / 4) < 10  # uniform on the ring: n/4
    assert np.all(views.ids >= 0)  # views stay full
    view_graph = csr_array((np.ones(n * c), (np.repeat(np.arange(n), c), views.ids.ravel())))
    assert connected_components(view_graph, directed=True, connection="weak")[0] == 1


# -- the protocol in the world -------------------------------------------------------------
def test_budget_arithmetic_100_peers_as_the_central_sampler():
    """P = 100, g = 10, epsilon / epsilon_A = 10: between 91 and 100 aggregations."""
    with recording() as log:
        result = simulate(scenario(n_peers=100, group_size=10, ratio=10, mode="full"))
    assert 91 <= result.aggregations <= 100
    assert result.aggregations_per_peer.max() == 10
    assert np.count_nonzero(result.aggregations_per_peer < 10) < 10
    assert result.stop_reason == "fewer than 10 peers can afford another aggregation"
    assert not log.overlap
    sampler = log.world.sampler
    assert sampler.groups_started == result.aggregations + result.aborted_groups
    assert sampler.formation_messages >= 6 * 9 * result.aggregations  # 3 round trips
    assert sampler.gossip_messages > 0


def test_deterministic_and_seeded():
    config = scenario(n_peers=24, group_size=4)
    first, again = simulate(config), simulate(config)
    np.testing.assert_array_equal(first.aggregations_per_peer, again.aggregations_per_peer)
    assert first.sim_time == again.sim_time and first.bytes_sent == again.bytes_sent
    other = simulate(dataclasses.replace(config, seed=2))
    assert first.bytes_sent != other.bytes_sent


def test_groups_are_uniform_like_the_central_sampler():
    """Chi-square of peer and pair memberships: no detectable preference (P = 20, g = 5)."""
    with recording() as log:
        simulate(scenario(n_peers=20, group_size=5, ratio=40, overlay="watts-strogatz", degree=4))
    groups = np.array(log.started)
    assert groups.shape[1] == 5 and len(groups) >= 150
    first_half = groups[: len(groups) // 2].ravel()  # before budgets bind
    assert stats.chisquare(np.bincount(first_half, minlength=20)).pvalue > 0.01
    together = np.zeros((20, 20))
    for members in groups:
        together[np.ix_(members, members)] += 1
    assert stats.chisquare(together[np.triu_indices(20, 1)]).pvalue > 0.01


def test_crashed_curators_abort_every_group_and_nobody_pays():
    with recording() as log:
        result = simulate(scenario(curator_crash_probability=1.0, max_failed=10))
    assert result.aggregations == 0 and result.aborted_groups >= 1
    assert np.all(result.epsilon_spent == 0)
    assert result.stop_reason == "10 aggregations in a row failed"
    assert not log.published


def test_the_observer_stops_at_the_aborted_aggregation_that_reaches_max_failed(monkeypatch):
    """The shared stop rule (p2pdp.protocols.gossip.stop_reason) in the simulator: with every
    curator crashing, the reason appears at the group end that makes the aborts in a row
    reach ``groups.max_failed_attempts``, not before and not after."""
    from p2pdp.sim.gossip.sampler import GossipSampler

    seen = []
    finished = GossipSampler.group_finished

    def spy(self, group, *, published):
        finished(self, group, published=published)
        seen.append((self.aborted_in_a_row, self.stop_reason))

    monkeypatch.setattr(GossipSampler, "group_finished", spy)
    simulate(scenario(curator_crash_probability=1.0, max_failed=4))
    first = next(i for i, (_, reason) in enumerate(seen) if reason)
    assert seen[first] == (4, "4 aggregations in a row failed")
    assert all(aborted < 4 for aborted, _ in seen[:first])


def test_a_member_that_crashes_before_submitting_aborts_its_group():
    with recording() as log:
        result = simulate(scenario(member_crash_probability=1.0, max_failed=10))
    assert result.aggregations == 0 and result.aborted_groups == len(log.started) >= 1
    assert np.all(result.aggregations_per_peer == 0)


def test_heavy_loss_stops_after_failed_attempts_without_charging():
    result = simulate(scenario(loss=0.5, max_failed=15))
    assert result.messages_lost > 0
    assert result.aggregations_per_peer.sum() == 5 * result.aggregations
    assert result.stop_reason.endswith("stopped initiating after 15 failures in a row")


def check_invariants(config: ScenarioConfig, result, log: Log) -> None:
    """The safety properties that must hold whatever the faults."""
    world, g, mode = log.world, config.groups.group_size, config.publication.mode
    assert world.sampler.done.triggered and result.stop_reason
    # no peer ever overspends, and is charged exactly for the published aggregates it joined
    assert np.all(result.epsilon_spent <= config.privacy.epsilon + 1e-9)
    joined = np.zeros(config.partition.n_peers, dtype=np.int64)
    for members, contributors, _ in log.published:
        joined[members] += 1
        # no aggregate is published with fewer than g contributors
        assert contributors == len(members) == len(set(members.tolist())) == g
    np.testing.assert_array_equal(result.aggregations_per_peer, joined)
    assert result.aggregations == len(log.published)
    assert all(len(set(m.tolist())) == g for m in log.started) and not log.overlap
    # every published model reaches whom the publication mode says, or the loss is counted
    received: dict[int, set[int]] = {}
    for peer, index in world.receipts:
        received.setdefault(index, set()).add(peer)
    missing = 0
    for index, (members, _, online) in enumerate(log.published):
        got = received.get(index, set())
        if mode == "full":
            assert world.shared[index] == bool(online.all())
            assert world.shared[index] or got == set(np.flatnonzero(online).tolist())
        else:
            assert got <= set(members.tolist())
            missing += g - len(got)
    assert missing == log.publications_lost


FAULTY = {
    "churn": True,
    "session_median": 20.0,
    "downtime_median": 5.0,
    "curator_crash_probability": 0.1,
    "member_crash_probability": 0.1,
}


@pytest.mark.parametrize("mode", ["group", "full"])
def test_moderate_faults_publish_abort_and_lose_yet_keep_the_invariants(mode):
    config = scenario(group_size=4, loss=0.1, mode=mode, max_failed=10, **FAULTY)
    with recording() as log:
        result = simulate(config)
    check_invariants(config, result, log)
    assert result.aggregations >= 15 and result.aborted_groups >= 5  # the faults did bite
    assert any(not online.all() for _, _, online in log.published)  # released during churn
    assert mode == "full" or log.publications_lost > 0


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    n_peers=st.integers(6, 24),
    group_fraction=st.floats(0.05, 0.6),
    ratio=st.integers(1, 4),
    loss=st.sampled_from([0.0, 0.2, 0.5]),
    churn=st.booleans(),
    crash=st.sampled_from([0.0, 0.3]),
    mode=st.sampled_from(["group", "full"]),
    overlay=st.sampled_from(["random-regular", "erdos-renyi", "watts-strogatz", "barabasi-albert"]),
    seed=st.integers(0, 1000),
)
def test_invariants_under_churn_loss_and_crashes(
    n_peers, group_fraction, ratio, loss, churn, crash, mode, overlay, seed
):
    config = scenario(
        n_peers=n_peers,
        group_size=max(1, round(group_fraction * n_peers)),
        ratio=ratio,
        mode=mode,
        loss=loss,
        seed=seed,
        max_failed=10,
        overlay=overlay,
        degree=4,
        attachment=2,
        allow_disconnected=True,
        **{
            **FAULTY,
            "churn": churn,
            "curator_crash_probability": crash,
            "member_crash_probability": crash,
        },
    )
    with recording() as log:
        result = simulate(config)
    check_invariants(config, result, log)


class FaultObserver(world_module.WorldObserver):
    """Counts what the world reports: lost messages, churn transitions, aborted groups."""

    def __init__(self) -> None:
        self.lost = 0
        self.transitions: dict[int, list[bool]] = {}
        self.aborts: list[str] = []
        self.world = None

    def message_lost(self, world, sender) -> None:
        self.world = world
        self.lost += 1

    def peer_offline(self, world, peer) -> None:
        self.world = world
        self.transitions.setdefault(peer, []).append(False)

    def peer_online(self, world, peer) -> None:
        self.transitions.setdefault(peer, []).append(True)

    def aborted(self, world, group, reason) -> None:
        self.aborts.append(reason)


def test_observers_see_every_lost_message_churn_transition_and_abort():
    config = scenario(group_size=4, loss=0.1, max_failed=10, **FAULTY)
    observer = FaultObserver()
    result = simulate(config, observers=(observer,))
    assert observer.lost == result.messages_lost > 0
    assert len(observer.aborts) == result.aborted_groups > 0
    assert set(observer.aborts) <= {"collect timeout", "curator offline"}
    online = observer.world.online
    assert observer.transitions and not online.all()
    for peer, states in observer.transitions.items():
        assert states[-1] == bool(online[peer])  # the last transition is the final state
