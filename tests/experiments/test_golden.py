"""Shipped scenarios give the same result rows as before the engine was opened (issue 10).

``tests/experiments/golden/`` holds each shipped scenario's file as it was and, for a few of its
cells, the rows that version of p2pdp wrote (every column but the wall times). Rerunning those cells
must reproduce what a change must not alter, each column compared as what it is (:data:`KINDS`):

- the cell's settings, texts and integer counters (messages, bytes, aggregations): exactly;
- the error columns as the numbers of wrong test labels they are (an error is wrong labels over
  test rows; a mean over peers, over test rows times peers; a median, over twice the test rows):
  the same counts, exactly, and each column checked to be such a count;
- the privacy bounds (epsilon spent, guaranteed epsilon and delta per aggregation): equal to a
  rounding (1e-12 relative), and the epsilon spent within the run's budget;
- other numbers (an AUC, means of counts, simulated seconds, which sum latencies drawn through
  numpy's SIMD kernels whose last bit differs across CPUs): to 1e-9 relative.

The default suite reruns one cell per scenario but adult; ``-m slow`` reruns every stored cell.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from p2pdp.experiments.run.cells import Cell, make_cells, run_task
from p2pdp.experiments.scenarios.scenario import parse_scenario
from p2pdp.tasks.pipeline import load_fold

GOLDEN = Path(__file__).parent / "golden"
#: Columns renamed since the golden rows were written: old name -> new name.
RENAMED = {"training.lam": "training.lambda"}


def _golden_rows() -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = {}
    with (GOLDEN / "rows.csv").open(newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            rows.setdefault(row.pop("scenario"), []).append(row)
    return rows


ROWS = _golden_rows()


def _text(value: object) -> str:
    return "" if value is None else str(value)


#: Error columns: the multiple of the test rows that makes each a count of wrong labels.
ERRORS = {
    "min_error": 1,
    "max_error": 1,
    "centralized_error": 1,
    "median_error": 2,  # the mean of two peers' counts when the peers are even
    "mean_error": "peers",
    "local_only_error": "peers",
}
#: Reported privacy bounds: equal to a rounding.
BOUNDS = (
    "max_epsilon_spent",
    "guaranteed_epsilon_per_aggregation",
    "guaranteed_delta_per_aggregation",
)
#: Numbers that are neither counts nor bounds: to 1e-9 relative.
FLOATS = (
    "std_error",
    "best_peer_auc",
    "mean_aggregations_per_peer",
    "mean_ensemble_size",
    "sim_time",
)
#: How each column is compared (every other one: as text, exactly).
KINDS = {
    **dict.fromkeys(ERRORS, "count"),
    **dict.fromkeys(BOUNDS, "bound"),
    **dict.fromkeys(FLOATS, "float"),
}


def _count(error: str, scale: int, where: str) -> int:
    """``error`` times ``scale``, checked to be a whole number of wrong labels."""
    wrong = float(error) * scale
    assert abs(wrong - round(wrong)) < 1e-6, f"{where}: {error} x {scale} is not a count"
    return round(wrong)


def _same(kind: str, new: str, old: str, *, scale: int, where: str) -> bool:
    """Whether ``new`` is ``old`` for a column of ``kind`` (:data:`KINDS`; ``scale``: the
    multiple that makes an error column a count)."""
    if kind == "count":
        return _count(new, scale, where) == _count(old, scale, where)
    if kind in ("bound", "float"):
        rel_tol = 1e-12 if kind == "bound" else 1e-9
        return math.isclose(float(new), float(old), rel_tol=rel_tol, abs_tol=1e-15)
    return new == old


def _test_rows(cell: Cell) -> int:
    config = cell.config
    fold = load_fold(
        config.data,
        config.evaluation,
        seed=config.seed,
        fold=cell.fold,
        repetition=cell.repetition,
    )
    return int(fold.y_test.size)


def _check(name: str, expected: list[dict[str, str]]) -> None:
    scenario = parse_scenario((GOLDEN / f"{name}.toml").read_text(), source=name)
    wanted = {row["cell_id"]: row for row in expected}
    cells = [cell for cell in make_cells(scenario) if cell.cell_id in wanted]
    assert len(cells) == len(wanted)
    for cell in cells:  # one cell per task: the golden cells of a scenario share no training
        (record,) = run_task((cell,))
        rows, peers = _test_rows(cell), cell.config.partition.n_peers
        for column, old in wanted[cell.cell_id].items():
            new = _text(record.row.get(RENAMED.get(column, column), record.row.get(column)))
            multiple = ERRORS.get(column, 1)
            scale = rows * (peers if multiple == "peers" else int(multiple))
            where = f"{name} {cell.cell_id} {column}"
            kind = KINDS.get(column, "text")
            assert _same(kind, new, old, scale=scale, where=where), f"{where}: {new} != {old}"
        row = record.row
        assert row["max_epsilon_spent"] <= cell.config.privacy.epsilon * (1 + 1e-12)
        assert 0 <= row["messages_lost"] <= row["messages_sent"]


#: Adult's cell takes ~30 s (1,000 peers on 32,561 rows): only in the slow run.
FAST = sorted(name for name in ROWS if name != "adult_group_vs_full")


@pytest.mark.integration
@pytest.mark.parametrize("name", FAST)
def test_one_cell_of_every_shipped_scenario_is_unchanged(name):
    _check(name, ROWS[name][:1])


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_golden_cell_is_unchanged(name):
    _check(name, ROWS[name])
