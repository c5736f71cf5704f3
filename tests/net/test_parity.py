"""Seeded parity: real OS processes over TCP give the simulator's rows and releases.

With ``network.seeded_noise`` (not private) the network runtime draws the simulator's noise,
so a whole run, its groups in flight and its command line can be compared row for row.
Each run here starts host processes (spawn: a few seconds each), so the runs are small.
"""

from __future__ import annotations

import csv
import dataclasses
import re
import shlex

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.data.settings import PartitionConfig
from p2pdp.experiments.cli import main as cli
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.disclosure import non_private_column
from p2pdp.sim.world import WorldObserver
from p2pdp.tasks import make_task, prepared, release_path, sensitivity_of, task_statistics
from tests.net.helpers import _config, _same_rows, _seeded, _tiny_scenario


class _Releases(WorldObserver):
    """Observer keeping each release's group and record (to compare the two runtimes)."""

    def __init__(self):
        self.groups = []

    def released(self, world, group, record):
        self.groups.append((group.group_id, group.members.tolist(), group.curator, record))

    def aborted(self, world, group, reason):
        raise AssertionError(f"group {group.group_id} aborted: {reason}")


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
