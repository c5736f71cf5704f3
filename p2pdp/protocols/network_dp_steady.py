"""The settled path of the filtered network-DP bound: periodic runs whose later rounds are copies.

A run whose rounds are all alike (every peer steps, then the same exchanges with the same
messages seen) lets :func:`p2pdp.protocols.network_dp_filter.filtered_coefficients` stop
filtering once the views' covariances settle: :class:`_Steady` gives the larger view whose
later rounds are exact copies of the settled one, and the proof that a bound on it is a bound
on the run's view.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import numpy as np

from p2pdp.protocols.views import ViewTrace

#: The views' covariances count as settled (:class:`_Steady`) once no model's variance given
#: any view of the batch moved by more than this fraction of the largest in a round.
STEADY = 1e-5


#: Directions of ``Sigma - Sigma*`` (:class:`_Steady`, :func:`_factor`) below this fraction
#: of the largest variance are the rounding of the covariances (the real ones have one to a
#: few directions above it, the rest at 1e-18 to 1e-14 by an eigendecomposition): not read,
#: as the filter's whitening ignores readings below 1e-10 of it.
_ROUNDING = 1e-12


Event = np.ndarray | tuple[np.ndarray, np.ndarray]


def _periodic(trace: ViewTrace, n: int) -> tuple[list[Event], int, list[Event]] | None:
    """``(round, rounds, tail)`` when ``trace`` is ``rounds`` copies of one round (every peer
    steps, then the same exchanges with the same messages seen) followed by exchanges
    without steps (``tail``); ``None`` otherwise."""
    events = trace.events
    starts = [i for i, e in enumerate(events) if isinstance(e, np.ndarray)]
    if len(starts) < 2 or starts[0] != 0:
        return None
    length = starts[1]  # a round's events: its step and its exchanges
    first = events[:length]

    def same(a: Event, b: Event) -> bool:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
        return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])

    rounds = len(starts)
    if not np.array_equal(cast(np.ndarray, first[0]), np.arange(n)):
        return None
    for r in range(1, rounds):
        alike = events[r * length : (r + 1) * length]
        if len(alike) < length or not all(map(same, first, alike)):
            return None
    return first, rounds, events[rounds * length :]


class _NotSteady(Exception):
    """A view's covariance fell below the settled one: not a periodic run after all."""


@dataclass
class _Steady:
    """The rounds of a periodic run that :func:`filtered_coefficients` filters, and the
    readings of a larger view that make its rounds copies of each other.

    **Why the covariance settles from below.** Let ``Sigma_s`` be the covariance of the models
    right after the ``s``-th step event (its noise injected) given what view ``v`` read
    before. One round maps it to the next through the same map ``Phi`` every round (the run is
    periodic): the exchanges' exact readings (the posterior covariance ``Sigma - Sigma H^T
    (H Sigma H^T)^+ H Sigma`` is the error of the best linear estimate, so ``Sigma <= Sigma'``
    gives a smaller posterior: the best gain for ``Sigma'`` does at least as well on
    ``Sigma``), the averaging (``W Sigma W^T``), the decay and the fresh noise ``Q`` are each
    monotone in the Loewner order. ``Sigma_0 = Q`` (the models are known before the first
    step) and ``Sigma_1 = Phi(Sigma_0) >= Q = Sigma_0``, so ``Sigma_{s+1} >= Sigma_s`` for
    every ``s`` (induction with ``Phi`` monotone).

    **The larger view.** Once the views' variances stop moving (:data:`STEADY`) at step ``s0``,
    ``Sigma* = Sigma_{s0}`` is kept (on the peers but ``v``; ``v`` knows its own model). After
    every later step event, once the retiring noises are bounded, the view is given one more
    reading, ``y = G^T Sigma^-1 x + w``, ``G G^T = Sigma - Sigma*`` (``>= 0``: ``Sigma =
    Phi(Sigma*) = Sigma_{s0 + 1} >= Sigma*``) and ``w ~ N(0, I - G^T Sigma^-1 G)`` independent
    of everything (``>= 0`` as ``Sigma* >= 0``): its innovation is already white, its gains are
    ``G``, its responses to the window's noises ``G^T Sigma^-1 E``, and it leaves the covariance
    at ``Sigma*`` (directions of ``Sigma - Sigma*`` below :data:`_ROUNDING` are the covariances'
    rounding and are not read). A view with more readings tells at least as much (the real view
    is a function of it), so a bound on it is a bound; the retired noises' remainders stay valid
    (the reading is a function of the models after the step and of ``w``). In that view every
    round after ``s0`` starts from ``Sigma*``, has the same events and ends in the same reset,
    and the filter's values of a step (its window's information, its remainder) depend only on
    the rounds from its own on: every step after ``s0`` whose window the run does not cut has
    the same values, and the last ``window`` steps those of the last steps of any such run. So
    the filter runs ``s0 + window + 2`` rounds and the tail, and step ``s0 + 1``'s values stand
    for the steps up to ``T - window`` (:meth:`copies`; not ``s0``'s, whose noise was not
    followed by a reset). A reset whose ``Sigma - Sigma*`` is not positive semidefinite (beyond
    rounding) raises :class:`_NotSteady` and every round is filtered.
    """

    round_events: list[Event]
    rounds: int
    tail: list[Event]
    window: int
    start: int | None = None
    steps: int = 0
    ran: int = 0
    previous: np.ndarray | None = None
    target: np.ndarray | None = None

    def events(self) -> Iterator[Event]:
        """The run's events: its rounds until ``window + 1`` rounds after the settled one,
        then the tail (:attr:`ran`: the rounds given)."""
        r = 0
        while r < self.rounds and (self.start is None or r <= self.start + self.window + 1):
            yield from self.round_events
            r += 1
        self.ran = r
        yield from self.tail

    def step(
        self,
        base: np.ndarray,
        F: np.ndarray,
        R: np.ndarray,
        variances: np.ndarray,
        others: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """At the end of a step event (after the retirement and the new slot): ``None``, or
        the reset's ``(Sigma, G)`` on the peers but ``v`` ((B, P - 1, P - 1), (B, P - 1, r))."""
        s, self.steps = self.steps, self.steps + 1
        if self.start is None:
            previous, self.previous = self.previous, variances
            if previous is None or s + self.window + 2 >= self.rounds:
                return None
            if np.abs(variances - previous).max() > STEADY * variances.max():
                return None
            self.start, self.target = s, _inner(_covariance(base, F, R), others)
            return None
        assert self.target is not None
        covariance = _inner(_covariance(base, F, R), others)
        scale = np.diagonal(covariance, axis1=1, axis2=2).max(axis=1)
        return covariance, _factor(covariance - self.target, scale)

    def copies(self) -> np.ndarray:
        """(T,): the filtered step whose values each of the run's ``T`` steps takes."""
        assert self.start is not None
        full, cut = np.arange(self.rounds), self.rounds - self.window
        first = self.start + 1  # the first step injected before a reset
        return np.where(
            full <= first, full, np.where(full < cut, first, full - (self.rounds - self.ran))
        )


def _factor(delta: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``G`` (B, m, r) with ``G G^T = delta`` for a batch (B, m, m) of positive semidefinite
    matrices, up to what :data:`_ROUNDING` of ``scale`` (B,) leaves: a Cholesky factorisation
    with diagonal pivoting, stopped once no diagonal of the rest exceeds it (``m^2`` a column;
    the settled resets have one to a few). Raises :class:`_NotSteady` where ``delta`` is not
    ``>= -1e-9 scale I`` (its Cholesky factorisation with that added fails)."""
    B, m, _ = delta.shape
    try:
        np.linalg.cholesky(delta + (1e-9 * scale)[:, None, None] * np.eye(m))
    except np.linalg.LinAlgError:
        raise _NotSteady from None
    rest, rows, columns = delta.copy(), np.arange(B), []
    for _ in range(m):
        diagonal = np.diagonal(rest, axis1=1, axis2=2)
        pivot = diagonal.argmax(axis=1)
        top = diagonal[rows, pivot]
        if not (top > _ROUNDING * scale).any():
            break
        column = (
            rest[rows, :, pivot] / np.sqrt(np.where(top > _ROUNDING * scale, top, np.inf))[:, None]
        )
        rest -= column[:, :, None] * column[:, None, :]
        columns.append(column)
    return np.stack(columns, axis=2) if columns else np.zeros((B, m, 0))


def _inner(covariance: np.ndarray, others: np.ndarray) -> np.ndarray:
    """The (B, P - 1, P - 1) blocks of a batch of (B, P, P) matrices on ``others``' rows and
    columns."""
    b = np.arange(others.shape[0])[:, None, None]
    return covariance[b, others[:, :, None], others[:, None, :]]


def _covariance(base: np.ndarray, F: np.ndarray, R: np.ndarray) -> np.ndarray:
    """The views' covariances ``base - F F^T - R R^T`` (B, P, P) (see
    :func:`filtered_coefficients`)."""
    return base[None] - F @ F.transpose(0, 2, 1) - R @ R.transpose(0, 2, 1)
