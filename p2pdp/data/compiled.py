"""The min-max transform of rows already ``log1p``-ed, compiled (numba), bit for bit numpy's.

A large synthetic run trained in blocks (:mod:`p2pdp.tasks.streamed`) transforms every block
of 65,536 rows of 57 features two to three times (its local models' pass, the centralised
reference's later passes for the blocks it does not keep). In numpy
(:meth:`~p2pdp.data.preprocess.FittedPreprocessor._transform_rows`) that is seven passes
over a scratch chunk (subtract, divide, clip, the bias column, the squares, their row sums,
the division by the norms) and a copy out; :func:`minmax_rows` makes one pass over each
row, writing the output once, with the same IEEE operations in the same order:
``(z - low) / span`` (two roundings, no fused multiply-add: numba compiles without
fast-math), ``min(max(v, 0), 1)`` as numpy's ``clip``, the bias 1.0, and the norm
``sqrt`` of the row's squares summed as numpy's ``add.reduce`` sums a contiguous row
(:func:`_pairwise`: eight accumulators, numpy's pairwise summation, rows of at most
:data:`MAX_WIDTH` values), each row divided by
``max(norm, 1)`` (a division by 1.0 is skipped: it changes no bit) or by ``sqrt(d_out)``.
So the rows are numpy's bit for bit (checked on this machine; the committed tests compare
them to 1e-15 on rows of every width class of the pairwise sum).

This module (hence numba) is imported by the training in blocks only, which has already
loaded numba for its fits (:mod:`p2pdp.learning.compiled`), so smaller runs pay nothing.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numpy.typing import NDArray

from p2pdp.core.errors import ConfigError

__all__ = [
    "MAX_WIDTH",
    "NORM_NONE",
    "NORM_SCALE",
    "NORM_UNIT_BALL",
    "compile_transform",
    "minmax_rows",
]

#: The norm step of :func:`minmax_rows`: none, ``project_unit_ball``, ``scale_sqrt_d``.
NORM_NONE, NORM_UNIT_BALL, NORM_SCALE = 0, 1, 2

#: The widest output rows :func:`minmax_rows` takes: numpy's block of its pairwise
#: summation (rows of at most this many values are summed with eight accumulators, longer
#: ones split in two, recursively, which numba's disk cache does not take).
MAX_WIDTH = 128


@numba.njit(cache=True, nogil=True)
def _pairwise(a, start, n):  # pragma: no cover
    """``a[start : start + n]`` (``n <=`` :data:`MAX_WIDTH`) summed as numpy's
    ``add.reduce`` sums a contiguous float64 run (``pairwise_sum`` of numpy's loops: a plain
    loop under 8 values, else eight accumulators, added pairwise, then the rest in order)."""
    if n < 8:
        total = -0.0
        for i in range(start, start + n):
            total += a[i]
        return total
    r0, r1, r2, r3 = a[start], a[start + 1], a[start + 2], a[start + 3]
    r4, r5, r6, r7 = a[start + 4], a[start + 5], a[start + 6], a[start + 7]
    i = start + 8
    while i < start + n - n % 8:
        r0, r1, r2, r3 = r0 + a[i], r1 + a[i + 1], r2 + a[i + 2], r3 + a[i + 3]
        r4, r5, r6, r7 = r4 + a[i + 4], r5 + a[i + 5], r6 + a[i + 6], r7 + a[i + 7]
        i += 8
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < start + n:
        total += a[i]
        i += 1
    return total


@numba.njit(cache=True, nogil=True)
def _minmax_rows(logged, low, span, bias, norm, out):  # pragma: no cover
    """The rows into ``out``; False (and ``out`` partly written) at a non-finite entry."""
    n, d = logged.shape
    width = out.shape[1]
    squares = np.empty(width)
    root = math.sqrt(width)
    for i in range(n):
        row = out[i]
        for j in range(d):
            if not math.isfinite(logged[i, j]):
                return False
            if span[j] > 0:
                value = (logged[i, j] - low[j]) / span[j]
            else:  # a constant feature maps to 0
                value = 0.0
            value = value if value > 0.0 else 0.0  # numpy's clip: max, then min
            row[j] = value if value < 1.0 else 1.0
        if bias:
            row[d] = 1.0
        if norm == 1:
            for j in range(width):
                squares[j] = row[j] * row[j]
            length = math.sqrt(_pairwise(squares, 0, width))
            if length > 1.0:
                for j in range(width):
                    row[j] = row[j] / length
        elif norm == 2:
            for j in range(width):
                row[j] = row[j] / root
    return True


def minmax_rows(
    logged: NDArray[np.float64],
    low: NDArray[np.float64],
    high: NDArray[np.float64],
    *,
    bias: bool,
    norm: int,
    out: NDArray[np.float64],
) -> NDArray[np.float64]:
    """The ``minmax`` step of rows ``logged`` (n, d) (already ``log1p``-ed: the step's
    input) with bounds ``low`` and ``high`` (d,), clipped to ``[0, 1]`` (a feature with
    ``high <= low`` maps to 0), then the bias column if ``bias`` and the norm step ``norm``
    (:data:`NORM_NONE`, :data:`NORM_UNIT_BALL` or :data:`NORM_SCALE`), into ``out``
    (n, d + bias) float64, C-contiguous rows; returns ``out``. The numbers of
    :meth:`~p2pdp.data.preprocess.FittedPreprocessor.transform`'s numpy steps (module
    docstring). ConfigError for a non-finite entry of ``logged``, ValueError for rows wider
    than :data:`MAX_WIDTH`."""
    if out.shape[1] > MAX_WIDTH:
        raise ValueError(f"rows of at most {MAX_WIDTH} values, got {out.shape[1]}")
    if not _minmax_rows(np.ascontiguousarray(logged), low, high - low, bias, norm, out):
        raise ConfigError("logged must contain only finite values, got a NaN or infinity")
    return out


def compile_transform() -> None:
    """Compile the kernel (or load it from numba's disk cache) in this process, so that
    processes forked after it inherit it instead of each loading its own."""
    one = np.ones(1)
    minmax_rows(one[None], one, one, bias=True, norm=NORM_UNIT_BALL, out=np.empty((1, 2)))
