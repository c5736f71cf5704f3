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
``gdp``
    Gaussian mechanism only, exact: ``k`` releases at noise multiplier ``z`` are
    ``sqrt(k)/z``-GDP (Dong, Roth & Su 2019), converted to ``(epsilon, delta_total)`` through
    the Gaussian's tight privacy profile (:mod:`p2pdp.privacy.gdp`). No valid accountant can state a
    smaller epsilon for these releases, so it affords the most aggregations (README's table:
    80 -> 94 against ``rdp``). The default for ``gaussian`` (``privacy.accountant = "auto"``).
``pld``
    Privacy loss distributions (Koskela et al. 2020; Doroshenko et al. 2022), computed by
    Google's dp-accounting: the pessimistic discretisation of each event's privacy loss,
    composed by convolution, so the epsilon is an upper bound within the discretisation
    (:func:`pld_discretization`) of the exact one; the smaller ``rdp`` or ``gdp`` bound is
    stated where one is smaller (every one is valid). Composes Gaussian, Poisson-subsampled
    Gaussian (add/remove or replace-one), Laplace and ``(epsilon, delta)`` events, and mixed
    sequences of them (:meth:`PldAccountant.sequence_epsilon`). The default for the
    Poisson-subsampled steps of the iterative protocols, where it is up to 7 times tighter
    than ``rdp`` (q = 0.01, z = 2, one step: 0.028 against 0.194 at delta = 1e-5).
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from p2pdp.core.boundary import calling, check_methods, check_numbers, check_type, problem
from p2pdp.core.errors import BudgetExhaustedError, ConfigError
from p2pdp.core.validation import require_count, require_positive, require_probability
from p2pdp.privacy.calibration import analytic_gaussian_sigma
from p2pdp.privacy.events import (
    ADD_REMOVE,
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    PrivacyEvent,
    SubsampledGaussianEvent,
)

ACCOUNTANTS: tuple[str, ...] = ("basic", "rdp", "gdp", "pld")

#: Accountants that compose only Gaussian releases (they need ``delta > 0``).
GAUSSIAN_ACCOUNTANTS: tuple[str, ...] = ("rdp", "gdp")

#: Accountants whose epsilon the README's budget table compares.
BUDGET_TABLE_ACCOUNTANTS: tuple[str, ...] = ("basic", "rdp", "gdp")

#: Widest privacy-loss grid of the ``pld`` accountant (nats). Pessimistic rounding keeps the
#: epsilon an upper bound, at most ``k`` grid widths above the optimistic estimate after ``k``
#: releases (tests/privacy/test_accounting.py); a release whose privacy loss spans a narrow
#: range gets a finer grid (:func:`pld_discretization`).
PLD_DISCRETIZATION = 1e-3

#: Grid points a release's privacy loss spans at least (:func:`pld_discretization`): at 1e-3 a
#: Poisson-subsampled Gaussian of small ``q`` spans a few dozen, and the rounding of each
#: release adds up: q = 0.003, z = 4, 5,000 steps, delta = 1e-6 gave 0.2357 where the
#: converged value is 0.2064 (14% above). With 3,000 points: 0.2064, within 0.03% of a 10x
#: finer grid on the cases measured (q in 0.001..0.3, 1,000 to 20,000 steps), 0.1-0.4 s a
#: composition.
PLD_POINTS = 3000

#: Relative tolerance when comparing spent to total epsilon (and delta), so that float error
#: in e.g. ``3 * 0.1 = 0.30000000000000004`` does not cost a peer an aggregation.
BUDGET_TOLERANCE = 1e-9

#: Renyi orders ``alpha`` (all > 1) over which the RDP conversion is minimised.
RDP_ORDERS: np.ndarray = 1.0 + np.geomspace(1e-3, 1e6, 2000)

#: Integer Renyi orders of the Poisson-subsampled Gaussian (its RDP is exact at integer orders).
INTEGER_RDP_ORDERS: np.ndarray = np.concatenate([np.arange(2, 257), [320, 384, 512, 768, 1024]])

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
    if accountant in GAUSSIAN_ACCOUNTANTS and delta_step == 0:
        raise ConfigError(
            f"accountant {accountant!r} is for the gaussian mechanism and needs "
            f"delta_per_aggregation in (0, 1), got {delta_per_aggregation!r}"
        )
    return eps_step, delta_total, delta_step


def _counts(n_aggregations: int | np.ndarray) -> np.ndarray:
    counts = np.asarray(n_aggregations)
    if counts.size and not (np.issubdtype(counts.dtype, np.integer) and counts.min() >= 0):
        raise ConfigError(f"n_aggregations must be integers >= 0, got {n_aggregations!r}")
    return counts


# --- accountants ----------------------------------------------------------------------------------
class Accountant(ABC):
    """How a peer's releases compose into the ``(epsilon, delta)`` it has spent.

    Protocol of the ``accountant`` component kind (``privacy.accountant``). An accountant is
    stateless: the :class:`BudgetLedger` counts releases per peer (every release of a run is
    the same :class:`~p2pdp.privacy.events.PrivacyEvent`, declared by the run's mechanism) and asks
    the accountant for the epsilon that ``k`` such releases cost at the peer's ``delta_total``.

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


#: Events whose PLD a :class:`PldAccountant` keeps (a bisection on the noise tries ~30).
_PLD_CACHE = 64


def pld_discretization(event: PrivacyEvent) -> float:
    """Grid width (nats) of the ``pld`` accountant's PLD of ``event``.

    :data:`PLD_DISCRETIZATION`, or finer where the privacy loss of one release spans fewer than
    :data:`PLD_POINTS` widths of it: the span over :data:`PLD_POINTS`. Only Poisson-subsampled
    Gaussians are refined (their span: the loss between dp-accounting's truncation points of
    the noise, the narrower of the add and remove directions under add/remove): at small ``q``
    the span is tiny and they are composed thousands of times. A plain Gaussian is one
    rounding whatever its count (:meth:`PldAccountant.distribution`); Laplace and
    ``(epsilon, delta)`` events keep :data:`PLD_DISCRETIZATION` (a mixed sequence is composed
    on its finest part's grid, and a fine grid under a wide Gaussian costs millions of points).
    """
    if isinstance(event, SubsampledGaussianEvent):
        from dp_accounting.pld import privacy_loss_mechanism as mechanism

        kind = mechanism.AdjacencyType
        kinds = (kind.REMOVE, kind.ADD) if event.relation == ADD_REMOVE else (kind.REPLACE,)
        spans = []
        for adjacency in kinds:
            loss = mechanism.GaussianPrivacyLoss(
                event.noise_multiplier, sampling_prob=event.sampling_rate, adjacency_type=adjacency
            )
            tail = loss.privacy_loss_tail()
            spans.append(
                abs(
                    loss.privacy_loss(tail.lower_x_truncation)
                    - loss.privacy_loss(tail.upper_x_truncation)
                )
            )
        return min(PLD_DISCRETIZATION, min(spans) / PLD_POINTS)
    return PLD_DISCRETIZATION


class PldAccountant(BasicAccountant):
    """Privacy loss distributions, composed exactly by Google's dp-accounting.

    Each event becomes the pessimistic PLD of its dominating pair of distributions, at the
    grid width :func:`pld_discretization` (at most :data:`PLD_DISCRETIZATION`):

    * :class:`~p2pdp.privacy.events.GaussianEvent`: the Gaussian shift of ``1 / z`` standard
      deviations (its relation is already in its sensitivity);
    * :class:`~p2pdp.privacy.events.SubsampledGaussianEvent`: the Poisson-subsampled Gaussian
      at rate ``q`` and noise ``z``, under the event's relation (add/remove: both the add and
      the remove direction; replace-one: ``q N(1) + (1-q) N(0)`` against ``q N(-1) + (1-q)
      N(0)``);
    * :class:`~p2pdp.privacy.events.LaplaceEvent`: the shift of one scale ``1 / epsilon`` of a
      Laplace law;
    * any other :class:`~p2pdp.privacy.events.EpsilonDeltaEvent` (and a distributional one:
      its threat model is unchanged): the worst ``(epsilon, delta)``-DP pair, which dominates
      every mechanism with that guarantee (Kairouz, Oh & Viswanath 2015).

    ``k`` releases are the ``k``-fold convolution, and the epsilon at ``delta_total`` is read
    from its hockey-stick curve: a valid upper bound (pessimistic rounding), exact up to the
    grid. :meth:`composed_epsilon` states the smallest of the valid upper bounds it knows for
    the event: this one, the basic bound and, where they compose the event, the ``rdp`` and
    ``gdp`` accountants' (the PLD's rounding can leave it above ``rdp`` after many releases).
    Events of every relation are composed as stated; a sequence must not mix relations
    (:meth:`sequence_epsilon` refuses it).

    ``discretization``: the widest grid (default :data:`PLD_DISCRETIZATION`).
    """

    name: ClassVar[str] = "pld"

    def __init__(self, discretization: float = PLD_DISCRETIZATION) -> None:
        self.discretization = require_positive("discretization", discretization)
        self._distributions: dict[tuple[PrivacyEvent, float], Any] = {}  # dp-accounting's PLDs
        self._epsilons: dict[tuple[PrivacyEvent, int, float], float] = {}

    def supports(self, event: PrivacyEvent) -> bool:
        if isinstance(event, EpsilonDeltaEvent):
            return event.epsilon < math.inf
        if isinstance(event, LaplaceEvent):
            return event.epsilon < math.inf
        return isinstance(event, (GaussianEvent, SubsampledGaussianEvent))

    def grid(self, event: PrivacyEvent) -> float:
        """The grid width of ``event``'s PLD: :func:`pld_discretization`, at most
        ``discretization``."""
        return min(self.discretization, pld_discretization(event))

    def distribution(
        self, event: PrivacyEvent, count: int = 1, *, grid: float | None = None
    ) -> Any:  # dp-accounting's PLD
        """The pessimistic PLD of ``count`` releases of ``event``, on :meth:`grid` (or ``grid``).

        ``count`` Gaussian releases are one Gaussian release at noise ``z / sqrt(count)``
        (exact, and one rounding instead of ``count``); every other event is the PLD of one
        release (cached per event and grid) convolved ``count`` times.
        """
        self.check(event)
        from dp_accounting.pld import privacy_loss_distribution as pld

        grid = self.grid(event) if grid is None else grid
        if isinstance(event, GaussianEvent):
            return pld.from_gaussian_mechanism(
                event.noise_multiplier / math.sqrt(count), value_discretization_interval=grid
            )
        if (event, grid) not in self._distributions:
            if len(self._distributions) >= _PLD_CACHE:  # a calibration tries many events
                self._distributions.clear()
                self._epsilons.clear()
            if isinstance(event, SubsampledGaussianEvent):
                from dp_accounting import NeighboringRelation

                relation = (
                    NeighboringRelation.ADD_OR_REMOVE_ONE
                    if event.relation == ADD_REMOVE
                    else NeighboringRelation.REPLACE_ONE
                )
                distribution = pld.from_gaussian_mechanism(
                    event.noise_multiplier,
                    sampling_prob=event.sampling_rate,
                    neighboring_relation=relation,
                    value_discretization_interval=grid,
                )
            elif isinstance(event, LaplaceEvent):
                distribution = pld.from_laplace_mechanism(
                    1.0 / event.epsilon, value_discretization_interval=grid
                )
            else:
                epsilon, delta = event.epsilon_delta()
                distribution = pld.from_privacy_parameters(
                    pld.common.DifferentialPrivacyParameters(epsilon, delta),
                    value_discretization_interval=grid,
                )
            self._distributions[event, grid] = distribution
        one = self._distributions[event, grid]
        return one if count == 1 else one.self_compose(count)

    def composed_epsilon(self, event, counts, *, delta_total):
        counts = _counts(counts)
        basic = super().composed_epsilon(event, counts, delta_total=delta_total)
        if not event.private:
            return basic
        unique, inverse = np.unique(counts, return_inverse=True)
        spent = np.array(
            [self._epsilon(event, k, delta_total) if k else 0.0 for k in unique.tolist()]
        )
        spent = np.minimum(basic, spent[inverse].reshape(counts.shape))
        for other in ("rdp", "gdp"):  # every valid bound: the smallest is one
            accountant = _ACCOUNTANTS[other]
            if accountant.supports(event):
                spent = np.minimum(
                    spent, accountant.composed_epsilon(event, counts, delta_total=delta_total)
                )
        return spent

    def _epsilon(self, event: PrivacyEvent, count: int, delta_total: float) -> float:
        key = (event, count, delta_total)
        if key not in self._epsilons:
            composed_pld = self.distribution(event, count)
            self._epsilons[key] = float(composed_pld.get_epsilon_for_delta(delta_total))
        return self._epsilons[key]

    def sequence_epsilon(
        self, releases: Sequence[tuple[PrivacyEvent, int]], *, delta_total: float
    ) -> float:
        """Epsilon at ``delta_total`` of a mixed sequence: ``count`` releases of each event.

        The exact composition (convolution of the PLDs) of everything one peer took part in,
        e.g. aggregations of different group sizes or mechanisms in one run. Every event must
        state the same neighbouring relation (a guarantee under two relations is neither).
        ``inf`` if any release is not private; 0 for no release.
        """
        releases = [(event, count) for event, count in releases if count]
        if any(not event.private for event, _ in releases):
            return math.inf
        relations = {event.relation for event, _ in releases}
        if len(relations) > 1:
            raise ConfigError(
                f"releases must state one neighbouring relation to be composed, got "
                f"{sorted(relations)}"
            )
        if not releases:
            return 0.0
        grid = min(self.grid(event) for event, _ in releases)  # one grid to convolve on
        parts = [self.distribution(event, int(count), grid=grid) for event, count in releases]
        total = functools.reduce(lambda left, right: left.compose(right), parts)
        return float(total.get_epsilon_for_delta(delta_total))


_ACCOUNTANTS: dict[str, Accountant] = {
    "basic": BasicAccountant(),
    "rdp": RdpAccountant(),
    "gdp": GdpAccountant(),
    "pld": PldAccountant(),
}


def resolve_accountant_name(accountant: str, mechanism: str) -> str:
    """``privacy.accountant`` with ``"auto"`` resolved: ``gdp`` for Gaussian releases, else basic.

    A mechanism counts as Gaussian when its class is (a subclass of)
    :class:`p2pdp.privacy.mechanisms.Gaussian`, whose releases declare a
    :class:`~p2pdp.privacy.events.GaussianEvent`. Any other name is returned unchanged.
    """
    if accountant != "auto":
        return accountant
    from p2pdp.privacy.mechanisms import Gaussian, mechanism_class

    try:
        cls = mechanism_class(mechanism)
    except ConfigError:
        return "basic"
    return "gdp" if isinstance(cls, type) and issubclass(cls, Gaussian) else "basic"


def make_accountant(accountant: str | Accountant) -> Accountant:
    """An accountant instance from a registered name, an import string or an instance."""
    if isinstance(accountant, Accountant):
        return accountant
    if accountant in _ACCOUNTANTS:
        return _ACCOUNTANTS[accountant]
    from p2pdp.core.components import resolve

    target = resolve("accountant", accountant, key="privacy.accountant")
    if isinstance(target, type):
        with calling("accountant", target, "__init__"):
            target = target()
    check_methods(target, "accountant", ACCOUNTANT_METHODS, "p2pdp.privacy.accounting.Accountant")
    return target


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


def step_event(
    epsilon_per_aggregation: float, delta_per_aggregation: float, accountant: str
) -> PrivacyEvent:
    """The event of one release at ``(epsilon_A, delta_A)``: Gaussian for rdp/gdp, else plain."""
    if accountant in GAUSSIAN_ACCOUNTANTS:
        sigma = analytic_gaussian_sigma(epsilon_per_aggregation, delta_per_aggregation, 1.0)
        return GaussianEvent(sigma, epsilon_per_aggregation, delta_per_aggregation)
    return EpsilonDeltaEvent(epsilon_per_aggregation, delta_per_aggregation)


def composed_epsilon(
    n_aggregations: int | np.ndarray,
    *,
    epsilon_per_aggregation: float,
    delta_total: float = 0.0,
    delta_per_aggregation: float = 0.0,
    accountant: str = "basic",
) -> np.ndarray:
    """Epsilon spent, at ``delta_total``, after ``n_aggregations`` releases of one peer.

    A convenience over :class:`Accountant` for releases calibrated to ``(epsilon_A,
    delta_A)`` (``rdp``: the analytic Gaussian mechanism at that calibration).

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
    counts = _counts(n_aggregations)
    event = step_event(eps_step, delta_step, accountant)
    return _ACCOUNTANTS[accountant].composed_epsilon(event, counts, delta_total=delta_total)


#: More releases per peer than any budget affords: an accountant that allows them is broken.
_MAX_RELEASES = 2**40


def affordable(
    accountant: Accountant,
    event: PrivacyEvent,
    *,
    epsilon_total: float,
    delta_total: float,
    at_most: int | None = None,
) -> int:
    """Largest number of releases of ``event`` whose composed epsilon is <= ``epsilon_total``.

    Up to the relative :data:`BUDGET_TOLERANCE`; 0 if not even one fits. Found by doubling
    and bisection on ``k`` (the composed epsilon increases with ``k``). ``at_most``: no more
    can happen in the run, so the search stops there (a very noisy event affords more).
    A built-in accountant's answer, a function of the arguments only, is searched once per
    process (a sweep builds a ledger for every cell).
    """
    if any(accountant is builtin for builtin in _ACCOUNTANTS.values()):
        try:
            hash(event)
        except TypeError:  # an event of one's own may not be hashable
            pass
        else:
            return _affordable_builtin(accountant, event, epsilon_total, delta_total, at_most)
    return _affordable(accountant, event, epsilon_total, delta_total, at_most)


def _affordable(
    accountant: Accountant,
    event: PrivacyEvent,
    epsilon_total: float,
    delta_total: float,
    at_most: int | None,
) -> int:
    """:func:`affordable`'s search."""
    limit = epsilon_total * (1 + BUDGET_TOLERANCE)

    def fits(k: int) -> bool:
        spent = composed(accountant, event, np.array(k), delta_total=delta_total)
        return bool(spent <= limit)

    if at_most is not None and fits(at_most):
        return at_most
    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):
        if high > _MAX_RELEASES:
            raise problem(
                "accountant",
                accountant,
                "composed_epsilon",
                f"stays <= epsilon_total = {epsilon_total:g} for {high} releases: it must grow "
                "with the number of releases",
            )
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


_affordable_builtin = functools.lru_cache(maxsize=256)(_affordable)


def affordable_aggregations(
    epsilon_total: float,
    epsilon_per_aggregation: float,
    delta_total: float = 0.0,
    delta_per_aggregation: float = 0.0,
    accountant: str = "basic",
) -> int:
    """Largest number of aggregations a peer can join within its budget.

    The largest ``k`` with :func:`composed_epsilon` ``(k) <= epsilon_total`` (up to the relative
    :data:`BUDGET_TOLERANCE`), e.g. ``basic`` with ``(1.0, 0.1)`` gives 10.
    """
    eps_step, delta_total, delta_step = _validate_step(
        epsilon_per_aggregation, delta_total, delta_per_aggregation, accountant
    )
    eps_total = _validate_total(epsilon_total, eps_step)
    event = step_event(eps_step, delta_step, accountant)
    return affordable(
        _ACCOUNTANTS[accountant], event, epsilon_total=eps_total, delta_total=delta_total
    )


def _validate_total(epsilon_total: float, eps_step: float) -> float:
    eps_total = require_positive("epsilon_total", epsilon_total)
    if eps_step > eps_total * (1 + BUDGET_TOLERANCE):
        raise ConfigError(
            f"epsilon_per_aggregation must be <= epsilon_total ({eps_total!r}), got {eps_step!r}"
        )
    return eps_total


def budget_table(
    settings: Sequence[tuple[float, float, float, float]] = BUDGET_TABLE_SETTINGS,
) -> list[dict[str, float | int]]:
    """Affordable aggregations per peer under each accountant for the Gaussian mechanism.

    Parameters
    ----------
    settings : sequence of (epsilon_total, epsilon_per_aggregation, delta_total,
        delta_per_aggregation)

    Returns
    -------
    list of dict
        One row per setting with those four keys plus ``basic``, ``rdp`` and ``gdp`` (counts).
    """
    rows = []
    for eps_total, eps_step, delta_total, delta_step in settings:
        row: dict[str, float | int] = {
            "epsilon_total": eps_total,
            "epsilon_per_aggregation": eps_step,
            "delta_total": delta_total,
            "delta_per_aggregation": delta_step,
        }
        for accountant in BUDGET_TABLE_ACCOUNTANTS:
            row[accountant] = affordable_aggregations(
                eps_total, eps_step, delta_total, delta_step, accountant
            )
        rows.append(row)
    return rows


def format_budget_table(rows: Sequence[dict[str, float | int]]) -> str:
    """Markdown table of :func:`budget_table` rows (for the README)."""
    lines = [
        "| epsilon | epsilon_A | delta | delta_A | basic | rdp | gdp |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['epsilon_total']:g} | {row['epsilon_per_aggregation']:g} "
            f"| {row['delta_total']:g} | {row['delta_per_aggregation']:g} "
            f"| {row['basic']} | {row['rdp']} | {row['gdp']} |"
        )
    return "\n".join(lines)


#: Arrays of at most this many peer ids are checked with Python builtins (faster when short).
_SMALL = 256


def _count_distinct(ids: np.ndarray) -> int:
    return len(set(ids.tolist())) if ids.size <= _SMALL else int(np.unique(ids).size)


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
    accountant : str or Accountant
        ``"basic"``, ``"rdp"`` (Gaussian only), or any :class:`Accountant`.
    event : PrivacyEvent, optional
        What one aggregation releases, as the run's mechanism declares it
        (:meth:`p2pdp.privacy.mechanisms.Mechanism.budget_event`); the accountant composes it.
        Default: the event of a release calibrated to ``(epsilon_A, delta_A)``
        (:func:`step_event`).

    Attributes
    ----------
    max_aggregations : int
        Aggregations every peer can afford.
    """

    def __init__(
        self,
        n_peers: int,
        *,
        epsilon_total: float,
        epsilon_per_aggregation: float,
        delta_total: float = 0.0,
        delta_per_aggregation: float = 0.0,
        accountant: str | Accountant = "basic",
        event: PrivacyEvent | None = None,
    ) -> None:
        self.n_peers = require_count("n_peers", n_peers)
        name = accountant.name if isinstance(accountant, Accountant) else accountant
        eps_step, delta_total, delta_step = _validate_step(
            epsilon_per_aggregation,
            delta_total,
            delta_per_aggregation,
            name if name in ACCOUNTANTS else "basic",
        )
        self.epsilon_total = _validate_total(epsilon_total, eps_step)
        self.delta_total = delta_total
        self.accountant = make_accountant(accountant)
        self.event = event if event is not None else step_event(eps_step, delta_step, name)
        with calling("accountant", self.accountant, "check"):
            self.accountant.check(self.event)
        self.max_aggregations = affordable(
            self.accountant, self.event, epsilon_total=self.epsilon_total, delta_total=delta_total
        )
        self._counts = np.zeros(self.n_peers, dtype=np.int64)

    def _peer_ids(self, peers: np.ndarray | Sequence[int]) -> np.ndarray:
        ids = np.asarray(peers)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ConfigError(f"peers must be a 1-D sequence of integer ids, got {peers!r}")
        if ids.size:
            # a group is small: Python's min/max on a list beat two numpy reductions there
            if ids.size <= _SMALL:
                values = ids.tolist()
                low, high = min(values), max(values)
            else:
                low, high = ids.min(), ids.max()
            if low < 0 or high >= self.n_peers:
                raise ConfigError(f"peers must be ids in [0, {self.n_peers}), got {peers!r}")
        return ids

    def can_afford(self, peers: np.ndarray | Sequence[int]) -> np.ndarray:
        """Bool per peer (shape (len(peers),)): can it afford one more aggregation?"""
        return self._counts[self._peer_ids(peers)] < self.max_aggregations

    def check(self, peers: np.ndarray | Sequence[int]) -> None:
        """Raise BudgetExhaustedError naming the peers that cannot afford one more aggregation."""
        self.refuse_broke(self._peer_ids(peers))

    def refuse_broke(self, ids: np.ndarray, spent: np.ndarray | None = None) -> None:
        """Raise BudgetExhaustedError naming the ``ids`` whose count (``spent``, default the
        ledger's) leaves no aggregation.

        ``ids`` is an int64 array of valid peer ids (not checked here: :meth:`check` checks
        them); ``spent`` (same shape) the counts to judge them by, for a driver that keeps its
        own counts until :meth:`write_counts`.
        """
        spent = self._counts[ids] if spent is None else spent
        broke = ids[spent >= self.max_aggregations]
        if broke.size:
            raise BudgetExhaustedError(
                f"peers {broke.tolist()} have used all {self.max_aggregations} aggregations of "
                f"epsilon_total={self.epsilon_total} ({self.accountant.name} accountant)"
            )

    def spend(self, peers: np.ndarray | Sequence[int]) -> None:
        """Record one aggregation for each of ``peers`` (distinct ids); all or nothing."""
        ids = self._peer_ids(peers)
        if ids.size > 1 and _count_distinct(ids) != ids.size:
            raise ConfigError(f"peers must be distinct ids, got {peers!r}")
        self.refuse_broke(ids)
        self._counts[ids] += 1

    def write_counts(self, counts: Sequence[int], ids: Sequence[int] | None = None) -> None:
        """Set the aggregation counts of ``ids`` (every peer if None) to ``counts``.

        For a driver that charges its peers outside the ledger, each charge checked with
        :meth:`refuse_broke` (:class:`p2pdp.sim.waves.DrawnCharges`). A count never decreases
        and never exceeds ``max_aggregations``: either would understate what was spent, so it
        raises ConfigError and writes nothing.
        """
        new = np.asarray(counts, dtype=np.int64)
        rows = slice(None) if ids is None else np.asarray(ids, dtype=np.int64)
        old = self._counts[rows]
        if new.shape != old.shape:
            raise ConfigError(f"counts must have shape {old.shape}, got {new.shape}")
        if not ((old <= new) & (new <= self.max_aggregations)).all():
            raise ConfigError(
                f"counts must not decrease nor exceed max_aggregations={self.max_aggregations}"
            )
        self._counts[rows] = new

    def spent_epsilon(self) -> np.ndarray:
        """Epsilon spent by each peer under the ledger's accountant, shape (P,)."""
        return composed(self.accountant, self.event, self._counts, delta_total=self.delta_total)

    def aggregations(self, peers: np.ndarray | Sequence[int] | None = None) -> np.ndarray:
        """Number of aggregations each peer joined, shape (P,), or of ``peers`` only (a
        copy)."""
        if peers is None:
            return self._counts.copy()
        return self._counts[self._peer_ids(peers)]

    def active_mask(self) -> np.ndarray:
        """Bool mask of peers that can still afford one more aggregation, shape (P,)."""
        return self._counts < self.max_aggregations
