"""A run's cells, and one cell run: what every backend of the runner hands a worker.

A *cell* (:class:`Cell`) is one grid point, one fold and one repetition: one
:func:`p2pdp.simulate` call. Cells whose :func:`~p2pdp.tasks.pipeline.training_key` is equal
share one local training (:func:`training_groups`); :func:`iter_task` trains once for such a
group (a :data:`Task`) and simulates its cells, each into a
:class:`~p2pdp.experiments.results.store.CellRecord`. The backends that share the cells out
are :mod:`p2pdp.experiments.run.workers` and :mod:`p2pdp.experiments.run.dask_backend`;
:mod:`p2pdp.experiments.run.runner` chooses one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from threadpoolctl import threadpool_limits

from p2pdp.config import ScenarioConfig
from p2pdp.core.parallel import local_workers
from p2pdp.core.progress import running_cell, set_phase
from p2pdp.experiments.network.hosts_file import coordinator_scores
from p2pdp.experiments.results.files import roc_on_grid
from p2pdp.experiments.results.store import CellRecord
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.disclosure import non_private_column
from p2pdp.experiments.scenarios.scenario import Scenario
from p2pdp.tasks import make_task, prepared

Task = tuple["Cell", ...]


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
