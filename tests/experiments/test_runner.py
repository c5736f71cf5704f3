"""Cells, task planning (shared training), backends giving identical rows, the `run` command."""

from __future__ import annotations

import io
import os
import re
import tempfile
import time

import pytest
from dask.distributed import LocalCluster

from p2pdp.core.errors import ComponentError, ConfigError
from p2pdp.experiments.cli import main
from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.run import cells as run_cells
from p2pdp.experiments.run import dask_backend as run_dask
from p2pdp.experiments.run import progress as run_progress
from p2pdp.experiments.run import runner as experiment
from p2pdp.experiments.run import workers as run_workers
from p2pdp.experiments.scenarios.scenario import load_scenario, parse_scenario
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


def assert_same_rows(rows, reference):
    """Equal rows up to ``wall_*``: text and integers exactly, other numbers to 1e-9 (a float
    computed in another process may differ in its last bits; it must not differ more)."""
    rows, reference = without_timing(rows), without_timing(reference)
    assert [row.keys() for row in rows] == [row.keys() for row in reference]
    for row, expected in zip(rows, reference, strict=True):
        for key, value in row.items():
            try:
                number, wanted = float(value), float(expected[key])
            except ValueError:
                assert value == expected[key], (row["cell_id"], key)
                continue
            if value.lstrip("-").isdigit():
                assert value == expected[key], (row["cell_id"], key)
            else:
                assert number == pytest.approx(wanted, rel=1e-9, abs=1e-12, nan_ok=True), (
                    row["cell_id"],
                    key,
                )


def test_cells_cover_points_folds_and_repetitions():
    scenario = parse_scenario(TINY, overrides=["repetitions=2"])
    cells = run_cells.make_cells(scenario)
    assert len(cells) == 4 * 3 * 2
    assert [c.cell_id for c in cells] == sorted(c.cell_id for c in cells)  # ids sort in grid order
    assert cells[0].cell_id == "p0-f0-r0" and cells[-1].cell_id == "p3-f2-r1"
    assert {(c.point, c.fold, c.repetition) for c in cells} == {
        (p, f, r) for p in range(4) for f in range(3) for r in range(2)
    }


def test_seed_experiment_has_560_cells_in_10_shared_trainings():
    cells = run_cells.make_cells(load_scenario("spambase_group_vs_full"))
    assert len(cells) == 560
    groups = run_cells.training_groups(cells)
    assert sorted(len(group) for group in groups) == [56] * 10
    for group in groups:
        keys = {training_key(c.config, fold=c.fold, repetition=c.repetition) for c in group}
        assert len(keys) == 1
        for workers, sizes in ((2, [4] * 14), (16, [1] * 56)):  # 16: every worker gets cells
            chunks = run_workers.chunks(group, workers=workers)
            assert [c for chunk in chunks for c in chunk] == list(group)
            assert [len(chunk) for chunk in chunks] == sizes


def test_the_unit_of_dispatch_is_the_cell_and_each_key_is_trained_once(tmp_path, monkeypatch):
    """4 workers, 3 training keys (folds): every worker runs cells, and the 3 trainings run
    once each (the workers that did not train read the training another one saved)."""
    log = tmp_path / "log"
    prepare, run_cell = run_cells._prepare, run_cells._run_cell

    def note(what):
        with open(log, "a") as file:  # one short O_APPEND write per line: atomic
            file.write(f"{what} {os.getpid()}\n")

    def logged_prepare(cell):
        note("prepare")
        return prepare(cell)

    def slow_cell(cell, trained, seconds, **kwargs):
        note("cell")
        time.sleep(0.3)  # long enough that a worker slow to start still gets cells
        return run_cell(cell, trained, seconds, **kwargs)

    monkeypatch.setattr(run_cells, "_prepare", logged_prepare)
    monkeypatch.setattr(run_cells, "_run_cell", slow_cell)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    scenario = parse_scenario(TINY)
    assert len(run_cells.training_groups(run_cells.make_cells(scenario))) == 3
    experiment.run_experiment(scenario, tmp_path / "jobs4", jobs=4)
    lines = [line.split() for line in log.read_text().splitlines()]
    assert sum(what == "prepare" for what, _ in lines) == 3
    assert len([what for what, _ in lines if what == "cell"]) == 12
    assert len({pid for what, pid in lines if what == "cell"}) == 4
    assert str(os.getpid()) not in {pid for _, pid in lines}  # all of it in the workers
    assert list((tmp_path / "tmp").iterdir()) == []  # the trainings' folder is removed
    assert len(read_results(tmp_path / "jobs4")) == 12


def test_at_most_workers_plus_one_trainings_are_kept(tmp_path, monkeypatch):
    """9 training keys, 2 workers: each cell sees at most 3 saved trainings (memory and disk
    stay bounded by the worker count, not the number of keys)."""
    log = tmp_path / "log"
    run_cell = run_cells._run_cell

    def counting_cell(cell, trained, seconds, **kwargs):
        with open(log, "a") as file:
            file.write(f"{len(list((tmp_path / 'tmp').glob('*/*')))}\n")
        return run_cell(cell, trained, seconds, **kwargs)

    monkeypatch.setattr(run_cells, "_run_cell", counting_cell)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    scenario = parse_scenario(TINY, overrides=["repetitions=3"])
    assert len(run_cells.training_groups(run_cells.make_cells(scenario))) == 9
    experiment.run_experiment(scenario, tmp_path / "out", jobs=2)
    saved = [int(line) for line in log.read_text().split()]
    assert len(saved) == 36 and max(saved) <= 3 and max(saved) >= 1


def test_a_training_that_cannot_be_shared_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setattr(run_cells, "_prepare", lambda cell: (lambda: None, 0.0))
    with pytest.raises(ComponentError, match=r"prepare returned an object that cannot be pickl"):
        experiment.run_experiment(parse_scenario(TINY), tmp_path / "out", jobs=2)


def test_a_task_trains_once(monkeypatch):
    calls = []
    original = LogisticEnsembles.prepare

    def counting(self, **kwargs):
        calls.append(kwargs)
        return original(self, **kwargs)

    monkeypatch.setattr(LogisticEnsembles, "prepare", counting)
    cells = run_cells.make_cells(parse_scenario(TINY))
    task = run_cells.training_groups(cells)[0]
    records = run_cells.run_task(task)
    assert len(calls) == 1 and len(records) == len(task) == 4
    assert [r.row["cell_id"] for r in records] == [c.cell_id for c in task]
    assert records[0].roc_tpr.shape == (101,)


def test_backends_give_identical_rows(tmp_path):
    """In-process, 2 local processes, Dask LocalCluster with threads and with processes."""
    scenario = parse_scenario(TINY)
    experiment.run_experiment(scenario, tmp_path / "inproc", jobs=1)
    reference = without_timing(read_results(tmp_path / "inproc"))
    assert len(reference) == 12
    for jobs in (2, 3):  # 3 keys of 4 cells: cells of one key run in several workers
        experiment.run_experiment(scenario, tmp_path / f"procs{jobs}", jobs=jobs)
        assert_same_rows(read_results(tmp_path / f"procs{jobs}"), reference)
    for processes in (False, True):
        with LocalCluster(
            n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None
        ) as cluster:
            out = tmp_path / f"dask-{processes}"
            experiment.run_experiment(scenario, out, scheduler=cluster.scheduler_address)
        assert without_timing(read_results(out)) == reference
    assert (tmp_path / "inproc" / "roc.csv").read_text() == (
        tmp_path / "procs2" / "roc.csv"
    ).read_text()


def test_one_task_gives_its_spare_workers_to_the_local_models(tmp_path, monkeypatch):
    """A single cell with --jobs 2: one task, run here, its local models solved and its peers
    scored by 2 forked processes (each on half the published models, then on half the peers),
    its centralised reference solved in a background process while the cell runs; every row
    equal to --jobs 1."""
    from p2pdp.core.parallel import current_workers
    from p2pdp.learning import evaluation, models
    from p2pdp.learning.tiles import EvaluationTiles, evaluation_tiles
    from p2pdp.tasks import pipeline

    used, scored = [], []
    fit, split = models.fit_local_models, evaluation.forked_map

    def recording(*args, **kwargs):
        used.append(current_workers())
        return fit(*args, **kwargs)

    def recording_split(function, shared, items, *, workers):
        scored.append((function.__name__, workers, len(items)))
        return split(function, shared, items, workers=workers)

    monkeypatch.setattr(models, "fit_local_models", recording)
    monkeypatch.setattr(evaluation, "forked_map", recording_split)
    monkeypatch.setattr(evaluation, "PARALLEL_MIN_PEERS", 2)  # TINY's run is small
    monkeypatch.setattr(pipeline, "BACKGROUND_MIN_ROWS", 2)  # TINY's reference is small
    # a block per published model, a tile per peer
    tiles = EvaluationTiles(chunk_elements=1, min_chunk_rows=1, peer_tile=1)
    one_cell = TINY[: TINY.index("[sweep]")]
    scenario = parse_scenario(one_cell, overrides=["evaluation.folds=[0]"])
    assert len(run_cells.make_cells(scenario)) == 1
    for jobs in (1, 2):
        with evaluation_tiles(tiles):
            experiment.run_experiment(scenario, tmp_path / f"jobs{jobs}", jobs=jobs)
    # the peers' models and the centralised one with --jobs 1; with --jobs 2 the centralised
    # one is fitted in the background process (not recorded here)
    assert used == [1, 1, 2]
    # the published models' sums and the ensembles (and with them the local models' errors)
    # split in two with 2 workers; the one centralised model's errors in one piece
    halved = ["_published_partials", "_count_tallied"]
    assert sorted(scored) == sorted(
        [(name, 1, 1) for name in [*halved, "_linear_wrong"]]
        + [(name, 2, 2) for name in halved]
        + [("_linear_wrong", 1, 1)]
    )
    assert without_timing(read_results(tmp_path / "jobs2")) == without_timing(
        read_results(tmp_path / "jobs1")
    )


def test_unreachable_scheduler_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(run_dask, "SCHEDULER_TIMEOUT_S", 0.5)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler"):
        experiment.run_experiment(parse_scenario(TINY), out, scheduler="tcp://127.0.0.1:1")
    assert not out.exists()


def test_bad_jobs(tmp_path):
    with pytest.raises(ConfigError, match="--jobs must be an integer >= 1, got 0"):
        experiment.run_experiment(parse_scenario(TINY), tmp_path, jobs=0)
    assert not list(tmp_path.iterdir())


def test_progress_lines_without_a_tty(tmp_path, monkeypatch):
    monkeypatch.setattr(run_progress, "PROGRESS_INTERVAL_S", 1000.0)
    stream = io.StringIO()
    experiment.run_experiment(parse_scenario(TINY), tmp_path, jobs=1, progress=stream)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1  # a fast run: no line per cell, only the last one
    assert lines[-1].startswith("p2pdp run: 12/12 cells") and "cells/s" in lines[-1]


def test_progress_heartbeat_while_a_long_cell_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(run_progress, "PROGRESS_INTERVAL_S", 0.1)
    original = run_cells.simulate

    def slow(*args, **kwargs):
        time.sleep(0.6)
        return original(*args, **kwargs)

    monkeypatch.setattr(run_cells, "simulate", slow)
    stream = io.StringIO()
    scenario = parse_scenario(TINY, overrides=["evaluation.folds=[0]"])
    experiment.run_experiment(scenario, tmp_path, jobs=1, progress=stream)
    lines = stream.getvalue().splitlines()
    assert sum(line.startswith("p2pdp run: 0/4 cells") for line in lines) >= 2
    assert "elapsed" in lines[0]
    assert lines[-1].startswith("p2pdp run: 4/4 cells")


#: Libraries `p2pdp run` needs only once the scenario is valid (numpy is needed to validate;
#: simpy and cryptography, ~50 ms together, still load for the runtimes' declared reads).
HEAVY = ("scipy", "sklearn", "pandas", "matplotlib", "dask", "distributed", "networkx")


def test_a_typo_fails_before_the_heavy_libraries_load():
    """A mistyped setting fails in well under a second: the scenario is validated before
    anything imports scipy, scikit-learn, pandas, matplotlib, dask or networkx."""
    import subprocess
    import sys

    script = """
import sys
from p2pdp.experiments.cli import main
typos = ["privacy.mechanism=typo", "privacy.epsilonn=1", "privacy.epsilon=-1"]
print([main(["run", "quickstart", "--set", typo]) for typo in typos])
print(sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1:])))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, *HEAVY], capture_output=True, text=True, timeout=300
    )
    assert done.stdout.splitlines() == ["[2, 2, 2]", "[]"], (done.stdout, done.stderr)
    errors = done.stderr.splitlines()
    assert "--set privacy.mechanism=typo: privacy.mechanism must be one of" in errors[0]
    assert "privacy.epsilonn" in errors[1] and "privacy.epsilon" in errors[2]


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
    monkeypatch.setattr(run_progress, "PROGRESS_INTERVAL_S", 0.05)
    one_cell = TINY[: TINY.index("[sweep]")]
    scenario = parse_scenario(one_cell, overrides=["evaluation.folds=[0]"])
    stream = io.StringIO()
    experiment.run_experiment(scenario, tmp_path / "out", jobs=1, progress=stream)
    lines = stream.getvalue().splitlines()
    # the cell, its phase, and the counter of its one-shot simulation (read when due)
    running = "(running: p0-f0-r0 simulation, 0 of at most "
    assert any(running in line and "aggregations, 0 aborted" in line for line in lines), lines
    assert lines[-1].startswith("p2pdp run: 1/1 cells") and "running" not in lines[-1]


#: Overrides making TINY's first grid point an iterative scenario: D-PSGD for 20 rounds.
ITERATIVE = [
    "privacy.mechanism=gaussian",
    "privacy.delta=1e-5",
    "gossip.degree=4",
    "protocol.name=dpsgd",
    "protocol.rounds=20",
]


def _slow_rounds(monkeypatch, seconds):
    """Every round of an iterative run (its record) takes ``seconds`` longer (forked workers
    inherit it)."""
    from p2pdp.sim import iterative

    distance = iterative.consensus_distance

    def slow(models):
        time.sleep(seconds)
        return distance(models)

    monkeypatch.setattr(iterative, "consensus_distance", slow)


def _rounds_shown(lines, cell):
    """The rounds the progress ``lines`` said ``cell`` was in (of 20), in order."""
    import re

    return [
        int(r) for line in lines for r in re.findall(rf"{cell} simulation, round (\d+) of 20", line)
    ]


def test_worker_processes_report_the_round_of_their_iterative_cells(tmp_path, monkeypatch):
    """Cells in forked workers: each worker says what its cells are doing on the record queue,
    and the parent's line shows both cells' rounds as they move (the workers always report:
    test_backends_give_identical_rows has the rows equal to those of a run in this process)."""
    _slow_rounds(monkeypatch, 0.04)
    monkeypatch.setattr(run_progress, "PROGRESS_INTERVAL_S", 0.05)
    one_point = TINY[: TINY.index("[sweep]")]
    scenario = parse_scenario(one_point, overrides=[*ITERATIVE, "evaluation.folds=[0, 1]"])
    stream = io.StringIO()
    experiment.run_experiment(scenario, tmp_path, jobs=2, progress=stream)
    lines = stream.getvalue().splitlines()
    for cell in ("p0-f0-r0", "p0-f1-r0"):
        rounds = _rounds_shown(lines, cell)
        assert len(set(rounds)) >= 2 and rounds == sorted(rounds), (cell, lines)
    assert lines[-1].startswith("p2pdp run: 2/2 cells") and "running" not in lines[-1]


def test_dask_workers_report_the_round_of_their_iterative_cells(tmp_path, monkeypatch):
    """Cells on Dask workers send what they are doing as events on the run's topic."""
    _slow_rounds(monkeypatch, 0.04)
    monkeypatch.setattr(run_progress, "PROGRESS_INTERVAL_S", 0.05)
    events = []
    received = run_dask._ClusterReports._received

    def spy(self, event):
        events.append(event[1])
        received(self, event)

    monkeypatch.setattr(run_dask._ClusterReports, "_received", spy)
    one_point = TINY[: TINY.index("[sweep]")]
    scenario = parse_scenario(one_point, overrides=[*ITERATIVE, "evaluation.folds=[0]"])
    stream = io.StringIO()
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        experiment.run_experiment(
            scenario, tmp_path / "out", scheduler=cluster.scheduler_address, progress=stream
        )
    said = [text for cell, text in events if cell == "p0-f0-r0" and text]
    assert any(text.startswith("simulation, round ") for text in said), events
    assert _rounds_shown(stream.getvalue().splitlines(), "p0-f0-r0"), stream.getvalue()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_names_two_running_cells_and_fits_a_terminal(monkeypatch):
    running = {
        "p1-f0-r0": "data and local models",
        "p0-f0-r0": "simulation, round 3 of 10",
        "p0-f1-r0": "training",
        "p2-f0-r0": "simulation, 12 of at most 40 aggregations, 0 aborted, simulated time 9 s",
    }
    log = io.StringIO()
    bar = run_progress._Progress(4, 0, log, running=lambda: running)
    bar.update("p0-f1-r0")  # done: a late report of it is not shown
    bar._show()
    bar.close()
    line = log.getvalue().splitlines()[-1]
    assert line.endswith(
        "(running: p0-f0-r0 simulation, round 3 of 10; p1-f0-r0 data and local models; +1 more)"
    )
    monkeypatch.setattr(
        run_progress.shutil, "get_terminal_size", lambda: os.terminal_size((60, 20))
    )
    terminal = _Terminal()
    bar = run_progress._Progress(4, 0, terminal, running=lambda: running)
    bar._show()
    bar.update("p0-f1-r0")
    bar.close()
    redraws = terminal.getvalue().rstrip("\n").split("\r")[1:]
    assert len(redraws) >= 2
    for redraw in redraws:  # each cut to the terminal, erasing what a longer one left
        assert redraw.endswith("\x1b[K") and len(redraw.removesuffix("\x1b[K")) <= 59


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


def test_a_gossip_run_whose_invitations_are_lost_says_its_failed_formation_attempts(monkeypatch):
    """At network.loss = 0.5 gossip formation fails attempt after attempt for minutes; the
    progress line said "0 aggregations, 0 aborted" and nothing else moved but the clock."""
    from p2pdp.experiments.run import oneshot, simulation

    counters = {}

    def remember(phase, counter=None):
        counters[phase] = counter

    monkeypatch.setattr(oneshot, "set_phase", remember)
    config = parse_scenario(
        TINY[: TINY.index("[sweep]")],
        overrides=[
            "groups.sampler=gossip",
            "gossip.degree=4",
            "network.loss=0.5",
            "groups.max_failed_attempts=2",
        ],
    ).config
    simulation.simulate(config)
    said = counters["simulation"]()
    failed, started = map(
        int, re.search(r"(\d+) of (\d+) formation attempts failed", said).groups()
    )
    assert 0 < failed <= started, said
