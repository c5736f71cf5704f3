"""`p2pdp run` and `report` under attack: signals, kill -9, a second writer, bad paths, damage.

The signal tests run ``python -m p2pdp.experiments.cli`` as a subprocess on a small synthetic
scenario
and poll for files with generous timeouts (the machine may be loaded), never fixed sleeps.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.experiments.cli import main
from p2pdp.experiments.report.write import write_report
from p2pdp.experiments.results.files import read_manifest, read_results
from p2pdp.experiments.results.lock import FolderInUseError
from p2pdp.experiments.results.store import ResultsStore
from p2pdp.experiments.run import runner as experiment
from p2pdp.experiments.scenarios.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
PNG_END = b"IEND\xaeB`\x82"  # the last chunk of every complete PNG file
TIMEOUT_S = 120.0

#: 2 folds x 8 grid points; the cells of a fold share one training (one task per fold).
SCENARIO = """
name = "safety"
seed = 3

[data]
dataset = "synthetic"
synthetic_rows = 1200
synthetic_test_rows = 600
synthetic_features = 8

[partition]
n_peers = 60

[privacy]
epsilon = 10.0
epsilon_per_aggregation = 1.0

[evaluation]
cv_folds = 2

[sweep]
"groups.group_size" = [2, 3, 4, 5]
"publication.mode" = ["group", "full"]
"""
CELLS = 16
ONE_FOLD = ("--set", "evaluation.folds=[0]")  # 8 cells, one training

needs_proc = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="finding worker processes needs Linux /proc"
)


@pytest.fixture
def scenario_file(tmp_path):
    path = tmp_path / "safety.toml"
    path.write_text(SCENARIO)
    return path


def cli(*args: str) -> subprocess.Popen:
    """Start ``python -m p2pdp.experiments.cli ARGS`` with this checkout first on the path."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "p2pdp.experiments.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": path, "MPLBACKEND": "Agg"},
    )


def wait_for(condition, what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"process ended ({process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def rows_in(out: Path) -> int:
    """Complete data lines of OUT/results.csv (0 if none yet)."""
    try:
        return max(0, (out / "results.csv").read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def children(pid: int) -> list[int]:
    """Pids of the live child processes of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def without_timing(rows):
    return [{k: v for k, v in row.items() if not k.startswith("wall_")} for row in rows]


def one_error_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("p2pdp: error: "), text
    assert "Traceback" not in text
    return lines[0]


# --- signals and kills ------------------------------------------------------------------------
@needs_proc
def test_sigterm_stops_the_workers_and_the_run_resumes(tmp_path, scenario_file):
    out = tmp_path / "out"
    run = cli("run", str(scenario_file), "--out", str(out), "--jobs", "2", *ONE_FOLD)
    wait_for(lambda: rows_in(out) >= 1, "the first cell", run)
    workers = children(run.pid)  # one training split into two tasks, one per worker
    assert len(workers) >= 2
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=TIMEOUT_S)
    assert run.returncode == 143, err  # 128 + SIGTERM, like Ctrl-C's 130
    assert "interrupted by SIGTERM" in err
    assert f"p2pdp run {scenario_file} --out {out} --set 'evaluation.folds=[0]' --resume" in err
    assert "Traceback" not in err
    wait_for(lambda: not any(alive(pid) for pid in workers), "the workers to end")
    manifest = read_manifest(out)
    assert (manifest["status"], manifest["error"]) == ("interrupted", "interrupted by SIGTERM")
    kept = rows_in(out)
    assert 1 <= kept < CELLS // 2

    scenario = load_scenario(scenario_file, [ONE_FOLD[1]])
    summary = experiment.run_experiment(scenario, out, jobs=1, resume=True)
    assert (summary.run, summary.skipped) == (CELLS // 2 - kept, kept)
    assert sorted(row["cell_id"] for row in read_results(out)) == [f"p{p}-f0-r0" for p in range(8)]


def test_rows_survive_a_kill_after_the_first_cells(tmp_path, scenario_file):
    """One task of 8 cells (one fold, one worker): rows appear one by one, not all at once."""
    out = tmp_path / "out"
    run = cli("run", str(scenario_file), "--out", str(out), "--jobs", "1", *ONE_FOLD)
    wait_for(lambda: rows_in(out) >= 1, "the first cell", run)
    run.kill()
    run.communicate(timeout=TIMEOUT_S)
    kept = rows_in(out)
    assert 1 <= kept < CELLS // 2
    assert read_manifest(out)["status"] == "running"  # kill -9: no chance to say more
    # the report holds the lock, so no run is left: it was interrupted (and how to finish it)
    report = write_report(out).read_text()
    assert "the run is running" not in report
    assert "the run is interrupted: the process that ran it ended without finishing" in report
    assert (
        f"`p2pdp run {scenario_file} --out {out} --set 'evaluation.folds=[0]' --resume`" in report
    )

    # the lock died with the process: resume at once, and get the uninterrupted rows
    scenario = load_scenario(scenario_file, [ONE_FOLD[1]])
    summary = experiment.run_experiment(scenario, out, jobs=1, resume=True)
    assert (summary.run, summary.skipped) == (CELLS // 2 - kept, kept)
    experiment.run_experiment(scenario, tmp_path / "whole", jobs=1)
    assert without_timing(read_results(out)) == without_timing(read_results(tmp_path / "whole"))


KILLED_REPORT = """
import io, pathlib, sys, time
import matplotlib.figure

original = matplotlib.figure.Figure.savefig

def slow_savefig(self, target, *args, **kwargs):
    # write half of the PNG to wherever the report saves it, then hang until killed
    buffer = io.BytesIO()
    original(self, buffer, *args, **{**kwargs, "format": "png"})
    half = buffer.getvalue()[: len(buffer.getvalue()) // 2]
    if hasattr(target, "write"):
        target.write(half)
    else:
        with open(target, "wb") as file:
            file.write(half)
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(600)

matplotlib.figure.Figure.savefig = slow_savefig
from p2pdp.experiments.cli import main
sys.exit(main(["report", sys.argv[1]]))
"""


def linked_figures(report: Path) -> list[str]:
    return re.findall(r"!\[[^]]*\]\(([^)]+)\)", report.read_text())


def test_a_kill_during_the_report_leaves_no_partial_file(tmp_path, scenario_file):
    out = tmp_path / "out"
    scenario = load_scenario(scenario_file, ["evaluation.folds=[0]"])
    experiment.run_experiment(scenario, out, jobs=1)
    assert linked_figures(write_report(out))
    script, marker = tmp_path / "killed_report.py", tmp_path / "saving"
    script.write_text(KILLED_REPORT)
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    report = subprocess.Popen(
        [sys.executable, str(script), str(out), str(marker)],
        env=os.environ | {"PYTHONPATH": path},
        stderr=subprocess.PIPE,
    )
    wait_for(marker.exists, "the first figure to be half saved", report)
    report.kill()
    report.communicate(timeout=TIMEOUT_S)
    for png in out.glob("*.png"):
        assert png.read_bytes().endswith(PNG_END), f"{png.name} is cut short"
    for figure in linked_figures(out / "report.md"):  # the old report still has its figures
        assert (out / figure).is_file(), f"report.md links {figure}, which the kill removed"
    # and the next report is complete
    text = write_report(out).read_text()
    assert "(error_vs_group_size.png)" in text
    assert (out / "error_vs_group_size.png").read_bytes().endswith(PNG_END)


# --- a second writer --------------------------------------------------------------------------
@needs_proc
def test_a_second_writer_is_refused_while_a_run_writes(tmp_path, scenario_file):
    """Refused at once while the run lives; after its kill -9, nothing is locked or running."""
    out = tmp_path / "out"
    run = cli("run", str(scenario_file), "--out", str(out), "--jobs", "2", *ONE_FOLD)
    try:
        wait_for(lambda: rows_in(out) >= 1, "the first cell", run)
        workers = children(run.pid)
        scenario = load_scenario(scenario_file, [ONE_FOLD[1]])
        for options in ({}, {"resume": True}, {"force": True}):
            with pytest.raises(FolderInUseError, match=f"p2pdp run \\(pid {run.pid} on "):
                experiment.run_experiment(scenario, out, jobs=1, **options)
        with pytest.raises(FolderInUseError, match=f"pid {run.pid} on .*, started 20"):
            write_report(out)
        assert run.poll() is None  # refused at once, not after waiting for the run
    finally:
        run.kill()
        run.communicate(timeout=TIMEOUT_S)
    wait_for(lambda: not any(alive(pid) for pid in workers), "the workers to die with it")
    experiment.run_experiment(scenario, out, jobs=1, resume=True)  # the lock died too
    rows = read_results(out)
    assert sorted(row["cell_id"] for row in rows) == [f"p{p}-f0-r0" for p in range(8)]


HOLD_LOCK = """
import sys, time
from p2pdp.experiments.results.lock import FolderLock
FolderLock(sys.argv[1], purpose="p2pdp run").acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, scenario_file, capsys):
    out = tmp_path / "out"
    out.mkdir()
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": path},
    )
    assert holder.stdout.readline() == "locked\n"
    argv = ["run", str(scenario_file), "--out", str(out), "--set", "evaluation.folds=[0]"]
    for extra in ([], ["--resume"], ["--force"]):
        assert main([*argv, "--jobs", "1", *extra]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert f"{out} is in use by p2pdp run (pid {holder.pid} on " in line
    holder.kill()
    holder.wait()
    assert main([*argv, "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    assert f"locked by pid {holder.pid} on " in err and "taking it over" in err
    assert len(read_results(out)) == CELLS // 2
    assert not (out / ".p2pdp.lock.json").exists()  # released at the end


# --- bad output paths -------------------------------------------------------------------------
@pytest.fixture
def unwritable(tmp_path):
    """A folder this process cannot create files in (chmod, or chattr +i for root)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    made_immutable = False
    if os.access(folder, os.W_OK):  # root ignores permissions
        folder.chmod(0o700)
        result = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
        made_immutable = result.returncode == 0
        if not made_immutable:
            pytest.skip("running as root where chattr +i is not available")
    yield folder
    if made_immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    folder.chmod(0o700)


def test_bad_output_paths_are_one_line_errors(tmp_path, scenario_file, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("not a folder")
    for out, message in (
        (a_file, f"--out {a_file} is a file, not a folder"),
        (a_file / "sub", f"--out {a_file / 'sub'}: {a_file} is a file, not a folder"),
    ):
        assert main(["run", str(scenario_file), "--out", str(out)]) == 2
        assert one_error_line(capsys.readouterr().err) == f"p2pdp: error: {message}"
    assert main(["report", str(a_file)]) == 2
    assert f"{a_file} is a file" in one_error_line(capsys.readouterr().err)


def test_unwritable_output_folders_are_one_line_errors(tmp_path, scenario_file, unwritable, capsys):
    assert main(["run", str(scenario_file), "--out", str(unwritable / "sub")]) == 2
    assert f"--out {unwritable / 'sub'}: cannot create" in one_error_line(capsys.readouterr().err)
    assert main(["run", str(scenario_file), "--out", str(unwritable)]) == 2
    assert f"{unwritable}: cannot write there" in one_error_line(capsys.readouterr().err)


def test_report_into_an_unwritable_folder_is_a_one_line_error(tmp_path, scenario_file, capsys):
    out = tmp_path / "out"
    experiment.run_experiment(load_scenario(scenario_file, ["evaluation.folds=[0]"]), out, jobs=1)
    out.chmod(0o500)
    immutable = os.access(out, os.W_OK)  # root: make it immutable instead
    if immutable:
        out.chmod(0o700)
        if subprocess.run(["chattr", "+i", str(out)], check=False).returncode != 0:
            pytest.skip("running as root where chattr +i is not available")
    try:
        assert main(["report", str(out)]) == 2
        assert f"{out}: cannot write there" in one_error_line(capsys.readouterr().err)
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(out)], check=True)
        out.chmod(0o700)


# --- damaged results files --------------------------------------------------------------------
@pytest.fixture
def finished(tmp_path, scenario_file):
    """A finished results folder of one fold (8 cells)."""
    out = tmp_path / "out"
    experiment.run_experiment(load_scenario(scenario_file, ["evaluation.folds=[0]"]), out, jobs=1)
    return out


def test_report_repairs_a_truncated_last_line(finished, capsys):
    results = finished / "results.csv"
    complete = results.read_text()
    with results.open("a") as file:
        file.write("p7-f0-r0,7,safety,3,synth")  # cut short by a crash
    assert main(["report", str(finished)]) == 0
    assert results.read_text() == complete
    assert "report: " in capsys.readouterr().out
    assert "8 cells:" in (finished / "report.md").read_text()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda lines: lines.insert(3, lines[3] + ",extra"), "line 4: .* fields, the header has"),
        (lambda lines: lines.insert(3, lines[3]), "line 5: cell p2-f0-r0 appears twice"),
        (
            lambda lines: lines.__setitem__(0, lines[0].replace("mean_error", "mean_err")),
            "lacks the columns \\['mean_error'\\]",
        ),
    ],
    ids=["extra field", "duplicate cell", "missing column"],
)
def test_damaged_results_are_one_line_errors(finished, capsys, damage, message):
    results = finished / "results.csv"
    lines = results.read_text().splitlines()
    damage(lines)
    results.write_text("\n".join(lines) + "\n")
    assert main(["report", str(finished)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(results) in line
    with pytest.raises(ConfigError, match=message):
        write_report(finished)


def test_the_interrupt_message_repeats_the_command_to_resume(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("SIGTERM")  # what the CLI's SIGTERM handler raises

    monkeypatch.setattr(experiment, "run_experiment", interrupted)
    out = tmp_path / "my out"
    assert main(["run", "quickstart", "--out", str(out), "--set", "evaluation.folds=[0]"]) == 143
    err = capsys.readouterr().err
    assert "interrupted by SIGTERM" in err
    assert f"p2pdp run quickstart --out '{out}' --set 'evaluation.folds=[0]' --resume" in err


# --- what a resume or a report must not take on trust -----------------------------------------
def test_repeated_folds_are_refused_before_anything_runs(tmp_path, scenario_file, capsys):
    out = tmp_path / "out"
    assert (
        main(["run", str(scenario_file), "--out", str(out), "--set", "evaluation.folds=[0,0]"]) == 2
    )
    assert "evaluation.folds must not repeat a fold" in one_error_line(capsys.readouterr().err)
    assert not (out / "results.csv").exists()


CSV_SCENARIO = """
name = "mine"
seed = 5
[data]
dataset = "csv"
path = "data.csv"
transform = ["minmax", "bias", "project_unit_ball"]
[partition]
n_peers = 10
[evaluation]
cv_folds = 2
"""


def test_resume_refuses_a_data_file_changed_since_the_cells_ran(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    rows = np.column_stack([X, (X.sum(axis=1) > 0).astype(int)])
    monkeypatch.chdir(tmp_path)
    np.savetxt("data.csv", rows, delimiter=",", fmt="%.6f")
    Path("mine.toml").write_text(CSV_SCENARIO)
    first = load_scenario("mine.toml", ["evaluation.folds=[0]"])
    experiment.run_experiment(first, "out", jobs=1)
    manifest = read_manifest("out")
    assert manifest["inputs"]["p2pdp"] and len(manifest["inputs"]["data"]) == 1
    # the cells of fold 1 would read other data than those of fold 0 did
    np.savetxt("data.csv", rows[::-1], delimiter=",", fmt="%.6f")
    manifest["status"] = "interrupted"
    (Path("out") / "manifest.json").write_text(json.dumps(manifest))
    assert (
        main(["run", "mine.toml", "--out", "out", "--set", "evaluation.folds=[0]", "--resume"]) == 2
    )
    line = one_error_line(capsys.readouterr().err)
    assert "changed since they ran" in line and "data.csv sha256" in line
    assert len(read_results("out")) == 1  # nothing merged


def test_report_refuses_a_row_outside_the_grid(finished, capsys):
    results = finished / "results.csv"
    lines = results.read_text().splitlines()
    lines.append(lines[1].replace("p0-f0-r0", "p99-f0-r0", 1))
    results.write_text("\n".join(lines) + "\n")
    assert main(["report", str(finished)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "line 10: cell p99-f0-r0 is not in the scenario's grid (8 cells)" in line


def _cut(path: Path) -> None:
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[: len(lines) // 2]) + "\n")


@pytest.mark.parametrize(
    ("table", "damage"),
    [
        ("releases.csv", lambda path: path.unlink()),
        ("releases.csv", lambda path: path.write_text(path.read_text().splitlines()[0] + "\n")),
        ("roc.csv", _cut),
        ("peers.csv", _cut),
    ],
    ids=["deleted", "header only", "roc cut", "peers cut"],
)
def test_lost_records_are_refused_by_report_and_rebuilt_by_resume(
    finished, scenario_file, capsys, table, damage
):
    before = {path.name: path.read_text() for path in finished.glob("*.csv")}
    rows = read_results(finished)
    damage(finished / table)
    assert main(["report", str(finished)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"{table} lack(s) the rows of" in line and "--resume" in line
    command = ["run", str(scenario_file), "--out", str(finished), "--set", "evaluation.folds=[0]"]
    assert main([*command, "--resume"]) == 0
    assert "already done" in capsys.readouterr().out
    after = {path.name: path.read_text() for path in finished.glob("*.csv")}
    for name in ("releases.csv", "peers.csv", "roc.csv"):
        assert after[name] == before[name], f"{name} not rebuilt"
    assert without_timing(read_results(finished)) == without_timing(rows)


def test_a_full_disk_names_the_file_and_marks_the_run_failed(
    tmp_path, scenario_file, monkeypatch, capsys
):
    class FullDisk:
        def __init__(self, file):
            self.file, self.name = file, file.name

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.file, name)

    real = ResultsStore._open_table

    def open_table(self, name, columns):
        file = real(self, name, columns)
        self._files[name] = FullDisk(file)
        return self._files[name]

    monkeypatch.setattr(ResultsStore, "_open_table", open_table)
    out = tmp_path / "out"
    assert main(["run", str(scenario_file), "--out", str(out), "--jobs", "1"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "No space left on device" in line and str(out) in line and ".csv" in line
    manifest = read_manifest(out)
    assert manifest["status"] == "failed" and "No space left" in manifest["error"]


def test_the_report_of_an_unfinished_run_says_how_many_cells_are_missing(finished):
    results = finished / "results.csv"
    lines = results.read_text().splitlines()
    results.write_text("\n".join(lines[:-3]) + "\n")
    manifest = read_manifest(finished)
    manifest.update(status="interrupted", error="interrupted by SIGTERM", finished=None)
    (finished / "manifest.json").write_text(json.dumps(manifest))
    text = write_report(finished).read_text()
    assert "not finished" not in text
    assert "**Incomplete results: 3 of 8 cells missing; the run is interrupted" in text
    assert "--resume`" in text
