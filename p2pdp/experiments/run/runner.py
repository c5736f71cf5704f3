"""Run a scenario: grid points x folds x repetitions, in parallel, into a results folder.

A *cell* is one grid point, one fold and one repetition: one :func:`p2pdp.simulate` call
(:mod:`p2pdp.experiments.run.cells`).
Its seeds derive from the config's seed, the fold and the repetition (inside ``simulate``),
never from the order or place of execution, so every backend and worker count gives the same
results rows (up to the ``wall_*`` timing columns).

Cells whose :func:`~p2pdp.tasks.pipeline.training_key` is equal (same data, fold, repetition,
partition and lambda) share one local training (the task's ``prepare``), computed once per
run. The unit of work handed to a worker is the cell (in chunks of at most
:data:`~p2pdp.experiments.run.workers.MAX_CHUNK` cells of one key), so a sweep uses as many
workers as it has cells, not only as many as it has training keys:

* in-process (``jobs=1``): the keys one after the other, each trained once;
* local worker processes (:mod:`p2pdp.experiments.run.workers`, on a
  :class:`concurrent.futures.ProcessPoolExecutor`): a worker trains a key, writes the trained
  object to a file in a private temporary folder (read back from the page cache by every
  worker that gets cells of that key, each keeping the last
  :data:`~p2pdp.experiments.run.workers.CACHED_TRAININGS` it read), says so on the record
  queue and runs the key's first chunk; the parent then dispatches the key's other chunks to
  whichever workers are free. At most ``workers + 1`` keys are alive (trained or training,
  with cells still to run) at once, in grid order, and a key's file is deleted when its last
  cell is done, so memory and disk stay bounded whatever the number of keys. Records come
  back cell by cell through a :class:`multiprocessing.Queue`, so the results store writes
  each cell as it finishes;
* a Dask distributed cluster (:mod:`p2pdp.experiments.run.dask_backend`;
  ``scheduler="tcp://host:port"``; one future per training and one
  per cell depending on it; the workers need p2pdp installed and the data files, e.g. via
  ``P2PDP_DATA_HOME``). A cell the cluster plan covers
  (:func:`p2pdp.experiments.run.cluster.plan_gap`: one large synthetic run) is split instead:
  its rows, local models, centralised reference and scores in blocks on the workers, its
  simulation in this process (:mod:`p2pdp.experiments.run.cluster`), cells of one training
  key sharing one training.

An exception in the run, including KeyboardInterrupt (which the CLI also raises for SIGTERM
and SIGHUP), stops the local worker processes (or cancels the Dask futures) before it
propagates; the results folder's manifest then says ``failed`` or ``interrupted``. The
progress line is :mod:`p2pdp.experiments.run.progress`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from p2pdp.config import check_reads
from p2pdp.core.errors import ConfigError
from p2pdp.core.progress import running
from p2pdp.core.validation import OneOf
from p2pdp.experiments.network.hosts_file import coordinator_scores, hosts_flag, network_hosts
from p2pdp.experiments.network.launch import check_network_settings
from p2pdp.experiments.network.processes import run_hosts
from p2pdp.experiments.results.store import CellRecord, ResultsStore
from p2pdp.experiments.run.cells import Cell, Task, iter_task, make_cells, training_groups
from p2pdp.experiments.run.cluster import plan_gap
from p2pdp.experiments.run.dask_backend import _ClusterReports, _connect, _run_dask
from p2pdp.experiments.run.iterative import check_budget
from p2pdp.experiments.run.progress import _Progress
from p2pdp.experiments.run.simulation import RUNTIMES
from p2pdp.experiments.run.workers import _WorkerPool
from p2pdp.experiments.scenarios.scenario import Scenario


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


def run_experiment(
    scenario: Scenario,
    out: str | Path,
    *,
    jobs: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    force: bool = False,
    progress: TextIO | None = None,
    runtime: str = "simulation",
) -> RunSummary:
    """Run every cell of ``scenario`` not yet in ``out`` and store the results there.

    The folder is locked for the whole run (a second writer is refused at once), each cell's
    record is written as soon as the cell finishes, and an exception (KeyboardInterrupt
    included) stops the workers, marks the manifest ``failed``/``interrupted`` and
    propagates; ``resume=True`` then finishes the remaining cells.

    Parameters
    ----------
    scenario : Scenario
    out : path
        Results folder (see :mod:`p2pdp.experiments.results.store`); created if missing.
    jobs : int, optional
        Local worker processes (default ``os.cpu_count()``); 1 runs in this process.
        Ignored when ``scheduler`` is given.
    scheduler : str, optional
        Address of a Dask distributed scheduler (``"tcp://host:port"``). The connection is
        checked before anything is written.
    resume, force : bool
        Finish a folder holding an interrupted run of the same scenario / discard a folder's
        results (see :meth:`p2pdp.experiments.results.store.ResultsStore.open`).
    progress : text stream, optional
        Where to report progress (a bar on a TTY, log lines otherwise), at least every
        :data:`~p2pdp.experiments.run.progress.PROGRESS_INTERVAL_S` seconds, with what the
        running cells are doing (their phase, round or aggregations:
        :mod:`p2pdp.core.progress`, which local workers and Dask workers report every half
        interval); None is silent.
    runtime : "simulation" or "network"
        ``network``: every cell runs its peers as OS processes over TCP on this machine
        (:mod:`p2pdp.net`), one cell at a time (its host processes use the cores, as many
        as ``P2PDP_NETWORK_HOSTS`` says: :func:`p2pdp.experiments.network.hosts_file.hosts_plan`),
        started once for the run and serving every cell
        (:func:`~p2pdp.experiments.network.processes.run_hosts`); not with ``jobs`` or
        ``scheduler``.

    Raises
    ------
    ConfigError
        Bad ``jobs``, unreachable scheduler, or a results folder that cannot be written, is
        in use (:class:`~p2pdp.experiments.results.lock.FolderInUseError`) or does not match.
    """
    started = time.perf_counter()
    _check_run(scenario, jobs=jobs, scheduler=scheduler, runtime=runtime)
    cells = make_cells(scenario)
    client = _connect(scheduler) if scheduler is not None else None
    try:
        workers = _worker_count(jobs, client)
        backend = _backend(
            scenario, cells, client, scheduler=scheduler, workers=workers, runtime=runtime
        )
        with ResultsStore.open(
            out,
            scenario,
            n_cells=len(cells),
            cell_ids=[cell.cell_id for cell in cells],
            backend=backend,
            resume=resume,
            force=force,
            runtime=runtime,
            hosts=hosts_flag() if runtime == "network" else None,
            read_data=runtime != "network" or coordinator_scores(scenario.config.partition.n_peers),
        ) as store:
            previous = store.lock.previous
            if previous and progress is not None:
                print(
                    f"p2pdp run: {store.directory} was locked by pid {previous.get('pid')} on "
                    f"{previous.get('host')} (started {previous.get('started')}), which ended "
                    "without unlocking it; taking it over",
                    file=progress,
                )
            pending = [cell for cell in cells if cell.cell_id not in store.done]
            outcomes, running_cells = _outcomes(pending, client, workers=workers, runtime=runtime)
            bar = None
            try:
                bar = _Progress(
                    len(cells), len(cells) - len(pending), progress, running=running_cells
                )
                for record in outcomes:
                    store.append([record])
                    bar.update(record.cell_id)
            finally:
                outcomes.close()  # stops the workers now, not when the traceback is freed
                if bar is not None:
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


def _check_run(
    scenario: Scenario, *, jobs: int | None, scheduler: str | None, runtime: str
) -> None:
    """ConfigError for what cannot run, before the results folder is touched: the runtime, the
    options it does not take, and each grid point's budget, settings it does not read and, on
    the network runtime, network settings."""
    OneOf(RUNTIMES).check("runtime", runtime)
    if runtime == "network" and scheduler is not None:
        raise ConfigError(
            "--runtime network runs the peers as processes on this machine; it does not "
            f"take --scheduler (got {scheduler!r})"
        )
    if runtime == "network" and jobs is not None:
        raise ConfigError(
            f"--jobs {jobs} is not used by the network runtime: each cell's host processes "
            "use the cores (set how many with --hosts N)"
        )
    for point in scenario.points:
        check_budget(point.config)
        check_reads(point.config, runtime)  # a scenario may set what one runtime reads
        if runtime == "network":
            check_network_settings(point.config)


def _backend(
    scenario: Scenario,
    cells: Sequence[Cell],
    client: Any,
    *,
    scheduler: str | None,
    workers: int,
    runtime: str,
) -> str:
    """Where the cells run, as the manifest's ``backend`` says it."""
    if runtime == "network":
        hosts = network_hosts(scenario.config.partition.n_peers)
        return f"network runtime: {hosts} host processes per run, over TCP"
    if client is None:
        return f"{workers} local process(es)"
    split = sum(plan_gap(cell.config) is None for cell in cells)
    return f"dask {scheduler} ({split} of {len(cells)} cells split in blocks over the workers)"


def _outcomes(
    pending: Sequence[Cell], client: Any, *, workers: int, runtime: str
) -> tuple[_WorkerPool | Generator[CellRecord, None, None], Callable[[], Any]]:
    """The records of the ``pending`` cells as they finish, from the backend that runs them,
    and what the running cells are doing, where they run (for the progress report)."""
    if client is not None:
        reports = _ClusterReports(client)
        return _run_dask(pending, client, reports.topic), reports.running
    if runtime == "network":  # one cell at a time: its host processes use the cores
        return _run_network(training_groups(pending)), running
    if workers > 1 and len(pending) > 1:
        pool = _WorkerPool(pending, min(workers, len(pending)))
        return pool, pool.running
    # one cell: the spare workers solve its local models
    return _run_in_process(training_groups(pending), training_workers=workers), running


# --- backends ---------------------------------------------------------------------------------
def _worker_count(jobs: int | None, client: Any) -> int:
    if client is not None:
        return max(1, sum(client.nthreads().values()))
    if jobs is None:
        return os.cpu_count() or 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs must be an integer >= 1, got {jobs!r}")
    return jobs


def _run_in_process(
    tasks: Sequence[Task], *, training_workers: int = 1, runtime: str = "simulation"
) -> Generator[CellRecord, None, None]:
    for task in tasks:
        yield from iter_task(task, training_workers=training_workers, runtime=runtime)


def _run_network(tasks: Sequence[Task]) -> Generator[CellRecord, None, None]:
    """The network runtime's cells, one at a time, served by host processes started once
    for all of them (:func:`p2pdp.experiments.network.processes.run_hosts`) and stopped when the
    cells are done, the generator is closed or an exception (an interrupt) passes."""
    with run_hosts():
        yield from _run_in_process(tasks, runtime="network")
