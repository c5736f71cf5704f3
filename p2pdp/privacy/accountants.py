"""The accountant protocol and the accountants of Gaussian releases: basic, RDP and GDP.

An accountant turns ``k`` releases of one :class:`~p2pdp.privacy.events.PrivacyEvent` (a peer's
aggregations, each at ``(epsilon_A, delta_A)`` for a change of one record of its shard, or one
step of an iterative protocol under the event's relation) into the epsilon spent at the peer's
``delta_total``. Every accountant states a valid upper bound, increasing with ``k``; the budget
ledger that asks them is :mod:`p2pdp.privacy.accounting`.

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
``gdp``
    Gaussian mechanism only, exact: ``k`` releases at noise multiplier ``z`` are
    ``sqrt(k)/z``-GDP (Dong, Roth & Su 2019), converted to ``(epsilon, delta_total)`` through
    the Gaussian's tight privacy profile (:mod:`p2pdp.privacy.gdp`). No valid accountant can state a
    smaller epsilon for these releases, so it affords the most aggregations (README's table:
    80 -> 94 against ``rdp``). The default for ``gaussian`` (``privacy.accountant = "auto"``).

The ``pld`` accountant, which composes every event kind, is :mod:`p2pdp.privacy.pld`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from p2pdp.core.boundary import calling, check_numbers, check_type, problem
from p2pdp.core.errors import ConfigError
from p2pdp.privacy.events import ADD_REMOVE, GaussianEvent, PrivacyEvent, SubsampledGaussianEvent
from p2pdp.privacy.tolerance import BUDGET_TOLERANCE

#: Renyi orders ``alpha`` (all > 1) over which the RDP conversion is minimised.
RDP_ORDERS: np.ndarray = 1.0 + np.geomspace(1e-3, 1e6, 2000)

#: Integer Renyi orders of the Poisson-subsampled Gaussian (its RDP is exact at integer orders).
INTEGER_RDP_ORDERS: np.ndarray = np.concatenate([np.arange(2, 257), [320, 384, 512, 768, 1024]])


def _counts(n_aggregations: int | np.ndarray) -> np.ndarray:
    counts = np.asarray(n_aggregations)
    if counts.size and not (np.issubdtype(counts.dtype, np.integer) and counts.min() >= 0):
        raise ConfigError(f"n_aggregations must be integers >= 0, got {n_aggregations!r}")
    return counts


# --- accountants ----------------------------------------------------------------------------------
class Accountant(ABC):
    """How a peer's releases compose into the ``(epsilon, delta)`` it has spent.

    Protocol of the ``accountant`` component kind (``privacy.accountant``). An accountant is
    stateless: the :class:`~p2pdp.privacy.accounting.BudgetLedger` counts releases per peer
    (every release of a run is the same :class:`~p2pdp.privacy.events.PrivacyEvent`, declared
    by the run's mechanism) and asks the accountant for the epsilon that ``k`` such releases
    cost at the peer's ``delta_total``.

    Implement :meth:`supports` and :meth:`composed_epsilon`; the epsilon must be a valid
    upper bound (an accountant may only err towards spending more) and increase with ``k``.
    """

    name: ClassVar[str]

    @abstractmethod
    def supports(self, event: PrivacyEvent) -> bool:
        """Whether this accountant can compose ``event``."""

    @abstractmethod
    def composed_epsilon(
        self, event: PrivacyEvent, counts: np.ndarray, *, delta_total: float
    ) -> np.ndarray:
        """Epsilon at ``delta_total`` after ``counts`` releases of ``event`` (any int shape).

        Returns floats of the same shape: 0 where the count is 0, ``inf`` where no epsilon
        is valid at ``delta_total``.
        """

    def check(self, event: PrivacyEvent) -> None:
        """ConfigError unless :meth:`supports` ``event``."""
        if event.private and not supports(self, event):
            raise ConfigError(
                f"privacy.accountant = {self.name!r} cannot compose {type(event).__name__} "
                f"releases; got {event!r}"
            )


class BasicAccountant(Accountant):
    """Sequential composition: ``k`` releases of an ``(eps, delta)`` event cost ``k`` times that.

    Composes every private event through its ``(epsilon, delta)`` guarantee; ``inf`` once
    ``k delta`` exceeds ``delta_total``.
    """

    name: ClassVar[str] = "basic"

    def supports(self, event: PrivacyEvent) -> bool:
        return True

    def composed_epsilon(self, event, counts, *, delta_total):
        counts = _counts(counts)
        if not event.private:
            return np.where(counts == 0, 0.0, math.inf)
        eps_step, delta_step = event.epsilon_delta()
        unique, inverse = np.unique(counts, return_inverse=True)
        steps = unique.astype(float)
        within_delta = steps * delta_step <= delta_total * (1 + BUDGET_TOLERANCE)
        with np.errstate(invalid="ignore"):  # 0 * inf, for 0 releases: set to 0 below
            spent = np.where(within_delta, steps * eps_step, math.inf)
        spent = np.where(unique == 0, 0.0, spent)
        return spent[inverse].reshape(counts.shape)


class _GaussianAccountant(BasicAccountant):
    """Composes Gaussian releases from their noise multiplier (``GaussianEvent`` only).

    Subclasses give :meth:`_gaussian_epsilon`; the basic bound is kept where it is smaller
    (both are valid, so the minimum is).
    """

    def supports(self, event: PrivacyEvent) -> bool:
        return isinstance(event, GaussianEvent)

    def composed_epsilon(self, event, counts, *, delta_total):
        counts = _counts(counts)
        basic = super().composed_epsilon(event, counts, delta_total=delta_total)
        if not event.private:
            return basic
        self.check(event)
        unique, inverse = np.unique(counts, return_inverse=True)
        spent = self._gaussian_epsilon(unique, event.noise_multiplier, delta_total)
        spent = np.where(unique == 0, 0.0, spent)[inverse].reshape(counts.shape)
        return np.minimum(basic, spent)

    def _gaussian_epsilon(
        self, counts: np.ndarray, noise_multiplier: float, delta_total: float
    ) -> np.ndarray:
        """Epsilon of ``counts`` (distinct, 1-D) releases at ``delta_total``."""
        raise NotImplementedError


class RdpAccountant(_GaussianAccountant):
    """Renyi DP of the Gaussian mechanism, converted to ``(epsilon, delta_total)``.

    ``k`` Gaussian releases with noise multiplier ``z`` (read from the
    :class:`~p2pdp.privacy.events.GaussianEvent`) are ``(alpha, k alpha / (2 z^2))``-RDP for every
    order ``alpha > 1``, converted with ``eps = rdp + log((alpha-1)/alpha) - (log delta +
    log alpha)/(alpha-1)`` (Canonne, Kamath & Steinke 2020; Balle et al. 2020) minimised over
    :data:`RDP_ORDERS`; the basic bound is used where it is smaller (both are valid).
    Also composes :class:`~p2pdp.privacy.events.SubsampledGaussianEvent` (Poisson sampling,
    add/remove one record) through :func:`subsampled_gaussian_rdp` at
    :data:`INTEGER_RDP_ORDERS`, with the same conversion.
    """

    name: ClassVar[str] = "rdp"

    def supports(self, event: PrivacyEvent) -> bool:
        if isinstance(event, SubsampledGaussianEvent):
            return event.relation == ADD_REMOVE  # the RDP bound used is for add/remove only
        return isinstance(event, GaussianEvent)

    def composed_epsilon(self, event, counts, *, delta_total):
        if not isinstance(event, SubsampledGaussianEvent):
            return super().composed_epsilon(event, counts, delta_total=delta_total)
        self.check(event)
        counts = _counts(counts)
        unique, inverse = np.unique(counts, return_inverse=True)
        alpha = INTEGER_RDP_ORDERS.astype(float)
        one = subsampled_gaussian_rdp(event.sampling_rate, event.noise_multiplier, alpha)
        spent = _rdp_to_epsilon(unique.astype(float)[:, None] * one, alpha, delta_total)
        return np.where(unique == 0, 0.0, spent)[inverse].reshape(counts.shape)

    def _gaussian_epsilon(self, counts, noise_multiplier, delta_total):
        alpha = RDP_ORDERS
        rdp = counts.astype(float)[:, None] * alpha / (2.0 * noise_multiplier**2)
        return _rdp_to_epsilon(rdp, alpha, delta_total)


def _rdp_to_epsilon(rdp: np.ndarray, alpha: np.ndarray, delta_total: float) -> np.ndarray:
    """``min over alpha of rdp + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1)``.

    ``rdp``: (n, len(alpha)) Renyi divergences; returns (n,) epsilons >= 0.
    """
    conversion = np.log1p(-1.0 / alpha) - (math.log(delta_total) + np.log(alpha)) / (alpha - 1)
    return np.maximum((rdp + conversion).min(axis=1), 0.0)


def subsampled_gaussian_rdp(
    sampling_rate: float, noise_multiplier: float, orders: np.ndarray
) -> np.ndarray:
    """RDP of one Poisson-subsampled Gaussian release at integer ``orders``, add/remove one.

    ``eps(alpha) = log A_alpha / (alpha - 1)`` with ``A_alpha = sum_k C(alpha, k) (1-q)^(alpha-k)
    q^k exp((k^2 - k) / (2 z^2))`` (Mironov, Talwar & Zhang 2019, Theorem 5: exact for integer
    ``alpha``; the mixture-over-base direction dominates). ``q = 1`` gives ``alpha / (2 z^2)``.

    Parameters
    ----------
    sampling_rate : float in (0, 1]
    noise_multiplier : float > 0
        Noise standard deviation over the clipping norm.
    orders : (m,) array of integers >= 2

    Returns
    -------
    (m,) array of Renyi divergences (nats).
    """
    from scipy.special import gammaln, logsumexp

    q, z = float(sampling_rate), float(noise_multiplier)
    alpha = np.asarray(orders, dtype=np.int64).astype(float)[:, None]
    if q == 1.0:
        return alpha[:, 0] / (2 * z**2)
    k = np.arange(alpha.max() + 1)[None, :]  # every order's terms at once, k > alpha masked
    inside = k <= alpha
    log_binom = gammaln(alpha + 1) - gammaln(k + 1) - gammaln(np.where(inside, alpha - k, 0) + 1)
    terms = log_binom + k * math.log(q) + (alpha - k) * math.log1p(-q) + (k * k - k) / (2 * z * z)
    return logsumexp(np.where(inside, terms, -np.inf), axis=1) / (alpha[:, 0] - 1)


class GdpAccountant(_GaussianAccountant):
    """Exact composition of Gaussian releases (Gaussian differential privacy).

    ``k`` releases with noise multiplier ``z`` (read from the
    :class:`~p2pdp.privacy.events.GaussianEvent`: ``sigma = z * Delta_2`` of the release, for one
    record of the peer's shard replaced) are exactly ``sqrt(k)/z``-GDP (Dong, Roth & Su
    2019, Corollary 3.3); the epsilon at ``delta_total`` is the smallest one that GDP curve
    allows (:func:`p2pdp.privacy.gdp.composed_epsilon_gdp`). Tight: no accountant can state less for
    these releases. Refuses every other event (:meth:`supports`). The basic bound is kept
    where it is smaller (it never is, up to rounding; both are valid).
    """

    name: ClassVar[str] = "gdp"

    def _gaussian_epsilon(self, counts, noise_multiplier, delta_total):
        from p2pdp.privacy.gdp import composed_epsilon_gdp

        return composed_epsilon_gdp(
            counts, noise_multiplier=noise_multiplier, delta_total=delta_total
        )


#: What the engine calls on an accountant (:class:`Accountant` provides them all).
ACCOUNTANT_METHODS = ("supports", "composed_epsilon", "check")


def supports(accountant: Accountant, event: PrivacyEvent) -> bool:
    """``accountant.supports(event)``, checked to be a bool."""
    with calling("accountant", accountant, "supports"):
        answer = accountant.supports(event)
    return bool(check_type(answer, (bool, np.bool_), "accountant", accountant, "supports"))


def composed(
    accountant: Accountant, event: PrivacyEvent, counts: np.ndarray, *, delta_total: float
) -> np.ndarray:
    """``accountant.composed_epsilon``, checked: numbers >= 0 (inf allowed) shaped as ``counts``."""
    with calling("accountant", accountant, "composed_epsilon"):
        epsilon = accountant.composed_epsilon(event, counts, delta_total=delta_total)
    epsilon = check_numbers(
        epsilon, "accountant", accountant, "composed_epsilon", shape=np.shape(counts), finite=False
    )
    if np.isnan(epsilon).any() or (epsilon < 0).any():
        raise problem(
            "accountant", accountant, "composed_epsilon", "returned NaN or a negative epsilon"
        )
    return epsilon
