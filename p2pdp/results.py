"""Results that survive a crash: ``results.csv``, ``roc.csv`` and ``manifest.json`` in one folder.

``results.csv``
    One row per cell (grid point x fold x repetition): ``cell_id``, ``point``, every config
    setting, the seed, fold, repetition, the metrics, and wall times (columns ``wall_*``, the
    only ones that differ between two runs of the same scenario). Rows are appended and
    fsync'ed as cells finish, so a crash loses at most the cells in flight; at the end the file
    is rewritten sorted by ``cell_id`` (atomically), so a resumed run's file equals an
    uninterrupted one's.
``roc.csv``
    The best peer's ROC curve of every cell (``cell_id, fpr, tpr``), sampled at the false
    positive rates :data:`ROC_FPR` (linear interpolation between the curve's points), which
    lets the report average curves over folds. Written before the cell's results row.
``manifest.json``
    The scenario (text, source, ``--set`` overrides, hash), library versions, git commit,
    start/end times of every session; replaced atomically (write a temporary file, then
    :func:`os.replace`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from p2pdp.errors import ConfigError
from p2pdp.scenario import Scenario

RESULTS_FILE = "results.csv"
ROC_FILE = "roc.csv"
MANIFEST_FILE = "manifest.json"
#: False positive rates at which every cell's ROC curve is stored, in [0, 1].
ROC_FPR = np.linspace(0.0, 1.0, 101)
_ROC_COLUMNS = ("cell_id", "fpr", "tpr")
_VERSIONED = ("p2pdp", "numpy", "scipy", "simpy", "scikit-learn", "networkx", "matplotlib")


@dataclass(frozen=True, slots=True, kw_only=True)
class CellRecord:
    """What one finished cell leaves behind: its results row and its ROC curve.

    ``roc_tpr`` is the best peer's true positive rate at each false positive rate of
    :data:`ROC_FPR`, shape (101,), values in [0, 1].
    """

    cell_id: str
    row: dict[str, Any]
    roc_tpr: np.ndarray | None


def roc_on_grid(fpr: np.ndarray, tpr: np.ndarray) -> np.ndarray:
    """TPR of an ROC curve (non-decreasing ``fpr``, ``tpr``) at :data:`ROC_FPR`, shape (101,)."""
    return np.interp(ROC_FPR, fpr, tpr)


class ResultsStore:
    """The output folder of one experiment; create it with :meth:`open`."""

    def __init__(self, directory: Path, manifest: dict[str, Any], done: frozenset[str]) -> None:
        self.directory = directory
        self.manifest = manifest
        self.done = done

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
    ) -> ResultsStore:
        """Check ``directory`` against ``scenario``, then create or reopen the store.

        A folder holding results (or a manifest) is refused unless ``resume`` is set and its
        scenario hash equals ``scenario.digest`` (then the cells already in ``results.csv``
        are :attr:`done`), or ``force`` is set (then the old files are deleted first).

        Raises
        ------
        ConfigError
            If the folder holds results of another scenario, or of this one without
            ``resume``/``force``.
        """
        directory = Path(directory)
        paths = [directory / name for name in (RESULTS_FILE, ROC_FILE, MANIFEST_FILE)]
        existing = read_manifest(directory) if paths[2].exists() else None
        if force:
            for path in paths:
                path.unlink(missing_ok=True)
        elif existing is None and paths[0].exists():
            raise ConfigError(
                f"--out {directory} holds a {RESULTS_FILE} without a {MANIFEST_FILE}; "
                "use --force to overwrite it, or another --out"
            )
        elif existing is not None and not (resume and existing["scenario_hash"] == scenario.digest):
            same = existing["scenario_hash"] == scenario.digest
            what = (
                "this scenario; use --resume to finish it"
                if same
                else f"a different scenario ({existing['scenario']!r} from "
                f"{existing['scenario_source']}, hash {existing['scenario_hash'][:12]}, not "
                f"{scenario.digest[:12]}); use another --out"
            )
            raise ConfigError(
                f"--out {directory} already holds results of {what}, or --force to discard them"
            )
        directory.mkdir(parents=True, exist_ok=True)
        session = {"started": _now(), "finished": None, "backend": backend, "cells_run": 0}
        if existing is not None and not force:
            done = _recover(directory)
            manifest = existing
            manifest["sessions"].append(session)
        else:
            done = frozenset()
            manifest = _new_manifest(scenario, n_cells) | {"sessions": [session]}
        manifest["status"] = "running"
        store = cls(directory, manifest, done)
        store._write_manifest()
        return store

    def append(self, records: Sequence[CellRecord]) -> None:
        """Append finished cells (ROC first, then results rows), fsync'ed; update the manifest."""
        if not records:
            return
        _append_csv(
            self.directory / ROC_FILE,
            _ROC_COLUMNS,
            [
                (record.cell_id, repr(float(x)), repr(float(y)))
                for record in records
                if record.roc_tpr is not None
                for x, y in zip(ROC_FPR, record.roc_tpr, strict=True)
            ],
        )
        columns = tuple(records[0].row)
        _append_csv(
            self.directory / RESULTS_FILE,
            columns,
            [tuple(record.row[c] for c in columns) for record in records],
        )
        self.manifest["sessions"][-1]["cells_run"] += len(records)
        self._write_manifest()

    def finish(self) -> None:
        """Sort both CSV files by ``cell_id`` (atomically) and mark the manifest complete."""
        for name in (RESULTS_FILE, ROC_FILE):
            path = self.directory / name
            if path.exists():
                header, *rows = _read_csv_rows(path)
                rows.sort(key=lambda row: row[0])  # stable: keeps each cell's ROC points in order
                _write_atomic(path, _csv_text([header, *rows]))
        finished = _now()
        self.manifest["sessions"][-1]["finished"] = finished
        self.manifest.update(status="complete", finished=finished)
        self._write_manifest()

    def _write_manifest(self) -> None:
        _write_atomic(self.directory / MANIFEST_FILE, json.dumps(self.manifest, indent=2) + "\n")


# --- reading ----------------------------------------------------------------------------------
def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of a results folder (see the module docstring)."""
    path = Path(directory) / MANIFEST_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def read_results(directory: str | Path) -> list[dict[str, str]]:
    """Rows of ``results.csv`` as dicts of strings, in file order."""
    path = Path(directory) / RESULTS_FILE
    if not path.exists():
        raise ConfigError(f"{path} not found: run `p2pdp run` with --out {directory} first")
    with path.open(newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def read_roc(directory: str | Path) -> dict[str, np.ndarray]:
    """``{cell_id: tpr}`` with ``tpr`` of shape (101,) at :data:`ROC_FPR`; empty if no file."""
    path = Path(directory) / ROC_FILE
    if not path.exists():
        return {}
    curves: dict[str, list[float]] = {}
    for cell_id, _, tpr in _read_csv_rows(path)[1:]:
        curves.setdefault(cell_id, []).append(float(tpr))
    return {cell_id: np.array(tpr) for cell_id, tpr in curves.items()}


# --- helpers ----------------------------------------------------------------------------------
def _recover(directory: Path) -> frozenset[str]:
    """Ids of the cells in ``results.csv`` after a crash; drops ROC rows of unfinished cells."""
    results, roc = directory / RESULTS_FILE, directory / ROC_FILE
    for path in (results, roc):
        _drop_partial_line(path)
    done = (
        frozenset(row[0] for row in _read_csv_rows(results)[1:])
        if results.exists()
        else frozenset()
    )
    if roc.exists():
        header, *rows = _read_csv_rows(roc)
        _write_atomic(roc, _csv_text([header, *(row for row in rows if row[0] in done)]))
    return done


def _drop_partial_line(path: Path) -> None:
    """Truncate a file after its last newline (a line cut short by a crash)."""
    if not path.exists():
        return
    with path.open("rb+") as file:
        data = file.read()
        if data and not data.endswith(b"\n"):
            file.truncate(data.rfind(b"\n") + 1)


def _read_csv_rows(path: Path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as file:
        return list(csv.reader(file))


def _csv_text(rows: Sequence[Sequence[Any]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def _append_csv(path: Path, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Append ``rows`` (header first if the file is new or empty), then fsync."""
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        header = _read_csv_rows(path)[0]
        if header != list(columns):
            raise ConfigError(
                f"{path} has columns {header}, but this run writes {list(columns)}; "
                "use --force to start over"
            )
    with path.open("a", newline="", encoding="utf-8") as file:
        file.write(_csv_text([columns, *rows] if new else rows))
        file.flush()
        os.fsync(file.fileno())


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file, fsync it, and rename it over ``path``."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8", newline="") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable (POSIX)
        descriptor = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def _new_manifest(scenario: Scenario, n_cells: int) -> dict[str, Any]:
    versions = {}
    for package in _VERSIONED:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "scenario": scenario.name,
        "scenario_source": scenario.source,
        "scenario_hash": scenario.digest,
        "scenario_text": scenario.text,
        "overrides": list(scenario.overrides),
        "sweep": [
            {"keys": list(a.keys), "values": [list(v) for v in a.values]} for a in scenario.axes
        ],
        "cells": n_cells,
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
