"""Gossip group formation on the network runtime (p2pdp.net.gossip_host, the coordinator's
gossip observer): what a host accepts, the real commit-reveal, and a run end to end."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import msgpack
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from p2pdp.config import NetworkConfig, ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.experiments.network.processes import RunHosts
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.settings import EvaluationConfig
from p2pdp.net.commitments import commitment, elect
from p2pdp.net.gossip_host import (
    FORMATION,
    FORMED,
    GossipSetup,
    HostFormation,
    _Record,
)
from p2pdp.net.gossip_views import ASKED
from p2pdp.net.host import PeerHost
from p2pdp.net.hosts import HostSettings
from p2pdp.net.tls import Authority, Credential, host_name, new_key, signing_request
from p2pdp.net.wire import ProtocolError
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.release import Releaser
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.gossip import Attempt
from p2pdp.protocols.oneshot import Late
from p2pdp.protocols.settings import GossipConfig, GroupsConfig, PublicationConfig
from p2pdp.sim.gossip.views import merge_views

N_PEERS, GROUP = 6, 3
HOST_OF = np.array([0, 0, 0, 1, 1, 1])
PARAMS = GossipConfig(
    view_size=5, gossip_period=0.1, backoff=0.05, invite_timeout=0.2, lock_timeout=0.5
)


def _wire(message):
    """``message`` as its receiver reads it (msgpack both ways: tuples become lists)."""
    return msgpack.unpackb(msgpack.packb(message, use_bin_type=True), raw=False)


class _Pair:
    """Two hosts' formations (peers 0-2 on host 0, 3-5 on host 1), frames delivered in
    process after a short delay, every delivered frame and every report kept."""

    def __init__(self, seed=0, delay=None):
        self.delay = delay or (lambda frame: 0.002)  # seconds a frame takes to arrive
        self.keys = [Ed25519PrivateKey.generate() for _ in range(2)]
        self.frames, self.reports, self.refused = [], [], []
        everyone = np.array([[q for q in range(N_PEERS) if q != p] for p in range(N_PEERS)])
        self.hosts = []
        for host in range(2):
            peers = [p for p in range(N_PEERS) if HOST_OF[p] == host]
            setup = GossipSetup(
                params=PARAMS,
                group_size=GROUP,
                max_failed=3,
                collect_timeout=1.0,
                ids=everyone[peers],
                stamps=-np.random.default_rng(host).random((3, N_PEERS - 1)),
                merge=merge_views,
                rng=np.random.default_rng(seed + host),
            )
            self.hosts.append(
                HostFormation(
                    peers,
                    setup,
                    host=host,
                    host_of=HOST_OF,
                    send=self._send,
                    report=self.reports.append,
                    key=self.keys[host],
                )
            )

    def _send(self, kind, sender, receiver, message):
        frame = _wire(message)
        asyncio.get_running_loop().call_later(self.delay(frame), self.deliver, receiver, frame)

    def deliver(self, receiver, frame):
        self.frames.append((receiver, frame))
        try:
            self.hosts[HOST_OF[receiver]].handle(receiver, frame)
        except ProtocolError as error:
            self.refused.append(str(error))

    async def until_formed(self, seconds=5.0):
        public = [key.public_key() for key in self.keys]
        for formation in self.hosts:
            formation.start(public)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        # at least one gossip period: every peer's view exchange is due once
        await asyncio.sleep(min(seconds, 1.5 * PARAMS.gossip_period))
        while not any(r["kind"] == FORMED for r in self.reports) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for formation in self.hosts:
            formation.halt()
            await formation.close()
        return [_wire(r) for r in self.reports if r["kind"] == FORMED]


@pytest.fixture(scope="module")
def formed():
    """A pair of hosts that formed at least one group, its first ``formed`` report."""
    pair = _Pair()
    reports = asyncio.run(pair.until_formed())
    assert reports, "no group formed in 5 s"
    return pair, reports[0]


def _public(pair):
    return [key.public_key() for key in pair.keys]


def test_a_group_formed_across_two_hosts_is_elected_by_its_revealed_nonces(formed):
    pair, report = formed
    assert pair.refused == []  # every honest frame accepted
    members, curator = elect(_public(pair), HOST_OF, N_PEERS, GROUP, report)
    assert members[0] == report["initiator"] and len(set(members.tolist())) == GROUP
    assert curator == members[sum(report["nonces"]) % GROUP]
    # views and formation frames both crossed between the hosts
    kinds = {frame["kind"] for _, frame in pair.frames}
    assert {"view", "view-reply", FORMATION} <= kinds
    steps = {f["step"] for _, f in pair.frames if f["kind"] == FORMATION}
    assert {"invite", "accept", "group", "reveal", "start", "ack"} <= steps


def test_an_initiator_cannot_choose_the_curator_or_forge_a_commitment(formed):
    pair, report = formed
    keys = _public(pair)
    # another nonce for one member (to steer the sum): it does not open the commitment
    forged = {**report, "nonces": [report["nonces"][0] + 1, *report["nonces"][1:]]}
    with pytest.raises(ProtocolError, match="does not open its commitment"):
        elect(keys, HOST_OF, N_PEERS, GROUP, forged)
    # a commitment of the initiator's making for a member of the other host
    member = next(m for m in report["members"] if HOST_OF[m] != HOST_OF[report["initiator"]])
    at = report["members"].index(member)
    signatures = list(report["signatures"])
    signatures[at] = report["signatures"][0]  # the initiator host's signature, not its own
    with pytest.raises(ProtocolError, match=f"member {member}'s commitment is not signed"):
        elect(keys, HOST_OF, N_PEERS, GROUP, {**report, "signatures": signatures})


def test_a_member_invited_again_after_its_lock_ran_out_reveals_the_nonce_it_committed_to():
    """The race behind "does not open its commitment" under load: a member accepted, its
    acceptance was slow (a loaded machine), its lock ran out, and the initiator's re-sent
    invitation made it accept again: the machine drew it a new nonce, but it accepts with
    the commitment it made (once per attempt), so its reveal did not open its commitment and
    the initiator refused an honest member. The machine keeps the nonce a member drew first
    for an attempt (tests/protocols/test_gossip_nonces.py); the host commits to it."""
    formation = _Pair(seed=9).hosts[1]
    sent = []
    formation._send = lambda kind, sender, receiver, message: sent.append(_wire(message))
    formation.machine.become_free(3)

    def invite(copy):
        formation.handle(3, {"kind": FORMATION, "step": "invite", "sender": 0, "receiver": 3,
                             "initiator": 0, "attempt": 0, "copy": copy})  # fmt: skip
        return sent[-1]

    first = invite(1)
    formation.machine.lock_until[3] = 0.0  # its lock ran out before the initiator heard it
    formation.machine.expire_locks()
    drawn = formation.machine._uniform
    formation.machine._uniform = lambda: (drawn() + 0.5) % 1.0  # surely another nonce
    again = invite(2)
    assert first["step"] == again["step"] == "accept"
    assert again["commitment"] == first["commitment"]  # one commitment per attempt
    record = formation.invites[(0, 0)]
    nonce = record.attempt.nonces[3]  # what its reveal sends (the machine's REVEAL payload)
    assert commitment(0, 0, 3, nonce, record.salts[3]) == first["commitment"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_acceptances_slower_than_a_lock_never_make_an_honest_reveal_refused(seed):
    """End to end, the same race: every acceptance takes 0.65-0.75 s (longer than the
    0.5-s lock: re-invitations to the same attempt happen), all parties honest, so no
    reveal may fail to open its commitment (when the machine drew a re-invited member a new
    nonce, one did within 8 s for 6 seeds in 6 in one run and 2 in 3 in another, load 10-12)."""
    rng = np.random.default_rng(seed)

    def delay(frame):
        return 0.65 + 0.1 * rng.random() if frame.get("step") == "accept" else 0.002

    pair = _Pair(seed=seed, delay=delay)
    asyncio.run(pair.until_formed(seconds=8.0))
    assert not [r for r in pair.refused if "does not open its commitment" in r]


def test_a_second_copy_an_unknown_attempt_and_a_stranger_are_refused():
    pair = _Pair(seed=5)
    reports = asyncio.run(pair.until_formed())
    assert reports and pair.refused == []
    attempt = (reports[0]["initiator"], reports[0]["attempt"])
    frames = [
        (receiver, frame)
        for receiver, frame in pair.frames
        if frame["kind"] == FORMATION and (frame["initiator"], frame["attempt"]) == attempt
    ]
    by_step = {frame["step"]: (receiver, frame) for receiver, frame in frames}
    for step in ("invite", "accept", "group", "reveal", "start", "ack"):
        receiver, frame = by_step[step]
        pair.deliver(receiver, frame)  # the same copy again
        assert pair.refused[-1].startswith(f"a second copy of {step}")
        if step != "invite":  # an invitation opens an attempt; nothing else does
            pair.deliver(receiver, {**frame, "attempt": frame["attempt"] + 2})
            assert "unknown attempt" in pair.refused[-1]
    # a group message that does not come from the attempt's initiator
    receiver, group = by_step["group"]
    pair.deliver(receiver, {**group, "sender": (group["sender"] + 1) % N_PEERS, "copy": 9})
    assert "not the attempt's initiator" in pair.refused[-1]
    # a group whose commitment of the receiver was swapped for another's
    commitments = list(group["commitments"])
    commitments.reverse()
    pair.deliver(receiver, {**group, "commitments": commitments, "copy": 9})
    assert "not signed by its host" in pair.refused[-1]


def test_an_unknown_attempt_is_refused_for_every_step():
    pair = _Pair(seed=7)
    asyncio.run(pair.until_formed(seconds=0.0))  # started and halted: nothing formed
    for step in ("accept", "decline", "reveal", "ack", "group", "start", "release"):
        sender, receiver = (4, 0) if step in ("accept", "decline", "reveal", "ack") else (0, 4)
        frame = {"kind": FORMATION, "step": step, "sender": sender, "receiver": receiver,
                 "initiator": 0, "attempt": 123, "copy": 1}  # fmt: skip
        pair.deliver(receiver, frame)
        assert "unknown attempt (0, 123)" in pair.refused[-1], step
    # an answer from a peer the initiator never invited (attempt 0 of peer 0 invited 3)
    record = _Record(Attempt(0, 0), invited={3})
    pair.hosts[0].attempts[0] = record
    accept = {"kind": FORMATION, "step": "accept", "sender": 4, "receiver": 0,
              "initiator": 0, "attempt": 0, "copy": 1}  # fmt: skip
    pair.deliver(0, accept)
    assert pair.refused[-1] == "a accept from 4, not invited to this attempt"
    pair.deliver(3, {"kind": "view-reply", "sender": 0, "receiver": 3, "seq": 1,
                     "view": [], "stamp": None})  # fmt: skip
    assert pair.refused[-1] == "a view reply from 0, which was not asked"


def _credential(authority, host):
    key = new_key()
    certificate = authority.enroll(
        host, authority.token(host), signing_request(host_name(host), key)
    )
    return Credential(name=host_name(host), certificate=certificate, key=key,
                      authority=authority.certificate)  # fmt: skip


def test_a_formation_frame_from_the_wrong_host_is_refused_and_counted():
    """Wiring: the peer's socket checks the sender's host (its certificate name) before the
    formation sees the frame; the refusal is counted under the frame's kind."""
    authority = Authority(2)
    credentials = [_credential(authority, host) for host in range(2)]
    settings = HostSettings(n_peers=N_PEERS, hosts=2, full_publication=False, group_size=GROUP)
    releaser = Releaser(
        make_mechanism("vector-laplace", epsilon=1.0),
        2,
        aggregate="mean",
        secure=False,
        noise_rng=np.random.default_rng(0),
        share_rng=np.random.default_rng(1),
    )
    host = PeerHost(
        np.array([3, 4, 5]),
        np.zeros((3, 2)),
        np.full(3, 10),
        releaser=releaser,
        sensitivity=lambda sizes: 1.0,
        settings=settings,
        report=lambda message: None,
        credential=credentials[1],
    )
    pair = _Pair()
    host.formation = pair.hosts[1]
    invite = {"kind": FORMATION, "step": "invite", "sender": 0, "receiver": 3,
              "initiator": 0, "attempt": 0, "copy": 1}  # fmt: skip
    host.handle(3, invite, who=host_name(1))  # peer 0 runs on host 0, not 1
    assert host.counters.refused[FORMATION] == 1
    assert not pair.hosts[1].invites  # the formation never saw it
    host.handle(3, {**invite, "receiver": 4}, who=host_name(0))  # for another peer's socket
    assert host.counters.refused[FORMATION] == 2


def _gossip(n_peers=12, **network):
    return ScenarioConfig(
        seed=11,
        data=DataConfig(dataset="synthetic", synthetic_rows=360, synthetic_test_rows=120),
        partition=PartitionConfig(n_peers=n_peers),
        groups=GroupsConfig(group_size=3, sampler="gossip"),
        gossip=GossipConfig(
            degree=4,
            view_size=6,
            gossip_period=0.5,
            backoff=0.5,
            invite_timeout=0.3,
            lock_timeout=1.0,
        ),
        privacy=PrivacyConfig(epsilon=1.0, epsilon_per_aggregation=0.25),
        publication=PublicationConfig(mode="group"),
        evaluation=EvaluationConfig(split="fixed"),
        network=NetworkConfig(**network),
    )


def test_a_gossip_run_on_the_network_forms_what_the_simulator_forms(monkeypatch):
    """12 peers on 3 hosts: every group the gossip forms is aggregated; the run spends the
    budgets as the simulator's does and stops for the same reason, nothing refused."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "3")
    config = _gossip()
    simulated, network = simulate(config).row(), simulate(config, runtime="network").row()
    assert network["stop_reason"] == simulated["stop_reason"]
    assert network["aggregations"] >= simulated["aggregations"] - 2
    assert network["aborted_groups"] == 0 and network["messages_refused"] == 0
    assert network["hosts_lost"] == 0
    assert math.isfinite(network["mean_error"])
    assert abs(network["mean_error"] - simulated["mean_error"]) < 0.1


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("gossip", "formation", "rounds"),
        ("gossip", "churn", True),
        ("gossip", "member_crash_probability", 0.1),
        ("gossip", "curator_crash_probability", 0.1),
    ],
)
def test_gossip_settings_the_network_does_not_run_are_refused_by_name(section, key, value):
    config = _gossip()
    config = dataclasses.replace(
        config, **{section: dataclasses.replace(getattr(config, section), **{key: value})}
    )
    with pytest.raises(ConfigError, match=f"gossip.{key} = .* not supported"):
        simulate(config, runtime="network")


def test_an_overlay_too_dense_for_the_peers_is_refused_before_any_host_starts(monkeypatch):
    """The hosts build the overlay themselves: a degree too large for P used to surface as
    every host's traceback and a line blaming the hosts' command; it is the simulator's one
    line, before anything starts."""

    def no_hosts(*args, **kwargs):
        raise AssertionError("a host was started")

    monkeypatch.setattr(RunHosts, "launch", no_hosts)
    config = dataclasses.replace(_gossip(n_peers=8), gossip=GossipConfig(degree=10))
    with pytest.raises(ConfigError, match=r"gossip.degree must be < partition.n_peers \(8\)"):
        simulate(config, runtime="network")


class _KillHost:
    """Observer killing host ``host`` (kill -9) when the ``after``-th group starts."""

    def __init__(self, host, after):
        self.host, self.after, self.started = host, after, 0

    def group_started(self, world, group):
        self.started += 1
        if self.started == self.after:
            world.processes[self.host].kill()

    def released(self, world, group, record):
        pass

    def aborted(self, world, group, reason):
        pass


@pytest.mark.slow
def test_a_host_killed_mid_formation_does_not_hang_the_run(monkeypatch):
    """kill -9 of one of 3 hosts while groups form: its peers' locks and invitations expire
    on the other hosts, the run ends (no hang) and counts the host lost."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "3")
    killer = _KillHost(host=2, after=2)
    row = simulate(_gossip(), runtime="network", observers=(killer,)).row()
    assert killer.started >= 2 and row["hosts_lost"] == 1
    assert row["aggregations"] >= 1 and math.isfinite(row["mean_error"])
    assert row["stop_reason"]


def test_a_view_reply_slower_than_the_next_requests_is_lost_not_refused_and_taken_once():
    pair = _Pair(seed=3)
    formation = pair.hosts[0]
    sent = []
    formation._send = lambda kind, sender, receiver, message: sent.append(_wire(message))
    for _ in range(ASKED + 1):  # one request per gossip period, none answered yet
        formation._ask_view(0)
    first, last = sent[0], sent[-1]
    reply = {"kind": "view-reply", "sender": first["receiver"], "receiver": 0,
             "seq": first["seq"], "view": [], "stamp": 1.0}  # fmt: skip
    with pytest.raises(Late):
        formation.handle(0, reply)
    with pytest.raises(ProtocolError, match="not asked"):  # a second copy
        formation.handle(0, reply)
    before = formation.view(0).tolist()
    formation.handle(0, {**reply, "sender": last["receiver"], "seq": last["seq"],
                         "view": [[5, 2.0]]})  # fmt: skip
    # merged, freshest first: 5 (stamp 2.0), then the partner's own descriptor (1.0)
    assert formation.view(0).tolist()[:2] == [5, last["receiver"]] and len(before) == 5


def test_a_hosts_formation_stream_is_fresh_by_default_and_the_seeds_when_seeded():
    """Default mode: each host's formation draws (backoffs, nonces, partners) from the OS
    CSPRNG, so two runs with one seed differ; seeded: per host, from the seed. The first
    views are the simulator's bootstrap either way (public)."""
    from p2pdp.experiments.network.host import _gossip_setup
    from p2pdp.tasks import make_task, release_path

    def setups(config):
        made = []
        for _ in range(2):  # two hosts' processes: each its own copy of the run's streams
            _, releaser, rngs = release_path(config, make_task(config), 3, fold=0, repetition=0)
            made.append(_gossip_setup(config, np.arange(4), releaser, rngs["protocol"], 1, 0, 0))
        return made

    draws = {}
    for seeded in (False, True):
        first, second = setups(_gossip(seeded_noise=seeded))
        assert np.array_equal(first.ids, second.ids) and first.ids.shape == (4, 6)
        draws[seeded] = [setup.rng.integers(2**62) for setup in (first, second)]
    assert draws[False][0] != draws[False][1] and draws[True][0] == draws[True][1]


def test_attempts_beyond_the_cap_forget_only_those_no_own_peer_is_tied_to():
    """A re-sent invitation or a group message for an attempt an own peer is locked to
    finds its record (its nonce) even after many other invitations came."""
    formation = _Pair(seed=9).hosts[1]
    sent = []
    formation._send = lambda kind, sender, receiver, message: sent.append(_wire(message))
    formation._cap = 3
    for peer in (3, 4, 5):
        formation.machine.become_free(peer)

    def invite(initiator, attempt, receiver):
        formation.handle(receiver, {"kind": FORMATION, "step": "invite", "sender": initiator,
                                    "receiver": receiver, "initiator": initiator,
                                    "attempt": attempt, "copy": 1})  # fmt: skip
        return sent[-1]["step"]

    assert invite(0, 0, 3) == "accept" and invite(1, 3, 4) == "accept"
    assert invite(2, 6, 4) == "decline"  # 4 is locked to (1, 3)
    assert invite(0, 9, 5) == "accept"  # over the cap: (2, 6) is forgotten, not (0, 0)
    assert set(formation.invites) == {(0, 0), (1, 3), (0, 9)}
    with pytest.raises(ProtocolError, match="still under way"):  # every one in use
        invite(1, 12, 3)
    assert set(formation.invites) == {(0, 0), (1, 3), (0, 9)}


def test_the_coordinator_stops_as_the_simulators_observer_only_once_every_host_caught_up():
    """Stopped initiating: every live host says nobody initiates and nothing is under way,
    AND has carried out every ``ended`` frame sent to it (one in transit may make its peers
    try again); a lost host does not count; too few solvent peers and aborts in a row first."""
    from p2pdp.net.coordinator import NetworkWorld
    from p2pdp.privacy.accounting import BudgetLedger
    from p2pdp.protocols.groups import failed_in_a_row, stopped_initiating, too_few_solvent

    config = _gossip(n_peers=6)
    world = NetworkWorld(
        config,
        n_peers=6,
        dim=2,
        ledger=BudgetLedger(6, epsilon_total=1.0, epsilon_per_aggregation=0.25),
        rngs={"protocol": np.random.default_rng(0)},
        launch=None,
        hosts=2,
        settings=HostSettings(n_peers=6, hosts=2, full_publication=False),
        authority=Authority(2),
    )
    stop = world._gossip_stop
    assert stop(0, 0) == ""  # no host said anything yet
    world._status = {0: (0, 0, 0), 1: (1, 0, 0)}
    assert stop(0, 0) == ""  # host 1 still has a peer initiating
    world._status[1] = (0, 0, 0)
    assert stop(0, 1) == ""  # a group in flight
    world._ended_sent[1] = 1
    assert stop(0, 0) == ""  # host 1 has not carried out its group's end yet
    world._status[1] = (0, 0, 1)
    assert stop(0, 0) == stopped_initiating(config.groups.max_failed_attempts)
    world._status[0] = (2, 1, 0)
    world.lost_hosts.add(0)  # its peers leave: 3 solvent peers remain, g = 3
    assert stop(0, 0) == stopped_initiating(config.groups.max_failed_attempts)
    max_failed = config.groups.max_failed_attempts
    assert stop(max_failed, 0) == failed_in_a_row(max_failed)
    for _ in range(4):  # peer 3 spends its budget (4 aggregations of 0.25)
        world.ledger.spend(np.array([3]))
    assert stop(0, 0) == too_few_solvent(3)
