"""Pooled testing for a low prevalence: estimation, optimality and privacy.

Model
-----
``N`` people with statuses ``X_i ~ Bernoulli(p)`` iid are split into ``J`` pools of size ``c``
(``N = c J``). A pooled sample is tested once with an imperfect test of sensitivity
``Se = P(test + | pool positive)`` and specificity ``Sp = P(test - | pool negative)``; a pool is
positive when at least one member is. With ``r = Se + Sp - 1 > 0`` (an informative test) one
test is positive with probability ``pi = P(Z = 1) = Se - r (1 - p)^c``; the MLE of ``p`` from
the fraction ``Z_bar`` of positive pools is ``p_hat = 1 - ((Se - Z_bar) / r)^(1/c)``
(:func:`pooled_mle`) with asymptotic variance ``pi (1 - pi) / (J c^2 r^2 (1 - p)^(2(c - 1)))``
(:func:`pooled_variance`, delta method). Pooling beats testing everyone for ``p < p_max``
(:func:`max_prevalence`, Liu et al. 2012).

Privacy of one person, and its threat model
-------------------------------------------
Released: the pooled test result ``Z`` of each pool (to the analyst, who may publish it).
Protected: one person's status ``x``; the *neighbouring relation* changes that status while
the other ``c - 1`` members' statuses stay **unknown to the adversary, who knows only p**: they
are marginalised as iid Bernoulli(p). With ``q = (1 - p)^(c - 1)`` (all others negative)::

    P(Z=1 | x=1) = Se        P(Z=1 | x=0) = Se - q r
    P(Z=0 | x=1) = 1 - Se    P(Z=0 | x=0) = 1 - Se + q r

and the person's privacy loss is ``epsilon(p, c) = max_z |ln P(z | x=1) / P(z | x=0)|``
(:func:`individual_epsilon`, checked against exact enumeration in
:func:`individual_epsilon_enumerated`). This is a *distributional* guarantee, NOT the worst-case
differential privacy of the other mechanisms in p2pdp: an adversary who knows that the other
members are negative faces the unpooled test, whose loss is :func:`worst_case_epsilon`
(``max(|ln(Se/(1-Sp))|, |ln(Sp/(1-Se))|)``, for every ``c``). It also assumes the other members'
statuses are independent of everything else the adversary sees: when the same people are
tested in several pools whose results are published, the adversary learns about the other
members from their other pools, and per-test losses computed here need not add up to a valid
bound (:func:`repeated_pool_epsilon` shows a pool tested twice exceeding twice the loss of
one test). Reports must say which guarantee they quote.

Randomized response on the result (the seed's "artificially decrease Se and Sp") is a
post-processing of ``Z`` through a binary channel; :func:`effective_accuracy` gives the
resulting ``(Se', Sp')``, which every function here accepts in place of ``(Se, Sp)``. With it
even the worst case is bounded by the randomized response's own epsilon, a real
(worst-case) DP guarantee.

Array conventions: every formula broadcasts its numeric arguments with numpy (figures sweep c
and p), returns a float for scalar inputs and an ndarray otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import require_count, require_probability
from p2pdp.privacy.counting import RandomizedResponse

#: Values of ``hold`` in :func:`max_prevalence`: what stays fixed when the pool size grows.
HOLDS: tuple[str, ...] = ("pools", "individuals")
#: Largest pool size :func:`individual_epsilon_enumerated` enumerates (2^(c-1) statuses).
MAX_ENUMERATED_POOL = 21


# --- validation -----------------------------------------------------------------------------------
def _probabilities(name: str, value: ArrayLike) -> np.ndarray:
    array = np.asarray(value, dtype=float)
    if not (np.all(np.isfinite(array)) and np.all((array >= 0) & (array <= 1))):
        raise ConfigError(f"{name} must be in [0, 1], got {value!r}")
    return array


def _pool_sizes(value: ArrayLike) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == bool or not np.issubdtype(array.dtype, np.number):
        raise ConfigError(f"pool_size must be integers >= 1, got {value!r}")
    if not (np.all(np.isfinite(array)) and np.all(array >= 1) and np.all(array == np.round(array))):
        raise ConfigError(f"pool_size must be integers >= 1, got {value!r}")
    return array.astype(np.int64)


def _accuracy(sensitivity: ArrayLike, specificity: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``(Se, Sp)`` as arrays; ConfigError unless both are in [0, 1] and ``Se + Sp > 1``."""
    se = _probabilities("sensitivity", sensitivity)
    sp = _probabilities("specificity", specificity)
    if not np.all(se + sp > 1):
        raise ConfigError(
            "sensitivity + specificity must be > 1 (an informative test), got "
            f"sensitivity={sensitivity!r}, specificity={specificity!r}"
        )
    return se, sp


def _out(value: np.ndarray) -> float | np.ndarray:
    return float(value) if np.ndim(value) == 0 else value


# --- test model -----------------------------------------------------------------------------------
def result_positive_probability(
    pool_positive: ArrayLike, sensitivity: ArrayLike, specificity: ArrayLike
) -> np.ndarray:
    """``P(Z = 1)`` for a pool whose true status is ``pool_positive``: ``Se`` or ``1 - Sp``.

    The single place where the test model lives: the simulator (:func:`pooled_test_outcomes`)
    and the exact enumeration (:func:`individual_epsilon_enumerated`) both use it.
    """
    return np.where(
        np.asarray(pool_positive, dtype=bool), sensitivity, 1.0 - np.asarray(specificity)
    )


def positive_probability(
    prevalence: ArrayLike, pool_size: ArrayLike, sensitivity: ArrayLike, specificity: ArrayLike
) -> float | np.ndarray:
    """``pi = P(Z = 1) = Se - r (1 - p)^c`` for a pool of ``c`` iid Bernoulli(p) members."""
    p = _probabilities("prevalence", prevalence)
    c = _pool_sizes(pool_size)
    se, sp = _accuracy(sensitivity, specificity)
    return _out(se - (se + sp - 1.0) * (1.0 - p) ** c)


def outcome_probabilities(
    prevalence: ArrayLike, pool_size: ArrayLike, sensitivity: ArrayLike, specificity: ArrayLike
) -> np.ndarray:
    """One member's output law with the other ``c - 1`` marginalised (closed form).

    Returns
    -------
    ndarray, shape broadcast(...) + (2, 2)
        ``P[..., x, z] = P(Z = z | X = x)``, rows sum to 1. ``P(Z=1 | x=1) = Se`` and
        ``P(Z=1 | x=0) = Se - q r`` with ``q = (1 - p)^(c - 1)``.
    """
    p = _probabilities("prevalence", prevalence)
    c = _pool_sizes(pool_size)
    se, sp = _accuracy(sensitivity, specificity)
    q = (1.0 - p) ** (c - 1)
    se, q, r = np.broadcast_arrays(se, q, se + sp - 1.0)
    yes = np.stack([se - q * r, se], axis=-1)  # index x
    return np.stack([1.0 - yes, yes], axis=-1)


# --- privacy of one person ------------------------------------------------------------------------
def _log_ratio_max(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """``max over the last axis of |ln(first / second)|``; 0/0 (impossible outcome) counts 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(np.log(first) - np.log(second))
    ratio = np.where((first == 0) & (second == 0), 0.0, ratio)
    return ratio.max(axis=-1)


def individual_epsilon(
    prevalence: ArrayLike, pool_size: ArrayLike, sensitivity: ArrayLike, specificity: ArrayLike
) -> float | np.ndarray:
    """One person's privacy loss from one pooled test, others marginalised (closed form).

    ``epsilon = max(ln(Se / (Se - q r)), ln((1 - Se + q r) / (1 - Se)))`` with
    ``q = (1 - p)^(c - 1)``, ``r = Se + Sp - 1`` (both log ratios are >= 0 since ``r > 0``;
    evaluated with ``log1p`` for accuracy). ``c = 1`` gives the unpooled test,
    :func:`worst_case_epsilon`; for ``c >= 2`` and ``p > 0`` the loss is strictly smaller and
    decreases in both ``p`` and ``c``.

    Threat model (read before quoting the number). Neighbouring relation: the person's status
    changes; released: the pool's test result (to the analyst). The guarantee holds against
    an adversary who knows ``p`` but NOT the other members' statuses (iid Bernoulli(p) to
    them, independent of anything else they see). It is NOT worst-case differential privacy:
    an adversary who knows the others are negative faces :func:`worst_case_epsilon`; one who
    knows another member is positive learns nothing (the pool is positive anyway). Repeated
    tests that share members are not covered by adding these losses (see the module notes).

    Parameters
    ----------
    prevalence : array_like, values in [0, 1]
        ``p``, the adversary's prior on each other member.
    pool_size : array_like of int >= 1
        ``c``.
    sensitivity, specificity : array_like, values in [0, 1], ``Se + Sp > 1``
        Of the test, or the effective values after randomized response
        (:func:`effective_accuracy`).

    Returns
    -------
    float or ndarray (broadcast shape)
        epsilon in nats, >= 0; ``inf`` if ``Se = 1`` (a negative result then proves x = 0).
    """
    p = _probabilities("prevalence", prevalence)
    c = _pool_sizes(pool_size)
    se, sp = _accuracy(sensitivity, specificity)
    qr = (1.0 - p) ** (c - 1) * (se + sp - 1.0)
    with np.errstate(divide="ignore"):
        positive = -np.log1p(-qr / se)  # z = 1: ln(Se / (Se - q r))
        negative = np.log1p(qr / (1.0 - se))  # z = 0: ln((1 - Se + q r) / (1 - Se))
    return _out(np.maximum(positive, negative))


def enumerated_outcome_probabilities(
    prevalence: float, pool_size: int, sensitivity: float, specificity: float
) -> np.ndarray:
    """One member's output law by exact enumeration of the other members' statuses.

    Sums ``P(z | x) = sum_s P(s) P(z | pool status = x or any(s))`` over all ``2^(c - 1)``
    status vectors ``s`` of the others (``P(s) = p^|s| (1 - p)^(c - 1 - |s|)``), with the same
    test model as the simulator (:func:`result_positive_probability`). Independent of the
    closed form (:func:`outcome_probabilities`); scalars only, ``c <= MAX_ENUMERATED_POOL``.

    Returns
    -------
    ndarray, shape (2, 2)
        ``P[x, z]``.
    """
    p = float(_probabilities("prevalence", prevalence))
    c = require_count("pool_size", pool_size)
    if c > MAX_ENUMERATED_POOL:
        raise ConfigError(f"pool_size must be <= {MAX_ENUMERATED_POOL} to enumerate, got {c}")
    se, sp = (float(v) for v in _accuracy(sensitivity, specificity))
    others = (np.arange(2 ** (c - 1))[:, None] >> np.arange(c - 1)) & 1  # (2^(c-1), c-1)
    positives = others.sum(axis=1)
    weight = p**positives * (1.0 - p) ** (c - 1 - positives)
    law = np.empty((2, 2))
    for x in (0, 1):
        yes = result_positive_probability((positives > 0) | bool(x), se, sp)
        no = np.where((positives > 0) | bool(x), 1.0 - se, sp)  # summed apart: no cancellation
        law[x] = weight @ no, weight @ yes
    return law


def epsilon_of_law(law: ArrayLike) -> float:
    """``max_z |ln P[1, z] / P[0, z]|`` of a binary-input law ``P[x, z]`` (0/0 counts 0)."""
    law = np.asarray(law, dtype=float)
    return float(_log_ratio_max(law[1], law[0]))


def individual_epsilon_enumerated(
    prevalence: float, pool_size: int, sensitivity: float, specificity: float
) -> float:
    """:func:`individual_epsilon` by exact enumeration over the ``2^(c-1)`` statuses of the others.

    :func:`epsilon_of_law` of :func:`enumerated_outcome_probabilities`. Same threat model as
    :func:`individual_epsilon`.
    """
    return epsilon_of_law(
        enumerated_outcome_probabilities(prevalence, pool_size, sensitivity, specificity)
    )


def repeated_pool_epsilon(
    prevalence: float,
    pool_size: int,
    n_tests: int,
    sensitivity: float,
    specificity: float,
) -> float:
    """One person's loss when the SAME pool (same other members) is tested ``n_tests`` times.

    The ``T`` results are independent given the pool's status, which is positive with
    probability 1 if ``x = 1`` and ``1 - q`` if ``x = 0`` (``q = (1-p)^(c-1)``); with ``m``
    positive results::

        P(m | x=1) ∝ Se^m (1-Se)^(T-m)
        P(m | x=0) ∝ (1-q) Se^m (1-Se)^(T-m) + q (1-Sp)^m Sp^(T-m)

    and the loss is the max over ``m`` of ``|ln ratio|``. Because the unknown others are the
    same in every test, this can exceed ``T * individual_epsilon`` (e.g. ``p = 0.05``,
    ``c = 2``, Se/Sp = 0.85/0.75, ``T = 2``: 3.17 > 3.14): the distributional losses do not
    compose by addition when tests share members. It never exceeds ``T *``
    :func:`worst_case_epsilon`. Same threat model as :func:`individual_epsilon`.
    """
    p = float(_probabilities("prevalence", prevalence))
    c = require_count("pool_size", pool_size)
    t = require_count("n_tests", n_tests)
    se, sp = (float(v) for v in _accuracy(sensitivity, specificity))
    q = (1.0 - p) ** (c - 1)
    m = np.arange(t + 1)
    with np.errstate(divide="ignore"):
        positive = m * np.log(se) + (t - m) * np.log1p(-se)
        negative = m * np.log1p(-sp) + (t - m) * np.log(sp)
        mixed = np.logaddexp(np.log1p(-q) + positive if q < 1 else -np.inf, np.log(q) + negative)
    return epsilon_of_law(np.exp(np.stack([mixed, positive])))


def worst_case_epsilon(sensitivity: ArrayLike, specificity: ArrayLike) -> float | np.ndarray:
    """Worst-case (true) DP of one pooled test: the unpooled test's loss, for every ``c``.

    ``max(|ln(Se / (1 - Sp))|, |ln(Sp / (1 - Se))|)``: the adversary knows the other members
    are negative, so the pool's status is the person's. This is the issue's ``c = 1`` formula;
    without the absolute values it is only right for ``Se + Sp >= 1`` (for ``Se + Sp < 1``
    both logs are negative), so the absolute values are kept. Neighbouring relation: one
    person's status changes, everything else fixed and known.
    """
    se, sp = np.broadcast_arrays(
        _probabilities("sensitivity", sensitivity), _probabilities("specificity", specificity)
    )
    law1 = np.stack([1.0 - se, se], axis=-1)
    law0 = np.stack([sp, 1.0 - sp], axis=-1)
    return _out(_log_ratio_max(law1, law0))


def crossover_prevalence(
    pool_size: ArrayLike, sensitivity: ArrayLike, specificity: ArrayLike
) -> float | np.ndarray:
    """Prevalence ``p_crit`` where the worst outcome switches from ``Z = 1`` to ``Z = 0``.

    The two likelihood ratios ``1/beta = Se / (Se - q r)`` (``Z = 1``) and
    ``alpha = 1 + q r / (1 - Se)`` (``Z = 0``) both increase with ``q = (1 - p)^(c - 1)`` and
    are equal at ``q* = (2 Se - 1) / r``. ``Z = 1`` is the worst outcome iff ``q > q*``, i.e.
    ``p < p_crit = 1 - (q*)^(1/(c - 1))``. ``q* < 1`` iff ``Sp > Se``; so for ``Sp <= Se``
    (or ``c = 1``) ``p_crit = 0`` whenever ``Z = 0`` is worst at ``q = 1``; for ``Se <= 1/2``
    (``q* <= 0``) ``Z = 1`` is worst for every ``p < 1`` and ``p_crit = 1``.

    Returns
    -------
    float or ndarray
        ``p_crit`` in [0, 1]; for ``c = 1``: 1 if ``Sp > Se`` (``Z = 1`` always worst) else 0.
    """
    c = _pool_sizes(pool_size)
    se, sp = _accuracy(sensitivity, specificity)
    q_star = (2.0 * se - 1.0) / (se + sp - 1.0)
    exponent = 1.0 / np.maximum(c - 1, 1)
    with np.errstate(invalid="ignore"):
        inner = 1.0 - np.clip(q_star, 0.0, 1.0) ** exponent
    p_crit = np.where(c == 1, np.where(q_star < 1.0, 1.0, 0.0), inner)
    return _out(p_crit)


def piecewise_epsilon(
    prevalence: ArrayLike, pool_size: ArrayLike, sensitivity: ArrayLike, specificity: ArrayLike
) -> float | np.ndarray:
    """The seed's piecewise theorem ("DP of sample pooling"), in its corrected form.

    ``exp(epsilon) = alpha`` if ``Sp <= Se``; if ``Sp > Se``: ``1/beta`` for ``p < p_crit``
    and ``alpha`` for ``p >= p_crit`` (:func:`crossover_prevalence`), with
    ``alpha = (1 - Se + q r) / (1 - Se)`` and ``beta = (Se - q r) / Se``, ``q = (1-p)^(c-1)``.

    Differences from the seed's slide as transcribed (checked against
    :func:`individual_epsilon` and :func:`individual_epsilon_enumerated` in the tests):

    * the slide writes ``2 Sp - 1`` where ``r = Se + Sp - 1`` belongs (they agree only when
      ``Se = Sp``);
    * it has a third piece ``1/alpha`` above a second critical prevalence: ``alpha >= 1``, so
      ``ln(1/alpha) <= 0`` can never be the maximum of ``|ln ratio|``; with ``r > 0`` both
      ratios are monotone in ``q`` and cross once, so there are only two pieces;
    * "``p = p_crit,2`` gives the lowest alpha": epsilon decreases monotonically in ``p`` (and
      in ``c``), reaching 0 at ``p = 1``; there is no interior minimum.

    The seed's "DP optimality" (pooling is strictly more private than not, for every
    ``p > 0`` and ``c >= 2``) holds in the threat model of :func:`individual_epsilon`.
    """
    p = _probabilities("prevalence", prevalence)
    c = _pool_sizes(pool_size)
    se, sp = _accuracy(sensitivity, specificity)
    q = (1.0 - p) ** (c - 1)
    r = se + sp - 1.0
    with np.errstate(divide="ignore"):
        alpha = np.log1p(q * r / (1.0 - se))
        inverse_beta = -np.log1p(-q * r / se)
    p_crit = crossover_prevalence(c, se, sp)
    # c = 1: q = 1 for every p, so compare through q* rather than p
    positive_worst = np.where(c == 1, p_crit == 1.0, p < p_crit)
    return _out(np.where((sp > se) & positive_worst, inverse_beta, alpha))


# --- randomized response on the result ------------------------------------------------------------
def effective_accuracy(
    sensitivity: ArrayLike, specificity: ArrayLike, response: RandomizedResponse
) -> tuple[float | np.ndarray, float | np.ndarray]:
    """``(Se', Sp')`` of a test whose result goes through randomized response ``response``.

    ``Se' = Se P(1|1) + (1 - Se) P(1|0)`` and ``Sp' = Sp (1 - P(1|0)) + (1 - Sp) (1 - P(1|1))``
    with ``P(1|b)`` the response's probability of answering 1 to bit ``b``; ``r' = r (P(1|1) -
    P(1|0))``. For the keep form with probability ``t``: ``Se' = t Se + (1-t)(1-Se)``. The
    released value is the response's answer (to the analyst); the worst-case epsilon of the
    chain is at most ``response.epsilon`` (post-processing of any input).
    """
    se, sp = _accuracy(sensitivity, specificity)
    yes1, yes0 = response.p_yes_given_yes, response.p_yes_given_no
    return _out(se * yes1 + (1.0 - se) * yes0), _out(sp * (1.0 - yes0) + (1.0 - sp) * (1.0 - yes1))


# --- estimation -----------------------------------------------------------------------------------
def pooled_mle(
    positive_fraction: ArrayLike,
    pool_size: ArrayLike,
    sensitivity: ArrayLike,
    specificity: ArrayLike,
) -> float | np.ndarray:
    """MLE of the prevalence from the fraction of positive pools.

    ``p_hat = 1 - ((Se - Z_bar) / r)^(1/c)``, ``r = Se + Sp - 1``, with the base clipped to
    [0, 1] so ``p_hat`` is in [0, 1] (``Z_bar <= 1 - Sp`` gives 0, ``Z_bar >= Se`` gives 1):
    the MLE under the constraint ``p`` in [0, 1]. Asymptotically unbiased and normal with the
    variance :func:`pooled_variance`.

    Parameters
    ----------
    positive_fraction : array_like, values in [0, 1]
        ``Z_bar``, the fraction of the ``J`` pools that tested positive.
    pool_size : array_like of int >= 1
    sensitivity, specificity : array_like, ``Se + Sp > 1``

    Returns
    -------
    float or ndarray (broadcast shape)
    """
    z_bar = _probabilities("positive_fraction", positive_fraction)
    c = _pool_sizes(pool_size)
    se, sp = _accuracy(sensitivity, specificity)
    # The two ends are decided by comparisons, not by the rounded quotient: (Se - Z_bar) / r
    # can round to 1 - 2^-53 at Z_bar = 1 - Sp exactly, which would give a p_hat of 1e-16.
    base = np.clip((se - z_bar) / (se + sp - 1.0), 0.0, 1.0)
    base = np.where(z_bar <= 1.0 - sp, 1.0, np.where(z_bar >= se, 0.0, base))
    return _out(1.0 - base ** (1.0 / c))


def pooled_variance(
    prevalence: ArrayLike,
    pool_size: ArrayLike,
    n_pools: ArrayLike,
    sensitivity: ArrayLike,
    specificity: ArrayLike,
) -> float | np.ndarray:
    """The seed's asymptotic variance of :func:`pooled_mle` with ``J = n_pools`` pools.

    ``sigma^2(p, c, J) = (Se - r (1-p)^c) (r (1-p)^c + 1 - Se) / (J c^2 r^2 (1-p)^(2(c-1)))``
    = ``pi (1 - pi) / (J (d pi / d p)^2)`` (delta method). ``inf`` at ``p = 1`` for ``c >= 2``.
    """
    p = _probabilities("prevalence", prevalence)
    c = _pool_sizes(pool_size)
    j = np.asarray(n_pools, dtype=float)
    if not (np.all(np.isfinite(j)) and np.all(j >= 1)):
        raise ConfigError(f"n_pools must be >= 1, got {n_pools!r}")
    se, sp = _accuracy(sensitivity, specificity)
    r = se + sp - 1.0
    negative = (1.0 - p) ** c
    with np.errstate(divide="ignore"):
        slope_sq = (c * r) ** 2 * (1.0 - p) ** (2 * (c - 1))
        return _out((se - r * negative) * (r * negative + 1.0 - se) / (j * slope_sq))


def _variance_ratio(p: float, c: int, se: float, sp: float, hold: str) -> float:
    """``sigma^2(p, c) / sigma^2(p, 1)`` at equal J (``hold="pools"``) or equal N = cJ."""
    j_pooled = 1.0 if hold == "pools" else 1.0 / c
    return (
        float(pooled_variance(p, c, 1.0, se, sp))
        / j_pooled
        / float(pooled_variance(p, 1, 1.0, se, sp))
    )


def variance_ratio(
    prevalence: ArrayLike,
    pool_size: ArrayLike,
    sensitivity: ArrayLike,
    specificity: ArrayLike,
    hold: str = "pools",
) -> float | np.ndarray:
    """``sigma^2(p, c) / sigma^2(p, 1)``: below 1 where pooling estimates ``p`` better.

    ``hold="pools"``: both designs test ``J`` pools (pooling tests ``c`` times more people);
    ``hold="individuals"``: both cover ``N`` people (``N / c`` pools against ``N`` tests).
    """
    if hold not in HOLDS:
        raise ConfigError(f"hold must be one of {HOLDS}, got {hold!r}")
    c = _pool_sizes(pool_size)
    ratio = np.asarray(pooled_variance(prevalence, c, 1.0, sensitivity, specificity)) / np.asarray(
        pooled_variance(prevalence, 1, 1.0, sensitivity, specificity)
    )
    return _out(ratio * (c if hold == "individuals" else 1))


def max_prevalence(
    pool_size: ArrayLike,
    sensitivity: ArrayLike,
    specificity: ArrayLike,
    hold: str = "pools",
) -> float | np.ndarray:
    """``p_max``: pooling in size ``c`` has lower variance than ``c = 1`` exactly for p < p_max.

    Solves ``variance_ratio(p) = 1`` (:func:`variance_ratio`) by a scan of 2,001 points for
    the first sign change, refined with Brent's method (to 1e-13). At ``p = 0`` the ratio is
    ``1/c^2`` (pools) or ``1/c`` (individuals) and it grows without bound as ``p -> 1``.

    Returns
    -------
    float or ndarray (broadcast shape)
        ``p_max`` in (0, 1); ``nan`` for ``c = 1`` (nothing to compare).
    """
    if hold not in HOLDS:
        raise ConfigError(f"hold must be one of {HOLDS}, got {hold!r}")
    c = _pool_sizes(pool_size)
    se, sp = _accuracy(sensitivity, specificity)
    c, se, sp = np.broadcast_arrays(c, se, sp)
    grid = np.linspace(0.0, 1.0, 2001)[:-1]
    out = np.empty(c.shape)
    for index in np.ndindex(c.shape):
        size, s_e, s_p = int(c[index]), float(se[index]), float(sp[index])
        if size == 1:
            out[index] = math.nan
            continue
        excess = np.log(variance_ratio(grid, size, s_e, s_p, hold))
        above = np.flatnonzero(excess >= 0)
        if above.size == 0:  # still below 1 at p = 0.9995: the root is in the last step
            low, high = grid[-1], 1.0 - 1e-15
        else:
            low, high = grid[above[0] - 1], grid[above[0]]
        out[index] = brentq(
            lambda p, s=size, a=s_e, b=s_p: math.log(_variance_ratio(p, s, a, b, hold)),
            low,
            high,
            xtol=1e-13,
        )
    return _out(out)


# --- simulation -----------------------------------------------------------------------------------
def pool_status(statuses: ArrayLike, pool_size: int) -> np.ndarray:
    """True status of each pool: consecutive blocks of ``c`` people, positive if any member is.

    Parameters
    ----------
    statuses : array_like of 0/1 or bool, shape (..., N), ``N`` a multiple of ``c``
    pool_size : int

    Returns
    -------
    ndarray of bool, shape (..., N // c)
    """
    c = require_count("pool_size", pool_size)
    array = np.asarray(statuses)
    if array.dtype != bool and not np.isin(array, (0, 1)).all():
        raise ConfigError("statuses must contain only 0/1 or booleans")
    if array.ndim == 0 or array.shape[-1] % c:
        raise ConfigError(
            f"the last axis of statuses must be a multiple of pool_size={c}, got {array.shape}"
        )
    return np.asarray(array.astype(bool).reshape(*array.shape[:-1], -1, c).any(axis=-1))


def pooled_test_outcomes(
    statuses: ArrayLike,
    pool_size: int,
    sensitivity: float,
    specificity: float,
    *,
    rng: np.random.Generator,
    response: RandomizedResponse | None = None,
) -> np.ndarray:
    """Simulated test result of every pool (vectorised over leading axes).

    Each block of ``c`` consecutive people is one pool (shuffle beforehand for random
    pools); a pool tests positive with probability ``Se`` if any member is positive, else
    ``1 - Sp``. With ``response``, each result is then passed through randomized response,
    which is the same law as testing with :func:`effective_accuracy`'s ``(Se', Sp')``.
    Released: the result (or its randomized answer) per pool, to the analyst. Privacy of one
    member: :func:`individual_epsilon` (distributional) or :func:`worst_case_epsilon`.

    Parameters
    ----------
    statuses : array_like of 0/1 or bool, shape (..., N), ``N`` a multiple of ``pool_size``
    pool_size : int
    sensitivity, specificity : float, ``Se + Sp > 1``
    rng : numpy.random.Generator
    response : RandomizedResponse, optional

    Returns
    -------
    ndarray of bool, shape (..., N // pool_size)
    """
    se, sp = (float(v) for v in _accuracy(sensitivity, specificity))
    positive = pool_status(statuses, pool_size)
    outcomes = rng.random(positive.shape) < result_positive_probability(positive, se, sp)
    return outcomes if response is None else response.sample(outcomes, rng=rng)


def simulate_pooled_mle(
    prevalence: float,
    pool_size: int,
    n_pools: int,
    sensitivity: float,
    specificity: float,
    *,
    n_repetitions: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``n_repetitions`` independent MLEs, each from ``J = n_pools`` pools.

    Draws the number of positive pools from its exact law ``Binomial(J, pi)`` (pools are
    independent, each positive with probability :func:`positive_probability`), which is fast
    for the figures; :func:`pooled_test_outcomes` simulates the people themselves.

    Returns
    -------
    ndarray, shape (n_repetitions,)
    """
    n_pools = require_count("n_pools", n_pools)
    n_repetitions = require_count("n_repetitions", n_repetitions)
    pi = positive_probability(prevalence, pool_size, sensitivity, specificity)
    positives = rng.binomial(n_pools, pi, n_repetitions)
    return np.asarray(pooled_mle(positives / n_pools, pool_size, sensitivity, specificity))


# --- data of the figures --------------------------------------------------------------------------
def epsilon_rows(
    prevalences: Sequence[float] | np.ndarray,
    pool_sizes: Sequence[int],
    sensitivity: float,
    specificity: float,
) -> list[dict[str, float]]:
    """Rows of the seed's "maximum differential privacy bound": epsilon vs p per c.

    One row per ``(c, p)``: ``pool_size, prevalence, sensitivity, specificity, epsilon``
    (:func:`individual_epsilon`), ``worst_case_epsilon``, ``crossover_prevalence``.
    """
    p = np.asarray(prevalences, dtype=float)
    rows = []
    for c in pool_sizes:
        eps = np.atleast_1d(individual_epsilon(p, c, sensitivity, specificity))
        crossover = float(crossover_prevalence(c, sensitivity, specificity))
        for prevalence, value in zip(p, eps, strict=True):
            rows.append(
                {
                    "pool_size": int(c),
                    "prevalence": float(prevalence),
                    "sensitivity": float(sensitivity),
                    "specificity": float(specificity),
                    "epsilon": float(value),
                    "worst_case_epsilon": float(worst_case_epsilon(sensitivity, specificity)),
                    "crossover_prevalence": crossover,
                }
            )
    return rows


def variance_ratio_rows(
    pool_sizes: Sequence[int],
    prevalences: Sequence[float],
    sensitivity: float,
    specificity: float,
    hold: str = "pools",
) -> list[dict[str, float | str]]:
    """Variance ratio ``sigma^2(p, c) / sigma^2(p, 1)`` vs c per p, with ``p_max(c)``.

    One row per ``(c, p)``: ``pool_size, prevalence, hold, variance_ratio, max_prevalence``
    and ``pooling_better`` (``p < p_max``, equivalently ratio < 1).
    """
    rows: list[dict[str, float | str]] = []
    for c in pool_sizes:
        p_max = float(max_prevalence(c, sensitivity, specificity, hold=hold))
        for p in prevalences:
            ratio = float(variance_ratio(p, c, sensitivity, specificity, hold=hold))
            rows.append(
                {
                    "pool_size": int(c),
                    "prevalence": float(p),
                    "hold": hold,
                    "sensitivity": float(sensitivity),
                    "specificity": float(specificity),
                    "variance_ratio": ratio,
                    "max_prevalence": p_max,
                    "pooling_better": bool(ratio < 1.0),
                }
            )
    return rows


def privacy_utility_rows(
    pool_sizes: Sequence[int],
    prevalence: float,
    n_individuals: int,
    sensitivity: float,
    specificity: float,
    keep_probabilities: Sequence[float] = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7),
    *,
    n_repetitions: int = 0,
    rng: np.random.Generator | None = None,
) -> list[dict[str, float]]:
    """Privacy vs utility per c: epsilon against the MSE of ``p_hat``, N people fixed.

    For each pool size ``c`` (``J = N // c`` pools) and each randomized-response keep
    probability ``t`` on the result (``t = 1``: none), the effective ``(Se', Sp')``, the
    distributional ``epsilon`` (:func:`individual_epsilon`), the ``worst_case_epsilon``, the
    asymptotic variance (:func:`pooled_variance`) and, if ``n_repetitions > 0``, the simulated
    MSE and bias of the clipped MLE (:func:`simulate_pooled_mle`; needs ``rng``).
    """
    rows = []
    for c in pool_sizes:
        n_pools = n_individuals // int(c)
        require_count("n_individuals // pool_size", n_pools)
        for t in keep_probabilities:
            t = require_probability("keep probability", t, low=0.5, low_open=True)
            if t < 1.0:
                response = RandomizedResponse.keep(t)
                se, sp = map(float, effective_accuracy(sensitivity, specificity, response))
            else:
                se, sp = sensitivity, specificity
            row = {
                "pool_size": int(c),
                "keep_probability": float(t),
                "prevalence": float(prevalence),
                "n_pools": n_pools,
                "effective_sensitivity": float(se),
                "effective_specificity": float(sp),
                "epsilon": float(individual_epsilon(prevalence, c, se, sp)),
                "worst_case_epsilon": float(worst_case_epsilon(se, sp)),
                "asymptotic_variance": float(pooled_variance(prevalence, c, n_pools, se, sp)),
            }
            if n_repetitions:
                if rng is None:
                    raise ConfigError("rng is required when n_repetitions > 0")
                estimates = simulate_pooled_mle(
                    prevalence, int(c), n_pools, se, sp, n_repetitions=n_repetitions, rng=rng
                )
                row["mse"] = float(np.mean((estimates - prevalence) ** 2))
                row["bias"] = float(np.mean(estimates) - prevalence)
            rows.append(row)
    return rows
