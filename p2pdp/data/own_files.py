"""Your own files: the ``csv``, ``libsvm`` and ``numpy`` data set loaders (``data.path``).

Each reads the file at ``data.path`` (and ``data.test_path``, a predefined test split) with the
``data`` settings that apply to its format; a bad file raises
:class:`~p2pdp.core.errors.DataError` naming the file and, for a bad line, its 1-based number.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from p2pdp.core.errors import ConfigError, DataError
from p2pdp.data.loaders import RawData
from p2pdp.data.parsing import (
    dense_line_problem,
    dense_table,
    is_number,
    libsvm_line_problem,
    line_error,
)
from p2pdp.data.settings import DataConfig

__all__ = ["csv_file", "libsvm_file", "numpy_file"]


def _file(value: str | None, key: str) -> Path:
    if value is None:
        raise ConfigError(f"{key} is required to read a file")
    path = Path(value).expanduser()
    if path.is_dir():
        raise DataError(f"{key} = {value!r} is a folder, not a file: give the data file in it")
    if not path.is_file():
        raise DataError(f"{key} = {value!r}: no such file ({path.resolve()})")
    return path


def _text_lines(path: Path) -> list[tuple[int, str]]:
    """(1-based line number, line) of every non-blank line of the UTF-8 text file ``path``."""
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        numpy = (
            " but a numpy file: set data.dataset = 'numpy'" if data.startswith(_NUMPY_MAGIC) else ""
        )
        raise DataError(f"{path}: not a text file (byte {exc.start} is not UTF-8){numpy}") from exc
    return [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def _read_csv(path: Path, data: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Features, labels and (with ``data.peer_column``) the peer column of a CSV file."""
    rows = _text_lines(path)
    names: list[str] = []
    if data.header and rows:
        delimiter = None if data.delimiter == "whitespace" else data.delimiter
        names = [name.strip().strip('"') for name in rows[0][1].split(delimiter)]
        if all(is_number(name) for name in names):  # skipping it would lose a row unseen
            raise DataError(
                f"{path}, line {rows[0][0]}: data.header = true skips this line as column "
                "names, but it holds numbers: a data row; set data.header = false"
            )
        rows = rows[1:]
    if not rows:
        raise DataError(f"{path}: the file has no data lines")
    delimiter = None if data.delimiter == "whitespace" else data.delimiter
    n_columns = len(rows[0][1].split(delimiter))
    if n_columns < 2:
        raise DataError(
            f"{path}, line {rows[0][0]}: 1 column; a row needs features and a label "
            f"(is data.delimiter = {data.delimiter!r} right?)"
        )
    label, peer = _label_and_peer_columns(data, names, n_columns, path)
    try:
        table = dense_table(rows, delimiter, quotechar='"')
    except (ValueError, OverflowError) as exc:
        for line_number, line in rows:
            problem = dense_line_problem(line, delimiter, n_columns - 1)
            if problem is not None:
                if line_number == rows[0][0] and not data.header and "non-numeric" in problem:
                    problem += " (column names? set data.header = true)"
                raise line_error(path, line_number, problem) from exc
        raise DataError(f"{path}: cannot be read as CSV: {exc}") from exc
    non_finite = np.argwhere(~np.isfinite(table))
    if non_finite.size:
        row, column = non_finite[0]
        raise line_error(
            path,
            rows[row][0],
            f"column {column + 1} is {table[row, column]}, not a finite number "
            f"({len(non_finite)} non-finite cells in the file)",
        )
    labels = _file_labels(table[:, label], rows, path)
    if peer is None:
        return np.delete(table, label, axis=1), labels, None
    peers = table[:, peer]
    bad = (peers != np.round(peers)) | (peers < 0)
    if bad.any():
        row = int(np.argmax(bad))
        raise line_error(
            path, rows[row][0], f"peer id {peers[row]:g} (column {peer + 1}) is not an integer >= 0"
        )
    return np.delete(table, [label, peer], axis=1), labels, peers


def _label_and_peer_columns(
    data: DataConfig, names: list[str], n_columns: int, path: Path
) -> tuple[int, int | None]:
    """0-based columns of the label and of ``data.peer_column`` (None if unset) in a table.

    ``names`` is the header (empty without one); a string ``data.peer_column`` is one of them.
    """
    for key, column in (("label_column", data.label_column), ("peer_column", data.peer_column)):
        if isinstance(column, int) and not -n_columns <= column < n_columns:
            raise ConfigError(
                f"data.{key} must index one of the {n_columns} columns of {path} "
                f"(0..{n_columns - 1}, or -1 for the last), got {column}"
            )
    label = data.label_column % n_columns
    column = data.peer_column
    if column is None:
        return label, None
    if isinstance(column, str) and column not in names:
        raise ConfigError(
            f"data.peer_column = {column!r} is not a column of {path}; its header names {names}"
        )
    peer = names.index(column) if isinstance(column, str) else column % n_columns
    if peer == label:
        raise ConfigError(
            f"data.peer_column = {column!r} and data.label_column = {data.label_column!r} "
            f"are the same column {peer} of {path}"
        )
    return label, peer


def _file_labels(labels: np.ndarray, rows: list[tuple[int, str]], path: Path) -> np.ndarray:
    """Check that file labels are binary, naming the first bad line; return them unchanged."""
    known = np.isin(labels, (-1.0, 0.0, 1.0))
    if not known.all():
        row = int(np.argmin(known))
        label = np.format_float_positional(labels[row], trim="-")  # 1.0000001, not 1
        raise line_error(path, rows[row][0], f"label {label} is not 0 or 1 (or -1 or +1)")
    if {-1.0, 0.0} <= set(np.unique(labels).tolist()):
        raise DataError(f"{path}: labels mix -1 and 0; use 0/1 or -1/+1")
    return labels


def csv_file(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """Your own CSV file: ``data.path`` (and ``data.test_path``, a predefined test split).

    One record per line, numeric cells separated by ``data.delimiter`` (``","`` by default,
    ``"whitespace"`` for runs of spaces and tabs), the label in column ``data.label_column``
    (0-based, default -1: the last) with values 0/1 or -1/+1, and a first line of column
    names to skip if ``data.header``. Blank lines are skipped; cells may be quoted with ``"``.
    ``data.peer_column`` (an index, or a name of the header) is a column of peer ids
    (integers >= 0), returned as ``peers`` rather than as a feature. A bad line raises
    :class:`~p2pdp.core.errors.DataError` naming the file, the 1-based line number and the
    problem (wrong column count, non-numeric or empty cell, NaN or inf, unexpected label or
    peer id). ``rng`` is not used.
    """
    path = _file(data.path, "data.path")
    X, y, peers = _read_csv(path, data)
    X_test = y_test = None
    if data.test_path is not None:  # its peer column, if any, is dropped: test rows train no peer
        X_test, y_test, _ = _read_csv(_file(data.test_path, "data.test_path"), data)
    return RawData(name=str(path), X=X, y=y, X_test=X_test, y_test=y_test, peers=peers)


def _read_libsvm(paths: list[Path], n_features: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_svmlight_files

    try:
        loaded = load_svmlight_files(
            [str(path) for path in paths],
            n_features=n_features,
            zero_based=False,
            dtype=np.float64,
        )
    except (ValueError, OverflowError) as exc:
        limit = n_features if n_features is not None else sys.maxsize
        for path in paths:
            for number, line in _text_lines(path):
                content = line.split("#", 1)[0]
                problem = libsvm_line_problem(content, limit) if content.strip() else None
                if problem is not None:
                    problem = problem.replace(f"outside 1..{sys.maxsize}", "below 1")
                    raise line_error(path, number, problem) from exc
        raise DataError(f"{', '.join(map(str, paths))}: cannot be read as LIBSVM: {exc}") from exc
    splits = []
    for path, (sparse, labels) in zip(
        paths, zip(loaded[::2], loaded[1::2], strict=True), strict=True
    ):
        rows = [
            (number, line) for number, line in _text_lines(path) if line.split("#", 1)[0].strip()
        ]
        X = sparse.toarray()
        non_finite = np.argwhere(~np.isfinite(X))
        if non_finite.size:
            row, column = non_finite[0]
            raise line_error(
                path, rows[row][0], f"feature {column + 1} is {X[row, column]}, not finite"
            )
        splits.append((X, _file_labels(labels, rows, path)))
    return splits


def libsvm_file(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """Your own LIBSVM file: ``data.path`` (and ``data.test_path``, a predefined test split).

    Lines ``<label> <index>:<value> ...`` with 1-based, increasing feature indices (as written
    by LIBSVM and scikit-learn's ``dump_svmlight_file(..., zero_based=False)``); ``#`` starts
    a comment. Labels 0/1 or -1/+1. ``data.n_features`` fixes d (default: the largest index
    in the file, or in both files with a test split). A bad line raises
    :class:`~p2pdp.core.errors.DataError` naming the file and its 1-based line number.
    ``rng`` is not used.
    """
    paths = [_file(data.path, "data.path")]
    if data.test_path is not None:
        paths.append(_file(data.test_path, "data.test_path"))
    splits = _read_libsvm(paths, data.n_features)
    X_test, y_test = splits[1] if len(splits) == 2 else (None, None)
    return RawData(name=str(paths[0]), X=splits[0][0], y=splits[0][1], X_test=X_test, y_test=y_test)


#: Arrays a ``.npz`` file of the ``numpy`` data set may hold (besides ``data.peer_column``).
NPZ_ARRAYS = ("X", "y", "X_test", "y_test")


#: How the files numpy writes begin: ``numpy.save`` (.npy) and ``numpy.savez`` (a zip archive).
_NUMPY_MAGIC = (b"\x93NUMPY", b"PK\x03\x04", b"PK\x05\x06")


def _read_numpy(path: Path, data: DataConfig, key: str) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` file, or ``X``, ``y`` (and ``peers``) of a ``.npy`` table."""
    where = f"{key} = {str(path)!r}"
    try:
        with path.open("rb") as file:
            head = file.read(6)
        if not head.startswith(_NUMPY_MAGIC):
            raise DataError(
                f"{where} is not a file written by numpy.save or numpy.savez ("
                + (f"it begins {head!r}" if head else "it is empty")
                + "): write it with one of them, or read a text table with data.dataset = 'csv'"
            )
        loaded = np.load(path, allow_pickle=False)  # never unpickle a data file
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                arrays = {name: _numpy_array(loaded, name, where) for name in loaded.files}
            return _npz_arrays(arrays, path, data, key)
        table = np.asarray(loaded)
    except (OSError, ValueError, EOFError) as exc:
        if "pickle" in str(exc):  # np.load refuses object arrays without allow_pickle
            raise DataError(_object_array(where, "the table")) from None
        raise DataError(f"{where}: cannot be read as a numpy file: {exc}") from None
    return _npy_arrays(table, path, data, key)


def _numpy_array(archive: Any, name: str, where: str) -> np.ndarray:
    """Array ``name`` of a ``.npz`` archive, or DataError if it holds Python objects."""
    try:
        return np.asarray(archive[name])
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DataError(_object_array(where, f"array {name!r}")) from None
        raise


def _object_array(where: str, what: str) -> str:
    return (
        f"{where}: {what} holds Python objects (an object array: None, strings or mixed "
        "types), which are not read (allow_pickle=False); save numbers only, e.g. "
        "numpy.asarray(values, dtype=float)"
    )


def _npz_arrays(
    arrays: dict[str, np.ndarray], path: Path, data: DataConfig, key: str
) -> dict[str, np.ndarray]:
    peer = [str(data.peer_column)] if data.peer_column is not None else []
    unknown = sorted(set(arrays) - {*NPZ_ARRAYS, *peer})
    if unknown:
        raise DataError(
            f"{key} = {str(path)!r}: array {unknown[0]!r} is not read (a .npz file holds "
            f"X, y, optionally X_test, y_test, and the array named by data.peer_column); "
            f"it holds {sorted(arrays)}"
        )
    for name in ("X", "y", *peer):
        if name not in arrays:
            raise DataError(f"{key} = {str(path)!r}: no array {name!r}; it holds {sorted(arrays)}")
    if peer:
        arrays["peers"] = arrays.pop(peer[0])
    return arrays


def _npy_arrays(table: np.ndarray, path: Path, data: DataConfig, key: str) -> dict[str, np.ndarray]:
    if table.ndim != 2 or table.shape[1] < 2:
        raise DataError(
            f"{key} = {str(path)!r}: a .npy file must hold a 2-D table (rows x columns: the "
            f"features and the label), got shape {table.shape}"
        )
    label, peer = _label_and_peer_columns(data, [], table.shape[1], path)
    dropped = [label] if peer is None else [label, peer]
    arrays = {"y": table[:, label], "X": np.delete(table, dropped, axis=1)}
    if peer is not None:
        arrays["peers"] = table[:, peer]
    return arrays


def numpy_file(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """Your own numpy arrays: ``data.path`` (and ``data.test_path``), both ``.npz`` or ``.npy``.

    A ``.npz`` file (``numpy.savez``) holds the arrays ``X`` (n, d) and ``y`` (n,), optionally
    a predefined test split ``X_test`` (n_test, d) and ``y_test`` (n_test,), and the array of
    peer ids (n,) named by ``data.peer_column``; any other array is an error (it would be
    silently unused). A ``.npy`` file (``numpy.save``) holds one 2-D table (n, d + 1) whose
    column ``data.label_column`` (default -1: the last) is the label, and column
    ``data.peer_column`` (if set) the peer ids. ``data.test_path`` is a second file of the
    same kind, the test split (its peer ids are dropped). Labels 0/1 or -1/+1; files are read
    with ``allow_pickle=False`` (no object arrays). ``rng`` is not used.
    """
    path = _file(data.path, "data.path")
    arrays = _read_numpy(path, data, "data.path")
    if data.test_path is not None:
        if "X_test" in arrays or "y_test" in arrays:
            raise DataError(
                f"data.path = {data.path!r} holds a test split (X_test, y_test) and "
                f"data.test_path = {data.test_path!r} gives another: keep one"
            )
        test = _read_numpy(_file(data.test_path, "data.test_path"), data, "data.test_path")
        if "X_test" in test or "y_test" in test:
            raise DataError(f"data.test_path = {data.test_path!r}: holds X_test, y_test; give X, y")
        arrays["X_test"], arrays["y_test"] = test["X"], test["y"]
    return RawData(
        name=str(path),
        X=arrays["X"],
        y=arrays["y"],
        X_test=arrays.get("X_test"),
        y_test=arrays.get("y_test"),
        peers=arrays.get("peers"),
    )
