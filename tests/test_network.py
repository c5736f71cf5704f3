"""The network runtime (p2pdp.net): real OS processes over TCP give the simulator's rows.

Each run here starts host processes (spawn: a few seconds each), so the runs are small.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import gc
import inspect
import json
import math
import os
import pickle
import re
import shlex
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections import Counter

import msgpack
import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from scipy import stats

from p2pdp.config import (
    DataConfig,
    EvaluationConfig,
    GroupsConfig,
    PartitionConfig,
    PrivacyConfig,
    ProtocolConfig,
    PublicationConfig,
    ScenarioConfig,
)
from p2pdp.core.errors import ConfigError, NetworkRunError
from p2pdp.experiments.cli import main as cli
from p2pdp.experiments.network import launch as network_module
from p2pdp.experiments.network.launch import read_hosts_file
from p2pdp.experiments.run.runner import run_experiment
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.disclosure import non_private_column
from p2pdp.experiments.scenarios.scenario import load_scenario
from p2pdp.net import coordinator, tls
from p2pdp.net import host as host_module
from p2pdp.net.coordinator import NetworkWorld
from p2pdp.net.host import HostError, HostSettings, PeerHost, Ticket
from p2pdp.net.tls import (
    Authority,
    Credential,
    enrollment_client,
    host_name,
    new_key,
    signing_request,
)
from p2pdp.net.wire import (
    ProtocolError,
    encode,
    error_reason,
    pack_vector,
    read_frame,
    unpack_vector,
)
from p2pdp.privacy.accounting import BudgetLedger
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.release import NoiseStream, Releaser
from p2pdp.protocols.groups import Group
from p2pdp.protocols.oneshot import Curator
from p2pdp.sim.world import WorldObserver
from p2pdp.tasks import make_task, prepared, release_path, sensitivity_of, task_statistics

TIMING = {"sim_time", "wall_training_s", "wall_simulation_s", "wall_evaluation_s"}


#: Secure aggregation: splittable noise, and the public shard-size bound the network needs.
SECURE = {"mechanism": "coordinate-laplace", "secure_aggregation": True, "min_shard_size": 20}


def _seeded(config: ScenarioConfig) -> ScenarioConfig:
    """``config`` with ``network.seeded_noise``: the simulator's releases, NOT private."""
    return dataclasses.replace(
        config, network=dataclasses.replace(config.network, seeded_noise=True)
    )


def _config(mode: str, *, secure: bool = False, **groups) -> ScenarioConfig:
    return ScenarioConfig(
        seed=11,
        data=DataConfig(dataset="synthetic", synthetic_rows=360, synthetic_test_rows=120),
        partition=PartitionConfig(n_peers=12),
        groups=GroupsConfig(group_size=3, **groups),
        privacy=PrivacyConfig(
            epsilon=1.0, epsilon_per_aggregation=0.25, **(SECURE if secure else {})
        ),
        publication=PublicationConfig(mode=mode),
        evaluation=EvaluationConfig(split="fixed"),
    )


class _Releases(WorldObserver):
    """Observer keeping each release's group and record (to compare the two runtimes)."""

    def __init__(self):
        self.groups = []

    def released(self, world, group, record):
        self.groups.append((group.group_id, group.members.tolist(), group.curator, record))

    def aborted(self, world, group, reason):
        raise AssertionError(f"group {group.group_id} aborted: {reason}")


def _same_rows(simulated, network, *, refused=0, lost=0):
    """The simulator's row and the network's are the same, but for the messages the network
    refused (``refused``) and, of those, the honest ones not delivered (``lost``)."""
    a, b = simulated.row(), network.row()
    # the only mode with the simulator's rows; the simulator does not read the setting
    assert b["network.seeded_noise"] is True and a["network.seeded_noise"] is None
    assert a["messages_refused"] == 0 and b["messages_refused"] == refused
    assert a["messages_lost"] == 0 and b["messages_lost"] == lost
    # floats with a tolerance: two processes, two code paths
    for key in a.keys() - TIMING - {"network.seeded_noise", "messages_refused", "messages_lost"}:
        if key.startswith("network."):  # the simulated network's: a real one reads none
            assert b[key] is None, key
            continue
        if isinstance(a[key], float):
            assert b[key] == pytest.approx(a[key], rel=1e-9, nan_ok=True), key
        else:
            assert a[key] == b[key], (key, a[key], b[key])


@pytest.mark.parametrize(
    ("mode", "secure"), [("group", False), ("full", False), ("group", True), ("full", True)]
)
def test_network_runtime_releases_what_the_simulator_releases(mode, secure, monkeypatch):
    """Same groups, curators, release records and metrics; messages and bytes per peer as
    the simulator counts them; the wire table counts one frame per protocol message. With
    secure aggregation the fixed-point shares and partial sums travel for real (the masks
    from each host's CSPRNG: they cancel), and the decoded releases are the simulator's. All
    with network.seeded_noise: the noise from the scenario's seeded streams."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    config = _config(mode, secure=secure)
    seen = {runtime: _Releases() for runtime in ("simulation", "network")}
    results = {
        runtime: simulate(
            _seeded(config) if runtime == "network" else config,
            runtime=runtime,
            observers=(seen[runtime],),
        )
        for runtime in seen
    }
    simulated, network = results["simulation"], results["network"]
    assert network.aggregations == simulated.aggregations > 0
    for (g1, m1, c1, r1), (g2, m2, c2, r2) in zip(
        seen["simulation"].groups, seen["network"].groups, strict=True
    ):
        assert (g1, m1, c1) == (g2, m2, c2)
        assert r1.sensitivity == r2.sensitivity and r1.n_min == r2.n_min
        assert r2.noise_norm == pytest.approx(r1.noise_norm, rel=1e-12)
    _same_rows(simulated, network)
    assert simulated.wire == []
    frames = {row["kind"]: row["frames"] for row in network.wire}
    g, releases = 3, network.aggregations
    assert frames["assign"] == g * releases
    if secure:  # every member shares with every other, every other sends its partial sum
        assert "submit" not in frames
        assert frames["share"] == g * (g - 1) * releases
        assert frames["partial"] == (g - 1) * releases
        assert all(record.secure for *_, record in seen["network"].groups)
    else:
        assert frames["submit"] == (g - 1) * releases
    assert frames["publish"] == (12 - 1 if mode == "full" else g - 1) * releases
    assert frames["refused"] == 0 and frames["hosts lost"] == 0


class _InFlight(_Releases):
    """:class:`_Releases`, and the most groups in flight at once and the budget checked at
    each release (no member beyond its aggregations)."""

    def __init__(self):
        super().__init__()
        self.in_flight = self.most = 0
        self.world = None

    def group_started(self, world, group):
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)

    def released(self, world, group, record):
        super().released(world, group, record)
        self.in_flight -= 1
        self.world = world
        ledger = world.ledger
        assert (ledger.aggregations(group.members) <= ledger.max_aggregations).all()


@pytest.mark.parametrize(
    ("seeded", "secure"),
    [
        pytest.param(False, False, marks=pytest.mark.slow),
        (True, False),
        pytest.param(True, True, marks=pytest.mark.slow),
    ],
)
def test_groups_in_flight_at_once_run_on_the_network(seeded, secure, monkeypatch):
    """``groups.max_concurrent_groups = 5`` on 3 hosts: groups overlap, every peer is
    charged once per release it is a member of and never beyond its budget. By default the
    first wave is the simulator's (the same draws) and later groups differ (the network
    refills at each end, the simulator once per wave); seeded, the coordinator refills once
    per wave as the simulator does, so groups, releases and rows are the simulator's
    (docs/guide/network.md)."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "3")
    config = _config("group", secure=secure, max_concurrent_groups=5)
    config = dataclasses.replace(
        config,
        partition=PartitionConfig(n_peers=24),  # 15 records each
        privacy=dataclasses.replace(config.privacy, min_shard_size=10 if secure else None),
    )
    seen = {runtime: _InFlight() for runtime in ("simulation", "network")}
    results = {
        runtime: simulate(
            _seeded(config) if runtime == "network" and seeded else config,
            runtime=runtime,
            observers=(seen[runtime],),
        )
        for runtime in seen
    }
    network = seen["network"]
    assert results["network"].aggregations == len(network.groups) > 5
    assert network.most == 5 == seen["simulation"].most
    members = np.concatenate([m for _, m, _, _ in network.groups])
    charges = network.world.ledger.aggregations(np.arange(24))
    np.testing.assert_array_equal(charges, np.bincount(members, minlength=24))
    assert charges.max() <= network.world.ledger.max_aggregations
    simulated = seen["simulation"].groups
    if not seeded:
        first = {g: (m, c) for g, m, c, _ in network.groups if g < 5}
        assert first == {g: (m, c) for g, m, c, _ in simulated[:5]}
        return
    for (g1, m1, c1, r1), (g2, m2, c2, r2) in zip(simulated, network.groups, strict=True):
        assert (g1, m1, c1) == (g2, m2, c2)
        assert r2.noise_norm == pytest.approx(r1.noise_norm, rel=1e-9)
    _same_rows(results["simulation"], results["network"])


def test_the_cli_runs_a_seeded_scenario_on_the_network_and_says_it_is_not_private(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(
        'name = "tiny"\nseed = 4\n[data]\ndataset = "synthetic"\nsynthetic_rows = 240\n'
        "synthetic_test_rows = 60\n[partition]\nn_peers = 8\n[groups]\ngroup_size = 4\n"
        "[privacy]\nepsilon = 1.0\nepsilon_per_aggregation = 0.5\n[evaluation]\n"
        'split = "fixed"\n'
    )
    out = tmp_path / "out"
    seeded = ["--set", "network.seeded_noise=true"]
    assert cli(["run", str(scenario), "--out", str(out), "--runtime", "network", *seeded]) == 0
    (row,) = csv.DictReader((out / "results.csv").open())
    assert "network.seeded_noise = true" in row["non_private_steps"]
    assert "NOT private" in row["non_private_steps"]
    wire = list(csv.DictReader((out / "wire.csv").open()))
    assert {r["kind"] for r in wire} >= {"assign", "submit", "publish", "refused"}
    assert int(row["aggregations"]) > 0
    # the simulator does not read the setting: refused before the folder is touched
    assert cli(["run", str(scenario), "--out", str(out), "--resume", *seeded]) != 0
    assert "network.seeded_noise = True is read only with runtime = 'network'" in (
        capsys.readouterr().err
    )


def test_a_network_folder_missing_its_wire_table_is_rebuilt_by_the_command_the_report_gives(
    tmp_path, monkeypatch, capsys
):
    """The report's rebuild command repeats --runtime network and the hosts (it used to
    omit them: that command was refused, or would have run the cell in the simulator); so
    does the resume command of an interrupted run, hosts given by P2PDP_NETWORK_HOSTS."""
    out = tmp_path / "out"
    scenario = _tiny_scenario(tmp_path)
    argv = ["run", str(scenario), "--out", str(out), "--runtime", "network"]
    assert cli([*argv, "--hosts", "2"]) == 0
    (out / "wire.csv").unlink()
    capsys.readouterr()
    assert cli(["report", str(out)]) == 2
    err = capsys.readouterr().err
    command = re.search(r"rebuild them with `([^`]*)`", err)[1]
    assert command.endswith("--runtime network --hosts 2 --resume"), command
    assert cli(shlex.split(command)[1:]) == 0  # without "p2pdp"
    assert {r["kind"] for r in csv.DictReader((out / "wire.csv").open())} >= {"assign"}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("SIGINT")

    monkeypatch.setattr("p2pdp.experiments.run.runner.run_experiment", interrupted)
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "3")
    assert cli(argv) == 130
    assert f"--out {out} --runtime network --hosts 3 --resume" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("groups.sampler", "gossip"),
        ("network.loss", 0.2),  # the simulator's transport model: not injected
        ("network.latency", "lognormal"),
        ("network.latency_mean", 0.5),
        ("network.bandwidth", 1e6),
    ],
)
def test_settings_the_network_runtime_does_not_run_are_refused_by_name(setting, value):
    config = _config("group")
    section, key = setting.split(".")
    config = dataclasses.replace(
        config, **{section: dataclasses.replace(getattr(config, section), **{key: value})}
    )
    why = "is read only with runtime = 'simulation'" if section == "network" else "not supported"
    with pytest.raises(ConfigError, match=f"{setting} = .* {why}"):
        simulate(config, runtime="network")


def _iterative(name: str) -> ScenarioConfig:
    return ScenarioConfig(
        seed=11,
        data=DataConfig(dataset="synthetic", synthetic_rows=360, synthetic_test_rows=120),
        partition=PartitionConfig(n_peers=12),
        privacy=PrivacyConfig(epsilon=1.0, delta=1e-5, mechanism="gaussian"),
        protocol=ProtocolConfig(name=name, rounds=3),
        evaluation=EvaluationConfig(split="fixed"),
    )


@pytest.mark.parametrize("name", ["dpsgd"])
def test_an_iterative_protocol_is_refused_before_anything_runs(name, tmp_path):
    """It used to run in the simulator while the manifest said "runtime": "network" (the
    iterative protocols run on the network now, pair noise too, but not a threat model's
    calibration: tests/test_network_iterative.py)."""
    pairs = {"protocol": {"pairwise_noise_multiplier": 1.0, "threat_model": "curious-peer"}}
    simulate(_iterative(name), **pairs)  # the simulator runs it
    message = 'protocol.threat_model = "curious-peer" is not supported by the network runtime'
    with pytest.raises(ConfigError, match=message):
        simulate(_iterative(name), runtime="network", **pairs)
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        '[data]\ndataset = "synthetic"\n[privacy]\nmechanism = "gaussian"\ndelta = 1e-5\n'
        f'[protocol]\nname = "{name}"\npairwise_noise_multiplier = 1.0\n'
        'threat_model = "curious-peer"\n'
    )
    with pytest.raises(ConfigError, match=message):
        run_experiment(load_scenario(scenario), tmp_path / "out", runtime="network")
    assert not (tmp_path / "out").exists()  # refused before the folder was touched


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ("0", r"= '0': the number of network hosts must be an integer >= 1"),
        ("-2", r"= '-2': the number of network hosts must be an integer >= 1"),
        ("2.5", r"= '2.5': the number of network hosts must be an integer >= 1"),
        ("13", r"= '13' gives 13 hosts for partition.n_peers = 12: at most one host per peer"),
        ("abc", r"= 'abc': neither a number of hosts .* nor the path of a hosts file"),
        ("FILE", r"hosts.toml gives 13 hosts for partition.n_peers = 12: at most one host"),
    ],
)
def test_host_counts_are_validated_before_anything_runs(hosts, message, tmp_path, monkeypatch):
    """P2PDP_NETWORK_HOSTS = 0 used to run one host, 13 hosts for 12 peers used to run 12."""
    if hosts == "FILE":
        hosts = tmp_path / "hosts.toml"
        hosts.write_text('coordinator = "127.0.0.1"\n' + '[[host]]\naddress = "127.0.0.1"\n' * 13)
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    with pytest.raises(ConfigError, match=message):
        simulate(_config("group"), runtime="network")
    scenario = tmp_path / "s.toml"
    scenario.write_text('[data]\ndataset = "synthetic"\n[partition]\nn_peers = 12\n')
    with pytest.raises(ConfigError, match=message):
        run_experiment(load_scenario(scenario), tmp_path / "out", runtime="network")
    assert not (tmp_path / "out").exists()


def test_jobs_are_refused_by_the_network_runtime(tmp_path, capsys):
    assert cli(["run", "quickstart", "--out", str(tmp_path), "--runtime", "network",
                "--jobs", "2"]) == 2  # fmt: skip
    assert "--jobs 2 is not used by the network runtime" in capsys.readouterr().err


def test_hosts_started_by_a_hosts_files_commands_give_the_simulators_rows(tmp_path, monkeypatch):
    """Each host is started by its entry's command (here through a launcher, as ssh would
    be), reads its launch bundle on stdin, listens on its entry's address and tells the
    others through the coordinator's directory."""
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\nbind = "127.0.0.1"\n'
        '[[host]]\naddress = "127.0.0.1"\n'
        f"command = {json.dumps(['env', sys.executable, '-m', 'p2pdp.experiments.network'])}\n"
        '[[host]]\naddress = "127.0.0.1"\n'
    )
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    config = _config("group", secure=True)
    network = simulate(_seeded(config), runtime="network")
    assert network.aggregations > 0
    _same_rows(simulate(config), network)


def _logged_hosts(tmp_path, monkeypatch):
    """Two hosts started by a hosts file's commands, each writing its pid to the returned
    log when it starts (P2PDP_NETWORK_HOSTS points at the file)."""
    log = tmp_path / "starts"
    host = f"{shlex.quote(sys.executable)} -m p2pdp.experiments.network"
    command = ["sh", "-c", f"echo $$ >> {shlex.quote(str(log))}; exec {host}"]
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\n'
        + f'[[host]]\naddress = "127.0.0.1"\ncommand = {json.dumps(command)}\n' * 2
    )
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    return log


@pytest.mark.parametrize("started_by", ["spawn", "command"])
def test_a_runs_hosts_start_once_and_serve_every_cell(tmp_path, monkeypatch, started_by):
    """Within run_hosts (a run's cells: the runner's), one set of host processes serves
    every cell, spawned or started by a hosts file's commands (their log: one start per
    host), each cell a session of its own with the simulator's rows (group and full
    publication, plain and secure, alternating); they exit at the end of the run."""
    if started_by == "command":
        log = _logged_hosts(tmp_path, monkeypatch)
    else:
        monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    cells = [_config("group"), _config("full", secure=True), _config("full"), _config("group")]
    with network_module.run_hosts() as served:
        for config in cells:
            _same_rows(simulate(config), simulate(_seeded(config), runtime="network"))
        processes = list(served.hosts.values())
        assert served.started == 2 and all(p.is_alive() for p in processes)
    assert not any(p.is_alive() for p in processes)
    if started_by == "command":
        assert len(log.read_text().split()) == 2


def test_a_run_starts_its_hosts_once_and_leaves_none_behind(tmp_path, monkeypatch):
    """run_experiment (the CLI's run) with a hosts file: each command starts once for the
    run's two cells (its log: one pid per host), and no host is left when it returns."""
    log = _logged_hosts(tmp_path, monkeypatch)
    scenario = _tiny_scenario(tmp_path)
    scenario.write_text(scenario.read_text() + '[sweep]\n"groups.collect_timeout" = [10.0, 11.0]\n')
    summary = run_experiment(load_scenario(scenario), tmp_path / "out", runtime="network")
    assert summary.run == 2
    pids = [int(pid) for pid in log.read_text().split()]
    assert len(pids) == 2 and not any(map(_running, pids))


def test_a_runs_hosts_stop_when_an_interrupt_leaves_it(monkeypatch):
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    with pytest.raises(KeyboardInterrupt), network_module.run_hosts() as served:
        simulate(_config("group"), runtime="network")
        processes = list(served.hosts.values())
        raise KeyboardInterrupt
    assert len(processes) == 2 and not any(p.is_alive() for p in processes)


ORPHANS = """
import os, sys, time
os.environ["P2PDP_NETWORK_HOSTS"] = sys.argv[1]
from p2pdp.config import DataConfig, GroupsConfig, PartitionConfig, ScenarioConfig
from p2pdp.experiments.network.launch import run_hosts
from p2pdp.experiments.run.simulation import simulate
if __name__ == "__main__":
    data = DataConfig(dataset="synthetic", synthetic_rows=120, synthetic_test_rows=40)
    config = ScenarioConfig(seed=1, data=data, partition=PartitionConfig(n_peers=6),
                            groups=GroupsConfig(group_size=3))
    with run_hosts() as served:
        simulate(config, runtime="network")
        print(*[process.pid for process in served.hosts.values()], flush=True)
        time.sleep(120)
"""


@pytest.mark.parametrize("started_by", ["spawn", "command"])
def test_a_runs_hosts_exit_when_the_coordinator_dies(tmp_path, started_by):
    """kill -9 of the coordinator between two cells: its hosts (spawned, or started by a
    hosts file's commands in sessions of their own) see the end of their input and exit
    within seconds, leaving no orphan."""
    setting = "2"
    if started_by == "command":
        hosts = tmp_path / "hosts.toml"
        hosts.write_text('coordinator = "127.0.0.1"\n' + '[[host]]\naddress = "127.0.0.1"\n' * 2)
        setting = str(hosts)
    script = tmp_path / "coordinator.py"
    script.write_text(ORPHANS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    coordinator_process = subprocess.Popen(
        [sys.executable, str(script), setting], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert coordinator_process.stdout is not None
        pids = [int(pid) for pid in coordinator_process.stdout.readline().split()]
        assert len(pids) == 2
        alive = [pid for pid in pids if _running(pid)]
        assert alive == pids  # between cells: the hosts wait for the next one
    finally:
        coordinator_process.kill()
        coordinator_process.wait()
    deadline = time.monotonic() + 20
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_running, pids))


def _running(pid: int) -> bool:
    """Process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_host_command_that_never_connects_is_named_and_killed_with_its_children(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(coordinator, "STARTUP_TIMEOUT", 3.0)
    monkeypatch.setattr(coordinator, "NOTICE_AFTER", 1.0)
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\nbind = "127.0.0.1"\n[[host]]\naddress = "127.0.0.1"\n'
        '[[host]]\naddress = "127.0.0.1"\ncommand = ["sh", "-c", "sleep 61.25; true"]\n'
    )
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    with pytest.raises(
        NetworkRunError, match=r"never connected: (.*\), )?host 1 \(sh -c 'sleep 61.25; true'\)"
    ):
        simulate(_config("group"), runtime="network")
    assert re.search(r"waiting for every host to start, \d s of 3 s; not connected yet: .*host 1",
                     caplog.text)  # fmt: skip
    left = subprocess.run(["pgrep", "-f", "sleep 61.25"], capture_output=True, text=True)
    assert left.stdout == ""  # the shell's child went with it


def test_a_host_that_cannot_reach_the_coordinator_says_where_it_looked(
    tmp_path, monkeypatch, capfd
):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(  # the coordinator listens on 127.0.0.1 only: 127.0.0.2 refuses
        'coordinator = "127.0.0.2"\nbind = "127.0.0.1"\n[[host]]\naddress = "127.0.0.1"\n'
    )
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    with pytest.raises(NetworkRunError, match=r"host 0 \(.*\) stopped with the error above"):
        simulate(_config("group"), runtime="network")
    err = capfd.readouterr().err
    assert "p2pdp host 0: cannot reach the coordinator at 127.0.0.2:" in err
    assert "Traceback" not in err


def _tiny_scenario(tmp_path, publication="group"):
    """A scenario file of ``_config``'s settings (12 peers, g = 3, 4 aggregations each)."""
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(
        'name = "tiny"\nseed = 11\n[data]\ndataset = "synthetic"\nsynthetic_rows = 360\n'
        "synthetic_test_rows = 120\n[partition]\nn_peers = 12\n[groups]\ngroup_size = 3\n"
        "[privacy]\nepsilon = 1.0\nepsilon_per_aggregation = 0.25\n[publication]\n"
        f'mode = "{publication}"\n[evaluation]\nsplit = "fixed"\n'
    )
    return scenario


def _one_error_line(capfd, expected):
    """What the CLI printed: the error in one line naming ``expected``, and no traceback."""
    err = capfd.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("p2pdp: error:")]
    assert re.search(expected, line), line
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ('command = ["false"]', r"host 1 \(false\) exited with status 1 while waiting for every"),
        ('command = ["/no/such/p2pdp-host"]', r"host 1 \(/no/such/p2pdp-host\) cannot start: "),
        ('address = "192.0.2.1"', r"host 1 \(.*-m p2pdp.experiments.network\) stopped with"),
    ],
)
def test_a_host_that_cannot_start_fails_the_run_in_one_line(tmp_path, capfd, entry, expected):
    """A bad command, a command that is not there, an address the host cannot listen on
    (TEST-NET-1: no interface has it): one line naming the host and its command."""
    second = entry if entry.startswith("address") else f'address = "127.0.0.1"\n{entry}'
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\nbind = "127.0.0.1"\n[[host]]\naddress = "127.0.0.1"\n'
        f"[[host]]\n{second}\n"
    )
    out = tmp_path / "out"
    argv = ["run", str(_tiny_scenario(tmp_path)), "--out", str(out), "--runtime", "network"]
    assert cli([*argv, "--hosts", str(hosts)]) == 2
    err = _one_error_line(capfd, expected)
    if entry.startswith("address"):
        assert "p2pdp host 1: cannot listen on 192.0.2.1" in err  # the host's own line
    assert json.loads((out / "manifest.json").read_text())["status"] == "failed"


def test_a_host_killed_while_it_starts_fails_the_run_in_one_line(tmp_path, monkeypatch, capfd):
    """kill -9 of a host process before it connected: the run fails at once, one line."""
    build = NetworkWorld.__init__

    def killing(world, *args, launch, **kwargs):
        def launched(host, port):
            process = launch(host, port)
            if host == 1:
                os.kill(process.pid, signal.SIGKILL)
            return process

        build(world, *args, launch=launched, **kwargs)

    monkeypatch.setattr(NetworkWorld, "__init__", killing)
    argv = ["run", str(_tiny_scenario(tmp_path)), "--out", str(tmp_path / "out")]
    assert cli([*argv, "--runtime", "network", "--hosts", "2"]) == 2
    _one_error_line(
        capfd,
        r"host 1 \(spawned from this Python process\) was killed by SIGKILL while waiting "
        "for every host to start",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[host]]\naddress = "a"\n', "coordinator must be a non-empty string, got None"),
        ('coordinator = "c"\n', r"needs at least one \[\[host\]\] entry"),
        ('coordinator = "c"\n[[host]]\nadress = "a"\n', "unknown key host.0..adress"),
        ('coordinator = "c"\n[[host]]\naddress = ""\n', r"host\[0\].address must be a non"),
        ('coordinator = "c"\n[[host]]\naddress = "a"\ncommand = "ssh a"\n',
         r"host\[0\].command must be a list of strings, got 'ssh a'"),
        ('coordinator = "c"\nport = 1\n[[host]]\naddress = "a"\n', "unknown key 'port'"),
        ("coordinator = \n", r"hosts file .*hosts.toml:1:\d+: invalid TOML"),
        ('coordinator = "c"\nhost = [1]\n', r"host\[0\] must be a table"),
    ],
)  # fmt: skip
def test_a_bad_hosts_file_is_refused_naming_the_key(tmp_path, text, message):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_hosts_file(hosts)


def test_hosts_need_the_network_runtime(tmp_path, capsys):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('coordinator = "c"\n[[host]]\naddress = "a"\n')
    assert cli(["run", "quickstart", "--out", str(tmp_path / "o"), "--hosts", str(hosts)]) != 0
    assert "--hosts needs --runtime network" in capsys.readouterr().err


def test_secure_aggregation_without_a_public_shard_size_bound_is_refused():
    config = _config("group", secure=True)
    unbounded = dataclasses.replace(
        config, privacy=dataclasses.replace(config.privacy, min_shard_size=None)
    )
    with pytest.raises(ConfigError, match="secure_aggregation = true on the network runtime "
                       "needs privacy.min_shard_size"):  # fmt: skip
        simulate(unbounded, runtime="network")


def test_seeded_noise_is_refused_by_the_simulator_where_it_would_change_nothing():
    with pytest.raises(ConfigError, match="network.seeded_noise"):
        simulate(_seeded(_config("group")))


def _credentials(hosts):
    """A run's authority and, keyed by name, the coordinator's credential and one per host,
    each host's made as a host makes it (its own key, a signing request, its token)."""
    authority = Authority(hosts)
    parties = {"coordinator": authority.credential}
    for host in range(hosts):
        key = new_key()
        certificate = authority.enroll(
            host, authority.token(host), signing_request(host_name(host), key)
        )
        parties[host_name(host)] = Credential(
            name=host_name(host), certificate=certificate, key=key, authority=authority.certificate
        )
    return authority, parties


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


def _coordinator(*, launch, dim=2):
    """A coordinator of 12 peers on 2 hosts started by ``launch``, outside any run."""
    return NetworkWorld(
        _config("group"),
        n_peers=12,
        dim=dim,
        ledger=BudgetLedger(12, epsilon_total=1.0, epsilon_per_aggregation=0.25),
        rngs={"protocol": np.random.default_rng(0)},
        launch=launch,
        hosts=2,
        settings=HostSettings(n_peers=12, hosts=2, full_publication=False),
        authority=Authority(2),
    )


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
        exitcode = host_module.EXPLAINED

    world = _coordinator(launch=lambda host, port: Explained())
    with pytest.raises(NetworkRunError) as error:
        world.run()
    assert str(error.value) == (
        "network runtime: host 0; host 1 stopped with the error above while waiting for every "
        "host to start"
    )


UNGUARDED = """
import os
os.environ["P2PDP_NETWORK_HOSTS"] = "2"
from p2pdp.config import DataConfig, GroupsConfig, PartitionConfig, ScenarioConfig
from p2pdp.experiments.run.simulation import simulate
data = DataConfig(dataset="synthetic", synthetic_rows=120, synthetic_test_rows=40)
config = ScenarioConfig(seed=1, data=data, partition=PartitionConfig(n_peers=6),
                        groups=GroupsConfig(group_size=3))
{call}
"""


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_the_main_guard_is_told_in_one_line(tmp_path, guarded):
    """From a script, the network runtime spawns hosts that import the script again: without
    ``if __name__ == "__main__":`` one line says to add it (there were 176 lines of the hosts'
    tracebacks), before any host starts; with it, the check says nothing (called alone: a
    guarded run is what every other test of the runtime does)."""
    call = 'simulate(config, runtime="network")'
    if guarded:
        call = (
            'if __name__ == "__main__":\n'
            "    from p2pdp.experiments.network import launch as network\n"
            '    network._check_main_guard()\n    print("checked")'
        )
    script = tmp_path / "script.py"
    script.write_text(UNGUARDED.format(call=call))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    if guarded:
        assert done.returncode == 0 and done.stdout == "checked\n", done.stderr
        return
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        f"p2pdp: error: the network runtime was started at the top level of {script} (line 9): "
        'put that under `if __name__ == "__main__":`'
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


# -- the wire format -----------------------------------------------------------------------
def _read(data: bytes, **kwargs):
    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_frame(reader, timeout=1.0, **kwargs)

    return asyncio.run(go())


def test_a_frame_round_trips_and_an_empty_stream_ends_cleanly():
    vector = np.array([0.5, -1.25, 3.0])
    message = _read(encode({"kind": "submit", "statistic": pack_vector(vector)}))
    assert message["kind"] == "submit"
    np.testing.assert_array_equal(unpack_vector(message["statistic"], shape=(3,)), vector)
    assert _read(b"") is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">I", 1 << 21) + b"x", "exceeds the maximum"),
        (struct.pack(">I", 3) + b"\xc1\xc1\xc1", "not msgpack"),
        (encode({"no": "kind"}), "string 'kind'"),
        (encode([1, 2]), "string 'kind'"),
        (struct.pack(">I", 10) + b"abc", "closed inside a frame"),
        (b"\x00\x00", "closed inside a frame's length"),
    ],
)
def test_oversize_malformed_and_truncated_frames_are_refused(data, reason):
    with pytest.raises(ProtocolError, match=reason):
        _read(data)


def test_a_silent_connection_times_out():
    async def go():
        reader = asyncio.StreamReader()
        return await read_frame(reader, timeout=0.05)

    with pytest.raises(TimeoutError):
        asyncio.run(go())


@pytest.mark.parametrize(
    "value",
    [
        {"shape": [2], "data": b"\x00" * 8},  # too few bytes
        {"shape": [1], "data": np.array([np.nan]).tobytes()},
        {"data": b""},
    ],
)
def test_malformed_vectors_are_refused(value):
    with pytest.raises(ProtocolError):
        unpack_vector(value, shape=(1,) if value.get("shape") == [1] else None)


# -- a host refuses what breaks the protocol, and keeps serving -------------------------------
def _host(reports, *, mechanism="vector-laplace", seeded_noise=False, **settings):
    mechanism = make_mechanism(mechanism, epsilon=1.0)
    releaser = Releaser(
        mechanism,
        2,
        aggregate="mean",
        secure=False,
        noise_rng=np.random.default_rng(0),
        share_rng=np.random.default_rng(1),
    )
    host = PeerHost(
        np.array([0, 1]),
        np.array([[0.1, 0.2], [0.3, 0.4]]),
        np.array([5, 7]),
        releaser=releaser,
        sensitivity=lambda sizes: 2.0 / min(sizes),
        settings=HostSettings(
            **{"n_peers": 3, "hosts": 1, "full_publication": False, **settings},
            seeded_noise=seeded_noise,
        ),
        report=reports.append,
    )
    host.send = lambda send, group, **fields: reports.append(("sent", send))  # no sockets
    return host


def _tls_host(credential, settings):
    """A host of peers 0 and 1 with ``credential`` (mutual TLS) and ``settings``."""
    return PeerHost(
        np.array([0, 1]),
        np.array([[0.1, 0.2], [0.3, 0.4]]),
        np.array([5, 7]),
        releaser=_host([]).releaser,
        sensitivity=lambda sizes: 2.0 / min(sizes),
        settings=settings,
        report=lambda message: None,
        credential=credential,
    )


def _submit(sender=2, size=6, **changes):
    message = {
        "kind": "submit",
        "sender": sender,
        "group": 0,
        "members": [0, 1, 2],
        "curator": 0,
        "size": size,
        "statistic": pack_vector(np.array([1.0, 2.0])),
    }
    return {**message, **changes}


ASSIGN_0 = {"kind": "assign", "sender": -1, "group": 0, "members": [0, 1, 2], "curator": 0,
            "release": 0, "timeout": 60.0}  # fmt: skip


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


def _full_publication(sender, group):
    return {"kind": "publish", "sender": sender, "group": group, "index": group,
            "model": pack_vector(np.zeros(2))}  # fmt: skip


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
        await host_module._received(host, 3, timeout=0.3)
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


def test_msgpack_is_the_encoding():
    frame = encode({"kind": "x", "n": 1})
    assert msgpack.unpackb(frame[4:]) == {"kind": "x", "n": 1}


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
    lost = sum(stats.get(r, 0) for r in coordinator.LOST)
    refused = sum(stats.get(r, 0) for r in coordinator.REFUSED)
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


# -- keys stay where they are made ---------------------------------------------------------------
#: A PEM private key (its header and the start of its body).
PEM_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/]")


def _private_keys_and_pem(root):
    """Every private key object and every bytes/str holding a PEM private key reachable from
    ``root`` (through attributes, containers and closures)."""
    keys, pem, seen, todo = [], [], set(), [root]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, type) or inspect.ismodule(item):
            continue
        seen.add(id(item))
        if isinstance(item, ec.EllipticCurvePrivateKey):
            keys.append(item)
        elif isinstance(item, (bytes, str)):
            if PEM_KEY.search(item.encode() if isinstance(item, str) else item):
                pem.append(item)
        elif inspect.isfunction(item):  # its closure and defaults, not its module's globals
            todo.extend(cell.cell_contents for cell in item.__closure__ or ())
            todo.extend([item.__defaults__, item.__kwdefaults__])
        else:
            todo.extend(gc.get_referents(item))
    return keys, pem


def _public(holder):
    """The DER public key of a private key or a certificate."""
    return holder.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _certified(pem):
    return _public(x509.load_pem_x509_certificate(pem))


def test_no_private_key_is_in_a_launch_bundle_or_held_by_the_coordinator(tmp_path, monkeypatch):
    """Both hosts started by a hosts file's commands, the bytes written to their standard
    input kept (tee): each launch bundle parses to the run, a ticket (one-time token, the
    CA's certificate) and addresses, and holds no private key (no PEM key, nothing that
    unpickles to one). Meanwhile everything the coordinator holds (the world, its authority,
    its launcher's closure) holds exactly two private keys, the CA's and its own, none for a
    host key certified in the run, and no PEM key. The rows are the simulator's (seeded)."""
    bundles = [tmp_path / f"bundle-{host}" for host in range(2)]
    host = f"{shlex.quote(sys.executable)} -m p2pdp.experiments.network"
    commands = [["sh", "-c", f"tee {shlex.quote(str(bundle))} | {host}"] for bundle in bundles]
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\nbind = "127.0.0.1"\n'
        + "".join(f'[[host]]\naddress = "127.0.0.1"\ncommand = {json.dumps(c)}\n' for c in commands)
    )
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    worlds = []

    class Holdings(WorldObserver):
        def released(self, world, group, record):
            if not worlds:  # mid-run: every host enrolled, the run under way
                worlds.append((world, _private_keys_and_pem(world)))

    config = _config("group")
    network = simulate(_seeded(config), runtime="network", observers=(Holdings(),))
    _same_rows(simulate(config), network)
    world, (keys, pem) = worlds[0]
    authority = world.authority
    issued = {host: _certified(certificate) for host, certificate in authority.issued.items()}
    assert sorted(issued) == [0, 1] and authority.enrolled
    assert pem == []
    assert sorted(map(_public, keys)) == sorted(
        [_certified(authority.certificate), _certified(authority.credential.certificate)]
    )
    assert not set(map(_public, keys)) & set(issued.values())
    for host, path in enumerate(bundles):
        raw = path.read_bytes()
        assert b"PRIVATE KEY" not in raw
        bundle = pickle.loads(raw)
        assert bundle["host"] == host and isinstance(bundle["ticket"], Ticket)
        assert bundle["ticket"].authority == authority.certificate
        assert _private_keys_and_pem(bundle) == ([], [])
        # the token was this host's, and it is spent: nobody can enroll with it again
        with pytest.raises(ProtocolError, match="wrong or spent token"):
            authority.enroll(host, bundle["ticket"].token, b"")


def test_an_enrollment_is_refused_without_its_token_for_another_identity_or_twice():
    """Over the coordinator's enrollment listener: a wrong token, a request for host-1 with
    host 0's token (which spends it), host 0's honest enrollment after that, a frame that is
    not an enrollment and one longer than ENROLL_BYTES are all refused (no certificate) and
    counted; host 1 enrolls once (a certificate for the key it made, as host-1), not twice;
    once no token is left the listener is closed."""
    world = _coordinator(launch=lambda host, ticket: None)
    authority = world.authority

    async def raw(port, message):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=enrollment_client(authority.certificate),
            server_hostname="coordinator",
        )  # fmt: skip
        writer.write(message if isinstance(message, bytes) else encode(message))
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return answer

    async def go():
        server = world._enrollment = await tls.listen(
            world._enroll, "127.0.0.1", world._enrollment_tls, pending=4,
            refused=world.wire.refused, per_identity=4, total=4, first_frame=5.0,
        )  # fmt: skip
        port = server.sockets[0].getsockname()[1]

        def ticket(host, token=None):
            return Ticket(port=0, enrollment_port=port, token=token or authority.token(host),
                          authority=authority.certificate)  # fmt: skip

        refused = []
        wrong = ticket(0, token="x" * 43)
        with pytest.raises(HostError, match="refused this host's enrollment"):
            await host_module.enroll(0, wrong, "127.0.0.1", 5.0)
        request = signing_request("host-1", new_key())
        assert await raw(port, {"kind": "enroll", "host": 0, "token": authority.token(0),
                                "request": request}) == b""  # fmt: skip
        with pytest.raises(HostError, match="refused"):  # host 0's token is spent
            await host_module.enroll(0, wrong, "127.0.0.1", 5.0)
        assert await raw(port, {"kind": "hello", "host": 1}) == b""
        assert await raw(port, struct.pack(">I", host_module.ENROLL_BYTES + 1)) == b""
        refused.append(world.wire.refused["enroll"])
        credential = await host_module.enroll(1, ticket(1), "127.0.0.1", 5.0)
        assert _certified(credential.certificate) == _public(credential.key)
        subject = x509.load_pem_x509_certificate(credential.certificate).subject
        assert subject.rfc4514_string() == "CN=host-1"
        with pytest.raises(HostError):  # no token left: the listener is closed
            await host_module.enroll(1, wrong, "127.0.0.1", 5.0)
        return refused

    assert asyncio.run(go()) == [5]
    assert sorted(authority.issued) == [1] and authority.enrolled


# -- mutual TLS: strangers and impostors are refused, the honest keep going ------------------
def test_mutual_tls_refuses_strangers_impostors_and_replays():
    _, credentials = _credentials(2)
    _, stranger = _credentials(2)  # another run's CA and certificates
    assign = {"kind": "assign", "sender": -1, "group": 0, "members": [0, 1], "curator": 0,
              "release": 0, "timeout": 60.0}  # fmt: skip

    async def connect(port, party, *, run=credentials, expect="host-0"):
        context = run[party].context(server=False)
        return await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=expect)

    async def go():
        host = _tls_host(
            credentials["host-0"], HostSettings(n_peers=4, hosts=2, full_publication=False)
        )
        port = (await host.listen())[0]
        # no certificate at all: the handshake never completes, no frame is read
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode(assign))
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        # a certificate of another run; and a server that is not the host the client meant
        with pytest.raises((ssl.SSLError, ConnectionError)):
            await connect(port, "host-1", run=stranger)
        with pytest.raises(ssl.SSLCertVerificationError):
            await connect(port, "host-1", expect="host-1")
        # host 1 (of this run) speaks for the coordinator, then for host 0's peer 1
        _, writer = await connect(port, "host-1")
        writer.write(encode(assign))
        writer.write(encode(_submit(sender=1, members=[0, 1])))
        await writer.drain()
        # the coordinator assigns group 0, then the same frame again (a replay)
        _, coordinator = await connect(port, "coordinator")
        coordinator.write(encode(assign) + encode(assign))
        await coordinator.drain()
        await asyncio.sleep(0.3)
        for w in (writer, coordinator):
            w.close()
        await host.close()
        return host

    host = asyncio.run(go())
    assert host.counters.refused["assign"] == 2  # the impostor's and the replay
    assert host.counters.refused["submit"] == 1  # host 1 cannot speak for peer 1
    assert host.last_group == {0: 0}  # the coordinator's assignment was accepted


def test_a_claim_below_the_public_minimum_shard_size_is_refused():
    reports = []
    host = _host(reports, min_shard_size=6)
    host.handle(0, ASSIGN_0)
    host.handle(0, _submit(size=5))
    assert host.counters.refused["submit"] == 1
    host.handle(0, _submit(size=6))
    assert host.counters.refused["submit"] == 1  # at the minimum: accepted


def test_a_public_minimum_shard_size_sets_every_groups_sensitivity():
    """With privacy.min_shard_size the noise follows the public bound, never the claims;
    a peer holding fewer records is refused before the run."""
    config = _config("group")
    bounded = dataclasses.replace(
        config, privacy=dataclasses.replace(config.privacy, min_shard_size=10)
    )
    log = _Releases()
    result = simulate(bounded, observers=(log,))
    task = make_task(bounded)
    expected = task.sensitivity([10, 10, 10])
    assert result.aggregations > 0
    assert {record.sensitivity for *_, record in log.groups} == {expected}
    assert min(result.shard_sizes) > 10  # the claims would have given less noise
    assert task.sensitivity([int(min(result.shard_sizes))] * 3) < expected
    too_high = dataclasses.replace(
        config, privacy=dataclasses.replace(config.privacy, min_shard_size=1000)
    )
    with pytest.raises(ConfigError, match=r"privacy.min_shard_size = 1000, but peer \d+ holds"):
        simulate(too_high)
    with pytest.raises(ConfigError, match="privacy.min_shard_size must be an integer >= 1, got 0"):
        dataclasses.replace(config.privacy, min_shard_size=0)


def test_a_host_keeps_sending_when_a_receiver_is_gone():
    """A connection that fails while draining (its host finished and closed, say), or that
    is known closed already (its host was killed), costs its frames, counted, not the
    host's sender: later frames are still written and a flush returns."""

    class Gone:  # a connection whose other end has closed, with a frame still to send
        class transport:
            @staticmethod
            def get_write_buffer_size():
                return 1

        def is_closing(self):  # not known to be closed yet: the drain finds out
            return False

        def write(self, data):
            pass

        async def drain(self):
            raise ConnectionResetError("Connection lost")

        def close(self):
            pass

    class Closed(Gone):  # its other end closed and asyncio knows: a write would vanish
        def is_closing(self):
            return True

        def write(self, data):
            raise AssertionError("written to a closed connection, dropped without a count")

    async def go():
        host = _host([])
        host._sending = asyncio.ensure_future(host._sender())
        host._writers = {1: Gone(), 2: Gone(), 3: Closed()}
        host.send_frame("publish", 0, [1, 2, 3], b"frame")
        await asyncio.wait_for(host.flush(), 5)
        host._writers[1] = Gone()
        host.send_frame("publish", 0, [1], b"frame")
        await asyncio.wait_for(host.flush(), 5)
        await host.close()
        return host

    host = asyncio.run(go())
    assert host.counters.refused["unreachable"] == 4
    assert 3 not in host._writers  # the next frame to peer 3 connects afresh
    assert host.counters.wire["publish"] == 4  # counted as sent, as the simulator counts them


def test_a_peers_socket_closes_an_idle_connection_and_senders_connect_afresh(caplog):
    """A peer's socket keeps a connection that sends nothing for ``peer_idle`` seconds (a
    group's time and two timeouts; it was 600 s): peer 0's host sends a frame to peer 1, stays
    silent past that, and sends another: its receiver closed the first connection, and the
    sender, which drops a connection unused for half that, reconnected: both frames arrive,
    nothing is lost."""
    settings = HostSettings(
        n_peers=2, hosts=2, full_publication=False, collect_timeout=0.2, timeout=0.2
    )
    assert settings.peer_idle == pytest.approx(0.6)
    releaser = _host([]).releaser

    def host(peer):
        return PeerHost(np.array([peer]), np.array([[0.1, 0.2]]), np.array([5]),
                        releaser=releaser, sensitivity=lambda sizes: 1.0, settings=settings,
                        report=lambda message: None)  # fmt: skip

    async def go():
        sender, receiver = host(0), host(1)
        await sender.listen()
        port = (await receiver.listen())[1]
        sender.addresses, sender.ports = ["127.0.0.1"] * 2, [0, port]
        frame = encode(_full_publication(0, 3))  # refused by peer 1 (no such group): counted
        for _ in range(2):
            sender.send_frame("publish", 0, [1], frame)
            await sender.flush()
            await asyncio.sleep(1.0)  # past peer_idle: the receiver closes the connection
        await sender.close()
        await receiver.close()
        return sender, receiver

    with caplog.at_level("INFO", logger="p2pdp.net.host"):
        sender, receiver = asyncio.run(go())
    assert receiver.counters.refused == {"publish": 2}  # both arrived; an idle close is no refusal
    assert receiver.counters.idle_closed == 2  # each connection closed when idle
    assert sender.counters.refused["unreachable"] == 0
    assert "refused a connection" not in caplog.text


def test_a_connection_its_peer_closes_logs_nothing_and_a_refused_one_says_why(caplog):
    """Host 0 sends peer 2 (on host 1, mutual TLS) a frame and closes its connection, as a
    sender drops one it left unused: nothing is logged or refused but the frame (no such
    group). A frame that stops half-way is refused, and its log line names why (a timeout
    carries no message of its own: it used to log "refused a connection: ")."""
    _, credentials = _credentials(2)
    settings = HostSettings(n_peers=4, hosts=2, full_publication=False, timeout=0.2)

    async def go():
        receiver = PeerHost(np.array([2, 3]), np.zeros((2, 2)), np.array([5, 5]),
                            releaser=_host([]).releaser, sensitivity=lambda sizes: 1.0,
                            settings=settings, report=lambda message: None,
                            credential=credentials["host-1"])  # fmt: skip
        sender = _tls_host(credentials["host-0"], settings)
        port = (await receiver.listen())[2]
        await sender.listen()
        sender.addresses, sender.ports = ["127.0.0.1"] * 2, [0, 0, port, 0]
        sender.send_frame("publish", 0, [2], encode(_full_publication(0, 3)))
        await sender.flush()
        await sender.close()  # closes its connection to peer 2
        await asyncio.sleep(0.3)
        closed = dict(receiver.counters.refused), caplog.text
        context = credentials["host-0"].context(server=False)
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="host-1"
        )
        writer.write(encode(_full_publication(0, 4))[:10])  # a frame that stops half-way
        await asyncio.sleep(0.5)
        writer.close()
        await receiver.close()
        return closed

    with caplog.at_level("INFO", logger="p2pdp.net.host"):
        (refused, logged) = asyncio.run(go())
    assert refused == {"publish": 1} and "connection" not in logged
    (line,) = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert line.split("refused a connection: ")[1].strip()  # a reason, never empty
    assert "did not end within 0.2 s" in line


def test_a_log_lines_reason_is_never_empty():
    assert error_reason(TimeoutError()) == "TimeoutError"
    assert error_reason(ConnectionResetError("reset by peer")) == "reset by peer"


# -- secure aggregation between the peers of one host, frames routed by hand -----------------
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


# -- private as deployed: the noise comes from the OS, drawn where it is added ---------------
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


class _Published(WorldObserver):
    """Observer keeping the world and its released groups (their models: world.published)."""

    def __init__(self):
        self.world, self.groups = None, []

    def released(self, world, group, record):
        self.world = world
        self.groups.append(group)


@pytest.mark.parametrize("seeded", [True, False])
def test_recomputing_the_noise_shares_from_the_seed_denoises_only_a_seeded_run(seeded, monkeypatch):
    """The attack of issue 29 on a real secure run: recompute every member's noise share from
    the scenario and its seed, subtract them from the release. With network.seeded_noise it
    gives each group's exact mean (to fixed-point precision); by default it gives nothing
    near it, and the rows do not list the noise as a non-private step."""
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", "2")
    config = _config("group", secure=True)
    config = _seeded(config) if seeded else config
    seen = _Published()
    assert simulate(config, runtime="network", observers=(seen,)).aggregations > 0
    task = make_task(config)
    statistics, _ = task_statistics(task, prepared(task, fold=0, repetition=0), 12)
    _, releaser, _ = release_path(config, task, statistics.shape[-1], fold=0, repetition=0)
    sensitivity = sensitivity_of(task, 20)([20] * 3)  # the public bound, as the members use
    errors = []
    for group in seen.groups:
        model = seen.world.published[seen.world.position[group.group_id]]
        shares = sum(
            releaser.noise_share(sensitivity, 3, rng=releaser.member_stream(group.group_id, peer))
            for peer in group.members.tolist()
        )
        exact = statistics[group.members].mean(axis=0)
        errors.append(np.abs(model - shares - exact).max())
    if seeded:
        assert max(errors) < 1e-9
        assert "NOT private" in non_private_column(config, runtime="network")
    else:
        assert min(errors) > 1e-6
        assert "seeded_noise" not in non_private_column(config, runtime="network")


# -- an insider with a valid certificate, during a real run ----------------------------------
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


# -- bounded under hostile load ---------------------------------------------------------------
def test_a_listener_bounds_silent_clients_and_then_serves_an_honest_one(monkeypatch, caplog):
    """40 silent TCP clients at one peer's socket, then the coordinator: each newcomer
    beyond the cap on handshakes in progress evicts the oldest, so the coordinator's
    handshake completes and its assignment is read; the silent clients left are dropped at
    the handshake deadline. With an allowlist, a client from another address (here:
    127.0.0.1 itself, not listed) is refused before its handshake."""
    monkeypatch.setattr(tls, "HANDSHAKE_TIMEOUT", 0.5)
    _, credentials = _credentials(1)

    async def go(allowed):
        host = _tls_host(
            credentials["host-0"],
            HostSettings(n_peers=2, hosts=1, full_publication=False, allowed=allowed),
        )
        port = (await host.listen())[0]
        silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
        await asyncio.sleep(0.1)
        context = credentials["coordinator"].context(server=False)
        try:
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname="host-0"
            )
            writer.write(encode({**ASSIGN_0, "members": [0, 1]}))
            await writer.drain()
            await asyncio.sleep(1.0)  # past the deadline
            writer.close()
        except (ssl.SSLError, ConnectionError):
            pass
        for _, w in silent:
            w.close()
        await host.close()
        return host

    host = asyncio.run(go(()))
    pending = 3 + 8  # the default group size, and some slack
    assert host.counters.refused["busy"] == 40 + 1 - pending
    assert host.counters.refused["handshake"] == pending - 1
    assert host.last_group == {0: 0}
    with caplog.at_level("WARNING"):
        host = asyncio.run(go(("10.0.0.9",)))
    assert host.counters.refused["address"] == 41 and host.last_group == {}
    assert caplog.text.count("not in the allowlist ['10.0.0.9']") == 1  # logged once
    host = asyncio.run(go(("localhost",)))  # a name: resolved once, to 127.0.0.1
    assert host.counters.refused["address"] == 0 and host.last_group == {0: 0}


def test_an_allowlist_name_that_does_not_resolve_is_named():
    with pytest.raises(ConfigError, match="allowlist's address 'no-such-host.invalid'"):
        tls.resolve(["127.0.0.1", "no-such-host.invalid"])


def test_a_host_outside_the_allowlist_is_told_so(monkeypatch):
    """The coordinator refuses this host's address (its allowlist names another): the host's
    one-line error names the allowlist (it said only "Connection reset by peer")."""
    authority = Authority(1)

    async def go():
        refused = Counter()
        server = await tls.listen(
            lambda reader, writer: None, "127.0.0.1", authority.credential.context(server=True,
            clients=False), pending=4, refused=refused, allowed={"10.0.0.9"}, per_identity=4,
            total=4, first_frame=5.0,
        )  # fmt: skip
        ticket = Ticket(port=1, enrollment_port=server.sockets[0].getsockname()[1],
                        token=authority.token(0), authority=authority.certificate)  # fmt: skip
        settings = HostSettings(n_peers=2, hosts=1, full_publication=False, allowed=("10.0.0.9",))
        with pytest.raises(HostError, match=r"allowlist, resolved: 10\.0\.0\.9; is this host"):
            await host_module.serve(
                np.array([0, 1]), np.zeros((2, 2)), np.array([5, 7]), releaser=_host([]).releaser,
                sensitivity=lambda sizes: 1.0, settings=settings, host_index=0, ticket=ticket,
            )  # fmt: skip
        server.close()
        return refused

    assert asyncio.run(go())["address"] == 1


def test_a_host_shut_down_with_connections_queued_logs_no_error(caplog):
    """40 silent clients hold every handshake place and queue for more when the host's loop
    ends: their tasks are cancelled quietly (the queue's futures used to be set after their
    cancellation: an InvalidStateError traceback per queued connection)."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(tls, "HANDSHAKE_TIMEOUT", 30.0)
    _, credentials = _credentials(1)

    async def go():
        host = _tls_host(
            credentials["host-0"], HostSettings(n_peers=2, hosts=1, full_publication=False)
        )
        port = (await host.listen())[0]
        silent.extend(socket.create_connection(("127.0.0.1", port)) for _ in range(40))
        for _ in range(3):  # accepted, and queued: not yet through the queue when it ends
            await asyncio.sleep(0)
        await host.close()

    silent = []
    with caplog.at_level("DEBUG", logger="asyncio"):
        asyncio.run(go())
    monkeypatch.undo()
    for client in silent:
        client.close()
    assert "InvalidStateError" not in caplog.text and "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


#: A listener in a process with one descriptor left, taken by a client: every accept fails
#: with EMFILE (asyncio retries 100 at a time, every second) for ``argv[1]`` seconds.
OUT_OF_DESCRIPTORS = """
import asyncio, logging, os, resource, socket, sys
from collections import Counter
from p2pdp.net import tls
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
context = tls.Authority(1).credential.context(server=True)
async def main():
    server = await tls.listen(lambda r, w: None, "127.0.0.1", context, pending=4,
                              refused=Counter(), per_identity=2, total=4, first_frame=5.0)
    port = server.sockets[0].getsockname()[1]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    os.close(held.pop())
    client = socket.create_connection(("127.0.0.1", port))  # the last descriptor
    await asyncio.sleep(float(sys.argv[1]))
asyncio.run(main())
"""


def test_accept_errors_out_of_descriptors_are_logged_once():
    """A listener whose process has no descriptor left: accept fails with EMFILE over and
    over (asyncio logged a traceback for each: 3,400 lines in 3.5 s here, 163 MB in 3.5 min
    in the audit); now one line, naming the error, for the whole process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", OUT_OF_DESCRIPTORS, "2.5"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "p2pdp.net.tls: a listener could not accept a connection: [Errno 24] Too many open "
        "files (logged once)"
    ]


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
    "from p2pdp.experiments.network.launch import host_from_stdin; host_from_stdin()"
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
