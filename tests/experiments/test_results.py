"""Results store: crash and resume, refusing foreign folders, manifest, atomic files."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import socket

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.experiments.cli import main
from p2pdp.experiments.results.files import (
    ROC_FPR,
    load,
    read_manifest,
    read_results,
    read_roc,
    roc_on_grid,
)
from p2pdp.experiments.results.lock import FolderInUseError, FolderLock
from p2pdp.experiments.results.store import CellRecord, ResultsStore
from p2pdp.experiments.results.tables import ColumnTable
from p2pdp.experiments.run import cells as run_cells
from p2pdp.experiments.run import runner as experiment
from p2pdp.experiments.scenarios.scenario import parse_scenario

TINY = """
name = "tiny"
seed = 11

[data]
dataset = "synthetic"
synthetic_rows = 300
synthetic_test_rows = 100
synthetic_features = 5

[partition]
n_peers = 8

[groups]
group_size = 4

[evaluation]
cv_folds = 4

[sweep]
"publication.mode" = ["group", "full"]
"""


def without_timing(rows):
    return [{k: v for k, v in row.items() if not k.startswith("wall_")} for row in rows]


class Crash(RuntimeError):
    pass


def crash_after(monkeypatch, cells: int) -> None:
    """Make the in-process backend die when cell number ``cells + 1`` starts simulating."""
    original, done = run_cells.simulate, []

    def dying(*args, **kwargs):
        if len(done) == cells:
            raise Crash("simulated crash")
        done.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(run_cells, "simulate", dying)


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    scenario = parse_scenario(TINY)
    experiment.run_experiment(scenario, tmp_path / "whole", jobs=1)
    whole = without_timing(read_results(tmp_path / "whole"))
    assert len(whole) == 2 * 4

    with monkeypatch.context() as patch:
        crash_after(patch, cells=3)  # in the middle of the second task (fold) of two cells
        with pytest.raises(Crash):
            experiment.run_experiment(scenario, tmp_path / "broken", jobs=1)
    partial = read_results(tmp_path / "broken")
    assert len(partial) == 3  # written cell by cell, not task by task
    manifest = read_manifest(tmp_path / "broken")
    assert (manifest["status"], manifest["error"]) == ("failed", "Crash: simulated crash")

    summary = experiment.run_experiment(scenario, tmp_path / "broken", jobs=1, resume=True)
    assert (summary.run, summary.skipped) == (5, 3)
    assert without_timing(read_results(tmp_path / "broken")) == whole
    assert (tmp_path / "broken" / "roc.csv").read_text() == (
        tmp_path / "whole" / "roc.csv"
    ).read_text()
    manifest = read_manifest(tmp_path / "broken")
    assert manifest["status"] == "complete" and "error" not in manifest
    assert [s["cells_run"] for s in manifest["sessions"]] == [3, 5]


def test_a_line_cut_short_by_a_crash_is_dropped(tmp_path, monkeypatch):
    scenario = parse_scenario(TINY)
    with monkeypatch.context() as patch:
        crash_after(patch, cells=2)
        with pytest.raises(Crash):
            experiment.run_experiment(scenario, tmp_path, jobs=1)
    for name in ("results.csv", "roc.csv"):  # half-written lines, as after a power cut
        with (tmp_path / name).open("a") as file:
            file.write("p9-f9-r9,0.5,0.")
    experiment.run_experiment(scenario, tmp_path, jobs=1, resume=True)
    rows = read_results(tmp_path)
    assert sorted(row["cell_id"] for row in rows) == [
        f"p{p}-f{f}-r0" for p in (0, 1) for f in range(4)
    ]
    assert set(read_roc(tmp_path)) == {row["cell_id"] for row in rows}


def test_foreign_or_finished_folders_are_refused(tmp_path):
    scenario = parse_scenario(TINY, overrides=["evaluation.folds=[0]"])
    experiment.run_experiment(scenario, tmp_path, jobs=1)
    other = parse_scenario(TINY, overrides=["evaluation.folds=[0]", "seed=12"])
    with pytest.raises(ConfigError, match="already holds results of this scenario; use --resume"):
        experiment.run_experiment(scenario, tmp_path, jobs=1)
    for resume in (False, True):
        with pytest.raises(ConfigError, match="different scenario .*'tiny'.*--force"):
            experiment.run_experiment(other, tmp_path, jobs=1, resume=resume)
    experiment.run_experiment(other, tmp_path, jobs=1, force=True)
    assert read_manifest(tmp_path)["scenario_hash"] == other.digest
    assert {row["seed"] for row in read_results(tmp_path)} == {"12"}


def test_results_without_a_manifest_are_refused(tmp_path):
    (tmp_path / "results.csv").write_text("cell_id\nx\n")
    with pytest.raises(ConfigError, match="without a manifest.json"):
        experiment.run_experiment(parse_scenario(TINY), tmp_path, jobs=1, resume=True)


def test_manifest_records_the_run(tmp_path):
    scenario = parse_scenario(TINY, overrides=["evaluation.folds=[1]"])
    experiment.run_experiment(scenario, tmp_path, jobs=1)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["scenario_text"] == TINY
    assert manifest["overrides"] == ["evaluation.folds=[1]"]
    assert manifest["scenario_hash"] == scenario.digest and manifest["cells"] == 2
    for package in ("p2pdp", "numpy", "scipy", "simpy", "scikit-learn"):
        assert manifest["versions"][package]
    assert manifest["python"].count(".") == 2
    assert manifest["started"] <= manifest["finished"]
    assert manifest["sweep"] == [{"keys": ["publication.mode"], "values": [["group"], ["full"]]}]
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_rows_hold_config_seed_fold_repetition_and_timing(tmp_path):
    experiment.run_experiment(
        parse_scenario(TINY, overrides=["evaluation.folds=[2]"]), tmp_path, jobs=1
    )
    row = read_results(tmp_path)[0]
    assert row["cell_id"] == "p0-f2-r0" and row["point"] == "0"
    assert (row["seed"], row["fold"], row["repetition"]) == ("11", "2", "0")
    assert row["publication.mode"] == "group" and row["partition.n_peers"] == "8"
    assert float(row["wall_cell_s"]) > 0 and float(row["wall_prepare_s"]) > 0


def test_appending_different_columns_fails(tmp_path):
    scenario = parse_scenario(TINY)
    store = ResultsStore.open(tmp_path, scenario, n_cells=2, backend="test")
    tpr = np.linspace(0, 1, len(ROC_FPR))
    store.append([CellRecord(cell_id="a", row={"cell_id": "a", "x": 1}, roc_tpr=tpr)])
    with pytest.raises(ConfigError, match="has columns"):
        store.append([CellRecord(cell_id="b", row={"cell_id": "b", "y": 1}, roc_tpr=tpr)])


def test_roc_on_grid_interpolates_the_curve():
    fpr, tpr = np.array([0.0, 0.0, 0.5, 1.0]), np.array([0.0, 0.6, 0.8, 1.0])
    sampled = roc_on_grid(fpr, tpr)
    assert sampled.shape == ROC_FPR.shape
    assert sampled[0] == pytest.approx(0.6)  # the vertical start takes its top point
    assert sampled[25] == pytest.approx(0.7)  # halfway between (0, 0.6) and (0.5, 0.8)
    assert sampled[-1] == 1.0


# --- failed runs ------------------------------------------------------------------------------
def test_a_run_that_recorded_no_cell_does_not_block_the_same_command(tmp_path, monkeypatch):
    scenario = parse_scenario(TINY)
    with monkeypatch.context() as patch:
        crash_after(patch, cells=0)
        with pytest.raises(Crash):
            experiment.run_experiment(scenario, tmp_path, jobs=1)
    manifest = read_manifest(tmp_path)
    assert (manifest["status"], manifest["error"]) == ("failed", "Crash: simulated crash")
    assert manifest["sessions"][0]["cells_run"] == 0
    experiment.run_experiment(scenario, tmp_path, jobs=1)  # no --resume needed
    assert len(read_results(tmp_path)) == 8
    assert read_manifest(tmp_path)["status"] == "complete"


def test_a_stale_running_manifest_without_cells_does_not_block(tmp_path):
    """A run killed (-9) before its first cell leaves a 'running' manifest and no rows."""
    scenario = parse_scenario(TINY, overrides=["evaluation.folds=[0]"])
    store = ResultsStore.open(tmp_path, scenario, n_cells=2, backend="test")
    store.lock.release()  # as if the process had died
    assert read_manifest(tmp_path)["status"] == "running"
    with (tmp_path / "manifest.json").open("a") as file:
        file.write("{ cut short")  # even a damaged manifest: no cell, nothing to protect
    other = parse_scenario(TINY, overrides=["evaluation.folds=[1]"])
    experiment.run_experiment(other, tmp_path, jobs=1)  # nothing to lose: any scenario may start
    assert [row["cell_id"] for row in read_results(tmp_path)] == ["p0-f1-r0", "p1-f1-r0"]


def test_a_run_time_error_leaves_a_failed_manifest_and_a_clean_retry(tmp_path, capsys):
    scenario_file = tmp_path / "tiny.toml"
    scenario_file.write_text(TINY)
    out = tmp_path / "out"
    argv = ["run", str(scenario_file), "--out", str(out), "--jobs", "1"]
    assert main([*argv, "--set", "partition.n_peers=1000"]) == 2  # more peers than rows
    error = capsys.readouterr().err.strip()
    assert error.startswith("p2pdp: error: ") and "\n" not in error and "n_peers" in error
    manifest = read_manifest(out)
    assert manifest["status"] == "failed" and "n_peers" in manifest["error"]
    assert main([*argv, "--set", "evaluation.folds=[0]"]) == 0  # the fixed command just runs


def test_a_failed_run_with_cells_asks_for_resume(tmp_path, monkeypatch):
    scenario = parse_scenario(TINY)
    with monkeypatch.context() as patch:
        crash_after(patch, cells=1)
        with pytest.raises(Crash):
            experiment.run_experiment(scenario, tmp_path, jobs=1)
    with pytest.raises(ConfigError, match="use --resume to finish it"):
        experiment.run_experiment(scenario, tmp_path, jobs=1)
    assert len(read_results(tmp_path)) == 1


# --- the lock ---------------------------------------------------------------------------------
def test_the_lock_names_its_holder_and_is_exclusive(tmp_path):
    lock = FolderLock(tmp_path, purpose="p2pdp run").acquire()
    info = json.loads((tmp_path / ".p2pdp.lock.json").read_text())
    assert (info["pid"], info["host"], info["purpose"]) == (
        os.getpid(),
        socket.gethostname(),
        "p2pdp run",
    )
    assert info["started"].startswith("20")
    with pytest.raises(FolderInUseError, match=f"in use by p2pdp run \\(pid {os.getpid()} on "):
        FolderLock(tmp_path, purpose="p2pdp report").acquire()
    with pytest.raises(FolderInUseError):
        experiment.run_experiment(parse_scenario(TINY), tmp_path, jobs=1)
    assert not (tmp_path / "manifest.json").exists()  # refused before anything was written
    lock.release()
    assert not (tmp_path / ".p2pdp.lock.json").exists()
    with FolderLock(tmp_path, purpose="p2pdp report") as again:
        assert again.previous is None  # a clean release leaves nothing to take over


# --- extra per-cell tables --------------------------------------------------------------------
def record(cell_id: str, releases: int) -> CellRecord:
    return CellRecord(
        cell_id=cell_id,
        row={"cell_id": cell_id, "x": 1},
        roc_tpr=np.linspace(0, 1, len(ROC_FPR)),
        tables={
            "releases": [{"release": i, "noise": 0.5 * i} for i in range(releases)],
            "peers": [{"peer": p, "epsilon_spent": 0.1} for p in range(2)],
        },
    )


def test_extra_tables_are_written_repaired_sorted_and_loaded(tmp_path):
    scenario = parse_scenario(TINY)
    with ResultsStore.open(tmp_path, scenario, n_cells=4, backend="test") as store:
        store.append([record("c2", 2), record("c0", 1)])
    # a crash while cell c3 was being written: its table rows, no results row, a cut line
    with (tmp_path / "peers.csv").open("a") as file:
        file.write("c3,0,0.1\nc3,1,0.1\n")
    with (tmp_path / "releases.csv").open("a") as file:
        file.write("c3,0,0.0\nc3,1,0.")
    assert read_manifest(tmp_path)["tables"] == ["releases", "peers"]

    frames = load(tmp_path)  # readable at any time: finished cells only
    assert set(frames) == {"results", "releases", "peers", "roc"}
    assert list(frames["releases"].columns) == ["cell_id", "release", "noise"]
    assert sorted(frames["releases"]["cell_id"]) == ["c0", "c2", "c2"]
    assert sorted(frames["peers"]["cell_id"]) == ["c0", "c0", "c2", "c2"]

    store = ResultsStore.open(tmp_path, scenario, n_cells=4, backend="test", resume=True)
    assert store.done == {"c0", "c2"}
    assert "c3" not in (tmp_path / "peers.csv").read_text()  # repaired on resume
    store.append([record("c1", 3)])
    store.finish()
    frames = load(tmp_path)
    assert frames["results"]["cell_id"].tolist() == ["c0", "c1", "c2"]
    assert frames["releases"]["cell_id"].tolist() == ["c0", "c1", "c1", "c1", "c2", "c2"]
    assert frames["releases"]["noise"].tolist() == [0.0, 0.0, 0.5, 1.0, 0.0, 0.5]
    assert frames["peers"]["cell_id"].tolist() == ["c0", "c0", "c1", "c1", "c2", "c2"]

    # --force discards them; a fresh run starts its tables afresh
    store = ResultsStore.open(tmp_path, scenario, n_cells=4, backend="test", force=True)
    assert not (tmp_path / "releases.csv").exists()
    (tmp_path / "releases.csv").write_text("cell_id,release,noise\nold,0,0.0\n")  # a leftover
    store.append([record("c0", 1)])
    store.finish()
    assert load(tmp_path)["releases"]["cell_id"].tolist() == ["c0"]


def test_a_folder_without_orphan_rows_is_repaired_without_reading_its_tables_whole(
    tmp_path, monkeypatch
):
    """The report repairs a folder before it reads it: a 10^7-peer run's release log (1.5 GB,
    ten million rows) read whole into rows took the report past 16 GiB. Only a table with rows
    of an unfinished cell is now read whole (to rewrite it); the others are streamed, and a
    damaged one is still refused with its line."""
    from p2pdp.experiments.results import files

    scenario = parse_scenario(TINY)
    with ResultsStore.open(tmp_path, scenario, n_cells=4, backend="test") as store:
        store.append([record("c2", 2), record("c0", 1)])
    read = []
    read_rows = files._read_rows
    monkeypatch.setattr(files, "_read_rows", lambda path: read.append(path.name) or read_rows(path))
    assert files.repair(tmp_path) == {"c0", "c2"}
    assert read == ["results.csv"]  # the finished cells' ids; no table read whole
    with (tmp_path / "peers.csv").open("a") as file:
        file.write("c3,0,0.1\n")  # a crash's orphan row: that table is read and rewritten
    assert files.repair(tmp_path) == {"c0", "c2"}
    assert (
        read[1:] == ["results.csv", "peers.csv"]
        and "c3" not in (tmp_path / "peers.csv").read_text()
    )
    # a table's rows lost (streamed) or its last line cut (read whole): the cell is incomplete
    peers = (tmp_path / "peers.csv").read_text()
    lines = peers.splitlines(keepends=True)
    last = lines[-1].split(",")[0]
    (tmp_path / "peers.csv").write_text("".join(lines[:-1]))
    assert files.incomplete_cells(tmp_path) == {last: ["peers.csv"]}
    (tmp_path / "peers.csv").write_text("".join(lines[:-1]) + lines[-1][:4])
    assert files.incomplete_cells(tmp_path) == {last: ["peers.csv"]}
    (tmp_path / "peers.csv").write_text(peers)
    assert files.incomplete_cells(tmp_path) == {}
    with (tmp_path / "releases.csv").open("a") as file:
        file.write("c2,9\n")  # one field short
    with pytest.raises(ConfigError, match=r"releases.csv, line \d+: 2 fields, the header has 3"):
        files.repair(tmp_path)


def test_bad_table_names_and_rows_are_refused(tmp_path):
    store = ResultsStore.open(tmp_path, parse_scenario(TINY), n_cells=1, backend="test")
    tpr = np.linspace(0, 1, len(ROC_FPR))
    with store:
        for tables, message in (
            ({"results": [{"a": 1}]}, "table name 'results'"),
            ({"Bad-Name": [{"a": 1}]}, "table name 'Bad-Name'"),
            ({"peers": [{"a": 1}, {"b": 2}]}, "a row has columns \\['b'\\]"),
        ):
            with pytest.raises(ConfigError, match=message):
                cell = CellRecord(cell_id="a", row={"cell_id": "a"}, roc_tpr=tpr, tables=tables)
                store.append([cell])


def test_a_column_table_is_written_as_its_rows_would_be(tmp_path):
    """The same bytes as csv.writer on the rows as dicts, whatever the values: floats (-0.0
    and 0.0, NaN, inf, equal to an int), ints beyond int64, bools, strings that need quoting,
    None, numpy scalars, columns mixing them and columns of one object."""
    rng = np.random.default_rng(3)
    n = 200  # long enough that repeated floats share their text
    floats = rng.choice([0.1, -0.0, 0.0, 1.0, 1e-300, math.inf, -math.inf, math.nan, 2.5], n)
    columns = {
        "float": floats.tolist(),  # repeated values, each printed from its own bits
        "noise": rng.standard_normal(n).tolist(),  # all distinct
        "few": rng.choice([0.1, 2.5, math.nan, math.inf, 1e-300], n).tolist(),  # no zero
        "int": rng.integers(-3, 3, n).tolist(),
        "big": [2**70 + i for i in range(n)],
        "flag": [bool(b) for b in rng.integers(0, 2, n)],
        "text": [["a", "", "b,c", 'say "x"', "two\nlines"][i % 5] for i in range(n)],
        "mixed": [[1, 1.0, True, None, np.float64(0.5), np.int64(2), "1"][i % 7] for i in range(n)],
        "same": [0.0078125] * n,
    }
    table = ColumnTable(columns)
    rows = [dict(zip(columns, v, strict=True)) for v in zip(*columns.values(), strict=True)]
    assert len(table) == n and table == rows and table[3] == rows[3] and table[-2:] == rows[-2:]
    expected = io.StringIO()
    csv.writer(expected, lineterminator="\n").writerows([("c 1", *row.values()) for row in rows])
    assert table.csv_text("c 1") == expected.getvalue()
    # through the store: the file holds those lines under the header
    scenario = parse_scenario(TINY)
    with ResultsStore.open(tmp_path, scenario, n_cells=1, backend="test") as store:
        store.append([CellRecord(cell_id="c 1", row={"x": 1}, roc_tpr=None, tables={"t": table})])
        store.finish()
    assert (tmp_path / "t.csv").read_text() == "cell_id," + ",".join(columns) + "\n" + (
        expected.getvalue()
    )
    with pytest.raises(ValueError, match="different lengths"):
        ColumnTable({"a": [1, 2], "b": [1]})
