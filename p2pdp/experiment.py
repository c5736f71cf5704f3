"""Run a scenario: grid points x folds x repetitions, in parallel, into a results folder.

A *cell* is one grid point, one fold and one repetition: one :func:`p2pdp.simulate` call.
Its seeds derive from the config's seed, the fold and the repetition (inside ``simulate``),
never from the order or place of execution, so every backend and worker count gives the same
results rows (up to the ``wall_*`` timing columns).

Cells whose :func:`~p2pdp.pipeline.training_key` is equal (same data, fold, repetition,
partition and lambda) share one local training: they are sent to a worker as one *task*,
which calls :func:`~p2pdp.pipeline.prepare_peers` once and ``simulate`` once per cell. A
training group is split into several tasks only when there are fewer groups than workers.

Backends: in-process (``jobs=1``), local worker processes
(:class:`concurrent.futures.ProcessPoolExecutor`), or a Dask distributed cluster
(``scheduler="tcp://host:port"``; the workers need p2pdp installed and the data files, e.g.
via ``P2PDP_DATA_HOME``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from threadpoolctl import threadpool_limits

from p2pdp.config import ScenarioConfig
from p2pdp.disclosure import non_private_column
from p2pdp.errors import ConfigError
from p2pdp.pipeline import prepare_peers, training_key
from p2pdp.results import CellRecord, ResultsStore, roc_on_grid
from p2pdp.scenario import Scenario
from p2pdp.simulation import simulate

Task = tuple["Cell", ...]
#: Seconds to wait for a Dask scheduler before giving up (nothing is written before).
SCHEDULER_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One simulation: grid point ``point`` of a scenario, one fold, one repetition.

    ``cell_id`` (``"p007-f3-r0"``) is stable for a given scenario and sorts in grid order.
    """

    cell_id: str
    point: int
    config: ScenarioConfig
    fold: int
    repetition: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """What :func:`run_experiment` did: cells in the grid, run now, found done; seconds."""

    directory: Path
    cells: int
    run: int
    skipped: int
    seconds: float


def default_out_dir(scenario: Scenario) -> Path:
    """``results/<scenario name>`` under the current directory."""
    return Path("results") / scenario.name


def make_cells(scenario: Scenario) -> list[Cell]:
    """Every cell of ``scenario``, in grid order (point, then fold, then repetition)."""
    points = scenario.points
    repetitions = scenario.config.repetitions
    folds = {p.index: p.config.evaluation.fold_indices() for p in points}
    widths = (
        len(str(len(points) - 1)),
        len(str(max(max(f) for f in folds.values()))),
        len(str(repetitions - 1)),
    )
    return [
        Cell(
            cell_id=f"p{p.index:0{widths[0]}d}-f{fold:0{widths[1]}d}-r{rep:0{widths[2]}d}",
            point=p.index,
            config=p.config,
            fold=fold,
            repetition=rep,
        )
        for p in points
        for fold in folds[p.index]
        for rep in range(repetitions)
    ]


def plan_tasks(cells: Sequence[Cell], *, workers: int) -> list[Task]:
    """Group ``cells`` by training key into tasks, splitting groups if fewer than ``workers``."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        key = training_key(cell.config, fold=cell.fold, repetition=cell.repetition)
        groups.setdefault(key, []).append(cell)
    split = -(-workers // max(len(groups), 1))  # ceil: every worker gets at least one task
    return [
        tuple(group[i :: min(split, len(group))])
        for group in groups.values()
        for i in range(min(split, len(group)))
    ]


def run_task(cells: Task) -> list[CellRecord]:
    """Train once for the task's training key, then simulate each cell (runs in a worker).

    Rows get ``cell_id`` and ``point`` first, then :meth:`p2pdp.simulation.RunResult.row`,
    then ``wall_prepare_s`` (the shared training's seconds) and ``wall_cell_s``. BLAS runs
    single-threaded: on small matrices its threads cost more than they gain (measured 4x
    slower on 2 cores), and parallel workers would oversubscribe the cores.
    """
    first = cells[0]
    records = []
    with threadpool_limits(limits=1):  # parallelism comes from workers, not BLAS threads
        start = time.perf_counter()
        trained = prepare_peers(first.config, fold=first.fold, repetition=first.repetition)
        prepare_seconds = time.perf_counter() - start
        for cell in cells:
            start = time.perf_counter()
            result = simulate(
                cell.config, fold=cell.fold, repetition=cell.repetition, trained=trained
            )
            row: dict[str, Any] = {"cell_id": cell.cell_id, "point": cell.point, **result.row()}
            row["non_private_steps"] = non_private_column(cell.config)  # p2pdp.disclosure
            row.update(wall_prepare_s=prepare_seconds, wall_cell_s=time.perf_counter() - start)
            roc = roc_on_grid(result.metrics.roc_fpr, result.metrics.roc_tpr)
            records.append(CellRecord(cell_id=cell.cell_id, row=row, roc_tpr=roc))
    return records


def run_experiment(
    scenario: Scenario,
    out: str | Path,
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    force: bool = False,
    progress: TextIO | None = None,
) -> RunSummary:
    """Run every cell of ``scenario`` not yet in ``out`` and store the results there.

    Parameters
    ----------
    scenario : Scenario
    out : path
        Results folder (see :mod:`p2pdp.results`); created if missing.
    jobs : int, optional
        Local worker processes (default ``os.cpu_count()``); 1 runs in this process.
        Ignored when ``scheduler`` is given.
    scheduler : str, optional
        Address of a Dask distributed scheduler (``"tcp://host:port"``). The connection is
        checked before anything is written.
    resume, force : bool
        Finish a folder holding an interrupted run of the same scenario / discard a folder's
        results (see :meth:`p2pdp.results.ResultsStore.open`).
    progress : text stream, optional
        Where to report progress (a bar on a TTY, log lines otherwise); None is silent.

    Raises
    ------
    ConfigError
        Bad ``jobs``, unreachable scheduler, or a results folder that does not match.
    """
    started = time.perf_counter()
    cells = make_cells(scenario)
    client = _connect(scheduler) if scheduler is not None else None
    try:
        workers = _worker_count(jobs, client)
        backend = f"dask {scheduler}" if client else f"{workers} local process(es)"
        store = ResultsStore.open(
            out, scenario, n_cells=len(cells), backend=backend, resume=resume, force=force
        )
        pending = [cell for cell in cells if cell.cell_id not in store.done]
        tasks = plan_tasks(pending, workers=workers)
        if client is not None:
            outcomes = _run_dask(tasks, client)
        elif workers > 1 and len(tasks) > 1:
            outcomes = _run_processes(tasks, min(workers, len(tasks)))
        else:
            outcomes = map(run_task, tasks)
        bar = _Progress(len(cells), len(cells) - len(pending), progress)
        for records in outcomes:
            store.append(records)
            bar.update(len(records))
        bar.close()
        store.finish()
    finally:
        if client is not None:
            client.close()
    return RunSummary(
        directory=store.directory,
        cells=len(cells),
        run=len(pending),
        skipped=len(cells) - len(pending),
        seconds=time.perf_counter() - started,
    )


# --- backends ---------------------------------------------------------------------------------
def _worker_count(jobs: int | None, client: Any) -> int:
    if client is not None:
        return max(1, sum(client.nthreads().values()))
    if jobs is None:
        return os.cpu_count() or 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs must be an integer >= 1, got {jobs!r}")
    return jobs


def _run_processes(tasks: Sequence[Task], workers: int) -> Iterator[list[CellRecord]]:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_task, task) for task in tasks]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            for future in futures:
                future.cancel()


def _connect(address: str) -> Any:
    """A Dask client for ``address``, or ConfigError if dask is missing or it is unreachable."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise ConfigError(
            f"--scheduler {address} needs dask.distributed: pip install 'p2pdp[dask]'"
        ) from None
    try:
        return Client(address, timeout=SCHEDULER_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(
            f"--scheduler {address}: cannot reach the Dask scheduler within "
            f"{SCHEDULER_TIMEOUT_S:g} s ({exc})"
        ) from None


def _run_dask(tasks: Sequence[Task], client: Any) -> Iterator[list[CellRecord]]:
    from dask.distributed import as_completed as dask_completed

    futures = [client.submit(run_task, task, pure=False) for task in tasks]
    try:
        for future in dask_completed(futures):
            yield future.result()
    finally:
        client.cancel(futures)


# --- progress ---------------------------------------------------------------------------------
class _Progress:
    """Cells done, rate and ETA: a redrawn bar on a TTY, one log line per update otherwise."""

    def __init__(self, total: int, done: int, stream: TextIO | None) -> None:
        self.total, self.done, self.stream = total, done, stream
        self.start_done, self.start = done, time.perf_counter()
        self.tty = stream is not None and stream.isatty()
        if stream is not None and done:
            self._print(f"resuming: {done} of {total} cells already done")

    def update(self, cells: int) -> None:
        self.done += cells
        elapsed = time.perf_counter() - self.start
        rate = (self.done - self.start_done) / elapsed if elapsed > 0 else float("inf")
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        status = f"{self.done}/{self.total} cells, {rate:.2f} cells/s, ETA {_duration(eta)}"
        if self.tty:
            filled = round(30 * self.done / max(self.total, 1))
            self._print(f"\r[{'#' * filled}{'.' * (30 - filled)}] {status}", end="")
        else:
            self._print(f"p2pdp run: {status}")

    def close(self) -> None:
        if self.tty:
            self._print("")

    def _print(self, text: str, end: str = "\n") -> None:
        if self.stream is not None:
            print(text, end=end, file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
