"""Each network host holds only its own data: ``p2pdp split`` and hosts files naming ``data``.

The data set is a CSV file written by each test (no real data set needed); a host given its
shard file must complete the run without ever opening that CSV or another host's files
(recorded by an audit hook on ``open`` in the host process), and give the simulator's rows.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError, NetworkRunError
from p2pdp.experiments.cli import main as cli
from p2pdp.experiments.network import check_network_settings, read_hosts_file
from p2pdp.experiments.scenario import load_scenario
from p2pdp.experiments.shards import read_host_shards
from p2pdp.experiments.simulation import simulate
from p2pdp.tasks import prepared_own
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

#: Records every path the host process opens (``open``, ``os.open``, ``np.load``...) into the
#: file named by its first argument, then runs the host as a hosts file's command does.
AUDITED_HOST = """
import os, sys
log = open(sys.argv[1], "a", buffering=1)
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        log.write(os.path.abspath(os.fsdecode(args[0])) + "\\n")
sys.addaudithook(hook)
from p2pdp.experiments.network import host_from_stdin
host_from_stdin()
"""


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


def _hosts_file(tmp_path: Path, manifests: list[Path], logs: list[Path]) -> Path:
    """A hosts file whose hosts run audited, with no data home (they could load no data set
    by name) and each its own manifest as ``data``."""
    entries = []
    for manifest, log in zip(manifests, logs, strict=True):
        command = ["env", f"P2PDP_DATA_HOME={tmp_path / 'no-data-here'}", sys.executable, "-c",
                   AUDITED_HOST, str(log)]  # fmt: skip
        entries.append(
            f'[[host]]\naddress = "127.0.0.1"\ncommand = {json.dumps(command)}\n'
            f"data = {json.dumps(str(manifest))}\n"
        )
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('coordinator = "127.0.0.1"\n' + "".join(entries))
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
    with pytest.raises(NetworkRunError, match=r"host \d .* exited with status 1"):
        simulate(config, runtime="network")
    err = capfd.readouterr().err
    assert f"p2pdp host 0: shard manifest {manifests[1]}: host = 1, expected 0" in err
    assert "Traceback" not in err


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
