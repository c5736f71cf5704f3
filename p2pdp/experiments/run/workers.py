"""The runner's local worker processes (``jobs`` > 1): :class:`_WorkerPool`.

A worker trains a key, writes the trained object to a file in a private temporary folder
(read back by every worker that gets cells of that key, each keeping the last
:data:`CACHED_TRAININGS` it read), says so on the record queue and runs the key's first chunk
(:func:`chunks`, at most :data:`MAX_CHUNK` cells); the parent then dispatches the key's other
chunks to whichever workers are free. At most ``workers + 1`` keys are alive at once, in grid
order, and a key's file is deleted when its last cell is done. Records come back cell by cell
through a :class:`multiprocessing.Queue`. A cell runs as in this process
(:mod:`p2pdp.experiments.run.cells`), so the rows do not depend on the number of workers.
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from threadpoolctl import threadpool_limits

from p2pdp.core.boundary import problem
from p2pdp.core.parallel import worker_signals
from p2pdp.core.progress import report_every
from p2pdp.experiments.results.store import CellRecord
from p2pdp.experiments.run import cells as run_cells
from p2pdp.experiments.run import progress as run_progress
from p2pdp.experiments.run.cells import Cell, Task, training_groups
from p2pdp.tasks import make_task

#: Most cells (all of one training key) handed to a local worker at once.
MAX_CHUNK = 4


#: Trained objects a local worker keeps after reading them (the keys it is running cells of).
CACHED_TRAININGS = 2


def chunks(group: Task, *, workers: int) -> list[Task]:
    """``group`` (cells of one training key) cut into consecutive chunks of at most
    :data:`MAX_CHUNK` cells, small enough that ``workers`` workers all get some."""
    size = max(1, min(MAX_CHUNK, len(group) // (2 * workers)))
    return [group[i : i + size] for i in range(0, len(group), size)]


_RECORDS: Any = None  # in a worker process: the queue its records go to


def _start_worker(records: Any, parent: int) -> None:
    """Initialise a worker process: its record queue, on which it also says what its cells
    are doing every :data:`~p2pdp.experiments.run.progress.PROGRESS_INTERVAL_S` / 2 seconds
    (when that changed: :func:`~p2pdp.core.progress.report_every`); signals are the parent's
    business.

    The parent stops its workers on Ctrl-C or SIGTERM, so a worker ignores SIGINT (a
    terminal sends it to the whole process group) and dies on SIGTERM; on Linux it is also
    killed when the parent dies, even by ``kill -9``.
    """
    global _RECORDS
    _RECORDS = records
    worker_signals()
    pid = os.getpid()  # what its cells are doing, for the parent's progress line
    report_every(
        run_progress.PROGRESS_INTERVAL_S / 2, lambda now: records.put(("running", pid, now))
    )
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl
            os._exit(1)


def _train_and_stream(key: int, cells: Task, path: str | None) -> None:
    """In a worker: train ``cells``' key, save it to ``path`` (if other workers need it) and
    put ``("trained", key, seconds)`` on the queue, then run ``cells`` (the key's first chunk)."""
    with threadpool_limits(limits=1):
        trained, seconds = run_cells._prepare(cells[0])
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
            _RECORDS.put(run_cells._run_cell(cell, trained, seconds))


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
            _RECORDS.put(run_cells._run_cell(cell, trained, seconds))


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
