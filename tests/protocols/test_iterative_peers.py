"""The iterative protocols' per-peer machines (p2pdp.protocols.iterative_peer) against the
batched arrays they stand beside (issue 44).

The per-peer SimPy driver (``driver = "reference"``: one machine per peer, one event per
message) and the batched driver must give the same rows, rounds table and network-DP trace
on small worlds of every protocol, with loss, lateness and churn; and a machine must refuse
what the protocol state says it may not accept.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.experiments.run.simulation import simulate
from p2pdp.protocols.iterative import DecentralizedSGD, GossipLearning, Muffliato, step_privacy
from p2pdp.protocols.iterative_peer import (
    Averaged,
    Deadline,
    Late,
    Received,
    RoundEnd,
    Send,
    Stepped,
    SynchronousPeer,
)
from p2pdp.protocols.peer_streams import StreamSeeds
from p2pdp.protocols.views import ViewTrace
from p2pdp.sim.iterative import run_iterative
from tests.protocols.test_iterative import _config, _overlay_mixing, _problem

# --- batched driver == per-peer machines -----------------------------------------------------

#: Protocols (with their settings) compared on small worlds.
PROTOCOLS = {
    "dpsgd": {"name": "dpsgd"},
    "dpsgd-pairs": {"name": "dpsgd", "pairwise_noise_multiplier": 2.0},
    "dpsgd-poisson": {"name": "dpsgd", "sampling": "poisson", "sampling_rate": 0.3},
    "dpsgd-fixed": {"name": "dpsgd", "sampling": "fixed", "batch_size": 5},
    "muffliato": {"name": "muffliato", "gossip_steps": 3},
    "gossip-learning": {"name": "gossip-learning"},
}

#: Networks: perfect, lossy with messages late past their deadline, and churn on top.
NETWORKS = {
    "perfect": ({}, {}),
    "lossy-late": ({"loss": 0.2, "latency": "exponential", "latency_mean": 0.3}, {}),
    "churn": (
        {"loss": 0.1},
        {"churn": True, "session_median": 3.0, "downtime_median": 2.0},
    ),
}


def _world(protocol: str, network: str, rounds: int = 6) -> ScenarioConfig:
    config = _config(rounds=rounds, eval_every=2, **PROTOCOLS[protocol])
    transport, churn = NETWORKS[network]
    return dataclasses.replace(
        config,
        partition=dataclasses.replace(config.partition, n_peers=12),
        network=dataclasses.replace(config.network, **transport),
        gossip=dataclasses.replace(config.gossip, **churn),
    )


def _assert_same(a: object, b: object, where: str) -> None:
    """Equal, floats to 1e-9 relative (the batched sums run in another order)."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            assert math.isnan(a) and math.isnan(b), where
        else:
            assert a == pytest.approx(b, rel=1e-9, abs=1e-12), where
    elif isinstance(a, np.ndarray):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=where)
    else:
        assert a == b, where


def _compare(config: ScenarioConfig) -> None:
    batched, reference = simulate(config), simulate(config, driver="reference")
    for key, value in batched.row().items():
        if key not in ("wall_time_s", "peak_memory_mb") and not key.startswith("wall_"):
            _assert_same(value, reference.row()[key], key)
    rows_a, rows_b = batched.round_rows(), reference.round_rows()
    assert len(rows_a) == len(rows_b) == config.protocol.rounds + 1
    for row_a, row_b in zip(rows_a, rows_b, strict=True):
        for key in row_a:
            _assert_same(row_a[key], row_b[key], f"round {row_a['round']}: {key}")
    _assert_same(batched.aggregations_per_peer, reference.aggregations_per_peer, "steps")
    assert batched.row()["messages_sent"] > 0


@pytest.mark.parametrize(
    ("protocol", "network"),
    [("dpsgd-pairs", "lossy-late"), ("muffliato", "churn"), ("gossip-learning", "lossy-late")],
)
def test_the_machines_give_the_batched_rows_and_rounds(protocol, network) -> None:
    """The default suite's cases: one per protocol family, each on an imperfect network."""
    _compare(_world(protocol, network))


@pytest.mark.slow
@pytest.mark.parametrize("network", list(NETWORKS))
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_the_machines_give_the_batched_rows_and_rounds_everywhere(protocol, network) -> None:
    _compare(_world(protocol, network))


def _traced(config: ScenarioConfig, driver: str) -> tuple[ViewTrace, object]:
    problem = _problem(generator(7, "problem"), n_peers=30)
    rngs = {name: generator(7, name) for name in ("noise", "sampling", "gossip", "pairs")}
    cls = {"dpsgd": DecentralizedSGD, "muffliato": Muffliato}[config.protocol.name]
    protocol = cls(config.protocol, problem, _overlay_mixing()[1], step_privacy(config), rngs=rngs)
    trace = ViewTrace()
    run = run_iterative(
        config,
        protocol,
        errors=lambda m: np.zeros(len(m)),
        rng=generator(7, "network"),
        trace=trace,
        driver=driver,
    )
    return trace, run


@pytest.mark.parametrize("name", ["dpsgd", "muffliato"])
def test_the_network_dp_trace_is_the_same_from_both_drivers(name) -> None:
    """Every step's peers, every exchange's averaged and late messages: the machines'
    records (a late message recorded when it arrives, rounds later) and the batched ones."""
    config = _world("muffliato" if name == "muffliato" else "dpsgd-pairs", "lossy-late")
    batched, run_a = _traced(config, "batched")
    reference, run_b = _traced(config, "reference")
    assert len(batched.events) == len(reference.events)
    late = 0
    for a, b in zip(batched.events, reference.events, strict=True):
        if isinstance(a, tuple):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
            late += int(a[1].sum())
        else:
            np.testing.assert_array_equal(a, b)
    assert late > 0 and run_a.ledger.late == run_b.ledger.late == late  # type: ignore[attr-defined]
    # the clock stops at the last round's end, not at the last late arrival
    assert run_b.end_time == pytest.approx(config.protocol.rounds)  # type: ignore[attr-defined]
    assert run_b.end_time == run_a.end_time  # type: ignore[attr-defined]


# --- streams ---------------------------------------------------------------------------------


def test_a_peers_streams_are_its_own_and_any_runtime_derives_them_alike() -> None:
    """Peer i's generator is the i-th spawn of its family's root (what a host derives alone),
    and a batched step draws peer i's noise from it whichever other peers step."""
    seeds = StreamSeeds.from_rngs({name: generator(1, name) for name in ("noise", "sampling")})
    root = np.random.SeedSequence(list(seeds.entropy["noise"]))
    spawned = np.random.default_rng(root.spawn(5)[3]).standard_normal(4)
    np.testing.assert_array_equal(seeds.generator("noise", 3).standard_normal(4), spawned)
    config = _config(noise_multiplier=10.0)
    problem = _problem(generator(2, "problem"), n_peers=30)
    mixing = _overlay_mixing()[1]
    models = []
    for peers in (np.arange(30), np.array([4, 9])):
        rngs = {name: generator(2, name) for name in ("noise", "sampling")}
        protocol = DecentralizedSGD(
            config.protocol, problem, mixing, step_privacy(config), rngs=rngs
        )
        protocol.step(peers)
        models.append(protocol.models[9].copy())
    np.testing.assert_array_equal(models[0], models[1])  # same draws for peer 9
    fresh = StreamSeeds.fresh()
    assert fresh.entropy["noise"] != StreamSeeds.fresh().entropy["noise"]


# --- one machine's refusals ------------------------------------------------------------------


def _machine(exchanges: int = 1) -> tuple[SynchronousPeer, np.ndarray]:
    config = _config(name="muffliato" if exchanges > 1 else "dpsgd", gossip_steps=exchanges,
                     noise_multiplier=10.0, rounds=5)  # fmt: skip
    problem = _problem(generator(3, "problem"), n_peers=30)
    rngs = {name: generator(3, name) for name in ("noise", "sampling", "gossip")}
    cls = Muffliato if exchanges > 1 else DecentralizedSGD
    protocol = cls(config.protocol, problem, _overlay_mixing()[1], step_privacy(config), rngs=rngs)
    machine = protocol.peer(0)
    assert isinstance(machine, SynchronousPeer)
    return machine, protocol.mixing.indices[protocol.mixing.indptr[0] : protocol.mixing.indptr[1]]


def test_a_round_steps_sends_to_every_neighbour_and_sets_the_deadline() -> None:
    machine, neighbours = _machine(exchanges=2)
    effects = machine.on_round(10.0, 1)
    assert effects[0] == Stepped(0, 1, 1)
    sends = [e for e in effects if isinstance(e, Send)]
    assert sorted(s.to for s in sends) == sorted(neighbours.tolist())
    assert all((s.round, s.exchange) == (1, 0) for s in sends)
    np.testing.assert_array_equal(sends[0].model, machine.model)
    assert effects[-1] == Deadline(10.5, 1, 0)  # round_period 1 s over 2 exchanges
    assert [type(e) for e in machine.on_deadline(10.5)][-1] is Deadline  # exchange 1 follows
    assert isinstance(machine.on_deadline(11.0)[-1], RoundEnd)


def test_a_machine_averages_what_arrived_by_its_own_row() -> None:
    machine, neighbours = _machine()
    machine.on_round(0.0, 1)
    own = machine.model.copy()
    a, b = int(neighbours[0]), int(neighbours[1])
    models = {a: own + 1.0, b: own - 3.0}
    for sender, model in models.items():
        assert machine.on_message(0.1, sender, 1, 0, model) == []
    effects = machine.on_deadline(1.0)
    averaged = next(e for e in effects if isinstance(e, Averaged))
    assert sorted(averaged.senders) == sorted(models)
    w = {int(j): machine.weights[k] for k, j in enumerate(neighbours.tolist())}
    expected = own + w[a] * (models[a] - own) + w[b] * (models[b] - own)  # missing: own kept
    np.testing.assert_allclose(machine.model, expected, rtol=1e-12)


def test_a_machine_refuses_strangers_duplicates_and_the_future_and_reads_the_late() -> None:
    machine, neighbours = _machine()
    friend, other = int(neighbours[0]), int(neighbours[1])
    stranger = next(j for j in range(30) if j not in neighbours and j != 0)
    model = np.ones(machine.dim)
    assert machine.on_message(0.0, friend, 1, 0, model) == []  # before its first round
    machine.on_round(0.0, 1)
    assert machine.on_message(0.1, stranger, 1, 0, model) == []
    assert machine.on_message(0.1, friend, 2, 0, model) == []  # a round not begun
    assert machine.on_message(0.1, friend, 9, 0, model) == []  # beyond protocol.rounds
    assert machine.on_message(0.1, friend, 1, 1, model) == []  # dpsgd has one exchange
    assert machine.on_message(0.1, friend, 1, 0, np.full(machine.dim, np.nan)) == []
    assert machine.on_message(0.1, friend, 1, 0, np.ones(3)) == []
    assert machine.on_message(0.2, friend, 1, 0, model) == []  # accepted
    assert machine.on_message(0.3, friend, 1, 0, 2 * model) == []  # a duplicate
    averaged = next(e for e in machine.on_deadline(1.0) if isinstance(e, Averaged))
    assert averaged.senders == (friend,)  # the first copy, once
    machine.on_round(1.0, 2)
    assert machine.on_message(1.1, other, 1, 0, model) == [Late(0, other, 1, 0)]
    assert machine.on_message(1.2, other, 1, 0, model) == []  # a late one, read once
    assert machine.on_message(1.2, friend, 1, 0, model) == []  # already averaged: duplicate
    assert dict(machine.refused) == {
        "early": 2,
        "not a neighbour": 1,
        "no such exchange": 2,
        "bad payload": 2,
        "duplicate": 3,
    }
    with pytest.raises(ValueError, match="round 2 after round 2"):
        machine.on_round(2.0, 2)


def test_a_gossip_machine_merges_once_per_wake_up_then_steps() -> None:
    config = _config(name="gossip-learning", noise_multiplier=10.0, rounds=5)
    problem = _problem(generator(5, "problem"), n_peers=30)
    rngs = {name: generator(5, name) for name in ("noise", "sampling", "gossip")}
    protocol = GossipLearning(config.protocol, problem, _overlay_mixing()[1],
                              step_privacy(config), rngs=rngs)  # fmt: skip
    machine = protocol.peer(3)
    neighbours = protocol.mixing.indices[protocol.mixing.indptr[3] : protocol.mixing.indptr[4]]
    (send,) = machine.on_wake(0.5)  # type: ignore[attr-defined]
    assert send.to in neighbours and (send.round, send.exchange) == (1, 0)
    received = np.full(machine.dim, 0.25)
    effects = machine.on_message(0.7, int(neighbours[0]), 4, 0, received)  # type: ignore[attr-defined]
    assert effects[0] == Received(3, int(neighbours[0]), 4) and effects[1] == Stepped(3, 1, 1)
    assert machine.on_message(0.8, int(neighbours[0]), 4, 0, received) == []  # type: ignore[attr-defined]
    assert machine.on_message(0.8, 3, 5, 0, received) == []  # type: ignore[attr-defined]
    assert dict(machine.refused) == {"duplicate": 1, "not a neighbour": 1}


def test_a_protocol_that_changes_a_step_but_has_no_machine_is_refused_by_the_per_peer_driver():
    class Louder(DecentralizedSGD):
        def step(self, peers: np.ndarray | None = None) -> np.ndarray:
            return super().step(peers)

    config = _config()
    problem = _problem(generator(6, "problem"), n_peers=30)
    rngs = {name: generator(6, name) for name in ("noise", "sampling")}
    protocol = Louder(config.protocol, problem, _overlay_mixing()[1], step_privacy(config),
                      rngs=rngs)  # fmt: skip
    with pytest.raises(ConfigError, match="overrides step but not peer"):
        protocol.peer(0)
