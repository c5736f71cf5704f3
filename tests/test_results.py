"""Results store: crash and resume, refusing foreign folders, manifest, atomic files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from p2pdp import experiment
from p2pdp.errors import ConfigError
from p2pdp.results import (
    ROC_FPR,
    CellRecord,
    ResultsStore,
    read_manifest,
    read_results,
    read_roc,
    roc_on_grid,
)
from p2pdp.scenario import parse_scenario

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
    original, done = experiment.simulate, []

    def dying(*args, **kwargs):
        if len(done) == cells:
            raise Crash("simulated crash")
        done.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(experiment, "simulate", dying)


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
