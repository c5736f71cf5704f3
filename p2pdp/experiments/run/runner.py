"""Run a scenario: grid points x folds x repetitions, in parallel, into a results folder.

A *cell* is one grid point, one fold and one repetition: one :func:`p2pdp.simulate` call.
Its seeds derive from the config's seed, the fold and the repetition (inside ``simulate``),
never from the order or place of execution, so every backend and worker count gives the same
results rows (up to the ``wall_*`` timing columns).

Cells whose :func:`~p2pdp.tasks.pipeline.training_key` is equal (same data, fold, repetition,
partition and lambda) share one local training (the task's ``prepare``), computed once per
run. The unit of work handed to a worker is the cell (in chunks of at most
:data:`MAX_CHUNK` cells of one key), so a sweep uses as many workers as it has cells, not
only as many as it has training keys:

* in-process (``jobs=1``): the keys one after the other, each trained once;
* local worker processes (:class:`concurrent.futures.ProcessPoolExecutor`): a worker trains a
  key, writes the trained object to a file in a private temporary folder (read back from the
  page cache by every worker that gets cells of that key, each keeping the last
  :data:`CACHED_TRAININGS` it read), says so on the record queue and runs the key's first
  chunk; the parent then dispatches the key's other chunks to whichever workers are free. At
  most ``workers + 1`` keys are alive (trained or training, with cells still to run) at once,
  in grid order, and a key's file is deleted when its last cell is done, so memory and disk
  stay bounded whatever the number of keys. Records come back cell by cell through a
  :class:`multiprocessing.Queue`, so the results store writes each cell as it finishes;
* a Dask distributed cluster (``scheduler="tcp://host:port"``; one future per training and one
  per cell depending on it; the workers need p2pdp installed and the data files, e.g. via
  ``P2PDP_DATA_HOME``). A cell the cluster plan covers
  (:func:`p2pdp.experiments.run.cluster.plan_gap`: one large synthetic run) is split instead:
  its rows, local models, centralised reference and scores in blocks on the workers, its
  simulation in this process (:mod:`p2pdp.experiments.run.cluster`), cells of one training
  key sharing one training.

An exception in the run, including KeyboardInterrupt (which the CLI also raises for SIGTERM
and SIGHUP), stops the local worker processes (or cancels the Dask futures) before it
propagates; the results folder's manifest then says ``failed`` or ``interrupted``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import os
import pickle
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from threadpoolctl import threadpool_limits

from p2pdp.config import ScenarioConfig, check_reads
from p2pdp.core.boundary import problem
from p2pdp.core.errors import ConfigError
from p2pdp.core.parallel import local_workers, remote_workers, worker_signals
from p2pdp.core.progress import report_every, running, running_cell, set_phase
from p2pdp.core.validation import OneOf
from p2pdp.experiments.network.hosts_file import coordinator_scores, hosts_flag, network_hosts
from p2pdp.experiments.network.launch import check_network_settings
from p2pdp.experiments.network.processes import run_hosts
from p2pdp.experiments.results.files import roc_on_grid
from p2pdp.experiments.results.store import CellRecord, ResultsStore
from p2pdp.experiments.run.cluster import dask_pieces, on_dask_worker, plan_gap, prepare_on_cluster
from p2pdp.experiments.run.iterative import check_budget
from p2pdp.experiments.run.simulation import RUNTIMES, simulate
from p2pdp.experiments.scenarios.disclosure import non_private_column
from p2pdp.experiments.scenarios.scenario import Scenario
from p2pdp.tasks import make_task, prepared

Task = tuple["Cell", ...]
#: Seconds to wait for a Dask scheduler before giving up (nothing is written before).
SCHEDULER_TIMEOUT_S = 5.0
#: Longest silence (seconds) of the progress report while a run is going.
PROGRESS_INTERVAL_S = 2.0
#: Most cells (all of one training key) handed to a local worker at once.
MAX_CHUNK = 4
#: Trained objects a local worker keeps after reading them (the keys it is running cells of).
CACHED_TRAININGS = 2


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


def training_groups(cells: Sequence[Cell]) -> list[Task]:
    """``cells`` grouped by training key (cells sharing one local training), in order of
    first appearance."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        key = make_task(cell.config).training_key(fold=cell.fold, repetition=cell.repetition)
        groups.setdefault(key, []).append(cell)
    return [tuple(group) for group in groups.values()]


def chunks(group: Task, *, workers: int) -> list[Task]:
    """``group`` (cells of one training key) cut into consecutive chunks of at most
    :data:`MAX_CHUNK` cells, small enough that ``workers`` workers all get some."""
    size = max(1, min(MAX_CHUNK, len(group) // (2 * workers)))
    return [group[i : i + size] for i in range(0, len(group), size)]


def iter_task(
    cells: Task, *, training_workers: int = 1, runtime: str = "simulation"
) -> Iterator[CellRecord]:
    """Train once for the task's training key, then simulate the cells, yielding each record.

    Rows get ``cell_id`` and ``point`` first, then
    :meth:`p2pdp.experiments.run.result.RunResult.row`,
    then ``wall_prepare_s`` (the shared training's seconds) and ``wall_cell_s``. BLAS runs
    single-threaded: on small matrices its threads cost more than they gain (measured 4x
    slower on 2 cores), and parallel workers would oversubscribe the cores.
    ``training_workers`` local processes solve the local models and score the peers
    (:func:`p2pdp.core.parallel.local_workers`; no result depends on it). ``runtime``: see
    :func:`~p2pdp.experiments.run.simulation.simulate`.
    """
    with threadpool_limits(limits=1):  # parallelism comes from workers, not BLAS threads
        with local_workers(training_workers):
            trained, prepare_seconds = None, 0.0  # a coordinator without data prepares none
            if runtime != "network" or coordinator_scores(cells[0].config.partition.n_peers):
                trained, prepare_seconds = _prepare(cells[0])
            for cell in cells:
                yield _run_cell(cell, trained, prepare_seconds, runtime=runtime)


def run_task(cells: Task) -> list[CellRecord]:
    """:func:`iter_task` as a list: every record of the task."""
    return list(iter_task(cells))


def _prepare(cell: Cell) -> tuple[Any, float]:
    """What the task prepares for ``cell``'s training key (its local training), and seconds."""
    start = time.perf_counter()
    with running_cell(cell.cell_id):
        set_phase("data and local models")
        trained = prepared(make_task(cell.config), fold=cell.fold, repetition=cell.repetition)
    return trained, time.perf_counter() - start


def _run_cell(
    cell: Cell, trained: Any, prepare_seconds: float, *, runtime: str = "simulation"
) -> CellRecord:
    """Simulate one cell: its results row, ROC curve and its ``releases``, ``peers``,
    ``rounds``, ``network_dp`` and ``wire`` tables (a table without rows is not written)."""
    start = time.perf_counter()
    with running_cell(cell.cell_id):
        set_phase("starting")
        result = simulate(
            cell.config,
            fold=cell.fold,
            repetition=cell.repetition,
            trained=trained,
            runtime=runtime,
        )
    row: dict[str, Any] = {"cell_id": cell.cell_id, "point": cell.point, **result.row()}
    # p2pdp.experiments.scenarios.disclosure
    row["non_private_steps"] = non_private_column(cell.config, runtime=runtime)
    row.update(wall_prepare_s=prepare_seconds, wall_cell_s=time.perf_counter() - start)
    curve = result.evaluation.roc() if hasattr(result.evaluation, "roc") else None
    return CellRecord(
        cell_id=cell.cell_id,
        row=row,
        roc_tpr=roc_on_grid(*curve) if curve is not None else None,
        tables={
            "releases": result.release_rows(),
            "peers": result.peer_table(),
            "rounds": result.round_rows(),
            "network_dp": result.network_dp_rows(),
            "wire": result.wire_rows(),
        },
    )


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
        :data:`PROGRESS_INTERVAL_S` seconds, with what the running cells are doing (their
        phase, round or aggregations: :mod:`p2pdp.core.progress`, which local workers and
        Dask workers report every :data:`PROGRESS_INTERVAL_S` / 2 seconds); None is silent.
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


_RECORDS: Any = None  # in a worker process: the queue its records go to


def _start_worker(records: Any, parent: int) -> None:
    """Initialise a worker process: its record queue, on which it also says what its cells
    are doing every :data:`PROGRESS_INTERVAL_S` / 2 seconds (when that changed:
    :func:`~p2pdp.core.progress.report_every`); signals are the parent's business.

    The parent stops its workers on Ctrl-C or SIGTERM, so a worker ignores SIGINT (a
    terminal sends it to the whole process group) and dies on SIGTERM; on Linux it is also
    killed when the parent dies, even by ``kill -9``.
    """
    global _RECORDS
    _RECORDS = records
    worker_signals()
    pid = os.getpid()  # what its cells are doing, for the parent's progress line
    report_every(PROGRESS_INTERVAL_S / 2, lambda now: records.put(("running", pid, now)))
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl
            os._exit(1)


def _train_and_stream(key: int, cells: Task, path: str | None) -> None:
    """In a worker: train ``cells``' key, save it to ``path`` (if other workers need it) and
    put ``("trained", key, seconds)`` on the queue, then run ``cells`` (the key's first chunk)."""
    with threadpool_limits(limits=1):
        trained, seconds = _prepare(cells[0])
        if path is not None:
            try:
                with open(path, "wb") as file:
                    pickle.dump(trained, file, protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                raise problem(
                    "task",
                    make_task(cells[0].config),
                    "prepare",
                    f"returned an object that cannot be pickled ({exc}); local workers share "
                    "it through a file: make it picklable, or run with --jobs 1",
                ) from None
        _RECORDS.put(("trained", key, seconds))
        for cell in cells:
            _RECORDS.put(_run_cell(cell, trained, seconds))


@functools.lru_cache(maxsize=CACHED_TRAININGS)
def _load_trained(path: str) -> Any:
    """The trained object a worker saved at ``path`` (files are never rewritten in a run)."""
    with open(path, "rb") as file:
        return pickle.load(file)


def _stream_chunk(cells: Task, path: str, seconds: float) -> None:
    """In a worker: run ``cells`` on the training saved at ``path``, record by record."""
    with threadpool_limits(limits=1):
        trained = _load_trained(path)
        for cell in cells:
            _RECORDS.put(_run_cell(cell, trained, seconds))


class _WorkerPool:
    """Local worker processes running ``cells``; iterate for the records as cells finish.

    Dispatch (see the module docstring): keys in grid order, at most ``workers + 1`` alive;
    one job per key trains it and runs its first chunk, the key's other chunks go out as soon
    as the training is saved. The processes start (fork) in the constructor, before any other
    thread of the run. :meth:`close` shuts them down, or, if the iteration did not finish (an
    error, Ctrl-C, SIGTERM), terminates them at once; the trainings' folder is deleted either
    way.
    """

    def __init__(self, cells: Sequence[Cell], workers: int) -> None:
        context = multiprocessing.get_context()
        self.records = context.Queue()
        self.remaining = len(cells)
        self.failed: list[Future] = []
        self.finished = False
        self.workers = workers
        self.keys = deque(enumerate(training_groups(cells)))
        self.key_of: dict[str, int] = {}  # cell id -> its key's index, for the keys alive
        self.left: dict[int, int] = {}  # key alive -> its cells not yet done
        self.unsent: dict[int, list[Task]] = {}  # key training -> its chunks to send once saved
        self.reports: dict[int, dict[str, str]] = {}  # worker pid -> what its cells are doing
        self.folder = tempfile.TemporaryDirectory(prefix="p2pdp-trained-")
        self.pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_start_worker,
            initargs=(self.records, os.getpid()),
        )
        try:
            for _ in range(min(workers + 1, len(self.keys))):
                self._start_key()
        except BaseException:
            self.close()
            raise

    def _submit(self, function: Any, *args: Any) -> None:
        assert self.pool is not None
        self.pool.submit(function, *args).add_done_callback(self._check)

    def _path(self, key: int) -> str:
        return os.path.join(self.folder.name, f"{key}.pickle")

    def _start_key(self) -> None:
        """Train the next key (and run its first chunk) in a worker."""
        key, group = self.keys.popleft()
        first, *self.unsent[key] = chunks(group, workers=self.workers)
        self.left[key] = len(group)
        self.key_of.update((cell.cell_id, key) for cell in group)
        self._submit(_train_and_stream, key, first, self._path(key) if self.unsent[key] else None)

    def _trained(self, key: int, seconds: float) -> None:
        """Send ``key``'s other chunks, now that its training is saved."""
        for chunk in self.unsent.pop(key):
            self._submit(_stream_chunk, chunk, self._path(key), seconds)

    def _done(self, record: CellRecord) -> None:
        """Count ``record``'s cell; when its key has no cell left, free it, start the next."""
        key = self.key_of.pop(record.cell_id)
        self.left[key] -= 1
        if self.left[key] == 0:
            del self.left[key]
            if os.path.exists(self._path(key)):
                os.remove(self._path(key))
            if self.keys:
                self._start_key()

    def _check(self, future: Future) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.failed.append(future)

    def __iter__(self) -> Iterator[CellRecord]:
        while self.remaining:
            if self.failed:
                while True:  # keep the cells that finished before the failure
                    try:
                        message = self.records.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(message, CellRecord):
                        yield message
                error = self.failed[0].exception()
                assert error is not None  # _check keeps only the futures that raised
                raise error
            try:
                message = self.records.get(timeout=0.2)
            except queue.Empty:
                continue
            if not isinstance(message, CellRecord):
                if message[0] == "running":  # a worker says what its cells are doing
                    self.reports[message[1]] = message[2]
                else:
                    self._trained(*message[1:])
                continue
            self.remaining -= 1
            self._done(message)
            yield message
        self.finished = True

    def running(self) -> dict[str, str]:
        """What the cells running in the workers are doing, as they said last."""
        return {
            cell: text for report in list(self.reports.values()) for cell, text in report.items()
        }

    def close(self) -> None:
        if self.pool is None:
            return
        pool, self.pool = self.pool, None
        if self.finished:
            pool.shutdown()
        else:
            _stop_workers(pool)
        self.records.close()
        self.folder.cleanup()


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate a pool's worker processes now (running tasks included) and reap them."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()


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


def _dask_prepare(cell: Cell, topic: str) -> tuple[Any, float]:
    with threadpool_limits(limits=1), _reporting(topic, cell.cell_id), on_dask_worker():
        return _prepare(cell)


def _dask_cell(cell: Cell, prepared: tuple[Any, float], topic: str) -> CellRecord:
    with threadpool_limits(limits=1), _reporting(topic, cell.cell_id), on_dask_worker():
        return _run_cell(cell, *prepared)


@contextlib.contextmanager
def _reporting(topic: str, cell_id: str) -> Iterator[None]:
    """On a Dask worker, while the block runs the cell ``cell_id``: say what it is doing
    every :data:`PROGRESS_INTERVAL_S` / 2 seconds (when that changed) as an event on
    ``topic`` (:class:`_ClusterReports`), and that it is done at the end."""
    from dask.distributed import get_worker

    worker = get_worker()  # its log_event may be called from another thread

    def send(now: dict[str, str]) -> None:
        worker.log_event(topic, [cell_id, now.get(cell_id, "")])

    stop = report_every(PROGRESS_INTERVAL_S / 2, send)
    try:
        yield
    finally:
        stop.set()
        worker.log_event(topic, [cell_id, None])


class _ClusterReports:
    """What the cells running on a Dask cluster are doing: the events its workers send on
    a topic of this run's own (:func:`_reporting`), and the cells this process simulates
    (the cluster plan's, :func:`_run_split`)."""

    def __init__(self, client: Any) -> None:
        self.topic = f"p2pdp-progress-{uuid.uuid4().hex}"
        self.reports: dict[str, str] = {}
        client.subscribe_topic(self.topic, self._received)

    def _received(self, event: tuple[float, list]) -> None:
        cell, text = event[1]
        if text is None:
            self.reports.pop(cell, None)
        else:
            self.reports[cell] = text

    def running(self) -> dict[str, str]:
        return {**self.reports, **running()}


def _run_dask(cells: Sequence[Cell], client: Any, topic: str) -> Generator[CellRecord, None, None]:
    """One future per training key, one per cell depending on it; records as cells finish.
    The workers say what their cells are doing on ``topic`` (:func:`_reporting`).

    The client keeps no reference to the trainings, so Dask frees each one when its last
    cell is done. The keys the cluster plan covers (:func:`p2pdp.experiments.run.cluster.plan_gap`)
    are trained in blocks on the workers instead, one after the other while the futures run,
    and their cells simulated here, their peers scored on the workers.
    """
    from dask.distributed import as_completed as dask_completed

    from p2pdp.experiments.run.cluster import scheduler_watch

    futures, split = [], []
    for group in training_groups(cells):
        if plan_gap(group[0].config) is None:
            split.append(group)
            continue
        prepared = client.submit(_dask_prepare, group[0], topic, pure=False)
        futures += [client.submit(_dask_cell, cell, prepared, topic, pure=False) for cell in group]
        del prepared
    try:
        with scheduler_watch(client):
            for group in split:
                yield from _run_split(group, client)
            for future in dask_completed(futures):
                yield future.result()
    finally:
        client.cancel(futures)


def _run_split(cells: Task, client: Any) -> Iterator[CellRecord]:
    """The cells of one training key the cluster plan covers: trained in blocks on the
    workers, simulated here, scored on the workers (:mod:`p2pdp.experiments.run.cluster`)."""
    first = cells[0]
    start = time.perf_counter()
    with running_cell(first.cell_id):
        set_phase("data and local models")
        trained = prepare_on_cluster(
            client, first.config, fold=first.fold, repetition=first.repetition
        )
    seconds = time.perf_counter() - start
    workers = max(1, sum(client.nthreads().values()))
    with threadpool_limits(limits=1), remote_workers(dask_pieces(client), workers):
        for cell in cells:
            yield _run_cell(cell, trained, seconds)


# --- progress ---------------------------------------------------------------------------------
class _Progress:
    """Cells done, rate, elapsed time and ETA: a redrawn bar on a TTY, log lines otherwise.

    A background thread redraws the bar, or prints a line, whenever nothing was shown for
    :data:`PROGRESS_INTERVAL_S` seconds, so a long cell does not leave the run silent. Off a
    TTY, lines come at most that often (and once at the end). The line also says what the
    running cells are doing, as ``running()`` says (:func:`p2pdp.core.progress.running` of
    this process, or what the workers reported): ``(running: p0-f1-r0 simulation, round 12
    of 100; p1-f0-r0 data and local models; +2 more)``. On a TTY the bar is cut to the
    terminal's width.
    """

    def __init__(
        self,
        total: int,
        done: int,
        stream: TextIO | None,
        *,
        running: Callable[[], dict[str, str]] = running,
    ) -> None:
        self.total, self.done, self.stream = total, done, stream
        self.running = running
        self.finished: set[str] = set()  # a report may come after the cell's record
        self.start_done, self.start = done, time.perf_counter()
        self.interval = PROGRESS_INTERVAL_S
        self.tty = stream is not None and stream.isatty()
        self._lock = threading.Lock()
        self._shown = self.start
        self._stop = threading.Event()
        self._thread = None
        if stream is not None:
            if done:
                self._print(f"resuming: {done} of {total} cells already done")
            self._thread = threading.Thread(target=self._beat, name="p2pdp-progress", daemon=True)
            self._thread.start()

    def update(self, cell_id: str) -> None:
        """Count the cell ``cell_id`` done (and show the line, if due)."""
        with self._lock:
            self.done += 1
            self.finished.add(cell_id)
        due = time.perf_counter() - self._shown >= self.interval
        if self.tty or due or self.done == self.total:
            self._show()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.tty:
            self._print("")

    def _beat(self) -> None:
        while not self._stop.wait(max(0.01, self._shown + self.interval - time.perf_counter())):
            if time.perf_counter() - self._shown >= self.interval:
                self._show()

    def _show(self) -> None:
        with self._lock:
            now = time.perf_counter()
            elapsed = now - self.start
            rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            status = (
                f"{self.done}/{self.total} cells, {rate:.2f} cells/s, "
                f"{_duration(elapsed)} elapsed, ETA {_duration(eta)}"
            )
            if self.done < self.total:
                status += self._running()
            if self.tty:
                filled = round(30 * self.done / max(self.total, 1))
                line = f"[{'#' * filled}{'.' * (30 - filled)}] {status}"
                width = shutil.get_terminal_size().columns - 1
                self._print(f"\r{line[:width]}\x1b[K", end="")  # erase the longer line before
            else:
                self._print(f"p2pdp run: {status}")
            self._shown = now

    def _running(self) -> str:
        """`` (running: CELL WHAT; ...)`` for the first two running cells, in grid order."""
        cells = sorted(
            (cell, text) for cell, text in self.running().items() if cell not in self.finished
        )
        if not cells:
            return ""
        shown = "; ".join(f"{cell} {text}".rstrip() for cell, text in cells[:2])
        more = f"; +{len(cells) - 2} more" if len(cells) > 2 else ""
        return f" (running: {shown}{more})"

    def _print(self, text: str, end: str = "\n") -> None:
        if self.stream is not None:
            print(text, end=end, file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
