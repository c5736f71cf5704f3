"""D-PSGD and Muffliato on the network runtime (p2pdp.net.iterative_host, iterative_coordinator).

The fast tests drive host objects in this process over loopback TCP; the slow ones start
host processes (spawn: several seconds each) and compare whole runs with the simulator's.
"""

from __future__ import annotations

import asyncio
import csv
import math
import os
import signal
import threading
import time

import numpy as np
import pytest

from p2pdp.config import (
    DataConfig,
    EvaluationConfig,
    NetworkConfig,
    PartitionConfig,
    PrivacyConfig,
    ProtocolConfig,
    ScenarioConfig,
)
from p2pdp.core.errors import ConfigError
from p2pdp.experiments.iterative_network import _machines
from p2pdp.experiments.simulation import simulate
from p2pdp.net.iterative_host import (
    AHEAD,
    KEPT,
    LATE,
    TOO_LATE,
    IterativeHost,
    IterativeSettings,
    SeededDraws,
)
from p2pdp.net.wire import MODEL, ModelFrame, ProtocolError, model_frame, pack_vector, parse_model
from p2pdp.protocols.iterative import LocalProblem, Muffliato, step_privacy
from p2pdp.protocols.mixing import Mixing

# -- in this process: the machines, the frames, two hosts over loopback ------------------------


def _small(name: str = "dpsgd", *, rounds: int = 4, gossip_steps: int = 1) -> ScenarioConfig:
    return ScenarioConfig(
        seed=5,
        data=DataConfig(dataset="synthetic", synthetic_rows=240, synthetic_test_rows=60),
        partition=PartitionConfig(n_peers=6),
        privacy=PrivacyConfig(epsilon=2.0, delta=1e-5, mechanism="gaussian"),
        protocol=ProtocolConfig(
            name=name,
            rounds=rounds,
            gossip_steps=gossip_steps,
            sampling="fixed",
            batch_size=5,
        ),
        evaluation=EvaluationConfig(split="fixed"),
    )


def _ring(n: int) -> Mixing:
    indices = np.array([sorted({(i - 1) % n, (i + 1) % n}) for i in range(n)]).ravel()
    return Mixing.metropolis_hastings(np.arange(0, 2 * n + 1, 2), indices)


def _population(config: ScenarioConfig, rows: int = 12, dim: int = 4):
    rng = np.random.default_rng(3)
    n = config.partition.n_peers
    X = rng.normal(size=(n * rows, dim))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = rng.choice([-1.0, 1.0], size=n * rows)
    shards = tuple(np.arange(i * rows, (i + 1) * rows) for i in range(n))
    return X, y, shards


def test_a_peer_keeps_each_neighbours_model_once_and_reads_late_ones_once():
    config = _small()
    X, y, shards = _population(config)
    mixing = _ring(6)
    (peer,) = _machines(
        config, np.array([0]), X, y, shards[:1], mixing, step_privacy(config), 1
    ).values()
    model = np.zeros(4)
    assert peer.on_message(3, 0, model) != KEPT  # 3 is not a neighbour of 0 on the ring
    assert peer.on_message(1, 0, model) == KEPT  # before round 1: its first exchange
    assert peer.on_message(1, 0, model) != KEPT  # a second copy
    assert peer.on_message(1, 1, model) == AHEAD  # two exchanges ahead
    peer.on_round(1)
    assert peer.on_message(5, 1, model) == KEPT  # the next exchange: kept early
    delivered, sends = peer.on_deadline()
    assert delivered.tolist() == [0] and sends == []  # edge 0 carries 1's model to 0
    assert peer.on_message(1, 0, model) != KEPT  # averaged already: a replay is refused
    assert peer.on_message(5, 0, model) == LATE  # exchange 0 is over: read, not averaged
    assert peer.on_message(5, 0, model) not in (KEPT, LATE)  # late once
    for round_ in (2, 3):
        peer.on_round(round_)
        peer.on_deadline()
    assert peer.on_message(1, 0, model) == TOO_LATE  # beyond the two rounds kept
    assert len(peer.seen) <= 2 * 2 and len(peer.inbox) <= 2  # bounded


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("round", 0),
        ("round", 5),
        ("round", True),
        ("exchange", 1),
        ("sender", 6),
        ("receiver", "1"),
        ("model", pack_vector(np.zeros(3))),
        ("model", pack_vector(np.array([0.0, math.nan, 0.0, 0.0]))),
    ],
)
def test_a_model_frame_out_of_range_is_refused_naming_its_field(field, value):
    message = {"kind": MODEL, "sender": 1, "receiver": 0, "round": 1, "exchange": 0}
    message["model"] = pack_vector(np.zeros(4))
    parse_model(message, n_peers=6, rounds=4, exchanges=1, dim=4)  # as sent: accepted
    message[field] = value
    with pytest.raises(ProtocolError):
        parse_model(message, n_peers=6, rounds=4, exchanges=1, dim=4)


def _hosts(config, X, y, shards, mixing, *, period, draws_seed=None):
    privacy = step_privacy(config)
    exchanges = config.protocol.gossip_steps if config.protocol.name == "muffliato" else 1
    settings = IterativeSettings(
        n_peers=6, hosts=2, rounds=config.protocol.rounds, exchanges=exchanges,
        period=period, dim=X.shape[1], timeout=5.0,
    )  # fmt: skip
    reports: list[list[dict]] = [[], []]
    hosts = []
    for h, peers in enumerate((np.arange(3), np.arange(3, 6))):
        machines = _machines(
            config, peers, X, y, tuple(shards[p] for p in peers), mixing, privacy, exchanges
        )
        if draws_seed is not None:  # each host replays the same streams, as with seeded noise
            rngs = {"noise": np.random.default_rng(draws_seed),
                    "sampling": np.random.default_rng(draws_seed + 1)}  # fmt: skip
            draws = SeededDraws(rngs, np.array([len(s) for s in shards]))
            for machine in machines.values():
                machine.draws = draws
        hosts.append(IterativeHost(machines, mixing, settings, report=reports[h].append))
    return hosts, reports, privacy


async def _run(hosts):
    ports = [await host.listen() for host in hosts]
    for host in hosts:
        host.ports, host.addresses = ports, ["127.0.0.1"] * len(hosts)
    start = asyncio.get_running_loop().time() + 0.05
    try:
        await asyncio.gather(*(host.run(start) for host in hosts))
    finally:
        for host in hosts:
            await host.close()


@pytest.mark.parametrize("name", ["dpsgd", "muffliato"])
def test_two_hosts_over_loopback_take_the_simulators_steps_and_averagings(name):
    """The machines of two hosts, their frames over TCP, paced by the clock: the models of
    the population-wide protocol with the same draws (every model arrives in time here)."""
    config = _small(name, gossip_steps=2)
    X, y, shards = _population(config)
    mixing = _ring(6)
    hosts, reports, privacy = _hosts(config, X, y, shards, mixing, period=0.2, draws_seed=7)
    asyncio.run(_run(hosts))
    cls = Muffliato if name == "muffliato" else type(hosts[0].machines[0].step)
    reference = cls(
        config.protocol,
        LocalProblem.from_shards(X, y, shards, config.training.lam),
        mixing,
        privacy,
        rngs={"noise": np.random.default_rng(7), "sampling": np.random.default_rng(8)},
    )
    exchanges = 2 if name == "muffliato" else 1
    for _ in range(config.protocol.rounds):
        reference.step()
        for _ in range(exchanges):
            reference.average(np.ones(len(mixing.indices), dtype=bool))
    got = np.stack([h.machines[p].model for h in hosts for p in sorted(h.machines)])
    np.testing.assert_allclose(got, reference.models, rtol=1e-12, atol=1e-14)
    assert not np.allclose(reference.models, 0.0)
    for h, host_reports in enumerate(reports):
        assert [r["round"] for r in host_reports] == [1, 2, 3, 4]
        into = np.flatnonzero(mixing.receivers // 3 == h).tolist()
        for report in host_reports:
            assert report["stepped"] == list(range(3 * h, 3 * h + 3))
            assert [sorted(ex) for ex in report["delivered"]] == [into] * exchanges
            assert report["sent"] == [6] * exchanges and report["late"] == []
        # each host sent the other one frame per edge across them and exchange
        assert hosts[h].counters.wire[MODEL] == 2 * exchanges * config.protocol.rounds
        assert hosts[h].counters.messages.sum() == 6 * exchanges * config.protocol.rounds


def test_a_frame_from_a_host_that_does_not_run_its_sender_is_refused():
    config = _small()
    X, y, shards = _population(config)
    hosts, _, _ = _hosts(config, X, y, shards, _ring(6), period=0.2)
    host = hosts[0]
    host.credential = object()  # as with TLS: the sender's certificate name is checked
    message = {
        "kind": MODEL, "sender": 5, "receiver": 0, "round": 1, "exchange": 0,
        "model": pack_vector(np.zeros(4)),
    }  # fmt: skip
    host.handle(message, "host-0")  # peer 5 runs on host 1
    host.handle({**message, "receiver": 4}, "host-1")  # peer 4 is not on host 0
    assert host.counters.refused[MODEL] == 2
    host.handle(message, "host-1")
    assert host.counters.refused[MODEL] == 2 and 5 in host.machines[0].inbox[0]
    assert model_frame(ModelFrame(5, 0, 1, 0, np.zeros(4)))  # encodes


@pytest.mark.parametrize(
    ("protocol", "key"),
    [
        ({"name": "gossip-learning"}, "protocol.name"),
        ({"pairwise_noise_multiplier": 1.0}, "protocol.pairwise_noise_multiplier"),
    ],
)
def test_what_the_network_does_not_run_yet_is_refused_by_name(protocol, key):
    with pytest.raises(ConfigError, match=f"{key} = .* not supported by the network runtime"):
        simulate(_small(), runtime="network", protocol=protocol)
