"""Starting a network run: settings refused before anything runs, hosts files, host processes
started once and never left behind, and a host that cannot start named in one line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError, NetworkRunError
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.experiments.cli import main as cli
from p2pdp.experiments.network import processes as network_processes
from p2pdp.experiments.network.hosts_file import read_hosts_file
from p2pdp.experiments.run.runner import run_experiment
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import load_scenario
from p2pdp.learning.settings import EvaluationConfig
from p2pdp.net import coordinator
from p2pdp.net.coordinator import NetworkWorld
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import ProtocolConfig
from tests.net.helpers import _config, _same_rows, _seeded, _tiny_scenario


@pytest.mark.parametrize(
    ("setting", "value"),
    [
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
    calibration: tests/net/test_network_iterative.py)."""
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
    with pytest.raises(ConfigError, match=message) as refused:
        simulate(_config("group"), runtime="network")
    if hosts != tmp_path / "hosts.toml":  # the variable the user set, by its name
        assert str(refused.value).startswith(f"P2PDP_NETWORK_HOSTS = {str(hosts)!r}")
    scenario = tmp_path / "s.toml"
    scenario.write_text('[data]\ndataset = "synthetic"\n[partition]\nn_peers = 12\n')
    with pytest.raises(ConfigError, match=message):
        run_experiment(load_scenario(scenario), tmp_path / "out", runtime="network")
    assert not (tmp_path / "out").exists()


def test_a_hosts_flag_is_named_as_given_not_as_the_variable_that_carries_it(tmp_path, capsys):
    """``--hosts 30`` for 12 peers: the message names ``--hosts``, not P2PDP_NETWORK_HOSTS
    (which the user never set, and which is unset again afterwards)."""
    scenario = tmp_path / "s.toml"
    scenario.write_text('[data]\ndataset = "synthetic"\n[partition]\nn_peers = 12\n')
    argv = ["run", str(scenario), "--out", str(tmp_path / "out"), "--runtime", "network"]
    assert cli([*argv, "--hosts", "30"]) == 2
    err = capsys.readouterr().err
    assert "--hosts = '30' gives 30 hosts for partition.n_peers = 12" in err
    assert "P2PDP_NETWORK_HOSTS" not in err
    assert "P2PDP_NETWORK_HOSTS" not in os.environ
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
    with network_processes.run_hosts() as served:
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
    with pytest.raises(KeyboardInterrupt), network_processes.run_hosts() as served:
        simulate(_config("group"), runtime="network")
        processes = list(served.hosts.values())
        raise KeyboardInterrupt
    assert len(processes) == 2 and not any(p.is_alive() for p in processes)


ORPHANS = """
import os, sys, time
os.environ["P2PDP_NETWORK_HOSTS"] = sys.argv[1]
from p2pdp.config import DataConfig, GroupsConfig, PartitionConfig, ScenarioConfig
from p2pdp.experiments.network.processes import run_hosts
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


def test_a_host_process_started_by_hand_says_what_it_is_instead_of_waiting():
    """``python -m p2pdp.experiments.network --help`` used to exit 0 silently (and, from a
    terminal, wait on standard input for a coordinator that never writes)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    asked = subprocess.run(
        [sys.executable, "-m", "p2pdp.experiments.network", "--help"],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert asked.returncode == 0 and "one host process of a network run" in asked.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "p2pdp.experiments.network", "--port", "1"],
        capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert wrong.returncode == 2 and "takes no arguments" in wrong.stderr
