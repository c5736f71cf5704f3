"""Empirical privacy audit: lower-bound the epsilon a mechanism really has.

The framework every audit of p2pdp uses (:class:`AuditResult`), the threshold test of additive
noise, and the exact audit of the clamped noisy count. The workloads audit their own mechanisms
with it (:mod:`p2pdp.tasks.prevalence.audit`, :mod:`p2pdp.tasks.pooled_testing.audit`,
:mod:`p2pdp.privacy.posterior_sampling.audit`); ``p2pdp audit`` runs them all
(:mod:`p2pdp.experiments.audit.table`).

Additive-noise mechanisms (threshold test)
------------------------------------------
Fix neighbouring inputs ``D, D'`` whose released vectors differ by exactly the sensitivity:
``f(D) = 0`` and ``f(D') = Delta_2 * u`` with ``u = (1, ..., 1) / sqrt(d)`` (for coordinate
noise calibrated on L1 this is the worst direction, the other mechanisms are rotation
invariant). Draw ``N`` outputs ``x`` on each side and compute, with ``v = Delta_2 * u``, three
statistics: the projection ``x . u`` (the Gaussian log-likelihood ratio), ``sum_i |x_i| -
|x_i - v_i|`` (coordinate Laplace's) and ``||x|| - ||x - v||`` (vector Laplace's). Split each
side into a calibration half and an evaluation half. On the calibration half pick the statistic
``s`` and threshold ``t`` (among quantiles of the pooled calibration values) that maximise the
bound below; on the evaluation half count ``FPR = P(s > t | D)`` and ``FNR = P(s <= t | D')``
for that one fixed test and take one-sided Clopper-Pearson
upper bounds ``FPR_U, FNR_U``, each at level ``1 - (1 - confidence)/2`` so that both hold
together with probability ``confidence`` (union bound). Any (epsilon, delta)-DP mechanism
satisfies ``1 - FNR <= e^eps FPR + delta`` and ``1 - FPR <= e^eps FNR + delta`` for this fixed
test, hence with probability ``>= confidence``::

    eps_LB = max(ln((1 - delta - FNR_U) / FPR_U), ln((1 - delta - FPR_U) / FNR_U)) <= epsilon

``passed = eps_LB <= epsilon``. The seed's L2-calibrated coordinate Laplace (``seed-laplace``)
and a vector Laplace with an Exponential instead of a Gamma(d) norm (the known bug) are negative
controls: the audit must flag them, which shows the test has power.

Discrete mechanisms (exact)
---------------------------
Randomized response (keep form and the seed's two-coin form) and the clamped noisy count have
known output distributions, so their epsilon is computed exactly as the worst log likelihood
ratio over outputs and neighbouring inputs (:func:`exact_noisy_count_epsilon`).

Whole runs (one-run audit)
--------------------------
Steinke, Nasr & Jagielski (2023), "Privacy auditing with one (1) training run": ``m`` canaries,
each independently in one of two neighbouring states with probability 1/2, go through one run
(or several independent runs: each canary still affects one run only); an adversary sees the
run's output, guesses the state of ``r`` of them and abstains on the others. If the run is
``(epsilon, delta)``-DP towards each canary, ``v`` or more correct guesses happen with
probability at most the p-value of :func:`one_run_p_value` (their Theorem 5.2, computed as in
their Appendix D); :func:`one_run_epsilon_lower_bound` inverts it: the largest ``epsilon`` that
the observed ``v`` rejects at the given confidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats
from scipy.special import ndtr, ndtri

from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import require_count, require_positive, require_probability

#: Fewest outputs per side a threshold test takes (half of them calibrate the threshold).
MIN_AUDIT_SAMPLES = 8
_N_THRESHOLDS = 512  # candidate thresholds per statistic scanned on the calibration half
#: Test statistics of the threshold test (columns of :func:`audit_statistics`).
STATISTICS: tuple[str, ...] = ("projection", "l1-difference", "l2-difference")
STATISTIC_DECIMALS = 9  # statistics are rounded to this many decimals (see audit_statistics)

#: ``sample_noise(size=N, rng=generator) -> ndarray (N, dim)``
NoiseSampler = Callable[..., NDArray[np.float64]]


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditResult:
    """One row of the audit.

    Attributes
    ----------
    mechanism : str
    epsilon, delta : float
        Claimed (nominal) guarantee.
    eps_lb : float
        Lower bound on the true epsilon (threshold test) or the exact epsilon (discrete).
    passed : bool
        ``eps_lb <= epsilon`` (up to 1e-9 relative, for the exact computations).
    expected_pass : bool
        False for the negative controls in :data:`p2pdp.experiments.audit.table.EXPECTED_TO_FAIL`.
    guarantee_epsilon : float
        Epsilon the mechanism really guarantees (``sqrt(d) * eps`` for seed-laplace, inf for
        none).
    method : str
        ``"threshold-test"`` or ``"exact"``.
    dim, n_samples : int or None
        Dimension and outputs per side (threshold test only).
    statistic : str or None
        Test statistic chosen on the calibration half, one of :data:`STATISTICS`.
    threshold, fpr_upper, fnr_upper : float or None
        Chosen threshold and the Clopper-Pearson upper bounds (threshold test only).
    canaries : int or None
        Canaries of a one-run audit (:func:`one_run_epsilon_lower_bound`).
    confidence : float or None
        Probability with which ``eps_lb`` is a valid lower bound (statistical audits).
    """

    mechanism: str
    epsilon: float
    delta: float
    eps_lb: float
    passed: bool
    expected_pass: bool
    guarantee_epsilon: float
    method: str
    dim: int | None = None
    n_samples: int | None = None
    statistic: str | None = None
    threshold: float | None = None
    fpr_upper: float | None = None
    fnr_upper: float | None = None
    canaries: int | None = None
    confidence: float | None = None

    @classmethod
    def exact(
        cls,
        mechanism: str,
        epsilon: float,
        exact: float,
        *,
        expected_pass: bool,
        guarantee_epsilon: float | None = None,
        dim: int | None = None,
        n_samples: int | None = None,
    ) -> AuditResult:
        """The row of an exact computation (``delta = 0``, method ``"exact"``).

        Parameters
        ----------
        mechanism : str
            The audited mechanism's name.
        epsilon : float
            Its claimed epsilon.
        exact : float
            Its exact epsilon (the row's ``eps_lb``); it passes when ``exact <= epsilon`` up
            to 1e-9 relative (the computation's rounding).
        expected_pass : bool
            False for a negative control.
        guarantee_epsilon : float or None
            What the mechanism really guarantees; None: ``exact``.
        dim, n_samples : int or None
            The grid's dimension and size, where the computation runs on one.

        Returns
        -------
        AuditResult
        """
        return cls(
            mechanism=mechanism,
            epsilon=epsilon,
            delta=0.0,
            eps_lb=exact,
            passed=exact <= epsilon * (1 + 1e-9),
            expected_pass=expected_pass,
            guarantee_epsilon=exact if guarantee_epsilon is None else guarantee_epsilon,
            method="exact",
            dim=dim,
            n_samples=n_samples,
        )

    @property
    def as_expected(self) -> bool:
        """Whether the outcome matches the expectation (pass for DP, fail for the controls)."""
        return self.passed == self.expected_pass

    def as_dict(self) -> dict[str, object]:
        """JSON-ready dict of all fields plus ``as_expected``.

        An infinite ``guarantee_epsilon`` (no guarantee) becomes None (JSON null).
        """
        row = asdict(self)
        if math.isinf(self.guarantee_epsilon):
            row["guarantee_epsilon"] = None
        row["as_expected"] = self.as_expected
        return row


def clopper_pearson_upper(successes: ArrayLike, trials: int, level: float) -> NDArray[np.float64]:
    """One-sided Clopper-Pearson upper confidence bound on a binomial proportion.

    Parameters
    ----------
    successes : ndarray of int, any shape
        Counts in [0, trials].
    trials : int
    level : float
        Confidence level in (0, 1), e.g. 0.975.

    Returns
    -------
    ndarray of float, same shape, in (0, 1]
    """
    counts = np.asarray(successes)
    upper = stats.beta.ppf(level, counts + 1, np.maximum(trials - counts, 1))
    return np.where(counts >= trials, 1.0, upper)


def _epsilon_bound(
    fpr: NDArray[np.float64], fnr: NDArray[np.float64], delta: float
) -> NDArray[np.float64]:
    """``max(ln((1-delta-fnr)/fpr), ln((1-delta-fpr)/fnr))``, floored at 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.maximum(np.log((1 - delta - fnr) / fpr), np.log((1 - delta - fpr) / fnr))
    return np.maximum(np.nan_to_num(bound, nan=0.0, neginf=0.0), 0.0)


def _error_bounds(
    null: NDArray[np.float64],
    alternative: NDArray[np.float64],
    thresholds: NDArray[np.float64],
    level: float,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Clopper-Pearson upper bounds on ``P(null > t)`` and ``P(alternative <= t)`` per ``t``."""
    false_pos = null.size - np.searchsorted(np.sort(null), thresholds, side="right")
    false_neg = np.searchsorted(np.sort(alternative), thresholds, side="right")
    return (
        clopper_pearson_upper(false_pos, null.size, level),
        clopper_pearson_upper(false_neg, alternative.size, level),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ThresholdTest:
    """Outcome of :func:`threshold_test`.

    Attributes
    ----------
    eps_lb : float
        Lower bound on epsilon, >= 0, valid with the requested confidence.
    statistic : int
        Column of the statistic chosen on the calibration half.
    threshold : float
        The test decides ``D'`` when the statistic exceeds it.
    fpr_upper, fnr_upper : float
        Clopper-Pearson upper bounds on the evaluation half.
    """

    eps_lb: float
    statistic: int
    threshold: float
    fpr_upper: float
    fnr_upper: float


def threshold_test(
    null: NDArray[np.float64],
    alternative: NDArray[np.float64],
    *,
    delta: float,
    confidence: float = 0.95,
) -> ThresholdTest:
    """Lower bound on epsilon from the best threshold test on one of several statistics.

    Parameters
    ----------
    null, alternative : ndarray, shape (N,) or (N, S), and (M,) or (M, S)
        ``S`` test statistics on outputs of ``M(D)`` and ``M(D')``, larger meaning "more like
        ``D'``". Each side is split in halves: the first half chooses the statistic and the
        threshold, the second half evaluates that single test.
    delta : float
        The mechanism's delta, in [0, 1).
    confidence : float
        Joint confidence of the two Clopper-Pearson bounds, in (0, 1).
    """
    delta = require_probability("delta", delta, high_open=True)
    confidence = require_probability("confidence", confidence, low_open=True, high_open=True)
    level = 1 - (1 - confidence) / 2
    null = np.asarray(null, float).reshape(len(null), -1)
    alternative = np.asarray(alternative, float).reshape(len(alternative), -1)
    if null.shape[1] != alternative.shape[1]:
        raise ConfigError(
            f"null and alternative must have the same statistics, got shapes {null.shape} and "
            f"{alternative.shape}"
        )
    require_count("len(null)", len(null), minimum=4)
    require_count("len(alternative)", len(alternative), minimum=4)
    null_cal, null_eval = np.array_split(null, 2)
    alt_cal, alt_eval = np.array_split(alternative, 2)
    best = (-1.0, 0, 0.0)  # (calibration bound, statistic, threshold)
    for column in range(null.shape[1]):
        pooled = np.concatenate([null_cal[:, column], alt_cal[:, column]])
        candidates = np.quantile(pooled, np.linspace(0, 1, _N_THRESHOLDS))
        bounds = _error_bounds(null_cal[:, column], alt_cal[:, column], candidates, level)
        scores = _epsilon_bound(*bounds, delta)
        if scores.max() > best[0]:
            best = (float(scores.max()), column, float(candidates[np.argmax(scores)]))
    _, column, threshold = best
    fpr_u, fnr_u = _error_bounds(
        null_eval[:, column], alt_eval[:, column], np.array([threshold]), level
    )
    return ThresholdTest(
        eps_lb=float(_epsilon_bound(fpr_u, fnr_u, delta)[0]),
        statistic=column,
        threshold=threshold,
        fpr_upper=float(fpr_u[0]),
        fnr_upper=float(fnr_u[0]),
    )


def gdp_threshold_test(
    null: NDArray[np.float64], alternative: NDArray[np.float64], *, confidence: float = 0.95
) -> tuple[float, ThresholdTest]:
    """Lower bound on ``mu`` of a claim of ``mu``-GDP from one threshold test, and the test.

    A ``mu``-GDP mechanism's tests satisfy ``FNR >= Phi(Phi^-1(1 - FPR) - mu)`` (Dong, Roth &
    Su 2019), so with Clopper-Pearson upper bounds that hold together with probability
    ``confidence``, ``mu >= Phi^-1(1 - FPR_U) - Phi^-1(FNR_U)``. As :func:`threshold_test`:
    the first half of each side picks the threshold (of the 1-D statistic, larger meaning
    ``D'``) that maximises this bound, the second half evaluates it. For independent outputs
    of a Gaussian mechanism this bound tends to the true ``mu`` (central thresholds are
    estimated well), where the ``(epsilon, delta)`` bound of :func:`threshold_test` needs the
    tails. Returns ``(mu_lb >= 0, the test)``; ``eps_lb`` of the test is 0 (unused).
    """
    confidence = require_probability("confidence", confidence, low_open=True, high_open=True)
    level = 1 - (1 - confidence) / 2
    null, alternative = np.asarray(null, float).ravel(), np.asarray(alternative, float).ravel()
    require_count("len(null)", len(null), minimum=4)
    require_count("len(alternative)", len(alternative), minimum=4)
    null_cal, null_eval = np.array_split(null, 2)
    alt_cal, alt_eval = np.array_split(alternative, 2)

    def bound(fpr: NDArray[np.float64], fnr: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.maximum(ndtri(1 - fpr) - ndtri(fnr), 0.0)

    candidates = np.quantile(np.concatenate([null_cal, alt_cal]), np.linspace(0, 1, _N_THRESHOLDS))
    scores = bound(*_error_bounds(null_cal, alt_cal, candidates, level))
    threshold = float(candidates[np.argmax(scores)])
    fpr_u, fnr_u = _error_bounds(null_eval, alt_eval, np.array([threshold]), level)
    test = ThresholdTest(
        eps_lb=0.0, statistic=0, threshold=threshold, fpr_upper=float(fpr_u[0]),
        fnr_upper=float(fnr_u[0]),
    )  # fmt: skip
    return float(bound(fpr_u, fnr_u)[0]), test


def audit_statistics(
    outputs: NDArray[np.float64], shift: NDArray[np.float64]
) -> NDArray[np.float64]:
    """The test statistics of :data:`STATISTICS` for outputs ``x`` and neighbour shift ``v``.

    Parameters
    ----------
    outputs : ndarray, shape (N, d)
    shift : ndarray, shape (d,)
        ``f(D') - f(D)`` (with ``f(D) = 0``).

    Returns
    -------
    ndarray, shape (N, 3)
        ``x . v / ||v||``, ``sum_i |x_i| - |x_i - v_i|``, ``||x|| - ||x - v||``, rounded to
        :data:`STATISTIC_DECIMALS` decimals. The rounding keeps the test on the mathematics:
        without it the threshold scan finds rounding-error patterns (e.g. the atom of
        ``|x| - |x - v|`` at ``-||v||_1`` is smeared over a few ulps differently for ``x`` and
        ``v + noise``) and reports a spurious epsilon (Mironov 2012-style floating-point
        leakage, which this audit does not address).
    """
    statistics = np.column_stack(
        [
            outputs @ (shift / np.linalg.norm(shift)),
            (np.abs(outputs) - np.abs(outputs - shift)).sum(axis=1),
            np.linalg.norm(outputs, axis=1) - np.linalg.norm(outputs - shift, axis=1),
        ]
    )
    return np.round(statistics, STATISTIC_DECIMALS)


def audit_additive_noise(
    sample_noise: NoiseSampler,
    *,
    sensitivity: float,
    dim: int,
    delta: float,
    n_samples: int,
    rng: np.random.Generator,
    confidence: float = 0.95,
) -> ThresholdTest:
    """Threshold-test audit of ``x -> x + noise`` on neighbours ``0`` and ``sensitivity * u``.

    Parameters
    ----------
    sample_noise : callable ``(*, size, rng) -> ndarray (size, dim)``
        The noise the mechanism adds (calibrated to ``sensitivity`` in ``dim`` dimensions).
    sensitivity : float
        L2 distance between the two neighbouring released vectors.
    dim : int
    delta : float
        The mechanism's delta.
    n_samples : int
        Outputs drawn per side (>= :data:`MIN_AUDIT_SAMPLES`; the threshold test uses half
        of them for calibration).
    rng : numpy.random.Generator
    confidence : float

    Returns
    -------
    ThresholdTest
        ``statistic`` indexes :data:`STATISTICS` (:func:`audit_statistics`).
    """
    sensitivity = require_positive("sensitivity", sensitivity)
    dim = require_count("dim", dim)
    n_samples = require_count("n_samples", n_samples, minimum=MIN_AUDIT_SAMPLES)
    shift = np.full(dim, sensitivity / math.sqrt(dim))
    null = audit_statistics(sample_noise(size=n_samples, rng=rng), shift)
    alternative = audit_statistics(shift + sample_noise(size=n_samples, rng=rng), shift)
    return threshold_test(null, alternative, delta=delta, confidence=confidence)


def exponential_norm_vector_laplace(epsilon: float, sensitivity: float, dim: int) -> NoiseSampler:
    """Negative control: vector Laplace with ``||eta|| ~ Exponential(sensitivity/epsilon)``.

    The known bug (the norm must be ``Gamma(d, sensitivity/epsilon)``): about ``d`` times too
    little noise. Used only by the audit.
    """

    def sample(*, size: int, rng: np.random.Generator) -> NDArray[np.float64]:
        direction = rng.standard_normal((size, dim))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        return rng.exponential(sensitivity / epsilon, (size, 1)) * direction

    return sample


def exact_noisy_count_epsilon(epsilon: float, n: int) -> float:
    """Exact epsilon of :func:`~p2pdp.privacy.counting.noisy_count` on ``n`` records.

    For every pair of neighbouring counts ``(c, c+1)``, ``c = 0..n-1``, and both orders, the
    worst log ratio of the output laws of ``clip(c + Laplace(1/epsilon), 0, n)``: the atoms at
    0 and n (Laplace cdf / sf) and the density on (0, n) evaluated on a grid of step 1/8 (the
    log density ratio is piecewise linear in the output with kinks at the integers, so its
    supremum is attained on the grid).
    """
    epsilon = require_positive("epsilon", epsilon)
    n = require_count("n", n)
    scale = 1.0 / epsilon
    inner = np.linspace(0, n, 8 * n + 1)[1:-1]
    counts = np.arange(n + 1)[:, None]
    log_law = np.hstack(
        [
            stats.laplace.logcdf(-counts, scale=scale),
            stats.laplace.logpdf(inner - counts, scale=scale),
            stats.laplace.logsf(n - counts, scale=scale),
        ]
    )
    return float(np.abs(np.diff(log_law, axis=0)).max())


def one_run_p_value(
    *, canaries: int, guesses: int, correct: int, epsilon: float, delta: float
) -> float:
    """Probability of ``correct`` or more right guesses if the run is ``(epsilon, delta)``-DP.

    Steinke, Nasr & Jagielski (2023), Theorem 5.2 as computed in their Appendix D: with
    ``q = e^eps / (1 + e^eps)`` (the accuracy of ``epsilon``-randomized response),
    ``beta = P[Binomial(r, q) >= v]``, ``alpha = max_{1 <= i <= v} P[v - i <= Binomial(r, q)
    < v] / i``, the p-value is ``min(1, beta + 2 m delta alpha)``.

    Parameters
    ----------
    canaries : int
        ``m``: canaries whose state was drawn (each state with probability 1/2).
    guesses : int
        ``r <= m``: canaries guessed (the others abstained on).
    correct : int
        ``v <= r``: right guesses.
    epsilon : float
        ``>= 0``.
    delta : float
        In [0, 1].
    """
    m = require_count("canaries", canaries)
    r = require_count("guesses", guesses, minimum=0)
    v = require_count("correct", correct, minimum=0)
    if not v <= r <= m:
        raise ConfigError(f"need correct <= guesses <= canaries, got {v}, {r}, {m}")
    if not epsilon >= 0:
        raise ConfigError(f"epsilon must be >= 0, got {epsilon!r}")
    delta = require_probability("delta", delta)
    q = float(1.0 / (1.0 + np.exp(-epsilon)))
    beta = float(stats.binom.sf(v - 1, r, q))
    alpha = 0.0
    if v > 0:
        below = np.cumsum(stats.binom.pmf(v - np.arange(1, v + 1), r, q))
        alpha = float((below / np.arange(1, v + 1)).max())
    return min(1.0, beta + 2.0 * m * delta * alpha)


def one_run_epsilon_lower_bound(
    *, canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> float:
    """Largest ``epsilon`` that ``correct`` right guesses out of ``guesses`` reject.

    The bisection of Steinke et al.'s Appendix D on :func:`one_run_p_value` (which increases
    with ``epsilon``): with probability ``>= confidence`` over the canaries' states and the
    run, a run that is ``(epsilon, delta)``-DP towards each canary gives a bound ``<=
    epsilon``. Returns 0 when even ``epsilon = 0`` is not rejected; the bisection stops at
    relative precision 1e-6 on its lower end, so the bound is never above the exact root.
    """
    confidence = require_probability("confidence", confidence, low_open=True, high_open=True)
    level = 1.0 - confidence

    def rejects(epsilon: float) -> bool:
        p_value = one_run_p_value(
            canaries=canaries, guesses=guesses, correct=correct, epsilon=epsilon, delta=delta
        )
        return p_value < level

    return _largest_rejected(rejects)


def _largest_rejected(rejects: Callable[[float], bool]) -> float:
    """The largest parameter >= 0 that ``rejects`` (decreasing: true up to a root), by
    doubling and bisection to relative precision 1e-6, returning the lower end (never above
    the root); 0 when not even 0 is rejected."""
    if not rejects(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while rejects(high):
        low, high = high, 2.0 * high
    while high - low > 1e-6 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if rejects(middle) else (low, middle)
    return low


def _gdp_one_run_excess(
    mu: float, *, canaries: int, guesses: int, correct: int, level: float
) -> float:
    """Positive when ``correct`` right guesses out of ``guesses`` reject ``mu``-GDP at ``level``.

    The recursion of Mahloujifar, Melis & Chaudhuri (2024) for an ``f``-DP run, ``f`` the
    Gaussian trade-off: with ``r = level v / m`` and ``h = level (k - v) / m``, for ``i = v - 1``
    down to 0, ``h' = max(h, Phi(Phi^-1(r) - mu))`` and ``r <- min(1, r + i / (k - i) (h' - h))``
    (stopping once ``h`` stays put); the run is rejected when ``r + h > k / m``.
    """
    m, k, v = canaries, guesses, correct
    r, h = level * v / m, level * (k - v) / m
    for i in range(v - 1, -1, -1):
        raised = max(h, float(ndtr(ndtri(r) - mu)))
        if raised == h:
            break
        r, h = min(r + i / (k - i) * (raised - h), 1.0), raised
    return r + h - k / m


def one_run_gdp_lower_bound(
    *, canaries: int, guesses: int, correct: int, confidence: float = 0.95
) -> float:
    """Largest ``mu`` such that a ``mu``-GDP run is rejected by ``correct`` right guesses.

    The one-run audit of an ``f``-DP claim (Mahloujifar, Melis & Chaudhuri 2024, "Auditing
    f-differential privacy in one run"), for the Gaussian trade-off ``f = G_mu``: the same
    experiment as :func:`one_run_epsilon_lower_bound` (``m`` canaries in random states, ``r``
    guesses, ``v`` right), but the claim tested is the whole trade-off curve of ``mu``-GDP,
    not one ``(epsilon, delta)`` point of it, which is far more powerful against Gaussian
    noise (a 25% noise shortfall at epsilon = 2 is caught with 10^6 canaries, where the
    ``(epsilon, delta)`` bound stays below the claim). With probability ``>= confidence`` a
    run that is ``mu``-GDP towards each canary gives a bound ``<= mu``
    (tests/experiments/test_iterative_audit.py checks it against simulated Gaussian
    guessers). Returns 0 when not even ``mu = 0`` is rejected; the bisection stops at relative
    precision 1e-6 on its lower end, so the bound is never above the exact root. Use it only for
    a claim that is ``mu``-GDP (the ``gdp`` accountant's); convert with
    :func:`p2pdp.privacy.gdp.gdp_epsilon`.
    """
    m = require_count("canaries", canaries)
    k = require_count("guesses", guesses)
    v = require_count("correct", correct, minimum=0)
    if not v <= k <= m:
        raise ConfigError(f"need correct <= guesses <= canaries, got {v}, {k}, {m}")
    confidence = require_probability("confidence", confidence, low_open=True, high_open=True)

    def rejects(mu: float) -> bool:
        excess = _gdp_one_run_excess(mu, canaries=m, guesses=k, correct=v, level=1 - confidence)
        return excess > 0

    return _largest_rejected(rejects)


def one_run_guesses(
    scores: NDArray[np.float64], *, guesses_per_side: int
) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """The canaries guessed in state +1 (the ``k`` highest scores) and in state -1 (the ``k``
    lowest), ``k = guesses_per_side``; the others are abstained on. Ties are broken by index
    (a stable sort), so the guesses depend on the scores only."""
    k = require_count("guesses_per_side", guesses_per_side)
    order = np.argsort(np.asarray(scores, float), kind="stable")
    if 2 * k > order.size:
        raise ConfigError(f"guesses_per_side must be <= {order.size // 2}, got {k}")
    return order[-k:], order[:k]
