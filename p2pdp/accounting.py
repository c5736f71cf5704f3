"""Per-peer privacy budgets and composition (the seed's Algorithm 2).

Every peer starts with ``epsilon_total`` (and ``delta_total``); every group aggregation it
joins releases one noisy model computed from its shard, at ``(epsilon_per_aggregation,
delta_per_aggregation)`` for a change of one record of its shard. A peer that cannot afford one
more aggregation leaves the candidate set. The ledger counts aggregations per peer (integers,
so no floating-point drift from repeated subtraction) and the accountant turns a count ``k``
into the epsilon spent, at ``delta_total``:

``basic``
    Sequential composition: ``k * epsilon_per_aggregation`` (and ``k * delta_per_aggregation``
    must stay <= ``delta_total``). Any mechanism. ``floor(epsilon / epsilon_A)`` aggregations.
``rdp``
    Gaussian mechanism only. The noise multiplier ``z = sigma / Delta_2`` is the analytic
    calibration at ``(epsilon_A, delta_A)``; ``k`` releases are ``(alpha, k alpha / (2 z^2))``-RDP
    for every order ``alpha > 1``, converted to ``(epsilon, delta_total)`` with the bound of
    Canonne, Kamath & Steinke 2020 / Balle et al. 2020,
    ``eps = rdp + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1)``, minimised over a
    grid of orders; the basic bound is used where it is smaller (both are valid, so the
    minimum is). Affords more aggregations than ``basic`` for typical settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from p2pdp.errors import BudgetExhaustedError, ConfigError
from p2pdp.mechanisms import (
    analytic_gaussian_sigma,
    require_count,
    require_positive,
    require_probability,
)

ACCOUNTANTS: tuple[str, ...] = ("basic", "rdp")

#: Relative tolerance when comparing spent to total epsilon (and delta), so that float error
#: in e.g. ``3 * 0.1 = 0.30000000000000004`` does not cost a peer an aggregation.
BUDGET_TOLERANCE = 1e-9

#: Renyi orders ``alpha`` (all > 1) over which the RDP conversion is minimised.
RDP_ORDERS: np.ndarray = 1.0 + np.geomspace(1e-3, 1e6, 2000)

#: (epsilon_total, epsilon_per_aggregation, delta_total, delta_per_aggregation) rows of the
#: README budget table; ``delta_per_aggregation = delta_total / floor(eps/eps_A)`` so that the
#: delta budget does not bind under basic composition.
BUDGET_TABLE_SETTINGS: tuple[tuple[float, float, float, float], ...] = (
    (0.5, 0.1, 1e-5, 2e-6),
    (1.0, 0.1, 1e-5, 1e-6),
    (1.0, 0.2, 1e-5, 2e-6),
    (1.0, 0.5, 1e-5, 5e-6),
    (2.0, 0.2, 1e-5, 1e-6),
    (10.0, 1.0, 1e-5, 1e-6),
)


def _validate_step(
    epsilon_per_aggregation: float,
    delta_total: float,
    delta_per_aggregation: float,
    accountant: str,
) -> tuple[float, float, float]:
    """Validated ``(epsilon_A, delta_total, delta_A)`` as floats."""
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    eps_step = require_positive("epsilon_per_aggregation", epsilon_per_aggregation)
    delta_total = require_probability("delta_total", delta_total, high_open=True)
    delta_step = require_probability("delta_per_aggregation", delta_per_aggregation, high_open=True)
    if delta_step > delta_total:
        raise ConfigError(
            f"delta_per_aggregation must be <= delta_total ({delta_total!r}), got {delta_step!r}"
        )
    if accountant == "rdp" and delta_step == 0:
        raise ConfigError(
            "accountant 'rdp' is for the gaussian mechanism and needs delta_per_aggregation "
            f"in (0, 1), got {delta_per_aggregation!r}"
        )
    return eps_step, delta_total, delta_step


def composed_epsilon(
    n_aggregations: int | np.ndarray,
    *,
    epsilon_per_aggregation: float,
    delta_total: float = 0.0,
    delta_per_aggregation: float = 0.0,
    accountant: str = "basic",
) -> np.ndarray:
    """Epsilon spent, at ``delta_total``, after ``n_aggregations`` releases of one peer.

    Parameters
    ----------
    n_aggregations : int or ndarray of int, any shape
        Number of aggregations joined, >= 0.
    epsilon_per_aggregation, delta_per_aggregation : float
        Guarantee of one release (for ``rdp``: the Gaussian mechanism's calibration).
    delta_total : float
        Delta at which the composition is stated.
    accountant : {"basic", "rdp"}

    Returns
    -------
    ndarray of float, same shape as ``n_aggregations``
        ``inf`` where no epsilon is valid at ``delta_total`` (basic: ``k * delta_A >
        delta_total``); 0 where ``k = 0``.
    """
    eps_step, delta_total, delta_step = _validate_step(
        epsilon_per_aggregation, delta_total, delta_per_aggregation, accountant
    )
    counts = np.asarray(n_aggregations)
    if counts.size and not (np.issubdtype(counts.dtype, np.integer) and counts.min() >= 0):
        raise ConfigError(f"n_aggregations must be integers >= 0, got {n_aggregations!r}")
    unique, inverse = np.unique(counts, return_inverse=True)
    steps = unique.astype(float)
    within_delta = steps * delta_step <= delta_total * (1 + BUDGET_TOLERANCE)
    spent = np.where(within_delta, steps * eps_step, math.inf)
    if accountant == "rdp":
        z = analytic_gaussian_sigma(eps_step, delta_step, 1.0)
        alpha = RDP_ORDERS
        conversion = np.log1p(-1.0 / alpha) - (math.log(delta_total) + np.log(alpha)) / (alpha - 1)
        rdp = steps[:, None] * alpha / (2.0 * z**2) + conversion
        spent = np.minimum(spent, np.maximum(rdp.min(axis=1), 0.0))
    spent = np.where(unique == 0, 0.0, spent)
    return spent[inverse].reshape(counts.shape)


def affordable_aggregations(
    epsilon_total: float,
    epsilon_per_aggregation: float,
    delta_total: float = 0.0,
    delta_per_aggregation: float = 0.0,
    accountant: str = "basic",
) -> int:
    """Largest number of aggregations a peer can join within its budget.

    The largest ``k`` with :func:`composed_epsilon` ``(k) <= epsilon_total`` (up to the relative
    :data:`BUDGET_TOLERANCE`), e.g. ``basic`` with ``(1.0, 0.1)`` gives 10. Found by doubling and
    bisection on ``k``; the composed epsilon increases with ``k``.
    """
    eps_step, delta_total, delta_step = _validate_step(
        epsilon_per_aggregation, delta_total, delta_per_aggregation, accountant
    )
    eps_total = require_positive("epsilon_total", epsilon_total)
    if eps_step > eps_total * (1 + BUDGET_TOLERANCE):
        raise ConfigError(
            f"epsilon_per_aggregation must be <= epsilon_total ({eps_total!r}), got {eps_step!r}"
        )
    limit = eps_total * (1 + BUDGET_TOLERANCE)

    def affordable(k: int) -> bool:
        spent = composed_epsilon(
            k,
            epsilon_per_aggregation=eps_step,
            delta_total=delta_total,
            delta_per_aggregation=delta_step,
            accountant=accountant,
        )
        return bool(spent <= limit)

    low, high = 1, 2  # affordable(1) holds: eps_step <= eps_total and delta_step <= delta_total
    while affordable(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if affordable(middle) else (low, middle)
    return low


def budget_table(
    settings: Sequence[tuple[float, float, float, float]] = BUDGET_TABLE_SETTINGS,
) -> list[dict[str, float | int]]:
    """Affordable aggregations per peer under ``basic`` and ``rdp`` for the Gaussian mechanism.

    Parameters
    ----------
    settings : sequence of (epsilon_total, epsilon_per_aggregation, delta_total,
        delta_per_aggregation)

    Returns
    -------
    list of dict
        One row per setting with those four keys plus ``basic`` and ``rdp`` (int counts).
    """
    rows = []
    for eps_total, eps_step, delta_total, delta_step in settings:
        row: dict[str, float | int] = {
            "epsilon_total": eps_total,
            "epsilon_per_aggregation": eps_step,
            "delta_total": delta_total,
            "delta_per_aggregation": delta_step,
        }
        for accountant in ACCOUNTANTS:
            row[accountant] = affordable_aggregations(
                eps_total, eps_step, delta_total, delta_step, accountant
            )
        rows.append(row)
    return rows


def format_budget_table(rows: Sequence[dict[str, float | int]]) -> str:
    """Markdown table of :func:`budget_table` rows (for the README)."""
    lines = [
        "| epsilon | epsilon_A | delta | delta_A | basic | rdp |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['epsilon_total']:g} | {row['epsilon_per_aggregation']:g} "
            f"| {row['delta_total']:g} | {row['delta_per_aggregation']:g} "
            f"| {row['basic']} | {row['rdp']} |"
        )
    return "\n".join(lines)


class BudgetLedger:
    """Vectorised per-peer budget ledger for ``n_peers`` peers (tested up to 100,000).

    Holds one integer count of aggregations joined per peer. Use it as the seed's Algorithm 2:
    :meth:`check` the group before any noise is drawn, :meth:`spend` once the noisy model is
    released. :meth:`spend` is all-or-nothing: it raises and changes nothing if any peer would
    overspend, so a fault cannot make a peer pay twice or not at all.

    Parameters
    ----------
    n_peers : int
        Number of peers ``P >= 1``; peers are identified by 0..P-1.
    epsilon_total, delta_total : float
        Budget of each peer (``epsilon_total > 0``; ``delta_total`` in [0, 1)).
    epsilon_per_aggregation, delta_per_aggregation : float
        Cost of one aggregation (``0 < epsilon_A <= epsilon_total``; ``delta_A <= delta_total``).
    accountant : {"basic", "rdp"}
        See the module docstring; ``rdp`` only for the Gaussian mechanism.

    Attributes
    ----------
    max_aggregations : int
        Aggregations every peer can afford (:func:`affordable_aggregations`).
    """

    def __init__(
        self,
        n_peers: int,
        *,
        epsilon_total: float,
        epsilon_per_aggregation: float,
        delta_total: float = 0.0,
        delta_per_aggregation: float = 0.0,
        accountant: str = "basic",
    ) -> None:
        self.n_peers = require_count("n_peers", n_peers)
        self.epsilon_total = epsilon_total
        self.epsilon_per_aggregation = epsilon_per_aggregation
        self.delta_total = delta_total
        self.delta_per_aggregation = delta_per_aggregation
        self.accountant = accountant
        self.max_aggregations = affordable_aggregations(
            epsilon_total, epsilon_per_aggregation, delta_total, delta_per_aggregation, accountant
        )
        self._counts = np.zeros(self.n_peers, dtype=np.int64)

    def _peer_ids(self, peers: np.ndarray | Sequence[int]) -> np.ndarray:
        ids = np.asarray(peers)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ConfigError(f"peers must be a 1-D sequence of integer ids, got {peers!r}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_peers):
            raise ConfigError(f"peers must be ids in [0, {self.n_peers}), got {peers!r}")
        return ids

    def can_afford(self, peers: np.ndarray | Sequence[int]) -> np.ndarray:
        """Bool per peer (shape (len(peers),)): can it afford one more aggregation?"""
        return self._counts[self._peer_ids(peers)] < self.max_aggregations

    def check(self, peers: np.ndarray | Sequence[int]) -> None:
        """Raise BudgetExhaustedError naming the peers that cannot afford one more aggregation."""
        self._refuse_broke(self._peer_ids(peers))

    def _refuse_broke(self, ids: np.ndarray) -> None:
        broke = ids[self._counts[ids] >= self.max_aggregations]
        if broke.size:
            raise BudgetExhaustedError(
                f"peers {broke.tolist()} have used all {self.max_aggregations} aggregations of "
                f"epsilon_total={self.epsilon_total} ({self.accountant} accountant)"
            )

    def spend(self, peers: np.ndarray | Sequence[int]) -> None:
        """Record one aggregation for each of ``peers`` (distinct ids); all or nothing."""
        ids = self._peer_ids(peers)
        if ids.size > 1 and np.unique(ids).size != ids.size:
            raise ConfigError(f"peers must be distinct ids, got {peers!r}")
        self._refuse_broke(ids)
        self._counts[ids] += 1

    def spent_epsilon(self) -> np.ndarray:
        """Epsilon spent by each peer under the ledger's accountant, shape (P,)."""
        return composed_epsilon(
            self._counts,
            epsilon_per_aggregation=self.epsilon_per_aggregation,
            delta_total=self.delta_total,
            delta_per_aggregation=self.delta_per_aggregation,
            accountant=self.accountant,
        )

    def aggregations(self) -> np.ndarray:
        """Number of aggregations each peer joined, shape (P,) (a copy)."""
        return self._counts.copy()

    def active_mask(self) -> np.ndarray:
        """Bool mask of peers that can still afford one more aggregation, shape (P,)."""
        return self._counts < self.max_aggregations
