"""The one-shot parties as transport-free machines (p2pdp.protocols.oneshot).

Driven here by hand, event by event, with no SimPy, socket or ledger; then the drivers are
shown to carry out the machines' decisions and to decide nothing of their own (a curator's
machine told to abort makes every driver release nothing and charge nobody).
"""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.config import ScenarioConfig
from p2pdp.core.rng import Uniforms
from p2pdp.experiments.run.simulation import simulate
from p2pdp.protocols import oneshot
from p2pdp.protocols.groups import (
    PARTIAL,
    SUBMIT,
    Group,
    GroupPool,
    failed_in_a_row,
    too_few_solvent,
)
from p2pdp.protocols.oneshot import (
    COLLECT_TIMEOUT,
    CURATOR_OFFLINE,
    REASSIGNED,
    Abort,
    Charge,
    Collect,
    Curator,
    Late,
    Member,
    Publish,
    Refused,
    Release,
    Sampler,
    Start,
    Stop,
    Timer,
)
from tests.conftest import tiny_config


def _group(group_id=0, members=(4, 7, 2), curator=7, secure=False) -> Group:
    return Group(group_id, np.array(members, dtype=np.int64), curator, secure=secure)


def _collected(curator: Curator, group: Group, sizes: dict[int, int]) -> list:
    """Every member's submission reaches ``group``'s curator; the effects of the last."""
    group.contribute(group.curator, sizes[group.curator])  # its own stays where it is
    effects: list = []
    for member in group.members.tolist():
        if member != group.curator:
            effects = curator.receive(SUBMIT, group.group_id, member, sizes[member])
    return effects


SIZES = {4: 40, 7: 70, 2: 20, 9: 90}


@pytest.mark.parametrize("everyone", [False, True])
def test_a_complete_group_is_charged_then_released_then_published(everyone):
    curator = Curator(everyone=everyone)
    group = _group()
    assert curator.joined(7, group, 10.0) == [Timer(group, 10.0)]
    assert curator.collecting(7, 0) and not curator.collecting(4, 0)
    assert _collected(curator, group, SIZES) == [Collect(group)]
    effects = curator.collect(group)
    # the charge first: a broke member stops the run before any noise is drawn
    assert [type(e) for e in effects] == [Charge, Release, Publish]
    np.testing.assert_array_equal(effects[0].members, [4, 7, 2])
    assert effects[1].group is group and effects[2] == Publish(group, everyone)
    assert group.ended and not curator.collecting(7, 0)
    assert curator.timer(group) == []  # collected first: the timer changes nothing
    assert curator.collect(group) == []  # and it is collected once


def test_a_group_timed_out_or_with_its_curator_offline_is_aborted_and_nobody_charged():
    curator = Curator(everyone=False)
    late, offline = _group(0), _group(1, members=(2, 9), curator=9)
    curator.joined(7, late, 5.0)
    curator.joined(9, offline, 5.0)
    assert curator.timer(late) == [Abort(late, COLLECT_TIMEOUT)]
    assert curator.collect(late) == []  # timed out first: never released
    with pytest.raises(Late, match="after the group ended"):  # a member's, in vain
        curator.receive(SUBMIT, 0, 4, 40)
    assert late.submitted == []  # not accepted
    assert curator.collect(offline, online=False) == [Abort(offline, CURATOR_OFFLINE)]
    assert curator.timer(offline) == []


@pytest.mark.parametrize(
    ("sender", "size", "kind", "why"),
    [
        (9, 90, SUBMIT, "outside its group"),  # not a member
        (7, 70, SUBMIT, "outside its group"),  # the curator itself
        (4, 40, SUBMIT, "a second submit"),  # it came in time
        (2, 20, SUBMIT, "a second submit"),  # it came late already
        (3, 1, SUBMIT, "below the public minimum"),
        (3, 30, "share", "receives no 'share'"),
    ],
)
def test_a_contribution_after_its_group_ended_is_late_only_if_it_would_have_been_accepted(
    sender, size, kind, why
):
    """Group 0 timed out holding 4's submission; 2's comes late (Late: a lost message);
    anything the curator would have refused in time is still refused, and so is a group it
    never collected."""
    curator = Curator(everyone=False, min_shard_size=2)
    group = _group(members=(4, 7, 2, 3))
    curator.joined(7, group, 5.0)
    curator.receive(SUBMIT, 0, 4, 40)
    curator.timer(group)
    assert curator.collected(7, 0) and not curator.collected(4, 0)
    with pytest.raises(Late):
        curator.receive(SUBMIT, 0, 2, 20)
    with pytest.raises(Refused, match=why) as refused:
        curator.receive(kind, 0, sender, size)
    assert refused.type is Refused  # not Late
    with pytest.raises(Refused, match="no curator here collects"):
        curator.receive(SUBMIT, 5, 2, 20)  # never collected here


def test_a_curator_remembers_a_fixed_window_of_ended_groups(monkeypatch):
    """A contribution for a group ended longer ago than the window is refused: the memory
    of ended groups does not grow with the run."""
    monkeypatch.setattr(oneshot, "ENDED_WINDOW", 3)
    curator = Curator(everyone=False)
    for group_id in range(5):
        group = _group(group_id)
        curator.joined(7, group, 5.0)
        curator.timer(group)
    assert len(curator._ended) == 3 and [curator.collected(7, g) for g in range(5)] == [
        False, False, True, True, True
    ]  # fmt: skip
    with pytest.raises(Refused, match="no curator here collects"):
        curator.receive(SUBMIT, 1, 2, 20)
    with pytest.raises(Late):
        curator.receive(SUBMIT, 2, 2, 20)


def test_a_curator_assigned_anew_aborts_its_older_group():
    curator = Curator(everyone=False)
    older, newer = _group(0), _group(3, members=(7, 9), curator=9)
    curator.joined(7, older, None)
    assert curator.joined(7, newer, None) == [Abort(older, REASSIGNED)]  # 7 is a member now
    assert curator.joined(9, newer, None) == []
    assert not curator.collecting(7, 0) and curator.collecting(9, 3)


@pytest.mark.parametrize(
    ("sender", "size", "why"),
    [
        (9, 90, "outside its group"),  # not a member
        (7, 70, "outside its group"),  # the curator itself
        (4, 40, "a second submit"),  # replayed
        (2, 1, "below the public minimum"),
    ],
)
def test_a_curator_accepts_a_contribution_only_from_another_member_once(sender, size, why):
    curator = Curator(everyone=False, min_shard_size=2)
    group = _group()
    curator.joined(7, group, None)
    assert curator.receive(SUBMIT, 0, 4, 40) == []
    with pytest.raises(Refused, match=why):
        curator.receive(SUBMIT, 0, sender, size)
    assert group.submitted == [4]  # nothing refused counts


def test_a_secure_curator_collects_once_every_partial_sum_arrived_once():
    curator = Curator(everyone=True)
    group = _group(secure=True)
    curator.joined(7, group, None)
    group.on_partial(7, 70)  # its own
    assert curator.receive(PARTIAL, 0, 4, 40) == []
    with pytest.raises(Refused, match="a second partial"):
        curator.receive(PARTIAL, 0, 4, 40)
    assert curator.receive(PARTIAL, 0, 2, 20) == [Collect(group)]
    assert group.submitted == [4, 7, 2]  # member order (the shares' sum)


def test_a_member_accepts_an_assignment_from_the_sampler_in_group_order():
    member = Member(SIZES, everyone=False)
    group = _group(5)
    with pytest.raises(Refused, match="coordinator"):
        member.assign(4, group, sender=7)
    with pytest.raises(Refused, match="without being a member"):
        member.assign(9, group)
    member.assign(4, group)
    assert member.last_group == {4: 5} and member.expected == {4: {5: 7}}
    for replay in (group, _group(3)):  # the same group again, or an older one
        with pytest.raises(Refused, match="replayed or out of order"):
            member.assign(4, replay)
    assert member.contribute(4, group).sends == [(SUBMIT, 4, 7)]


def test_a_member_keeps_a_group_publication_only_from_its_curator_once():
    member = Member(SIZES, everyone=False)
    member.join(4, _group(5))
    with pytest.raises(Refused, match="not its curator"):
        member.publication(4, 5, 2)  # another member
    with pytest.raises(Refused, match="not its curator"):
        member.publication(4, 6, 7)  # a group it is not in
    member.publication(4, 5, 7)
    with pytest.raises(Refused, match="a second one"):
        member.publication(4, 5, 7)


def test_a_member_counts_each_members_share_once_and_never_an_older_groups():
    member = Member(SIZES, everyone=False)
    group = _group(5, secure=True)
    member.join(4, group)
    assert member.sharing(4) == 5
    assert member.share(4, group, 7).sends == ()
    with pytest.raises(Refused, match="a second share"):
        member.share(4, group, 7)
    with pytest.raises(Refused, match="not both members"):
        member.share(4, group, 9)
    assert member.share(4, group, 2).sends == [(PARTIAL, 4, 7)]  # every other member's
    with pytest.raises(Refused, match="after a later group"):
        member.share(4, _group(3, secure=True), 7)


def _sampler(peers=7, g=3, limit=2, max_failed=2, seed=0) -> Sampler:
    sampler = Sampler(
        Uniforms(np.random.default_rng(seed)),
        group_size=g,
        max_concurrent=limit,
        max_failed=max_failed,
    )
    sampler.start(list(range(peers)), 0)
    return sampler


def test_a_share_of_a_group_its_receiver_left_is_late_only_if_it_would_have_been_taken(
    monkeypatch,
):
    """Member 4 took 7's share of group 5, then joined group 8: 2's first share of group 5
    is late; a second copy, 7's (it came in time), a non-member's and a share of a group
    4 never took shares of are refused; a window of past groups is remembered."""
    monkeypatch.setattr(oneshot, "ENDED_WINDOW", 2)
    member = Member(SIZES, everyone=False)
    group, newer = _group(5, secure=True), _group(8, members=(4, 9), curator=9, secure=True)
    member.join(4, group)
    member.share(4, group, 7)
    member.join(4, newer)
    assert member.share_group(4, 5) is group and member.share_group(4, 8) is newer
    assert member.share_group(4, 3) is None
    with pytest.raises(Late):
        member.share(4, group, 2)
    for sender, why in ((2, "a second share"), (7, "a second share"), (9, "not both members")):
        with pytest.raises(Refused, match=why) as refused:
            member.share(4, group, sender)
        assert refused.type is Refused
    with pytest.raises(Refused, match="after a later group"):
        member.share(4, _group(3, secure=True), 2)
    for group_id in (10, 11):  # two more groups: group 5 falls out of the window
        member.join(4, _group(group_id, secure=True))
    assert member.share_group(4, 5) is None and member.share_group(4, 8) is newer


def test_the_sampler_starts_disjoint_groups_up_to_its_limit_and_the_pools_draws():
    sampler = _sampler()
    starts = sampler.fill()
    assert [type(s) for s in starts] == [Start, Start] and sampler.in_flight == 2
    # the draws of a pool on the same stream, in the same order
    pool = GroupPool(Uniforms(np.random.default_rng(0)))
    pool.add(list(range(7)))
    for start in starts:
        members, curator = pool.draw(3)
        np.testing.assert_array_equal(start.members, members)
        assert start.curator == curator
    assert sampler.fill() == []  # its limit: nothing until a group finishes
    first = starts[0].members
    sampler.finished(first, published=True, solvent=np.array([True, False, True]))
    assert sorted(sampler.pool.peers) == sorted([*pool.peers, first[0], first[2]])
    assert [type(s) for s in sampler.fill()] == [Start]  # 3 idle peers again


def test_the_sampler_stops_only_with_no_group_in_flight():
    sampler = _sampler(max_failed=2)
    a, b = sampler.fill()
    sampler.finished(a.members, published=False, solvent=np.ones(3, bool))
    assert [type(s) for s in sampler.fill()] == [Start]  # one abort: it goes on
    sampler.finished(b.members, published=False, solvent=np.ones(3, bool))
    assert sampler.fill() == []  # two aborts in a row, but a group is still in flight
    assert sampler.stop_reason == failed_in_a_row(2)
    sampler.finished(np.array([0, 1, 2]), published=False, solvent=np.ones(3, bool))
    assert sampler.fill() == [Stop(failed_in_a_row(2))]
    assert sampler.fill() == []  # once


def test_the_sampler_stops_when_too_few_peers_can_afford_another_aggregation():
    sampler = _sampler(peers=4, limit=1)
    (start,) = sampler.fill()
    assert sampler.fill() == []
    sampler.finished(start.members, published=True, solvent=np.zeros(3, bool))  # all broke
    assert sampler.fill() == [Stop(too_few_solvent(3))]


def _config(**privacy) -> ScenarioConfig:
    return tiny_config(
        seed=3,
        data={"synthetic_rows": 400, "synthetic_test_rows": 100},
        groups={"group_size": 4, "max_failed_attempts": 3},
        privacy={
            "epsilon": 1.0,
            "epsilon_per_aggregation": 0.5,
            "mechanism": "coordinate-laplace",
            **privacy,
        },
        publication={"mode": "group"},
        evaluation={"split": "fixed"},
    )


@pytest.mark.parametrize("secure", [False, True])
def test_the_world_releases_and_charges_only_what_the_curators_machine_decides(monkeypatch, secure):
    """A curator's machine that aborts every complete group: the SimPy world then releases
    nothing, charges nobody, and stops after max_failed_attempts aborts in a row (the
    sampler's machine), with the machine's reason."""
    config = _config(secure_aggregation=secure)
    assert simulate(config, fold=0, driver="reference").aggregations == 10  # as the machine says

    def abort(self, group, *, online=True):
        return [self._end(group, "told to")]

    monkeypatch.setattr(Curator, "collect", abort)
    result = simulate(config, fold=0, driver="reference")
    assert result.aggregations == 0 and result.aborted_groups == 3
    assert result.stop_reason == failed_in_a_row(3)
    assert not result.aggregations_per_peer.any()
