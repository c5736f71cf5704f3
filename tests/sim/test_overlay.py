"""Overlay graphs: structure of each kind, CSR form, connectivity checks, seeding, bad input."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.protocols.settings import GossipConfig
from p2pdp.sim import overlay as overlay_module
from p2pdp.sim.overlay import build_overlay, random_regular_edges
from p2pdp.sim.shuffle import CompiledShuffle


def edges_of(overlay) -> set[tuple[int, int]]:
    rows = np.repeat(np.arange(overlay.n_peers), overlay.degrees())
    return set(zip(rows.tolist(), overlay.indices.tolist(), strict=True))


def assert_simple_undirected(overlay) -> None:
    edges = edges_of(overlay)
    assert len(edges) == overlay.indices.size  # no repeated edge
    assert all((v, u) in edges for u, v in edges)  # stored both ways
    assert all(u != v for u, v in edges)  # no self-loop
    for peer in range(overlay.n_peers):
        assert np.all(np.diff(overlay.neighbours(peer)) > 0)  # sorted rows


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("random-regular", {"degree": 6}),
        ("erdos-renyi", {"degree": 8}),
        ("watts-strogatz", {"degree": 6, "rewiring": 0.2}),
        ("barabasi-albert", {"attachment": 3}),
    ],
)
def test_every_kind_is_a_connected_simple_graph(kind, params):
    overlay = build_overlay(GossipConfig(overlay=kind, **params), 300, rng=np.random.default_rng(1))
    assert overlay.n_peers == 300 and overlay.indptr.shape == (301,)
    assert overlay.indptr.dtype == np.int64 and overlay.indices.dtype == np.int32
    assert overlay.n_components == 1
    assert_simple_undirected(overlay)


def test_degrees_follow_each_model():
    rng = np.random.default_rng(2)
    n = 2000
    regular = build_overlay(GossipConfig(overlay="random-regular", degree=7), n, rng=rng)
    assert np.all(regular.degrees() == 7)
    ring = build_overlay(GossipConfig(overlay="watts-strogatz", degree=6, rewiring=0.0), n, rng=rng)
    assert np.all(ring.degrees() == 6)
    assert set(ring.neighbours(10).tolist()) == {7, 8, 9, 11, 12, 13}
    er = build_overlay(GossipConfig(overlay="erdos-renyi", degree=10), n, rng=rng)
    # mean degree 10: the edge count is Binomial(n(n-1)/2, 10/(n-1)), sd ~ 0.07 per peer
    assert abs(er.degrees().mean() - 10) < 0.5
    explicit = build_overlay(GossipConfig(overlay="erdos-renyi", edge_probability=0.01), n, rng=rng)
    assert abs(explicit.degrees().mean() - 0.01 * (n - 1)) < 1.0
    ba = build_overlay(GossipConfig(overlay="barabasi-albert", attachment=4), n, rng=rng)
    assert ba.degrees().min() >= 4
    assert ba.indices.size == 2 * 4 * (n - 4)  # m edges per peer after the first m
    assert ba.degrees().max() > 10 * 4  # preferential attachment grows hubs


def test_seeded_by_the_generator():
    config = GossipConfig(overlay="random-regular", degree=4)
    first = build_overlay(config, 100, rng=np.random.default_rng(5))
    again = build_overlay(config, 100, rng=np.random.default_rng(5))
    other = build_overlay(config, 100, rng=np.random.default_rng(6))
    np.testing.assert_array_equal(first.indices, again.indices)
    assert not np.array_equal(first.indices, other.indices)


def test_disconnected_overlay_is_an_error_unless_allowed():
    sparse = GossipConfig(overlay="erdos-renyi", edge_probability=0.005)
    with pytest.raises(ConfigError, match=r"gossip.overlay 'erdos-renyi' on 100 peers is disc"):
        build_overlay(sparse, 100, rng=np.random.default_rng(0))
    allowed = GossipConfig(overlay="erdos-renyi", edge_probability=0.005, allow_disconnected=True)
    overlay = build_overlay(allowed, 100, rng=np.random.default_rng(0))
    assert overlay.n_components > 1


def test_single_peer_overlay_is_trivially_connected():
    overlay = build_overlay(GossipConfig(overlay="erdos-renyi"), 1, rng=np.random.default_rng(0))
    assert overlay.n_components == 1 and overlay.indices.size == 0


@pytest.mark.parametrize(
    ("params", "n_peers", "message"),
    [
        ({"overlay": "random-regular", "degree": 10}, 10, "gossip.degree must be < partition"),
        ({"overlay": "random-regular", "degree": 3}, 11, "degree \\* n_peers even"),
        ({"overlay": "watts-strogatz", "degree": 12}, 12, "gossip.degree must be <"),
        ({"overlay": "barabasi-albert", "attachment": 5}, 5, "gossip.attachment must be <"),
    ],
)
def test_parameters_that_do_not_fit_the_peers(params, n_peers, message):
    with pytest.raises(ConfigError, match=message):
        build_overlay(GossipConfig(**params), n_peers, rng=np.random.default_rng(0))


def test_bad_peer_count():
    with pytest.raises(ConfigError, match="partition.n_peers must be an integer >= 1, got 0"):
        build_overlay(GossipConfig(), 0, rng=np.random.default_rng(0))


@pytest.mark.parametrize(
    ("degree", "n_peers"),
    [(1, 2), (2, 5), (3, 4), (3, 6), (4, 5), (5, 6), (5, 8), (6, 10), (4, 12), (8, 30), (10, 100)],
)
def test_random_regular_edges_are_networkx_graph(degree, n_peers):
    """The same edges as networkx's generator for the same seed, dense graphs included
    (whose attempts fail and start over: the same random stream throughout)."""
    for seed in range(40):
        graph = nx.random_regular_graph(degree, n_peers, seed=seed)
        expected = sorted((min(u, v), max(u, v)) for u, v in graph.edges())
        assert random_regular_edges(degree, n_peers, seed).tolist() == [
            list(edge) for edge in expected
        ]


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**40 + 7])
def test_compiled_shuffle_is_pythons(seed):
    """The compiled shuffle gives CPython's permutations, call after call (lengths whose
    ``randbelow`` rejects often: just above powers of two), and leaves the twister where
    CPython's is (the next word is the same)."""
    python, compiled = random.Random(seed), CompiledShuffle(seed)
    for n in (0, 1, 2, 3, 5, 17, 1025, 4097, 70_000):
        expected = list(range(n)) * 2
        python.shuffle(expected)
        values = np.tile(np.arange(n, dtype=np.int64), 2)
        compiled(values)
        assert values.tolist() == expected
    assert int(compiled._twister.random_raw()) == python.getrandbits(32)


@pytest.mark.parametrize(("degree", "n_peers"), [(3, 4), (5, 6), (6, 10), (4, 12), (10, 100)])
def test_random_regular_edges_compiled_are_networkx_graph(degree, n_peers, monkeypatch):
    """With every shuffle compiled, the same edges as networkx's (dense graphs too, whose
    attempts fail and start over)."""
    monkeypatch.setattr(overlay_module, "COMPILED_STUBS", 0)
    for seed in range(20):
        graph = nx.random_regular_graph(degree, n_peers, seed=seed)
        expected = sorted((min(u, v), max(u, v)) for u, v in graph.edges())
        assert random_regular_edges(degree, n_peers, seed).tolist() == [
            list(edge) for edge in expected
        ]
