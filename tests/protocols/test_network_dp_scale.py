"""The filtered network-DP bound at scale (issue 42): its views split across processes and its
exchanges moved one by one give the values of the plain computation."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from p2pdp.core.parallel import local_workers
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.privacy.gdp import gdp_epsilon
from p2pdp.protocols import network_dp, network_dp_filter, views
from p2pdp.protocols.mixing import Mixing


def _overlay(peers: int, degree: int) -> Mixing:
    return _mixing(nx.random_regular_graph(degree, peers, seed=3))


def _mixing(graph: nx.Graph) -> Mixing:
    peers = graph.number_of_nodes()
    adjacency = sp.csr_array(nx.to_scipy_sparse_array(graph, nodelist=range(peers)))
    adjacency.sort_indices()
    return Mixing.metropolis_hastings(adjacency.indptr, adjacency.indices)


def _lossy_trace(mixing: Mixing, steps: int, exchanges: int) -> views.ViewTrace:
    """Every peer steps but one at each step event (a different one), ``exchanges`` after each,
    a tenth of the messages lost and a tenth read late (rng seeded)."""
    rng = np.random.default_rng(7)
    trace = views.ViewTrace()
    n, edges = mixing.n_peers, len(mixing.indices)
    for step in range(steps):
        trace.step(np.delete(np.arange(n), step % n))
        for _ in range(exchanges):
            fate = rng.random(edges)
            trace.exchange(fate >= 0.2, (fate >= 0.1) & (fate < 0.2))
    return trace


def _filtered(trace, mixing, **options) -> np.ndarray:
    scales = np.linspace(0.5, 1.5, mixing.n_peers)
    return network_dp_filter.filtered_coefficients(
        trace, mixing, scales=scales, decay=0.97, **options
    )


def test_the_views_split_across_processes_give_the_same_bound(monkeypatch) -> None:
    """The batches of views go to the run's local worker processes (current_workers, as a
    single cell with ``--jobs 2`` has them; 1 in a runner's worker process, which then forks
    none); the values do not depend on the processes, and depend on the batch size only by
    the rounding of the batched products."""
    mixing = _overlay(30, 6)
    trace = _lossy_trace(mixing, 4, 3)
    alone = _filtered(trace, mixing, batch=4, workers=1)
    forked: list[tuple[int, int]] = []
    real = network_dp_filter.forked_map

    def spy(function, shared, items, *, workers):
        forked.append((workers, len(items)))
        return real(function, shared, items, workers=workers)

    monkeypatch.setattr(network_dp_filter, "forked_map", spy)
    with local_workers(2):
        split = _filtered(trace, mixing, batch=4)
    assert forked == [(2, 8)]  # 8 batches of 4 views (the last 2), 4 pieces a process
    with local_workers(1):
        _filtered(trace, mixing, batch=4)
    assert forked[-1] == (1, 1)  # one process: one piece, no fork
    off = ~np.eye(30, dtype=bool)
    assert np.isnan(split[~off]).all() and np.isfinite(split[off]).all()
    np.testing.assert_allclose(split[off], alone[off], rtol=1e-12, atol=0)
    whole = _filtered(trace, mixing, workers=2)  # one batch of every view
    np.testing.assert_allclose(whole[off], alone[off], rtol=1e-10, atol=1e-14)
    with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
        _filtered(trace, mixing, workers=0)
    with pytest.raises(ValueError, match="batch must be an integer >= 1, got 2.5"):
        _filtered(trace, mixing, batch=2.5)


def test_exchanges_moved_one_by_one_equal_their_product() -> None:
    """``_left`` moves a state through the exchanges since the last step event as their dense
    product, as its sparse form, or one exchange at a time: the same matrix product."""
    mixing = _overlay(60, 10)
    rng = np.random.default_rng(0)
    exchanges = [mixing.matrix(rng.random(len(mixing.indices)) > 0.1) for _ in range(3)]
    carry = np.eye(60)
    for W in exchanges:
        carry = W @ carry
    X = rng.standard_normal((2, 60, 7))
    expected = np.matmul(carry, X)
    stepwise = sum(W.nnz for W in exchanges)
    assert stepwise < np.count_nonzero(carry)  # dense after 3 exchanges at degree 10
    for threshold in (0.01, 1.0):  # dense / one by one
        old = network_dp_filter._DENSE_CARRY
        try:
            network_dp_filter._DENSE_CARRY = threshold
            np.testing.assert_allclose(
                network_dp_filter._left(carry, X, exchanges), expected, rtol=1e-12, atol=1e-14
            )
            np.testing.assert_allclose(
                network_dp_filter._left(carry, X[0], exchanges), expected[0], atol=1e-14
            )
        finally:
            network_dp_filter._DENSE_CARRY = old
    ring = _mixing(nx.cycle_graph(60))  # one exchange of a sparse overlay: its sparse form
    W = ring.matrix(np.ones(len(ring.indices), dtype=bool))
    assert W.nnz <= network_dp_filter._DENSE_CARRY * 60 * 60
    moved = network_dp_filter._left(W.toarray(), X, [W])
    np.testing.assert_allclose(moved, np.stack([W @ X[0], W @ X[1]]), rtol=1e-12, atol=1e-14)


def test_the_bound_moved_one_exchange_at_a_time_is_the_bound(monkeypatch) -> None:
    """With every move made sparse (one exchange at a time where that is fewer operations,
    as past ~750 peers at degree 10), the filtered bound is the dense one's to 1e-9, and still
    at least the exact value of every pair."""
    mixing = _overlay(24, 4)
    trace = _lossy_trace(mixing, 4, 3)
    dense = _filtered(trace, mixing)
    monkeypatch.setattr(network_dp_filter, "_DENSE_CARRY", 1.0)
    moved = []
    real = network_dp_filter._left

    def spy(carry, X, exchanges):
        moved.append(sum(W.nnz for W in exchanges) < np.count_nonzero(carry))
        return real(carry, X, exchanges)

    monkeypatch.setattr(network_dp_filter, "_left", spy)
    sparse = _filtered(trace, mixing)
    assert any(moved)  # some moves went one exchange at a time
    off = ~np.eye(24, dtype=bool)
    np.testing.assert_allclose(sparse[off], dense[off], rtol=1e-9, atol=1e-12)
    exact, _ = network_dp.view_coefficients(
        trace, mixing, scales=np.linspace(0.5, 1.5, 24), decay=0.97
    )
    assert (sparse[off] >= exact[off] - 1e-12).all()


def test_a_filtered_bound_beyond_its_memory_or_work_is_refused_with_the_reason(
    monkeypatch,
) -> None:
    """Views above the exact computation's size take the filtered bound, unless its work or
    its memory (the states its views share, held by every process) exceeds its limit: then
    the row is empty and the note names the limit it exceeds."""
    mixing = _overlay(16, 4)
    trace = _lossy_trace(mixing, 3, 2)
    mechanism = ClippedGaussianSum(clip_norm=1.0, noise_multiplier=2.0)
    options = {"scales": np.linspace(0.5, 1.5, 16), "decay": 0.97, "delta": 1e-5}
    monkeypatch.setattr(network_dp, "MAX_VIEW_ENTRIES", 100)
    columns, distances = network_dp.report(trace, mixing, mechanism, **options)
    assert columns["network_dp_method"] == "bound" and columns["network_dp_note"] == ""
    assert distances and np.isfinite(columns["network_dp_epsilon_max"])
    memory = network_dp_filter.filter_bytes(trace, mixing)
    assert network_dp_filter.filter_window(trace) == 5  # 2 exchanges a step
    assert memory == 8 * (3 * (1 + 5) * 16 * 16 + network_dp_filter._FILTER_FLOATS)
    monkeypatch.setattr(network_dp, "MAX_FILTER_BYTES", memory - 1)
    columns, distances = network_dp.report(trace, mixing, mechanism, **options)
    assert f"memory is {memory:,} bytes" in columns["network_dp_note"]
    assert f"more than its {memory - 1:,}" in columns["network_dp_note"]
    assert np.isnan(columns["network_dp_epsilon_max"]) and distances == []
    monkeypatch.setattr(network_dp, "MAX_FILTER_BYTES", memory)
    monkeypatch.setattr(network_dp, "MAX_FILTER_WORK", 100)
    columns, _ = network_dp.report(trace, mixing, mechanism, **options)
    assert "work is" in columns["network_dp_note"] and "memory" not in columns["network_dp_note"]


def test_1000_peers_of_muffliato_are_computed_and_beyond_refused() -> None:
    """The limits admit issue 42's run, 1,000 peers of degree 10 with 20 rounds of Muffliato's
    5 exchanges (about 370 s of CPU in each of 2 processes), and refuse what would take longer: 30
    rounds, 1,500 peers, and D-PSGD's one exchange a step at 1,000 peers, whose retirements
    solve each view's covariance (3 P^3 a view, counted by the work)."""
    graph = nx.random_regular_graph(10, 1000, seed=0)
    mixing = _mixing(graph)

    def admitted(trace: views.ViewTrace, mixing: Mixing = mixing) -> bool:
        work = network_dp_filter.filter_work(trace, mixing)
        return work <= network_dp.MAX_FILTER_WORK and (
            network_dp_filter.filter_bytes(trace, mixing) <= network_dp.MAX_FILTER_BYTES
        )

    assert admitted(views.full_delivery_trace(mixing, 20, 5))
    assert not admitted(views.full_delivery_trace(mixing, 30, 5))
    dpsgd = views.full_delivery_trace(mixing, 20, 1)
    assert not admitted(dpsgd)
    assert network_dp_filter.filter_work(dpsgd, mixing, window=2) <= network_dp.MAX_FILTER_WORK
    larger = _mixing(nx.random_regular_graph(10, 1500, seed=0))
    assert not admitted(views.full_delivery_trace(larger, 20, 5), larger)


def test_the_step_s_fresh_slot_is_read_as_a_scaling_of_the_same_value(monkeypatch) -> None:
    """A reading's response to the window's noises takes the slot the last step event filled
    (a diagonal block, not yet moved) as a scaling: the bound is the plain product's."""
    mixing = _overlay(24, 4)
    trace = _lossy_trace(mixing, 5, 3)
    off = ~np.eye(24, dtype=bool)
    for window in (2, 3):
        fast = _filtered(trace, mixing, window=window)
        with monkeypatch.context() as patch:
            patch.setattr(network_dp_filter, "_moved", lambda H, prior, fresh: H @ prior)
            plain = _filtered(trace, mixing, window=window)
        np.testing.assert_allclose(fast[off], plain[off], rtol=1e-12, atol=1e-14)


def test_many_pairs_convert_to_epsilon_at_once_like_each_alone() -> None:
    """The pairs' GDP conversions are one vectorised solve: each epsilon is its own pair's
    (the same as converting that pair alone), NaN and infinite kappa kept as they were."""
    rng = np.random.default_rng(1)
    kappa = rng.uniform(0.0, 3.0, (40, 40))
    kappa[0, 1], kappa[2, 3], kappa[4, 5] = np.nan, np.inf, 0.0
    together = network_dp.pairwise_epsilon(kappa, sensitivity_over_sigma=0.7, delta=1e-5)
    assert np.isnan(together[0, 1]) and together[2, 3] == np.inf and together[4, 5] == 0.0
    for u, v in [(0, 0), (7, 3), (39, 38), (12, 30)]:
        alone = gdp_epsilon(0.7 * np.sqrt(kappa[u, v]), 1e-5)
        assert together[u, v] == pytest.approx(float(alone), rel=1e-12)
    assert np.isfinite(together).sum() == 40 * 40 - 2
