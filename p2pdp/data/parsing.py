"""Parsing the files of a benchmark data set (CSV, whitespace, LIBSVM) into checked arrays.

Labels become ``-1`` / ``+1`` (int8) and features dense float64 arrays. A bad line, a wrong
row count or a wrong count of positives raises :class:`~p2pdp.core.errors.DataError` naming
the file and, for a bad line, its 1-based line number. A file's bytes are parsed once per
process (:func:`parsed`).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from p2pdp.core.errors import DataError
from p2pdp.data.manifests import DataFile, Manifest

__all__ = [
    "dense_line_problem",
    "dense_table",
    "is_number",
    "libsvm_line_problem",
    "line_error",
    "parsed",
]

_DELIMITERS = {"csv": ",", "whitespace": None}


def is_number(text: str) -> bool:
    """Whether ``text`` parses as a float."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _width_problem(n_columns: int, n_features: int) -> str:
    return f"{n_columns} columns, expected {n_features + 1} ({n_features} features and the label)"


def dense_line_problem(line: str, delimiter: str | None, n_features: int) -> str | None:
    """What is wrong with one dense line of features and a label (None: nothing)."""
    cells = line.split(delimiter)
    if len(cells) != n_features + 1:
        return _width_problem(len(cells), n_features)
    for column, cell in enumerate(cells, 1):
        if not is_number(cell):
            return f"column {column}: non-numeric cell {cell.strip()!r}"
    return None


def libsvm_line_problem(line: str, n_features: int) -> str | None:
    """What is wrong with one LIBSVM line (1-based increasing indices; None: nothing)."""
    label, *pairs = line.split()
    if not is_number(label):
        return f"label {label!r} is not a number"
    previous = 0
    for pair in pairs:
        index_text, colon, value = pair.partition(":")
        if not colon:
            return f"token {pair!r} is not <index>:<value>"
        try:
            index = int(index_text)
        except ValueError:
            return f"feature index {index_text!r} is not an integer"
        if not 1 <= index <= n_features:
            return f"feature index {index} is outside 1..{n_features}"
        if index <= previous:
            return f"feature indices must increase, got {index} after {previous}"
        if not is_number(value):
            return f"value {value!r} of feature {index} is not a number"
        previous = index
    return None


def dense_table(
    rows: list[tuple[int, str]], delimiter: str | None, quotechar: str | None = None
) -> np.ndarray:
    """(n, columns) float64 table of the numbered text lines ``rows``; raises ValueError or
    OverflowError (as :func:`numpy.loadtxt`) on a bad line, which the caller then finds."""
    lines = [line for _, line in rows]
    return np.loadtxt(
        lines, delimiter=delimiter, dtype=np.float64, ndmin=2, comments=None, quotechar=quotechar
    )


def line_error(path: Path, line_number: int, problem: str) -> DataError:
    """The DataError of ``problem`` at 1-based ``line_number`` of ``path``."""
    return DataError(f"{path}, line {line_number}: {problem}")


def _parse_table(
    data: bytes, rows: list[tuple[int, str]], path: Path, manifest: Manifest
) -> tuple[np.ndarray, np.ndarray]:
    """Fast parse into dense (X, raw labels); on failure find and report the first bad line."""
    from sklearn.datasets import load_svmlight_file

    d = manifest.n_features
    try:
        if manifest.format == "libsvm":
            sparse, labels = load_svmlight_file(
                io.BytesIO(data), n_features=d, zero_based=False, dtype=np.float64
            )
            return sparse.toarray(), labels
        delimiter = _DELIMITERS[manifest.format]
        table = dense_table(rows, delimiter)
    except (ValueError, OverflowError) as exc:
        for line_number, line in rows:
            problem = (
                libsvm_line_problem(line, d)
                if manifest.format == "libsvm"
                else dense_line_problem(line, _DELIMITERS[manifest.format], d)
            )
            if problem is not None:
                raise line_error(path, line_number, problem) from exc
        raise DataError(f"{path}: cannot be read as {manifest.format}: {exc}") from exc
    if table.shape[1] != d + 1:
        raise line_error(path, rows[0][0], _width_problem(table.shape[1], d))
    return table[:, :-1], table[:, -1]


def _parse(data: bytes, path: Path, manifest: Manifest, spec: DataFile) -> tuple[np.ndarray, ...]:
    """Parse and check one file; return (X, y) with y in {-1, +1}."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from exc
    # (1-based line number, content) of every data line; libsvm allows '#' comments.
    strip_comment = manifest.format == "libsvm"
    rows = [
        (number, line.split("#", 1)[0] if strip_comment else line)
        for number, line in enumerate(text.split("\n"), 1)
    ]
    rows = [(number, line) for number, line in rows if line.strip()]
    if not rows:
        raise DataError(f"{path}: the file is empty (no data lines)")
    X, labels = _parse_table(data, rows, path, manifest)

    def fail(row: int, problem: str) -> DataError:
        return line_error(path, rows[row][0], problem)

    def feature(column: int) -> str:
        names = manifest.feature_names
        return f"feature {column + 1}" + ("" if names is None else f" ({names[column]})")

    non_finite = np.argwhere(~np.isfinite(X))
    if non_finite.size:
        row, column = non_finite[0]
        raise fail(row, f"{feature(column)} is {X[row, column]}, not a finite number")
    positive = labels == manifest.positive_label
    known = positive | (labels == manifest.negative_label)
    if not known.all():
        row = int(np.argmin(known))
        raise fail(
            row,
            f"unexpected label {labels[row]:g}, expected {manifest.negative_label:g} (negative) "
            f"or {manifest.positive_label:g} (positive)",
        )
    if manifest.feature_bounds is not None:
        low, high = (np.asarray(bound) for bound in manifest.feature_bounds)
        outside = np.argwhere((X < low) | (X > high))
        if outside.size:
            row, column = outside[0]
            raise fail(
                row,
                f"{feature(column)} = {X[row, column]:g} is outside the manifest's "
                f"data-independent bounds [{low[column]:g}, {high[column]:g}]",
            )
    if len(labels) != spec.rows:
        raise DataError(
            f"{path}: {len(labels)} data lines, the manifest of {manifest.name!r} expects "
            f"{spec.rows} (truncated file, or extra lines)"
        )
    if positive.sum() != spec.positives:
        raise DataError(
            f"{path}: {positive.sum()} positive labels, the manifest of {manifest.name!r} "
            f"expects {spec.positives}"
        )
    return X, np.where(positive, 1, -1).astype(np.int8)


#: Parsed files of this process, by (manifest, file, sha256 of the bytes, path): a sweep reads
#: the same file for every fold (parsing Spambase takes 40 ms); at most _PARSED_FILES kept.
_PARSED: dict[tuple[Manifest, DataFile, str, str], tuple[np.ndarray, ...]] = {}
_PARSED_FILES = 4


def parsed(
    data: bytes, sha256: str, path: Path, manifest: Manifest, spec: DataFile
) -> tuple[np.ndarray, ...]:
    """:func:`_parse` of ``data`` (whose sha256 is ``sha256``), parsed once per process; the
    arrays are read-only (every load shares them)."""
    key = (manifest, spec, sha256, str(path))
    arrays = _PARSED.get(key)
    if arrays is None:
        arrays = _parse(data, path, manifest, spec)
        for array in arrays:
            array.flags.writeable = False
        while len(_PARSED) >= _PARSED_FILES:
            del _PARSED[next(iter(_PARSED))]  # the oldest
        _PARSED[key] = arrays
    return arrays
