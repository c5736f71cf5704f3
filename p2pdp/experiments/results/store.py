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
    positive rates :data:`ROC_FPR` (linear interpolation between the curve's points), which
    lets the report average curves over folds.
``<table>.csv``
    Extra per-cell tables (:attr:`CellRecord.tables`, e.g. ``releases.csv``, ``peers.csv``):
    ``cell_id`` first, then the table's columns, any number of rows per cell.
``manifest.json``
    The scenario (text, source, ``--set`` overrides, hash), the grid's cell ids, what the
    cells depend on (``inputs``: p2pdp's version and the data files' sha256, see
    :func:`run_inputs`), library versions, git commit, the extra tables, and every session
    (start, end, backend, cells run, pid, host), the ``runtime`` and, for a network run, its
    ``hosts`` (``--hosts``); ``status`` is ``running``, ``complete``,
    ``failed`` or ``interrupted`` (then ``error`` says why). Replaced atomically (write a
    temporary file, then :func:`os.replace`).
``.p2pdp.lock``, ``.p2pdp.lock.json``
    The folder lock (:class:`FolderLock`) and who holds it.

A cell writes its extra tables first, then its ROC curve, then its results row, which
records how many rows it wrote to each (column :data:`TABLE_ROWS`): a cell is done when its
results row is complete and its other rows are all there. :func:`repair` (run by ``--resume``
and by the report) drops a line cut short by a crash and the rows of other tables whose cell
has no results row; :func:`incomplete_cells` finds cells whose other rows were lost since
(``--resume`` runs them again; the report refuses the folder until then).
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import operator
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, overload

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.core.files import write_atomic
from p2pdp.experiments.scenarios.scenario import (
    Scenario,
    format_change,
    parse_scenario,
    scenario_changes,
)

if TYPE_CHECKING:  # pragma: no cover
    import pandas

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

RESULTS_FILE = "results.csv"
ROC_FILE = "roc.csv"
MANIFEST_FILE = "manifest.json"
LOCK_FILE = ".p2pdp.lock"
LOCK_INFO_FILE = ".p2pdp.lock.json"
#: Seconds between two fsyncs of the CSV files (and updates of the manifest) during a run.
SYNC_INTERVAL_S = 2.0
#: False positive rates at which every cell's ROC curve is stored, in [0, 1].
ROC_FPR = np.linspace(0.0, 1.0, 101)
_ROC_COLUMNS = ("cell_id", "fpr", "tpr")
_RESERVED_TABLES = ("results", "roc", "manifest")
_TABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")
#: The setting that says which folds a run covers, not how a cell runs (each row has its
#: ``fold``): ``--resume`` may add folds to a run, whose rows of one grid point then differ in
#: this column only (the report ignores it).
CELL_SELECTION = "evaluation.folds"
#: Column of ``results.csv``: the rows the cell wrote to each other table, ``"peers:50;roc:101"``.
TABLE_ROWS = "table_rows"
_VERSIONED = ("p2pdp", "numpy", "scipy", "simpy", "scikit-learn", "networkx", "matplotlib")


class FolderInUseError(ConfigError):
    """Another process (or this one) holds the lock of a results folder."""


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


class RowSequence(Sequence[dict[str, Any]]):
    """A sequence of row dicts built when read: equal to (and shown as) the list of its rows."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, like the list it stands for

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        n = len(self)
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(n))]
        if not -n <= index < n:
            raise IndexError(index)
        return self._row(index)

    def _row(self, index: int) -> dict[str, Any]:
        """Row ``index`` (in ``[-len, len)``) as a dict."""
        raise NotImplementedError


class ColumnTable(RowSequence):
    """A table's rows given column by column, ``{column: values}`` (each a list or a 1-D
    numpy array, all as long), for :attr:`CellRecord.tables`: written as the same text as
    its rows as dicts (``str`` of each value, ``repr`` of a float, quoted as :mod:`csv`
    quotes), without building a dict per row; reads as the sequence of those dicts (a numpy
    column's values as Python scalars, ``ndarray.tolist``).

    A column holding one object (``[value] * n``) is converted to text once, a column of
    floats, of ints or of bools with :class:`str` (as :mod:`csv` does; each distinct float
    once when they repeat), others value by value. The text is made ``BLOCK_ROWS`` rows
    at a time (:meth:`csv_blocks`): a table of ten million rows never holds a Python object
    per value.
    """

    __slots__ = ("_n", "columns")

    #: Rows converted to text at a time (:meth:`csv_blocks`).
    BLOCK_ROWS = 65536

    def __init__(self, columns: dict[str, Any]) -> None:  # lists or 1-D arrays
        lengths = {len(values) for values in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths {sorted(lengths)}: {list(columns)}")
        self.columns = columns
        self._n = lengths.pop() if lengths else 0

    def __len__(self) -> int:
        return self._n

    def _row(self, index: int) -> dict[str, Any]:
        return {name: _value(values, index) for name, values in self.columns.items()}

    def csv_blocks(self, cell_id: str) -> Iterator[str]:
        """The table's CSV lines after a ``cell_id`` column (no header), ``BLOCK_ROWS``
        rows at a time."""
        cell = _csv_field(cell_id)
        for start in range(0, self._n, self.BLOCK_ROWS):
            stop = min(start + self.BLOCK_ROWS, self._n)
            texts = [[cell] * (stop - start)]
            texts += [
                _column_texts(_values(values, start, stop)) for values in self.columns.values()
            ]
            yield "".join([",".join(fields) + "\n" for fields in zip(*texts, strict=True)])

    def csv_text(self, cell_id: str) -> str:
        """The table's CSV lines after a ``cell_id`` column (no header)."""
        return "".join(self.csv_blocks(cell_id))


def _value(values: Sequence[Any], index: int) -> Any:
    """Entry ``index`` of a column: a Python scalar from a numpy array."""
    if isinstance(values, np.ndarray):
        return values[index : index + 1 or None].tolist()[0]
    return values[index]


def _values(values: Sequence[Any], start: int, stop: int) -> list[Any]:
    """Entries ``[start, stop)`` of a column as a list (Python scalars from a numpy array)."""
    return (
        values[start:stop].tolist() if isinstance(values, np.ndarray) else list(values[start:stop])
    )


def _csv_field(value: Any) -> str:
    """``value`` as :mod:`csv` writes it inside a row (quoted only where needed)."""
    return _csv_text([(value, "")])[:-2]  # a row of one field: "" would be quoted


def _column_texts(values: list[Any]) -> list[str]:
    """The CSV text of each of ``values`` (one column), as :func:`_csv_field` gives it."""
    if values and all(map(operator.is_, values, itertools.repeat(values[0]))):
        return [_csv_field(values[0])] * len(values)  # one object: one text
    kinds = set(map(type, values))
    if kinds == {float}:
        distinct = set(values)  # -0.0 == 0.0 but prints otherwise: no shared text for zeros
        if 4 * len(distinct) <= len(values) and 0.0 not in distinct:
            text = {value: str(value) for value in distinct}
            return list(map(text.__getitem__, values))
    if len(kinds) == 1 and kinds <= {float, int, bool}:
        return list(map(str, values))  # what csv writes for these, never quoted
    if kinds == {str}:  # equal strings print alike
        text = {value: _csv_field(value) for value in set(values)}
        return list(map(text.__getitem__, values))
    return [_csv_field(value) for value in values]


def roc_on_grid(fpr: np.ndarray, tpr: np.ndarray) -> np.ndarray:
    """TPR of an ROC curve (non-decreasing ``fpr``, ``tpr``) at :data:`ROC_FPR`, shape (101,)."""
    return np.interp(ROC_FPR, fpr, tpr)


# --- the folder lock --------------------------------------------------------------------------
_HELD: dict[str, FolderLock] = {}  # this process's locks, by real path of the folder


class FolderLock:
    """Exclusive lock on a results folder: one writer (``run``, ``report``) at a time.

    A POSIX record lock (:func:`fcntl.lockf`) on ``.p2pdp.lock``, taken without waiting: a
    second writer fails at once with :class:`FolderInUseError` naming the holder (purpose,
    pid, host, start time, read from ``.p2pdp.lock.json``). The kernel drops the lock when
    the holding process ends in any way (even ``kill -9``), and unlike ``flock`` it is not
    inherited by worker processes forked from the holder, so orphaned workers never keep a
    folder locked: a lock whose holder died is free, and the next writer takes it over
    (:attr:`previous` then holds the dead holder's info). Works on local and NFS folders.
    A process can hold a folder's lock only once (a second attempt fails the same way).
    """

    def __init__(self, directory: str | Path, *, purpose: str) -> None:
        self.directory = Path(directory)
        self.purpose = purpose
        self.info: dict[str, Any] = {}
        self.previous: dict[str, Any] | None = None
        self._fd: int | None = None
        self._key = os.path.realpath(self.directory)

    def acquire(self) -> FolderLock:
        """Take the lock or raise :class:`FolderInUseError` (ConfigError if not writable)."""
        if fcntl is None:  # pragma: no cover - not POSIX
            raise ConfigError("results folders need POSIX file locks (fcntl)")
        if self._key in _HELD:
            raise FolderInUseError(_in_use(self.directory, _HELD[self._key].info))
        try:
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"{self.directory}: cannot write there ({exc.strerror})") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # this process holds no lock on the file, so closing drops nothing
            info = _read_lock_info(self.directory)
            raise FolderInUseError(_in_use(self.directory, info)) from None
        self.previous = _read_lock_info(self.directory)  # left by a holder that died
        self.info = {
            "purpose": self.purpose,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _now(),
            "command": " ".join(sys.argv),
        }
        self._fd = fd
        _HELD[self._key] = self
        try:
            write_atomic(self.directory / LOCK_INFO_FILE, json.dumps(self.info) + "\n")
        except OSError as exc:
            self.release()
            raise ConfigError(f"{self.directory}: cannot write there ({exc.strerror})") from None
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Drop the lock (and its info file); does nothing if not held."""
        if self._fd is None:
            return
        try:
            (self.directory / LOCK_INFO_FILE).unlink(missing_ok=True)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            _HELD.pop(self._key, None)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_lock_info(directory: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((directory / LOCK_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _in_use(directory: Path, info: dict[str, Any] | None) -> str:
    if not info:
        holder = "another process (starting up)"
    else:
        holder = (
            f"{info.get('purpose', 'another process')} (pid {info.get('pid')} on "
            f"{info.get('host')}, started {info.get('started')})"
        )
    return f"{directory} is in use by {holder}; wait for it to finish or stop it first"


def make_folder(directory: str | Path, what: str = "--out") -> Path:
    """Create ``directory`` (and parents) or raise a one-line ConfigError naming the path.

    ``what`` names the argument in the message (``"--out"``).
    """
    directory = Path(directory)
    try:
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"{what} {directory} is a file, not a folder")
        for parent in directory.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise ConfigError(f"{what} {directory}: {parent} is a file, not a folder")
                break
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{what} {directory}: cannot create the folder ({exc.strerror})"
        ) from None
    return directory


# --- the store --------------------------------------------------------------------------------
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


# --- reading ----------------------------------------------------------------------------------
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
        if path.exists() and path.stat().st_size > 0:
            header, *rows = _read_rows(path)
            kept = [row for row in rows if row[0] in done]
            if len(kept) < len(rows):
                write_atomic(path, _csv_text([header, *kept]))
    return done


# --- helpers ----------------------------------------------------------------------------------
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
    if not path.exists():
        return
    with path.open("rb+") as file:
        data = file.read()
        if data and not data.endswith(b"\n"):
            file.truncate(data.rfind(b"\n") + 1)


def _read_rows(path: Path) -> list[list[str]]:
    """The complete lines of a CSV file, parsed; raises ConfigError if one is damaged.

    Text after the last newline (a line being written, or cut short) is ignored. Every row
    must have as many fields as the header.
    """
    try:
        data = path.read_bytes()
        text = data[: data.rfind(b"\n") + 1].decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is damaged: not UTF-8 text") from None
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise ConfigError(f"{path} is damaged: {exc}") from None
    if rows:
        width = len(rows[0])
        for number, row in enumerate(rows[1:], start=2):
            if len(row) != width:
                raise ConfigError(
                    f"{path}, line {number}: {len(row)} fields, the header has {width}; the "
                    "file is damaged (use --force to start over)"
                )
    return rows


def _csv_text(rows: Iterable[Sequence[Any]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


@contextlib.contextmanager
def _naming(path: str | Path) -> Iterator[None]:
    """Give an OSError raised meanwhile the file's path (a full disk says only "No space left")."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def run_inputs(scenario: Scenario, *, read_data: bool = True) -> dict[str, Any]:
    """What a scenario's cells depend on besides its settings: p2pdp's version, the data.

    ``{"p2pdp": version, "data": {file: sha256}}`` over the data files of every grid point
    (:func:`p2pdp.data.loaders.data_fingerprint`) and of every ``partition.path``. Recorded in
    the manifest; ``--resume`` refuses a folder whose inputs differ, so it never merges results
    of two data sets or versions. ``read_data`` false: no file is opened and ``data`` is
    empty (a network run whose coordinator holds no data: it cannot tell whether the hosts'
    shard files changed; a resume of a folder whose cells fingerprinted their data is refused).
    """
    from p2pdp.data.loaders import data_fingerprint, file_fingerprint

    data: dict[str, str] = {}
    if not read_data:
        return {"p2pdp": _version("p2pdp"), "data": data}
    for config in {point.config.data for point in scenario.points}:
        data.update(data_fingerprint(config))
    data.update(
        file_fingerprint({point.config.partition.path or "" for point in scenario.points} - {""})
    )
    return {"p2pdp": _version("p2pdp"), "data": dict(sorted(data.items()))}


def _scenario_change(
    directory: Path,
    manifest: dict[str, Any],
    scenario: Scenario,
    cell_ids: Sequence[str] | None,
    *,
    resume: bool,
) -> dict[str, Any] | None:
    """Whether ``scenario`` may write the folder of ``manifest`` (which holds results):
    ``None`` if it is the folder's scenario and ``resume`` is set; the change to record if it
    only adds folds (:data:`CELL_SELECTION`) and ``resume`` is set; else ConfigError saying
    what changed."""
    retry = "use another --out, or --force to discard them"
    if manifest["scenario_hash"] == scenario.digest:
        if resume:
            return None
        raise ConfigError(
            f"--out {directory} already holds results of this scenario; use --resume to "
            "finish it, or --force to discard them"
        )
    what = (
        f"--out {directory} already holds results of a different scenario "
        f"({manifest['scenario']!r} from {manifest['scenario_source']}, hash "
        f"{manifest['scenario_hash'][:12]}, not {scenario.digest[:12]})"
    )
    try:
        before = parse_scenario(
            manifest["scenario_text"],
            source=manifest["scenario_source"],
            overrides=manifest.get("overrides", []),
            unset=manifest.get("unset", []),
        )
    except (ConfigError, KeyError, TypeError):
        before = None  # written from a mapping, or by a p2pdp that read it otherwise
    changes = [] if before is None else scenario_changes(before, scenario)
    if before is None or before.digest != manifest["scenario_hash"] or not changes:
        raise ConfigError(f"{what}; {retry}")
    text = "; ".join(map(format_change, changes))
    if any(key != CELL_SELECTION for key, _, _ in changes):
        only = f"; --resume can only add folds ({CELL_SELECTION})" if resume else ""
        raise ConfigError(f"{what}: {text}{only}; {retry}")
    left_out = sorted(set(manifest.get("cell_ids") or ()) - set(cell_ids or ()))
    if left_out or cell_ids is None:
        folds = set(before.config.evaluation.fold_indices())
        gone = sorted(folds - set(scenario.config.evaluation.fold_indices()))
        why = (
            f"the folder holds cells of folds {gone} that it leaves out"
            if gone
            else f"its cell ids differ (first old one missing: {left_out[0]}: a fold number "
            "with more digits renames every cell)"
            if left_out
            else "no grid to check the folder against"
        )
        raise ConfigError(f"--out {directory}: {text}: {why}; --resume can only add folds; {retry}")
    if not resume:
        raise ConfigError(
            f"--out {directory} already holds results of this scenario with fewer folds "
            f"({text}); use --resume to run the new folds' cells, or --force to discard them"
        )
    return {
        "change": text,
        "scenario_hash": manifest["scenario_hash"],
        "overrides": manifest.get("overrides", []),
        "unset": manifest.get("unset", []),
        "cells": manifest.get("cells"),
    }


def _check_inputs(directory: Path, manifest: dict[str, Any], inputs: dict[str, Any]) -> None:
    old = manifest.get("inputs")
    if old == inputs:
        return
    if old is None:
        changes = ["the folder does not record them (written by an older p2pdp)"]
    else:
        changes = []
        if old.get("p2pdp") != inputs["p2pdp"]:
            changes.append(f"p2pdp {old.get('p2pdp')} -> {inputs['p2pdp']}")
        before, now = old.get("data", {}), inputs["data"]
        for name in sorted(before.keys() | now.keys()):
            if before.get(name) != now.get(name):
                was, new = (d.get(name, "absent")[:12] for d in (before, now))
                changes.append(f"{name} sha256 {was} -> {new}")
    raise ConfigError(
        f"--out {directory}: what its cells depend on changed since they ran: "
        f"{'; '.join(changes)}; resuming would mix results of both; use --force to start over, "
        "or another --out"
    )


def _check_cell_ids(directory: Path, manifest: dict[str, Any], done: frozenset[str]) -> None:
    """ConfigError if ``results.csv`` holds a cell outside the manifest's grid."""
    known = manifest.get("cell_ids")
    if known is None:  # written before the manifest listed them
        return
    unknown = sorted(done - set(known))
    if unknown:
        raise ConfigError(
            f"{directory / RESULTS_FILE}: {len(unknown)} row(s) of cells outside the scenario's "
            f"grid (first: {unknown[0]}): the file was edited or mixed with another run's; "
            "use --force to start over"
        )


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
        if path.exists():
            for line in _read_rows(path)[1:]:
                counts[line[0]] = counts.get(line[0], 0) + 1
        counted[name] = counts
    broken: dict[str, list[str]] = {}
    for row in rows:
        for name, count in _parse_counts(row[TABLE_ROWS]).items():
            if counted[name].get(row["cell_id"], 0) != count:
                broken.setdefault(row["cell_id"], []).append(f"{name}.csv")
    return broken


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


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def resume_command(directory: str | Path, manifest: dict[str, Any]) -> str:
    """The command that finishes the run of ``manifest`` in ``directory``: its scenario,
    ``--unset`` keys, ``--set`` overrides, and for a network run ``--runtime network`` and its
    ``--hosts``."""
    words = ["p2pdp", "run", str(manifest.get("scenario_source", "SCENARIO"))]
    words += ["--out", str(directory)]
    words += [word for key in manifest.get("unset", []) for word in ("--unset", key)]
    words += [word for override in manifest.get("overrides", []) for word in ("--set", override)]
    runtime = manifest.get("runtime", "simulation")
    if runtime != "simulation":
        words += ["--runtime", runtime]
    if manifest.get("hosts"):
        words += ["--hosts", str(manifest["hosts"])]
    return shlex.join([*words, "--resume"])


def _scenario_fields(scenario: Scenario) -> dict[str, Any]:
    """What a manifest says about its scenario."""
    return {
        "scenario": scenario.name,
        "scenario_source": scenario.source,
        "scenario_hash": scenario.digest,
        "scenario_text": scenario.text,
        "overrides": list(scenario.overrides),
        "unset": list(scenario.unset),
        "sweep": [
            {"keys": list(a.keys), "values": [list(v) for v in a.values]} for a in scenario.axes
        ],
    }


def _new_manifest(
    scenario: Scenario, n_cells: int, cell_ids: Sequence[str] | None, inputs: dict[str, Any]
) -> dict[str, Any]:
    versions = {package: _version(package) for package in _VERSIONED}
    return {
        **_scenario_fields(scenario),
        "cells": n_cells,
        "cell_ids": None if cell_ids is None else list(cell_ids),
        "inputs": inputs,
        "tables": [],
        "versions": versions,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "started": _now(),
        "finished": None,
    }


def _git_commit() -> str | None:
    """HEAD of the repository p2pdp is installed from, or None (not a checkout, no git)."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
