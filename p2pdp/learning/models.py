"""Exact L2-regularised logistic regression for many peers at once.

Peer ``j`` holds the rows ``X[shards[j]]`` with labels ``y[shards[j]]`` in ``{-1, +1}`` and
computes the exact minimiser of

``J_j(w) = (1/n_j) sum_{i in shard j} log(1 + exp(-y_i w.x_i)) + (lam/2) ||w||_2^2``

over all ``d`` coordinates (the bias is an ordinary, regularised column of ``X``). Output
perturbation (Chaudhuri, Monteleoni & Sarwate 2011) relies on ``w`` being the *exact* minimiser:
then, if every row has ``||x_i||_2 <= 1``, replacing one record of peer ``j``'s shard moves the
model by at most ``2 / (n_j lam)`` in L2 norm. The solvers here therefore iterate until the
gradient norm ``||grad J_j(w)||_2`` is at most ``tol`` (default ``1e-9``) and report the achieved
norms; they never stop early. (The seed trained by gradient descent with a learning rate tuned
by 3-fold cross-validation per peer; an exact Newton solver needs no learning rate at all.)
The solvers do not assume ``||x_i|| <= 1``; only the privacy bound does.

:func:`fit_local_models` is a batched Newton (IRLS) method; :func:`fit_local_models_sklearn` is
the per-peer scikit-learn reference it is tested against.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from p2pdp.core.boundary import calling, check_methods, check_number
from p2pdp.core.errors import ConfigError, P2PDPError
from p2pdp.core.parallel import (
    current_workers,
    forked_map,
    maps_here,
    one_blas_thread,
    shared_empty,
)
from p2pdp.learning.newton import (
    STREAM_BLOCK,
    STREAM_MIN_ROWS,
    _batched_matvec,
    _loss_coefficients,
    _newton,
    _newton_streaming,
)

__all__ = [
    "LocalModels",
    "fit_local_models",
    "fit_local_models_sklearn",
    "logistic_objective_gradient",
]

METHODS: tuple[str, ...] = ("auto", "batched", "per_peer")
#: ``method="auto"`` solves shards of at least this many rows one peer at a time: from about
#: 2,000 rows per peer batching stopped paying (``benchmarks/bench_local_training.py``).
PER_PEER_MIN_ROWS = 2048
GRADIENT_TOLERANCE = 1e-9  # default bound on every peer's ||grad J_j||, see group_sensitivity
#: Memory one batch of peers may use (rows, Gram or Hessian matrices, temporaries), in bytes.
#: Larger batches amortise Python overhead but leave the cache; 16 MiB was fastest from 40 to
#: 4,000 rows per peer (2-core machine, d = 58).
CHUNK_BYTES = 16 * 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalModels:
    """Every peer's exact local model.

    Attributes
    ----------
    weights : numpy.ndarray, shape (P, d), float64
        Row ``j`` is the minimiser of peer ``j``'s objective ``J_j``.
    grad_norms : numpy.ndarray, shape (P,), float64
        Achieved ``||grad J_j(weights[j])||_2``, recomputed from ``weights`` (at most the
        solver's ``tol``, up to rounding of order 1e-16).
    iterations : int
        Newton iterations used (maximum over peers).
    shard_sizes : numpy.ndarray, shape (P,), int64
        ``n_j``, the number of rows of each peer (the sensitivity of peer ``j``'s model is
        ``2 / (n_j lam)``).
    """

    weights: NDArray[np.float64]
    grad_norms: NDArray[np.float64]
    iterations: int
    shard_sizes: NDArray[np.int64]


def logistic_objective_gradient(
    w: NDArray[np.float64], X: NDArray[np.float64], y: NDArray[np.float64], lam: float
) -> tuple[float, NDArray[np.float64]]:
    """Value and gradient of one peer's objective ``J(w)``.

    Parameters
    ----------
    w : numpy.ndarray, shape (d,)
        Model.
    X : numpy.ndarray, shape (n, d)
        The peer's rows, ``n >= 1``.
    y : numpy.ndarray, shape (n,)
        Labels in ``{-1, +1}``.
    lam : float
        Regularisation strength, ``> 0``.

    Returns
    -------
    value : float
        ``(1/n) sum_i log(1 + exp(-y_i w.x_i)) + (lam/2) ||w||^2``, computed stably.
    gradient : numpy.ndarray, shape (d,)
        ``-(1/n) sum_i y_i expit(-y_i w.x_i) x_i + lam w``.
    """
    from scipy.special import expit, log_expit

    margins = y * (X @ w)
    value = -np.mean(log_expit(margins)) + 0.5 * lam * float(w @ w)
    gradient = -(y * expit(-margins)) @ X / len(y) + lam * w
    return float(value), gradient


#: Newton steps :func:`fit_local_models` allows by default (from ``w = 0`` it takes 5-15).
MAX_NEWTON_STEPS = 50
#: Shards whose indices :func:`_validate` range-checks with one numpy call.
_CHECK_SHARDS = 4096


def _validate(
    X: ArrayLike, y: ArrayLike, shards: Sequence[ArrayLike], lam: float
) -> tuple[NDArray[np.float64], NDArray[np.float64], list[NDArray[np.int64]]]:
    """``X``, ``y`` as float64 and ``shards`` as int64 arrays, or ConfigError."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
        raise ConfigError(f"X must be a non-empty 2-D array, got shape {X.shape}")
    if y.shape != (X.shape[0],):
        raise ConfigError(f"y must have shape ({X.shape[0]},) to match X, got shape {y.shape}")
    if not (np.isfinite(X.min()) and np.isfinite(X.max())):  # no N x d temporary
        raise ConfigError("X must contain only finite values, got a NaN or infinity")
    bad_labels = (y != 1.0) & (y != -1.0)
    if bad_labels.any():
        raise ConfigError(f"y must contain only -1 and +1, got {y[bad_labels][0]}")
    if not (np.isfinite(lam) and lam > 0):
        raise ConfigError(f"lam must be > 0 and finite, got {lam}")
    if len(shards) == 0:
        raise ConfigError("shards must hold at least one peer, got 0")
    arrays = [np.asarray(shard) for shard in shards]
    for j, shard in enumerate(arrays):
        if shard.ndim != 1 or shard.size == 0 or shard.dtype.kind not in "iu":
            raise ConfigError(
                f"shards[{j}] must be a non-empty 1-D integer array, got dtype {shard.dtype} "
                f"and shape {shard.shape}"
            )
    # Range-check the indices a chunk of shards at a time: one numpy call per chunk instead of
    # two per shard (a million shards), and no copy of every index at once.
    for first in range(0, len(arrays), _CHECK_SHARDS):
        chunk = np.concatenate(arrays[first : first + _CHECK_SHARDS])
        if chunk.min() < 0 or chunk.max() >= X.shape[0]:
            for j, shard in enumerate(arrays[first : first + _CHECK_SHARDS], first):
                bad = shard[(shard < 0) | (shard >= X.shape[0])]
                if bad.size:
                    raise ConfigError(
                        f"shards[{j}] holds row index {bad[0]}, out of range for X with "
                        f"{X.shape[0]} rows"
                    )
    arrays = [shard.astype(np.int64, copy=False) for shard in arrays]
    return X, y, arrays


def _batches(
    sizes: NDArray[np.int64], chunk_size: int | None, d: int, method: str
) -> list[NDArray[np.intp]]:
    """Split peer numbers into batches of equal shard size, each within the memory cap."""
    order = np.argsort(sizes, kind="stable")
    batches: list[NDArray[np.intp]] = []
    for group in np.split(order, np.flatnonzero(np.diff(sizes[order])) + 1):
        n = int(sizes[group[0]])
        r = min(n, d)  # the dual form works in n dimensions below d rows
        per_peer_bytes = 8 * (4 * n * d + 9 * r * r)  # rows, Gram or Hessian, solver copies
        one_by_one = method == "per_peer" or (method == "auto" and n >= PER_PEER_MIN_ROWS)
        limit = 1 if one_by_one else CHUNK_BYTES // per_peer_bytes
        limit = max(1, min(limit, chunk_size or limit))
        batches.extend(group[k : k + limit] for k in range(0, len(group), limit))
    return batches


#: A :func:`fit_local_models` problem: X, y, shards, shard sizes, lam, tol, max_iter, the
#: workers of a streamed shard (1 when the batches themselves run in workers), and the
#: weights (P, d) and gradient norms (P,) to write each batch's into (None: return them).
_Problem = tuple[
    NDArray[np.float64], NDArray[np.float64], list[NDArray[np.int64]], NDArray[np.int64],
    float, float, int, int, tuple[int, int],
    tuple[NDArray[np.float64], NDArray[np.float64]] | None,
]  # fmt: skip


def _fit_batch(
    problem: _Problem, batch: NDArray[np.intp]
) -> tuple[int, tuple[NDArray[np.float64], NDArray[np.float64]] | None]:
    """Newton steps of one batch of peers, and their weights (B, d) and achieved gradient
    norms (B,), or None once written into the problem's outputs (rows ``batch``)."""
    weights, norms, steps = _solve_batch(*problem[:9], batch)
    out = problem[9]
    if out is None:
        return steps, (weights, norms)
    out[0][batch], out[1][batch] = weights, norms
    return steps, None


def _solve_batch(
    X: NDArray[np.float64],
    y: NDArray[np.float64],
    shard_arrays: list[NDArray[np.int64]],
    sizes: NDArray[np.int64],
    lam: float,
    tol: float,
    max_iter: int,
    workers: int,
    stream: tuple[int, int],
    batch: NDArray[np.intp],
) -> tuple[NDArray[np.float64], NDArray[np.float64], int]:
    """Weights (B, d), achieved gradient norms (B,) and Newton steps of one batch of peers;
    ``stream = (min_rows, block)``: a single shard of ``min_rows`` rows or more is solved by
    :func:`_newton_streaming` in blocks of ``block`` rows."""
    min_rows, block = stream
    if len(batch) == 1 and sizes[batch[0]] >= min_rows:
        peer = int(batch[0])
        w, norm, steps = _newton_streaming(
            X, y, shard_arrays[peer], lam, tol, max_iter, peer, workers=workers, block=block
        )
        return w[None, :], np.array([norm]), steps
    rows = np.stack([shard_arrays[j] for j in batch])  # (B, n)
    Xb, yb = X[rows], y[rows]
    if rows.shape[1] < X.shape[1]:
        gram = np.matmul(Xb, Xb.transpose(0, 2, 1))
        alpha, steps = _newton(gram, yb, lam, tol, max_iter, batch, dual=True)
        wb = np.matmul(alpha[:, None, :], Xb)[:, 0, :]
    else:
        wb, steps = _newton(Xb, yb, lam, tol, max_iter, batch, dual=False)
    coefficients = _loss_coefficients(yb * _batched_matvec(Xb, wb), yb)
    norms = np.linalg.norm(np.matmul(coefficients[:, None, :], Xb)[:, 0, :] + lam * wb, axis=1)
    return wb, norms, steps


def fit_local_models(
    X: ArrayLike,
    y: ArrayLike,
    shards: Sequence[ArrayLike],
    lam: float,
    *,
    tol: float = GRADIENT_TOLERANCE,
    max_iter: int = MAX_NEWTON_STEPS,
    method: str = "auto",
    chunk_size: int | None = None,
    workers: int | None = None,
    stream_min_rows: int = STREAM_MIN_ROWS,
    stream_block: int = STREAM_BLOCK,
) -> LocalModels:
    """Exact local models of all peers by batched Newton (IRLS).

    Parameters
    ----------
    X : numpy.ndarray, shape (N, d)
        All rows (finite; the privacy bound, not the solver, needs ``||x_i||_2 <= 1``).
    y : numpy.ndarray, shape (N,)
        Labels in ``{-1, +1}``.
    shards : sequence of P integer arrays
        ``shards[j]`` indexes peer ``j``'s rows in ``X``; sizes may differ, each ``>= 1``.
    lam : float
        Regularisation strength ``lambda > 0`` (applied to every coordinate).
    tol : float, default 1e-9
        Every peer is solved to ``||grad J_j||_2 <= tol``.
    max_iter : int, default 50
        Newton iterations allowed; Newton from ``w = 0`` typically needs 5-15.
    method : {"auto", "batched", "per_peer"}
        ``"batched"`` stacks peers whose shards have the same size (no padding) into batches
        of about ``CHUNK_BYTES`` and solves each batch with one call per LAPACK routine;
        ``"per_peer"`` runs the same code one peer at a time; ``"auto"`` batches shards of
        fewer than ``PER_PEER_MIN_ROWS`` rows and solves larger ones one by one. All three
        give bitwise identical models. Measured (``benchmarks/bench_local_training.py
        --rows-per-peer``, d = 58, 400,000 rows in all): batching is 27x faster than per-peer
        at 10 rows per peer, 6x at 40, 1.9x at 300 and 1.2x at 1,000; at 2,000-4,000 rows
        per-peer was 0-20% faster (within run-to-run noise), and from about 8,000 rows the
        memory cap makes every batch a single peer anyway.
    chunk_size : int, optional
        Most peers per batch (default: as many as fit in ``CHUNK_BYTES``). Results do not
        depend on it.
    workers : int, optional
        Local processes solving batches in parallel (forked: they read ``X`` without a copy),
        or, for a single shard of at least ``STREAM_MIN_ROWS`` rows (the centralised
        reference), summing its blocks' gradients and Hessians (:func:`_newton_streaming`).
        Default: :func:`~p2pdp.core.parallel.local_workers`' setting, 1 unless a caller raised
        it. Results are bitwise identical for any number (a peer's model depends only on its
        shard; block sums are added in block order).
    stream_min_rows, stream_block : int, default 200,000 and 65,536
        A single shard of at least ``stream_min_rows`` rows is solved by
        :func:`_newton_streaming`, its rows read in blocks of ``stream_block`` (memory
        besides ``X``: one block per process). Other sizes give the same minimiser to the
        certified tolerance (the same rows summed in another order), not the same bits.

    Returns
    -------
    LocalModels
        Models in the order of ``shards``, with achieved gradient norms.

    Raises
    ------
    ConfigError
        Bad input (shapes, non-finite ``X``, labels outside ``{-1, +1}``, ``lam <= 0``, empty
        shard, index out of range, bad option).
    P2PDPError
        Some peer did not reach ``tol`` within ``max_iter`` iterations (names the peer and its
        gradient norm).

    Notes
    -----
    Newton (IRLS) from ``w = 0`` with an Armijo backtracking line search (see :func:`_newton`);
    shards with fewer rows than ``d`` are solved in the dual (kernel) form, ``n x n`` systems
    instead of ``d x d``. A peer's model depends only on its own shard, not on which other
    peers share its batch, their order, or ``chunk_size``.

    Strong convexity turns the achieved gradient norm into a certificate: the distance to the
    exact minimiser is at most ``grad_norms[j] / lam``. A privacy analysis that wants to be
    rigorous about the solver can add ``2 * tol / lam`` to the sensitivity ``2 / (n_j lam)``.

    BLAS runs single-threaded inside this function (``threadpoolctl``): thousands of small
    LAPACK calls gain nothing from BLAS threads, and on a busy 2-core machine the default
    threading made the solver 1.4x (40 rows per peer) to 5x (300+ rows) slower. Parallelise
    across runs instead.
    """
    X, y, shard_arrays = _validate(X, y, shards, lam)
    if not (np.isfinite(tol) and tol > 0):
        raise ConfigError(f"tol must be > 0 and finite, got {tol}")
    if max_iter < 1:
        raise ConfigError(f"max_iter must be >= 1, got {max_iter!r}")
    if method not in METHODS:
        raise ConfigError(f"method must be one of {METHODS}, got {method!r}")
    if chunk_size is not None and chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size!r}")
    for name, value in (("stream_min_rows", stream_min_rows), ("stream_block", stream_block)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    workers = current_workers() if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    sizes = np.array([len(shard) for shard in shard_arrays], dtype=np.int64)
    d = X.shape[1]
    batches = _batches(sizes, chunk_size, d, method)
    # each batch writes its models into weights and grad_norms, except on other machines: in
    # forked workers, into shared memory (no result pickled, nothing copied here)
    here = maps_here(workers, len(batches))
    empty = shared_empty if here and min(workers, len(batches)) > 1 else np.empty
    weights, grad_norms = empty((len(sizes), d)), empty((len(sizes),))
    out = (weights, grad_norms) if here else None
    streamed = workers if len(batches) == 1 else 1
    stream = (stream_min_rows, stream_block)
    problem = (X, y, shard_arrays, sizes, lam, tol, max_iter, streamed, stream, out)
    with one_blas_thread():  # inherited by forked workers
        # forked processes read X as it is (copy-on-write): no copy, no pickle
        fitted = forked_map(_fit_batch, problem, batches, workers=workers)
    iterations = 0
    for batch, (steps, models) in zip(batches, fitted, strict=True):
        if models is not None:
            weights[batch], grad_norms[batch] = models
        iterations = max(iterations, steps)
    return LocalModels(
        weights=weights, grad_norms=grad_norms, iterations=iterations, shard_sizes=sizes
    )


def fit_local_models_sklearn(
    X: ArrayLike, y: ArrayLike, shards: Sequence[ArrayLike], lam: float, *, tol: float = 1e-12
) -> LocalModels:
    """Reference path: one scikit-learn fit per peer (slow; for tests and benchmarks).

    Peer ``j`` fits ``LogisticRegression(C=1/(n_j lam), fit_intercept=False,
    solver="newton-cholesky", tol=tol)``. scikit-learn minimises ``sum_i loss_i + ||w||^2/(2C)
    = n_j J_j(w)``, so the minimiser is the same. The default ``lbfgs`` solver at its default
    ``tol=1e-4`` stops far from the optimum (on 100 Spambase shards of 46 rows: coefficients
    off by up to 7e-3 at ``lam = 1e-2`` and 7e-2 at ``lam = 1e-3``), too far for the privacy
    bound, hence Newton-Cholesky at a tight ``tol``. scikit-learn refuses single-class data; such a
    shard gets one extra all-zero row of the other label with sample weight 0, which changes
    neither the objective nor its minimiser.

    Parameters and returns are as in :func:`fit_local_models` (at most 100 iterations per
    peer); ``iterations`` is the maximum of scikit-learn's ``n_iter_``.

    Raises
    ------
    ConfigError
        Bad input, as in :func:`fit_local_models`.
    P2PDPError
        scikit-learn did not converge for some peer.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    X, y, shard_arrays = _validate(X, y, shards, lam)
    weights = np.empty((len(shard_arrays), X.shape[1]))
    grad_norms = np.empty(len(shard_arrays))
    iterations = 0
    # one BLAS thread, as in fit_local_models; non-convergence is an error, not a warning
    with one_blas_thread(), warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        for j, shard in enumerate(shard_arrays):
            Xj, yj, sample_weight = X[shard], y[shard], np.ones(len(shard))
            if np.all(yj == yj[0]):
                Xj = np.vstack([Xj, np.zeros(X.shape[1])])
                yj = np.append(yj, -yj[0])
                sample_weight = np.append(sample_weight, 0.0)
            model = LogisticRegression(
                C=1.0 / (len(shard) * lam),
                fit_intercept=False,
                solver="newton-cholesky",
                tol=tol,
                max_iter=100,
            )
            try:
                model.fit(Xj, yj, sample_weight=sample_weight)
            except ConvergenceWarning as exc:
                raise P2PDPError(f"scikit-learn did not converge for peer {j}: {exc}") from exc
            weights[j] = model.coef_[0]
            grad_norms[j] = np.linalg.norm(
                logistic_objective_gradient(weights[j], X[shard], y[shard], lam)[1]
            )
            iterations = max(iterations, int(model.n_iter_[0]))
    sizes = np.array([len(shard) for shard in shard_arrays], dtype=np.int64)
    return LocalModels(
        weights=weights, grad_norms=grad_norms, iterations=iterations, shard_sizes=sizes
    )


# --- the local-model component --------------------------------------------------------------------
class LocalModel(Protocol):
    """A local learner (the ``model`` component kind, ``training.model``).

    Every peer minimises an L2-regularised empirical risk on its own shard; the group
    sensitivity the engine adds noise for (:func:`p2pdp.privacy.calibration.group_sensitivity`) is
    ``2 (L / n_min + tau) / (K lam)``, which holds when

    * the loss is convex and ``L``-Lipschitz in ``w`` for rows with ``||x||_2 <= 1``
      (:attr:`lipschitz`; the rows are projected onto the unit ball by preprocessing),
    * the objective is ``lam``-strongly convex over every coordinate, and
    * every returned model has ``||grad J_j||_2 <= tau`` (:attr:`gradient_tolerance`): the
      engine refuses models that do not (``LocalModels.grad_norms``).

    A learner that cannot promise these must not be used with the output-perturbation
    mechanisms. It is constructed without arguments.
    """

    lipschitz: float
    gradient_tolerance: float

    def fit(
        self, X: np.ndarray, y: np.ndarray, shards: Sequence[np.ndarray], lam: float
    ) -> LocalModels:
        """Every peer's model: ``X`` (N, d), ``y`` (N,) in {-1, +1}, P index arrays."""
        ...


class GradientModel(LocalModel, Protocol):
    """A local learner the iterative protocols (D-PSGD, Muffliato, gossip learning) can step.

    They take private gradient steps themselves (:mod:`p2pdp.protocols.iterative`): each
    stepping peer releases the sum of its sampled records' clipped loss gradients plus
    Gaussian noise (:meth:`p2pdp.learning.local_problem.LocalProblem.clipped_sums`). For a
    linear model, whose loss on record ``(x, y)`` is ``l(x.w, y)``, that gradient is
    ``l'(x.w, y) x``, with ``l'`` the derivative in the score ``x.w``: the model declares
    ``l'``. The privacy of a step holds whatever ``l'`` is: each record's gradient is clipped
    to L2 norm ``C`` (``protocol.clip_norm``) before it is summed, so one record changes the
    sum by at most ``2C`` (replace-one) or ``C`` (add/remove). The L2 regulariser's gradient
    ``lam w`` is added by the step (it reads no record).
    """

    def loss_derivative(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``l'(s_i, y_i)``, the derivative of the loss in the score: ``scores`` (n,) the
        records' ``x.w``, ``y`` (n,) their labels in {-1, +1}; returns (n,) floats, finite."""
        ...


class LogisticModel:
    """L2-regularised logistic regression solved exactly by batched Newton (the seed's model).

    The logistic loss is 1-Lipschitz for rows of norm <= 1; every model is solved to
    ``||grad J_j|| <= 1e-9`` (:data:`GRADIENT_TOLERANCE`). A :class:`GradientModel`: the
    iterative protocols step along its per-record gradients.
    """

    lipschitz: float = 1.0
    gradient_tolerance: float = GRADIENT_TOLERANCE

    def fit(
        self, X: np.ndarray, y: np.ndarray, shards: Sequence[np.ndarray], lam: float
    ) -> LocalModels:
        return fit_local_models(X, y, shards, lam, tol=self.gradient_tolerance)

    def loss_derivative(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Of ``log(1 + exp(-y s))`` in ``s``: ``-y sigmoid(-y s)``, in (-1, 1)."""
        from scipy.special import expit

        return -y * expit(-(y * scores))


def make_model(name: str) -> LocalModel:
    """The learner ``training.model`` names (a built-in name or an import string)."""
    if name == "logistic":
        return LogisticModel()
    from p2pdp.core.components import resolve

    cls = resolve("model", name, key="training.model")
    check_methods(cls, "model", ("fit",), "p2pdp.learning.models.LocalModel")
    with calling("model", cls, "__init__"):
        model = cls()
    for attribute in ("lipschitz", "gradient_tolerance"):
        check_number(getattr(model, attribute, None), "model", model, attribute, low=0.0)
    return model
