"""A host (p2pdp.net.host) refuses what breaks the protocol, and keeps serving.

Host objects are driven in this process, frame by frame: a frame is accepted only from the
party the protocol state says may send it, for the group it names, once; buffers are bounded.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from p2pdp.net import bookkeeping, host_process
from p2pdp.net.wire import (
    pack_vector,
)
from p2pdp.protocols.oneshot import Curator
from tests.net.helpers import ASSIGN_0, _full_publication, _host, _submit


@pytest.mark.parametrize(
    ("peer", "message", "reason"),
    [
        (0, {**ASSIGN_0, "sender": 2}, "assign"),  # not from the coordinator
        (1, {**ASSIGN_0, "members": [0, 2]}, "assign"),  # peer 1 is not a member
        (0, _submit(size=0), "submit"),
        (1, _submit(), "submit"),  # peer 1 is a member, not the curator
        (0, _submit(sender=5), "submit"),  # not a member
        (0, _submit(statistic=pack_vector(np.ones(3))), "submit"),  # wrong shape
        (0, {**ASSIGN_0, "members": [0, 2**64 - 1]}, "assign"),  # an id beyond int64
        (0, {**_submit(), "group": -1}, "submit"),  # a group behind the curator
        (0, {"kind": "gossip", "sender": 2}, "unknown"),  # counted as unknown: no new keys
        # integers are integers: not a number-like string, a bool, a float
        (0, _submit(size="6"), "submit"),
        (0, _submit(sender="2"), "submit"),
        (0, _submit(group=False), "submit"),  # False == 0, its group
        (0, _submit(size=6.0), "submit"),
        (1, {**ASSIGN_0, "members": [0, "1", 2]}, "assign"),
        (0, {**ASSIGN_0, "timeout": "60"}, "assign"),
        (1, {**ASSIGN_0, "curator": True}, "assign"),
    ],
)  # fmt: skip
def test_a_host_refuses_frames_outside_the_protocol_and_keeps_serving(peer, message, reason):
    """Peers 0 (curator) and 1 of group 0 are assigned, then one frame arrives."""
    reports = []
    host = _host(reports)
    if message["kind"] != "assign":
        host.handle(0, ASSIGN_0)
        host.handle(1, ASSIGN_0)
    host.handle(peer, message)
    assert host.counters.refused[reason] == 1
    assert not [r for r in reports if isinstance(r, dict)]  # nothing released


def test_a_submission_is_judged_by_the_curators_own_assignment():
    """A submission names its group's members, but only the coordinator's assignment to the
    curator counts: one that arrives first waits for it (then is checked against it), and
    its member list never replaces the assigned one (seen by a reviewer's probe)."""
    reports = []
    host = _host(reports)
    host.handle(0, _submit(sender=2, members=[0, 2]))  # before the assignment: kept
    assert sum(host.counters.refused.values()) == 0
    host.handle(0, ASSIGN_0)
    assert not [r for r in reports if isinstance(r, dict)]  # still waits for member 1
    host.handle(0, _submit(sender=1, size=7))
    (done,) = [r for r in reports if isinstance(r, dict)]
    assert done["members"] == [0, 1, 2] and done["record"]["group_size"] == 3


def test_made_up_groups_cannot_crowd_out_an_honest_senders_message():
    """A peer keeps, per sender, the messages of one group it was not assigned yet (an
    honest sender only moves forward): a sender that makes up groups only replaces its own,
    and an honest member's early submission still reaches the curator (a reviewer's probe:
    made-up groups 1 and 2, then the real group 3)."""
    reports = []
    host = _host(reports)
    for group in (1, 2, 10**9):
        host.handle(0, {**_submit(sender=2), "group": group})  # sender 2 makes groups up
    assert host.counters.refused["early"] == 2  # each replaced the one before
    host.handle(0, {**_submit(sender=1, size=7), "group": 3})  # honest, before the assignment
    host.handle(0, {**_submit(sender=2), "group": 3})  # from 2: behind its own made-up group
    assert host.counters.refused["submit"] == 1
    host.handle(0, {**ASSIGN_0, "group": 3})
    assert not [r for r in reports if isinstance(r, dict)]  # waits for 2, which held itself up
    assert 1 in host.groups[3][1]  # the honest submission was kept and replayed


@pytest.mark.parametrize("full", [False, True])
def test_an_honest_publication_refused_after_a_forged_copy_is_counted_in_the_stats(full):
    """Peer 1 is a member of group 0 (curator 0); a copy of group 0's publication from
    peer 0 arrives first (forged by an insider with peer 0's host's certificate), then the
    honest one, refused as a second copy. Once the FINISH says group 0 was released by
    peer 0, the final report counts one "pre-empted" (a lost message); a second copy of a
    group never released counts nothing."""
    host = _host([], full_publication=full)
    host.handle(1, ASSIGN_0)
    host.handle(1, _full_publication(0, 0))  # the forged copy
    host.handle(1, _full_publication(0, 0))  # the honest one
    assert host.counters.refused["publish"] == 1
    if full:  # a made-up group of another sender, twice: no release, no loss
        host.handle(1, _full_publication(2, 9))
        host.handle(1, _full_publication(2, 9))
    assert "pre-empted" not in host.stats(0)["refused"]  # not before the FINISH
    host.released_pairs = {(0, 0)}
    assert host.stats(0)["refused"]["pre-empted"] == 1


def test_made_up_full_publications_do_not_end_a_hosts_final_wait(caplog):
    """Under full publication a receiver cannot tell a made-up group from a real one on
    arrival, so it counts toward its final wait only the publications of the groups the
    coordinator says were released, from their curators: made-up groups, and a real group
    from another sender, leave it waiting (it used to count them all and stop early)."""
    reports = []
    host = _host(reports, full_publication=True)
    for group in (5, 6, 7):  # sender 2 "publishes" groups that were never released
        host.handle(0, _full_publication(2, group))
        host.handle(1, _full_publication(2, group))
    assert host.counters.publications_received == 6 and sum(host.counters.refused.values()) == 0
    host.count_released({(3, 2), (4, 1)})  # group 3 by peer 2, group 4 by peer 1 (on host)
    assert host.released_received == 0

    async def final_wait():
        start = time.monotonic()
        await host_process._received(host, 3, timeout=0.3)
        return time.monotonic() - start

    with caplog.at_level("WARNING"):
        assert asyncio.run(final_wait()) >= 0.3  # waited to the end: none of them counts
    assert "0 of 3 publications arrived" in caplog.text
    host.handle(0, _full_publication(2, 8))  # a real group, wrong curator: not counted
    host.handle(0, {**_full_publication(1, 4)})  # group 4 from its curator, peer 1
    assert host.released_received == 1


def test_a_sender_cannot_publish_more_groups_than_a_peer_can_curate():
    """Per sender, a host keeps at most ``releases_per_peer`` groups of full publications
    (a curator is a member: its budget bounds its releases), so made-up groups cannot grow
    its memory; more are refused and counted."""
    reports = []
    host = _host(reports, full_publication=True, releases_per_peer=2)
    for group in (1, 2, 3, 4):
        host.handle(0, _full_publication(2, group))
    host.handle(1, _full_publication(2, 2))  # a group already kept, to another peer: fine
    assert host.counters.refused["publish"] == 2
    assert set(host.arrivals) == {(1, 2), (2, 2)} and host.arrivals[(2, 2)] == 2


def test_a_replayed_submission_is_not_a_second_members():
    reports = []
    host = _host(reports)
    host.handle(0, _submit())
    host.handle(0, _submit())  # replay, before the assignment
    assert host.counters.refused["submit"] == 1
    host.handle(0, ASSIGN_0)
    host.handle(0, _submit())  # replay, after it
    assert host.counters.refused["submit"] == 2
    assert not any(r for r in reports if isinstance(r, dict))  # still waits for member 1
    host.handle(1, ASSIGN_0)
    assert ("sent", ("submit", 1, 0)) in reports  # member 1 submits to its curator
    host.handle(0, _submit(sender=1, size=7))
    (done,) = [r for r in reports if isinstance(r, dict)]
    assert done["kind"] == "done" and done["record"]["group_size"] == 3
    assert done["record"]["n_min"] == 5


def test_a_curator_never_releases_a_group_past_its_expiry():
    """The coordinator aborts a group once the curator's timer (started by its assignment)
    ran out: the curator then takes no submission, so it never releases that group. Its
    members' first submissions are late (``expired``: lost); a second copy is refused."""
    reports = []
    host = _host(reports)
    host.handle(0, _submit(sender=2))  # kept until the assignment
    host.handle(0, _submit(sender=1, size=7))
    host.handle(0, {**ASSIGN_0, "timeout": 0.0})
    assert not [r for r in reports if isinstance(r, dict)]  # nothing released, no report
    assert host.counters.refused == {"expired": 2}
    host.handle(0, _submit(sender=2))
    assert host.counters.refused == {"expired": 2, "submit": 1}


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (_submit(sender=2), "expired"),  # honest, late: lost
        (_submit(sender=1, size=7), "submit"),  # it came in time: a second copy
        (_submit(sender=5), "submit"),  # not a member
        (_submit(sender=2, size=0), "submit"),  # below the minimum
        (_submit(sender=2, group=-1), "submit"),  # a group this curator never collected
        (_submit(sender=2, statistic=pack_vector(np.ones(3))), "submit"),  # malformed
    ],
)
def test_a_submission_after_its_curators_timer_is_lost_if_honest_else_refused(message, reason):
    """Group 0's curator (peer 0) holds member 1's submission when its timer runs out
    (the first frame after it delivers it); then one frame arrives: a member's first
    submission is lost (``expired``, the row's ``messages_lost``), anything the curator
    would have refused in time still is (the row's ``messages_refused``)."""
    reports = []
    host = _host(reports, collect_timeout=0.05)
    host.handle(0, {**ASSIGN_0, "timeout": 0.05})
    host.handle(0, _submit(sender=1, size=7))
    time.sleep(0.1)
    host.handle(0, message)
    assert host.counters.refused == {reason: 1}
    host.handle(0, message)  # and again: a second copy at best
    assert host.counters.refused == ({reason: 1, "submit": 1} if reason != "submit" else
                                     {"submit": 2})  # fmt: skip
    assert not [r for r in reports if isinstance(r, dict)]  # never released
    stats = host.stats(0)["refused"]  # as the coordinator sums them into the row
    lost = sum(stats.get(r, 0) for r in bookkeeping.LOST)
    refused = sum(stats.get(r, 0) for r in bookkeeping.REFUSED)
    assert (lost, refused) == ((1, 1) if reason == "expired" else (0, 2))


def test_the_host_releases_only_what_the_curators_machine_decides(monkeypatch):
    """The host's curator, every submission in: released and reported when its machine
    (p2pdp.protocols.oneshot.Curator) says so; nothing released or reported when it does not."""
    for collect, reported in ((Curator.collect, ["done"]), (lambda *_, **__: [], [])):
        monkeypatch.setattr(Curator, "collect", collect)
        reports = []
        host = _host(reports)
        host.handle(0, ASSIGN_0)
        host.handle(0, _submit(sender=1))
        host.handle(0, _submit(sender=2))
        assert [r["kind"] for r in reports if isinstance(r, dict)] == reported


def test_a_claim_below_the_public_minimum_shard_size_is_refused():
    reports = []
    host = _host(reports, min_shard_size=6)
    host.handle(0, ASSIGN_0)
    host.handle(0, _submit(size=5))
    assert host.counters.refused["submit"] == 1
    host.handle(0, _submit(size=6))
    assert host.counters.refused["submit"] == 1  # at the minimum: accepted


def test_a_host_keeps_early_messages_of_every_group_in_flight_and_no_more():
    """A host's peers may hear from the members of every group in flight before their own
    assignments: with ``max_concurrent`` c, c * g(g-1) messages kept early per sending
    host (here 12: six peers of host 1 to each of peers 0 and 1), the next one refused."""
    host = _host([], max_concurrent=2, n_peers=12, hosts=2)  # peers 6..11 are host 1's
    for receiver in (0, 1):
        for sender in range(6, 12):
            host.handle(receiver, {**_submit(sender=sender), "group": 5})
    assert host.early_held[1] == 2 * 3 * 2 and not host.counters.refused
    host.handle(0, {**_submit(sender=6), "kind": "share", "group": 5})
    assert host.early_held[1] == 12 and sum(host.counters.refused.values()) == 1
