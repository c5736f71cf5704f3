"""Whole network runs under hostile load: an insider with a valid certificate forging frames,
and floods of silent or idle connections, leave the run's rows, memory and log alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization

from p2pdp.experiments.run.simulation import simulate
from p2pdp.net.coordinator import NetworkWorld
from p2pdp.net.tls import (
    Credential,
    host_name,
    new_key,
)
from p2pdp.net.wire import (
    encode,
    pack_vector,
)
from tests.net.helpers import _config, _same_rows, _seeded


def _insider(authority, host):
    """A second certificate of this run for ``host`` (an insider's, signed by the run's CA
    directly: the host's own token is spent)."""
    key = new_key()
    return Credential(
        name=host_name(host),
        certificate=authority.sign(host_name(host), key.public_key()),
        key=key,
        authority=authority.certificate,
    )


def test_forged_releases_publications_records_and_hellos_are_refused_and_the_run_goes_on(
    monkeypatch, caplog
):
    """While group 2 is in flight (its curator on host 0), TLS clients holding this run's
    certificates of host 1 and host 0 send: host 1's release of group 2 naming its own peer
    as curator with a huge model; host 0's release of group 2 whose record has noise_norm =
    "x"; host 1's hello for host 0's peers; host 1's publications to a member of group 1 (a
    peer of host 1 as its sender, and the receipt index 2^63 - 1). Each is refused and
    counted, and the run ends with the simulator's rows (seeded noise)."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    send = NetworkWorld._send
    groups, attacked = [], []

    async def frames(world, party, port, name, messages):
        context = _insider(world.authority, int(party.removeprefix("host-"))).context(server=False)
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname=name
        )
        writer.write(b"".join(encode(message) for message in messages))
        await writer.drain()
        return writer

    async def attack(world, group):
        """group: in flight, its assignments not sent yet; groups[-2]: released."""
        before = sum(world.wire.refused.values())
        record = {"group_size": 3, "n_min": 30, "sensitivity": 0.1, "mechanism": "x",
                  "epsilon": 0.25, "delta": 0.0, "noise_scale": 0.4, "noise_std": 0.5,
                  "noise_norm": 0.3, "secure": False}  # fmt: skip
        forged = {"kind": "done", "group": group.group_id, "members": [6, 7, 8], "curator": 6,
                  "model": pack_vector(np.full(world.dim, 1e6)),
                  "record": record}  # fmt: skip
        crashing = {**forged, "curator": group.curator, "members": group.members.tolist(),
                    "record": {**record, "noise_norm": "x"}}  # fmt: skip
        foreign = {"kind": "hello", "host": 1, "address": "127.0.0.1", "ports": [[0, 9]]}
        writers = [
            await frames(world, "host-1", world.port, "coordinator", [forged, foreign]),
            await frames(world, "host-0", world.port, "coordinator", [crashing]),
        ]
        last = groups[-2]
        member = next(m for m in last.members.tolist() if m != last.curator and m < 6)
        zeros = pack_vector(np.zeros(world.dim))
        publication = {"kind": "publish", "sender": 6, "group": last.group_id,
                       "index": last.group_id, "model": zeros}  # fmt: skip
        writers.append(
            await frames(
                world,
                "host-1",
                world.ports[member],
                "host-0",
                [publication, {**publication, "group": 0, "index": 2**63 - 1}],
            )
        )
        for _ in range(200):  # until the coordinator has read and refused its three
            if sum(world.wire.refused.values()) >= before + 3:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # the host reads its two
        for writer in writers:
            writer.close()
        attacked.append(dict(world.wire.refused))

    async def sending(world, peer, message):
        if message["kind"] == "assign" and message["group"] not in [g.group_id for g in groups]:
            group = world._in_flight[message["group"]]
            groups.append(group)
            last = groups[-2] if len(groups) > 1 else None
            ready = (
                not attacked
                and group.curator < 6
                and last is not None
                and any(m != last.curator and m < 6 for m in last.members.tolist())
            )
            if ready:
                await attack(world, group)
        await send(world, peer, message)

    monkeypatch.setattr(NetworkWorld, "_send", sending)
    config = _config("group")
    network = simulate(_seeded(config), runtime="network")
    assert attacked == [{"done": 2, "hello": 1}]
    log = caplog.text
    assert "by 6, not its curator" in log
    assert "record noise_norm must be a number >= 0, got 'x'" in log
    assert "says where peers [0]" in log
    _same_rows(simulate(config), network, refused=5)  # and the host's two publications
    (refused,) = [row["frames"] for row in network.wire if row["kind"] == "refused"]
    assert refused == 5


def test_forged_full_publications_pre_empt_no_other_group_and_are_counted(monkeypatch):
    """Full publication: once a group curated by a peer of host 1 is in flight, an insider
    with host 1's certificate sends every peer of host 0 a "publication" of group 10^6 from
    each of host 1's peers (none of them its curator: a receiver cannot know, so it is taken,
    but each (group, sender) only once: it pre-empts none of those peers' real groups; it
    used to make every later one a refused "replay"), and one of the group in flight from its
    curator (its id: the honest copy that follows is refused, at each of the 6 peers). The
    row counts the 6 refused and the 6 honest messages not delivered; all else is the
    simulator's (the forged publications count toward no final wait: the FINISH names each
    released group's curator)."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    send = NetworkWorld._send
    sent = []

    async def forge(world, group):
        context = _insider(world.authority, 1).context(server=False)
        zeros = pack_vector(np.zeros(world.dim))
        messages = [
            {"kind": "publish", "sender": sender, "group": 10**6, "index": 10**6, "model": zeros}
            for sender in range(6, 12)
        ]
        messages.append({"kind": "publish", "sender": group.curator, "group": group.group_id,
                         "index": group.group_id, "model": zeros})  # fmt: skip
        for peer in range(6):
            _, writer = await asyncio.open_connection(
                "127.0.0.1", world.ports[peer], ssl=context, server_hostname="host-0"
            )
            writer.write(b"".join(encode(message) for message in messages))
            await writer.drain()
            sent.append(writer)
        await asyncio.sleep(0.5)  # read before the honest publication

    async def sending(world, peer, message):
        group = world._in_flight.get(message["group"])
        if message["kind"] == "assign" and not sent and group.group_id and group.curator >= 6:
            await forge(world, group)
        await send(world, peer, message)

    monkeypatch.setattr(NetworkWorld, "_send", sending)
    config = _config("full")
    network = simulate(_seeded(config), runtime="network")
    for writer in sent:
        writer.close()
    assert len(sent) == 6
    _same_rows(simulate(config), network, refused=6, lost=6)


def _vm_peak_mb(pid):
    """The peak resident memory of process ``pid`` (MB), from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def _silent_connections_during_a_run(monkeypatch, n_connections, hosts="2"):
    """From group 2 on, ``n_connections`` silent TCP clients at host 0's peers (spread over
    its sockets, kept open to the end): the hosts' peak RSS grows by less than 50 MB (each
    pending handshake holds ~300 KB: without the cap, 300 of them take 90 MB) and the run
    gives the simulator's rows (seeded noise). ``hosts``: P2PDP_NETWORK_HOSTS (2 hosts)."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", hosts)
    send = NetworkWorld._send
    opened, peaks, limits = [], [], []

    async def sending(world, peer, message):
        if message["kind"] == "assign" and message["group"] == 2 and not opened:
            peaks.append([_vm_peak_mb(p.pid) for p in world.processes])
            limits.extend(_descriptor_limit(p.pid) for p in world.processes)
            for i in range(n_connections):
                connection = await asyncio.open_connection("127.0.0.1", world.ports[i % 6])
                opened.append(connection)
        await send(world, peer, message)

    monkeypatch.setattr(NetworkWorld, "_send", sending)
    finish = NetworkWorld._finish

    async def finishing(world):
        peaks.append([_vm_peak_mb(p.pid) for p in world.processes])
        for _, writer in opened:
            writer.close()
        await finish(world)

    monkeypatch.setattr(NetworkWorld, "_finish", finishing)
    config = _config("group")
    network = simulate(_seeded(config), runtime="network")
    assert len(opened) == n_connections
    before, after = peaks
    assert max(b - a for a, b in zip(before, after, strict=True)) < 50
    _same_rows(simulate(config), network)
    (refused,) = [row["frames"] for row in network.wire if row["kind"] == "refused"]
    # each evicted, or closed at the handshake deadline; uncounted: those its client closed
    # still in the queue of a socket (at most 3 + 8 there, and as many in their handshake)
    assert refused >= n_connections - 6 * 2 * 11
    return limits


def _descriptor_limit(pid):
    """The soft limit on open files of process ``pid`` (``ulimit -n``), from /proc."""
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError(f"no open-files limit for {pid}")


def test_silent_connections_during_a_run_leave_its_memory_and_rows_alone(monkeypatch):
    _silent_connections_during_a_run(monkeypatch, 300)


@pytest.mark.slow
def test_three_thousand_silent_connections_during_a_run(monkeypatch):
    _silent_connections_during_a_run(monkeypatch, 3000)


#: A host command whose process may hold at most 1,024 file descriptors (``ulimit -n 1024``).
FEW_DESCRIPTORS = (
    "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)); "
    "from p2pdp.experiments.network.host import host_from_stdin; host_from_stdin()"
)


def test_more_silent_connections_than_a_hosts_descriptors_during_a_run(monkeypatch, tmp_path):
    """1,100 silent connections at a host limited to 1,024 descriptors: they are evicted
    before they exhaust them, so accept keeps working, the host's own connections are made,
    and the run gives the simulator's rows (before the cap: accept failed in a loop and
    groups aborted)."""
    command = json.dumps([sys.executable, "-c", FEW_DESCRIPTORS])
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\n'
        + f'[[host]]\naddress = "127.0.0.1"\ncommand = {command}\n' * 2
    )
    assert _silent_connections_during_a_run(monkeypatch, 1100, str(hosts)) == [1024, 1024]


def _rss_mb(pid):
    """The resident memory of process ``pid`` now (MB), from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _descriptors(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


#: An insider in a process of its own: reads a JSON plan on stdin (its PEM certificate, key
#: and the run's CA; ``targets``: [port, server name, connections]; ``huge``: [port, name]),
#: opens every connection (idle: it sends nothing), sends a 4 GiB length prefix on each
#: ``huge`` one, prints how many of those the listener closed, and waits for stdin to end.
INSIDER = r"""
import asyncio, json, ssl, struct, sys, tempfile, os
plan = json.loads(sys.stdin.readline())
directory = tempfile.mkdtemp()
for name in ("cert", "key", "ca"):
    with open(os.path.join(directory, name), "w") as f:
        f.write(plan[name])
context = ssl.create_default_context(cafile=os.path.join(directory, "ca"))
context.load_cert_chain(os.path.join(directory, "cert"), os.path.join(directory, "key"))
held = []
async def connect(port, name):
    try:
        held.append(await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                  server_hostname=name))
    except (OSError, ssl.SSLError):
        pass
async def huge(port, name):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                   server_hostname=name)
    writer.write(struct.pack(">I", 2**32 - 1))
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionError:
        return True
    except TimeoutError:  # still open
        return False
async def main():
    targets = [(port, name) for port, name, n in plan["targets"] for _ in range(n)]
    for start in range(0, len(targets), 50):
        await asyncio.gather(*(connect(*t) for t in targets[start:start + 50]))
    closed = await asyncio.gather(*(huge(*t) for t in plan["huge"]))
    print(sum(closed), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""


def _insiders_during_a_run(monkeypatch, capfd, caplog, n_connections):
    """From group 2 on, an insider (a process of its own) holding a valid certificate of
    host 1 opens ``n_connections`` mutual-TLS connections to host 0's peers (spread over its
    sockets) and as many to the coordinator's control port, keeps them open and idle to the
    end, and sends a 4 GiB length prefix on three more of each. Each listener keeps at most
    two connections per certificate name (taking no other party's place) and closes the rest
    at once, so: the run gives the simulator's rows (seeded noise), neither the coordinator
    nor a host grows by 50 MB or 100 descriptors, the huge prefixes are refused and their
    connections closed by the host and the coordinator alike, and the log grows by less than
    1 MB."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    send = NetworkWorld._send
    measured, attacker = [], []

    def measure(world):
        pids = [os.getpid(), *(p.pid for p in world.processes)]
        measured.append([(_rss_mb(pid), _descriptors(pid)) for pid in pids])

    async def sending(world, peer, message):
        if message["kind"] == "assign" and message["group"] == 2 and not measured:
            measure(world)
            insider = _insider(world.authority, 1)
            key = insider.key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            per_peer = [n_connections // 6 + (i < n_connections % 6) for i in range(6)]
            plan = {
                "cert": insider.certificate.decode(),
                "key": key.decode(),
                "ca": world.authority.certificate.decode(),
                "targets": [[world.port, "coordinator", n_connections]]
                + [[world.ports[i], "host-0", n] for i, n in enumerate(per_peer)],
                "huge": [[world.port, "coordinator"]] * 3
                + [[world.ports[i], "host-0"] for i in range(3)],
            }
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", INSIDER,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            )  # fmt: skip
            process.stdin.write(json.dumps(plan).encode() + b"\n")
            attacker.append(process)
            attacker.append(int(await asyncio.wait_for(process.stdout.readline(), 600)))
        await send(world, peer, message)

    monkeypatch.setattr(NetworkWorld, "_send", sending)
    finish = NetworkWorld._finish

    async def finishing(world):
        measure(world)
        attacker[0].stdin.close()
        await attacker[0].wait()
        await finish(world)

    monkeypatch.setattr(NetworkWorld, "_finish", finishing)
    capfd.readouterr()
    config = _config("group")
    network = simulate(_seeded(config), runtime="network")
    log = capfd.readouterr()  # the hosts' (their stderr), and the coordinator's (logging)
    logged = len(log.out) + len(log.err) + len(caplog.text)
    assert logged < 1_000_000
    assert attacker[1] == 6  # every huge prefix's connection closed by its listener
    before, after = measured
    for (rss_0, fds_0), (rss_1, fds_1) in zip(before, after, strict=True):
        assert rss_1 - rss_0 < 50 and fds_1 - fds_0 < 100, (before, after)
    _same_rows(simulate(config), network)
    (refused,) = [row["frames"] for row in network.wire if row["kind"] == "refused"]
    assert refused >= 2 * n_connections - 2 * 7  # at most two per listener kept, and evicted
    return before, after, logged, refused


def test_insiders_idle_connections_during_a_run_leave_its_rows_memory_and_log_alone(
    monkeypatch, capfd, caplog
):
    _insiders_during_a_run(monkeypatch, capfd, caplog, 200)


@pytest.mark.slow
def test_two_thousand_idle_insider_connections_to_a_host_and_the_coordinator(
    monkeypatch, capfd, caplog
):
    before, after, log, refused = _insiders_during_a_run(monkeypatch, capfd, caplog, 2000)
    with capfd.disabled():  # the numbers measured: (RSS MB, descriptors) per process
        print(f"\ncoordinator and hosts before: {before}\nafter: {after}\nlog: {log} bytes, "
              f"refused: {refused}")  # fmt: skip
