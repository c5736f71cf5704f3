"""Cells, task planning (shared training), backends giving identical rows, the `run` command."""

from __future__ import annotations

import io
import time

import pytest
from dask.distributed import LocalCluster

from p2pdp.core.errors import ConfigError
from p2pdp.experiments import runner as experiment
from p2pdp.experiments.cli import main
from p2pdp.experiments.results import read_results
from p2pdp.experiments.scenario import load_scenario, parse_scenario
from p2pdp.tasks.logistic.task import LogisticEnsembles
from p2pdp.tasks.pipeline import training_key

TINY = """
name = "tiny"
seed = 7

[data]
dataset = "synthetic"
synthetic_rows = 300
synthetic_test_rows = 100
synthetic_features = 5

[partition]
n_peers = 10

[evaluation]
cv_folds = 3

[sweep]
"groups.group_size" = [2, 5]
"publication.mode" = ["group", "full"]
"""


def without_timing(rows):
    return [{k: v for k, v in row.items() if not k.startswith("wall_")} for row in rows]


def test_cells_cover_points_folds_and_repetitions():
    scenario = parse_scenario(TINY, overrides=["repetitions=2"])
    cells = experiment.make_cells(scenario)
    assert len(cells) == 4 * 3 * 2
    assert [c.cell_id for c in cells] == sorted(c.cell_id for c in cells)  # ids sort in grid order
    assert cells[0].cell_id == "p0-f0-r0" and cells[-1].cell_id == "p3-f2-r1"
    assert {(c.point, c.fold, c.repetition) for c in cells} == {
        (p, f, r) for p in range(4) for f in range(3) for r in range(2)
    }


def test_seed_experiment_has_560_cells_in_10_shared_trainings():
    cells = experiment.make_cells(load_scenario("spambase_group_vs_full"))
    assert len(cells) == 560
    tasks = experiment.plan_tasks(cells, workers=2)
    assert sorted(len(task) for task in tasks) == [56] * 10
    for task in tasks:
        keys = {training_key(c.config, fold=c.fold, repetition=c.repetition) for c in task}
        assert len(keys) == 1


def test_groups_are_split_when_fewer_than_workers():
    cells = experiment.make_cells(load_scenario("adult_group_vs_full", ["repetitions=1"]))
    tasks = experiment.plan_tasks(cells, workers=3)
    assert len(tasks) == 3
    assert sorted(c.cell_id for task in tasks for c in task) == sorted(c.cell_id for c in cells)


def test_a_task_trains_once(monkeypatch):
    calls = []
    original = LogisticEnsembles.prepare

    def counting(self, **kwargs):
        calls.append(kwargs)
        return original(self, **kwargs)

    monkeypatch.setattr(LogisticEnsembles, "prepare", counting)
    cells = experiment.make_cells(parse_scenario(TINY))
    task = experiment.plan_tasks(cells, workers=1)[0]
    records = experiment.run_task(task)
    assert len(calls) == 1 and len(records) == len(task) == 4
    assert [r.row["cell_id"] for r in records] == [c.cell_id for c in task]
    assert records[0].roc_tpr.shape == (101,)


def test_backends_give_identical_rows(tmp_path):
    """In-process, 2 local processes, Dask LocalCluster with threads and with processes."""
    scenario = parse_scenario(TINY)
    experiment.run_experiment(scenario, tmp_path / "inproc", jobs=1)
    reference = without_timing(read_results(tmp_path / "inproc"))
    assert len(reference) == 12
    experiment.run_experiment(scenario, tmp_path / "procs", jobs=2)
    assert without_timing(read_results(tmp_path / "procs")) == reference
    for processes in (False, True):
        with LocalCluster(
            n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None
        ) as cluster:
            out = tmp_path / f"dask-{processes}"
            experiment.run_experiment(scenario, out, scheduler=cluster.scheduler_address)
        assert without_timing(read_results(out)) == reference
    assert (tmp_path / "inproc" / "roc.csv").read_text() == (
        tmp_path / "procs" / "roc.csv"
    ).read_text()


def test_one_task_gives_its_spare_workers_to_the_local_models(tmp_path, monkeypatch):
    """A single cell with --jobs 2: one task, run here, its local models solved and its peers
    scored by 2 forked processes; every row equal to --jobs 1."""
    from p2pdp.core.parallel import current_workers
    from p2pdp.learning import evaluation, models

    used, scored = [], []
    fit, split = models.fit_local_models, evaluation.forked_map

    def recording(*args, **kwargs):
        used.append(current_workers())
        return fit(*args, **kwargs)

    def recording_split(function, shared, items, *, workers):
        scored.append((workers, len(items)))
        return split(function, shared, items, workers=workers)

    monkeypatch.setattr(models, "fit_local_models", recording)
    monkeypatch.setattr(evaluation, "forked_map", recording_split)
    monkeypatch.setattr(evaluation, "PARALLEL_MIN_PEERS", 2)  # TINY's run is small
    one_cell = TINY[: TINY.index("[sweep]")]
    scenario = parse_scenario(one_cell, overrides=["evaluation.folds=[0]"])
    assert len(experiment.make_cells(scenario)) == 1
    for jobs in (1, 2):
        experiment.run_experiment(scenario, tmp_path / f"jobs{jobs}", jobs=jobs)
    assert used == [1, 1, 2, 2]  # the peers' models and the centralised one, per run
    assert scored == [(1, 1), (2, 2)]  # the peers split in two with 2 workers
    assert without_timing(read_results(tmp_path / "jobs2")) == without_timing(
        read_results(tmp_path / "jobs1")
    )


def test_unreachable_scheduler_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "SCHEDULER_TIMEOUT_S", 0.5)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler"):
        experiment.run_experiment(parse_scenario(TINY), out, scheduler="tcp://127.0.0.1:1")
    assert not out.exists()


def test_bad_jobs(tmp_path):
    with pytest.raises(ConfigError, match="--jobs must be an integer >= 1, got 0"):
        experiment.run_experiment(parse_scenario(TINY), tmp_path, jobs=0)
    assert not list(tmp_path.iterdir())


def test_progress_lines_without_a_tty(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "PROGRESS_INTERVAL_S", 1000.0)
    stream = io.StringIO()
    experiment.run_experiment(parse_scenario(TINY), tmp_path, jobs=1, progress=stream)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1  # a fast run: no line per cell, only the last one
    assert lines[-1].startswith("p2pdp run: 12/12 cells") and "cells/s" in lines[-1]


def test_progress_heartbeat_while_a_long_cell_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "PROGRESS_INTERVAL_S", 0.1)
    original = experiment.simulate

    def slow(*args, **kwargs):
        time.sleep(0.6)
        return original(*args, **kwargs)

    monkeypatch.setattr(experiment, "simulate", slow)
    stream = io.StringIO()
    scenario = parse_scenario(TINY, overrides=["evaluation.folds=[0]"])
    experiment.run_experiment(scenario, tmp_path, jobs=1, progress=stream)
    lines = stream.getvalue().splitlines()
    assert sum(line.startswith("p2pdp run: 0/4 cells") for line in lines) >= 2
    assert "elapsed" in lines[0]
    assert lines[-1].startswith("p2pdp run: 4/4 cells")


def test_quickstart_end_to_end(tmp_path, real_data_home, capsys):
    out = tmp_path / "quick"
    argv = ["run", "quickstart", "--out", str(out), "--jobs", "2", "--set", "evaluation.folds=[0]"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "8 cells (8 run, 0 already done)" in printed
    rows = read_results(out)
    assert len(rows) == 8
    assert {row["groups.group_size"] for row in rows} == {"5", "25"}
    assert all(0.0 <= float(row["mean_error"]) <= 1.0 for row in rows)
    assert (out / "report.md").exists() and (out / "error_vs_group_size.png").exists()
    # the same folder again: refused without --resume, nothing to do with it
    assert main(argv) == 2
    assert "use --resume" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    assert "0 run, 8 already done" in capsys.readouterr().out


def test_progress_of_a_long_single_cell_says_what_it_is_doing(tmp_path, monkeypatch):
    """A run of one large cell is one task run here: its progress lines name the phase."""
    import io
    import time as clock

    from p2pdp.sim.world import World

    run = World.run

    def slow(self, *args, **kwargs):
        clock.sleep(0.3)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(World, "run", slow)
    monkeypatch.setattr(experiment, "PROGRESS_INTERVAL_S", 0.05)
    one_cell = TINY[: TINY.index("[sweep]")]
    scenario = parse_scenario(one_cell, overrides=["evaluation.folds=[0]"])
    stream = io.StringIO()
    experiment.run_experiment(scenario, tmp_path / "out", jobs=1, progress=stream)
    lines = stream.getvalue().splitlines()
    assert any(line.endswith("(running: simulation)") for line in lines), lines
    assert lines[-1].startswith("p2pdp run: 1/1 cells") and "running" not in lines[-1]


def _signal_handlers(_shared, _item):
    import signal

    return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)


def test_forked_workers_leave_signals_to_their_parent():
    """A forked worker must not inherit the CLI's SIGTERM handler (KeyboardInterrupt): its
    pool stops it with SIGTERM, and an exception raised while it holds the pool's queue lock
    hangs the run (seen on a config error). It ignores SIGINT and dies on SIGTERM."""
    import signal

    from p2pdp.core.parallel import forked_map

    def interrupt(number, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        handlers = forked_map(_signal_handlers, None, [0, 1], workers=2)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert handlers == [(signal.SIG_IGN, signal.SIG_DFL)] * 2
