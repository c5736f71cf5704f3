"""Fewer SimPy events, same run: coalesced deliveries and timeout-free reliable groups.

The transport delivers messages that arrive at one instant, scheduled back to back, with one
event, and the curators of a loss-free central run wait without a collection timeout. Both only
remove events that could not change the run; these tests compare every output of such runs with
the same runs on the reference path (one event per message, a timeout per group).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import simpy

from p2pdp.config import NetworkConfig, ScenarioConfig
from p2pdp.data.settings import PartitionConfig
from p2pdp.experiments.run.simulation import simulate
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GossipConfig, GroupsConfig, PublicationConfig
from p2pdp.sim import transport as transport_module
from p2pdp.sim.central import CentralSampler
from tests.conftest import tiny_config


def config(**changes) -> ScenarioConfig:
    base = tiny_config(
        seed=3,
        data={"synthetic_test_rows": 100},
        partition={"n_peers": 30},
        privacy={"epsilon": 1.0, "epsilon_per_aggregation": 0.2},
        groups={"group_size": 5},
        evaluation={"split": "fixed"},
    )
    return dataclasses.replace(base, **changes)


CASES = {
    "constant latency, full publication": config(),
    "constant latency, group publication, 3 groups at once": config(
        groups=GroupsConfig(group_size=5, max_concurrent_groups=3),
        publication=PublicationConfig(mode="group"),
    ),
    "exponential latency, loss, 3 groups at once": config(
        groups=GroupsConfig(group_size=4, max_concurrent_groups=3, collect_timeout=0.3),
        network=NetworkConfig(latency="exponential", loss=0.05),
        publication=PublicationConfig(mode="group"),
    ),
    "secure aggregation": config(
        privacy=PrivacyConfig(epsilon=1.0, mechanism="coordinate-laplace", secure_aggregation=True)
    ),
    "gossip with churn and crashes": config(
        groups=GroupsConfig(group_size=4, sampler="gossip"),
        gossip=GossipConfig(degree=6, churn=True, member_crash_probability=0.1),
    ),
}


def run(config: ScenarioConfig, *, reference: bool, monkeypatch) -> tuple:
    """Everything a run reports, and the number of events it scheduled."""
    with monkeypatch.context() as patch:
        if reference:  # one event per message, a collection timeout per group
            send = transport_module.Transport.send

            def one_event_each(self, *args, coalesce=False):
                send(self, *args)

            patch.setattr(transport_module.Transport, "send", one_event_each)
            patch.setattr(CentralSampler, "faults", True)
        counted = [0]
        schedule = simpy.Environment.schedule

        def counting(self, *args, **kwargs):
            counted[0] += 1
            schedule(self, *args, **kwargs)

        patch.setattr(simpy.Environment, "schedule", counting)
        # the SimPy world's events are under test (p2pdp.sim.waves, which batches the
        # loss-free central runs without any, is compared with it in test_waves.py)
        result = simulate(config, driver="reference")
    outputs = (
        result.evaluation.summary(),
        result.aggregations,
        result.aborted_groups,
        result.aggregations_per_peer.tolist(),
        result.sim_time,
        result.messages_sent,
        result.bytes_sent,
        result.messages_lost,
        result.stop_reason,
        result.releases,
    )
    return outputs, counted[0]


@pytest.mark.parametrize("name", CASES)
def test_fewer_events_change_nothing_else(name, monkeypatch):
    reference, reference_events = run(CASES[name], reference=True, monkeypatch=monkeypatch)
    fewer, events = run(CASES[name], reference=False, monkeypatch=monkeypatch)
    assert fewer == reference  # exact: every number, every release record
    assert events <= reference_events


@pytest.mark.parametrize("group_size", [1, 10, 40])
def test_a_loss_free_central_group_costs_a_handful_of_events(group_size, monkeypatch):
    """Under a constant latency, 3g - 2 messages per group, yet fewer than 6 events."""
    cfg = config(
        groups=GroupsConfig(group_size=group_size),
        partition=PartitionConfig(n_peers=4 * group_size),
    )
    (_, aggregations, *_), reference = run(cfg, reference=True, monkeypatch=monkeypatch)
    (_, same, *_), events = run(cfg, reference=False, monkeypatch=monkeypatch)
    assert aggregations == same > 0
    assert events / aggregations < 6, events / aggregations
    if group_size >= 10:
        assert reference / aggregations > 2 * group_size  # an event per message and a timeout


def test_a_message_never_overtakes_an_event_scheduled_before_it():
    """Same arrival instant, an unrelated event scheduled in between: three events, in order."""
    env = transport_module.Environment()
    transport = transport_module.Transport(
        env, NetworkConfig(latency_mean=0.5), 2, rng=np.random.default_rng(0)
    )
    order = []
    transport.send(0, order.append, "first", 10, coalesce=True)
    transport.send(1, order.append, "joins the first", 10, coalesce=True)
    env.timeout(0.5).callbacks.append(lambda _: order.append("unrelated"))
    transport.send(0, order.append, "after the unrelated event", 10, coalesce=True)
    env.run()
    assert order == ["first", "joins the first", "unrelated", "after the unrelated event"]
    assert env.scheduled == 3
