"""What a host's curator releases: secure aggregation between the peers of one host (frames
routed by hand), the noise index of each group, and noise drawn from the OS with the
mechanism's law where it is added (private as deployed).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy import stats

from p2pdp.net.host import PeerHost
from p2pdp.net.hosts import HostSettings
from p2pdp.net.wire import (
    unpack_vector,
)
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.release import NoiseStream, Releaser
from tests.net.helpers import ASSIGN_0, _host, _submit

SECURE_STATISTICS = np.array([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.25]])


def _secure_host(reports, *, seeded_noise=False):
    """Peers 0, 1, 2 on one host (shard sizes 5, 7, 6; public minimum 5), secure
    aggregation of the mean; returns the host and the list its messages go to."""
    releaser = Releaser(
        make_mechanism("coordinate-laplace", epsilon=1.0),
        2,
        aggregate="mean",
        secure=True,
        noise_rng=np.random.default_rng(0),
        share_rng=np.random.default_rng(1),
        member_seed=np.random.SeedSequence(7),
    )
    host = PeerHost(
        np.arange(3),
        SECURE_STATISTICS,
        np.array([5, 7, 6]),
        releaser=releaser,
        sensitivity=lambda sizes: 2.0 / min(sizes),
        settings=HostSettings(
            n_peers=3, hosts=1, full_publication=False, min_shard_size=5, seeded_noise=seeded_noise
        ),
        report=reports.append,
    )
    outbox = []
    host.send = lambda send, group, **fields: outbox.append(
        (send.receiver, {"kind": send.kind, "sender": send.sender, "group": group, **fields})
    )
    return host, outbox


def _assign(timeout=60.0):
    return {**ASSIGN_0, "timeout": timeout}


def _route(host, outbox):
    """Deliver every message sent so far (and those they cause), in order."""
    delivered = []
    while outbox:
        receiver, message = outbox.pop(0)
        delivered.append((receiver, message))
        host.handle(receiver, message)
    return delivered


def test_a_secure_round_releases_the_noisy_mean_and_only_masked_shares_travel():
    """Members 0, 1, 2 share fixed-point encodings of w_i / K + eta_i; the curator decodes
    the sum of the partial sums: the mean plus every member's own noise share (drawn from
    its seeded stream, so the simulator releases the same), to fixed-point precision. The
    shares on the wire come from the OS's CSPRNG: another run with the same seeds sends other
    shares and releases the same model."""
    runs = []
    for _ in range(2):
        reports = []
        host, outbox = _secure_host(reports, seeded_noise=True)
        for peer in range(3):
            host.handle(peer, _assign())
        runs.append((_route(host, outbox), reports, host))
    (sent_a, (done_a,), host), (sent_b, (done_b,), _) = runs
    releaser = host.releaser
    noise = sum(
        releaser.noise_share(2.0 / 5, 3, rng=releaser.member_stream(0, peer)) for peer in range(3)
    )
    model = unpack_vector(done_a["model"], shape=(2,))
    np.testing.assert_allclose(model, SECURE_STATISTICS.mean(axis=0) + noise, atol=3 * 2.0**-37)
    assert done_a["model"] == done_b["model"]
    assert done_a["record"]["secure"] and done_a["record"]["n_min"] == 5
    assert np.isnan(done_a["record"]["noise_norm"])  # the curator cannot know it
    kinds = [message["kind"] for _, message in sent_a]
    assert kinds.count("share") == 6 and kinds.count("partial") == 2
    shares_a = [m["share"]["data"] for _, m in sent_a if m["kind"] == "share"]
    shares_b = [m["share"]["data"] for _, m in sent_b if m["kind"] == "share"]
    assert not set(shares_a) & set(shares_b)
    assert "statistic" not in str([m for _, m in sent_a])  # no statistic leaves its peer


def test_secure_frames_outside_the_protocol_are_refused_and_the_round_completes():
    """A share that arrives before its receiver's assignment waits for it; a replayed share,
    a share from outside the group, a replayed partial sum and one claiming a shard below
    the public minimum are refused; the honest round still releases."""
    reports = []
    host, outbox = _secure_host(reports)
    host.handle(0, _assign())
    host.handle(1, _assign())  # peer 2 is not assigned yet
    to_1 = [message for receiver, message in outbox if receiver == 1]
    to_2 = [message for receiver, message in outbox if receiver == 2]
    assert len(to_2) == 2  # from 0 and 1
    _route(host, outbox)  # peer 2 keeps them until its assignment
    assert sum(host.counters.refused.values()) == 0
    host.handle(1, to_1[0])  # replayed: would complete peer 1's partial sum without 2's
    host.handle(2, to_2[0])  # the same share again, still before the assignment
    host.handle(1, {**to_2[0], "sender": 5})  # 5 is not in the group
    assert host.counters.refused["share"] == 3
    host.handle(2, _assign())  # it sends its shares, and its partial sum at once
    for receiver, message in [item for item in outbox if item[1]["kind"] == "share"]:
        host.handle(receiver, message)
    partials = [(r, m) for r, m in outbox if m["kind"] == "partial"]
    assert sorted(m["sender"] for _, m in partials) == [1, 2]
    (_, first), (_, second) = partials
    host.handle(0, {**second, "size": 4})  # below the public minimum
    host.handle(0, first)
    host.handle(0, first)  # replayed
    assert host.counters.refused["partial"] == 2
    assert not [r for r in reports if r["kind"] == "done"]
    host.handle(0, second)
    (done,) = reports
    assert done["kind"] == "done" and done["record"]["n_min"] == 5


def test_a_secure_curator_never_releases_past_its_timer():
    """Every partial sum arrived in time, but the curator's own completes (its last share
    arrives) after its timer ran out: it releases nothing."""
    reports = []
    host, outbox = _secure_host(reports)
    for peer in range(3):
        host.handle(peer, _assign(timeout=0.2))
    last = next(i for i, (r, m) in enumerate(outbox) if r == 0 and m["kind"] == "share")
    receiver, late_share = outbox.pop(last)
    _route(host, outbox)  # every other share, then partial sums 1 and 2, in time
    time.sleep(0.3)
    host.handle(receiver, late_share)
    assert reports == [] and host.counters.refused["expired"] == 1


def test_a_curators_noise_index_is_its_groups_so_no_two_releases_share_a_draw():
    """The assignment's noise index is the group id: after an aborted group (id 1) the next
    release (id 2) skips its draw, so a late release of group 1 could never reuse another
    release's noise; with no abort, group id = release index, as in the simulator (seeded
    noise)."""
    reports = []
    host = _host(reports, seeded_noise=True)
    releaser = host.releaser
    for group in (0, 2):
        assign = {**ASSIGN_0, "group": group, "release": group}
        host.handle(0, assign)
        host.handle(1, assign)
        host.handle(0, {**_submit(sender=2), "group": group})
        host.handle(0, {**_submit(sender=1, size=7), "group": group})
    done = [r for r in reports if isinstance(r, dict)]
    assert [r["group"] for r in done] == [0, 2]
    twin = NoiseStream(releaser.mechanism, 2, rng=np.random.default_rng(0))  # the host's
    draws = [twin.draw(1.0) for _ in range(3)]
    statistics = np.array([[0.1, 0.2], [1.0, 2.0], [1.0, 2.0]])  # the curator's, 1's, 2's
    for report, draw in zip(done, (draws[0], draws[2]), strict=True):
        sensitivity = report["record"]["sensitivity"]
        noise = unpack_vector(report["model"], shape=(2,)) - statistics.mean(axis=0)
        np.testing.assert_allclose(noise, sensitivity * draw, rtol=1e-12)


def test_a_seeded_curator_releases_each_groups_draw_whatever_the_order_of_releases():
    """Groups in flight at once end in any order: this host's curators of groups 0 (peer 1)
    and 2 (peer 0), group 2 complete first; seeded, each release has the draw of its own
    group's index (the replica seeks backward), as releases in order would."""
    reports = []
    host = _host(reports, seeded_noise=True, max_concurrent=2, n_peers=6)
    groups = {0: ([1, 4, 5], 1), 2: ([0, 2, 3], 0)}  # id: (members, curator)
    for group, (members, curator) in groups.items():  # assigned in id order
        assign = {**ASSIGN_0, "group": group, "release": group, "members": members,
                  "curator": curator}  # fmt: skip
        host.handle(curator, assign)
    for group in (2, 0):  # group 2 completes first
        members, curator = groups[group]
        for sender in members[1:]:
            host.handle(curator, {**_submit(sender=sender), "group": group,
                                  "members": members, "curator": curator})  # fmt: skip
    done = [r for r in reports if isinstance(r, dict)]
    assert [r["group"] for r in done] == [2, 0]
    twin = NoiseStream(host.releaser.mechanism, 2, rng=np.random.default_rng(0))  # the host's
    draws = [twin.draw(1.0) for _ in range(3)]
    own = {2: np.array([0.1, 0.2]), 0: np.array([0.3, 0.4])}  # the curators' statistics
    for report in done:
        group = report["group"]
        exact = (own[group] + 2 * np.array([1.0, 2.0])) / 3
        noise = unpack_vector(report["model"], shape=(2,)) - exact
        sensitivity = report["record"]["sensitivity"]
        np.testing.assert_allclose(noise, sensitivity * draws[group], rtol=1e-12)


def test_a_secure_curator_assigned_anew_drops_its_unfinished_group():
    """A curator is in one group at a time: a new assignment expires its unfinished group,
    so a partial sum arriving for it later completes nothing (a reviewer's probe: it was
    decoded with the curator's partial sum of the new group, a garbage release)."""
    reports = []
    host, outbox = _secure_host(reports)
    for peer in range(3):
        host.handle(peer, _assign())
    late = []
    while outbox:  # everything but member 1's partial sum to the curator
        receiver, message = outbox.pop(0)
        if message["kind"] == "partial" and message["sender"] == 1:
            late.append((receiver, message))
        else:
            host.handle(receiver, message)
    assert len(late) == 1 and not reports  # the curator waits for it
    for peer in range(3):
        host.handle(peer, {**_assign(), "group": 1})  # the coordinator moved on
    host.handle(*late[0])
    assert not [r for r in reports if r["group"] == 0]
    assert host.counters.refused == {"expired": 1}  # member 1's partial sum, late: lost
    host.handle(*late[0])
    assert host.counters.refused == {"expired": 1, "partial": 1}  # a second copy


def test_a_share_that_reaches_its_member_after_the_group_moved_on_is_lost_not_refused():
    """Member 2's share to member 1 of group 0 is held back until the coordinator assigned
    everyone group 1: it is late (``expired``, lost); a second copy is refused."""
    reports = []
    host, outbox = _secure_host(reports)
    for peer in range(3):
        host.handle(peer, _assign())
    (held,) = [(r, m) for r, m in outbox if r == 1 and m["sender"] == 2 and m["kind"] == "share"]
    outbox.remove(held)
    _route(host, outbox)
    assert not reports and sum(host.counters.refused.values()) == 0  # the curator waits
    for peer in range(3):
        host.handle(peer, {**_assign(), "group": 1})  # the coordinator moved on
    outbox.clear()
    host.handle(*held)
    assert host.counters.refused == {"expired": 1} and not outbox  # no partial sum sent
    host.handle(*held)
    assert host.counters.refused == {"expired": 1, "share": 1}


def test_a_curators_noise_comes_from_the_os_with_the_mechanisms_law():
    """By default a curator draws each release's noise from a generator freshly seeded from
    the OS: a twin host built from the same seeds releases other models, the noise's norm is
    not reported, and the noise of 3,000 releases, over its scale, is Laplace(1) coordinate by
    coordinate (KS test at p = 1e-9: a false alarm once in a billion runs; a wrong scale or
    no noise fails by far)."""
    releases = 3000
    models = []
    for twin in range(2):
        reports = []
        host = _host(reports, mechanism="coordinate-laplace")
        for group in range(releases if twin == 0 else 1):
            assign = {**ASSIGN_0, "group": group, "release": group}
            host.handle(0, assign)
            host.handle(1, assign)
            host.handle(0, {**_submit(sender=2), "group": group})
            host.handle(0, {**_submit(sender=1, size=7), "group": group})
        models.append([r for r in reports if isinstance(r, dict)])
    done, (twin,) = models
    assert len(done) == releases
    assert twin["model"] != done[0]["model"]  # same seeds, another draw
    assert all(math.isnan(r["record"]["noise_norm"]) for r in done)  # stays with the curator
    exact = np.array([[0.1, 0.2], [1.0, 2.0], [1.0, 2.0]]).mean(axis=0)
    unit = np.concatenate(
        [(unpack_vector(r["model"], shape=(2,)) - exact) / r["record"]["noise_scale"] for r in done]
    )
    assert stats.kstest(unit, stats.laplace.cdf).pvalue > 1e-9


def test_secure_noise_shares_come_from_the_os_with_the_promised_variance():
    """By default each secure member draws its noise share from the OS: the decoded release
    of 3,000 rounds carries noise of the variance its record declares (K / (K - 1) times the
    mechanism's: the sum of three shares of a two-way split of Laplace(b) is a difference of
    two Gamma(3/2, b), variance 3 b^2; the sample variance of 6,000 coordinates has a relative
    standard error of 2.6%, the tolerance is 20%)."""
    reports = []
    host, outbox = _secure_host(reports)
    for group in range(3000):
        for peer in range(3):
            host.handle(peer, {**_assign(), "group": group, "release": group})
        _route(host, outbox)
    assert len(reports) == 3000
    noise = np.stack(
        [unpack_vector(r["model"], shape=(2,)) - SECURE_STATISTICS.mean(axis=0) for r in reports]
    )
    (std,) = {r["record"]["noise_std"] for r in reports}
    (scale,) = {r["record"]["noise_scale"] for r in reports}
    assert std**2 == pytest.approx(3 * scale**2)
    assert np.mean(noise**2) == pytest.approx(std**2, rel=0.2)
