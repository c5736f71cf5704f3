"""The one-shot aggregation as a transport-free state machine (p2pdp.protocols.groups).

Driven here by hand, message by message, as a network runtime would drive it; the SimPy world
drives the same object (the golden rows check that it still gives the seed's runs).
"""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.config import ScenarioConfig
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.settings import EvaluationConfig
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.groups import (
    ASSIGN,
    PARTIAL,
    PUBLISH,
    SAMPLER,
    SHARE,
    SUBMIT,
    Group,
    Send,
)
from p2pdp.protocols.settings import GroupsConfig, PublicationConfig


def _group(secure: bool, members=(4, 7, 2), curator=7) -> Group:
    return Group(0, np.array(members), curator, secure=secure)


def test_plain_group_is_ready_when_the_curator_holds_every_statistic():
    group = _group(secure=False)
    assert group.assignments() == [Send(ASSIGN, SAMPLER, m) for m in (4, 7, 2)]
    sizes = {4: 40, 7: 70, 2: 20}
    sends = []
    for member in (4, 7, 2):  # every member learns its group
        step = group.contribute(member, sizes[member])
        assert not step.ready
        sends.extend(step.sends)
    # the curator's own statistic never travels; the others go to the curator
    assert sends == [Send(SUBMIT, 4, 7), Send(SUBMIT, 2, 7)]
    assert not group.on_submit(2, sizes[2])  # arrival order, not member order
    assert group.on_submit(4, sizes[4])
    assert group.submitted == [7, 2, 4] and group.sizes == [70, 20, 40]
    assert group.publications() == [Send(PUBLISH, 7, 4), Send(PUBLISH, 7, 2)]


def test_secure_group_needs_every_members_partial_sum_once():
    group = _group(secure=True)
    sizes = {4: 40, 7: 70, 2: 20}
    shares = [s for m in (4, 7, 2) for s in group.contribute(m, sizes[m]).sends]
    assert sorted(shares) == sorted(
        Send(SHARE, a, b) for a in (4, 7, 2) for b in (4, 7, 2) if a != b
    )
    partials, readies = [], []
    for share in shares:  # every share arrives
        step = group.on_share(share.receiver, sizes[share.receiver])
        partials.extend(step.sends)
        readies.append(step.ready)
    # the others send their partial sums to the curator; the curator keeps its own
    assert sorted(partials) == sorted([Send(PARTIAL, 4, 7), Send(PARTIAL, 2, 7)])
    assert not any(readies)  # the curator still waits for the others' partial sums
    assert not group.on_partial(4, 40)
    assert not group.on_partial(4, 40)  # a replayed partial sum is not a second member's
    assert group.on_partial(2, 20)
    assert group.submitted == [4, 7, 2] and group.sizes == [40, 70, 20]  # member order


@pytest.mark.parametrize("size", [2, 3, 5])
def test_a_member_sends_its_partial_sum_only_with_every_other_members_share(size):
    """A partial sum sent early would hold a share too few: the curator's sum would not
    cancel the masks (and would expose the member's statistic). Each member's shares arrive
    one by one; nothing leaves before the last, then exactly one partial sum."""
    members = tuple(range(10, 10 + size))
    group = _group(secure=True, members=members, curator=members[-1])
    for member in members:
        group.contribute(member, 30)
    for member in members:
        for arrived in range(1, size):  # shares from the size - 1 others
            step = group.on_share(member, 30)
            if arrived < size - 1:
                assert step.sends == () and not step.ready, (member, arrived)
        if member != members[-1]:
            assert list(step.sends) == [Send(PARTIAL, member, members[-1])]
            assert not group.on_partial(member, 30)
        else:  # the curator's own partial sum completes the group
            assert step.sends == () and step.ready
    assert group.submitted == list(members)


def test_secure_group_of_one_is_its_own_partial_sum():
    group = _group(secure=True, members=(5,), curator=5)
    step = group.contribute(5, 9)
    assert step.sends == () and step.ready and group.sizes == [9]


@pytest.mark.parametrize("secure", [False, True])
def test_the_world_sends_exactly_what_the_state_machine_says(secure):
    """Messages per kind in a simulated run = what the protocol prescribes per group."""
    config = ScenarioConfig(
        seed=3,
        data=DataConfig(dataset="synthetic", synthetic_rows=400, synthetic_test_rows=100),
        partition=PartitionConfig(n_peers=20),
        groups=GroupsConfig(group_size=4),
        privacy=PrivacyConfig(
            epsilon=1.0,
            epsilon_per_aggregation=0.5,
            mechanism="coordinate-laplace",
            secure_aggregation=secure,
        ),
        publication=PublicationConfig(mode="group"),
        evaluation=EvaluationConfig(split="fixed"),
    )
    result = simulate(config, fold=0)
    g, groups = 4, result.aggregations
    assert groups == 20 * 2 // g
    per_group = g  # assignments (the sampler's control messages)
    per_group += g * (g - 1) + (g - 1) if secure else g - 1  # shares + partials, or submits
    per_group += g - 1  # publications
    assert result.messages_sent == groups * per_group
