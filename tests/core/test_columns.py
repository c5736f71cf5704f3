"""Per-release state as arrays (issue 43): core/columns.py's Rows and Ragged, the release
records' table, the release log and the results tables written in blocks, and the wiring: a
simulated run hands the task the world's own arrays (no copy, no object per release)."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest

from p2pdp.core.columns import Ragged, Rows
from p2pdp.experiments.results.tables import ColumnTable
from p2pdp.experiments.run import oneshot, simulation
from p2pdp.privacy.release import ReleaseRecord, ReleaseTable, record_column

SMALL = {
    "name": "small",
    "seed": 5,
    "data": {
        "dataset": "synthetic",
        "synthetic_rows": 1200,
        "synthetic_test_rows": 200,
        "synthetic_features": 4,
    },
    "partition": {"n_peers": 60},
    "groups": {"group_size": 5},
    "evaluation": {"split": "fixed"},
}


def test_rows_grow_past_their_capacity_and_read_as_one_array_without_a_copy():
    rng = np.random.default_rng(0)
    expected = rng.standard_normal((50, 3))
    rows = Rows((3,), np.float64, capacity=4)
    rows.append(expected[0])
    rows.extend(expected[1:20])
    rows.extend(list(expected[20:21]))  # a list of rows
    rows.reserve(10)  # smaller than held: no-op
    rows.extend(expected[21:])
    assert len(rows) == 50 and rows.array.shape == (50, 3)
    np.testing.assert_array_equal(rows.array, expected)
    np.testing.assert_array_equal(rows[7], expected[7])
    view = np.asarray(rows, dtype=np.float64)
    assert np.shares_memory(view, rows.array) and view.shape == (50, 3)
    assert not np.shares_memory(np.array(rows, copy=True), rows.array)
    assert np.asarray(rows, dtype=np.float32).dtype == np.float32
    assert Rows((2,), np.int64).array.shape == (0, 2)


def test_ragged_rows_read_back_as_given():
    rng = np.random.default_rng(1)
    given = [rng.integers(0, 100, size) for size in (3, 1, 4, 0, 2)]
    ragged = Ragged()
    for row in given:
        ragged.append(row)
    block = rng.integers(0, 100, (6, 5))
    ragged.extend(block)
    given += list(block)
    assert len(ragged) == len(given)
    for got, want in zip(ragged, given, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ragged[-1], given[-1])
    np.testing.assert_array_equal(ragged[2], given[2])
    assert [len(row) for row in ragged[1:4]] == [1, 4, 0]
    assert ragged.offsets.tolist() == np.cumsum([0, *map(len, given)]).tolist()
    with pytest.raises(IndexError):
        ragged[len(given)]


def _records(n: int, rng: np.random.Generator) -> list[ReleaseRecord]:
    names = ["vector-laplace", "gaussian"]
    return [
        ReleaseRecord(
            int(rng.integers(1, 20)),
            int(rng.integers(1, 9)),
            float(rng.random()),
            names[i % 2],
            [1.0, math.inf][i % 2],
            0.0,
            float(rng.random()),
            float(rng.random()),
            [float(rng.random()), math.nan][i % 3 == 0],
            bool(i % 2),
        )
        for i in range(n)
    ]


def test_a_release_table_gives_back_each_record_field_for_field():
    records = _records(25, np.random.default_rng(2))
    table = ReleaseTable()
    table.append(records[0])
    table.extend(records[1:])
    assert len(table) == 25
    for got, want in zip(table, records, strict=True):
        assert got._replace(noise_norm=0.0) == want._replace(noise_norm=0.0)
        assert [type(v) for v in got] == [type(v) for v in want]
        assert got.noise_norm == want.noise_norm or (
            math.isnan(got.noise_norm) and math.isnan(want.noise_norm)
        )
    assert table[-1].mechanism == records[-1].mechanism
    np.testing.assert_array_equal(
        record_column(table, "noise_std"), record_column(records, "noise_std")
    )
    assert table.column("mechanism").tolist() == [r.mechanism for r in records]


def test_a_table_of_numpy_columns_is_written_in_blocks_as_its_rows_would_be(monkeypatch):
    rng = np.random.default_rng(4)
    n = 23
    columns = {
        "time": rng.random(n),
        "group": np.arange(n, dtype=np.int64),
        "flag": rng.integers(0, 2, n).astype(bool),
        "name": np.array(["a,b"] * n, dtype=object),
        "fold": [0] * n,
    }
    table = ColumnTable(columns)
    rows = [
        {
            name: (v.item() if hasattr(v, "item") else v)
            for name, v in zip(columns, values, strict=True)
        }
        for values in zip(*columns.values(), strict=True)
    ]
    assert table == rows and table[-1] == rows[-1]
    assert all(type(table[0][name]) is type(rows[0][name]) for name in columns)
    expected = io.StringIO()
    csv.writer(expected, lineterminator="\n").writerows([("c", *row.values()) for row in rows])
    monkeypatch.setattr(ColumnTable, "BLOCK_ROWS", 5)
    blocks = list(table.csv_blocks("c"))
    assert len(blocks) == 5 and "".join(blocks) == expected.getvalue()


def test_a_simulated_run_hands_the_task_the_worlds_arrays(monkeypatch):
    """The Outcome's published models are the world's (K, d) array (not a copy: ten million
    receivers share it), its members and records the world's tables; the release log keeps
    no object per release; the releases table equals its rows."""
    seen = {}
    original = oneshot._outcome

    def outcome(world, dim):
        seen["world"], seen["outcome"] = world, original(world, dim)
        return seen["outcome"]

    monkeypatch.setattr(oneshot, "_outcome", outcome)
    result = simulation.simulate(SMALL)
    world, got = seen["world"], seen["outcome"]
    assert world.batched and result.aggregations == len(world.releases) > 0
    assert np.shares_memory(got.published, world.published.array)
    assert got.published.shape == (result.aggregations, 5) and got.published.dtype == np.float64
    assert isinstance(got.members, Ragged) and isinstance(got.releases, ReleaseTable)
    assert all(len(members) == 5 for members in got.members)
    per_peer = np.bincount(got.members.values, minlength=60)
    np.testing.assert_array_equal(per_peer, result.aggregations_per_peer)
    rows = result.release_rows()
    assert len(rows) == result.aggregations
    assert [row["group_size"] for row in rows] == [5] * result.aggregations
    assert [row["noise_std"] for row in rows] == [r.noise_std for r in world.releases]


def test_cells_written_out_of_order_are_sorted_at_the_end_from_the_file(tmp_path, monkeypatch):
    """The store keeps each piece's length, not its text: at the end it cuts the file into
    its pieces and sorts them by cell (stable: a cell's blocks keep their order)."""
    from p2pdp.experiments.results.store import CellRecord, ResultsStore
    from p2pdp.experiments.scenarios.scenario import parse_scenario

    monkeypatch.setattr(ColumnTable, "BLOCK_ROWS", 2)
    scenario = parse_scenario('name = "t"\n[partition]\nn_peers = 20\n')

    def cell(cell_id: str, n: int) -> CellRecord:
        table = ColumnTable({"i": np.arange(n), "x": np.linspace(0, 1, n)})
        return CellRecord(cell_id=cell_id, row={"v": n}, roc_tpr=None, tables={"t": table})

    store = ResultsStore.open(tmp_path, scenario, n_cells=3, backend="test")
    store.append([cell("c2", 3), cell("c0", 5)])
    store.append([cell("c1", 1)])
    store.finish()
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0] == "cell_id,i,x"
    expected = [
        f"{c},{i},{x!r}"
        for c, n in (("c0", 5), ("c1", 1), ("c2", 3))
        for i, x in enumerate(np.linspace(0, 1, n).tolist())
    ]
    assert lines[1:] == expected
