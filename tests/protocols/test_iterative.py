"""Iterative protocols (issue 20): mixing, the private step, accounting, wiring, records.

Wiring tests go from a config to what a peer actually releases: the noise law of a step at
the clipping norm this file computes itself, the epsilon the accountant states for the steps
actually taken against an independent computation, budgets that stop peers, and the
``rounds`` table a run writes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from scipy import integrate, optimize, stats

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import Scenario
from p2pdp.learning.local_problem import LocalProblem
from p2pdp.privacy.accountants import RdpAccountant, subsampled_gaussian_rdp
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.privacy.events import SubsampledGaussianEvent
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.iterative import DecentralizedSGD, step_privacy
from p2pdp.protocols.mixing import Mixing
from p2pdp.sim.transport import Transport
from tests.conftest import tiny_config


def _config(privacy: dict | None = None, **protocol) -> ScenarioConfig:
    settings = {"name": "dpsgd", "rounds": 10, "eval_every": 5, **protocol}
    if protocol.get("sampling") == "poisson":
        privacy = {"min_shard_size": 5, **(privacy or {})}
    return tiny_config(
        training={"lam": 0.01},
        privacy={"mechanism": "gaussian", "epsilon": 2.0, "delta": 1e-5, **(privacy or {})},
        gossip={"degree": 4},
        evaluation={"cv_folds": 2},
        protocol=settings,
    )


def _non_private(**protocol) -> ScenarioConfig:
    """:func:`_config` with no noise on the steps (``privacy.mechanism = "none"``)."""
    config = _config(**protocol)
    return dataclasses.replace(config, privacy=PrivacyConfig(mechanism="none", epsilon=2.0))


def _mixing_of(graph: nx.Graph) -> Mixing:
    n = graph.number_of_nodes()
    adjacency = sp.csr_array(nx.to_scipy_sparse_array(graph, nodelist=range(n)))
    adjacency.sort_indices()
    return Mixing.metropolis_hastings(adjacency.indptr, adjacency.indices)


def _overlay_mixing(n: int = 30, degree: int = 4, seed: int = 3) -> tuple[nx.Graph, Mixing]:
    graph = nx.random_regular_graph(degree, n, seed=seed)
    return graph, _mixing_of(graph)


# --- mixing -----------------------------------------------------------------------------------
IRREGULAR = {
    "star": nx.star_graph(9),
    "path": nx.path_graph(10),
    "erdos-renyi": nx.erdos_renyi_graph(30, 0.15, seed=4),
}


@pytest.mark.parametrize("overlay", ["random-regular", *IRREGULAR])
def test_metropolis_hastings_weights_match_networkx_reference(overlay) -> None:
    """Symmetric and doubly stochastic on irregular overlays too (unequal degrees)."""
    if overlay == "random-regular":
        graph, mixing = _overlay_mixing()
    else:
        graph = IRREGULAR[overlay]
        mixing = _mixing_of(graph)
    W = mixing.matrix().toarray()
    reference = np.zeros_like(W)
    for i, j in graph.edges():
        reference[i, j] = reference[j, i] = 1 / (1 + max(graph.degree[i], graph.degree[j]))
    np.fill_diagonal(reference, 1 - reference.sum(axis=1))
    np.testing.assert_allclose(W, reference, atol=1e-15)
    np.testing.assert_allclose(W, W.T, atol=1e-15)
    np.testing.assert_allclose(W.sum(axis=0), 1.0, atol=1e-12)
    assert (W >= 0).all()
    second = np.sort(np.abs(np.linalg.eigvalsh(reference)))[-2]
    assert mixing.spectral_gap() == pytest.approx(1 - second, abs=1e-12)


@pytest.mark.parametrize("overlay", ["random-regular", *IRREGULAR])
def test_average_keeps_lost_weight_on_own_model_and_mean_when_all_arrive(overlay) -> None:
    mixing = _overlay_mixing()[1] if overlay == "random-regular" else _mixing_of(IRREGULAR[overlay])
    models = generator(0, "t").normal(size=(mixing.n_peers, 5))
    everything = mixing.average(models, np.ones(len(mixing.indices), dtype=bool))
    np.testing.assert_allclose(everything, mixing.matrix() @ models, atol=1e-12)
    np.testing.assert_allclose(everything.mean(axis=0), models.mean(axis=0), atol=1e-12)
    nothing = mixing.average(models, np.zeros(len(mixing.indices), dtype=bool))
    np.testing.assert_array_equal(nothing, models)


# --- the private step -------------------------------------------------------------------------
def _problem(rng: np.random.Generator, n_peers: int = 40, rows: int = 6) -> LocalProblem:
    X = rng.normal(size=(n_peers * rows, 4))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.where(rng.random(n_peers * rows) < 0.5, -1.0, 1.0)
    shards = tuple(np.arange(i * rows, (i + 1) * rows) for i in range(n_peers))
    return LocalProblem.from_shards(X, y, shards, lam=0.1)


def _without_neighbours(config, problem: LocalProblem, privacy) -> DecentralizedSGD:
    """D-PSGD on ``problem`` over an overlay without edges: a step is all that happens."""
    empty = Mixing.metropolis_hastings(
        np.zeros(problem.n_peers + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    )
    rngs = {name: generator(2, name) for name in ("noise", "sampling", "gossip")}
    return DecentralizedSGD(config.protocol, problem, empty, privacy, rngs=rngs)


def _clipped_sums_by_hand(problem: LocalProblem, models: np.ndarray, clip: float) -> np.ndarray:
    """Each peer's sum of per-record logistic gradients, clipped to ``clip``: a loop."""
    sums = np.zeros_like(models)
    for peer in range(problem.n_peers):
        for r in range(problem.indptr[peer], problem.indptr[peer + 1]):
            x, y = problem.X[r], problem.y[r]
            gradient = -y * x / (1 + math.exp(y * x @ models[peer]))
            sums[peer] += gradient * min(1.0, clip / np.linalg.norm(gradient))
    return sums


def test_step_releases_clipped_sum_plus_noise_at_the_calibrated_scale() -> None:
    """Config -> released model: (w - w') / eta - lam w = (clipped sum + noise) / n, and the
    noise is N(0, (z C)^2) with z computed here from the budget (KS test)."""
    clip, rounds, epsilon, delta = 0.2, 10, 2.0, 1e-5
    config = _config(clip_norm=clip, rounds=rounds, step_size=0.5)
    privacy = step_privacy(config)

    # independent calibration: `rounds` Gaussian steps of sensitivity 2C are sqrt(T) (2C/sigma)
    # -GDP; delta(eps) of mu-GDP (Dong, Roth & Su) solved for the mu that spends the budget
    def delta_of(mu: float) -> float:
        return stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(
            -epsilon / mu - mu / 2
        )

    mu = optimize.brentq(lambda m: delta_of(m) - delta, 1e-3, 50, xtol=1e-14)
    sigma = 2 * clip * math.sqrt(rounds) / mu
    assert privacy.mechanism.noise_multiplier * clip == pytest.approx(sigma, rel=1e-6)

    rng = generator(1, "problem")
    problem = _problem(rng, n_peers=400)
    protocol = _without_neighbours(config, problem, privacy)
    protocol.models = rng.normal(size=protocol.models.shape)
    before = protocol.models.copy()
    protocol.step()
    gradient = (before - protocol.models) / 0.5 - 0.1 * before
    noise = gradient * problem.sizes[:, None] - _clipped_sums_by_hand(problem, before, clip)
    assert stats.kstest(noise.ravel() / sigma, "norm").pvalue > 1e-3
    assert np.std(noise) == pytest.approx(sigma, rel=0.05)
    np.testing.assert_array_equal(protocol.steps, 1)


def test_step_without_noise_is_exactly_the_clipped_gradient() -> None:
    """Clipping happens whatever the noise: a step at z = 0 moves by the clipped mean."""
    config = _non_private(clip_norm=0.05, step_size=0.5)
    rng = generator(3, "problem")
    problem = _problem(rng, n_peers=50)
    protocol = _without_neighbours(config, problem, step_privacy(config))
    protocol.models = rng.normal(size=protocol.models.shape)
    before = protocol.models.copy()
    protocol.step()
    gradient = (before - protocol.models) / 0.5 - 0.1 * before
    expected = _clipped_sums_by_hand(problem, before, 0.05) / problem.sizes[:, None]
    np.testing.assert_allclose(gradient, expected, rtol=1e-9, atol=1e-12)


def test_poisson_rdp_equals_numerical_integration() -> None:
    q, z = 0.05, 0.8
    orders = np.array([2, 3, 5, 8, 16])
    ours = subsampled_gaussian_rdp(q, z, orders)
    for alpha, value in zip(orders.tolist(), ours, strict=True):

        def integrand(x: float, alpha: int = alpha) -> float:
            ratio = (1 - q) + q * math.exp((2 * x - 1) / (2 * z * z))
            return stats.norm.pdf(x, scale=z) * ratio**alpha

        moment = integrate.quad(integrand, -30, 30, points=[0, 1], limit=400)[0]
        assert value == pytest.approx(math.log(moment) / (alpha - 1), rel=1e-9)
    assert subsampled_gaussian_rdp(1.0, 2.0, np.array([4]))[0] == pytest.approx(4 / 8)


def test_poisson_steps_charge_rdp_of_the_subsampled_event() -> None:
    config = _config(
        {"accountant": "rdp"},
        sampling="poisson",
        sampling_rate=0.2,
        noise_multiplier=1.5,
        rounds=40,
    )
    privacy = step_privacy(config)
    assert privacy.accountant == "rdp"
    assert privacy.event == SubsampledGaussianEvent(1.5, 0.2, relation="add-remove")
    steps = np.array([0, 1, 7, privacy.max_steps])
    spent = privacy.epsilon(steps)
    # independent: RDP at integer orders, converted (Balle et al. 2020), minimised
    alpha = np.arange(2, 257).astype(float)
    one = np.array([subsampled_gaussian_rdp(0.2, 1.5, np.array([a]))[0] for a in alpha])
    for k, value in zip(steps.tolist(), spent, strict=True):
        bound = k * one + np.log1p(-1 / alpha) - (math.log(1e-5) + np.log(alpha)) / (alpha - 1)
        assert value == pytest.approx(0.0 if k == 0 else max(bound.min(), 0), rel=1e-3, abs=1e-12)
    assert spent[-1] <= 2.0 < privacy.epsilon(np.array([privacy.max_steps + 1]))[0]
    assert (
        simulate(
            dataclasses.replace(config, protocol=dataclasses.replace(config.protocol, rounds=3))
        ).row()["privacy.accountant"]
        == "rdp"
    )  # what it used
    with pytest.raises(ConfigError, match=r"'gdp' cannot compose Poisson.*protocol.sampling"):
        dataclasses.replace(config, privacy=dataclasses.replace(config.privacy, accountant="gdp"))


def test_gdp_refuses_subsampled_event_and_basic_gives_inf() -> None:
    from p2pdp.privacy.accounting import make_accountant

    event = SubsampledGaussianEvent(1.0, 0.1)
    assert not make_accountant("gdp").supports(event)
    assert RdpAccountant().supports(event)
    assert (
        make_accountant("basic").composed_epsilon(event, np.array([2]), delta_total=1e-5)[0]
        == math.inf
    )


def test_fixed_size_sampling_picks_batch_size_records_per_peer() -> None:
    mechanism = ClippedGaussianSum(clip_norm=1.0, noise_multiplier=1.0, sampling="fixed",
                                   batch_size=3)  # fmt: skip
    indptr = np.array([0, 2, 7, 15])
    mask = mechanism.select(indptr, generator(0, "s"))
    assert [int(mask[a:b].sum()) for a, b in itertools.pairwise(indptr)] == [2, 3, 3]
    np.testing.assert_array_equal(mechanism.denominators(np.diff(indptr)), [2, 3, 3])


# --- runs ---------------------------------------------------------------------------------------
def test_run_charges_budget_and_writes_rounds() -> None:
    result = simulate(_config(rounds=10, eval_every=5))
    row = result.row()
    assert row["max_epsilon_spent"] == pytest.approx(2.0, rel=1e-6)  # calibrated to spend it
    assert row["mean_steps_per_peer"] == row["min_steps_per_peer"] == 10
    np.testing.assert_array_equal(result.aggregations_per_peer, 10)
    rounds = result.round_rows()
    assert [r["round"] for r in rounds] == list(range(11))
    evaluated = [r["round"] for r in rounds if not math.isnan(r["mean_error"])]
    assert evaluated == [0, 5, 10]
    assert rounds[-1]["mean_error"] == pytest.approx(row["mean_error"])
    assert rounds[-1]["epsilon_spent"] == pytest.approx(2.0, rel=1e-6)
    assert rounds[-1]["bytes_sent"] == row["bytes_sent"] > rounds[5]["bytes_sent"] > 0
    assert row["messages_sent"] == 10 * 20 * 4  # a message per directed edge per round


def test_gossip_learning_stops_each_peer_at_its_budget() -> None:
    config = _config(name="gossip-learning", rounds=30, noise_multiplier=5.0)
    privacy = step_privacy(config)
    assert 0 < privacy.max_steps < 30
    result = simulate(config)
    steps = result.aggregations_per_peer
    assert steps.max() == privacy.max_steps  # some peers reach it, none passes it
    assert (result.epsilon_spent <= 2.0 * (1 + 1e-9)).all()
    assert result.row()["messages_sent"] == pytest.approx(30 * 20, abs=20)


def test_non_private_dpsgd_reaches_the_centralised_model() -> None:
    config = _non_private(rounds=300, step_size=2.0, eval_every=300)
    result = simulate(config)
    row = result.row()
    assert row["max_epsilon_spent"] == math.inf and row["guarantee"] == "none"
    assert row["mean_error"] == pytest.approx(row["centralized_error"], abs=0.01)
    assert row["max_error"] <= row["centralized_error"] + 0.02  # every peer, not just on average


def test_loss_and_lateness_drop_messages_not_the_run() -> None:
    base = _non_private(rounds=5)
    lossy = dataclasses.replace(base, network=dataclasses.replace(base.network, loss=0.3))
    row = simulate(lossy).row()
    assert 0.2 * row["messages_sent"] < row["messages_lost"] < 0.4 * row["messages_sent"]
    late = dataclasses.replace(base, network=dataclasses.replace(
        base.network, latency="exponential", latency_mean=1.0))  # fmt: skip
    row = simulate(late).row()
    assert row["messages_lost"] > 0.3 * row["messages_sent"]  # exp(1) > round period 1 often


def test_transport_exchange_counts_like_send() -> None:
    import simpy

    from p2pdp.config import NetworkConfig

    transport = Transport(simpy.Environment(), NetworkConfig(loss=0.5), 3, rng=generator(0, "n"))
    delivered, late = transport.exchange(np.array([0, 0, 1, 2] * 250), 100, within=1.0)
    np.testing.assert_array_equal(transport.messages_sent, [500, 250, 250])
    np.testing.assert_array_equal(transport.bytes_sent, [50_000, 25_000, 25_000])
    assert transport.messages_lost == 1000 - delivered.sum() and not late.any()
    assert 400 < delivered.sum() < 600


@pytest.mark.parametrize("latency", [0.01, 2.0])  # every message on time / every one late
def test_late_messages_are_read_not_averaged_and_lost_ones_are_not_late(latency) -> None:
    """The synchronous driver: what it hands the protocol to average and what it counts."""
    from p2pdp.protocols.views import ViewTrace
    from p2pdp.sim.iterative import run_iterative

    base = _config(rounds=3)
    config = dataclasses.replace(
        base, network=dataclasses.replace(base.network, latency_mean=latency, loss=0.5)
    )
    problem = _problem(generator(4, "problem"), n_peers=30)
    rngs = {name: generator(4, name) for name in ("noise", "sampling", "gossip")}
    protocol = DecentralizedSGD(
        config.protocol, problem, _overlay_mixing()[1], step_privacy(config), rngs=rngs
    )
    averaged: list[np.ndarray] = []
    original = protocol.average

    def spy(delivered: np.ndarray, late: np.ndarray) -> None:
        averaged.append(delivered.copy())
        original(delivered, late)

    protocol.average = spy  # type: ignore[method-assign]
    trace = ViewTrace()
    run = run_iterative(
        config, protocol, errors=lambda m: np.zeros(len(m)), rng=generator(4, "n"), trace=trace
    )
    transport = run.transport
    sent = int(transport.messages_sent.sum())
    exchanges = [event for event in trace.events if isinstance(event, tuple)]
    assert len(averaged) == len(exchanges) == 3 and sent == 3 * len(protocol.mixing.indices)
    for given, (delivered, late) in zip(averaged, exchanges, strict=True):
        np.testing.assert_array_equal(given, delivered)
        assert not (delivered & late).any()
    on_time = sum(int(d.sum()) for d in averaged)
    late_count = sum(int(late.sum()) for _, late in exchanges)
    assert 0.4 * sent < transport.messages_lost < 0.6 * sent
    assert on_time + late_count + transport.messages_lost == sent
    assert transport.messages_late == late_count
    if latency > 1.0:  # a round of 1 s: nothing arrives in time, the rest is late
        assert on_time == 0 and late_count == sent - transport.messages_lost
    else:
        assert late_count == 0


def test_gossip_learning_merges_by_averaging_the_received_model() -> None:
    """A peer out of budget only merges: its model becomes the average of the two."""
    from p2pdp.protocols.iterative import GossipLearning

    config = _config(name="gossip-learning", noise_multiplier=5.0)
    privacy = step_privacy(config)
    problem = _problem(generator(5, "problem"), n_peers=30)
    rngs = {name: generator(5, name) for name in ("noise", "sampling", "gossip")}
    protocol = GossipLearning(config.protocol, problem, _overlay_mixing()[1], privacy, rngs=rngs)
    protocol.models = generator(5, "models").normal(size=protocol.models.shape)
    own, received = protocol.models[3].copy(), protocol.models[8].copy()
    protocol.steps[3] = privacy.max_steps
    protocol.receive(3, received)
    np.testing.assert_allclose(protocol.models[3], (own + received) / 2, rtol=1e-15)
    protocol.receive(4, received)  # with budget left: merge, then one step from the average
    assert protocol.steps[4] == 1


def test_runs_are_reproducible() -> None:
    config = _config(name="gossip-learning", rounds=5)
    a, b = simulate(config), simulate(config)
    assert a.round_rows() == b.round_rows()
    np.testing.assert_array_equal(a.aggregations_per_peer, b.aggregations_per_peer)


def test_invalid_protocol_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="protocol.clip_norm = inf"):
        _config(clip_norm=math.inf)
    with pytest.raises(
        ConfigError,
        match=r"gossip_steps = 2 is read only with protocol.name = "
        r"'muffliato' \(here 'dpsgd'\)",
    ):
        Scenario(config=_config(gossip_steps=2))  # a scenario refuses what nothing reads
    with pytest.raises(ConfigError, match="gossip_steps = 2 is read only with protocol.name"):
        Scenario(config=_config(name="gossip-learning", gossip_steps=2))
    with pytest.raises(ConfigError, match="protocol.step_size"):
        _config(step_size=-1.0)
    with pytest.raises(ConfigError, match=r"protocol.name = 'dpsgd' is read only with task.name"):
        Scenario(
            config=ScenarioConfig(task={"name": "prevalence-counts"}, protocol={"name": "dpsgd"})
        )
    with pytest.raises(ConfigError, match="protocol.name"):
        _config(name="no-such-protocol")
    config = _config()
    plain = "tests.learning.test_local_problem:NoGradientModel"  # no per-record gradient
    with pytest.raises(ConfigError, match="declares none: give it a method loss_derivative"):
        simulate(
            dataclasses.replace(config, training=dataclasses.replace(config.training, model=plain))
        )


# --- network DP (exact values: tests/protocols/test_network_dp.py) --------------------------------
def test_muffliato_reports_network_dp_no_larger_than_local_dp_and_grows_with_gossip() -> None:
    """Whatever the losses, each pair's network DP is at most local DP; the view of K = 3
    exchanges per step contains that of K = 1's first exchange, so it leaks at least as much
    (the run's Muffliato must really make ``gossip_steps`` exchanges per round)."""
    config = _config(name="muffliato", gossip_steps=3, rounds=3)
    result = simulate(config)
    row = result.row()
    assert row["network_dp_epsilon_max"] <= row["max_epsilon_spent"] * (1 + 1e-12)
    assert row["network_dp_note"] == "" and row["messages_sent"] == 3 * 3 * 20 * 4
    one = simulate(dataclasses.replace(config, protocol=dataclasses.replace(
        config.protocol, gossip_steps=1))).row()  # fmt: skip
    assert row["network_dp_epsilon_mean"] > one["network_dp_epsilon_mean"] * 1.01
    dpsgd = simulate(dataclasses.replace(config, protocol=dataclasses.replace(
        config.protocol, name="dpsgd", gossip_steps=1))).row()  # fmt: skip
    assert dpsgd["network_dp_epsilon_mean"] == pytest.approx(  # the same run: one exchange
        one["network_dp_epsilon_mean"], rel=1e-9
    )
    lossy = dataclasses.replace(config, network=dataclasses.replace(config.network, loss=0.2))
    lossy_row = simulate(lossy).row()
    assert lossy_row["network_dp_epsilon_max"] <= lossy_row["max_epsilon_spent"] * (1 + 1e-12)
    assert lossy_row["network_dp_epsilon_mean"] < row["network_dp_epsilon_mean"]  # seen less


def test_non_private_steps_are_labelled_where_results_are_read() -> None:
    from p2pdp.experiments.scenarios.disclosure import non_private_steps

    steps = non_private_steps(_non_private())
    assert any(step.startswith("privacy.mechanism = 'none'") for step in steps)
    assert not any("noise_multiplier" in step for step in non_private_steps(_config()))


# --- results folder and report ------------------------------------------------------------------
COMPARISON = """
name = "compare"
seed = 3
[data]
dataset = "synthetic"
synthetic_rows = 400
synthetic_test_rows = 100
synthetic_features = 6
[partition]
n_peers = 10
[training]
lambda = 0.05
[privacy]
mechanism = "gaussian"
delta = 1e-5
[gossip]
degree = 4
[protocol]
rounds = 6
eval_every = 3
[evaluation]
cv_folds = 3
[sweep]
"privacy.epsilon,privacy.epsilon_per_aggregation" = [[1, 0.5], [10, 5]]
"protocol.name,protocol.step_size,protocol.gossip_steps" = [
    ["one-shot", 1.0, 1], ["dpsgd", 0.5, 1], ["dpsgd", 2.0, 1], ["muffliato", 1.0, 2],
    ["gossip-learning", 1.0, 1],
]
"""


def test_a_protocol_sweep_writes_rounds_and_the_report_compares_tuned_protocols(tmp_path):
    from p2pdp.experiments.report.write import write_report
    from p2pdp.experiments.run.runner import run_experiment
    from p2pdp.experiments.scenarios.scenario import load_scenario
    from p2pdp.results import load

    path = tmp_path / "compare.toml"
    path.write_text(COMPARISON, encoding="utf-8")
    out = tmp_path / "out"
    run_experiment(load_scenario(str(path)), out, jobs=1)
    tables = load(out)
    results, rounds = tables["results"], tables["rounds"]
    iterative = results[results["protocol.name"] != "one-shot"]
    assert len(results) == 2 * 5 * 3 and len(iterative) == 2 * 4 * 3
    assert set(rounds["protocol"]) == {"dpsgd", "muffliato", "gossip-learning"}
    assert len(rounds) == len(iterative) * 7  # rounds 0..6
    assert rounds["mean_error"].notna().sum() == len(iterative) * 3  # rounds 0, 3 and 6
    one_shot = results[results["protocol.name"] == "one-shot"]
    assert one_shot["spectral_gap"].isna().all() and iterative["spectral_gap"].notna().all()
    assert set(tables["network_dp"]["cell_id"]) == set(
        results.loc[results["protocol.name"].isin(["dpsgd", "muffliato"]), "cell_id"]
    )
    report = write_report(out).read_text(encoding="utf-8")
    for figure in ("protocols_vs_epsilon", "mean_error_vs_round", "consensus_distance_vs_round"):
        assert (out / f"{figure}.png").stat().st_size > 0 and f"({figure}.png)" in report
    assert "## Protocols compared at their tuned settings" in report
    assert "protocol comparison: each protocol's tuning settings" in report  # non-private step
    assert "| dpsgd |" in report and "step_size = " in report


def test_a_single_iterative_protocol_gets_its_round_figures(tmp_path) -> None:
    from p2pdp.experiments.report.write import write_report
    from p2pdp.experiments.run.runner import run_experiment
    from p2pdp.experiments.scenarios.scenario import load_scenario

    path = tmp_path / "one.toml"
    text = COMPARISON[: COMPARISON.index('"protocol.name,')]  # the epsilon axis only
    path.write_text(text.replace("[protocol]", '[protocol]\nname = "dpsgd"'), encoding="utf-8")
    out = tmp_path / "out"
    run_experiment(load_scenario(str(path), ["evaluation.folds=[0]"]), out, jobs=1)
    report = write_report(out).read_text(encoding="utf-8")
    assert (out / "mean_error_vs_round.png").exists() and "Nothing is tuned" in report
    assert "protocol comparison: each protocol's tuning" not in report


def test_a_single_protocol_tuned_over_folds_lists_the_tuning_as_non_private(tmp_path) -> None:
    from p2pdp.experiments.report.write import write_report
    from p2pdp.experiments.run.runner import run_experiment
    from p2pdp.experiments.scenarios.scenario import load_scenario

    path = tmp_path / "one.toml"
    text = COMPARISON[: COMPARISON.index("[sweep]")] + '[sweep]\n"protocol.step_size" = [0.5, 2]\n'
    path.write_text(text.replace("[protocol]", '[protocol]\nname = "dpsgd"'), encoding="utf-8")
    out = tmp_path / "out"
    overrides = ["evaluation.folds=[0, 1]", "privacy.epsilon=1"]
    run_experiment(load_scenario(str(path), overrides), out, jobs=1)
    report = write_report(out).read_text(encoding="utf-8")
    steps = report[report.index("## Non-private steps") : report.index("## Figures")]
    assert "protocol comparison: each protocol's tuning settings" in steps
    assert "## dpsgd at its tuned settings" in report
    fixed = next(line for line in report.splitlines() if line.startswith("Fixed: "))
    assert "= None" not in fixed and "`groups.sampler`" not in fixed  # unread: not shown


def test_leave_one_fold_out_tuning_never_uses_the_folds_own_error() -> None:
    from p2pdp.experiments.report.protocols import tuned_comparison

    # fold 2's own best is step 2 (0.2), but the other folds pick step 1 for it (error 0.5);
    # folds 0 and 1 get step 2 (0.3 each), chosen by the other two folds' means
    errors = {(1.0, 0): 0.1, (1.0, 1): 0.1, (1.0, 2): 0.5, (2.0, 0): 0.3, (2.0, 1): 0.3,
              (2.0, 2): 0.2}  # fmt: skip
    base = {"protocol.name": "dpsgd", "privacy.epsilon": 1.0}
    rows = [
        {**base, "protocol.step_size": step, "fold": fold, "mean_error": error}
        for (step, fold), error in errors.items()
    ]
    keys, table = tuned_comparison(rows, ["privacy.epsilon", "protocol.step_size"])
    assert keys == ["protocol.name", "privacy.epsilon"]
    (row,) = table
    assert row["error"] == pytest.approx((0.3 + 0.3 + 0.5) / 3)
    assert row["chosen"] == "step_size = 2.0"


def test_the_comparison_leaves_network_dp_empty_with_the_cells_reasons() -> None:
    from p2pdp.experiments.report.protocols import markdown, tuned_comparison

    note = "not computed: gossip.churn = true (views under churn are not implemented)"
    base = {
        "protocol.name": "muffliato",
        "privacy.epsilon": 1.0,
        "mean_error": 0.2,
        "max_epsilon_spent": 1.0,
        "local_only_error": 0.3,
        "centralized_error": 0.1,
    }
    rows = [
        {**base, "fold": 0, "network_dp_epsilon_mean": 0.5, "network_dp_note": ""},
        {**base, "fold": 1, "network_dp_epsilon_mean": math.nan, "network_dp_note": note},
    ]
    keys, table = tuned_comparison(rows, ["privacy.epsilon"])
    assert math.isnan(table[0]["network_dp_epsilon_mean"])  # not the mean of the one computed
    lines = markdown(keys, table)
    assert lines[2].endswith("| - |") and f"- muffliato: {note}" in lines


def test_a_peer_without_neighbours_keeps_learning_alone() -> None:
    base = _non_private(name="gossip-learning", rounds=4)
    gossip = {"overlay": "erdos-renyi", "edge_probability": 0.03, "allow_disconnected": True}
    sparse = dataclasses.replace(base, gossip=dataclasses.replace(base.gossip, **gossip))
    result = simulate(sparse)
    row = result.row()
    assert row["spectral_gap"] == 0.0  # a disconnected overlay never mixes
    assert 0 < row["messages_sent"] < 4 * 20  # isolated peers send nothing
    assert (result.aggregations_per_peer >= 0).all()
    dpsgd = dataclasses.replace(sparse.protocol, name="dpsgd")
    assert simulate(dataclasses.replace(sparse, protocol=dpsgd)).row()["mean_steps_per_peer"] == 4


@pytest.mark.parametrize("name", ["dpsgd", "gossip-learning"])
def test_churn_takes_peers_offline_they_neither_step_nor_receive(name) -> None:
    base = _non_private(name=name, rounds=60)
    churn = {"churn": True, "session_median": 10.0, "downtime_median": 10.0}
    config = dataclasses.replace(base, gossip=dataclasses.replace(base.gossip, **churn))
    steps = simulate(config).aggregations_per_peer
    steady = simulate(base).aggregations_per_peer
    assert steps.sum() < 0.8 * steady.sum()  # about half the peer-rounds are offline
    assert steps.min() < steps.max()
    row = simulate(config).row()
    assert row["messages_lost"] > 0.1 * row["messages_sent"]  # sent to offline peers
    np.testing.assert_array_equal(simulate(config).aggregations_per_peer, steps)  # reproducible


# --- one neighbouring relation per step ---------------------------------------------------------
def test_poisson_step_divisor_does_not_change_when_a_record_is_added() -> None:
    """Add/remove: peer 0's shard gains one record; the divisor the protocol built from the
    config for every peer's steps stays q * privacy.min_shard_size, and the step's event says
    add-remove. Full sampling divides by the shard size, public under its replace-one."""
    config = _config(
        {"min_shard_size": 4, "mechanism": "none", "delta": 0.0},
        sampling="poisson",
        sampling_rate=0.5,
        step_size=1.0,
    )
    rng = generator(5, "problem")
    problem = _problem(rng, n_peers=3, rows=6)
    shards = tuple(
        np.arange(problem.indptr[j], problem.indptr[j + 1]) for j in range(problem.n_peers)
    )
    grown = (np.append(shards[0], shards[1][0]), *shards[1:])  # peer 0 gains one record
    bigger = LocalProblem.from_shards(problem.X, problem.y, grown, problem.lam)
    privacy = step_privacy(config)
    assert privacy.mechanism.relation == "add-remove"
    noisy = _config(
        {"min_shard_size": 4}, sampling="poisson", sampling_rate=0.5, noise_multiplier=4.0
    )
    assert step_privacy(noisy).event.relation == "add-remove"
    for data in (problem, bigger):
        protocol = _without_neighbours(config, data, privacy)
        np.testing.assert_array_equal(protocol._denominators, 0.5 * 4)
    full = step_privacy(_config(noise_multiplier=4.0))
    assert full.event.relation == "replace-one"  # its divisor n is public: the size is fixed
    np.testing.assert_array_equal(full.mechanism.denominators(np.array([6, 7])), [6, 7])
    with pytest.raises(ConfigError, match=r"privacy.min_shard_size.*got privacy.min_shard_size"):
        _config({"min_shard_size": None}, sampling="poisson", sampling_rate=0.5)


@pytest.mark.parametrize("sampling", ["full", "fixed"])
def test_replace_one_step_moves_the_sum_by_its_declared_sensitivity(sampling) -> None:
    """Replace one record by the one whose clipped gradient points the other way: the sum
    moves by exactly 2C, the event's sensitivity, and the event's noise multiplier is the
    noise std over it (z C / 2C); sensitivity C would understate epsilon."""
    clip = 0.1
    mechanism = ClippedGaussianSum(clip_norm=clip, noise_multiplier=3.0, sampling=sampling,
                                   batch_size=4)  # fmt: skip
    X = np.tile([[0.6, 0.8]], (4, 1))
    y = np.array([1.0, 1.0, -1.0, 1.0])
    y_replaced = y.copy()
    y_replaced[0] = -1.0  # same features, other label: the gradient flips
    sums = [
        LocalProblem(X=X, y=labels, indptr=np.array([0, 4]), lam=0.1).clipped_sums(
            np.zeros((1, 2)), np.array([0]), mechanism, generator(0, "s")
        )
        for labels in (y, y_replaced)
    ]
    moved = float(np.linalg.norm(sums[0] - sums[1]))
    assert moved == pytest.approx(2 * clip, rel=1e-12)
    assert moved <= mechanism.sensitivity * (1 + 1e-12)
    event = mechanism.event(1e-6)
    assert event.relation == "replace-one"
    assert event.noise_multiplier * moved == pytest.approx(3.0 * clip, rel=1e-12)


def test_rows_state_their_neighbouring_relation_and_poisson_is_charged_by_pld() -> None:
    """Config -> accountant -> row: Poisson steps are charged the PLD epsilon of the steps
    taken (dp-accounting, computed here) under add/remove; full steps and one-shot releases
    are replace-one."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    from p2pdp.privacy.pld import PLD_DISCRETIZATION

    config = _config(sampling="poisson", sampling_rate=0.3, rounds=6)
    result = simulate(config)
    row = result.row()
    assert row["neighbouring_relation"] == "add-remove"
    assert row["privacy.accountant"] == "pld"
    z = row["noise_multiplier_used"]
    independent = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=PLD_DISCRETIZATION
    )
    independent.compose(dp_event.PoissonSampledDpEvent(0.3, dp_event.GaussianDpEvent(z)), 6)
    assert row["max_epsilon_spent"] == pytest.approx(independent.get_epsilon(1e-5), rel=1e-9)
    assert 2.0 * (1 - 1e-3) <= row["max_epsilon_spent"] <= 2.0 * (1 + 1e-9)  # calibrated
    assert simulate(_config(rounds=2)).row()["neighbouring_relation"] == "replace-one"
    one_shot = dataclasses.replace(config, protocol={"name": "one-shot"})
    assert simulate(one_shot).row()["neighbouring_relation"] == "replace-one"
