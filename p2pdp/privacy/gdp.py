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

Everything here is evaluated in log space (``log_ndtr``), so it stays accurate for ``delta``
down to 1e-300 and ``mu`` from 1e-6 to 1e3; :func:`gdp_epsilon` inverts it for many ``mu`` at
once (a bracketed Newton iteration on arrays, whose every value is checked with a bound on the
formula's rounding: an upper bound on the exact epsilon), :func:`gdp_mu` with ``brentq``.

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


#: Relative error, in units of the float64 epsilon, allowed to each term of the log-space
#: ``delta`` (scipy's ``log_ndtr``, the sums, ``expm1`` and ``log`` are within a few units each;
#: 32 leaves room). It sizes the margin :func:`_certified_excess` adds.
_ROUNDING_UNITS = 32.0


def _certified_excess(
    epsilon: np.ndarray, mu: np.ndarray, log_delta: float
) -> tuple[np.ndarray, np.ndarray]:
    """An upper bound on ``log delta(epsilon; mu) - log_delta`` and Newton's step, elementwise.

    The log-space ``delta`` (:func:`_log_delta`) plus a bound on its rounding error, so that
    ``excess <= 0`` proves ``delta(epsilon) <= delta`` up to the accuracy of ``log_ndtr``: with
    ``x = epsilon + log Phi(b) - log Phi(a)`` (computed with absolute error about
    ``u (epsilon + |log Phi(b)| + |log Phi(a)|)``, ``u`` the float64 epsilon, which ``log(1 -
    e^x)`` multiplies by ``e^x / (1 - e^x)``: large where ``mu`` is tiny and ``x`` near 0), the
    margin is :data:`_ROUNDING_UNITS` ``u`` times ``|log Phi(a)| + |log(1 - e^x)| + (epsilon +
    |log Phi(b)| + |log Phi(a)|) e^x / (1 - e^x)``. NaN (not proved) where ``x`` rounds to
    ``>= 0``.

    ``d delta / d epsilon = -e^epsilon Phi(b)`` (``b = -epsilon/mu - mu/2``: the ``phi`` terms
    cancel since ``phi(a) = e^epsilon phi(b)``), so Newton's step on ``log delta`` is
    ``excess * delta / (e^epsilon Phi(b))`` (the margin's slope neglected): ``<= 0`` where
    ``excess <= 0``, NaN or infinite where delta underflows.
    """
    from scipy.special import log_ndtr

    a = -epsilon / mu + mu / 2.0
    log_first = log_ndtr(a)
    log_second = log_ndtr(a - mu)
    exponent = epsilon + log_second - log_first
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_rest = np.log(-np.expm1(exponent))
        log_value = log_first + log_rest
        amplification = -np.exp(exponent) / np.expm1(exponent)
        spread = epsilon + np.abs(log_second) + np.abs(log_first)
        margin = np.abs(log_first) + np.abs(log_rest) + spread * amplification
        excess = log_value - log_delta + _ROUNDING_UNITS * np.finfo(float).eps * margin
        return excess, excess * np.exp(log_value - epsilon - log_second)


#: Newton or bisection steps of :func:`_epsilon_many` before a value is given the tail bound.
_MAX_STEPS = 100


def _epsilon_many(mu: np.ndarray, log_delta: float) -> np.ndarray:
    """Smallest ``epsilon >= 0`` with ``delta(epsilon; mu) <= delta``, for every ``mu > 0`` at once.

    A bracketed Newton iteration on all values together, on :func:`_certified_excess` (the
    log-space ``delta`` plus a bound on its rounding): ``high`` always satisfies the constraint
    (``excess <= 0``) and ``low`` is 0 or a point that does not; each step is Newton's from
    ``high`` (``log delta`` is concave in ``epsilon``, so it lands between the root and
    ``high``), or the bisection of ``[low, high]`` where Newton's leaves the bracket. A value is
    done when its Newton step or its bracket is below 2 ulps of ``high``, and ``high`` is
    returned: every epsilon returned is one at which ``delta(epsilon) <= delta`` was checked
    with the rounding margin, an upper bound on the exact root (see :func:`gdp_epsilon` for how
    close). A value whose bracket cannot close in :data:`_MAX_STEPS` steps keeps its ``high``;
    one for which no ``high`` is proved (the rounding margin does not fit: ``mu`` around 1e-12
    with ``delta`` 1e-50 or less) gets the tail
    bound ``mu^2/2 - mu Phi^-1(delta)`` (``delta(epsilon) <= Phi(-epsilon/mu + mu/2)``), rounded
    up by 1e-12 relative.
    """
    from scipy.special import ndtri

    out = np.zeros(mu.shape)
    zero_excess, _ = _certified_excess(np.zeros(mu.shape), mu, log_delta)
    # delta(0) = 2 Phi(mu/2) - 1 <= mu / sqrt(2 pi): proves epsilon 0 where rounding cannot
    total_variation = mu * (0.3989422804014327 * (1 + 1e-12))
    zero = (zero_excess <= 0) | (total_variation <= math.exp(log_delta) * (1 - 1e-12))
    todo = np.flatnonzero(~zero)  # NaN counts as not proved
    m = mu[todo]
    tail = m * m / 2.0 - m * ndtri(math.exp(log_delta))
    high = np.maximum(tail, 1e-12)
    excess, step = _certified_excess(high, m, log_delta)
    for _ in range(8):  # the tail bound may need a margin (doubling it at most 8 times)
        above = ~(excess <= 0)
        if not above.any():
            break
        high[above] *= 2.0
        excess[above], step[above] = _certified_excess(high[above], m[above], log_delta)
    low = np.zeros(m.shape)
    ulp = 2.0 * np.finfo(float).eps
    live = np.flatnonzero(excess <= 0)
    for _ in range(_MAX_STEPS):
        h, lo = high[live], low[live]
        newton = h + step[live]  # <= h: excess <= 0 at high
        done = (h - newton <= ulp * h) | (h - lo <= ulp * h)
        live, h, lo, newton = live[~done], h[~done], lo[~done], newton[~done]
        if not live.size:
            break
        inside = np.isfinite(newton) & (newton > lo) & (newton < h)
        point = np.where(inside, newton, 0.5 * (lo + h))
        value, value_step = _certified_excess(point, m[live], log_delta)
        below = value <= 0
        high[live[below]], excess[live[below]] = point[below], value[below]
        step[live[below]] = value_step[below]
        low[live[~below]] = point[~below]
    unproved = ~(excess <= 0)
    high[unproved] = np.maximum(tail[unproved], 0.0) * (1 + 1e-12) + 1e-300
    out[todo] = high
    return out


def gdp_epsilon(mu: float | np.ndarray, delta: float) -> np.ndarray:
    """Tight ``epsilon`` at ``delta`` of a ``mu``-GDP mechanism, vectorised over ``mu``.

    Solves ``delta(epsilon; mu) = delta`` for ``epsilon`` in log space (the curve decreases in
    ``epsilon``) for every distinct ``mu`` at once (:func:`_epsilon_many`: 10^6 values in about
    2 s of CPU, where one ``brentq`` each took about 66 s: benchmarks/gdp_conversion.py). Each
    value returned was checked to satisfy the constraint with a bound on the log-space
    formula's rounding added, so it is never below the exact root; it is within 1e-9 relative
    of it for ``mu >= 1e-3`` (network DP's pairs, every accountant's composition) and within
    1e-5 down to ``mu = 1e-7``, where the rounding margin dominates (tests/privacy/test_gdp.py,
    against ``mpmath``).

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
    values = np.zeros(unique.shape)
    released = unique > 0
    values[released] = _epsilon_many(unique[released], math.log(delta))
    return values[inverse].reshape(mus.shape)


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest ``mu`` such that ``mu``-GDP implies ``(epsilon, delta)``-DP.

    ``delta(epsilon; mu)`` increases with ``mu``; solved by ``brentq`` on ``log mu``, then
    stepped down until :func:`gdp_epsilon` (an upper bound on the exact root) at ``mu`` is at
    most ``epsilon``: the result never overstates the budget, and a run calibrated with it
    reports at most its budget.

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
    # stepped down until gdp_epsilon (an upper bound, checked with its rounding margin) at
    # this mu is within the budget: then the noise is private at epsilon, and a run reports
    # at most its budget
    while float(_epsilon_many(np.array([math.exp(root)]), log_delta)[0]) > epsilon:
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
