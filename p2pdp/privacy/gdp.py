"""Exact composition of Gaussian releases through Gaussian differential privacy (mu-GDP).

A release ``M(D) = f(D) + N(0, sigma^2 I)`` of a vector of L2 sensitivity ``Delta`` (under the
neighbouring relation the caller uses: here, replace one record of one peer's shard) is
``mu``-GDP with ``mu = Delta / sigma = 1 / z``, ``z`` the *noise multiplier* (Dong, Roth & Su
2019, "Gaussian Differential Privacy", Theorem 2.7). GDP composes exactly: ``k`` adaptively
chosen releases that are ``mu_1..mu_k``-GDP are jointly ``sqrt(sum mu_i^2)``-GDP (their
Corollary 3.3), so ``k`` releases at noise multiplier ``z`` are ``sqrt(k)/z``-GDP. This is the
Gaussian mechanism's tight privacy profile, not an upper bound: no accountant can certify a
smaller ``epsilon`` for these releases at the same ``delta`` (the profile of one Gaussian
release of sensitivity ``sqrt(k) Delta`` at the same ``sigma`` is attained).

A ``mu``-GDP mechanism is ``(epsilon, delta(epsilon))``-DP for every ``epsilon >= 0`` with
(their Corollary 2.13; the same curve as Balle & Wang 2018, Theorem 8)::

    delta(epsilon) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)

Everything here is evaluated in log space (``log_ndtr``) and inverted with ``brentq``, so it
stays accurate for ``delta`` down to 1e-300 and ``mu`` from 1e-6 to 1e3.

What a peer's ledger needs: each aggregation a peer joins is one Gaussian release calibrated on
its group's sensitivity ``Delta_g`` with ``sigma = z Delta_g``; the peer's own record moves the
average by at most ``Delta_g`` (the group-mean bound uses the smallest shard), so for that
peer the release is at most ``1/z``-GDP, whatever the group. A peer that joined releases with
noise multipliers ``z_1..z_k`` is ``sqrt(sum 1/z_i^2)``-GDP; the guarantee stated is
``(gdp_epsilon(mu, delta_total), delta_total)``-DP for a change of one record of its shard.
Publishing the releases further is post-processing and changes nothing.

For a ledger, the cheapest state is ``sum mu_i^2`` per peer: a release at noise multiplier
``z`` adds ``1/z^2``, and a peer can afford it while ``sum + 1/z^2 <= gdp_mu(epsilon_total,
delta_total)^2`` (one root-finding per run, not per release). With one ``z`` per run (every
release calibrated at the same ``(epsilon_A, delta_A)``) this is a count, and
:func:`affordable_aggregations_gdp` gives the same maximum.
"""

from __future__ import annotations

import math

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.privacy.tolerance import BUDGET_TOLERANCE

__all__ = [
    "affordable_aggregations_gdp",
    "composed_epsilon_gdp",
    "gaussian_mu",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "noise_multiplier_for_gdp",
]

#: Largest ``mu`` whose epsilon is computed (about 5e11 at any delta): beyond it the log-space
#: formula loses every digit (NaN at mu = 1e12), and no such guarantee protects anyone.
MAX_MU = 1e6
#: Largest budget :func:`gdp_mu` calibrates to (mu about 1,400): beyond it the log-space
#: formula loses every digit (NaN at epsilon = 1e9) and the budget protects no one.
MAX_EPSILON = 1e6


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be > 0 and finite, got {value!r}")
    return value


def _open_probability(name: str, value: float) -> float:
    value = float(value)
    if not 0.0 < value < 1.0:
        raise ConfigError(f"{name} must be in (0, 1), got {value!r}")
    return value


def _log_delta(epsilon: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """``log delta(epsilon)`` of ``mu``-GDP, elementwise; ``-inf`` where delta underflows.

    ``delta = Phi(a) (1 - exp(epsilon + log Phi(b) - log Phi(a)))`` with
    ``a = -epsilon/mu + mu/2`` and ``b = a - mu``; the bracket is in (0, 1] since ``mu > 0``.
    """
    from scipy.special import log_ndtr

    a = -epsilon / mu + mu / 2.0
    log_first = log_ndtr(a)
    exponent = epsilon + log_ndtr(a - mu) - log_first
    with np.errstate(divide="ignore"):
        return log_first + np.log(-np.expm1(exponent))


def gdp_delta(epsilon: float | np.ndarray, mu: float | np.ndarray) -> np.ndarray:
    """Smallest ``delta`` for which a ``mu``-GDP mechanism is ``(epsilon, delta)``-DP.

    Parameters
    ----------
    epsilon : float or ndarray, >= 0
    mu : float or ndarray, > 0
        Broadcast together.

    Returns
    -------
    ndarray of float in [0, 1)
        ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``, computed in log space.
    """
    epsilon = np.asarray(epsilon, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    if np.any(~(epsilon >= 0)) or np.any(~np.isfinite(epsilon)):
        raise ConfigError(f"epsilon must be >= 0 and finite, got {epsilon!r}")
    if np.any(~(mu > 0)) or np.any(~np.isfinite(mu)):
        raise ConfigError(f"mu must be > 0 and finite, got {mu!r}")
    return np.exp(_log_delta(epsilon, mu))


def gaussian_mu(n_releases: int | np.ndarray, noise_multiplier: float) -> np.ndarray:
    """``mu = sqrt(k) / z`` of ``k`` Gaussian releases at noise multiplier ``z = sigma/Delta``.

    Parameters
    ----------
    n_releases : int or ndarray of int, >= 0
    noise_multiplier : float, > 0

    Returns
    -------
    ndarray of float, shape of ``n_releases`` (0 where ``k = 0``: nothing released)
    """
    z = _positive("noise_multiplier", noise_multiplier)
    counts = np.asarray(n_releases)
    if counts.size and not (np.issubdtype(counts.dtype, np.integer) and counts.min() >= 0):
        raise ConfigError(f"n_releases must be integers >= 0, got {n_releases!r}")
    return np.sqrt(counts.astype(np.float64)) / z


def _epsilon_one(mu: float, log_delta: float) -> float:
    """Smallest ``epsilon >= 0`` with ``delta(epsilon; mu) <= delta``, for one ``mu > 0``."""
    from scipy.optimize import brentq
    from scipy.special import ndtri

    if _log_delta(np.float64(0.0), np.float64(mu)) <= log_delta:
        return 0.0

    def excess(epsilon: float) -> float:
        return float(_log_delta(np.float64(epsilon), np.float64(mu))) - log_delta

    # delta(eps) <= Phi(-eps/mu + mu/2), so eps = mu^2/2 - mu Phi^-1(delta) is an upper bound.
    high = max(mu * mu / 2.0 - mu * float(ndtri(math.exp(log_delta))), 1e-12)
    while excess(high) > 0:  # guards against rounding at the bound
        high *= 2.0
    low = 0.0
    root = brentq(excess, low, high, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    while excess(root) > 0:  # never report an epsilon below the exact one
        root += 1e-14 * max(1.0, root)
    return root


def gdp_epsilon(mu: float | np.ndarray, delta: float) -> np.ndarray:
    """Tight ``epsilon`` at ``delta`` of a ``mu``-GDP mechanism, vectorised over ``mu``.

    Solves ``delta(epsilon; mu) = delta`` for ``epsilon`` with ``brentq`` in log space (the
    curve decreases in ``epsilon``), once per distinct ``mu``; the returned value is never below
    the exact root (stepped up by a few ulps where rounding would put it below).

    Parameters
    ----------
    mu : float or ndarray, >= 0
        0 means nothing was released (epsilon 0).
    delta : float in (0, 1)

    Returns
    -------
    ndarray of float >= 0, shape of ``mu``
    """
    delta = _open_probability("delta", delta)
    mus = np.asarray(mu, dtype=np.float64)
    if np.any(~(mus >= 0)) or np.any(~np.isfinite(mus)):
        raise ConfigError(f"mu must be >= 0 and finite, got {mu!r}")
    if np.any(mus > MAX_MU):
        raise ConfigError(
            f"mu = {float(mus.max()):g} (GDP) is beyond {MAX_MU:g}, where epsilon would exceed "
            "5e11: so little noise protects nothing (a noise multiplier of about 1/mu); "
            "for a run without noise say so (privacy.mechanism = 'none')"
        )
    unique, inverse = np.unique(mus, return_inverse=True)
    log_delta = math.log(delta)
    values = np.array([0.0 if m == 0 else _epsilon_one(float(m), log_delta) for m in unique])
    return values[inverse].reshape(mus.shape)


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest ``mu`` such that ``mu``-GDP implies ``(epsilon, delta)``-DP.

    ``delta(epsilon; mu)`` increases with ``mu``; solved by ``brentq`` on ``log mu``, then
    stepped down until the condition holds, so the result never overstates the budget.

    Parameters
    ----------
    epsilon : float, > 0
    delta : float in (0, 1)
    """
    from scipy.optimize import brentq

    epsilon = _positive("epsilon", epsilon)
    log_delta = math.log(_open_probability("delta", delta))
    if epsilon > MAX_EPSILON:
        raise ConfigError(
            f"epsilon = {epsilon:g} is beyond {MAX_EPSILON:g}, where a Gaussian calibration "
            "means nothing (no privacy to speak of); for a run without noise set "
            "privacy.mechanism = 'none'"
        )

    def excess(log_mu: float) -> float:
        return float(_log_delta(np.float64(epsilon), np.float64(math.exp(log_mu)))) - log_delta

    low, high = -1.0, 1.0
    while excess(low) > 0:
        low -= 2.0
    while excess(high) <= 0:
        high += 2.0
    root = brentq(excess, low, high, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    while excess(root) > 0:
        root -= 1e-14 * max(1.0, abs(root))
    return math.exp(root)


def composed_epsilon_gdp(
    n_aggregations: int | np.ndarray, *, noise_multiplier: float, delta_total: float
) -> np.ndarray:
    """Epsilon spent at ``delta_total`` after ``k`` Gaussian releases at noise multiplier ``z``.

    ``gdp_epsilon(sqrt(k)/z, delta_total)``, elementwise over ``n_aggregations`` (0 for
    ``k = 0``). Guarantee: ``(epsilon, delta_total)``-DP for one peer, replace-one-record of its
    shard, when every release it joined had ``sigma >= z * Delta`` (``Delta`` the release's L2
    sensitivity to that peer's records).
    """
    return gdp_epsilon(gaussian_mu(n_aggregations, noise_multiplier), delta_total)


def _fits(k: int, z: float, epsilon_total: float, delta_total: float) -> bool:
    spent = float(composed_epsilon_gdp(k, noise_multiplier=z, delta_total=delta_total))
    return spent <= epsilon_total * (1 + BUDGET_TOLERANCE)


def affordable_aggregations_gdp(
    epsilon_total: float, delta_total: float, noise_multiplier: float
) -> int:
    """Most Gaussian releases at noise multiplier ``z`` that fit in ``(epsilon_total, delta)``.

    "Fix the noise, get the count" (how Opacus users budget): ``k = floor((mu* z)^2)`` with
    ``mu* = gdp_mu(epsilon_total, delta_total)``, then corrected by one step either way so that
    ``composed_epsilon_gdp(k) <= epsilon_total`` (up to :data:`BUDGET_TOLERANCE`) and
    ``k + 1`` does not fit. 0 if not even one release fits.

    To reproduce the ledger's per-aggregation calibration, pass
    ``z = p2pdp.privacy.calibration.analytic_gaussian_sigma(epsilon_A, delta_A, 1.0)``.
    """
    epsilon_total = _positive("epsilon_total", epsilon_total)
    delta_total = _open_probability("delta_total", delta_total)
    z = _positive("noise_multiplier", noise_multiplier)
    mu_star = gdp_mu(epsilon_total, delta_total)
    k = math.floor((mu_star * z) ** 2)
    while k > 0 and not _fits(k, z, epsilon_total, delta_total):
        k -= 1
    while _fits(k + 1, z, epsilon_total, delta_total):
        k += 1
    return k


def noise_multiplier_for_gdp(
    epsilon_total: float, delta_total: float, n_aggregations: int
) -> float:
    """Smallest noise multiplier ``z`` with which ``k`` Gaussian releases fit the budget.

    ``z = sqrt(k) / mu*``, ``mu* = gdp_mu(epsilon_total, delta_total)`` (the inverse of
    :func:`affordable_aggregations_gdp`: ``k`` releases at this ``z`` are exactly
    ``mu*``-GDP). Multiply by a release's L2 sensitivity to get its ``sigma``.
    """
    epsilon_total = _positive("epsilon_total", epsilon_total)
    delta_total = _open_probability("delta_total", delta_total)
    if not (isinstance(n_aggregations, (int, np.integer)) and n_aggregations >= 1):
        raise ConfigError(f"n_aggregations must be an integer >= 1, got {n_aggregations!r}")
    return math.sqrt(int(n_aggregations)) / gdp_mu(epsilon_total, delta_total)
