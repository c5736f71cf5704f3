"""Pairwise network DP (issue 28): the exact divergence of a peer's whole view, by brute force.

The brute force here is independent of :mod:`p2pdp.protocols.network_dp`: it builds ``v``'s
view of a noise-then-gossip run explicitly (the dense powers of ``W``, ``v``'s own noises as
observed rows, every message of every exchange), its full joint covariance, the Mahalanobis
form ``M = B^T Sigma^+ B`` of ``u``'s noise columns, and enumerates the adversary's signs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from scipy import optimize, stats

from p2pdp.config import ScenarioConfig
from p2pdp.core.rng import generator
from p2pdp.experiments.run.simulation import simulate
from p2pdp.privacy.gdp import gdp_epsilon
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols import correlated_dp, network_dp, network_dp_filter, network_dp_steady, views
from p2pdp.protocols.mixing import Mixing
from tests.conftest import tiny_config


def _config(*, privacy: dict | None = None, **protocol) -> ScenarioConfig:
    settings = {"name": "muffliato", "rounds": 2, "gossip_steps": 2, **protocol}
    return tiny_config(
        training={"lam": 0.01},
        privacy={"mechanism": "gaussian", "epsilon": 2.0, "delta": 1e-5, **(privacy or {})},
        gossip={"degree": 4},
        evaluation={"cv_folds": 2},
        protocol=settings,
    )


def _mixing(graph: nx.Graph) -> Mixing:
    n = graph.number_of_nodes()
    adjacency = sp.csr_array(nx.to_scipy_sparse_array(graph, nodelist=range(n)))
    adjacency.sort_indices()
    return Mixing.metropolis_hastings(adjacency.indptr, adjacency.indices)


GRAPHS = {
    "ring-10": nx.cycle_graph(10),
    "4-regular-12": nx.random_regular_graph(4, 12, seed=1),
    "3-regular-14": nx.random_regular_graph(3, 14, seed=1),
}


def _trace(mixing: Mixing, steps: int, gossip: int, after: int = 0) -> views.ViewTrace:
    """Every peer steps ``steps`` times, ``gossip`` exchanges after each, all delivered; then
    ``after`` more exchanges without steps (budget spent)."""
    return views.full_delivery_trace(mixing, steps, gossip, after=after)


def _brute_view(W, steps, gossip, v, *, after=0, scales=None, decay=1.0, own=True):
    """(R, T P) view matrix of ``v``: column ``t P + i`` is peer i's t-th noise."""
    P = len(W)
    scales = np.ones(P) if scales is None else scales
    state = np.zeros((P, steps * P))
    rows = []
    neighbours = [w for w in range(P) if w != v and W[v, w] > 0]
    for t in range(steps + (1 if after else 0)):
        if t < steps:
            state = decay * state
            state[np.arange(P), t * P + np.arange(P)] = -scales
            if own:
                rows.append(np.eye(steps * P)[t * P + v])
        for _ in range(gossip if t < steps else after):
            rows.extend(state[w].copy() for w in neighbours)
            state = W @ state
    return np.array(rows)


def _brute_Ms(W, steps, gossip, v, **kwargs) -> dict[int, np.ndarray]:
    """``M = B^T Sigma^+ B`` of every ``u != v`` in ``v``'s view (Sigma = A A^T)."""
    A = _brute_view(W, steps, gossip, v, **kwargs)
    precision = np.linalg.pinv(A @ A.T, rcond=1e-13, hermitian=True)
    Ms = {}
    for u in range(len(W)):
        if u != v:
            B = A[:, [t * len(W) + u for t in range(steps)]]
            Ms[u] = B.T @ precision @ B
    return Ms


def _brute_M(W, steps, gossip, u, v, **kwargs) -> np.ndarray:
    return _brute_Ms(W, steps, gossip, v, **kwargs)[u]


def _sign_max(M: np.ndarray) -> float:
    """The adversary's best signs (one direction for every step's change)."""
    return max(
        float(np.array(s) @ M @ np.array(s)) for s in itertools.product((-1, 1), repeat=len(M))
    )


def _ascent(M: np.ndarray, iterations: int = 20000) -> float:
    """A feasible point of the vector problem by projected power ascent (a lower bound)."""
    V = np.linalg.qr(generator(0, "ascent").normal(size=(len(M), len(M))))[0]
    for _ in range(iterations):
        MV = M @ V
        norms = np.linalg.norm(MV, axis=1, keepdims=True)
        V = np.where(norms > 0, MV / np.where(norms > 0, norms, 1.0), V)
    return float(np.einsum("ij,ij->", V, M @ V))


def _gdp_delta(epsilon: float, mu: float) -> float:
    return stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(
        -epsilon / mu - mu / 2
    )


def test_two_hops_on_the_ring_leak_as_much_as_a_neighbour_once_v_knows_its_own_value() -> None:
    """Ring of 10, one step, K = 2, u = 9, v = 7: the whole view without v's own noise gives
    2/3 (the old per-message sum said 1/3); with it, 1 (local DP)."""
    mixing = _mixing(GRAPHS["ring-10"])
    W = mixing.matrix().toarray()
    assert _brute_M(W, 1, 2, 9, 7, own=False)[0, 0] == pytest.approx(2 / 3, abs=1e-12)
    assert _brute_M(W, 1, 2, 9, 7)[0, 0] == pytest.approx(1.0, abs=1e-12)
    kappa, gap = network_dp.view_coefficients(
        _trace(mixing, 1, 2), mixing, scales=np.ones(10), decay=1.0
    )
    assert kappa[9, 7] == pytest.approx(1.0, abs=1e-12) and gap == 0.0
    assert np.isnan(np.diag(kappa)).all()


@pytest.mark.parametrize("steps", [1, 2, 4])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_reported_epsilon_is_at_least_the_brute_force_value_for_every_pair(name, steps) -> None:
    """Every pair, K in {1, 2, 4}: brute-force sign maximum <= kappa <= both SDP caps and T
    (equal to the signs for T <= 2, where they are exact); epsilon bounds the brute force's;
    kappa never decreases with K."""
    mixing = _mixing(GRAPHS[name])
    W = mixing.matrix().toarray()
    P = mixing.n_peers
    previous = None
    for gossip in (1, 2, 4):
        kappa, _ = network_dp.view_coefficients(
            _trace(mixing, steps, gossip), mixing, scales=np.ones(P), decay=1.0
        )
        epsilon = network_dp.pairwise_epsilon(kappa, sensitivity_over_sigma=0.7, delta=1e-5)
        for v in range(P):
            for u, M in _brute_Ms(W, steps, gossip, v).items():
                signs = _sign_max(M)
                caps = min(np.abs(M).sum(), steps * np.linalg.eigvalsh(M)[-1])
                assert signs - 1e-9 <= kappa[u, v] <= min(caps, steps) + 1e-9, (u, v, gossip)
                if steps <= 2:
                    assert kappa[u, v] == pytest.approx(signs, abs=1e-9)
                if signs > 1e-12:  # the reported epsilon holds for the brute force's mu
                    delta = _gdp_delta(epsilon[u, v], 0.7 * math.sqrt(signs))
                    assert delta <= 1e-5 * (1 + 1e-6)
        if previous is not None:
            assert np.nanmin(kappa - previous) >= -1e-9  # more gossip, more seen
        previous = kappa


def test_vector_changes_beat_signs_and_the_reported_value_is_the_vector_optimum() -> None:
    """Changes in R^d (d >= T) can leak more than one direction with signs: the semidefinite
    value is checked against an independent feasible point (power ascent) on views where the
    signs fall short, and the caps sum |M| and T lambda_max are not what is reported."""
    W = _mixing(GRAPHS["ring-10"]).matrix().toarray()
    for u, v in [(1, 0), (9, 0), (4, 3)]:  # neighbours, T = 4, K = 1
        M = _brute_M(W, 4, 1, u, v)
        (upper,), (lower,) = views.worst_case_shifts(M[None])
        ascent = _ascent(M)
        assert lower - 1e-9 <= upper <= ascent + 1e-8 and ascent <= upper + 1e-9
        assert ascent > _sign_max(M) + 3e-4  # vectors leak more than signs ...
        assert min(np.abs(M).sum(), 4 * np.linalg.eigvalsh(M)[-1]) > ascent + 0.05  # < caps
    # a 5-cycle's max-cut form (known value): SDP (25 + 5 sqrt 5) / 8 > best signs 4
    L = nx.laplacian_matrix(nx.cycle_graph(5)).toarray() / 4.0
    (upper,), (lower,) = views.worst_case_shifts(L[None])
    assert upper == pytest.approx((25 + 5 * math.sqrt(5)) / 8, abs=1e-8)
    assert lower == pytest.approx(upper, abs=1e-8) and upper > _sign_max(L) + 0.5


def test_exchanges_after_the_budget_and_late_messages_are_in_the_view_lost_ones_not() -> None:
    mixing = _mixing(GRAPHS["ring-10"])
    W = mixing.matrix().toarray()
    ones = np.ones(10)
    during, _ = network_dp.view_coefficients(_trace(mixing, 1, 1), mixing, scales=ones, decay=1)
    longer, _ = network_dp.view_coefficients(
        _trace(mixing, 1, 1, after=3), mixing, scales=ones, decay=1
    )
    assert longer[9, 6] > during[9, 6] + 0.1  # 3 hops: seen only after the budget stopped u
    assert longer[9, 6] == pytest.approx(_brute_M(W, 1, 1, 9, 6, after=3)[0, 0], abs=1e-9)
    E = len(mixing.indices)
    late, lost = views.ViewTrace(), views.ViewTrace()
    for trace, is_late in ((late, True), (lost, False)):
        trace.step(np.arange(10))
        trace.exchange(np.zeros(E, dtype=bool), np.full(E, is_late))
    late_kappa, _ = network_dp.view_coefficients(late, mixing, scales=ones, decay=1.0)
    lost_kappa, _ = network_dp.view_coefficients(lost, mixing, scales=ones, decay=1.0)
    assert late_kappa[9, 0] == pytest.approx(1.0) and late_kappa[9, 7] == 0.0  # read, not mixed
    assert np.nanmax(lost_kappa) == 0.0


def test_a_muffliato_run_reports_the_exact_value_of_its_recorded_exchanges() -> None:
    """Config -> run -> columns: 4 rounds of K = 3 exchanges, a budget of 2 steps (two rounds
    of averaging after it), unequal shards, the step's decay: the columns equal the brute force
    of that run, computed here from the config alone."""
    from p2pdp.protocols.iterative import step_privacy
    from p2pdp.sim.overlay import build_overlay

    config = _config(name="muffliato", gossip_steps=3, rounds=4, noise_multiplier=6.0,
                     step_size=0.7)  # fmt: skip
    config = dataclasses.replace(
        config, partition=dataclasses.replace(config.partition, scheme="quantity_skew")
    )
    privacy = step_privacy(config)
    assert privacy.max_steps == 2
    result = simulate(config)
    row = result.row()
    np.testing.assert_array_equal(result.aggregations_per_peer, 2)
    overlay = build_overlay(config.gossip, 20, rng=generator(config.seed, "overlay", 0, 0))
    W = Mixing.metropolis_hastings(overlay.indptr, overlay.indices).matrix().toarray()
    eta, K = 0.7, config.protocol.gossip_steps
    scales = eta / result.shard_sizes.astype(float)
    assert np.ptp(scales) > 0  # unequal shards: the noises enter with different weights
    ratio = 2.0 / 6.0  # Delta / sigma = 2 C / (z C)
    mu = np.full((20, 20), np.nan)
    for v in range(20):
        Ms = _brute_Ms(W, 2, K, v, after=2 * K, scales=scales, decay=1 - eta * 0.01)
        for u, M in Ms.items():
            mu[u, v] = ratio * math.sqrt(_sign_max(M))
    epsilon = np.full((20, 20), np.nan)
    for (u, v), m in np.ndenumerate(mu):
        if np.isfinite(m):
            epsilon[u, v] = optimize.brentq(lambda e, m=m: _gdp_delta(e, m) - 1e-5, 0, 50,
                                            xtol=1e-13)  # fmt: skip
    assert row["network_dp_epsilon_mean"] == pytest.approx(np.nanmean(epsilon), rel=1e-7)
    assert row["network_dp_epsilon_max"] == pytest.approx(np.nanmax(epsilon), rel=1e-7)
    assert row["network_dp_epsilon_max"] <= row["max_epsilon_spent"] * (1 + 1e-9)
    assert row["network_dp_note"] == ""


def test_network_dp_is_empty_with_the_reason_where_not_computed(monkeypatch) -> None:
    base = _config(name="muffliato", gossip_steps=2, rounds=2)
    none = dataclasses.replace(base, privacy=PrivacyConfig(mechanism="none", epsilon=2.0))
    row = simulate(none).row()
    assert "privacy.mechanism = 'none'" in row["network_dp_note"]
    assert math.isnan(row["network_dp_epsilon_mean"]) and math.isnan(row["network_dp_epsilon_max"])
    assert row["network_dp_method"] == ""
    exact = simulate(base).row()
    assert exact["network_dp_method"] == "exact" and exact["wall_network_dp_s"] >= 0.0
    monkeypatch.setattr(network_dp, "MAX_VIEW_ENTRIES", 100)
    bound = simulate(base).row()  # beyond the exact computation: the filtered bound
    assert bound["network_dp_method"] == "bound" and bound["network_dp_note"] == ""
    for column in ("mean", "max", "max_beyond_neighbours"):
        name = f"network_dp_epsilon_{column}"
        assert exact[name] - 1e-12 <= bound[name] <= 1.5 * exact[name] + 1e-12, column
    monkeypatch.setattr(network_dp, "MAX_FILTER_WORK", 100)
    result = simulate(base)
    assert "more than the 100 of an exact computation" in result.row()["network_dp_note"]
    assert "more than its 100" in result.row()["network_dp_note"]
    assert math.isnan(result.row()["network_dp_epsilon_max"]) and result.network_dp == []
    assert result.row()["network_dp_method"] == ""
    gossip_learning = simulate(_config(name="gossip-learning", gossip_steps=1)).row()
    assert "'gossip-learning' is not a synchronous" in gossip_learning["network_dp_note"]
    assert math.isnan(gossip_learning["network_dp_epsilon_max"])
    assert gossip_learning["network_dp_method"] == ""


def _brute_trace_Ms(trace, mixing, v, *, scales, decay) -> dict[int, np.ndarray]:
    """``M`` of every ``u != v`` for ``v``'s view of a recorded run, built densely from the
    trace's events (each exchange's matrix ``I + O - diag(O 1)``, ``O`` the delivered
    off-diagonal weights), independently of :func:`network_dp.view_coefficients`."""
    W = mixing.matrix().toarray()
    P = len(W)
    steps = [e for e in trace.events if isinstance(e, np.ndarray)]
    owner = np.concatenate(steps)
    state, rows, column = np.zeros((P, owner.size)), [], 0
    for event in trace.events:
        if isinstance(event, np.ndarray):
            for i in event.tolist():
                state[i] *= decay
                state[i, column] = -scales[i]
                column += 1
            continue
        delivered, late = event
        for e in np.flatnonzero(delivered | late):
            if mixing.receivers[e] == v:
                rows.append(state[mixing.indices[e]].copy())
        off = np.zeros((P, P))
        off[mixing.receivers[delivered], mixing.indices[delivered]] = W[
            mixing.receivers[delivered], mixing.indices[delivered]
        ]
        state = (np.eye(P) + off - np.diag(off.sum(axis=1))) @ state
    A = np.array(rows)[:, owner != v]
    kept = owner[owner != v]
    precision = np.linalg.pinv(A @ A.T, rcond=1e-13, hermitian=True)
    return {u: A[:, kept == u].T @ precision @ A[:, kept == u] for u in range(P) if u != v}


def _recorded(monkeypatch) -> list[views.ViewTrace]:
    """The traces the runs after this call pass to :func:`network_dp.report`."""
    traces: list[views.ViewTrace] = []
    report = network_dp.report

    def recording(trace, *args, **kwargs):
        traces.append(trace)
        return report(trace, *args, **kwargs)

    monkeypatch.setattr(network_dp, "report", recording)
    return traces


def test_a_churned_lossy_run_reports_the_exact_network_dp_of_its_realised_exchanges(
    monkeypatch,
) -> None:
    """Churn and message loss: the columns are those of the run as recorded (peers offline at
    a step did not step, lost messages are in no view), equal to an independent dense brute
    force over the recorded events; the run did lose messages and skip steps."""
    from p2pdp.sim.overlay import build_overlay

    config = _config(name="muffliato", gossip_steps=2, rounds=3, noise_multiplier=6.0,
                     step_size=0.5)  # fmt: skip
    config = dataclasses.replace(
        config,
        gossip=dataclasses.replace(
            config.gossip, churn=True, session_median=2.0, downtime_median=2.0
        ),
        network=dataclasses.replace(config.network, loss=0.2),
    )
    traces = _recorded(monkeypatch)
    result = simulate(config)
    row = result.row()
    (trace,) = traces
    assert row["network_dp_note"] == "" and row["network_dp_method"] == "exact"
    assert result.aggregations_per_peer.min() < 3  # some peer was offline at a step
    exchanges = [e for e in trace.events if isinstance(e, tuple)]
    assert sum(int((~(d | late)).sum()) for d, late in exchanges) > 0  # messages lost
    overlay = build_overlay(config.gossip, 20, rng=generator(config.seed, "overlay", 0, 0))
    mixing = Mixing.metropolis_hastings(overlay.indptr, overlay.indices)
    scales, ratio = 0.5 / result.shard_sizes.astype(float), 2.0 / 6.0
    epsilon = np.full((20, 20), np.nan)
    for v in range(20):
        Ms = _brute_trace_Ms(trace, mixing, v, scales=scales, decay=1 - 0.5 * 0.01)
        for u, M in Ms.items():  # T <= 3: the signs are a lower value, the SDP's is exact
            (upper,), (lower,) = views.worst_case_shifts(M[None])
            assert upper == pytest.approx(lower, abs=1e-9) and upper >= _sign_max(M) - 1e-9
            mu = ratio * math.sqrt(max(upper, 0.0))
            epsilon[u, v] = (
                0.0 if mu < 1e-12 else optimize.brentq(
                    lambda e, m=mu: _gdp_delta(e, m) - 1e-5, 0, 50, xtol=1e-13)
            )  # fmt: skip
    assert row["network_dp_epsilon_mean"] == pytest.approx(np.nanmean(epsilon), rel=1e-6)
    assert row["network_dp_epsilon_max"] == pytest.approx(np.nanmax(epsilon), rel=1e-6)
    # the filtered bound of the same recorded run (uneven steps, lost messages): never below
    decay = 1 - 0.5 * 0.01
    exact, _ = network_dp.view_coefficients(trace, mixing, scales=scales, decay=decay)
    for window in (1, 2):  # noises retired at events where some peer did not step
        bound = network_dp_filter.filtered_coefficients(
            trace, mixing, scales=scales, decay=decay, window=window
        )
        off = ~np.eye(20, dtype=bool)
        assert (bound[off] >= exact[off] - 1e-12).all() and np.isnan(bound[~off]).all()


def test_poisson_rows_bound_every_sampling_outcome_of_the_differing_record(monkeypatch) -> None:
    """Poisson sampling (add/remove, Delta = C): given a sampling outcome the view is
    Gaussian, the differing record shifting only the steps whose batch drew it. For every
    outcome of u's 2 steps (drawn at none, the first, the second, both) the exact epsilon of
    that outcome (brute force, signs exact for T <= 2) is at most the reported pair's, and
    the outcome 'drawn at both' attains it: the column is the max over outcomes."""
    from p2pdp.sim.overlay import build_overlay

    config = _config(name="muffliato", noise_multiplier=3.0, step_size=0.5, sampling="poisson",
                     sampling_rate=0.5, privacy={"min_shard_size": 5})  # fmt: skip
    traces = _recorded(monkeypatch)
    result = simulate(config)
    row = result.row()
    assert row["neighbouring_relation"] == "add-remove"
    assert row["network_dp_note"] == "" and np.isfinite(row["network_dp_epsilon_max"])
    (trace,) = traces
    overlay = build_overlay(config.gossip, 20, rng=generator(config.seed, "overlay", 0, 0))
    mixing = Mixing.metropolis_hastings(overlay.indptr, overlay.indices)
    scales = np.full(20, 0.5 / (0.5 * 5))  # eta / (q min_shard_size): the public divisor
    ratio = 1.0 / 3.0  # Delta / sigma = C / (z C)
    worst = np.zeros((20, 20))
    for v in range(20):
        Ms = _brute_trace_Ms(trace, mixing, v, scales=scales, decay=1 - 0.5 * 0.01)
        for u, M in Ms.items():
            for drawn in ([], [0], [1], [0, 1]):  # the outcome: steps whose batch drew it
                kappa = _sign_max(M[np.ix_(drawn, drawn)]) if drawn else 0.0
                worst[u, v] = max(worst[u, v], kappa)
                assert kappa <= worst[u, v] + 1e-12
    mu = ratio * np.sqrt(worst[~np.eye(20, dtype=bool)])
    epsilon = [optimize.brentq(lambda e, m=m: _gdp_delta(e, m) - 1e-5, 0, 50, xtol=1e-13)
               for m in mu if m > 1e-12]  # fmt: skip
    assert row["network_dp_epsilon_max"] == pytest.approx(max(epsilon), rel=1e-6)
    assert row["network_dp_epsilon_mean"] == pytest.approx(sum(epsilon) / (20 * 19), rel=1e-6)


def _brute_epsilon(W, steps, gossip, *, ratio, **kwargs) -> np.ndarray:
    """Every pair's epsilon at delta 1e-5 from the brute-force sign maximum (exact, T <= 2)."""
    P = len(W)
    epsilon = np.full((P, P), np.nan)
    for v in range(P):
        for u, M in _brute_Ms(W, steps, gossip, v, **kwargs).items():
            mu = ratio * math.sqrt(_sign_max(M))
            if mu < 1e-12:  # u not in v's view
                epsilon[u, v] = 0.0
                continue
            epsilon[u, v] = optimize.brentq(lambda e, m=mu: _gdp_delta(e, m) - 1e-5, 0, 50,
                                            xtol=1e-13)  # fmt: skip
    return epsilon


def test_a_dpsgd_run_reports_the_exact_network_dp_of_its_single_exchanges() -> None:
    """D-PSGD is the view model with one exchange per round: its rows carry the columns (they
    were NaN with an empty note), equal to the brute force of that run (2 rounds, K = 1)."""
    from p2pdp.sim.overlay import build_overlay

    config = _config(name="dpsgd", gossip_steps=1, rounds=2, noise_multiplier=6.0,
                     step_size=0.5)  # fmt: skip
    result = simulate(config)
    row = result.row()
    np.testing.assert_array_equal(result.aggregations_per_peer, 2)
    overlay = build_overlay(config.gossip, 20, rng=generator(config.seed, "overlay", 0, 0))
    W = Mixing.metropolis_hastings(overlay.indptr, overlay.indices).matrix().toarray()
    scales = 0.5 / result.shard_sizes.astype(float)
    epsilon = _brute_epsilon(W, 2, 1, ratio=2.0 / 6.0, scales=scales, decay=1 - 0.5 * 0.01)
    assert row["network_dp_note"] == ""
    assert row["network_dp_epsilon_mean"] == pytest.approx(np.nanmean(epsilon), rel=1e-7)
    assert row["network_dp_epsilon_max"] == pytest.approx(np.nanmax(epsilon), rel=1e-7)
    assert row["network_dp_epsilon_max"] <= row["max_epsilon_spent"] * (1 + 1e-9)


def test_the_reported_coefficient_is_the_certificate_not_the_feasible_point(monkeypatch) -> None:
    """T = 4 > 2, where the semidefinite program is solved: with the barrier stopped after
    one round, its feasible point (lower) falls short of the optimum while its dual
    certificate (upper) still bounds it. What ``view_coefficients`` reports must be the
    certificate: at least the optimum found independently (power ascent on the brute-force
    ``M``), and the note's gap says by how much the lower value differs."""
    monkeypatch.setattr(views, "_BARRIER_ROUNDS", 1)
    mixing = _mixing(GRAPHS["ring-10"])
    W = mixing.matrix().toarray()
    kappa, gap = network_dp.view_coefficients(
        _trace(mixing, 4, 1), mixing, scales=np.ones(10), decay=1.0
    )
    assert gap > 1e-6  # a case where the two differ
    for u, v in [(1, 0), (9, 0), (4, 3)]:
        M = _brute_M(W, 4, 1, u, v)
        (_,), (lower,) = views.worst_case_shifts(M[None])
        optimum = _ascent(M)
        assert lower < optimum - 1e-5  # reporting the feasible point would understate
        assert kappa[u, v] >= optimum - 1e-9 and kappa[u, v] <= 4 + 1e-9


def test_distances_are_hop_counts_of_the_overlay() -> None:
    """``by_distance`` groups pairs by hops (networkx's shortest path lengths), not by the
    mixing weights: every distance an integer, each with its pairs' count, mean and max."""
    graph = GRAPHS["3-regular-14"]
    mixing = _mixing(graph)
    P = mixing.n_peers
    epsilon = np.arange(P * P, dtype=float).reshape(P, P) / 7.0
    hops = dict(nx.all_pairs_shortest_path_length(graph))
    expected: dict[int, list[float]] = {}
    for u in range(P):
        for v in range(P):
            if u != v:
                expected.setdefault(hops[u][v], []).append(epsilon[u, v])
    rows = network_dp.by_distance(mixing, epsilon)
    assert [row["distance"] for row in rows] == sorted(expected) and len(expected) > 2
    for row in rows:
        values = expected[row["distance"]]
        assert row["pairs"] == len(values)
        assert row["mean_epsilon"] == pytest.approx(np.mean(values), rel=1e-12)
        assert row["max_epsilon"] == pytest.approx(max(values), rel=1e-12)


def test_a_runs_network_dp_table_has_one_row_per_hop_distance_of_its_overlay() -> None:
    """Config -> run -> the ``network_dp.csv`` rows: their distances and pair counts are the
    hop distances of the run's overlay (computed here with networkx)."""
    from p2pdp.sim.overlay import build_overlay

    config = _config(name="muffliato", gossip_steps=2, rounds=2, noise_multiplier=6.0)
    result = simulate(config)
    overlay = build_overlay(config.gossip, 20, rng=generator(config.seed, "overlay", 0, 0))
    graph = nx.Graph()
    for u in range(20):
        graph.add_edges_from(
            (u, int(v)) for v in overlay.indices[overlay.indptr[u] : overlay.indptr[u + 1]]
        )
    counts: dict[int, int] = {}
    for u, lengths in nx.all_pairs_shortest_path_length(graph):
        for v, hops in lengths.items():
            if u != v:
                counts[hops] = counts.get(hops, 0) + 1
    rows = result.network_dp_rows()
    assert {row["distance"]: row["pairs"] for row in rows} == counts
    assert all(row["fold"] == 0 for row in rows)


BOUND_GRAPHS = {
    "ring-10": nx.cycle_graph(10),
    "star-9": nx.star_graph(8),
    "3-regular-14": nx.random_regular_graph(3, 14, seed=1),
    "erdos-renyi-12": nx.erdos_renyi_graph(12, 0.3, seed=2),
}
#: (steps, exchanges per step): up to the window (the bound is exact) and beyond it.
BOUND_GRID = [(2, 2), (3, 3), (4, 1), (6, 2), (8, 1)]


def _columns(kappa: np.ndarray, mixing: Mixing) -> dict[str, float]:
    """The reported epsilon columns of a kappa matrix (Delta / sigma = 0.5, delta = 1e-5)."""
    epsilon = network_dp.pairwise_epsilon(kappa, sensitivity_over_sigma=0.5, delta=1e-5)
    neighbours = mixing.matrix().toarray() > 0
    return {
        "mean": float(np.nanmean(epsilon)),
        "max": float(np.nanmax(epsilon)),
        "max_beyond_neighbours": float(epsilon[~neighbours].max()),
    }


@pytest.mark.parametrize("solve", ["as shipped", "never"])
@pytest.mark.parametrize("name", list(BOUND_GRAPHS))
def test_the_filtered_bound_is_never_below_the_exact_value(name, solve, monkeypatch) -> None:
    """Every pair of every (steps, exchanges) of the grid, unequal step scales, a decay: the
    filtered bound is >= the exact coefficient (never below; within the certificate's 2%
    when the run has no more steps than the window) and at most T_u; on the ring and the
    3-regular graph the reported columns (mean, max, max beyond neighbours of epsilon) are
    within 1.5x of the exact ones. ``never``: every retired noise takes the cheap remainder
    bound (the covariance floor, as at 1,000 peers), none the view's own solve."""
    if solve == "never":
        monkeypatch.setattr(network_dp_filter, "RETIRE_SOLVE", math.inf)
    mixing = _mixing(BOUND_GRAPHS[name])
    P = mixing.n_peers
    scales = np.linspace(0.5, 1.5, P)
    worst, widest = 0.0, 1.0
    for steps, gossip in BOUND_GRID:
        trace = _trace(mixing, steps, gossip)
        exact, _ = network_dp.view_coefficients(trace, mixing, scales=scales, decay=0.97)
        bound = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)
        off = ~np.eye(P, dtype=bool)
        assert np.isnan(bound[~off]).all()
        assert (bound[off] >= exact[off] - 1e-12).all(), (steps, gossip)  # exact's rounding
        assert (bound[off] <= steps + 1e-9).all()
        if steps <= network_dp_filter.filter_window(trace):  # nothing retired: only the certificate
            assert (bound[off] <= 1.02 * exact[off] + 1e-9).all(), (steps, gossip)
        worst = max(worst, float((bound[off] - exact[off]).max()))
        if name in ("ring-10", "3-regular-14"):
            tight, loose = _columns(exact, mixing), _columns(bound, mixing)
            for column, value in loose.items():
                assert value <= 1.5 * tight[column], (steps, gossip, column)
                widest = max(widest, value / tight[column])
    print(f"{name} (solve {solve}): largest kappa excess {worst:.3g}, widest column ratio "
          f"{widest:.3f} (ring and 3-regular only)")  # fmt: skip


@pytest.mark.parametrize("solve", ["as shipped", "never"])
def test_a_short_window_needs_the_whole_remainder_of_its_retired_noises(solve, monkeypatch) -> None:
    """One exchange a step (D-PSGD) with a window of 2 step events and exchanges after the
    last step, on the Erdos-Renyi graph: the noises retired from the window keep telling
    (through the later exchanges), so the bound's remainder term carries much of the value.
    The bound is never below the exact value; the window's part alone (remainder 0) is, so
    the case can tell a remainder that is too small (halving it: 0.19 below exact)."""
    if solve == "never":
        monkeypatch.setattr(network_dp_filter, "RETIRE_SOLVE", math.inf)
    mixing = _mixing(BOUND_GRAPHS["erdos-renyi-12"])
    P = mixing.n_peers
    trace, scales = _trace(mixing, 3, 1, after=4), np.linspace(0.5, 1.5, P)
    exact, _ = network_dp.view_coefficients(trace, mixing, scales=scales, decay=0.97)
    off = ~np.eye(P, dtype=bool)

    def bound() -> np.ndarray:
        kappa = network_dp_filter.filtered_coefficients(
            trace, mixing, scales=scales, decay=0.97, window=2
        )
        return kappa[off]

    assert (bound() >= exact[off] - 1e-12).all()
    monkeypatch.setattr(network_dp_filter, "_remainder", lambda e, f, s, i: 0.0 * s)
    assert (bound() < exact[off] - 0.1).any()


def _settled(monkeypatch) -> list[tuple[int, np.ndarray]]:
    """Spy on the periodic runs' larger view: ``(step, covariance before the reset)`` of
    every reset the filter makes."""
    resets: list[tuple[int, np.ndarray]] = []
    original = network_dp_filter._Steady.step

    def step(self, *args):
        reset = original(self, *args)
        if reset is not None:
            resets.append((self.steps - 1, reset[0]))
        return reset

    monkeypatch.setattr(network_dp_filter._Steady, "step", step)
    return resets


@pytest.mark.parametrize(
    ("name", "steps", "gossip", "after"), [("star-9", 16, 3, 2), ("erdos-renyi-12", 20, 1, 0)]
)
def test_a_periodic_run_settled_from_its_first_round_is_never_below_the_exact_value(
    name, steps, gossip, after, monkeypatch
) -> None:
    """The periodic runs' larger view at its loosest (settled after the first round, so
    every later round is reset to the second step's covariance and copied): never below the
    exact value, for any pair, and the filter ran only the rounds it needs."""
    monkeypatch.setattr(network_dp_steady, "STEADY", math.inf)
    resets = _settled(monkeypatch)
    mixing = _mixing(BOUND_GRAPHS[name])
    P = mixing.n_peers
    trace, scales = _trace(mixing, steps, gossip, after=after), np.linspace(0.5, 1.5, P)
    exact, _ = network_dp.view_coefficients(trace, mixing, scales=scales, decay=0.97)
    bound = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)
    off = ~np.eye(P, dtype=bool)
    assert (bound[off] >= exact[off] - 1e-12).all()
    assert (bound[off] <= steps + 1e-9).all()
    window = network_dp_filter.filter_window(trace)
    assert [step for step, _ in resets] == list(range(2, window + 3))  # settled at step 1


def test_a_periodic_runs_rounds_after_it_settles_are_copies_of_each_other(monkeypatch) -> None:
    """On a 3-regular graph, 40 rounds of 2 exchanges: the filter settles, every reset of
    the larger view finds the same covariance (the rounds are copies, which is what lets one
    stand for all), it runs only the settled round plus a window of rounds, and its bound is
    the full filter's within 1e-4 (what the resets' extra readings add)."""
    resets = _settled(monkeypatch)
    mixing = _mixing(BOUND_GRAPHS["3-regular-14"])
    P, steps = mixing.n_peers, 40
    trace, scales = _trace(mixing, steps, 2), np.linspace(0.5, 1.5, P)
    bound = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)
    full = network_dp_filter.filtered_coefficients(
        trace, mixing, scales=scales, decay=0.97, steady=False
    )
    window = network_dp_filter.filter_window(trace)
    assert len(resets) == window + 1 and resets[-1][0] < steps // 2
    first = resets[0][1]
    for _, covariance in resets[1:]:
        np.testing.assert_allclose(covariance, first, rtol=0, atol=1e-9 * np.abs(first).max())
    off = ~np.eye(P, dtype=bool)
    np.testing.assert_allclose(bound[off], full[off], rtol=1e-4)


def test_the_copied_rounds_are_the_larger_views_filtered_to_the_end(monkeypatch) -> None:
    """The settled step's values stand for the rounds not filtered: the same as filtering
    every round of the larger view (a reset each round to the end), to 1e-9."""
    mixing = _mixing(BOUND_GRAPHS["3-regular-14"])
    P = mixing.n_peers
    trace, scales = _trace(mixing, 40, 2, after=2), np.linspace(0.5, 1.5, P)
    copied = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)

    def every_round(self):
        for _ in range(self.rounds):
            yield from self.round_events
        self.ran = self.rounds
        yield from self.tail

    monkeypatch.setattr(network_dp_filter._Steady, "events", every_round)
    monkeypatch.setattr(network_dp_filter._Steady, "copies", lambda self: np.arange(self.rounds))
    filtered = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)
    off = ~np.eye(P, dtype=bool)
    np.testing.assert_allclose(copied[off], filtered[off], rtol=1e-9)


def test_the_settled_path_computes_only_the_shared_states_it_reads(monkeypatch) -> None:
    """The shared states of the step events are computed as the batches read them: settled
    after the first round, 40 rounds filter ``window + 3`` (and compute only those), every
    round filtered computes all 40; the same values in batches of 3 views (the first reads
    them, the others find them) as in one."""
    monkeypatch.setattr(network_dp_steady, "STEADY", math.inf)
    mixing = _mixing(BOUND_GRAPHS["3-regular-14"])
    P, steps = mixing.n_peers, 40
    trace, scales = _trace(mixing, steps, 2, after=2), np.linspace(0.5, 1.5, P)
    real = network_dp_filter._shared_states
    computed: list[int] = []

    def counted(*args, **kwargs):
        computed.append(0)
        for state in real(*args, **kwargs):
            computed[-1] += 1
            yield state

    monkeypatch.setattr(network_dp_filter, "_shared_states", counted)
    options = {"scales": scales, "decay": 0.97, "workers": 1}
    settled = network_dp_filter.filtered_coefficients(trace, mixing, batch=3, **options)
    once = network_dp_filter.filtered_coefficients(trace, mixing, **options)
    every = network_dp_filter.filtered_coefficients(trace, mixing, steady=False, **options)
    window = network_dp_filter.filter_window(trace)
    assert computed == [window + 3, window + 3, steps]
    off = ~np.eye(P, dtype=bool)
    np.testing.assert_allclose(settled[off], once[off], rtol=1e-12)
    assert np.isfinite(every[off]).all()


def test_a_runs_recorded_trace_takes_the_settled_bound(monkeypatch) -> None:
    """Config -> run -> columns: a Muffliato run of 20 peers (degree 4), 16 rounds of 3
    exchanges, a budget for every round, every message delivered, with the filtered bound
    forced: its recorded trace
    is periodic, the filter settles and copies (fewer rounds filtered than run), and the
    columns are those of filtering every round within 1e-4."""
    monkeypatch.setattr(network_dp, "MAX_VIEW_ENTRIES", 0)
    monkeypatch.setattr(network_dp, "_FOUND", {})
    resets = _settled(monkeypatch)
    config = _config(
        name="muffliato", gossip_steps=3, rounds=16, noise_multiplier=6.0,
        privacy={"epsilon": 100.0},  # every peer steps every round
    )  # fmt: skip
    row = simulate(config).row()
    assert row["network_dp_method"] == "bound" and len(resets) >= 1
    assert max(step for step, _ in resets) < 15
    monkeypatch.setattr(network_dp, "_FOUND", {})
    monkeypatch.setattr(network_dp_filter, "_periodic", lambda trace, n: None)
    full = simulate(config).row()
    for column in ("mean", "max", "max_beyond_neighbours"):
        key = f"network_dp_epsilon_{column}"
        assert row[key] == pytest.approx(full[key], rel=1e-4)


def test_runs_of_more_peers_than_the_limit_filter_every_round(monkeypatch) -> None:
    """Above :data:`STEADY_MAX_PEERS` a periodic run takes no reset (each would factorise a
    view's covariance, which costs more than the rounds it saves) and gives the values of
    filtering every round; at the limit it settles."""
    monkeypatch.setattr(network_dp_steady, "STEADY", math.inf)  # settled after a round
    mixing = _mixing(BOUND_GRAPHS["3-regular-14"])
    P = mixing.n_peers
    trace, scales = _trace(mixing, 12, 2), np.linspace(0.5, 1.5, P)

    def bound(limit: int) -> tuple[np.ndarray, int]:
        resets = _settled(monkeypatch)
        monkeypatch.setattr(network_dp_filter, "STEADY_MAX_PEERS", limit)
        kappa = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)
        return kappa, len(resets)

    (above, resets_above), (_, resets_at) = bound(P - 1), bound(P)
    every = network_dp_filter.filtered_coefficients(
        trace, mixing, scales=scales, decay=0.97, steady=False
    )
    assert resets_above == 0 and resets_at >= 1
    off = ~np.eye(P, dtype=bool)
    np.testing.assert_allclose(above[off], every[off], rtol=1e-12)


def test_only_runs_whose_rounds_are_alike_are_periodic() -> None:
    """``_periodic``: every peer steps, then the same exchanges with the same messages seen,
    in every round; a lost message, a peer that skips a step or a step without the round's
    exchanges is not periodic (every round filtered)."""
    mixing = _mixing(BOUND_GRAPHS["3-regular-14"])
    P = mixing.n_peers
    trace = _trace(mixing, 5, 2, after=3)
    round_events, rounds, tail = network_dp_filter._periodic(trace, P)
    assert rounds == 5 and len(round_events) == 3 and len(tail) == 3
    lossy = _trace(mixing, 5, 2)
    delivered = np.ones(len(mixing.indices), dtype=bool)
    delivered[0] = False
    lossy.events[4] = (delivered, np.zeros_like(delivered))
    skipped = _trace(mixing, 5, 2)
    skipped.events[6] = np.arange(1, P)
    short = _trace(mixing, 5, 2)
    del short.events[5]
    for trace in (lossy, skipped, short):
        assert network_dp_filter._periodic(trace, P) is None


def test_a_reset_below_the_settled_covariance_filters_every_round(monkeypatch) -> None:
    """A view whose covariance falls below the settled one (not periodic after all) takes
    the full filter: the same values as ``steady=False``."""
    mixing = _mixing(BOUND_GRAPHS["3-regular-14"])
    P = mixing.n_peers
    trace, scales = _trace(mixing, 40, 2), np.linspace(0.5, 1.5, P)
    full = network_dp_filter.filtered_coefficients(
        trace, mixing, scales=scales, decay=0.97, steady=False
    )
    original = network_dp_filter._Steady.step

    def lower(self, base, F, R, variances, others):
        if self.target is not None:
            self.target = self.target * 2.0
        return original(self, base, F, R, variances, others)

    monkeypatch.setattr(network_dp_filter._Steady, "step", lower)
    bound = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)
    off = ~np.eye(P, dtype=bool)
    np.testing.assert_allclose(bound[off], full[off], rtol=1e-12)


def test_cells_differing_only_in_the_budget_share_their_coefficients(monkeypatch) -> None:
    """kappa does not depend on the noise multiplier: a second report on the same events,
    overlay, scales and decay finds the first's coefficients (one computation) and gives the
    epsilons of its own noise; another decay, or other events, computes again."""
    from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum

    mixing = _mixing(GRAPHS["ring-10"])
    calls: list[int] = []
    original = network_dp.view_coefficients

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(network_dp, "view_coefficients", counted)
    monkeypatch.setattr(network_dp, "_FOUND", {})
    scales = np.linspace(0.5, 1.5, 10)
    rows = {}
    for z in (3.0, 6.0):
        mechanism = ClippedGaussianSum(clip_norm=1.0, noise_multiplier=z)
        rows[z], _ = network_dp.report(
            _trace(mixing, 3, 2), mixing, mechanism, scales=scales, decay=0.97, delta=1e-5
        )
    assert len(calls) == 1 and rows[3.0]["network_dp_epsilon_max"] > rows[6.0][
        "network_dp_epsilon_max"]  # fmt: skip
    kappa, _ = original(_trace(mixing, 3, 2), mixing, scales=scales, decay=0.97)
    expected = network_dp.pairwise_epsilon(kappa, sensitivity_over_sigma=2 / 6.0, delta=1e-5)
    assert rows[6.0]["network_dp_epsilon_mean"] == pytest.approx(np.nanmean(expected), rel=1e-12)
    mechanism = ClippedGaussianSum(clip_norm=1.0, noise_multiplier=6.0)
    for trace, decay in ((_trace(mixing, 3, 2), 0.9), (_trace(mixing, 3, 1), 0.97)):
        network_dp.report(trace, mixing, mechanism, scales=scales, decay=decay, delta=1e-5)
    assert len(calls) == 3


def test_the_comparison_says_when_its_network_dp_is_an_upper_bound() -> None:
    from p2pdp.experiments.report.protocols import markdown, tuned_comparison

    base = {"protocol.name": "muffliato", "privacy.epsilon": 1.0, "mean_error": 0.2,
            "max_epsilon_spent": 1.0, "local_only_error": 0.3, "centralized_error": 0.1,
            "network_dp_note": ""}  # fmt: skip
    for method, shown in (("exact", "| 0.5 |"), ("bound", "| 0.5 (upper bound) |")):
        rows = [
            {**base, "fold": f, "network_dp_epsilon_mean": 0.5, "network_dp_method": method}
            for f in (0, 1)
        ]
        keys, table = tuned_comparison(rows, ["privacy.epsilon"])
        assert markdown(keys, table)[2].endswith(shown)


def test_the_matrix_of_an_exchange_with_lost_messages_is_the_averaging() -> None:
    """``Mixing.matrix(delivered)`` (the filtered bound's exchanges) is ``average``'s map."""
    mixing = _mixing(GRAPHS["3-regular-14"])
    rng = generator(0, "matrix")
    delivered = rng.random(len(mixing.indices)) < 0.6
    X = rng.normal(size=(14, 5))
    np.testing.assert_allclose(
        mixing.matrix(delivered) @ X, mixing.average(X, delivered), rtol=1e-12, atol=1e-12
    )
    assert not np.allclose(mixing.matrix(delivered).toarray(), mixing.matrix().toarray())


@pytest.mark.parametrize("dense_above", [-1.0, 2.0])
def test_the_exchanges_carried_to_a_step_give_the_same_bound_dense_or_sparse(
    monkeypatch, dense_above
) -> None:
    """The filter reads each exchange in the coordinates of the last step event and applies
    the exchanges since at the next one, as a dense matrix or a sparse one by their density
    (small overlays are always dense): forced either way, on a sparse ring of 30 (one and
    three exchanges a step, a lossy exchange, a peer that skips a step), the bound is the
    same to rounding and never below the exact value."""
    mixing = _mixing(nx.cycle_graph(30))
    P, rng = mixing.n_peers, generator(3, "carried")
    trace = views.ViewTrace()
    for t in range(5):
        trace.step(np.delete(np.arange(P), [t]) if t % 2 else np.arange(P))
        for _ in range(1 + 2 * (t % 2)):
            delivered = rng.random(len(mixing.indices)) < 0.9
            trace.exchange(delivered, ~delivered & (rng.random(delivered.size) < 0.5))
    scales = np.linspace(0.5, 1.5, P)
    reference = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)
    monkeypatch.setattr(network_dp_filter, "_DENSE_CARRY", dense_above)
    bound = network_dp_filter.filtered_coefficients(trace, mixing, scales=scales, decay=0.97)
    exact, _ = network_dp.view_coefficients(trace, mixing, scales=scales, decay=0.97)
    off = ~np.eye(P, dtype=bool)
    np.testing.assert_allclose(bound[off], reference[off], rtol=1e-9, atol=1e-12)
    assert (bound[off] >= exact[off] - 1e-12).all()


def test_an_infinite_coefficient_is_an_infinite_epsilon_that_the_max_column_keeps():
    """A view that determines a noise-free value (kappa = inf) leaks everything: the pairwise
    epsilon is inf, not NaN (np.nanmax, which the max columns use, would skip a NaN), and the
    correlated analysis (in clip units) says the same."""
    kappa = np.array([[0.0, np.inf], [np.nan, 0.5]])
    epsilon = network_dp.pairwise_epsilon(kappa, sensitivity_over_sigma=0.5, delta=1e-5)
    assert epsilon[0, 1] == np.inf and np.isnan(epsilon[1, 0])
    assert np.nanmax(epsilon) == np.inf
    assert epsilon[1, 1] == pytest.approx(gdp_epsilon(0.5 * np.sqrt(0.5), 1e-5))
    same = correlated_dp.epsilon_of_kappa(kappa, sensitivity_over_clip=0.5, delta=1e-5)
    np.testing.assert_array_equal(same, epsilon)
