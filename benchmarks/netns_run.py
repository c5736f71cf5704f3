"""A network run across Linux network namespaces, with the simulator's delay, jitter and loss.

Usage (as root, where ``ip netns`` works)::

    python benchmarks/netns_run.py quickstart --hosts 3 --out /tmp/netns \\
        --set network.latency=lognormal --set network.latency_mean=0.05 \\
        --set network.latency_sigma=0.198 --set network.loss=0.05 --compare --seeds 1 2 3

Each host process of a ``--runtime network`` run gets a network namespace of its own, and so
does the coordinator (the ``p2pdp run`` process): no party reaches another over loopback.
Every namespace has one TUN interface (an address in 198.18.0.0/24, the range RFC 2544 sets
aside for benchmarks); this script holds the other end of every TUN and is the router
between them (:class:`Relay`): each IP packet that leaves a namespace for another is dropped
with probability ``network.loss`` or delivered after a delay drawn from the simulator's
latency law (``network.latency``, ``latency_mean``, ``latency_sigma``, plus ``size /
network.bandwidth``; :class:`PacketModel`), the same settings a simulated run reads. Why a
relay: this kernel has no ``netem`` qdisc (``tc qdisc add ... netem`` answers "Specified
qdisc kind is unknown") and no ``iptables``/``nft`` tool is installed, while TUN devices and
``ip netns`` are there.

What loss means here. The runtime's frames ride TLS over TCP, so the relay drops IP
packets, never a frame: TCP retransmits a lost segment (after a duplicate-ack round trip, or
its retransmission timeout, >= 200 ms on Linux; a lost SYN waits 1 s), so on this network a
5% packet loss becomes extra delay, and a protocol message is lost only when that delay
makes it miss its deadline (``groups.collect_timeout``; for the iterative protocols, their
exchange deadline): the row's ``messages_lost`` counts those. The simulator's
``network.loss`` drops whole messages instead (a datagram model). Both runs get the same
``network.*`` settings; ``--compare`` sets their rows side by side.

The network runtime refuses ``network.*`` settings (the real network replaces the model):
the script hands the relay the scenario's ``network.*`` settings and the runtime the same
scenario with them set to their defaults. Messages between two peers of one host stay inside
its namespace (loopback): no delay, no loss, where the simulator delays every message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import fcntl
import math
import os
import secrets
import shutil
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import simpy

from p2pdp.config import NetworkConfig
from p2pdp.sim.transport import Transport

__all__ = ["PacketModel", "Relay", "Testbed", "netns_available"]

#: The address range of the namespaces: RFC 2544's, for benchmarks (never routed).
SUBNET = "198.18.0"
#: The coordinator's namespace has the first address, host i the (i + 2)-th.
COORDINATOR_ADDRESS = f"{SUBNET}.1"
#: Packets the relay holds at once, in bytes (beyond it a packet is dropped, counted).
MAX_IN_FLIGHT = 64 << 20
#: Hosts of one testbed (one /24: the coordinator and the hosts).
MAX_HOSTS = 250
_TUNSETIFF, _IFF_TUN, _IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
_MTU = 65535
#: The simulator's network model: the relay's settings (``seeded_noise`` is the runtime's).
_MODEL_SETTINGS = ("latency", "latency_mean", "latency_sigma", "bandwidth", "loss")


def host_address(host: int) -> str:
    """The address of host ``host``'s namespace."""
    return f"{SUBNET}.{host + 2}"


@dataclass(frozen=True)
class PacketModel:
    """The simulator's message model applied to single IP packets.

    A packet of ``n`` bytes is lost with probability ``network.loss``; otherwise it arrives
    ``latency + n / network.bandwidth`` seconds after it left, the latency drawn from the
    simulator's law (:meth:`p2pdp.sim.transport.Transport.latencies`: constant, exponential
    or lognormal of mean ``latency_mean``, log-space std ``latency_sigma``). Draws are
    independent per packet (as netem's are), so jitter may reorder packets: TCP puts them
    back in order. ``seeded_noise`` is not read.

    Parameters
    ----------
    network : NetworkConfig
        The settings a simulated run of the same scenario reads.
    """

    network: NetworkConfig

    def delays(self, sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Delays of packets of ``sizes`` bytes, (n,) -> (n,) seconds; NaN: the packet is lost.

        One call draws the latencies of all ``n`` packets, then their losses, from ``rng``.
        """
        sizes = np.asarray(sizes, dtype=np.float64)
        transport = Transport(simpy.Environment(), self.network, 0, rng=rng)
        delays = transport.latencies(sizes.size) + sizes / self.network.bandwidth
        if self.network.loss > 0:
            delays[rng.random(sizes.size) < self.network.loss] = np.nan
        return delays


@dataclass
class RelayCounts:
    """What a :class:`Relay` did: packets forwarded and dropped, and the delays it added."""

    forwarded: int = 0
    lost: int = 0  # dropped by the model
    overflow: int = 0  # dropped: MAX_IN_FLIGHT bytes were in flight already
    unroutable: int = 0  # not IPv4, or to no namespace of the testbed
    unsent: int = 0  # due, but the destination refused it (a namespace deleted meanwhile)
    delay_sum: float = 0.0  # seconds drawn, over forwarded packets
    delay_max: float = 0.0
    slip_sum: float = 0.0  # seconds a packet left after it was due (the event loop's lag)
    slip_max: float = 0.0

    def row(self) -> dict[str, float]:
        mean = self.delay_sum / self.forwarded if self.forwarded else math.nan
        return {
            "relay_forwarded": self.forwarded,
            "relay_lost": self.lost,
            "relay_loss_rate": self.lost / max(1, self.forwarded + self.lost),
            "relay_overflow": self.overflow,
            "relay_unroutable": self.unroutable,
            "relay_unsent": self.unsent,
            "relay_mean_delay_s": mean,
            "relay_max_delay_s": self.delay_max,
            "relay_mean_slip_s": self.slip_sum / self.forwarded if self.forwarded else math.nan,
            "relay_max_slip_s": self.slip_max,
        }


@dataclass
class Relay:
    """Routes IPv4 packets between file descriptors (TUN devices), each delayed or dropped by
    ``model``.

    Parameters
    ----------
    routes : dict of bytes to int
        A 4-byte IPv4 address -> the descriptor that reaches it. Each descriptor is read
        whole packets at a time (a TUN device, or a datagram socket in tests): every packet
        read goes to the descriptor of its destination address (bytes 16 to 20 of its
        header) after its delay, or nowhere.
    model : PacketModel
    rng : numpy.random.Generator
        The stream of delays and losses (drawn ``batch`` packets at a time).
    max_in_flight : int
        Bytes held at once; a packet beyond it is dropped (``counts.overflow``).
    batch : int
        Packets whose delays one draw makes.
    """

    routes: dict[bytes, int]
    model: PacketModel
    rng: np.random.Generator
    max_in_flight: int = MAX_IN_FLIGHT
    batch: int = 1024
    counts: RelayCounts = field(default_factory=RelayCounts)
    _in_flight: int = field(default=0, init=False, repr=False)  # bytes
    _delays: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "batch"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(
                    f"Relay.{name} must be an integer >= 1, got {getattr(self, name)!r}"
                )

    def _delay(self, size: int) -> float:
        # Sizes only matter for a finite bandwidth: draw latencies and losses in batches and
        # add this packet's transfer time.
        if not self._delays:
            self._delays = self.model.delays(np.zeros(self.batch), self.rng).tolist()
        return self._delays.pop() + size / self.model.network.bandwidth

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start routing on ``loop`` (until :meth:`detach`)."""
        for fd in set(self.routes.values()):
            loop.add_reader(fd, self._read, loop, fd)

    def detach(self, loop: asyncio.AbstractEventLoop) -> None:
        for fd in set(self.routes.values()):
            loop.remove_reader(fd)

    def _read(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        counts = self.counts
        for _ in range(64):  # then let the loop deliver what is due
            try:
                packet = os.read(fd, _MTU)
            except (BlockingIOError, InterruptedError):
                return
            out = self.routes.get(packet[16:20]) if packet[:1] and packet[0] >> 4 == 4 else None
            if out is None:
                counts.unroutable += 1
                continue
            delay = self._delay(len(packet))
            if math.isnan(delay):
                counts.lost += 1
                continue
            if self._in_flight + len(packet) > self.max_in_flight:
                counts.overflow += 1
                continue
            self._in_flight += len(packet)
            counts.forwarded += 1
            counts.delay_sum += delay
            counts.delay_max = max(counts.delay_max, delay)
            due = loop.time() + delay
            loop.call_at(due, self._deliver, loop, out, packet, due)

    def _deliver(self, loop: asyncio.AbstractEventLoop, fd: int, packet: bytes, due: float) -> None:
        self._in_flight -= len(packet)
        slip = max(0.0, loop.time() - due)
        self.counts.slip_sum += slip
        self.counts.slip_max = max(self.counts.slip_max, slip)
        try:
            os.write(fd, packet)
        except OSError:
            self.counts.unsent += 1


def netns_available() -> str | None:
    """None where this machine can build a testbed, else why not (one line)."""
    if sys.platform != "linux":
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "no /dev/net/tun"
    probe = f"p2pdp-probe-{secrets.token_hex(3)}"  # root without the capability: a container
    try:
        _ip("netns", "add", probe)
    except RuntimeError as error:
        return str(error)
    _ip("netns", "del", probe)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class Testbed:
    """Network namespaces for a coordinator and ``n_hosts`` hosts, joined by a :class:`Relay`.

    A context manager: on entry it makes the namespaces (unique names, ``p2pdp-<random>-c``
    and ``-h0`` ...), one TUN device in each with its address (:data:`COORDINATOR_ADDRESS`,
    :func:`host_address`) and the relay on a thread of its own; on exit, even after an
    error, it stops the relay, kills every process still in its namespaces and deletes them.

    Parameters
    ----------
    n_hosts : int
    network : NetworkConfig
        The delay, jitter and loss between any two namespaces (:class:`PacketModel`).
    rng : numpy.random.Generator
        The relay's stream.
    """

    def __init__(self, n_hosts: int, network: NetworkConfig, *, rng: np.random.Generator) -> None:
        if not 1 <= n_hosts <= MAX_HOSTS:
            raise ValueError(f"n_hosts = {n_hosts}: a testbed has 1 to {MAX_HOSTS} hosts")
        token = secrets.token_hex(3)
        self.prefix = f"p2pdp-{token}"
        self.coordinator = f"{self.prefix}-c"
        self.hosts = [f"{self.prefix}-h{i}" for i in range(n_hosts)]
        self._tuns = [f"p2p{token}{i}" for i in range(n_hosts + 1)]  # <= 15 characters
        self._addresses = [COORDINATOR_ADDRESS, *map(host_address, range(n_hosts))]
        self.relay = Relay({}, PacketModel(network), rng)
        self._fds: list[int] = []
        self._made: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def namespaces(self) -> list[str]:
        """The coordinator's namespace, then host 0's, host 1's ..."""
        return [self.coordinator, *self.hosts]

    def tun(self, i: int) -> str:
        """The TUN device of :attr:`namespaces` ``[i]``."""
        return self._tuns[i]

    def __enter__(self) -> Testbed:
        try:
            for ns, tun, address in zip(self.namespaces, self._tuns, self._addresses, strict=True):
                _ip("netns", "add", ns)
                self._made.append(ns)
                fd = _open_tun(tun)
                self._fds.append(fd)
                _ip("link", "set", "dev", tun, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", tun)
                _ip("-n", ns, "link", "set", tun, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                self.relay.routes[bytes(map(int, address.split(".")))] = fd
            loop = self._loop = asyncio.new_event_loop()
            self.relay.attach(loop)
            self._thread = threading.Thread(target=loop.run_forever, name="relay", daemon=True)
            self._thread.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the relay, end the processes left in the namespaces, delete them."""
        loop = self._loop
        if loop is not None and self._thread is not None:
            loop.call_soon_threadsafe(self.relay.detach, loop)
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(5)
            loop.close()
            self._loop = self._thread = None
        for ns in self._made:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._made.clear()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()

    def command(self, ns: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns, *argv]

    def hosts_file(self, path: Path, *, allowlist: bool = True) -> Path:
        """Write a hosts file for a network run whose coordinator runs in :attr:`coordinator`:
        host i in its namespace, listening on its address (see docs/guide/network.md)."""
        python = [sys.executable, "-m", "p2pdp.experiments.network"]
        lines = [
            f'coordinator = "{COORDINATOR_ADDRESS}"',
            f'bind = "{COORDINATOR_ADDRESS}"',
            f"allowlist = {str(allowlist).lower()}",
        ]
        for i, ns in enumerate(self.hosts):
            argv = ", ".join(f'"{word}"' for word in self.command(ns, python))
            lines += ["", "[[host]]", f'address = "{host_address(i)}"', f"command = [{argv}]"]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path


# --- the script ----------------------------------------------------------------------------

_COLUMNS = ("mean_error", "aggregations", "aborted_groups", "messages_lost", "hosts_lost")


def _network_config(scenario: str, sets: Sequence[str]) -> NetworkConfig:
    """The one ``network`` setting every grid point of the scenario has (refused otherwise)."""
    from p2pdp.experiments.scenarios.scenario import load_scenario

    configs = {point.config.network for point in load_scenario(scenario, sets).points}
    if len(configs) != 1:
        raise SystemExit(
            f"netns_run: {scenario} sweeps network.* ({len(configs)} values): one relay "
            "serves a run, so give one value with --set"
        )
    return configs.pop()


def _rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "results.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def _key(row: dict[str, str]) -> tuple[str, ...]:
    return row["point"], row["fold"], row["repetition"]


def _run(argv: list[str], *, log: Path, timeout: float) -> None:
    with log.open("w") as out:
        try:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(
                f"netns_run: {' '.join(argv[:8])} ... ran past --timeout = "
                f"{timeout:g} s (stopped; its log: {log})"
            ) from None
    if done.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise SystemExit(f"netns_run: {' '.join(argv[:8])} ... failed:\n" + "\n".join(tail))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", help="a scenario file or a shipped scenario's name")
    parser.add_argument("--hosts", type=int, default=3, help="host processes (default 3)")
    parser.add_argument("--out", type=Path, required=True, help="a folder for the runs")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="as p2pdp run's --set; network.* (but seeded_noise) configures "
        "the relay and the simulator's model",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="one run per seed: the scenario's seed and the relay's stream",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds one run (network or simulator) may take before it is stopped (3600)",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="also run the simulator with the same settings, rows side by side",
    )
    args = parser.parse_args(argv)
    if (why := netns_available()) is not None:
        parser.error(why)
    if not args.timeout > 0:
        parser.error(f"--timeout = {args.timeout}: a number of seconds > 0")
    if not 1 <= args.hosts <= MAX_HOSTS:
        parser.error(f"--hosts = {args.hosts}: a testbed has 1 to {MAX_HOSTS} hosts")
    network = _network_config(args.scenario, args.set)
    model = [f"network.{name}" for name in _MODEL_SETTINGS]
    sets = [s for s in args.set if s.split("=", 1)[0].strip() not in model]
    # The runtime refuses a model of the network (the real one replaces it): its defaults.
    default = NetworkConfig()
    reset = [f"{key}={getattr(default, key[8:])!r}" for key in model]
    cli = [sys.executable, "-m", "p2pdp.experiments.cli", "run", args.scenario, "--force"]
    args.out.mkdir(parents=True, exist_ok=True)
    table: list[dict[str, object]] = []
    for seed in args.seeds:
        out = args.out / f"seed-{seed}"
        out.mkdir(exist_ok=True)
        with Testbed(args.hosts, network, rng=np.random.default_rng(seed)) as bed:
            hosts = bed.hosts_file(out / "hosts.toml")
            run = [*cli, "--runtime", "network", "--hosts", str(hosts), "--out", str(out / "net")]
            run += [f"--set={s}" for s in [*sets, *reset, f"seed={seed}"]]
            _run(bed.command(bed.coordinator, run), log=out / "net.log", timeout=args.timeout)
            relay = bed.relay.counts.row()
        sim: dict[tuple[str, ...], dict[str, str]] = {}
        if args.compare:
            run = [*cli, "--out", str(out / "sim")]
            run += [f"--set={s}" for s in [*args.set, "network.seeded_noise=false", f"seed={seed}"]]
            _run(run, log=out / "sim.log", timeout=args.timeout)
            sim = {_key(row): row for row in _rows(out / "sim")}
        for row in _rows(out / "net"):
            line: dict[str, object] = {"seed": seed, "point": row["point"], "fold": row["fold"]}
            line.update({f"net_{c}": row.get(c, "") for c in _COLUMNS})
            if args.compare:
                line.update({f"sim_{c}": sim[_key(row)].get(c, "") for c in _COLUMNS})
            line.update({f"network.{name}": getattr(network, name) for name in _MODEL_SETTINGS})
            line.update(relay)
            table.append(line)
    with (args.out / "comparison.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    _print(table)
    return 0


def _print(table: list[dict[str, object]]) -> None:
    for line in table:
        print(", ".join(f"{k}={v}" for k, v in line.items()))
    pairs = [(str(t["net_mean_error"]), str(t.get("sim_mean_error", ""))) for t in table]
    diff = [float(net) - float(sim) for net, sim in pairs if net and sim]  # "": not scored
    if diff:
        print(
            f"mean over {len(diff)} cells of network - simulator mean_error: "
            f"{np.mean(diff):+.4f} (max |diff| {np.max(np.abs(diff)):.4f})"
        )


if __name__ == "__main__":
    raise SystemExit(main())
