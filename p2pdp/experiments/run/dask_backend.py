"""The runner on a Dask distributed cluster (``scheduler="tcp://host:port"``).

One future per training key and one per cell depending on it (:func:`_run_dask`); a key the
cluster plan covers (:func:`p2pdp.experiments.run.cluster.plan_gap`: one large synthetic run)
is trained in blocks on the workers and simulated in this process instead
(:func:`_run_split`). The workers say what their cells are doing as events on a topic of the
run's own (:func:`_reporting`, :class:`_ClusterReports`). A cell runs as in this process
(:mod:`p2pdp.experiments.run.cells`), so the rows do not depend on where it ran.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from threadpoolctl import threadpool_limits

from p2pdp.core.errors import ConfigError
from p2pdp.core.parallel import remote_workers
from p2pdp.core.progress import report_every, running, running_cell, set_phase
from p2pdp.experiments.results.store import CellRecord
from p2pdp.experiments.run import cells as run_cells
from p2pdp.experiments.run import progress as run_progress
from p2pdp.experiments.run.cells import Cell, Task, training_groups
from p2pdp.experiments.run.cluster import dask_pieces, on_dask_worker, plan_gap, prepare_on_cluster

#: Seconds to wait for a Dask scheduler before giving up (nothing is written before).
SCHEDULER_TIMEOUT_S = 5.0


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
        return run_cells._prepare(cell)


def _dask_cell(cell: Cell, prepared: tuple[Any, float], topic: str) -> CellRecord:
    with threadpool_limits(limits=1), _reporting(topic, cell.cell_id), on_dask_worker():
        return run_cells._run_cell(cell, *prepared)


@contextlib.contextmanager
def _reporting(topic: str, cell_id: str) -> Iterator[None]:
    """On a Dask worker, while the block runs the cell ``cell_id``: say what it is doing
    every :data:`~p2pdp.experiments.run.progress.PROGRESS_INTERVAL_S` / 2 seconds (when that
    changed) as an event on ``topic`` (:class:`_ClusterReports`), and that it is done at the
    end."""
    from dask.distributed import get_worker

    worker = get_worker()  # its log_event may be called from another thread

    def send(now: dict[str, str]) -> None:
        worker.log_event(topic, [cell_id, now.get(cell_id, "")])

    stop = report_every(run_progress.PROGRESS_INTERVAL_S / 2, send)
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
            yield run_cells._run_cell(cell, trained, seconds)
