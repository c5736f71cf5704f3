"""The Newton (IRLS) solver behind :func:`p2pdp.learning.models.fit_local_models`.

Two forms of the same damped Newton method with an Armijo backtracking line search, iterated
until every gradient norm is at most ``tol`` (the exactness output perturbation relies on,
:mod:`p2pdp.learning.models`):

- :func:`_newton`, batched: many small shards at once, their Gram or Hessian matrices stacked;
- :func:`_newton_streaming` and :func:`newton_from_block_sums`: one large shard (the
  centralised reference) whose rows are read in blocks of :data:`STREAM_BLOCK`, each pass a sum
  over blocks in block order (the same sums for any number of workers), and whose last pass is
  skipped where :func:`_certified_norm` certifies it (the training in blocks,
  :mod:`p2pdp.tasks.streamed`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from p2pdp.core.errors import P2PDPError
from p2pdp.core.parallel import (
    forked_pool,
)

#: Armijo sufficient-decrease constant of the backtracking line search.
_ARMIJO = 1e-4
#: Relative slack of the Armijo test, so that rounding in ``J`` near the optimum (where the
#: exact decrease is below float resolution) cannot reject a Newton step.
_ROUNDING_SLACK = 64 * np.finfo(np.float64).eps
#: Smallest step length before a line search is declared failed.
_MIN_STEP = 2.0**-40


def _batched_matvec(A: NDArray[np.float64], v: NDArray[np.float64]) -> NDArray[np.float64]:
    """``A[k] @ v[k]`` for every ``k``: (B, m, r), (B, r) -> (B, m)."""
    return np.matmul(A, v[:, :, None])[:, :, 0]


def _loss_coefficients(
    margins: NDArray[np.float64], yb: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``c`` with ``grad J = X^T c + lam w``: ``c_i = -y_i expit(-m_i) / n``, (B, n)."""
    from scipy.special import expit

    return -yb * expit(-margins) / yb.shape[1]


def _newton(
    F: NDArray[np.float64],
    yb: NDArray[np.float64],
    lam: float,
    tol: float,
    max_iter: int,
    peers: NDArray[np.intp],
    *,
    dual: bool,
) -> tuple[NDArray[np.float64], int]:
    """Damped Newton on a batch of equal-size problems, in primal or dual (kernel) form.

    Parameters
    ----------
    F : numpy.ndarray, shape (B, n, r)
        Primal form: the rows ``X_j`` (``r = d``), parameters ``theta = w``.
        Dual form: the Gram matrices ``K_j = X_j X_j^T`` (``r = n``), parameters ``theta = alpha``
        with ``w = X_j^T alpha``. In both, ``F theta = X_j w`` (the scores).
    yb : numpy.ndarray, shape (B, n)
        Labels.
    lam, tol, max_iter
        As in :func:`fit_local_models`.
    peers : numpy.ndarray, shape (B,)
        Peer numbers, for error messages.
    dual : bool
        Which form ``F`` holds.

    Returns
    -------
    theta : numpy.ndarray, shape (B, r)
        Parameters whose model has ``||grad J_j(w)||_2 <= tol``.
    iterations : int
        Newton steps taken by the slowest peer.

    With ``c`` from :func:`_loss_coefficients` and ``S = diag(expit(m) expit(-m)) / n``, the
    primal step solves ``(X^T S X + lam I) dw = -(X^T c + lam w)``. Since
    ``(X^T S X + lam I)^{-1} X^T = X^T (S K + lam I)^{-1}``, the same step is ``dw = X^T dalpha``
    with ``(S K + lam I) dalpha = -(c + lam alpha)``: an ``n x n`` system instead of ``d x d``.
    All unconverged peers are solved in one batched LAPACK call; then each backtracks
    (Armijo) on ``J``. Rows in the unit ball never needed it in our tests (Spambase down to
    ``lam = 1e-5``, tiny separable shards), but rows of norm up to ``1e3`` with mixed labels
    made undamped Newton oscillate or diverge in about half of 300 random cases; with the line
    search all converged (at most 41 iterations). The full step is always tried first, so
    convergence near the optimum stays quadratic. Converged peers leave the batch.
    """
    from scipy.special import expit, log_expit

    def inner(
        u: NDArray[np.float64], v: NDArray[np.float64], Fv: NDArray[np.float64] | None
    ) -> NDArray[np.float64]:
        """``(X^T u) . (X^T v)`` in the dual form (``Fv = F v``), ``u . v`` in the primal; (B,)."""
        if not dual:
            return (u * v).sum(axis=1)
        if Fv is None:
            raise ValueError("the dual form needs Fv = F v")
        return (u * Fv).sum(axis=1)

    def objective(
        scores: NDArray[np.float64], sq_norms: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        return -log_expit(y_act * scores).mean(axis=1) + 0.5 * lam * sq_norms

    batch, n, r = F.shape
    theta = np.zeros((batch, r))
    active = np.arange(batch)  # positions of the peers not yet converged, and their data:
    F_act, y_act, theta_act = F, yb, theta.copy()
    scores, sq_norms = np.zeros((batch, n)), np.zeros(batch)
    values = objective(scores, sq_norms)
    identity = lam * np.eye(r)
    iteration = 0
    while True:
        margins = y_act * scores
        coefficients = _loss_coefficients(margins, y_act)
        if dual:
            grads = coefficients + lam * theta_act
        else:
            grads = np.matmul(coefficients[:, None, :], F_act)[:, 0, :] + lam * theta_act
        grad_images = _batched_matvec(F_act, grads) if dual else None
        grad_norms = np.sqrt(np.maximum(inner(grads, grads, grad_images), 0))
        keep = grad_norms > tol
        theta[active[~keep]] = theta_act[~keep]
        if not keep.any():
            return theta, iteration
        if iteration == max_iter:
            worst = int(np.argmax(grad_norms))
            raise P2PDPError(
                f"Newton did not reach gradient norm <= {tol:g} in max_iter={max_iter} "
                f"iterations: worst peer {peers[active[worst]]} has gradient norm "
                f"{grad_norms[worst]:.3e}"
            )
        iteration += 1
        if not keep.all():
            active, F_act, y_act = active[keep], F_act[keep], y_act[keep]
            theta_act, scores, sq_norms = theta_act[keep], scores[keep], sq_norms[keep]
            values, grads, margins = values[keep], grads[keep], margins[keep]
        curvature = (expit(margins) * expit(-margins) / n)[:, :, None]
        if dual:
            systems = curvature * F_act + identity
        else:
            systems = np.matmul(F_act.transpose(0, 2, 1), curvature * F_act) + identity
        steps = -np.linalg.solve(systems, grads[:, :, None])[:, :, 0]
        score_steps = _batched_matvec(F_act, steps)
        slopes = inner(grads, steps, score_steps)
        cross = inner(theta_act, steps, score_steps)
        step_sq_norms = inner(steps, steps, score_steps)
        lengths = np.ones(len(active))
        while True:
            trial_values = objective(
                scores + lengths[:, None] * score_steps,
                sq_norms + lengths * (2 * cross + lengths * step_sq_norms),
            )
            rejected = trial_values > (
                values + _ARMIJO * lengths * slopes + _ROUNDING_SLACK * np.abs(values)
            )
            if not rejected.any():
                break
            lengths[rejected] *= 0.5
            if lengths.min() < _MIN_STEP:
                raise P2PDPError(
                    f"line search failed at Newton iteration {iteration} for peer "
                    f"{peers[active[np.argmin(lengths)]]}"
                )
        theta_act = theta_act + lengths[:, None] * steps
        scores = _batched_matvec(F_act, theta_act)
        sq_norms = inner(theta_act, theta_act, scores)
        values = objective(scores, sq_norms)


#: A shard of at least this many rows (the centralised reference on a large data set) is
#: solved by :func:`_newton_streaming`: the same Newton steps, the rows read in blocks (in the
#: local worker processes when there are several), so memory besides the rows is one block
#: per process instead of three copies of the shard. Smaller shards keep the batched solver
#: (and every shipped scenario its bit-identical models). ``fit_local_models(stream_min_rows=)``
STREAM_MIN_ROWS = 200_000
#: Rows per block of :func:`_newton_streaming` (``fit_local_models(stream_block=)``): fixed for
#: a solve, so its sums do not depend on the workers; another size adds the same rows in
#: another order (the same minimiser, to the solver's certified tolerance).
STREAM_BLOCK = 65_536


#: What one block gives a pass of :func:`newton_from_block_sums` (:func:`sums_of_block`): its
#: loss and gradient sums, or its Hessian sum.
BlockSums = tuple[float, NDArray[np.float64]] | NDArray[np.float64]

#: Rows :func:`block_sums` and :func:`block_hessian` take at a time: 1,024 rows of d = 58
#: (0.5 MB) stay in a core's L2 cache for the second product of a pass, so a pass reads its
#: rows from memory once (and leaves the shared cache to whatever runs beside it). Measured
#: on one core over 2x10^6 rows in blocks of 65,536: 0.15 s against 0.19 s for the loss and
#: gradient, 0.43 s against 0.99 s for the Hessian (one product over each block, the loss
#: and gradient besides).
_SUM_CHUNK = 1024


def _block_sums(
    problem: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64], int],
    item: tuple[int, NDArray[np.float64], bool],
) -> BlockSums:
    """:func:`sums_of_block` of the rows ``rows[start : start + B]`` at ``w``, with
    ``problem = (X, y, rows, B)`` and ``item = (start, w, hessian)``."""
    X, y, rows, block = problem
    start, w, hessian = item
    part = rows[start : start + block]
    first = int(part[0])
    if int(part[-1]) - first == len(part) - 1 and np.all(np.diff(part) == 1):
        rows_of = slice(first, first + len(part))  # views
        return sums_of_block(X[rows_of], y[rows_of], w, hessian)
    return sums_of_block(X[part], y[part], w, hessian)


def block_sums(
    Xb: NDArray[np.float64], yb: NDArray[np.float64], w: NDArray[np.float64]
) -> tuple[float, NDArray[np.float64]]:
    """Unnormalised loss and gradient sums of one block of rows at the model ``w``, for a
    pass of :func:`newton_from_block_sums` (which divides by the number of rows and adds the
    regulariser).

    ``Xb`` (m, d) rows, ``yb`` (m,) float64 labels in {-1, +1}, ``w`` (d,). With margins
    ``m_i = y_i w.x_i``: ``sum_i log(1 + exp(-m_i))`` and ``sum_i -y_i expit(-m_i) x_i`` (d,),
    summed over :data:`_SUM_CHUNK` rows at a time, in row order.
    """
    from scipy.special import expit, log_expit

    loss, gradient = 0.0, np.zeros(Xb.shape[1])
    for start in range(0, len(yb), _SUM_CHUNK):
        rows, labels = Xb[start : start + _SUM_CHUNK], yb[start : start + _SUM_CHUNK]
        margins = labels * (rows @ w)
        loss -= float(log_expit(margins).sum())
        gradient += (-labels * expit(-margins)) @ rows
    return loss, gradient


def block_hessian(Xb: NDArray[np.float64], w: NDArray[np.float64]) -> NDArray[np.float64]:
    """Unnormalised Hessian sum of one block of rows ``Xb`` (m, d) at the model ``w`` (d,):
    ``sum_i expit(m_i) expit(-m_i) x_i x_i^T`` (d, d), which does not depend on the labels
    (the weight is even in the margin). Exactly symmetric: symmetric rank-k updates
    ``(r x)^T (r x)``, ``r = sqrt(expit(m) expit(-m))``, over :data:`_SUM_CHUNK` rows at a
    time, in row order.
    """
    from scipy.special import expit

    total = np.zeros((Xb.shape[1], Xb.shape[1]))
    for start in range(0, len(Xb), _SUM_CHUNK):
        rows = Xb[start : start + _SUM_CHUNK]
        scores = rows @ w
        scaled = rows * np.sqrt(expit(scores) * expit(-scores))[:, None]
        total += scaled.T @ scaled  # numpy calls the symmetric rank-k update (syrk)
    return total


def sums_of_block(
    Xb: NDArray[np.float64], yb: NDArray[np.float64], w: NDArray[np.float64], hessian: bool
) -> BlockSums:
    """What one block gives a pass of :func:`newton_from_block_sums`: its
    :func:`block_hessian` if ``hessian``, else its :func:`block_sums`."""
    return block_hessian(Xb, w) if hessian else block_sums(Xb, yb, w)


def _newton_streaming(
    X: NDArray[np.float64],
    y: NDArray[np.float64],
    rows: NDArray[np.int64],
    lam: float,
    tol: float,
    max_iter: int,
    peer: int,
    *,
    workers: int,
    block: int,
) -> tuple[NDArray[np.float64], float, int]:
    """Damped Newton for one peer on ``X[rows]``, reading the rows in blocks of ``block``.

    The steps of :func:`_newton` in primal form: a pass over the rows evaluates, at one
    model ``w``, either the objective and the gradient ``X^T c + lam w`` or the Hessian
    ``X^T S X + lam I``, as sums of per-block sums (:func:`_block_sums`), computed in
    ``workers`` forked processes (forked once for the whole solve) and added in block order,
    so the model does not depend on the number of workers (bitwise, on one machine). A
    Newton step is tried at full length first; a pass at the trial model gives its objective
    for the Armijo test and its gradient, and once it is accepted (and not yet optimal) a
    second pass its Hessian (:func:`newton_from_block_sums`). Memory besides
    ``X``: one block per process. Returns the weights, the achieved gradient norm and the
    Newton steps taken.
    """
    n, d = len(rows), X.shape[1]
    starts = range(0, n, block)
    with forked_pool(_block_sums, (X, y, rows, block), workers=workers) as blocks:
        return newton_from_block_sums(
            lambda v, hessian: blocks([(start, v, hessian) for start in starts]),
            n,
            d,
            lam,
            tol,
            max_iter,
            peer,
        )


def newton_from_block_sums(
    block_sums: Callable[[NDArray[np.float64], bool], Sequence[BlockSums]],
    n: int,
    d: int,
    lam: float,
    tol: float,
    max_iter: int,
    peer: int,
    *,
    remainder: Callable[[NDArray[np.float64]], tuple[float, float]] | None = None,
) -> tuple[NDArray[np.float64], float, int]:
    """The damped Newton of :func:`_newton_streaming`, its passes over the rows delegated.

    ``block_sums(w, hessian)`` returns the :func:`sums_of_block` of every block of the ``n``
    rows at the model ``w`` (d,): their loss and gradient sums, or only their Hessian sums if
    ``hessian``, in block order (blocks
    of :data:`STREAM_BLOCK` rows, however and wherever they are computed: forked processes,
    or a Dask cluster's workers holding the blocks, :mod:`p2pdp.experiments.run.cluster`); they
    are added here in that order, so the model is the same bit for bit for any executor.
    A point's Hessian is asked for in a second pass only once the point is accepted and its
    gradient is above ``tol``: the last pass (and a rejected trial's) skips it. Returns the
    weights (d,), the achieved gradient norm and the Newton steps taken; P2PDPError (naming
    ``peer``) if ``max_iter`` steps do not reach ``tol`` or a line search fails.

    ``remainder(step)``, if given, bounds what the second-order model misses over ``step``
    (d,) from any point ``w``: ``(a, b)`` with ``||grad J(w + step) - grad J(w) - H(w) step||
    <= a`` and ``J(w + step) - J(w) - grad J(w).step - step.H(w).step / 2 <= b``. A Newton
    step that these bounds certify (:func:`_certified_norm`: gradient norm at most ``tol / 4``
    after it, and the Armijo test passed at full length) is then taken without the pass at
    the new point, which would only have confirmed it: the same weights, one pass saved, and
    the certified bound returned as the gradient norm.
    """

    def at(v: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        """Objective and gradient of ``J`` at ``v``."""
        loss, gradient = 0.0, np.zeros(d)
        for block in block_sums(v, False):  # added in block order
            assert isinstance(block, tuple)  # a pass without the Hessian
            loss, gradient = loss + block[0], gradient + block[1]
        return loss / n + 0.5 * lam * float(v @ v), gradient / n + lam * v

    def hessian_at(v: NDArray[np.float64]) -> NDArray[np.float64]:
        """Hessian of ``J`` at ``v``."""
        hessian = np.zeros((d, d))
        for block in block_sums(v, True):  # added in block order
            assert not isinstance(block, tuple)  # the Hessian pass
            hessian = hessian + block
        return hessian / n + lam * np.eye(d)

    w = np.zeros(d)
    value, gradient = at(w)
    iteration = 0
    while True:
        grad_norm = float(np.linalg.norm(gradient))
        if grad_norm <= tol:
            return w, grad_norm, iteration
        if iteration == max_iter:
            raise P2PDPError(
                f"Newton did not reach gradient norm <= {tol:g} in max_iter={max_iter} "
                f"iterations: worst peer {peer} has gradient norm {grad_norm:.3e}"
            )
        iteration += 1
        hessian = hessian_at(w)
        step = -np.asarray(np.linalg.solve(hessian, gradient), dtype=np.float64)
        slope, length = float(gradient @ step), 1.0
        if remainder is not None:
            certified = _certified_norm(hessian, gradient, step, remainder(step), tol)
            if certified is not None:
                return w + length * step, certified, iteration
        while True:
            trial = w + length * step
            trial_value, trial_gradient = at(trial)
            if trial_value <= value + _ARMIJO * length * slope + _ROUNDING_SLACK * abs(value):
                break
            length *= 0.5
            if length < _MIN_STEP:
                raise P2PDPError(
                    f"line search failed at Newton iteration {iteration} for peer {peer}"
                )
        w, value, gradient = trial, trial_value, trial_gradient


def _certified_norm(
    hessian: NDArray[np.float64],
    gradient: NDArray[np.float64],
    step: NDArray[np.float64],
    bounds: tuple[float, float],
    tol: float,
) -> float | None:
    """A bound on ``||grad J(w + step)||`` if it is at most ``tol / 4`` and the Armijo test
    of :func:`newton_from_block_sums` certainly passes at ``w + step``, else None.

    ``hessian`` (d, d) and ``gradient`` (d,) are ``J``'s at ``w``, ``step`` (d,) the Newton
    step solved from them, ``bounds`` the ``remainder(step)`` of
    :func:`newton_from_block_sums`. With ``r = gradient + hessian @ step`` (0 but for the
    solve's rounding), ``grad J(w + step)`` is ``r`` plus the gradient's remainder, so its
    norm is at most ``||r|| + a``; and ``J(w + step) - J(w) <= g.s + s.H s / 2 + b =
    (g.s + s.r) / 2 + b``, at most ``g.s / 4`` (below the Armijo line ``1e-4 g.s``) when
    ``|s.r| / 2 + b <= -g.s / 4``. The margins (``tol / 4``, ``g.s / 4``) exceed the
    rounding of the sums (about ``1e-13`` relative) by orders of magnitude, so the pass at
    ``w + step`` would have accepted the step and stopped there."""
    gradient_bound, value_bound = bounds
    residual = gradient + hessian @ step
    norm = float(np.linalg.norm(residual)) + gradient_bound
    slope = float(gradient @ step)
    if norm <= tol / 4 and 0.5 * abs(float(step @ residual)) + value_bound <= -slope / 4:
        return norm
    return None
