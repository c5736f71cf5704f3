"""Results that survive a crash, in one folder written by one process at a time.

``results.csv``
    One row per cell (grid point x fold x repetition): ``cell_id``, ``point``, every config
    setting, the seed, fold, repetition, the metrics, and wall times (columns ``wall_*``, the
    only ones that differ between two runs of the same scenario). A cell's row is written and
    flushed as soon as the cell finishes, so killing the run (Ctrl-C, SIGTERM, ``kill -9``)
    loses at most the cells in flight; the files are fsync'ed at least every
    :data:`SYNC_INTERVAL_S` seconds and at the end, so a power cut loses at most that much
    more. At the end every file is rewritten sorted by ``cell_id`` (atomically), so a resumed
    run's files equal an uninterrupted one's.
``roc.csv``
    The best peer's ROC curve of every cell (``cell_id, fpr, tpr``), sampled at the false
    positive rates :data:`~.files.ROC_FPR` (linear interpolation between the curve's points), which
    lets the report average curves over folds.
``<table>.csv``
    Extra per-cell tables (:attr:`CellRecord.tables`, e.g. ``releases.csv``, ``peers.csv``):
    ``cell_id`` first, then the table's columns, any number of rows per cell.
``manifest.json``
    The scenario (text, source, ``--set`` overrides, hash), the grid's cell ids, what the
    cells depend on (``inputs``: p2pdp's version and the data files' sha256, see
    :func:`~.manifest.run_inputs`), library versions, git commit, the extra tables, and every
    session (start, end, backend, cells run, pid, host), the ``runtime`` and, for a network run, its
    ``hosts`` (``--hosts``); ``status`` is ``running``, ``complete``,
    ``failed`` or ``interrupted`` (then ``error`` says why). Replaced atomically (write a
    temporary file, then :func:`os.replace`).
``.p2pdp.lock``, ``.p2pdp.lock.json``
    The folder lock (:class:`~.lock.FolderLock`) and who holds it.

A cell writes its extra tables first, then its ROC curve, then its results row, which records
how many rows it wrote to each (column :data:`~.files.TABLE_ROWS`): a cell is done when its
results row is complete and its other rows are all there. :func:`~.files.repair` (run by
``--resume`` and by the report) drops a line cut short by a crash and the rows of other tables
whose cell has no results row; :func:`~.files.incomplete_cells` finds cells whose other rows
were lost since (``--resume`` runs them again; the report refuses the folder until then).

This module writes the folder (:class:`ResultsStore`); the files' names and readers are in
:mod:`p2pdp.experiments.results.files`, the manifest's contents and checks in
:mod:`~p2pdp.experiments.results.manifest`, the lock in :mod:`~p2pdp.experiments.results.lock`
and the CSV text in :mod:`~p2pdp.experiments.results.tables`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.core.files import write_atomic
from p2pdp.experiments.results.files import (
    MANIFEST_FILE,
    RESULTS_FILE,
    ROC_FPR,
    TABLE_ROWS,
    _drop_cells,
    _format_counts,
    _recorded_cells,
    _remove_results,
    incomplete_cells,
    read_manifest,
    repair,
)
from p2pdp.experiments.results.lock import FolderLock, make_folder
from p2pdp.experiments.results.manifest import (
    _check_cell_ids,
    _check_inputs,
    _new_manifest,
    _now,
    _scenario_change,
    _scenario_fields,
    resume_command,
    run_inputs,
)
from p2pdp.experiments.results.tables import ColumnTable, _csv_text, _naming, _read_rows
from p2pdp.experiments.scenarios.scenario import Scenario

#: Seconds between two fsyncs of the CSV files (and updates of the manifest) during a run.
SYNC_INTERVAL_S = 2.0
_ROC_COLUMNS = ("cell_id", "fpr", "tpr")
_RESERVED_TABLES = ("results", "roc", "manifest")
_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True, slots=True, kw_only=True)
class CellRecord:
    """What one finished cell leaves behind: its results row, ROC curve and extra tables.

    ``roc_tpr`` is the best peer's true positive rate at each false positive rate of
    :data:`ROC_FPR`, shape (101,), values in [0, 1]. ``tables`` maps a table name (lower
    case letters, digits and ``_``, not ``results``, ``roc`` or ``manifest``) to its rows for
    this cell, e.g. ``{"releases": [{...}, ...], "peers": [...]}``; every row of a table has
    the same keys, and is written to ``<name>.csv`` after a ``cell_id`` column.
    """

    cell_id: str
    row: dict[str, Any]
    roc_tpr: np.ndarray | None
    tables: dict[str, Sequence[dict[str, Any]]] = field(default_factory=dict)


class ResultsStore:
    """The output folder of one experiment; create it with :meth:`open`, use it as a context.

    Holds the folder's :class:`FolderLock` from :meth:`open` until :meth:`finish`,
    :meth:`fail` or the end of the ``with`` block (an exception there marks the run failed).
    """

    def __init__(
        self,
        directory: Path,
        manifest: dict[str, Any],
        done: frozenset[str],
        lock: FolderLock,
        *,
        resumed: bool,
    ) -> None:
        self.directory = directory
        self.manifest = manifest
        self.done = done
        self.lock = lock
        self.resumed = resumed
        self._files: dict[str, TextIO] = {}
        self._columns: dict[str, tuple[str, ...]] = {}
        # per file this session started: the length in bytes of each _write (some of one
        # cell's rows), keyed by cell_id, after the header; finish sorts these pieces of the
        # file (if they are not in order) instead of parsing it
        self._pieces: dict[str, list[tuple[str, int]]] = {}
        self._last_sync = time.monotonic()
        self.closed = False

    @classmethod
    def open(
        cls,
        directory: str | Path,
        scenario: Scenario,
        *,
        n_cells: int,
        backend: str,
        resume: bool = False,
        force: bool = False,
        cell_ids: Sequence[str] | None = None,
        runtime: str = "simulation",
        hosts: str | None = None,
        read_data: bool = True,
    ) -> ResultsStore:
        """Lock ``directory``, check it against ``scenario``, then create or reopen the store.

        A folder in which no cell was recorded (no folder, an empty one, or one left by a run
        that failed or was stopped before its first cell) starts afresh. A folder holding
        results is refused unless ``resume`` is set and its scenario hash equals
        ``scenario.digest`` (then the cells already in ``results.csv`` are :attr:`done`,
        after :func:`repair`), or ``force`` is set (then the old files are deleted first).
        A resume is also refused if what the cells depend on changed (:func:`run_inputs`:
        the p2pdp version, the data files' sha256) or a row names a cell outside
        ``cell_ids``, or the folder's cells ran on another ``runtime`` (``simulation`` or
        ``network``: their rows must not mix); a cell whose rows in ``roc.csv`` or an extra
        table are missing (a file deleted or cut) is not done: its rows are dropped and it
        runs again. ``hosts`` (a network run's ``--hosts``, if given) is recorded for
        :func:`resume_command`. ``read_data`` false (a network coordinator that holds no
        data): the data files are not fingerprinted, nor opened (:func:`run_inputs`).

        Raises
        ------
        FolderInUseError
            If another process writes the folder.
        ConfigError
            If ``directory`` cannot be created or written, holds damaged results, results of
            another scenario, or of this one without ``resume``/``force``.
        """
        directory = make_folder(directory)
        lock = FolderLock(directory, purpose="p2pdp run").acquire()
        try:
            existing = None
            if force or not _recorded_cells(directory):
                _remove_results(directory)  # nothing recorded, or discarded: start afresh
            elif (directory / MANIFEST_FILE).exists():
                existing = read_manifest(directory)
            if existing is None and (directory / RESULTS_FILE).exists():
                raise ConfigError(
                    f"--out {directory} holds a {RESULTS_FILE} without a {MANIFEST_FILE}; "
                    "use --force to overwrite it, or another --out"
                )
            change = None
            if existing is not None:
                change = _scenario_change(directory, existing, scenario, cell_ids, resume=resume)
            session = {
                "started": _now(),
                "finished": None,
                "backend": backend,
                "cells_run": 0,
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }
            inputs = run_inputs(scenario, read_data=read_data)
            if existing is not None:
                before = existing.get("runtime", "simulation")
                if before != runtime:
                    raise ConfigError(
                        f"--out {directory} holds cells run on the {before} runtime; resume "
                        f"them on the same one (`{resume_command(directory, existing)}`), or "
                        "--force to discard them"
                    )
                _check_inputs(directory, existing, inputs)
                done = repair(directory)
                _check_cell_ids(directory, existing, done)
                broken = incomplete_cells(directory)
                if broken:
                    _drop_cells(directory, broken)
                    done -= broken.keys()
                manifest = existing
                manifest["sessions"].append(session)
                manifest.setdefault("tables", [])
                if change is not None:  # more folds: this scenario's grid from now on
                    change["session"] = len(manifest["sessions"]) - 1
                    manifest.setdefault("changes", []).append(change)
                    manifest.update(
                        _scenario_fields(scenario), cells=n_cells, cell_ids=list(cell_ids or ())
                    )
            else:
                done = frozenset()
                manifest = _new_manifest(scenario, n_cells, cell_ids, inputs)
                manifest["runtime"] = runtime
                manifest["sessions"] = [session]
            if runtime == "network":
                manifest["hosts"] = hosts
            manifest["status"] = "running"
            manifest.pop("error", None)
            store = cls(directory, manifest, done, lock, resumed=existing is not None)
            store._write_manifest()
        except BaseException:
            lock.release()
            raise
        return store

    def append(self, records: Sequence[CellRecord]) -> None:
        """Write finished cells (extra tables, ROC, then results row) and flush them.

        The files are fsync'ed (and the manifest updated) when :data:`SYNC_INTERVAL_S` has
        passed since the last time, and at the end.
        """
        for record in records:
            tables = [
                (name, _table_columns(record.cell_id, name, rows), rows)
                for name, rows in record.tables.items()
                if rows
            ]
            for name, columns, rows in tables:
                if isinstance(rows, ColumnTable):
                    for text in rows.csv_blocks(record.cell_id):
                        self._write(name, columns, record.cell_id, text)
                else:
                    lines = [(record.cell_id, *row.values()) for row in rows]
                    self._write(name, columns, record.cell_id, _csv_text(lines))
            if record.roc_tpr is not None:  # a task without a ROC curve writes none
                self._write(
                    "roc",
                    _ROC_COLUMNS,
                    record.cell_id,
                    _csv_text(
                        [
                            (record.cell_id, repr(float(x)), repr(float(y)))
                            for x, y in zip(ROC_FPR, record.roc_tpr, strict=True)
                        ]
                    ),
                )
            counts = {name: len(rows) for name, _, rows in tables}
            if record.roc_tpr is not None:
                counts["roc"] = len(ROC_FPR)
            row = {**record.row, TABLE_ROWS: _format_counts(counts)}
            columns = tuple(row)
            line = _csv_text([tuple(row[c] for c in columns)])
            self._write("results", columns, record.cell_id, line)
            self.manifest["sessions"][-1]["cells_run"] += 1
        if time.monotonic() - self._last_sync >= SYNC_INTERVAL_S:
            self.sync()

    def sync(self) -> None:
        """fsync every open CSV file and rewrite the manifest."""
        for file in self._files.values():
            with _naming(file.name):
                file.flush()
                os.fsync(file.fileno())
        self._write_manifest()
        self._last_sync = time.monotonic()

    def finish(self) -> None:
        """Sort every CSV file by ``cell_id`` (atomically), mark complete, release the lock.

        A file this session started is sorted from the text of each cell it wrote (kept in
        memory, the same bytes as the file); a resumed one is read back and parsed.

        Interrupted meanwhile (Ctrl-C after the last cell), the run is marked ``interrupted``
        like any other: ``--resume`` then completes it.
        """
        try:
            self._finish()
        except BaseException as error:
            self.fail(error)
            raise
        self.closed = True
        self.lock.release()

    def _finish(self) -> None:
        self._close_files()
        for name in ("results", "roc", *self.manifest["tables"]):
            path = self.directory / f"{name}.csv"
            pieces = self._pieces.get(name)
            if pieces is not None:  # written whole by this session: its rows are known
                order = sorted(range(len(pieces)), key=lambda i: pieces[i][0])  # stable
                if order != list(range(len(pieces))):  # else the file is in order already
                    data = memoryview(path.read_bytes())
                    ends = np.cumsum([0, *(size for _, size in pieces)]) + (
                        len(data) - sum(size for _, size in pieces)
                    )  # the header, then each piece
                    texts = [data[ends[i] : ends[i + 1]] for i in order]
                    write_atomic(path, b"".join([data[: ends[0]], *texts]))
            elif path.exists():
                header, *rows = _read_rows(path)
                rows.sort(key=lambda row: row[0])  # stable: keeps each cell's rows in order
                write_atomic(path, _csv_text([header, *rows]))
        finished = _now()
        self.manifest["sessions"][-1]["finished"] = finished
        self.manifest.update(status="complete", finished=finished)
        self._write_manifest()

    def fail(self, error: BaseException) -> None:
        """Mark the run ``failed`` (``interrupted`` for KeyboardInterrupt) and release the lock.

        The cells written so far stay (``--resume`` finishes the rest); the manifest's
        ``error`` says why, e.g. ``"DataError: spambase.data not found"`` or
        ``"interrupted by SIGTERM"``.
        """
        try:
            with contextlib.suppress(OSError):  # e.g. a full disk: still record the failure
                self._close_files()
            if isinstance(error, KeyboardInterrupt):
                status, text = (
                    "interrupted",
                    f"interrupted by {error.args[0] if error.args else 'SIGINT'}",
                )
            else:
                status, text = "failed", f"{type(error).__name__}: {error}"
            session = self.manifest["sessions"][-1]
            session.update(finished=_now(), error=text)
            self.manifest.update(status=status, error=text)
            self._write_manifest()
        finally:
            self.closed = True
            self.lock.release()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        if self.closed:
            return
        if error is not None:
            self.fail(error)
        else:
            try:
                self._close_files()
                self._write_manifest()
            finally:
                self.closed = True
                self.lock.release()

    # --- internals ----------------------------------------------------------------------------
    def _write(self, name: str, columns: tuple[str, ...], cell_id: str, text: str) -> None:
        """Append cell ``cell_id``'s CSV lines ``text`` (each starting with ``cell_id``) to
        ``<name>.csv`` and flush them."""
        file = self._files.get(name) or self._open_table(name, columns)
        if self._columns[name] != columns:
            raise ConfigError(
                f"{self.directory / f'{name}.csv'} has columns {list(self._columns[name])}, "
                f"but this run writes {list(columns)}; use --force to start over"
            )
        with _naming(file.name):
            file.write(text)
            file.flush()
        pieces = self._pieces.get(name)
        if pieces is not None:
            pieces.append((cell_id, len(text.encode("utf-8"))))

    def _open_table(self, name: str, columns: tuple[str, ...]) -> TextIO:
        """Open ``<name>.csv`` for appending: continue a resumed file, else start it afresh."""
        path = self.directory / f"{name}.csv"
        if name in ("results", "roc"):
            known = self.resumed
        else:
            known = name in self.manifest["tables"]
            if not known:  # the manifest names a table before its first row is written
                self.manifest["tables"].append(name)
                self._write_manifest()
        if known and path.exists() and path.stat().st_size > 0:
            header = tuple(_read_rows(path)[0])
            if header != columns:
                raise ConfigError(
                    f"{path} has columns {list(header)}, but this run writes {list(columns)}; "
                    "use --force to start over"
                )
            file = path.open("a", newline="", encoding="utf-8")
        else:  # a file not written by this run's sessions is a leftover: replace it
            file = path.open("w", newline="", encoding="utf-8")
            file.write(_csv_text([columns]))
            self._pieces[name] = []
        self._files[name] = file
        self._columns[name] = columns
        return file

    def _close_files(self) -> None:
        files, self._files = self._files, {}
        for file in files.values():
            try:
                file.flush()
                os.fsync(file.fileno())
            finally:
                file.close()

    def _write_manifest(self) -> None:
        path = self.directory / MANIFEST_FILE
        text = json.dumps(self.manifest, indent=2) + "\n"
        try:
            write_atomic(path, text)
        except OSError:
            if not path.exists():
                raise
            # No room for a second copy (a full disk): overwrite the manifest in place, which
            # needs no new blocks when it is not longer than before, so the status is recorded.
            with _naming(path), path.open("r+", encoding="utf-8") as file:
                file.write(text)
                file.truncate()


def _table_columns(cell_id: str, name: str, rows: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """``("cell_id", *keys)`` of an extra table's rows; ConfigError for a bad name or rows."""
    if not _TABLE_NAME.fullmatch(name) or name in _RESERVED_TABLES:
        raise ConfigError(
            f"table name {name!r}: use lower case letters, digits and _, and not "
            f"{', '.join(_RESERVED_TABLES)}"
        )
    keys = tuple(rows[0])
    for row in [rows[0]] if isinstance(rows, ColumnTable) else rows:  # one set of columns
        if tuple(row) != keys or "cell_id" in row:
            raise ConfigError(
                f"table {name!r} of cell {cell_id}: a row has columns {list(row)}, the first "
                f"{list(keys)} (no cell_id: it is added)"
            )
    return ("cell_id", *keys)
