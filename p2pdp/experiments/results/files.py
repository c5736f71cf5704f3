"""The files of a results folder (:mod:`p2pdp.experiments.results.store` writes them): their
names, the ROC curves' grid, the readers that :mod:`p2pdp.results` re-exports, and the repair
of a folder left by a crash.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.core.files import write_atomic
from p2pdp.experiments.results.tables import _csv_text, _first_fields, _read_rows

if TYPE_CHECKING:  # pragma: no cover
    import pandas


RESULTS_FILE = "results.csv"


ROC_FILE = "roc.csv"


MANIFEST_FILE = "manifest.json"


#: False positive rates at which every cell's ROC curve is stored, in [0, 1].
ROC_FPR = np.linspace(0.0, 1.0, 101)


#: The setting that says which folds a run covers, not how a cell runs (each row has its
#: ``fold``): ``--resume`` may add folds to a run, whose rows of one grid point then differ in
#: this column only (the report ignores it).
CELL_SELECTION = "evaluation.folds"


#: Column of ``results.csv``: the rows the cell wrote to each other table, ``"peers:50;roc:101"``.
TABLE_ROWS = "table_rows"


def roc_on_grid(fpr: np.ndarray, tpr: np.ndarray) -> np.ndarray:
    """TPR of an ROC curve (non-decreasing ``fpr``, ``tpr``) at :data:`ROC_FPR`, shape (101,)."""
    return np.interp(ROC_FPR, fpr, tpr)


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a results folder (see the module docstring)."""
    path = Path(directory) / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(manifest, dict) or "scenario_hash" not in manifest:
        raise ConfigError(f"{path} is not a p2pdp manifest (no scenario_hash)")
    return manifest


def read_results(directory: str | Path) -> list[dict[str, str]]:
    """Rows of ``results.csv`` as dicts of strings, in file order.

    Only complete lines are read (a line still being written, or cut short by a crash, is
    left out), so this is safe while a run writes the folder.

    Raises
    ------
    ConfigError
        If the file is missing, a row has more or fewer fields than the header, or a cell
        appears twice (the message names the file and line).
    """
    path = Path(directory) / RESULTS_FILE
    if not path.exists():
        raise ConfigError(f"{path} not found: run `p2pdp run` with --out {directory} first")
    header, *rows = _read_rows(path) or [[]]
    _unique_cells(path, rows)
    return [dict(zip(header, row, strict=True)) for row in rows]


def read_roc(directory: str | Path) -> dict[str, np.ndarray]:
    """``{cell_id: tpr}`` with ``tpr`` of shape (101,) at :data:`ROC_FPR`; empty if no file."""
    path = Path(directory) / ROC_FILE
    if not path.exists():
        return {}
    curves: dict[str, list[float]] = {}
    for number, (cell_id, _, tpr) in enumerate(_read_rows(path)[1:], start=2):
        try:
            curves.setdefault(cell_id, []).append(float(tpr))
        except ValueError:
            raise ConfigError(f"{path}, line {number}: tpr {tpr!r} is not a number") from None
    for cell_id, points in curves.items():
        if len(points) != len(ROC_FPR):
            raise ConfigError(
                f"{path}: cell {cell_id} has {len(points)} ROC points, not {len(ROC_FPR)} "
                "(damaged, or written twice); rerun the cell with --force"
            )
    return {cell_id: np.array(tpr) for cell_id, tpr in curves.items()}


def load(directory: str | Path) -> dict[str, pandas.DataFrame]:
    """Every table of a results folder as pandas DataFrames, by table name.

    ``"results"`` (one row per cell), then each extra table the manifest lists (e.g.
    ``"releases"``, ``"peers"``) and ``"roc"``, those present. Values are parsed by
    :func:`pandas.read_csv`. Safe while a run writes the folder: only complete lines are
    read, and rows of cells whose results row is not written yet are left out.
    """
    import pandas as pd

    directory = Path(directory)
    results = read_results(directory)
    done = {row["cell_id"] for row in results}
    names = ["results"]
    if (directory / MANIFEST_FILE).exists():
        names += read_manifest(directory).get("tables", [])
    names.append("roc")
    frames = {}
    for name in names:
        path = directory / f"{name}.csv"
        if path.exists():
            header, *rows = _read_rows(path) or [[]]
            text = _csv_text([header, *(row for row in rows if row[0] in done)])
            frames[name] = pd.read_csv(io.StringIO(text))
    return frames


def repair(directory: str | Path) -> frozenset[str]:
    """Make a folder left by a crash consistent; return the ids of its finished cells.

    Drops a line cut short at the end of every CSV file, and the rows of ``roc.csv`` and
    the extra tables whose cell has no results row. Call it only while holding the
    folder's :class:`FolderLock`.
    """
    directory = Path(directory)
    tables = ["roc"]
    if (directory / MANIFEST_FILE).exists():
        tables += read_manifest(directory).get("tables", [])
    for name in ("results", *tables):
        _drop_partial_line(directory / f"{name}.csv")
    done = _recorded_cells(directory)
    for name in tables:
        path = directory / f"{name}.csv"
        # streamed: most folders have no orphan row, and a table can be ten million rows
        if path.exists() and path.stat().st_size > 0 and not done.issuperset(_first_fields(path)):
            header, *rows = _read_rows(path)
            write_atomic(path, _csv_text([header, *(row for row in rows if row[0] in done)]))
    return done


def _recorded_cells(directory: Path) -> frozenset[str]:
    """Ids of the cells with a complete row in ``results.csv`` (read only; checks the file)."""
    path = directory / RESULTS_FILE
    if not path.exists():
        return frozenset()
    rows = _read_rows(path)[1:]
    _unique_cells(path, rows)
    return frozenset(row[0] for row in rows)


def _unique_cells(path: Path, rows: Sequence[Sequence[str]]) -> None:
    seen: set[str] = set()
    for number, row in enumerate(rows, start=2):
        if row[0] in seen:
            raise ConfigError(
                f"{path}, line {number}: cell {row[0]} appears twice (two runs wrote this "
                "folder at once); use --force to start over"
            )
        seen.add(row[0])


def _remove_results(directory: Path) -> None:
    """Delete the CSV files and manifest of a folder (extra tables: those the manifest names)."""
    names = ["results", "roc"]
    try:
        names += read_manifest(directory).get("tables", [])
    except ConfigError:
        pass  # no or damaged manifest: a leftover extra table is replaced when first written
    for name in names:
        (directory / f"{name}.csv").unlink(missing_ok=True)
    (directory / MANIFEST_FILE).unlink(missing_ok=True)


def _drop_partial_line(path: Path) -> None:
    """Truncate a file after its last newline (a line cut short by a crash)."""
    if not path.exists() or _ends_with_a_line(path):  # the usual case: nothing read
        return
    with path.open("rb+") as file:
        file.truncate(file.read().rfind(b"\n") + 1)


def _format_counts(counts: dict[str, int]) -> str:
    return ";".join(f"{name}:{count}" for name, count in sorted(counts.items()))


def incomplete_cells(directory: str | Path) -> dict[str, list[str]]:
    """Cells of ``results.csv`` whose rows in other tables are missing, with those tables.

    Each results row records how many rows its cell wrote to each table (column
    :data:`TABLE_ROWS`); a table deleted, emptied or cut short since leaves its cells here.
    Rows written before that column existed are not checked.
    """
    directory = Path(directory)
    rows = read_results(directory)
    if not rows or TABLE_ROWS not in rows[0]:
        return {}
    counted: dict[str, dict[str, int]] = {}
    for name in {n for row in rows for n in _parse_counts(row[TABLE_ROWS])}:
        path = directory / f"{name}.csv"
        counts: dict[str, int] = {}
        if path.exists():  # streamed unless its last line was cut (then that line is ignored)
            ids = (
                _first_fields(path)
                if _ends_with_a_line(path)
                else (line[0] for line in _read_rows(path)[1:])
            )
            for cell in ids:
                counts[cell] = counts.get(cell, 0) + 1
        counted[name] = counts
    broken: dict[str, list[str]] = {}
    for row in rows:
        for name, count in _parse_counts(row[TABLE_ROWS]).items():
            if counted[name].get(row["cell_id"], 0) != count:
                broken.setdefault(row["cell_id"], []).append(f"{name}.csv")
    return broken


def _ends_with_a_line(path: Path) -> bool:
    """Whether ``path`` is empty or its last line is complete (ends with a newline)."""
    with path.open("rb") as file:
        if file.seek(0, 2) == 0:
            return True
        file.seek(-1, 2)
        return file.read(1) == b"\n"


def _parse_counts(text: str) -> dict[str, int]:
    return {name: int(count) for name, _, count in (p.partition(":") for p in text.split(";") if p)}


def _drop_cells(directory: Path, cells: Iterable[str]) -> None:
    """Remove every row of ``cells`` from every CSV file of the folder (atomically)."""
    drop = set(cells)
    for path in sorted(directory.glob("*.csv")):
        header, *rows = _read_rows(path) or [[]]
        kept = [row for row in rows if row[0] not in drop]
        if len(kept) < len(rows):
            write_atomic(path, _csv_text([header, *kept]))
