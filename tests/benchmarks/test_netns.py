"""benchmarks/netns_run.py: the relay's delay and loss model (everywhere), and Linux network
namespaces joined by the relay (root, ``ip netns`` and /dev/net/tun, else skipped with the
reason): two fast tests, and a network run beside the simulator (slow)."""

from __future__ import annotations

import asyncio
import csv
import importlib.util
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from p2pdp.config import NetworkConfig

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
_spec = importlib.util.spec_from_file_location("netns_run", BENCHMARKS / "netns_run.py")
assert _spec is not None and _spec.loader is not None
netns_run = importlib.util.module_from_spec(_spec)
sys.modules["netns_run"] = netns_run  # dataclasses look their module up
_spec.loader.exec_module(netns_run)

NO_NETNS = netns_run.netns_available()
needs_netns = pytest.mark.skipif(NO_NETNS is not None, reason=f"no testbed here: {NO_NETNS}")


def test_packet_delays_follow_the_simulators_latency_law_and_loss_rate():
    # 50 ms +/- 10 ms: lognormal of mean 0.05 s, log-space std 0.198 (std 0.05 * 0.2).
    network = NetworkConfig(latency="lognormal", latency_mean=0.05, latency_sigma=0.198, loss=0.05)
    n = 40_000
    delays = netns_run.PacketModel(network).delays(np.zeros(n), np.random.default_rng(7))
    lost = np.isnan(delays)
    # Binomial(n, 0.05): std sqrt(n p (1 - p)) = 43.6; 5 standard deviations.
    assert abs(lost.sum() - n * 0.05) < 5 * math.sqrt(n * 0.05 * 0.95)
    kept = delays[~lost]
    assert kept.min() > 0
    assert abs(kept.mean() - 0.05) < 5 * 0.01 / math.sqrt(kept.size)
    assert abs(kept.std() - 0.01) < 0.0005
    # Constant latency, finite bandwidth: exactly latency + size / bandwidth, nothing lost.
    constant = NetworkConfig(latency="constant", latency_mean=0.02, bandwidth=1e6)
    sizes = np.array([0, 1500, 64_000])
    got = netns_run.PacketModel(constant).delays(sizes, np.random.default_rng(0))
    np.testing.assert_allclose(got, 0.02 + sizes / 1e6)


def _packet(destination: str, payload: bytes) -> bytes:
    """An IPv4-shaped datagram: version 4, the destination address at bytes 16-20, the
    payload."""
    return b"\x45" + bytes(15) + socket.inet_aton(destination) + payload


def test_the_relay_delays_by_the_model_drops_at_its_rate_and_bounds_what_it_holds():
    """The relay's own loop over datagram socket pairs standing in for TUN devices."""
    latency, loss, n = 0.05, 0.2, 400
    network = NetworkConfig(latency="constant", latency_mean=latency, loss=loss)
    pairs = {address: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for address in
             ("198.18.0.1", "198.18.0.2")}  # fmt: skip
    for relay_end, _ in pairs.values():
        relay_end.setblocking(False)
    routes = {socket.inet_aton(a): relay_end.fileno() for a, (relay_end, _) in pairs.items()}
    relay = netns_run.Relay(routes, netns_run.PacketModel(network), np.random.default_rng(3),
                            max_in_flight=60 * 100)  # fmt: skip
    sender, receiver = pairs["198.18.0.1"][1], pairs["198.18.0.2"][1]
    receiver.setblocking(False)

    async def exchange() -> dict[int, float]:
        loop = asyncio.get_running_loop()
        arrived: dict[int, float] = {}

        def receive() -> None:
            data = receiver.recv(100)
            arrived[int.from_bytes(data[20:24], "big")] = time.monotonic()

        relay.attach(loop)
        loop.add_reader(receiver.fileno(), receive)
        sent = {}
        for i in range(n):
            sent[i] = time.monotonic()
            sender.send(_packet("198.18.0.2", i.to_bytes(4, "big") + bytes(36)))  # 60 bytes
            if i % 50 == 49:  # let the relay read: at most 100 packets in flight
                await asyncio.sleep(0.06)
        sender.send(_packet("203.0.113.9", b"nowhere"))
        sender.send(b"\x60" + bytes(40))  # IPv6: not routed
        await asyncio.sleep(latency + 0.2)
        loop.remove_reader(receiver.fileno())
        relay.detach(loop)
        return {i: arrived[i] - sent[i] for i in arrived}

    try:
        delays = asyncio.run(exchange())
    finally:
        for a, b in pairs.values():
            a.close()
            b.close()
    counts = relay.counts
    assert counts.unroutable == 2
    assert counts.overflow == 0  # at most 100 x 60 bytes in flight: the bound, not beyond it
    assert counts.forwarded + counts.lost == n and counts.unsent == 0
    assert len(delays) == counts.forwarded
    assert abs(counts.lost - n * loss) < 5 * math.sqrt(n * loss * (1 - loss))
    # Every packet waited the latency, and not much more (the event loop's timer slack).
    assert min(delays.values()) >= latency - 0.002
    assert max(delays.values()) < latency + 0.25


def test_the_relay_drops_beyond_its_bound_and_counts_it():
    network = NetworkConfig(latency="constant", latency_mean=10.0)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.setblocking(False)
    relay = netns_run.Relay({socket.inet_aton("198.18.0.2"): a.fileno()},
                            netns_run.PacketModel(network), np.random.default_rng(0),
                            max_in_flight=1000)  # fmt: skip

    async def flood() -> None:
        loop = asyncio.get_running_loop()
        relay.attach(loop)
        for _ in range(30):
            b.send(_packet("198.18.0.2", bytes(80)))  # 100 bytes each
        await asyncio.sleep(0.05)
        relay.detach(loop)

    try:
        asyncio.run(flood())
    finally:
        a.close()
        b.close()
    assert (relay.counts.forwarded, relay.counts.overflow) == (10, 20)
    with pytest.raises(ValueError, match="max_in_flight must be an integer >= 1, got 0"):
        netns_run.Relay({}, relay.model, np.random.default_rng(0), max_in_flight=0)


def _namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listing.splitlines() if line.strip()}


@pytest.fixture
def testbed():
    """Three hosts and a coordinator, 50 ms constant one-way delay, no loss."""
    network = NetworkConfig(latency="constant", latency_mean=0.05)
    with netns_run.Testbed(3, network, rng=np.random.default_rng(0)) as bed:
        yield bed
    assert not set(bed.namespaces) & _namespaces()


_ECHO = """
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.create_server((sys.argv[2], 9000))
    print("ready", flush=True)
    c, _ = s.accept()
    while data := c.recv(100):
        c.sendall(data)
else:
    t = time.monotonic(); c = socket.create_connection((sys.argv[2], 9000), timeout=5)
    rtts = [time.monotonic() - t]
    for _ in range(3):
        t = time.monotonic(); c.sendall(b"x"); c.recv(1); rtts.append(time.monotonic() - t)
    print(*rtts)
"""


@needs_netns  # about 1 s
def test_namespaces_reach_each_other_only_through_the_relay_and_its_delay(testbed):
    address = netns_run.host_address(1)
    server = subprocess.Popen(testbed.command(testbed.hosts[1], [sys.executable, "-c", _ECHO,
                              "serve", address]), stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        client = subprocess.run(
            testbed.command(testbed.hosts[0], [sys.executable, "-c", _ECHO, "call", address]),
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    finally:
        server.kill()
        server.wait()
    rtts = [float(word) for word in client.stdout.split()]
    assert all(0.1 - 0.002 <= rtt < 0.1 + 0.2 for rtt in rtts), rtts  # 2 x 50 ms each
    assert testbed.relay.counts.forwarded >= 8
    # A host's namespace has no other way out: loopback and its TUN device only.
    links = subprocess.run(["ip", "-n", testbed.hosts[0], "-o", "link"], capture_output=True,
                           text=True, check=True).stdout.splitlines()  # fmt: skip
    assert [line.split(":")[1].strip() for line in links] == ["lo", testbed.tun(1)]


@needs_netns
def test_a_testbed_is_removed_even_when_its_user_fails():
    bed = netns_run.Testbed(2, NetworkConfig(), rng=np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="on purpose"), bed:
        assert set(bed.namespaces) <= _namespaces()
        stray = subprocess.Popen(bed.command(bed.hosts[0], ["sleep", "60"]))
        raise RuntimeError("on purpose")
    assert not set(bed.namespaces) & _namespaces()
    assert stray.wait(5) == -9  # what was left running inside is ended


def _tiny_scenario(tmp_path: Path) -> Path:
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(
        'name = "tiny"\nseed = 11\n[data]\ndataset = "synthetic"\nsynthetic_rows = 360\n'
        "synthetic_test_rows = 120\n[partition]\nn_peers = 12\n[groups]\ngroup_size = 3\n"
        "[privacy]\nepsilon = 1.0\nepsilon_per_aggregation = 0.25\n"
        '[evaluation]\nsplit = "fixed"\n'
    )
    return scenario


def _script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, str(BENCHMARKS / "netns_run.py"), *args],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip


@needs_netns
def test_a_run_past_its_timeout_is_stopped_in_one_line_and_leaves_no_namespace(tmp_path):
    done = _script(str(_tiny_scenario(tmp_path)), "--out", str(tmp_path / "out"),
                   "--timeout", "0.5")  # fmt: skip
    assert done.returncode == 1
    assert "ran past --timeout = 0.5 s (stopped; its log: " in done.stderr
    assert "Traceback" not in done.stderr
    hosts = (tmp_path / "out" / "seed-0" / "hosts.toml").read_text()
    used = {word.strip('",') for word in hosts.split() if word.startswith('"p2pdp-')}
    assert len(used) == 3 and not used & _namespaces()


@pytest.mark.slow  # about 40 s
@needs_netns
def test_a_network_run_across_namespaces_with_delay_and_loss_completes_beside_the_simulator(
    tmp_path,
):
    """The script on a tiny synthetic scenario, 3 hosts, 20 ms +/- 4 ms and 5% packet loss."""
    out = tmp_path / "out"
    done = _script(
        str(_tiny_scenario(tmp_path)), "--hosts", "3", "--out", str(out), "--compare",
        "--seeds", "5", "--set", "network.latency=lognormal", "--set",
        "network.latency_mean=0.02", "--set", "network.latency_sigma=0.198", "--set",
        "network.loss=0.05",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    (row,) = csv.DictReader((out / "comparison.csv").open())
    assert int(row["relay_forwarded"]) > 100
    assert 0 < int(row["relay_lost"])  # packets were lost; TCP resent them
    assert 0.016 < float(row["relay_mean_delay_s"]) < 0.024
    assert int(row["net_hosts_lost"]) == 0
    assert int(row["net_aggregations"]) > 0 and int(row["sim_aggregations"]) > 0
    assert row["net_messages_lost"].isdigit() and int(row["sim_messages_lost"]) > 0
    assert abs(float(row["net_mean_error"]) - float(row["sim_mean_error"])) < 0.15
    (net,) = csv.DictReader((out / "seed-5" / "net" / "results.csv").open())
    assert net["network.loss"] == ""  # the runtime reads no model: the relay had it
    assert (row["network.latency"], row["network.loss"]) == ("lognormal", "0.05")
    hosts = (out / "seed-5" / "hosts.toml").read_text()
    used = {word.strip('",') for word in hosts.split() if word.startswith('"p2pdp-')}
    assert len(used) == 3 and not used & _namespaces()  # the hosts' namespaces, removed
