"""The exact local models of consecutive small shards, one shard after another, compiled (numba).

:func:`p2pdp.learning.models.fit_local_models` solves a shard of ``n < d`` rows by damped
Newton in the dual (kernel) form, batched in numpy: one LAPACK call per routine for a batch of
equal-size shards, then numpy's gathers and reductions over the batch. A large synthetic run
trained in blocks (:mod:`p2pdp.tasks.streamed`) solves 3,277 shards of 20 rows in every block
of 65,536 rows; there this module solves them one by one in compiled code instead: the same
Newton steps, line search, stopping rule and final gradient norm (:func:`_newton` of
:mod:`p2pdp.learning.models`, dual form), at about half the CPU time (a block of 3,276 shards
of 20 rows and 58 features, one core of the shared 2-core machine: 49 ms against 93 ms,
medians of 5). The numbers are not those of the
LAPACK path bit for bit (an LU solve of its own, sums in another order): the weights agree to
about 1e-15 relative, and every peer is certified all the same, its achieved gradient norm at
most ``tol`` (``tests/learning/test_compiled.py``). A peer's model depends on its shard only,
so the models do not depend on the number of workers.

This module (hence numba) is imported, and the kernel compiled or loaded from numba's disk
cache, by the training in blocks only, so smaller runs pay nothing for it.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numpy.typing import NDArray

from p2pdp.core.errors import P2PDPError

# the batched Newton's line search: the Armijo constant, its rounding slack, the least step
from p2pdp.learning.newton import _ARMIJO, _MIN_STEP, _ROUNDING_SLACK

__all__ = ["compile_fits", "fit_consecutive_shards"]


@numba.njit(cache=True, nogil=True)
def _softplus(m: float) -> float:  # pragma: no cover
    """``log(1 + exp(-m))``, without overflow."""
    if m > 0:
        return math.log1p(math.exp(-m))
    return -m + math.log1p(math.exp(m))


@numba.njit(cache=True, nogil=True)
def _expit(t: float) -> float:  # pragma: no cover
    """``1 / (1 + exp(-t))``, without overflow."""
    if t >= 0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


@numba.njit(cache=True, nogil=True)
def _objective(y, scores, step, length, sq_norm, lam):  # pragma: no cover
    """``J`` at the scores ``scores + length * step`` and squared model norm ``sq_norm``."""
    total = 0.0
    for i in range(y.size):
        total += _softplus(y[i] * (scores[i] + length * step[i]))
    return total / y.size + 0.5 * lam * sq_norm


@numba.njit(cache=True, nogil=True)
def _solve(A, b, out):  # pragma: no cover
    """``out = A^{-1} b`` by Gaussian elimination with partial pivoting (``A``, ``b`` spoilt)."""
    n = b.size
    for k in range(n):
        pivot, best = k, abs(A[k, k])
        for i in range(k + 1, n):
            if abs(A[i, k]) > best:
                pivot, best = i, abs(A[i, k])
        if pivot != k:
            for j in range(n):
                A[k, j], A[pivot, j] = A[pivot, j], A[k, j]
            b[k], b[pivot] = b[pivot], b[k]
        for i in range(k + 1, n):
            factor = A[i, k] / A[k, k]
            for j in range(k + 1, n):
                A[i, j] -= factor * A[k, j]
            b[i] -= factor * b[k]
    for i in range(n - 1, -1, -1):
        total = b[i]
        for j in range(i + 1, n):
            total -= A[i, j] * out[j]
        out[i] = total / A[i, i]


@numba.njit(cache=True, nogil=True)
def _matvec(K, v, out):  # pragma: no cover
    for i in range(v.size):
        total = 0.0
        for k in range(v.size):
            total += K[i, k] * v[k]
        out[i] = total


@numba.njit(cache=True, nogil=True)
def _fit_all(X, y, starts, lam, tol, max_iter, weights, norms, status):  # pragma: no cover
    """Every shard ``X[starts[j] : starts[j + 1]]``; ``status = (steps, failed shard or -1,
    0 for no convergence or 1 for a failed line search)``."""
    status[0], status[1], status[2] = 0, -1, 0
    for j in range(starts.size - 1):
        rows = X[starts[j] : starts[j + 1]]
        labels = y[starts[j] : starts[j + 1]]
        n = labels.size
        K = rows @ rows.T
        alpha, scores = np.zeros(n), np.zeros(n)
        gradient, step, score_step = np.empty(n), np.empty(n), np.empty(n)
        image, curvature = np.empty(n), np.empty(n)
        system, rhs = np.empty((n, n)), np.empty(n)
        sq_norm = 0.0
        value = _objective(labels, scores, scores, 0.0, sq_norm, lam)
        steps = 0
        while True:
            for i in range(n):
                margin = labels[i] * scores[i]
                tail = _expit(-margin)
                gradient[i] = -labels[i] * tail / n + lam * alpha[i]
                curvature[i] = _expit(margin) * tail / n
            _matvec(K, gradient, image)
            norm_sq = 0.0
            for i in range(n):
                norm_sq += gradient[i] * image[i]
            if math.sqrt(max(norm_sq, 0.0)) <= tol:
                break
            if steps == max_iter:
                status[1], status[2] = j, 0
                return
            steps += 1
            for i in range(n):
                for k in range(n):
                    system[i, k] = curvature[i] * K[i, k]
                system[i, i] += lam
                rhs[i] = -gradient[i]
            _solve(system, rhs, step)
            _matvec(K, step, score_step)
            slope = cross = step_sq = 0.0
            for i in range(n):
                slope += gradient[i] * score_step[i]
                cross += alpha[i] * score_step[i]
                step_sq += step[i] * score_step[i]
            length = 1.0
            while True:
                sq = sq_norm + length * (2 * cross + length * step_sq)
                trial = _objective(labels, scores, score_step, length, sq, lam)
                if trial <= value + _ARMIJO * length * slope + _ROUNDING_SLACK * abs(value):
                    break
                length *= 0.5
                if length < _MIN_STEP:
                    status[1], status[2] = j, 1
                    return
            for i in range(n):
                alpha[i] += length * step[i]
            _matvec(K, alpha, scores)
            sq_norm = 0.0
            for i in range(n):
                sq_norm += alpha[i] * scores[i]
            value = _objective(labels, scores, scores, 0.0, sq_norm, lam)
        status[0] = max(status[0], steps)
        w = alpha @ rows
        weights[j] = w
        coefficients = np.empty(n)
        for i in range(n):
            coefficients[i] = -labels[i] * _expit(-labels[i] * (rows[i] @ w)) / n
        primal = coefficients @ rows + lam * w
        norms[j] = math.sqrt(primal @ primal)


def fit_consecutive_shards(
    X: NDArray[np.float64],
    y: NDArray[np.float64],
    starts: NDArray[np.int64],
    lam: float,
    tol: float,
    max_iter: int,
    *,
    first_peer: int = 0,
) -> tuple[NDArray[np.float64], NDArray[np.float64], int]:
    """Exact models of the shards ``X[starts[j] : starts[j + 1]]`` (each of fewer rows than
    ``X``'s d columns, at least one), as :func:`p2pdp.learning.models.fit_local_models`
    solves them in the dual form.

    ``X`` (m, d) C-contiguous float64 rows, ``y`` (m,) float64 labels in {-1, +1},
    ``starts`` (k + 1,) increasing row numbers; ``lam``, ``tol`` and ``max_iter`` as there.
    Returns the weights (k, d), the achieved gradient norms (k,), each at most ``tol``, and
    the most Newton steps any shard took. P2PDPError naming peer ``first_peer + j`` if shard
    ``j`` does not reach ``tol`` in ``max_iter`` steps or its line search fails. ValueError
    for a shard of ``d`` rows or more, or none.
    """
    sizes = np.diff(starts)
    if sizes.size and (sizes.min() < 1 or sizes.max() >= X.shape[1]):
        raise ValueError(
            f"shards must have 1 to {X.shape[1] - 1} rows, got {sizes.min()} to {sizes.max()}"
        )
    weights, norms = np.empty((sizes.size, X.shape[1])), np.empty(sizes.size)
    status = np.zeros(3, dtype=np.int64)
    _fit_all(
        np.ascontiguousarray(X),
        np.ascontiguousarray(y),
        starts.astype(np.int64),
        lam,
        tol,
        max_iter,
        weights,
        norms,
        status,
    )
    steps, failed, reason = (int(value) for value in status)
    if failed >= 0:
        peer = first_peer + failed
        if reason == 0:
            raise P2PDPError(
                f"Newton did not reach gradient norm <= {tol:g} in max_iter={max_iter} "
                f"iterations: worst peer {peer}"
            )
        raise P2PDPError(f"line search failed for peer {peer}")
    return weights, norms, steps


def compile_fits() -> None:
    """Compile the kernel (or load it from numba's disk cache) in this process, so that
    processes forked after it inherit it instead of each compiling its own."""
    fit_consecutive_shards(np.eye(1, 2), np.ones(1), np.array([0, 1]), 1.0, 1.0, 1)
