"""The CSV text of a results folder's tables (:mod:`p2pdp.experiments.results.store`).

Rows are written as :mod:`csv` writes them (a table given column by column,
:class:`ColumnTable`, as the same text without a dict per row) and read back line by line,
refusing a damaged file; an :class:`OSError` while writing names its file.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from p2pdp.core.errors import ConfigError


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


def _first_fields(path: Path) -> Iterator[str]:
    """The first field (the cell id) of every line after the header, streamed: the checks of
    :func:`_read_rows` (UTF-8, CSV syntax, every row as wide as the header) with memory for
    one line, not the file (a 10^7-peer run's release log is 1.5 GB of text, ten million
    rows). For a file that ends with a complete line (:func:`repair` drops a cut one first)."""
    with path.open(encoding="utf-8", newline="") as text:
        try:
            reader = csv.reader(text)
            header = next(reader, None)
            for number, row in enumerate(reader, start=2):
                if header is not None and len(row) != len(header):
                    raise ConfigError(
                        f"{path}, line {number}: {len(row)} fields, the header has "
                        f"{len(header)}; the file is damaged (use --force to start over)"
                    )
                yield row[0]
        except UnicodeDecodeError:
            raise ConfigError(f"{path} is damaged: not UTF-8 text") from None
        except csv.Error as exc:
            raise ConfigError(f"{path} is damaged: {exc}") from None


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
