"""Correlated, pairwise-cancelling noise (issue 39): exact privacy per threat model.

The brute force here is independent of :mod:`p2pdp.protocols.correlated_dp`: it simulates a
D-PSGD run with dense matrices (``W`` from networkx degrees, an explicit per-round delivered
matrix, pair variables numbered in networkx's edge order), builds the joint covariance of the
adversary's messages and the noises it knows, conditions on them with a Schur complement and
takes the Mahalanobis form ``M = G^T Sigma^+ G`` of the target's data terms with a dense
pseudo-inverse, then enumerates the adversary's signs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import scenario_from_mapping
from p2pdp.learning.local_problem import LocalProblem
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.privacy.gdp import gdp_epsilon
from p2pdp.protocols import correlated_dp, network_dp
from p2pdp.protocols.correlated_dp import CorrelatedRun
from p2pdp.protocols.iterative import DecentralizedSGD, step_privacy
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.views import ViewTrace
from tests.conftest import tiny_config


def _er() -> nx.Graph:
    seed = 0
    while True:
        graph = nx.erdos_renyi_graph(9, 0.35, seed=seed)
        if nx.is_connected(graph):
            return graph
        seed += 1


GRAPHS = {
    "ring-8": nx.cycle_graph(8),
    "star-7": nx.star_graph(6),
    "3-regular-14": nx.random_regular_graph(3, 14, seed=1),
    "erdos-renyi-9": _er(),
}


def _mixing(graph: nx.Graph) -> Mixing:
    n = graph.number_of_nodes()
    adjacency = sp.csr_array(nx.to_scipy_sparse_array(graph, nodelist=range(n)))
    adjacency.sort_indices()
    return Mixing.metropolis_hastings(adjacency.indptr, adjacency.indices)


def _trace(mixing: Mixing, rounds: int, lost: np.ndarray | None = None) -> ViewTrace:
    """D-PSGD: every round all peers step, then one exchange; ``lost`` (rounds, E) ints:
    0 delivered, 1 late (read, not averaged), 2 lost."""
    trace = ViewTrace()
    E = len(mixing.indices)
    for r in range(rounds):
        trace.step(np.arange(mixing.n_peers))
        status = np.zeros(E, dtype=int) if lost is None else lost[r]
        trace.exchange(status == 0, status == 1)
    return trace


def _brute_run(graph, rounds, *, z, zp, scales, decay=1.0, lost=None, mode="fresh"):
    """Dense simulation: every peer's sent model per round as coefficients of the noises.

    ``mode``: "fresh" (the design), "reused" (one pair variable per edge for the whole run),
    "symmetric" (the same sign at both ends: no cancellation).
    Returns (messages (rounds, P, N), data (rounds, P, rounds P), who (N,) dict info, W rows).
    """
    P = graph.number_of_nodes()
    edges = sorted(tuple(sorted(e)) for e in graph.edges())
    degree = dict(graph.degree())
    W = np.zeros((P, P))
    for a, b in edges:
        W[a, b] = W[b, a] = 1.0 / (1.0 + max(degree[a], degree[b]))
    per_round = P + (0 if mode == "reused" else len(edges))
    N = rounds * per_round + (len(edges) if mode == "reused" else 0)
    owner = np.full(N, -1)  # independent noise of peer
    edge_of = np.full(N, -1)  # pair noise of edges[k]
    x = np.zeros((P, N))
    y = np.zeros((P, rounds * P))
    messages, data = [], []
    directed = [(i, j) for i in range(P) for j in sorted(graph.neighbors(i))]  # CSR order
    for r in range(rounds):
        x, y = decay * x, decay * y
        base = r * per_round
        for i in range(P):
            x[i, base + i] -= scales[i] * z
            owner[base + i] = i
            y[i, r * P + i] -= scales[i]
        for k, (a, b) in enumerate(edges):
            col = (rounds * per_round + k) if mode == "reused" else base + P + k
            c = max(scales[a], scales[b]) * zp  # eta / min(m_a, m_b)
            x[a, col] -= c
            x[b, col] -= c if mode == "symmetric" else -c
            edge_of[col] = k
        messages.append(x.copy())
        data.append(y.copy())
        Wr = W.copy()
        if lost is not None:
            for e, (i, j) in enumerate(directed):
                if lost[r, e] > 0:  # late or lost: not averaged
                    Wr[i, j] = 0.0
        Wr[np.arange(P), np.arange(P)] = 0.0
        Wr[np.arange(P), np.arange(P)] = 1.0 - Wr.sum(axis=1)
        x, y = Wr @ x, Wr @ y
    return np.array(messages), np.array(data), owner, edge_of, edges, directed


def _brute_Ms(brute, observers, lost=None):
    """``M`` of every target outside ``observers`` (None: eavesdropper), Schur-conditioned."""
    messages, data, owner, edge_of, edges, directed = brute
    rounds, P, N = messages.shape
    rows, drows = [], []
    for r in range(rounds):
        for j in range(P):
            if observers is None:
                sees = True
            else:
                sees = any(
                    (i in observers) and (lost is None or lost[r, e] < 2)
                    for e, (i, jj) in enumerate(directed)
                    if jj == j
                )
            if sees:
                rows.append(messages[r, j])
                drows.append(data[r, j])
    A, D = np.array(rows), np.array(drows)
    if observers is None:
        known = np.zeros(N, dtype=bool)
    else:
        known = np.array(
            [
                (owner[c] in observers)
                or (edge_of[c] >= 0 and (set(edges[edge_of[c]]) & set(observers)))
                for c in range(N)
            ],
            dtype=bool,
        )
    # joint covariance of (view, known noises) with unit-variance noises; condition on known
    S_yy, S_yk = A @ A.T, A[:, known]
    S_kk = np.eye(int(known.sum()))
    cov = S_yy - S_yk @ np.linalg.solve(S_kk, S_yk.T) if known.any() else S_yy
    precision = np.linalg.pinv(cov, rcond=1e-12, hermitian=True)
    Ms = {}
    for u in range(P):
        if observers is not None and u in observers:
            continue
        G = D[:, [t * P + u for t in range(rounds)]]
        outside = G - cov @ precision @ G
        Ms[u] = np.inf if np.abs(outside).max() > 1e-8 else G.T @ precision @ G
    return Ms


def _sign_max(M) -> float:
    if np.isscalar(M) and np.isinf(M):
        return np.inf
    return max(
        float(np.array(s) @ M @ np.array(s)) for s in itertools.product((-1, 1), repeat=len(M))
    )


def _module_kappa(graph, rounds, observers, *, z, zp, scales, lost=None):
    mixing = _mixing(graph)
    run = CorrelatedRun.build(
        _trace(mixing, rounds, lost),
        mixing,
        scales=scales,
        decay=1.0,
        noise_multiplier=z,
        pair_noise_multiplier=zp,
    )
    P = mixing.n_peers
    targets = np.array([u for u in range(P) if observers is None or u not in observers])
    return dict(zip(targets.tolist(), run.kappa(observers, targets).tolist(), strict=True))


def _check(graph, rounds, observers, *, z=1.0, zp=3.0, scales=None, lost=None) -> None:
    P = graph.number_of_nodes()
    scales = np.full(P, 0.5) if scales is None else scales
    brute = _brute_run(graph, rounds, z=z, zp=zp, scales=scales, lost=lost)
    Ms = _brute_Ms(brute, observers, lost)
    kappa = _module_kappa(graph, rounds, observers, z=z, zp=zp, scales=scales, lost=lost)
    assert set(kappa) == set(Ms)
    for u, M in Ms.items():
        signs = _sign_max(M)
        assert kappa[u] >= signs * (1 - 1e-9) - 1e-12, (u, observers)  # never below
        if rounds <= 2:
            assert kappa[u] == pytest.approx(signs, rel=1e-7, abs=1e-10), (u, observers)
        else:
            cap = min(np.abs(M).sum(), rounds * np.linalg.eigvalsh(M)[-1])
            assert kappa[u] <= cap + 1e-9


@pytest.mark.parametrize("whitening", ["covariance", "svd"])
@pytest.mark.parametrize("rounds", [1, 2, 3])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_eavesdropper_and_every_curious_peer_match_the_brute_force(
    name, rounds, whitening, monkeypatch
) -> None:
    """Exact (T <= 2) or between the brute force's signs and its SDP caps (T = 3), for the
    eavesdropper and every curious peer; unequal shards (scales) on two graphs; both ways the
    module whitens a view (its covariance's eigenvectors, or the SVD it falls back to)."""
    if whitening == "svd":
        monkeypatch.setattr(correlated_dp, "_GRAM_CONDITION", 0.0)
    graph = GRAPHS[name]
    P = graph.number_of_nodes()
    scales = None
    if name in ("star-7", "erdos-renyi-9"):
        scales = 0.5 + 0.1 * generator(3, "scales", name).random(P)
    _check(graph, rounds, None, scales=scales)
    for v in range(P):
        _check(graph, rounds, [v], scales=scales)


@pytest.mark.parametrize("name", list(GRAPHS))
def test_coalitions_and_lost_messages_match_the_brute_force(name) -> None:
    """Coalitions (pooled views and secrets), with and without late (read, not averaged)
    and lost (never seen) messages."""
    graph = GRAPHS[name]
    P = graph.number_of_nodes()
    E = 2 * graph.number_of_edges()
    lost = generator(5, "lost", name).choice(3, size=(2, E), p=[0.6, 0.2, 0.2])
    for coalition in ([0, 1], [1, 3, 5], list(graph.neighbors(2))):
        _check(graph, 2, coalition)
        _check(graph, 2, coalition, lost=lost)
    _check(graph, 2, None, lost=lost)
    assert P > 5


def _filtered(graph, rounds, observers, *, z, zp, scales, decay, lost=None):
    mixing = _mixing(graph)
    P = mixing.n_peers
    targets = np.array([u for u in range(P) if observers is None or u not in observers])
    trace = _trace(mixing, rounds, lost)
    common = {"scales": scales, "decay": decay, "noise_multiplier": z, "pair_noise_multiplier": zp}
    fast = correlated_dp.filtered_kappa(
        trace, mixing, observers=observers, targets=targets, **common
    )
    dense = CorrelatedRun.build(trace, mixing, **common).kappa(observers, targets)
    return fast, dense, targets


def _same(fast, dense) -> None:
    """Equal within 1e-7 relative (the two computations' rounding margins differ: up to 4e-8
    measured), both infinite together."""
    assert np.array_equal(np.isinf(fast), np.isinf(dense))
    finite = np.isfinite(dense)
    np.testing.assert_allclose(fast[finite], dense[finite], rtol=1e-7, atol=1e-14)


NOISES = {"pairs": (1.0, 3.0), "no-pairs": (1.0, 0.0), "strong-pairs": (0.7, 10.0)}


@pytest.mark.parametrize("noise", list(NOISES))
@pytest.mark.parametrize("name", list(GRAPHS))
def test_the_filter_equals_the_dense_views_and_never_falls_below_the_brute_force(
    name, noise
) -> None:
    """:func:`filtered_kappa` (the Kalman filter) against today's exact solver
    (:meth:`CorrelatedRun.kappa`) for the eavesdropper, every curious peer and three
    coalitions (with late and lost messages), over 1, 2 and 4 rounds (two curious peers at 4),
    unequal shards and a decay; and never below the brute force where its sign enumeration is
    exact (2 rounds)."""
    graph = GRAPHS[name]
    z, zp = NOISES[noise]
    P = graph.number_of_nodes()
    scales = 0.5 + 0.1 * generator(3, "scales", name).random(P)
    E = 2 * graph.number_of_edges()
    lost = generator(5, "lost", name).choice(3, size=(2, E), p=[0.6, 0.2, 0.2])
    coalitions = ([0, 1], [1, 3, 5], list(graph.neighbors(2)))
    for rounds in (1, 2, 4):
        curious = [[v] for v in range(P)] if rounds < 4 else [[0], [P - 1]]
        for observers in [None, *curious, *coalitions]:
            fast, dense, _ = _filtered(
                graph, rounds, observers, z=z, zp=zp, scales=scales, decay=0.98
            )
            _same(fast, dense)
    for observers in [None, [0], *coalitions]:
        for drop in (None, lost):
            fast, dense, targets = _filtered(
                graph, 2, observers, z=z, zp=zp, scales=scales, decay=1.0, lost=drop
            )
            _same(fast, dense)
            brute = _brute_Ms(_brute_run(graph, 2, z=z, zp=zp, scales=scales, lost=drop),
                              observers, drop)  # fmt: skip
            exact = np.array([_sign_max(brute[u]) for u in targets.tolist()])
            assert np.all(fast >= exact * (1 - 1e-12)), (observers, fast - exact)


def test_the_filter_sees_a_shift_without_noise_as_the_dense_views_do() -> None:
    """Without independent noise (z = 0) the eavesdropper sees the network's sum without
    noise (infinite) and a curious peer's pseudo-inverse keeps only the directions the pair
    noise covers: the filter's singular innovations give the dense values."""
    graph = GRAPHS["3-regular-14"]
    for observers in (None, [0], [0, 1]):
        fast, dense, _ = _filtered(
            graph, 3, observers, z=0.0, zp=2.0, scales=np.full(14, 0.5), decay=0.99
        )
        _same(fast, dense)
    assert np.isinf(_filtered(graph, 3, None, z=0.0, zp=2.0, scales=np.full(14, 0.5),
                              decay=0.99)[0]).all()  # fmt: skip


@pytest.mark.parametrize("name", ["ring-8", "erdos-renyi-9"])
def test_without_pair_noise_the_filter_is_network_dps_pairwise_view(name) -> None:
    """z_p = 0: every curious peer's filtered kappa is network DP's (independent noise, the
    same views), a computation of its own in :mod:`p2pdp.protocols.network_dp`."""
    mixing = _mixing(GRAPHS[name])
    P = mixing.n_peers
    trace = _trace(mixing, 3)
    scales = 0.5 + 0.1 * generator(7, "scales", name).random(P)
    pairwise, _ = network_dp.view_coefficients(trace, mixing, scales=scales, decay=0.99)
    for v in range(P):
        targets = np.array([u for u in range(P) if u != v])
        fast = correlated_dp.filtered_kappa(
            trace, mixing, scales=scales, decay=0.99, noise_multiplier=1.0,
            pair_noise_multiplier=0.0, observers=[v], targets=targets,
        )  # fmt: skip
        np.testing.assert_allclose(fast, pairwise[targets, v], rtol=1e-7, atol=1e-14)


@pytest.mark.slow
def test_the_filter_equals_the_dense_views_on_a_larger_overlay_over_more_rounds() -> None:
    """40 peers, degree 6, 12 rounds: every curious peer within 1e-7 of the dense views."""
    graph = nx.random_regular_graph(6, 40, seed=2)
    scales = 0.05 + 0.01 * generator(6, "scales").random(40)
    for observers in (None, *([v] for v in range(0, 40, 7)), [3, 4, 5]):
        fast, dense, _ = _filtered(
            graph, 12, observers, z=1.0, zp=3.0, scales=scales, decay=1 - 2 / 128
        )
        _same(fast, dense)


def test_the_one_round_closed_form_is_the_eavesdroppers_exact_value() -> None:
    """``[(z^2 I + z_p^2 L)^-1]_uu`` (re-derived, not the paper's bound) equals the brute force;
    it falls from ``1 / z^2`` towards ``1 / (P z^2)`` as the pair noise grows."""
    for graph in GRAPHS.values():
        P = graph.number_of_nodes()
        L = nx.laplacian_matrix(graph, nodelist=range(P)).toarray().astype(float)
        for z, zp in ((1.0, 0.0), (1.0, 2.0), (0.5, 50.0)):
            closed = correlated_dp.eavesdropper_one_round(L, z, zp)
            brute = _brute_Ms(_brute_run(graph, 1, z=z, zp=zp, scales=np.full(P, 0.3)), None)
            for u in range(P):
                assert closed[u] == pytest.approx(brute[u][0, 0], rel=1e-9)
        big = correlated_dp.eavesdropper_one_round(L, 1.0, 1e4)
        assert np.allclose(big, 1.0 / P, rtol=1e-3)


def test_reusing_pair_noise_across_rounds_raises_the_eavesdroppers_epsilon() -> None:
    """Pair noise reused across rounds (a mistake of DECOR's public code) leaks: the
    eavesdropper differences two rounds and the pair terms cancel there."""
    graph = GRAPHS["3-regular-14"]
    scales = np.full(14, 0.5)
    fresh = _brute_Ms(_brute_run(graph, 2, z=1.0, zp=10.0, scales=scales), None)
    reused = _brute_Ms(_brute_run(graph, 2, z=1.0, zp=10.0, scales=scales, mode="reused"), None)
    module = _module_kappa(graph, 2, None, z=1.0, zp=10.0, scales=scales)
    for u in range(14):
        assert module[u] == pytest.approx(_sign_max(fresh[u]), rel=1e-7)
        assert _sign_max(reused[u]) > 5 * module[u]


def test_pair_noise_that_does_not_cancel_leaves_noise_in_the_network_average() -> None:
    """The same sign at both ends: the network sum of the noise coefficients keeps the pair
    terms (with opposite signs only the independent noises remain)."""
    graph = GRAPHS["erdos-renyi-9"]
    scales = np.full(9, 0.5)
    for mode, pair_left in (("fresh", False), ("symmetric", True)):
        messages, _, owner, edge_of, *_ = _brute_run(
            graph, 2, z=1.0, zp=3.0, scales=scales, mode=mode
        )
        total = messages[-1].sum(axis=0)
        assert (np.abs(total[edge_of >= 0]).max() > 1e-6) == pair_left
        assert np.abs(total[owner >= 0]).min() > 0.1


def test_without_independent_noise_the_eavesdropper_sees_the_sum_exactly() -> None:
    """``z = 0``: pair noise cancels in the sum of all messages, so every shift is seen
    without noise (infinite epsilon), while a curious peer on a 3-regular graph is still
    hidden by the secrets it does not know."""
    graph = GRAPHS["3-regular-14"]
    kappa = _module_kappa(graph, 1, None, z=0.0, zp=2.0, scales=np.full(14, 0.5))
    assert all(np.isinf(k) for k in kappa.values())
    brute = _brute_Ms(_brute_run(graph, 1, z=0.0, zp=2.0, scales=np.full(14, 0.5)), None)
    assert all(np.isscalar(M) and np.isinf(M) for M in brute.values())
    epsilon = correlated_dp.epsilon_of_kappa(
        np.array(list(kappa.values())), sensitivity_over_clip=2.0, delta=1e-5
    )
    assert np.isinf(epsilon).all()


def test_correlated_noise_never_costs_more_than_local_dp() -> None:
    """Pair noise can only add noise to a view: every threat model's kappa is at most the
    independent-noise-only value (z_p = 0) of the same view, which is at most T / z^2."""
    graph = GRAPHS["3-regular-14"]
    scales = np.full(14, 0.5)
    for observers in (None, [0], [0, 1, 2]):
        with_pairs = _module_kappa(graph, 3, observers, z=1.0, zp=5.0, scales=scales)
        without = _module_kappa(graph, 3, observers, z=1.0, zp=0.0, scales=scales)
        for u in with_pairs:
            assert with_pairs[u] <= without[u] + 1e-9 <= 3.0 + 2e-9


# --- the noise layer of D-PSGD: config -> noise drawn -> epsilon reported ----------------------


def _config(**protocol) -> ScenarioConfig:
    settings = {"name": "dpsgd", "rounds": 3, "noise_multiplier": 2.0, "step_size": 0.7}
    return tiny_config(
        partition={"n_peers": 14, "scheme": "quantity_skew"},
        training={"lam": 0.01},
        privacy={"mechanism": "gaussian", "epsilon": 50.0, "delta": 1e-5},
        gossip={"degree": 3},
        evaluation={"cv_folds": 2},
        protocol={**settings, **protocol},
    )


def _dpsgd(config: ScenarioConfig, graph: nx.Graph, d: int, seed: int = 0) -> DecentralizedSGD:
    """D-PSGD of ``config`` on ``graph`` with ``d`` features, unequal shards (2..5 rows)."""
    rng = generator(seed, "problem")
    P = graph.number_of_nodes()
    sizes = 2 + np.arange(P) % 4
    X = rng.normal(size=(sizes.sum(), d)) / np.sqrt(d)
    y = np.where(rng.random(sizes.sum()) < 0.5, -1.0, 1.0)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    shards = tuple(np.arange(bounds[i], bounds[i + 1]) for i in range(P))
    problem = LocalProblem.from_shards(X, y, shards, lam=config.training.lam)
    rngs = {name: generator(seed, name) for name in ("noise", "sampling", "gossip", "pairs")}
    return DecentralizedSGD(config.protocol, problem, _mixing(graph), step_privacy(config),
                            rngs=rngs)  # fmt: skip


def test_pair_terms_cancel_over_the_peers_are_fresh_each_round_and_have_their_scale() -> None:
    graph = GRAPHS["3-regular-14"]
    protocol = _dpsgd(_config(pairwise_noise_multiplier=3.0), graph, d=20000)
    everyone = np.arange(14)
    first = protocol.pair_terms(everyone, 20000)
    second = protocol.pair_terms(everyone, 20000)
    assert isinstance(first, np.ndarray) and isinstance(second, np.ndarray)
    scale = np.abs(first).max()
    assert np.abs(first.sum(axis=0)).max() <= 1e-12 * scale  # cancels, up to rounding
    m = protocol._denominators
    for i in range(14):  # a peer's term: sum over its edges of N(0, (z_p C / m_e)^2)
        expected = sum((3.0 / min(m[i], m[j])) ** 2 for j in graph.neighbors(i))
        assert first[i].var() == pytest.approx(expected, rel=0.05)
    correlation = np.corrcoef(first.ravel(), second.ravel())[0, 1]
    assert abs(correlation) < 0.01  # fresh every round, not reused
    # peers that do not step (offline): each stepping end still adds its whole term (it
    # cannot know), so the terms of edges with one end stepping no longer cancel
    some = np.array([0, 1, 2, 3, 5, 8])
    partial = protocol.pair_terms(some, 20000)
    assert isinstance(partial, np.ndarray) and partial.shape == (6, 20000)
    for k, i in enumerate(some.tolist()):
        expected = sum((3.0 / min(m[i], m[j])) ** 2 for j in graph.neighbors(i))
        assert partial[k].var() == pytest.approx(expected, rel=0.05)
    assert np.abs(partial.sum(axis=0)).max() > 0.1 * np.abs(partial).max()
    assert _dpsgd(_config(), graph, d=5).pair_terms(everyone, 5) == 0.0


def _fixed_gradients(monkeypatch) -> None:
    """Gradient sums that do not depend on the models (peer ``i``'s is ``i`` in every
    coordinate): runs then differ only by their noise, as the accounting's model assumes."""
    monkeypatch.setattr(
        LocalProblem,
        "clipped_sums",
        lambda self, models, peers, mechanism, rng: np.repeat(
            peers[:, None].astype(float), models.shape[1], axis=1
        ),
    )


def test_the_network_average_keeps_only_the_independent_noise_unless_a_message_is_lost(
    monkeypatch,
) -> None:
    """Same seeds with and without pair noise: every delivered round leaves the peers' mean
    model unchanged by the pair noise (to rounding); a lost message leaves some in it."""
    _fixed_gradients(monkeypatch)
    graph = GRAPHS["erdos-renyi-9"]
    E = 2 * graph.number_of_edges()
    for lose, equal in ((False, True), (True, False)):
        means = []
        for zp in (0.0, 5.0):
            protocol = _dpsgd(_config(**({"pairwise_noise_multiplier": zp} if zp else {})),
                              graph, d=6)  # fmt: skip
            for r in range(3):
                protocol.step()
                delivered = np.ones(E, dtype=bool)
                delivered[0] = not (lose and r == 1)
                protocol.average(delivered)
            means.append(protocol.models.mean(axis=0))
        assert np.allclose(means[0], means[1], rtol=0, atol=1e-12) == equal


def test_the_noise_drawn_has_the_covariance_the_accounting_assumes(monkeypatch) -> None:
    """Wiring: with the gradients zeroed, every message of a real D-PSGD run (20,000 iid
    coordinates) has the empirical covariance ``C^2 A A^T`` of the model the epsilons come
    from (pair noise fresh, antisymmetric, unscaled by W), to sampling error."""
    _fixed_gradients(monkeypatch)
    graph = GRAPHS["star-7"]
    d, clip = 20000, 0.5
    config = _config(pairwise_noise_multiplier=3.0, clip_norm=clip)
    protocol = _dpsgd(config, graph, d=d)
    E = 2 * graph.number_of_edges()
    lost = generator(2, "lost").random((3, E)) < 0.2
    trace, sent = ViewTrace(), []
    for r in range(3):
        trace.step(protocol.step())
        sent.append(protocol.models.copy())
        trace.exchange(~lost[r], np.zeros(E, dtype=bool))
        protocol.average(~lost[r])
    run = CorrelatedRun.build(
        trace,
        protocol.mixing,
        scales=0.7 / protocol._denominators,
        decay=1.0 - 0.7 * 0.01,
        noise_multiplier=protocol.privacy.mechanism.noise_multiplier,
        pair_noise_multiplier=protocol.pair_noise_multiplier,
    )
    A = np.concatenate(run.messages) * clip
    model = A @ A.T
    observed = np.concatenate(sent)
    gradients = np.concatenate(run.data) @ np.tile(np.arange(7.0), 3)  # the known mean
    observed = observed - gradients[:, None]
    empirical = observed @ observed.T / d
    spread = np.sqrt(np.outer(np.diag(model), np.diag(model)))
    assert np.abs(empirical - model).max() / spread.max() < 5.5 * np.sqrt(2.0 / d)
    assert (np.abs(empirical - model) <= 5.5 * np.sqrt(2.0 / d) * spread + 1e-15).all()


def test_rows_report_the_exact_epsilon_per_threat_model_of_the_run() -> None:
    """Config -> run -> columns: the brute force of the run's overlay, unequal shards and
    decay, computed here, gives the reported eavesdropper and curious-peer epsilons; both are
    below local DP, and below the same run's values without pair noise."""
    from p2pdp.sim.overlay import build_overlay

    config = _config(pairwise_noise_multiplier=4.0)
    result = simulate(config)
    row = result.row()
    assert row["correlated_dp_note"] == ""
    overlay = build_overlay(config.gossip, 14, rng=generator(config.seed, "overlay", 0, 0))
    graph = nx.Graph()
    graph.add_nodes_from(range(14))
    rows = np.repeat(np.arange(14), np.diff(overlay.indptr))
    graph.add_edges_from(zip(rows.tolist(), overlay.indices.tolist(), strict=True))
    scales = 0.7 / result.shard_sizes.astype(float)
    assert np.ptp(scales) > 0
    z = result.row()["noise_multiplier_used"]
    ratio, decay = 2.0, 1.0 - 0.7 * 0.01  # Delta / C; the step's decay

    def worst(zp: float) -> tuple[float, float]:
        brute = _brute_run(graph, 3, z=z, zp=zp, scales=scales, decay=decay)
        eaves = max(_sign_max(M) for M in _brute_Ms(brute, None).values())
        curious = max(_sign_max(M) for v in range(14) for M in _brute_Ms(brute, [v]).values())
        return eaves, curious

    eaves, curious = worst(4.0)
    # kappa with T = 3 steps: the reported value lies between the signs and the SDP caps
    for column, kappa in (("eavesdropper", eaves), ("curious_peer", curious)):
        reported = row[f"correlated_dp_{column}_epsilon"]
        floor = gdp_epsilon(ratio * np.sqrt(kappa), 1e-5)
        assert reported >= floor * (1 - 1e-9)
        assert reported <= gdp_epsilon(ratio * np.sqrt(3 * kappa), 1e-5)
        assert reported < row["max_epsilon_spent"]
    without = worst(0.0)
    assert eaves < without[0] and curious < without[1]


NONE = {"mechanism": "none", "epsilon": 2.0}


def test_pair_noise_is_refused_where_nothing_reads_it_and_empty_where_not_computed(
    monkeypatch,
) -> None:
    document = {
        "data": {"dataset": "synthetic", "synthetic_rows": 600, "synthetic_test_rows": 200},
        "privacy": {"mechanism": "gaussian", "epsilon": 2.0, "delta": 1e-5},
        "protocol": {"name": "dpsgd", "pairwise_noise_multiplier": 1.0},
    }
    scenario_from_mapping(document)  # read by D-PSGD with noisy steps
    for protocol, privacy in (("muffliato", {}), ("gossip-learning", {}), ("dpsgd", NONE)):
        changed = {
            **document,
            "protocol": {**document["protocol"], "name": protocol},
            "privacy": privacy or document["privacy"],
        }
        with pytest.raises(ConfigError, match="pairwise_noise_multiplier"):
            scenario_from_mapping(changed)
    with pytest.raises(ConfigError, match="pairwise_noise_multiplier"):
        _config(pairwise_noise_multiplier=-1.0)
    base = _config(pairwise_noise_multiplier=1.0, rounds=2)
    poisson = dataclasses.replace(
        base,
        protocol=dataclasses.replace(base.protocol, sampling="poisson", sampling_rate=0.5),
        privacy=dataclasses.replace(base.privacy, min_shard_size=1),
    )
    row = simulate(poisson).row()
    assert "protocol.sampling = 'poisson'" in row["correlated_dp_note"]
    assert math.isnan(row["correlated_dp_eavesdropper_epsilon"])
    monkeypatch.setattr(correlated_dp, "MAX_FILTER_COST", 100)
    row = simulate(base).row()
    assert "more than the 1e+02 of an exact computation" in row["correlated_dp_note"]
    assert math.isnan(row["correlated_dp_curious_peer_epsilon"])
    plain = simulate(_config(rounds=2)).row()  # off by default: nothing computed, no note
    assert math.isnan(plain["correlated_dp_eavesdropper_epsilon"])
    assert plain["correlated_dp_note"] == ""


def test_a_noise_multiplier_calibrated_for_a_threat_model_spends_exactly_its_budget() -> None:
    """``kappa(z, r z) = kappa(1, r) / z^2``: the multiplier from one unit computation gives,
    recomputed by the brute force at that multiplier, the target epsilon (never more)."""
    graph = GRAPHS["3-regular-14"]
    scales = np.full(14, 0.4)
    unit = _module_kappa(graph, 2, [0], z=1.0, zp=4.0, scales=scales)
    z = correlated_dp.calibrated_noise_multiplier(
        max(unit.values()), epsilon=1.0, delta=1e-5, sensitivity_over_clip=2.0
    )
    brute = _brute_Ms(_brute_run(graph, 2, z=z, zp=4.0 * z, scales=scales), [0])
    kappa = max(_sign_max(M) for M in brute.values())
    epsilon = float(gdp_epsilon(2.0 * np.sqrt(kappa), 1e-5))
    assert epsilon == pytest.approx(1.0, rel=1e-8) and epsilon <= 1.0 + 1e-12
    with pytest.raises(ConfigError, match="without noise"):
        correlated_dp.calibrated_noise_multiplier(
            np.inf, epsilon=1.0, delta=1e-5, sensitivity_over_clip=2.0
        )


@pytest.mark.parametrize("name", ["ring-8", "star-7"])
def test_the_worst_coalition_of_each_size_is_the_brute_forces_worst(name) -> None:
    """Every coalition of 1 and 2 peers enumerated by the brute force: the module's worst per
    target equals the brute force's (T = 2: exact); coalitions of one are the curious peers,
    and a larger coalition never learns less."""
    graph = GRAPHS[name]
    P = graph.number_of_nodes()
    scales = np.full(P, 0.5)
    mixing = _mixing(graph)
    run = CorrelatedRun.build(
        _trace(mixing, 2), mixing, scales=scales, decay=1.0, noise_multiplier=1.0,
        pair_noise_multiplier=3.0,
    )  # fmt: skip
    brute = _brute_run(graph, 2, z=1.0, zp=3.0, scales=scales)
    previous = np.zeros(P)
    for size in (1, 2):
        worst = correlated_dp.worst_coalition_kappa(run, size)
        expected = np.zeros(P)
        for members in itertools.combinations(range(P), size):
            for u, M in _brute_Ms(brute, list(members)).items():
                expected[u] = max(expected[u], _sign_max(M))
        np.testing.assert_allclose(worst, expected, rtol=1e-7, atol=1e-10)
        assert (worst >= previous - 1e-12).all()
        previous = worst
    curious = np.zeros(P)
    for v in range(P):
        others = np.array([u for u in range(P) if u != v])
        curious[others] = np.maximum(curious[others], run.kappa([v], others))
    np.testing.assert_allclose(correlated_dp.worst_coalition_kappa(run, 1), curious, rtol=1e-12)
    with pytest.raises(ConfigError, match="to enumerate"):
        correlated_dp.worst_coalition_kappa(run, P)


@pytest.mark.parametrize("threat", ["eavesdropper", "curious-peer"])
def test_a_threat_model_calibrates_the_noise_so_the_row_spends_the_budget_against_it(
    threat,
) -> None:
    """Config -> calibrated z -> noise drawn -> epsilon reported: with
    ``protocol.threat_model`` the run's worst target spends privacy.epsilon against that
    adversary (the brute force of the run's overlay, at the row's z, brackets it), z_p is the
    ratio times z, every peer takes every step, and local DP is reported honestly (above the
    budget); the central reference stays at the local-DP budget."""
    from p2pdp.sim.overlay import build_overlay

    base = _config(noise_multiplier=None, pairwise_noise_multiplier=3.0, threat_model=threat)
    config = dataclasses.replace(base, privacy=dataclasses.replace(base.privacy, epsilon=2.0))
    row = simulate(config).row()
    column = f"correlated_dp_{threat.replace('-', '_')}_epsilon"
    assert row[column] == pytest.approx(2.0, rel=1e-6) and row[column] <= 2.0 + 1e-9
    z = row["noise_multiplier_used"]
    assert row["pairwise_noise_multiplier_used"] == pytest.approx(3.0 * z, rel=1e-12)
    assert row["mean_steps_per_peer"] == 3 and row["max_epsilon_spent"] > 2.0
    assert row["central_dp_epsilon"] == pytest.approx(2.0, rel=1e-4)
    local = dataclasses.replace(config, protocol=dataclasses.replace(
        config.protocol, threat_model="local"))  # fmt: skip
    assert z < simulate(local).row()["noise_multiplier_used"]
    overlay = build_overlay(config.gossip, 14, rng=generator(config.seed, "overlay", 0, 0))
    graph = nx.Graph()
    graph.add_nodes_from(range(14))
    rows = np.repeat(np.arange(14), np.diff(overlay.indptr))
    graph.add_edges_from(zip(rows.tolist(), overlay.indices.tolist(), strict=True))
    sizes = simulate(config).shard_sizes.astype(float)
    brute = _brute_run(graph, 3, z=z, zp=3.0 * z, scales=0.7 / sizes, decay=1.0 - 0.7 * 0.01)
    observers = [None] if threat == "eavesdropper" else [[v] for v in range(14)]
    kappa = max(_sign_max(M) for o in observers for M in _brute_Ms(brute, o).values())
    assert gdp_epsilon(2.0 * np.sqrt(kappa), 1e-5) <= 2.0 * (1 + 1e-9)  # the claim holds
    assert gdp_epsilon(2.0 * np.sqrt(3 * kappa), 1e-5) >= 2.0 * (1 - 1e-9)  # and is not loose


def test_a_threat_model_is_refused_where_the_calibration_cannot_hold() -> None:
    with pytest.raises(ConfigError, match="leave protocol.noise_multiplier unset"):
        _config(threat_model="curious-peer", pairwise_noise_multiplier=3.0)
    with pytest.raises(ConfigError, match="pairwise_noise_multiplier > 0"):
        _config(noise_multiplier=None, threat_model="eavesdropper")
    document = {
        "data": {"dataset": "synthetic", "synthetic_rows": 600, "synthetic_test_rows": 200},
        "privacy": {"mechanism": "gaussian", "epsilon": 2.0, "delta": 1e-5},
        "protocol": {"name": "muffliato", "pairwise_noise_multiplier": 1.0,
                     "threat_model": "eavesdropper"},
    }  # fmt: skip
    with pytest.raises(ConfigError, match="threat_model"):
        scenario_from_mapping(document)
    calibrated = _config(noise_multiplier=None, pairwise_noise_multiplier=3.0,
                         threat_model="curious-peer")  # fmt: skip
    lossy = dataclasses.replace(
        calibrated, network=dataclasses.replace(calibrated.network, loss=0.2)
    )
    with pytest.raises(ConfigError, match="network.loss = 0"):
        simulate(lossy)
    late = dataclasses.replace(  # messages later than the round: the trace is not the one
        calibrated, network=dataclasses.replace(calibrated.network, latency_mean=5.0)
    )
    with pytest.raises(ConfigError, match="lost or delayed"):
        simulate(late)


def test_a_calibration_beyond_the_filters_cost_limit_is_refused(monkeypatch) -> None:
    """The refusal names the cost (the P + 1 views' multiply-adds) and the limit; just
    within it the calibration runs."""
    mixing = _mixing(GRAPHS["ring-8"])
    cost = correlated_dp.report_cost(correlated_dp.loss_free_trace(mixing, 3), mixing)
    settings = {"rounds": 3, "scales": np.full(8, 0.5), "decay": 1.0, "ratio": 3.0,
                "threat": "curious_peer", "epsilon": 1.0, "delta": 1e-5,
                "sensitivity_over_clip": 2.0}  # fmt: skip
    monkeypatch.setattr(correlated_dp, "MAX_FILTER_COST", cost - 1)
    with pytest.raises(ConfigError, match=r"multiply-adds, more than .*lower protocol.rounds"):
        correlated_dp.threat_calibration(mixing, **settings)
    monkeypatch.setattr(correlated_dp, "MAX_FILTER_COST", cost)
    assert correlated_dp.threat_calibration(mixing, **settings) > 0


def test_the_rows_scaled_unit_views_equal_the_views_computed_at_the_runs_noise() -> None:
    """``kappa(z, r z) = kappa(1, r) / z^2``: the report (unit views, cached per run) gives the
    epsilons of the views built at the run's own z, and another ratio is not served from the
    cache."""
    graph = GRAPHS["3-regular-14"]
    mixing = _mixing(graph)
    trace = correlated_dp.loss_free_trace(mixing, 3)
    scales = 0.5 + 0.1 * generator(4, "scales").random(14)
    mechanism = ClippedGaussianSum(clip_norm=1.0, noise_multiplier=1.7)
    row = correlated_dp.report(
        trace, mixing, mechanism, scales=scales, decay=0.99, pair_noise_multiplier=5.1,
        delta=1e-5,
    )  # fmt: skip
    direct = correlated_dp.worst_kappas(CorrelatedRun.build(
        trace, mixing, scales=scales, decay=0.99, noise_multiplier=1.7,
        pair_noise_multiplier=5.1))  # fmt: skip
    for threat, kappa in direct.items():
        expected = gdp_epsilon(2.0 * np.sqrt(kappa), 1e-5)
        assert row[f"correlated_dp_{threat}_epsilon"] == pytest.approx(expected, rel=1e-6)
    other = correlated_dp.unit_worst_kappas(trace, mixing, scales=scales, decay=0.99, ratio=1.0)
    assert other["eavesdropper"] > direct["eavesdropper"] * 1.7**2 * (1 + 1e-3)


def test_a_threat_model_run_computes_its_views_once(monkeypatch) -> None:
    """The row's columns find the calibration's views at z = 1 again (one computation per
    cell): keyed by the configured ratio, not by z_p / z recomputed from the
    drawn z_p, which here differs from 3.0 in its last bit (at epsilon = 4: the calibration's
    rounding decides which budgets do; the first assert checks the premise)."""
    base = _config(
        noise_multiplier=None, pairwise_noise_multiplier=3.0, threat_model="eavesdropper"
    )
    config = dataclasses.replace(base, privacy=dataclasses.replace(base.privacy, epsilon=4.0))
    monkeypatch.setattr(correlated_dp, "_UNIT_KAPPAS", {})
    built = []
    compute = correlated_dp.filtered_worst_kappas

    def counted(*args, **kwargs):
        built.append(kwargs.get("pair_noise_multiplier"))
        return compute(*args, **kwargs)

    monkeypatch.setattr(correlated_dp, "filtered_worst_kappas", counted)
    row = simulate(config).row()
    assert row["pairwise_noise_multiplier_used"] / row["noise_multiplier_used"] != 3.0
    assert built == [3.0]
