"""Arrays that grow by rows: what a run keeps per release, without an object per release.

A run of ten million peers makes ten million releases. Kept as one Python object each (a
(d,) array per published model, a (g,) array per group's members, a named tuple per record)
they cost ~1.2 kB a release, 12 GB at 10^7, on top of the models themselves; kept here they
cost their numbers only (a model's 8 d bytes, a member's 8 bytes, a record's 67 bytes).

- :class:`Rows`: rows of one shape and dtype appended to one array (``append`` one row,
  ``extend`` a block), read as that array (:attr:`Rows.array`, a view: no copy; also through
  ``numpy.asarray``). :meth:`Rows.reserve` sets the capacity up front: ``numpy.empty`` takes
  the memory from the kernel untouched, so a capacity never written costs address space, not
  resident memory, and a run that knows its largest count copies nothing as it grows.
- :class:`Ragged`: rows of different lengths (each release's members) as one flat array and
  the offsets of each row; reads as the sequence of its rows (views).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["Ragged", "Rows"]


class Rows:
    """Rows of shape ``shape`` and dtype ``dtype`` appended to one array, in order.

    Reads as a sequence of rows (``len``, indexing, iteration) and, through ``numpy.asarray``
    or :attr:`array`, as one ``(len(self), *shape)`` array that shares this one's memory.

    Parameters
    ----------
    shape : tuple of int
        The shape of one row (``()``: a row is one number).
    dtype : numpy dtype
        Kept exactly: an appended value is converted to it as ``numpy.asarray`` converts
        (float64 stays float64).
    capacity : int
        Rows allocated up front (see :meth:`reserve`).
    """

    __slots__ = ("_data", "_n")

    def __init__(
        self, shape: tuple[int, ...] = (), dtype: Any = np.float64, *, capacity: int = 0
    ) -> None:
        self._data = np.empty((max(int(capacity), 0), *shape), dtype=dtype)
        self._n = 0

    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` rows in all (no-op if there is already): one copy of
        the rows held so far, none later until the count passes ``capacity``."""
        if capacity > self._data.shape[0]:
            data = np.empty((capacity, *self._data.shape[1:]), dtype=self._data.dtype)
            data[: self._n] = self._data[: self._n]
            self._data = data

    def _room(self, extra: int) -> None:
        need = self._n + extra
        if need > self._data.shape[0]:
            self.reserve(max(need, 2 * self._data.shape[0], 16))

    def append(self, row: Any) -> None:
        """Append one row."""
        self._room(1)
        self._data[self._n] = row
        self._n += 1

    def extend(self, block: Any) -> None:
        """Append the rows of ``block`` (``(n, *shape)``, or anything ``numpy.asarray`` makes
        one of, e.g. a list of rows), in order."""
        block = np.asarray(block, dtype=self._data.dtype).reshape(-1, *self._data.shape[1:])
        n = block.shape[0]
        self._room(n)
        self._data[self._n : self._n + n] = block
        self._n += n

    @property
    def array(self) -> np.ndarray:
        """The rows so far, ``(len(self), *shape)``: a view of this store (not a copy)."""
        return self._data[: self._n]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.array
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return array.copy() if copy else array

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        return self.array[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.array)


class Ragged(Sequence[np.ndarray]):
    """Integer rows of different lengths (e.g. the members behind each release), as one
    flat array of their values and the offset where each row starts.

    Reads as the sequence of its rows: ``ragged[i]`` is row ``i`` as a (n_i,) view of the
    flat array (read it, do not write it).
    """

    __slots__ = ("_offsets", "_values")

    def __init__(self, dtype: Any = np.int64) -> None:
        self._values = Rows((), dtype)
        self._offsets = Rows((), np.int64)
        self._offsets.append(0)

    def reserve(self, rows: int, values: int) -> None:
        """Make room for ``rows`` rows holding ``values`` values in all (:meth:`Rows.reserve`)."""
        self._offsets.reserve(rows + 1)
        self._values.reserve(values)

    def append(self, row: Any) -> None:
        """Append one row (a 1-D sequence of integers)."""
        self._values.extend(row)
        self._offsets.append(len(self._values))

    def extend(self, block: np.ndarray) -> None:
        """Append each row of ``block`` (n, k): ``n`` rows of ``k`` values."""
        block = np.asarray(block)
        n, k = block.shape
        self._values.extend(block.ravel())
        self._offsets.extend(self._offsets.array[-1] + k * np.arange(1, n + 1, dtype=np.int64))

    @property
    def values(self) -> np.ndarray:
        """Every row's values, one after the other (a view)."""
        return self._values.array

    @property
    def offsets(self) -> np.ndarray:
        """(len(self) + 1,): row ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (a view)."""
        return self._offsets.array

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"row {index} of {n}")
        index %= n
        start, stop = self._offsets.array[index : index + 2].tolist()
        return self._values.array[start:stop]

    def __iter__(self) -> Iterator[np.ndarray]:
        values, offsets = self._values.array, self._offsets.array.tolist()
        for start, stop in itertools.pairwise(offsets):
            yield values[start:stop]
