"""What a peer sees of an iterative run, and how much a view can tell about one peer's noises.

:class:`ViewTrace` records a run's step events and exchanges as they happened (who stepped, what
arrived, what was late); :func:`full_delivery_trace` builds one without loss or churn. Given a
view's matrix ``M`` of a peer's noises (the information the view carries about them, in noise
units), :func:`worst_case_shifts` bounds the largest privacy loss over every sequence of shifts
of at most one clip norm per step (a semidefinite program with a checked dual certificate,
:func:`_certificate`); both network-DP analyses (:mod:`p2pdp.protocols.network_dp`, exact or
filtered, and :mod:`p2pdp.protocols.correlated_dp`) report through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from p2pdp.protocols.mixing import Mixing

#: Barrier rounds (each dividing the barrier weight by 10) and Newton steps per round of
#: :func:`worst_case_shifts` (both stop earlier once converged).
_BARRIER_ROUNDS = 30


_NEWTON_STEPS = 50


@dataclass(slots=True)
class ViewTrace:
    """What a synchronous run did, in order: every step's peers and every exchange's messages.

    ``events[k]`` is either a (k,) int array, the peers that took a private step, or a pair
    ``(delivered, late)`` of (E,) bool arrays over the overlay's edges (``Mixing.indices``):
    the messages averaged, and those that arrived after the exchange's deadline (read by
    their receiver, not averaged). An edge in neither was lost (never seen).
    """

    events: list[np.ndarray | tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def step(self, peers: np.ndarray) -> None:
        self.events.append(np.array(peers, dtype=np.int64))

    def exchange(self, delivered: np.ndarray, late: np.ndarray) -> None:
        self.events.append((np.array(delivered, dtype=bool), np.array(late, dtype=bool)))

    def view_entries(self) -> int:
        """The size :data:`MAX_VIEW_ENTRIES` limits (counted without building anything)."""
        noises = sum(e.size for e in self.events if isinstance(e, np.ndarray))
        received = sum(int((e[0] | e[1]).sum()) for e in self.events if isinstance(e, tuple))
        return received * noises


def full_delivery_trace(mixing: Mixing, steps: int, exchanges: int, *, after: int = 0) -> ViewTrace:
    """The trace of a run in which every peer steps ``steps`` times with ``exchanges``
    exchanges after each, every message delivered on time, then ``after`` more exchanges
    without steps (budgets spent)."""
    trace = ViewTrace()
    every = np.ones(len(mixing.indices), dtype=bool)
    for _ in range(steps):
        trace.step(np.arange(mixing.n_peers))
        for _ in range(exchanges):
            trace.exchange(every, ~every)
    for _ in range(after):
        trace.exchange(every, ~every)
    return trace


def worst_case_shifts(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``kappa = sup sum_{s,t} M_st a_s . a_t`` over vectors ``||a_t|| <= 1``, for a batch.

    A semidefinite program (the sup over Gram matrices ``G >= 0`` with ``diag G <= 1`` of
    ``tr(M G)``; attained at ``diag G = 1`` since ``M >= 0``), solved by the barrier method
    on its dual ``min sum y s.t. diag(y) - M >= 0`` (Newton steps on
    ``sum y / tau - logdet(diag y - M)``, ``tau`` divided by 10 until ``tau T < 1e-12 sum y``),
    every matrix of the batch at once.

    Parameters
    ----------
    M : (B, T, T) array of symmetric positive semidefinite matrices

    Returns
    -------
    (upper, lower), each (B,): ``upper = sum y + T lambda_max(M - diag y)``, a bound valid for
    every ``y`` (for ``diag G = 1``,
    ``tr(M G) = sum y + tr((M - diag y) G) <= sum y + T lambda_max``), capped by
    ``sum |M_st|`` and ``T lambda_max(M)``; ``lower = tr(M G)`` at
    the primal point ``G`` of the central path (``tau (diag y - M)^-1`` scaled to a unit
    diagonal), or at ``G = I`` or ``G = s s^T`` (``s`` the signs of the top eigenvector),
    attained by unit vectors ``a_t``. For ``T <= 2`` both are the closed form
    ``M_11 + M_22 + 2 |M_12|`` (``max(M_11, 0)`` for ``T = 1``).
    """
    T = M.shape[-1]
    if T <= 2:
        value = np.maximum(np.trace(M, axis1=1, axis2=2), 0.0)
        if T == 2:
            value = value + 2.0 * np.abs(M[:, 0, 1])
        return value, value.copy()
    values, vectors = np.linalg.eigh(M)
    top = np.maximum(values[:, -1], 0.0)
    cap = np.minimum(np.abs(M).sum(axis=(1, 2)), T * top)
    sign = np.where(vectors[:, :, -1] >= 0, 1.0, -1.0)
    lower = np.maximum(np.trace(M, axis1=1, axis2=2), np.einsum("bi,bij,bj->b", sign, M, sign))
    upper = np.maximum(cap, lower)
    hard = np.flatnonzero((cap - lower > 1e-12 * cap) & (top > 0))
    if not hard.size:
        return upper, lower
    M_hard, eye = M[hard], np.eye(T)
    y = np.repeat(2.0 * top[hard, None], T, axis=1)
    tau = top[hard].copy()
    for _ in range(_BARRIER_ROUNDS):
        for _ in range(_NEWTON_STEPS):  # Newton on sum(y) / tau - logdet(diag y - M)
            inverse = np.linalg.inv(y[:, :, None] * eye - M_hard)
            gradient = 1.0 / tau[:, None] - np.diagonal(inverse, axis1=1, axis2=2)
            step = np.linalg.solve(inverse**2, -gradient[:, :, None])[:, :, 0]
            decrement = -np.einsum("bi,bi->b", gradient, step)  # squared Newton decrement
            if decrement.max() < 1e-12:
                break
            length = np.where(decrement < 1e-12, 0.0, 1.0)
            for _ in range(40):  # halve each step until diag y - M stays positive definite
                trial = (y + length[:, None] * step)[:, :, None] * eye - M_hard
                bad = np.linalg.eigvalsh(trial)[:, 0] <= 0
                if not bad.any():
                    break
                length[bad] /= 2.0
            y = y + length[:, None] * step
        if (tau * T < 1e-12 * y.sum(axis=1)).all():
            break
        tau /= 10.0
    G = tau[:, None, None] * np.linalg.inv(y[:, :, None] * eye - M_hard)
    scale = 1.0 / np.sqrt(np.diagonal(G, axis1=1, axis2=2))
    G = G * scale[:, :, None] * scale[:, None, :]
    lower[hard] = np.maximum(lower[hard], np.einsum("bij,bij->b", M_hard, G))
    certificate = y.sum(axis=1) + T * np.linalg.eigvalsh(M_hard - y[:, :, None] * eye)[:, -1]
    upper[hard] = np.maximum(np.minimum(certificate, cap[hard]), lower[hard])
    return upper, lower


def _margin(kappa: np.ndarray) -> np.ndarray:
    """``kappa`` raised by ``1e-9`` relative plus ``1e-12``: above the rounding of the filter's
    arithmetic (the tests find it within ~1e-14 of the exact values where both are exact)."""
    return kappa * (1.0 + 1e-9) + 1e-12


def _certificate(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cheap upper values of ``kappa(M)`` for a batch (B, T, T) of PSD matrices: ``sum |M|``,
    and ``T lambda_max`` for ``T <= 30`` (valid for every ``M``, see
    :func:`worst_case_shifts`); and the indices where they exceed the trace (a lower value)
    by over 2% with ``T <= 12``, for the semidefinite program (beyond, its batched barrier
    costs more than the rest of the bound: 100 peers, 20 steps of one exchange, ~50 s)."""
    T = M.shape[-1]
    upper = np.abs(M).sum(axis=(1, 2))
    none = np.zeros(0, dtype=np.int64)
    if T > 30:
        return upper, none
    upper = np.minimum(upper, T * np.maximum(np.linalg.eigvalsh(M)[:, -1], 0.0))
    if T > 12:
        return upper, none
    return upper, np.flatnonzero(upper - np.trace(M, axis1=1, axis2=2) > 2e-2 * upper)


def _row_space(A: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the row space of ``A`` (rows), numerical rank as numpy's.

    A direction whose singular value is below ``max(A.shape) eps s_max`` is taken as unseen:
    at that level floating point cannot tell it from zero (the tests' brute force decides the
    rank of the covariance independently)."""
    if A.size == 0:
        return np.zeros((0, A.shape[1]))
    _, singular, Vt = np.linalg.svd(A, full_matrices=False)
    tolerance = singular.max(initial=0.0) * max(A.shape) * np.finfo(float).eps
    return Vt[singular > tolerance]
