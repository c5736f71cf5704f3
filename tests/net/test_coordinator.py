"""The coordinator (p2pdp.net.coordinator): hosts that die or stop, lost frames, and what it
charges to the budget (only releases, including one reported after its group's timeout).
"""

from __future__ import annotations

import asyncio
import csv
import os
import signal
import time

import numpy as np
import pytest

from p2pdp.core.errors import NetworkRunError
from p2pdp.experiments.cli import main as cli
from p2pdp.experiments.run.simulation import simulate
from p2pdp.net import hosts
from p2pdp.net.coordinator import NetworkWorld
from p2pdp.net.wire import (
    ProtocolError,
    pack_vector,
)
from p2pdp.protocols.groups import Group
from p2pdp.sim.world import WorldObserver
from tests.net.helpers import _config, _coordinator, _tiny_scenario


class _Dead:
    """A host process that has exited (with status ``exitcode``, None: unknown)."""

    exitcode = None

    def is_alive(self):
        return False

    def join(self, timeout=None):
        pass

    def kill(self):
        pass


def test_a_host_that_dies_at_start_fails_the_run_at_once():
    """E.g. a script without the main guard: spawn cannot start the hosts."""
    world = _coordinator(launch=lambda host, port: _Dead())
    start = time.perf_counter()
    with pytest.raises(NetworkRunError, match=r"host 0 exited; host 1 exited while.*__main__"):
        world.run()
    assert time.perf_counter() - start < 5


def test_hosts_that_said_why_they_stopped_fail_the_run_with_no_unrelated_advice():
    """A host that printed its own one-line error (exit status EXPLAINED: a tampered shard
    file, say) stops the run with a line that points at it, without the advice about hosts
    files and the main guard (it used to end every such error)."""

    class Explained(_Dead):
        exitcode = hosts.EXPLAINED

    world = _coordinator(launch=lambda host, port: Explained())
    with pytest.raises(NetworkRunError) as error:
        world.run()
    assert str(error.value) == (
        "network runtime: host 0; host 1 stopped with the error above while waiting for every "
        "host to start"
    )


def test_the_coordinator_charges_only_releases_of_groups_it_aborted():
    """A curator's late report charges the members the coordinator assigned, once, from the
    charge held back at the abort; a report of a group never aborted (made up, or reported
    twice) is refused and charges nobody; a malformed one is refused before anything counts."""
    world = _coordinator(launch=lambda host, port: None)
    record = {"group_size": 3, "n_min": 30, "sensitivity": 0.1, "mechanism": "vector-laplace",
              "epsilon": 0.25, "delta": 0.0, "noise_scale": 0.4, "noise_std": 0.5,
              "noise_norm": 0.3, "secure": False}  # fmt: skip
    done = {"kind": "done", "group": 7, "members": [0, 1, 2, 3, 4, 5], "curator": 1,
            "model": pack_vector(np.zeros(2)), "record": record}  # fmt: skip
    report = world._release_report(done, "host-0")
    with pytest.raises(ProtocolError, match="not aborted"):  # group 7 was never aborted
        world._late_release(report)
    assert world.ledger.aggregations().sum() == 0
    world._hold(Group(7, np.array([1, 4, 9]), 1))  # aborted: one charge held back
    assert world._held.tolist() == [0, 1, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0]
    world._late_release(report)  # its members as assigned, not as reported
    assert np.flatnonzero(world.ledger.aggregations()).tolist() == [1, 4, 9]
    assert world._held.sum() == 0 and world.position == {7: 0}
    with pytest.raises(ProtocolError):  # reported twice
        world._late_release(report)
    world._hold(Group(8, np.array([0, 2, 3]), 2))  # aborted, curator 2
    other = world._release_report({**done, "group": 8, "curator": 3}, "host-0")
    with pytest.raises(ProtocolError, match="not aborted"):  # 3 is a member, not its curator
        world._late_release(other)
    assert world.ledger.aggregations().sum() == 3 and world._held.sum() == 3
    with pytest.raises(ProtocolError, match="reports for curator 1"):  # from another host
        world._release_report(done, "host-1")
    with pytest.raises(ValueError, match="exactly the fields"):  # a field too many
        world._release_report({**done, "record": {**record, "extra": 1}}, "host-0")


class _Fault(WorldObserver):
    """At the ``at``-th release, send ``signal`` to host process 1 (peers 6..11)."""

    def __init__(self, at, signal):
        self.at, self.signal, self.releases = at, signal, []

    def released(self, world, group, record):
        self.releases.append(group.members.tolist())
        if len(self.releases) == self.at:
            os.kill(world.processes[1].pid, self.signal)


def _charged_only_for_releases(result, releases):
    counts = np.zeros(12, dtype=int)
    for members in releases:
        counts[members] += 1
    np.testing.assert_array_equal(result.aggregations_per_peer, counts)


@pytest.mark.parametrize("secure", [False, True])
def test_a_host_killed_mid_run_leaves_the_run_to_the_others(secure, monkeypatch):
    """kill -9 of a host process: its peers leave, the group in flight with one of them is
    aborted (secure: whatever shares were already sent), nobody is charged for it, and the
    others finish the run."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    fault = _Fault(at=2, signal=signal.SIGKILL)
    result = simulate(_config("group", secure=secure), runtime="network", observers=(fault,))
    wire = {row["kind"]: row["frames"] for row in result.wire}
    assert wire["hosts lost"] == result.row()["hosts_lost"] == 1
    assert result.row()["messages_lost"] <= wire["refused"]
    assert result.aggregations == len(fault.releases) > 2
    assert all(max(members) < 6 for members in fault.releases[2:])  # only host 0's peers
    _charged_only_for_releases(result, fault.releases)


def test_a_lost_host_and_lost_frames_are_in_the_row_and_the_reports_first_lines(
    tmp_path, monkeypatch
):
    """kill -9 of a host mid-run under full publication: the row says hosts_lost = 1 and
    messages_lost = the frames that could not be delivered (its peers' publications; among
    wire.csv's refusals); report.md says so under its title (it used to say nothing, and
    the row messages_lost = 0)."""
    build = NetworkWorld.__init__

    def faulty(world, *args, observers=(), **kwargs):
        build(world, *args, observers=(*observers, _Fault(2, signal.SIGKILL)), **kwargs)

    monkeypatch.setattr(NetworkWorld, "__init__", faulty)
    out = tmp_path / "out"
    argv = ["run", str(_tiny_scenario(tmp_path, "full")), "--out", str(out)]
    assert cli([*argv, "--runtime", "network", "--hosts", "2"]) == 0
    (row,) = csv.DictReader((out / "results.csv").open())
    wire = {r["kind"]: int(r["frames"]) for r in csv.DictReader((out / "wire.csv").open())}
    assert int(row["hosts_lost"]) == wire["hosts lost"] == 1
    assert 0 < int(row["messages_lost"]) <= wire["refused"]  # its peers' publications
    head = (out / "report.md").read_text().splitlines()[:5]
    assert any(
        line.startswith(
            f"**Faults on the network: 1 host process(es) lost and {row['messages_lost']} "
            "frames lost (undeliverable, or past their group's timer), in 1 of 1 cells**"
        )
        for line in head
    ), head


@pytest.mark.parametrize("secure", [False, True])
def test_a_stopped_host_times_its_groups_out_and_is_killed_at_the_end(secure, monkeypatch):
    """A host that stops answering (SIGSTOP: a partition, or a peer slower than the
    timeout): its groups are aborted after groups.collect_timeout, nobody is charged for
    them, and the run ends instead of hanging."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    assigned = {}  # group -> the noise index its assignment carried
    send = NetworkWorld._send

    async def recording(world, peer, message):
        assigned[message["group"]] = message["release"]
        await send(world, peer, message)

    monkeypatch.setattr(NetworkWorld, "_send", recording)
    fault = _Fault(at=1, signal=signal.SIGSTOP)
    config = _config("group", secure=secure, collect_timeout=1.0, max_failed_attempts=3)
    result = simulate(config, runtime="network", observers=(fault,))
    assert result.aborted_groups >= 1
    assert result.stop_reason == "3 aggregations in a row failed"
    assert {row["kind"]: row["frames"] for row in result.wire}["hosts lost"] == 1
    _charged_only_for_releases(result, fault.releases)
    # an aborted group's index is never handed out again (its curator may release late)
    assert all(index == group for group, index in assigned.items())


def test_a_release_reported_after_its_groups_collect_timeout_is_charged(monkeypatch):
    """The coordinator reads the DONE of group 1 only after it aborted the group (collect
    timeout): the charge it held back at the abort is spent on the members it assigned, the
    release is kept, and nobody is charged for anything else."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    on_control = NetworkWorld._on_control
    delayed = []
    fault = _Fault(at=0, signal=None)  # records the releases only

    def once_aborted(world, message, who, writer, host):
        # read it again once the coordinator gave up on the group and released the next one
        # (polled, not a fixed delay: a fast run could end before a fixed delay ran out)
        if message["group"] in world._aborted and len(fault.releases) >= 2:
            on_control(world, message, who, writer, host)
        else:
            asyncio.get_running_loop().call_later(
                0.02, once_aborted, world, message, who, writer, host
            )

    def slow(world, message, who, writer, host):
        if message["kind"] == "done" and message["group"] == 1 and not delayed:
            delayed.append(message)
            once_aborted(world, message, who, writer, host)
            return host
        return on_control(world, message, who, writer, host)

    monkeypatch.setattr(NetworkWorld, "_on_control", slow)
    config = _config("group", collect_timeout=1.0)
    result = simulate(config, runtime="network", observers=(fault,))
    assert delayed and result.aborted_groups == 1
    late = delayed[0]["members"]
    assert late in fault.releases and fault.releases.index(late) > 1  # released after group 2
    _charged_only_for_releases(result, fault.releases)
    assert {row["kind"]: row["frames"] for row in result.wire}["refused"] == 1  # "late release"


def test_a_control_frame_goes_only_to_a_host_still_connected() -> None:
    """Every control frame to a host (DIRECTORY, START, ENDED, HALT, FINISH) goes through
    ``NetworkWorld._tell``: a lost host, or one whose connection is closing (a killed
    host's TLS transport raises on write), is skipped and nothing is counted sent."""
    from types import SimpleNamespace

    from p2pdp.net.bookkeeping import WireStats

    class Writer:
        def __init__(self, closing: bool) -> None:
            self.closing, self.frames = closing, []

        def is_closing(self) -> bool:
            return self.closing

        def write(self, frame: bytes) -> None:
            if self.closing:
                raise AttributeError("'NoneType' object has no attribute '_write_appdata'")
            self.frames.append(frame)

    writers = {0: Writer(False), 1: Writer(True), 2: Writer(False)}
    world = SimpleNamespace(_hosts=writers, lost_hosts={2}, wire=WireStats())
    told = [NetworkWorld._tell(world, host, b"halt", "halt") for host in (0, 1, 2, 3)]
    assert told == [True, False, False, False]
    assert [len(writer.frames) for writer in writers.values()] == [1, 0, 0]
    assert world.wire.frames["halt"] == 1
