"""Each network host holds only its own data: ``p2pdp split`` and hosts files naming ``data``.

The data set is a CSV file written by each test (no real data set needed); a host given its
shard file must complete the run without ever opening that CSV or another host's files
(recorded by an audit hook on ``open`` in the host process), and give the simulator's rows.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError, NetworkRunError
from p2pdp.experiments.cli import main as cli
from p2pdp.experiments.network.hosts_file import read_hosts_file
from p2pdp.experiments.network.launch import check_network_settings
from p2pdp.experiments.network.shards import read_host_shards
from p2pdp.experiments.run.oneshot import UNSCORED
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import load_scenario
from p2pdp.net.coordinator import NetworkWorld
from p2pdp.net.hosts import HostSettings
from p2pdp.net.tls import Authority
from p2pdp.privacy.accounting import BudgetLedger
from p2pdp.tasks import make_task, prepared_own
from p2pdp.tasks.pipeline import prepare_peers

TIMING = {"sim_time", "wall_training_s", "wall_simulation_s", "wall_evaluation_s"}

SCENARIO = """
name = "per-host"
seed = 5
repetitions = 2

[data]
dataset = "csv"
path = "{path}"

[partition]
n_peers = 8

[groups]
group_size = 2

[privacy]
epsilon = 1.0
epsilon_per_aggregation = 0.25
{privacy}

[publication]
mode = "{mode}"

[evaluation]
split = "cv"
cv_folds = 3
folds = [0, 1]
"""

#: Records every path the process opens (``open``, ``os.open``, ``np.load``...) into the file
#: named by its first argument.
AUDIT = """
import os, sys
log = open(sys.argv[1], "a", buffering=1)
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        log.write(os.path.abspath(os.fsdecode(args[0])) + "\\n")
sys.addaudithook(hook)
"""
#: An audited host, run as a hosts file's command runs it.
AUDITED_HOST = (
    AUDIT
    + """
from p2pdp.experiments.network.host import host_from_stdin
host_from_stdin()
"""
)
#: An audited ``p2pdp`` command line (the arguments after the log file).
AUDITED_CLI = (
    AUDIT
    + """
from p2pdp.experiments.cli import main
sys.exit(main(sys.argv[2:]))
"""
)


def _scenario(tmp_path: Path, *, mode: str = "group", privacy: str = "") -> Path:
    """A scenario on a CSV data set of 240 rows written into ``tmp_path``."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 3))
    y = (X @ np.array([1.0, -0.5, 0.25]) + 0.5 * rng.normal(size=240) > 0).astype(int)
    data = tmp_path / "data.csv"
    np.savetxt(data, np.column_stack([X, y]), delimiter=",", fmt="%.17g")
    scenario = tmp_path / "per-host.toml"
    scenario.write_text(SCENARIO.format(path=data, mode=mode, privacy=privacy))
    return scenario


def _split(scenario: Path, out: Path, hosts: int = 2) -> list[Path]:
    assert cli(["split", str(scenario), "--hosts", str(hosts), "--out", str(out)]) == 0
    return [out / f"host-{host}.json" for host in range(hosts)]


def _hosts_file(
    tmp_path: Path, manifests: list[Path], logs: list[Path], *, score: bool = True
) -> Path:
    """A hosts file whose hosts run audited, with no data home (they could load no data set
    by name) and each its own manifest as ``data``; ``score = false`` unless ``score``."""
    entries = []
    for manifest, log in zip(manifests, logs, strict=True):
        command = ["env", f"P2PDP_DATA_HOME={tmp_path / 'no-data-here'}", sys.executable, "-c",
                   AUDITED_HOST, str(log)]  # fmt: skip
        entries.append(
            f'[[host]]\naddress = "127.0.0.1"\ncommand = {json.dumps(command)}\n'
            f"data = {json.dumps(str(manifest))}\n"
        )
    hosts = tmp_path / ("hosts.toml" if score else "hosts-unscored.toml")
    head = 'coordinator = "127.0.0.1"\n' + ("" if score else "score = false\n")
    hosts.write_text(head + "".join(entries))
    return hosts


def _seeded(config):
    return dataclasses.replace(
        config, network=dataclasses.replace(config.network, seeded_noise=True)
    )


def _same_rows(simulated, network):
    a, b = simulated.row(), network.row()
    assert b["network.seeded_noise"] is True
    for key in a.keys() - TIMING - {"network.seeded_noise"}:
        if key.startswith("network."):
            continue
        if isinstance(a[key], float):
            assert b[key] == pytest.approx(a[key], rel=1e-9, nan_ok=True), key
        else:
            assert a[key] == b[key], (key, a[key], b[key])
    # each release's noise, measured against the simulator's statistics: the hosts' own models
    # (trained from their shard files) are the simulator's
    assert len(simulated.releases) == len(network.releases) > 0
    for x, y in zip(simulated.releases, network.releases, strict=True):
        assert (x["group"], x["curator"]) == (y["group"], y["curator"])
        assert y["noise_norm"] == pytest.approx(x["noise_norm"], rel=1e-6)


def test_split_writes_each_host_exactly_the_rows_the_simulator_gives_its_peers(tmp_path):
    scenario = _scenario(tmp_path)
    manifests = _split(scenario, tmp_path / "shards", hosts=3)
    config = load_scenario(str(scenario)).points[0].config
    seen = []
    for fold in (0, 1):
        for repetition in (0, 1):
            trained = prepare_peers(config, fold=fold, repetition=repetition)
            for host, manifest in enumerate(manifests):
                rows = read_host_shards(
                    manifest, config, host=host, hosts=3, fold=fold, repetition=repetition
                )
                seen.extend(rows.peers.tolist())
                for peer, shard in zip(rows.peers, rows.shards, strict=True):
                    expected = trained.shards[peer]
                    np.testing.assert_array_equal(rows.y[shard], trained.fold.y_train[expected])
                    np.testing.assert_allclose(
                        rows.X[shard], trained.fold.X_train[expected], rtol=0, atol=1e-15
                    )
    assert sorted(seen) == sorted(list(range(8)) * 4)  # every peer once per fold and repetition
    manifest = json.loads(manifests[1].read_text())
    assert manifest["peers"] == [3, 4, 5] and manifest["folds"] == [0, 1]
    assert manifest["scenario"] == "per-host" and manifest["repetitions"] == 2


#: Secure aggregation (splittable noise, a public shard-size bound), as a scenario's lines.
SECURE = 'secure_aggregation = true\nmechanism = "coordinate-laplace"\nmin_shard_size = 20'


@pytest.mark.parametrize(("mode", "privacy"), [("group", ""), ("full", SECURE)])
def test_hosts_given_only_their_shards_give_the_simulators_rows_and_open_nothing_else(
    tmp_path, monkeypatch, mode, privacy
):
    """Each host reads only its own manifest and shard file (audit hook on ``open`` in the
    host process): never the data set, never the other host's files; the rows (seeded
    noise) are the simulator's, fold 1 of repetition 1."""
    scenario = _scenario(tmp_path, mode=mode, privacy=privacy)
    manifests = _split(scenario, tmp_path / "shards")
    logs = [tmp_path / f"opened-{host}.txt" for host in range(2)]
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(_hosts_file(tmp_path, manifests, logs)))
    config = load_scenario(str(scenario)).points[0].config
    network = simulate(_seeded(config), runtime="network", fold=1, repetition=1)
    assert network.aggregations > 0
    _same_rows(simulate(config, fold=1, repetition=1), network)
    data_set = str(tmp_path / "data.csv")
    for host, log in enumerate(logs):
        opened = set(log.read_text().split())
        own = {str(manifests[host]), str(manifests[host].with_suffix(".npz"))}
        assert own <= opened  # the hook saw the host read its data
        others = {path for path in opened if path.startswith(str(tmp_path / "shards"))} - own
        assert others == set() and data_set not in opened, host


#: What the protocol itself produces: a run whose coordinator holds no data fills these
#: exactly as a scored run does.
PROTOCOL_COLUMNS = (
    "aggregations",
    "aborted_groups",
    "affordable_aggregations",
    "mean_aggregations_per_peer",
    "max_epsilon_spent",
    "max_guaranteed_epsilon",
    "messages_sent",
    "bytes_sent",
    "messages_lost",
    "messages_refused",
    "hosts_lost",
    "stop_reason",
    "data_dependent_bounds",
    "guaranteed_epsilon_per_aggregation",
    "guaranteed_delta_per_aggregation",
    "guarantee",
    "neighbouring_relation",
)
#: The releases' public columns (and the peers' charges), equal in both modes.
RELEASE_COLUMNS = ("group", "curator", "group_size", "n_min", "sensitivity", "mechanism",
                   "epsilon", "delta", "noise_scale", "noise_std", "secure")  # fmt: skip
PEER_COLUMNS = ("peer", "aggregations", "epsilon_spent", "guaranteed_epsilon")


def _same_text(text: str, value) -> bool:
    """A CSV cell ``text`` holds ``value`` (numbers to 1e-9 relative: SIMD kernels)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        return text == str(value)
    return float(text) == pytest.approx(float(value), rel=1e-9, nan_ok=True)


def _table(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


@pytest.mark.parametrize(("mode", "privacy"), [("group", ""), ("full", SECURE)])
def test_a_coordinator_without_data_opens_none_and_fills_what_the_protocol_produced(
    tmp_path, monkeypatch, mode, privacy
):
    """``score = false``: ``p2pdp run`` (audit hook on ``open`` in the coordinator's process,
    no data home) never opens the data set nor a shard file, completes, leaves every score
    empty with the reason in ``score_note``, and fills the protocol's columns, releases and
    charges as the scored run of the same hosts does (seeded noise: the same releases); its
    report says once why it draws no error figure."""
    scenario = _scenario(tmp_path, mode=mode, privacy=privacy)
    shards = tmp_path / "shards"
    manifests = _split(scenario, shards)
    logs = [tmp_path / f"opened-{host}.txt" for host in range(2)]
    unscored_hosts = _hosts_file(tmp_path, manifests, logs, score=False)
    opened, out = tmp_path / "opened-by-coordinator.txt", tmp_path / "out"
    one_cell = ["--set", "evaluation.folds=[1]", "--set", "repetitions=1"]
    run = [sys.executable, "-c", AUDITED_CLI, str(opened), "run", str(scenario), "--runtime",
           "network", "--hosts", str(unscored_hosts), "--out", str(out), "--set",
           "network.seeded_noise=true", *one_cell]  # fmt: skip
    environment = {**os.environ, "P2PDP_DATA_HOME": str(tmp_path / "no-data-here")}
    done = subprocess.run(run, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    paths = set(opened.read_text().split())
    assert str(out / "results.csv") in paths  # the hook saw the coordinator write its results
    data_set = str(tmp_path / "data.csv")
    assert data_set not in paths and not any(p.startswith(str(shards)) for p in paths)
    (row,) = _table(out / "results.csv")

    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(_hosts_file(tmp_path, manifests, logs)))
    config = _seeded(load_scenario(str(scenario)).points[0].config)
    scored = simulate(config, runtime="network", fold=1, repetition=0)
    expected = scored.row()
    assert expected["score_note"] == "" and row["score_note"] == UNSCORED
    assert int(row["aggregations"]) > 0
    for column in PROTOCOL_COLUMNS:
        assert _same_text(row[column], expected[column]), (column, row[column], expected[column])
    columns = make_task(config).score_columns()
    assert set(columns) == set(scored.evaluation.summary())  # every score the task gives
    for column in columns:  # scored (but the posterior sampler's diagnostics), or empty
        assert row[column] == "nan", column
        assert column.startswith("posterior_") or not math.isnan(expected[column]), column

    releases = _table(out / "releases.csv")
    assert len(releases) == len(scored.releases)
    secure = bool(privacy)
    for got, want in zip(releases, scored.release_rows(), strict=True):
        for column in RELEASE_COLUMNS:
            assert _same_text(got[column], want[column]), (column, got[column], want[column])
        # a curator reports its seeded noise's norm; a secure release's nobody knows here
        if secure:
            assert got["noise_norm"] == "nan"
        else:
            assert _same_text(got["noise_norm"], want["noise_norm"])
    peers = _table(out / "peers.csv")
    for got, want in zip(peers, scored.peer_table(), strict=True):
        assert got["shard_size"] == "nan" and "error" not in got
        for column in PEER_COLUMNS:
            assert _same_text(got[column], want[column]), (column, got[column], want[column])

    wire = [(r["kind"], int(r["frames"]), int(r["wire_bytes"])) for r in _table(out / "wire.csv")]
    assert wire == [(r["kind"], r["frames"], r["wire_bytes"]) for r in scored.wire_rows()]

    report = (out / "report.md").read_text()
    assert report.count("## Not scored") == 1 and report.count(UNSCORED) == 1
    assert "Error vs group size, Error vs privacy budget" in report
    assert not list(out.glob("error_vs_*.png")) and not list(out.glob("roc_*.png"))


def test_score_false_is_refused_without_every_hosts_data_or_if_not_a_bool(tmp_path):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('coordinator = "c"\nscore = false\n[[host]]\naddress = "a"\n')
    with pytest.raises(ConfigError, match=r"hosts.toml: score = false needs every host's data"):
        read_hosts_file(hosts)
    hosts.write_text('coordinator = "c"\nscore = "no"\n[[host]]\naddress = "a"\ndata = "d"\n')
    with pytest.raises(ConfigError, match=r"score must be true or false, got 'no'"):
        read_hosts_file(hosts)
    hosts.write_text('coordinator = "c"\nscore = false\n[[host]]\naddress = "a"\ndata = "d"\n')
    assert read_hosts_file(hosts).score is False


def test_a_host_checks_its_own_shard_sizes_when_the_coordinator_holds_none(
    tmp_path, monkeypatch, capfd
):
    """``privacy.min_shard_size`` above a peer's rows: with ``score = false`` nobody else can
    refuse it before the run, so the host does, naming the setting and its peer."""
    scenario = _scenario(tmp_path, privacy="min_shard_size = 21")
    manifests = _split(scenario, tmp_path / "shards")
    logs = [tmp_path / f"opened-{host}.txt" for host in range(2)]
    monkeypatch.setenv(
        "P2PDP_NETWORK_HOSTS", str(_hosts_file(tmp_path, manifests, logs, score=False))
    )
    config = load_scenario(str(scenario)).points[0].config
    with pytest.raises(NetworkRunError, match=r"(?s)host \d .* stopped with the error above"):
        simulate(config, runtime="network")
    err = capfd.readouterr().err  # the first host to fail (the run then stops the other)
    assert re.search(r"privacy.min_shard_size = 21, but peer [04] holds 20 records", err)
    assert "Traceback" not in err


def test_hosts_whose_statistics_differ_in_length_fail_the_run_naming_each():
    """A coordinator without data learns the length from the hellos: all must agree (else no
    ledger, no run); one with data checks theirs against its own."""
    config = load_scenario("quickstart").points[0].config
    made = []

    def ledger(dim):
        made.append(dim)
        return BudgetLedger(4, epsilon_total=1.0, epsilon_per_aggregation=0.25)

    def world(dim):
        return NetworkWorld(config, n_peers=4, dim=dim, ledger=ledger,
                            rngs={"protocol": np.random.default_rng(0)}, launch=None, hosts=2,
                            settings=HostSettings(n_peers=4, hosts=2, full_publication=False),
                            authority=Authority(2))  # fmt: skip

    unscored = world(None)
    unscored._dims = {0: 4, 1: 5}
    with pytest.raises(NetworkRunError, match=r"differ in length \(host 0: 4, host 1: 5\)"):
        unscored._agreed_dimension()
    assert made == []  # no ledger for a length the hosts do not agree on
    unscored._dims = {0: 5, 1: 5}
    unscored._agreed_dimension()
    assert unscored.dim == 5 and made == [5]
    scored = world(4)
    scored._dims = {0: 5, 1: 5}
    with pytest.raises(NetworkRunError, match=r"host 1: 5\) \(the coordinator's: 4\)"):
        scored._agreed_dimension()


def test_a_host_given_another_hosts_data_fails_the_run_naming_the_file_and_field(
    tmp_path, monkeypatch, capfd
):
    scenario = _scenario(tmp_path)
    manifests = _split(scenario, tmp_path / "shards")
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\n'
        + "".join(f'[[host]]\naddress = "127.0.0.1"\ndata = "{m}"\n' for m in manifests[::-1])
    )
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    config = load_scenario(str(scenario)).points[0].config
    with pytest.raises(NetworkRunError, match=r"host \d .* stopped with the error above"):
        simulate(config, runtime="network")
    err = capfd.readouterr().err
    # both hosts hold the other's data: whichever fails first stops the run (a race)
    assert any(
        f"p2pdp host {i}: shard manifest {manifests[1 - i]}: host = {1 - i}, expected {i}" in err
        for i in (0, 1)
    ), err
    assert "Traceback" not in err


def test_shards_split_for_another_peer_count_say_to_rerun_split_in_one_line(tmp_path, capfd):
    """Shard files split for 8 peers, a run of 12: each host's one line names both counts
    and says to rerun ``p2pdp split`` (it printed two SHA-256 keys), and the run's own line
    points at it, without the advice about the main guard; no traceback."""
    scenario = _scenario(tmp_path)
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "127.0.0.1"\n'
        + "".join(
            f'[[host]]\naddress = "127.0.0.1"\ndata = "{m}"\n'
            for m in _split(scenario, tmp_path / "shards")
        )
    )
    capfd.readouterr()
    argv = ["run", str(scenario), "--out", str(tmp_path / "out"), "--runtime", "network",
            "--hosts", str(hosts), "--set", "partition.n_peers=12"]  # fmt: skip
    assert cli(argv) == 2
    err = capfd.readouterr().err
    assert re.search(
        r"p2pdp host \d: shard manifest .*host-\d.json: split for partition.n_peers = 8, this "
        r"run has 12: rerun `p2pdp split SCENARIO --hosts N --out DIR`",
        err,
    ), err
    (line,) = [line for line in err.splitlines() if line.startswith("p2pdp: error:")]
    assert line.endswith("stopped with the error above while waiting for every host to start")
    assert "Traceback" not in err and "__main__" not in err


def test_split_into_an_existing_file_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "taken"
    out.write_text("not a directory")
    assert cli(["split", str(_scenario(tmp_path)), "--hosts", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"p2pdp: error: --out {out} is a file, not a folder")
    assert out.read_text() == "not a directory"


def _tamper(manifest: Path, **changes) -> None:
    document = json.loads(manifest.read_text())
    document.update(changes)
    manifest.write_text(json.dumps(document))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: m.unlink(), r"shard manifest .*host-0.json: cannot be read: .*No such file"),
        (lambda m: m.with_suffix(".npz").unlink(), r"host-0.json: file .*host-0.npz: .*No such"),
        (lambda m: m.write_text("[1]"), "must be a JSON object"),
        (lambda m: _tamper(m, version=2), "version = 2, expected 1"),
        (lambda m: _tamper(m, hosts=3), "hosts = 3, expected 2"),
        (lambda m: _tamper(m, peers=[0, 1, 2]), r"peers = \[0, 1, 2\], expected \[0, 1, 2, 3\]"),
        (lambda m: _tamper(m, shard_key="0" * 64), "shard_key = '0000.*seed, data and partition"),
        (lambda m: _tamper(m, file="../host-1.npz"), "file = '../host-1.npz', expected the name"),
        (lambda m: m.with_suffix(".npz").write_bytes(b"x"), r"sha256 = .*the SHA-256 of .*npz"),
    ],
)
def test_a_shard_file_that_is_not_this_hosts_is_refused_naming_file_and_field(
    tmp_path, damage, message
):
    scenario = _scenario(tmp_path)
    manifest = _split(scenario, tmp_path / "shards")[0]
    config = load_scenario(str(scenario)).points[0].config
    read_host_shards(manifest, config, host=0, hosts=2, fold=0, repetition=0)  # as written
    damage(manifest)
    with pytest.raises(ConfigError, match=message):
        read_host_shards(manifest, config, host=0, hosts=2, fold=0, repetition=0)


def test_a_shard_file_refuses_another_scenario_or_a_fold_it_does_not_hold(tmp_path):
    scenario = _scenario(tmp_path)
    manifest = _split(scenario, tmp_path / "shards")[0]
    config = load_scenario(str(scenario)).points[0].config
    other = dataclasses.replace(config, seed=6)
    with pytest.raises(ConfigError, match=r"host-0.json: shard_key = .*expected"):
        read_host_shards(manifest, other, host=0, hosts=2, fold=0, repetition=0)
    with pytest.raises(ConfigError, match=r"host-0.npz: holds no X_2_1, the rows of fold 2 of rep"):
        read_host_shards(manifest, config, host=0, hosts=2, fold=2, repetition=1)


def test_split_refuses_grids_whose_peers_hold_different_rows_and_bad_host_counts(tmp_path, capsys):
    scenario = str(_scenario(tmp_path))
    out = str(tmp_path / "out")
    sweep = ["--set", 'sweep."partition.n_peers"=[4,8]']
    assert cli(["split", scenario, "--hosts", "2", "--out", out, *sweep]) == 2
    assert "grid points differ in partition" in capsys.readouterr().err
    assert cli(["split", scenario, "--hosts", "9", "--out", out]) == 2
    assert "--hosts gives 9 hosts for partition.n_peers = 8" in capsys.readouterr().err
    assert cli(["split", scenario, "--hosts", "no-such-file", "--out", out]) == 2
    assert "give the number of hosts or an existing hosts file" in capsys.readouterr().err
    # a hosts file gives the count; a grid that differs elsewhere shares one set of files
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('coordinator = "127.0.0.1"\n' + '[[host]]\naddress = "127.0.0.1"\n' * 3)
    lam = ["--set", 'sweep."training.lambda"=[0.01,0.1]']
    assert cli(["split", scenario, "--hosts", str(hosts), "--out", out, *lam]) == 0
    assert sorted(p.name for p in Path(out).iterdir()) == [
        f"host-{i}.{ext}" for i in range(3) for ext in ("json", "npz")
    ]


def test_a_hosts_file_gives_every_host_its_data_or_none(tmp_path):
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(
        'coordinator = "c"\n[[host]]\naddress = "a"\ndata = "/d/host-0.json"\n'
        '[[host]]\naddress = "b"\n'
    )
    with pytest.raises(ConfigError, match=r"host\[1\].data is missing"):
        read_hosts_file(hosts)
    hosts.write_text('coordinator = "c"\n[[host]]\naddress = "a"\ndata = 3\n')
    with pytest.raises(ConfigError, match=r"host\[0\].data must be a non-empty string, got 3"):
        read_hosts_file(hosts)
    hosts.write_text('coordinator = "c"\n[[host]]\naddress = "a"\ndata = "/d/h.json"\n')
    assert read_hosts_file(hosts).data == ("/d/h.json",)


def test_a_task_that_cannot_prepare_from_own_rows_is_refused_by_name(tmp_path, monkeypatch, capsys):
    """By split, by a network run whose hosts file gives data (before anything starts), and
    by the host itself."""
    assert cli(["split", "prevalence_counts", "--hosts", "2", "--out", str(tmp_path)]) == 2
    refusal = "task.name = 'prevalence-counts' cannot run from per-host shard files"
    assert refusal in capsys.readouterr().err
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('coordinator = "127.0.0.1"\n[[host]]\naddress = "127.0.0.1"\ndata = "x"\n')
    monkeypatch.setenv("P2PDP_NETWORK_HOSTS", str(hosts))
    config = load_scenario("prevalence_counts").points[0].config
    with pytest.raises(ConfigError, match=refusal):
        check_network_settings(config)

    class Counting:
        name = "counting"

    empty = np.zeros((0, 2))
    with pytest.raises(ConfigError, match="task.name = 'counting' cannot run from per-host"):
        prepared_own(Counting(), empty, np.zeros(0), (), data_dependent_bounds=False, fold=0,
                     repetition=0)  # fmt: skip
