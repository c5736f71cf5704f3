"""Prevalence of a binary outcome under differential privacy (Hatlelid et al. 2021): the maths.

Central model (a curator per group)
-----------------------------------
A group's curator holds ``n`` 0/1 records (``n`` public) and releases the count of 1-records
plus ``Laplace(1/epsilon)`` noise, clamped to [0, n] (:func:`noisy_counts`, the vectorised
:func:`~p2pdp.privacy.counting.noisy_count`). Neighbouring relation: *replace* one record (the
count
moves by at most 1: sensitivity 1); released: the clamped noisy count, to every peer that
receives it (publication is post-processing). Guarantee: epsilon-DP per release for each
record of the group; releases over the same records compose (basic composition), releases
over disjoint records do not add up (parallel composition).

A receiving peer updates a ``Beta(a, b)`` posterior (Jeffreys ``Beta(1/2, 1/2)`` by default):

* ``naive`` (the seed): treat the noisy count as the true one, ``Beta(a + c~, b + n - c~)``
  (:func:`beta_posterior`). Its credible intervals ignore the Laplace noise and are too
  narrow when ``1/epsilon`` is comparable to the binomial spread ``sqrt(n p (1-p))``.
* ``exact``: the posterior of the prevalence given the NOISY count, marginalising the noise
  over the unknown true count ``k``: ``P(theta | c~) = sum_k w_k Beta(theta; a + k, b + n - k)``
  with ``w_k ∝ P(c~ | k) BetaBinomial(k; n, a, b)`` (:func:`channel_posterior`,
  :class:`BetaMixture`). Exact (a finite mixture), valid for any release channel whose law
  given ``k`` is known: the clamped Laplace count (:func:`laplace_count_log_likelihood`),
  randomized response (:func:`rr_count_log_likelihood`), and several releases over disjoint
  records (:func:`combine_log_likelihoods`). Its intervals have exactly nominal coverage when
  the prevalence is drawn from the prior, whatever epsilon: the default.
* ``widened``: a Beta moment-matched to the naive mean and the naive variance plus the noise
  variance ``2 / (epsilon^2 (a + b + n)^2)`` (:func:`widened_posterior`): a cheap
  approximation, tested but not exact.

The seed's two policies for data arriving in ``Q`` batches (:func:`accumulate_policy`,
:func:`requery_policy`): accumulate one noisy count per new batch at ``epsilon`` (each record
is released once) into one posterior, or re-query the cumulative count at ``epsilon / Q`` each
time from the original prior. After batch ``t`` the count's noise variance is ``2 t /
epsilon^2`` (accumulate) against ``2 Q^2 / epsilon^2`` (re-query): accumulation is better at
every step, not only early on (:func:`policy_noise_variance`).

Local model (no curator)
------------------------
Each record's owner answers through randomized response (:class:`~p2pdp.privacy.mechanisms.
RandomizedResponse`: keep form, or the seed's two-coin form :func:`two_coin_response`);
neighbouring relation: one respondent's bit changes; released: every noisy answer, to
everyone. The debiased proportion feeds the same Beta posterior (``debiased`` pseudo-counts,
:func:`rr_debiased_posterior`, naive like above) or the exact channel posterior.

Error scalings (:func:`central_error_variance`, :func:`local_error_variance`): on top of the
sampling variance ``p (1 - p) / n``, the central estimate pays ``2 / (epsilon n)^2`` (error
``~ 1/(epsilon n)``), the local one ``~ 1 / (epsilon^2 n)`` for small epsilon (error
``~ 1/(epsilon sqrt n)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats
from scipy.special import betainc, betaln, expit, gammaln, logsumexp

from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import require_count, require_positive, require_probability
from p2pdp.privacy.counting import RandomizedResponse

#: Jeffreys prior ``Beta(1/2, 1/2)``, the default (as in Hatlelid et al. 2021).
JEFFREYS: tuple[float, float] = (0.5, 0.5)
#: Ways to turn a noisy release into a credible interval (see the module notes).
INTERVAL_METHODS: tuple[str, ...] = ("naive", "widened", "exact")
#: The seed's policies for repeated releases.
POLICIES: tuple[str, ...] = ("accumulate", "requery")


def _prior(prior: tuple[float, float]) -> tuple[float, float]:
    a, b = prior
    return require_positive("prior a", a), require_positive("prior b", b)


def _level(level: float) -> float:
    return require_probability("level", level, low_open=True, high_open=True)


# --- central release ---------------------------------------------------------------------------
def noisy_counts(
    true_counts: ArrayLike, n: ArrayLike, epsilon: float, *, rng: np.random.Generator
) -> np.ndarray:
    """Many groups' :func:`~p2pdp.privacy.counting.noisy_count` at once.

    ``clip(k + Laplace(1/epsilon), 0, n)`` elementwise; the same law as ``noisy_count`` (and
    the same numbers from the same generator state, one Laplace draw per group in order).
    Neighbouring relation: replace one record of one group; released: each group's clamped
    noisy count; epsilon-DP for every record.

    Parameters
    ----------
    true_counts : array_like of int, any shape
        Number of 1-records ``k`` of each group, in [0, n].
    n : array_like of int, broadcastable
        Records per group (public).
    epsilon : float
        > 0, per release.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of float, shape of ``true_counts`` (broadcast with ``n``)
    """
    epsilon = require_positive("epsilon", epsilon)
    k = np.asarray(true_counts)
    size = np.asarray(n)
    if not (np.all(k >= 0) and np.all(k <= size) and np.all(k == np.round(k))):
        raise ConfigError(f"true_counts must be integers in [0, n], got {true_counts!r}")
    k, size = np.broadcast_arrays(k, size)
    noise = rng.laplace(0.0, 1.0 / epsilon, k.shape)
    return np.clip(k + noise, 0, size)


def beta_posterior(
    counts: ArrayLike, n: ArrayLike, *, prior: tuple[float, float] = JEFFREYS
) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`~p2pdp.privacy.counting.beta_bernoulli_update`: ``(a + c, b + n - c)``.

    The *naive* posterior when ``counts`` are noisy: the noise is ignored.

    Returns
    -------
    (ndarray, ndarray)
        Posterior Beta parameters, broadcast shape of ``counts`` and ``n``.
    """
    a, b = _prior(prior)
    c = np.asarray(counts, dtype=float)
    size = np.asarray(n, dtype=float)
    if not (np.all(c >= 0) and np.all(c <= size)):
        raise ConfigError(f"counts must be in [0, n], got {counts!r}")
    return a + c + 0.0 * size, b + size - c


def credible_interval(
    a: ArrayLike, b: ArrayLike, level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Equal-tailed ``level`` credible interval of ``Beta(a, b)`` (scipy.stats.beta), vectorised."""
    tail = (1.0 - _level(level)) / 2.0
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.asarray(stats.beta.ppf(tail, a, b)), np.asarray(stats.beta.isf(tail, a, b))


def widened_posterior(
    counts: ArrayLike,
    n: ArrayLike,
    noise_variance: ArrayLike,
    *,
    prior: tuple[float, float] = JEFFREYS,
) -> tuple[np.ndarray, np.ndarray]:
    """Beta with the naive mean and a variance widened by the noise on the count.

    Mean ``m = (a + c) / (a + b + n)``; variance ``m (1 - m) / (a + b + n + 1) +
    noise_variance / (a + b + n)^2`` (``2 Q / epsilon^2`` for ``Q`` Laplace releases summed);
    returned as ``Beta(m nu, (1 - m) nu)`` with ``nu = m (1 - m) / variance - 1``, floored at
    the prior's ``a + b`` (never less concentrated than the prior; without the floor, very
    noisy counts give U-shaped Betas). Approximate: matches two moments, not the shape, and
    undercovers when the noise is comparable to ``n`` (the exact posterior does not).
    """
    a_post, b_post = beta_posterior(counts, n, prior=prior)
    total = a_post + b_post
    mean = a_post / total
    variance = mean * (1 - mean) / (total + 1) + np.asarray(noise_variance) / total**2
    nu = np.maximum(mean * (1 - mean) / variance - 1.0, sum(_prior(prior)))
    return mean * nu, (1 - mean) * nu


def laplace_count_log_likelihood(released: ArrayLike, n: int, epsilon: float) -> np.ndarray:
    """``log P(c~ | k)`` for ``k = 0..n`` of the clamped Laplace count (up to a constant per c~).

    The law of ``clip(k + Laplace(1/epsilon), 0, n)``: an atom ``P(k + L <= 0)`` at 0, an atom
    ``P(k + L >= n)`` at n, density ``(epsilon/2) exp(-epsilon |c~ - k|)`` in between.

    Returns
    -------
    ndarray, shape released.shape + (n + 1,)
    """
    n = require_count("n", n, minimum=0)
    epsilon = require_positive("epsilon", epsilon)
    c = np.asarray(released, dtype=float)[..., None]
    k = np.arange(n + 1)
    scale = 1.0 / epsilon
    inner = stats.laplace.logpdf(c - k, scale=scale)
    at_zero = stats.laplace.logcdf(-k, scale=scale) + 0.0 * c
    at_n = stats.laplace.logsf(n - k, scale=scale) + 0.0 * c
    return np.where(c <= 0, at_zero, np.where(c >= n, at_n, inner))


def rr_count_log_likelihood(yes_count: int, n: int, response: RandomizedResponse) -> np.ndarray:
    """``log P(Y = yes_count | k)`` for ``k = 0..n`` when ``n`` bits go through ``response``.

    ``Y`` = (answers 1 among the ``k`` 1-bits, ``Binomial(k, P(1|1))``) + (among the ``n - k``
    0-bits, ``Binomial(n - k, P(1|0))``): a convolution, summed exactly in log space.
    ``O(n * yes_count)``.

    Returns
    -------
    ndarray, shape (n + 1,)
    """
    n = require_count("n", n, minimum=0)
    yes = require_count("yes_count", yes_count, minimum=0)
    if yes > n:
        raise ConfigError(f"yes_count must be <= n={n}, got {yes_count!r}")
    k = np.arange(n + 1)[:, None]
    i = np.arange(yes + 1)[None, :]  # answers 1 coming from 1-bits
    with np.errstate(divide="ignore"):
        terms = stats.binom.logpmf(i, k, response.p_yes_given_yes) + stats.binom.logpmf(
            yes - i, n - k, response.p_yes_given_no
        )
    return logsumexp(terms, axis=1)


def combine_log_likelihoods(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Likelihood of the TOTAL count from releases over disjoint record sets.

    Release ``q`` covers ``n_q`` records with count ``k_q`` and has ``log P(c~_q | k_q)``
    (shape ``(n_q + 1,)``). Given theta the ``k_q`` are independent binomials, so the
    posterior depends on the releases through ``g(K) = sum_{k_1+..+k_Q=K} prod_q
    C(n_q, k_q) P(c~_q | k_q) / C(N, K)``, ``N = sum n_q``: a convolution, done here in
    linear space after scaling each part by its maximum.

    Returns
    -------
    ndarray, shape (N + 1,)
        ``log g(K)`` (up to a constant), usable as the ``log_likelihood`` of
        :func:`channel_posterior` with ``n = N``.
    """
    if not parts:
        raise ConfigError("parts must hold at least one release, got none")
    total = np.ones(1)  # the empty sum: K = 0 with probability 1
    log_offset = 0.0
    for part in parts:
        part = np.asarray(part, dtype=float)
        size = part.size - 1
        weighted = part + _log_binomial(size)
        peak = float(weighted.max())
        total = np.convolve(total, np.exp(weighted - peak))
        log_offset += peak
        scale = total.max()
        total /= scale
        log_offset += math.log(scale)
    with np.errstate(divide="ignore"):
        return np.log(total) + log_offset - _log_binomial(total.size - 1)


def _log_binomial(n: int) -> np.ndarray:
    k = np.arange(n + 1)
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class BetaMixture:
    """Posterior ``sum_k w_k Beta(a + k, b + n - k)`` over the latent true count ``k = 0..n``.

    Vectorised over leading axes of ``log_weights`` (one posterior per group or repetition).

    Attributes
    ----------
    a, b : float
        Prior parameters.
    n : int
        Number of records behind the release(s).
    log_weights : ndarray, shape (..., n + 1)
        Normalised log posterior probabilities of the true count ``k``.
    """

    a: float
    b: float
    n: int
    log_weights: np.ndarray

    def __post_init__(self) -> None:
        weights = np.asarray(self.log_weights, dtype=float)
        if weights.shape[-1:] != (self.n + 1,):
            raise ConfigError(
                f"log_weights must have a last axis of n + 1 = {self.n + 1}, got {weights.shape}"
            )
        object.__setattr__(self, "log_weights", weights)

    @property
    def weights(self) -> np.ndarray:
        """``w_k``, shape (..., n + 1), summing to 1."""
        return np.exp(self.log_weights)

    def mean(self) -> np.ndarray:
        """Posterior mean ``sum_k w_k (a + k) / (a + b + n)``, shape (...)."""
        k = np.arange(self.n + 1)
        return (self.weights @ (self.a + k)) / (self.a + self.b + self.n)

    def variance(self) -> np.ndarray:
        """Posterior variance (law of total variance over ``k``), shape (...)."""
        k = np.arange(self.n + 1)
        total = self.a + self.b + self.n
        means = (self.a + k) / total
        second = means * (self.a + k + 1) / (total + 1)
        return self.weights @ second - self.mean() ** 2

    def cdf(self, theta: ArrayLike) -> np.ndarray:
        """``P(prevalence <= theta)``; ``theta`` broadcast against the leading shape."""
        theta = np.asarray(theta, dtype=float)[..., None]
        keep = self._support()
        k = np.arange(self.n + 1)[keep]
        regularised = betainc(self.a + k, self.b + self.n - k, theta)
        return np.sum(self.weights[..., keep] * regularised, axis=-1)

    def pdf(self, theta: ArrayLike) -> np.ndarray:
        """Posterior density at ``theta`` in (0, 1); broadcast like :meth:`cdf`."""
        theta = np.asarray(theta, dtype=float)[..., None]
        keep = self._support()
        k = np.arange(self.n + 1)[keep]
        density = np.exp(stats.beta.logpdf(theta, self.a + k, self.b + self.n - k))
        return np.sum(self.weights[..., keep] * density, axis=-1)

    def interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Equal-tailed credible interval (:meth:`quantile` of both tails)."""
        tail = (1.0 - _level(level)) / 2.0
        return self.quantile(tail), self.quantile(1.0 - tail)

    def quantile(self, probability: float) -> np.ndarray:
        """``theta`` with ``cdf(theta) = probability``, shape (...), vectorised.

        The cdf of every posterior on a fixed grid (uniform plus logit-spaced near 0 and 1;
        one ``betainc`` table shared by all posteriors, then a matrix product) brackets the
        root; safeguarded Newton steps (bisection whenever a step leaves the bracket) refine
        it to ``|cdf - probability| < 1e-9`` in the tested cases.
        """
        probability = require_probability("probability", probability, low_open=True, high_open=True)
        lead = self.log_weights.shape[:-1]
        keep = self._support()
        k = np.arange(self.n + 1)[keep]
        weights = self.weights.reshape(-1, self.n + 1)[:, keep]
        grid = np.unique(
            np.concatenate([np.linspace(0.0, 1.0, 257), expit(np.linspace(-27.0, 27.0, 109))])
        )
        table = betainc(self.a + k[:, None], self.b + self.n - k[:, None], grid[None, :])
        cdf_grid = weights @ table  # (G, T), from 0 at theta = 0 to 1 at theta = 1
        rows = np.arange(weights.shape[0])
        above = np.clip((cdf_grid < probability).sum(axis=1), 1, grid.size - 1)
        low, high = grid[above - 1], grid[above]
        f_low, f_high = cdf_grid[rows, above - 1], cdf_grid[rows, above]
        fraction = np.clip((probability - f_low) / np.maximum(f_high - f_low, 1e-300), 0, 1)
        theta = low + fraction * (high - low)
        posterior = BetaMixture(a=self.a, b=self.b, n=self.n, log_weights=self.log_weights)
        flat = posterior.log_weights.reshape(-1, self.n + 1)
        flat_posterior = BetaMixture(a=self.a, b=self.b, n=self.n, log_weights=flat)
        for _ in range(12):
            excess = flat_posterior.cdf(theta) - probability
            low = np.where(excess < 0, theta, low)
            high = np.where(excess < 0, high, theta)
            with np.errstate(divide="ignore", invalid="ignore"):
                step = theta - excess / flat_posterior.pdf(theta)
            inside = (step >= low) & (step <= high)
            theta = np.where(inside, step, 0.5 * (low + high))
            if np.all(np.abs(excess) < 1e-12):
                break
        return theta.reshape(lead)

    def _support(self) -> np.ndarray:
        """Counts whose weight exceeds e^-40 times the largest in some posterior."""
        flat = self.log_weights.reshape(-1, self.n + 1)
        return (flat - flat.max(axis=1, keepdims=True) > -40).any(axis=0)


def channel_posterior(
    log_likelihood: ArrayLike, n: int, *, prior: tuple[float, float] = JEFFREYS
) -> BetaMixture:
    """Exact posterior of the prevalence from a release whose law given the true count is known.

    ``w_k ∝ P(release | k) C(n, k) B(a + k, b + n - k)`` (the Beta-Binomial marginal of ``k``).

    Parameters
    ----------
    log_likelihood : array_like, shape (..., n + 1)
        ``log P(release | k)`` (from :func:`laplace_count_log_likelihood`,
        :func:`rr_count_log_likelihood` or :func:`combine_log_likelihoods`).
    n : int
    prior : (float, float)
    """
    a, b = _prior(prior)
    n = require_count("n", n, minimum=0)
    k = np.arange(n + 1)
    log_marginal = _log_binomial(n) + betaln(a + k, b + n - k)
    joint = np.asarray(log_likelihood, dtype=float) + log_marginal
    return BetaMixture(a=a, b=b, n=n, log_weights=joint - logsumexp(joint, axis=-1, keepdims=True))


def laplace_posterior(
    released: ArrayLike, n: int, epsilon: float, *, prior: tuple[float, float] = JEFFREYS
) -> BetaMixture:
    """Exact posterior given clamped noisy counts ``released`` (one per group, same ``n``)."""
    return channel_posterior(laplace_count_log_likelihood(released, n, epsilon), n, prior=prior)


def posterior_interval(
    released: ArrayLike,
    n: int,
    epsilon: float,
    *,
    method: str = "exact",
    level: float = 0.95,
    prior: tuple[float, float] = JEFFREYS,
) -> tuple[np.ndarray, np.ndarray]:
    """Credible interval of the prevalence from clamped noisy counts, by ``method``.

    ``naive`` ignores the noise; ``widened`` adds its variance (``2 / epsilon^2``);
    ``exact`` marginalises it (see the module notes). Vectorised over ``released``.
    """
    if method == "naive":
        return credible_interval(*beta_posterior(released, n, prior=prior), level)
    if method == "widened":
        noise = 2.0 / require_positive("epsilon", epsilon) ** 2
        return credible_interval(*widened_posterior(released, n, noise, prior=prior), level)
    if method == "exact":
        return laplace_posterior(released, n, epsilon, prior=prior).interval(level)
    raise ConfigError(f"method must be one of {INTERVAL_METHODS}, got {method!r}")


# --- the seed's two policies ---------------------------------------------------------------------
def policy_noise_variance(n_queries: int, epsilon: float, policy: str) -> np.ndarray:
    """Variance of the noise on the count behind the posterior after each of ``Q`` batches.

    ``accumulate``: ``2 t / epsilon^2`` after batch ``t`` (t Laplace(1/epsilon) summed);
    ``requery``: ``2 Q^2 / epsilon^2`` at every step (one Laplace(Q/epsilon)). Unclamped.

    Returns
    -------
    ndarray, shape (Q,)
    """
    q = require_count("n_queries", n_queries)
    epsilon = require_positive("epsilon", epsilon)
    if policy == "accumulate":
        return 2.0 * np.arange(1, q + 1) / epsilon**2
    if policy == "requery":
        return np.full(q, 2.0 * q**2 / epsilon**2)
    raise ConfigError(f"policy must be one of {POLICIES}, got {policy!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyTrace:
    """Posterior after each batch, for ``R`` independent populations.

    Attributes
    ----------
    mean, low, high : ndarray, shape (R, Q)
        Posterior mean and credible interval after batch ``t``.
    released : ndarray, shape (R, Q)
        The clamped noisy counts released (accumulate: per batch; requery: cumulative).
    """

    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    released: np.ndarray


def _naive(method: str) -> bool:
    """Whether a policy's ``method`` is ``"naive"`` (else ``"exact"``; ConfigError if neither)."""
    if method not in ("naive", "exact"):
        raise ConfigError(f"method must be 'naive' or 'exact', got {method!r}")
    return method == "naive"


def _naive_trace(
    successes: np.ndarray,
    n_seen: np.ndarray,
    released: np.ndarray,
    prior: tuple[float, float],
    level: float,
) -> PolicyTrace:
    """The naive Beta posteriors that take the noisy counts ``successes`` (R, Q) of ``n_seen``
    (Q,) records as true ones."""
    a, b = beta_posterior(successes, n_seen, prior=prior)
    low, high = credible_interval(a, b, level)
    return PolicyTrace(mean=a / (a + b), low=low, high=high, released=released)


def accumulate_policy(
    batch_counts: ArrayLike,
    batch_size: int,
    epsilon: float,
    *,
    rng: np.random.Generator,
    method: str = "exact",
    level: float = 0.95,
    prior: tuple[float, float] = JEFFREYS,
) -> PolicyTrace:
    """The seed's chosen policy: one noisy count per new batch, all added into one posterior.

    Each batch holds ``batch_size`` new records and is released once at ``epsilon``
    (neighbouring relation: replace one record; every record is in exactly one release, so
    the whole stream is epsilon-DP by parallel composition). The posterior after batch ``t``
    combines releases ``1..t``: ``naive`` sums the noisy counts into the Beta; ``exact``
    convolves the releases' likelihoods (:func:`combine_log_likelihoods`).

    Parameters
    ----------
    batch_counts : array_like of int, shape (R, Q)
        True number of 1-records in each batch of each of ``R`` populations.
    batch_size : int
    epsilon : float
    rng : numpy.random.Generator
    method : {"naive", "exact"}
    """
    counts = np.atleast_2d(np.asarray(batch_counts))
    m = require_count("batch_size", batch_size)
    released = noisy_counts(counts, m, epsilon, rng=rng)
    rows, q = counts.shape
    n_seen = m * np.arange(1, q + 1)
    if _naive(method):
        return _naive_trace(np.cumsum(released, axis=1), n_seen, released, prior, level)
    mean, low, high = (np.empty((rows, q)) for _ in range(3))
    for t in range(q):
        parts = laplace_count_log_likelihood(released[:, : t + 1], m, epsilon)  # (R, t+1, m+1)
        combined = np.stack([combine_log_likelihoods(list(row)) for row in parts])
        posterior = channel_posterior(combined, int(n_seen[t]), prior=prior)
        mean[:, t] = posterior.mean()
        low[:, t], high[:, t] = posterior.interval(level)
    return PolicyTrace(mean=mean, low=low, high=high, released=released)


def requery_policy(
    batch_counts: ArrayLike,
    batch_size: int,
    epsilon: float,
    *,
    rng: np.random.Generator,
    method: str = "exact",
    level: float = 0.95,
    prior: tuple[float, float] = JEFFREYS,
) -> PolicyTrace:
    """The seed's alternative: after each batch re-query the cumulative count at ``epsilon/Q``.

    Every record is in up to ``Q`` releases (those after its batch), each ``epsilon/Q``-DP:
    ``epsilon``-DP in total by basic composition. The posterior after batch ``t`` starts from
    the prior and uses the latest release only (as in the seed). Shapes as in
    :func:`accumulate_policy`.
    """
    counts = np.atleast_2d(np.asarray(batch_counts))
    m = require_count("batch_size", batch_size)
    _, q = counts.shape
    per_query = require_positive("epsilon", epsilon) / q
    cumulative = np.cumsum(counts, axis=1)
    n_seen = m * np.arange(1, q + 1)
    released = noisy_counts(cumulative, n_seen, per_query, rng=rng)
    if _naive(method):
        return _naive_trace(released, n_seen, released, prior, level)
    mean, low, high = (np.empty(counts.shape) for _ in range(3))
    for t in range(q):
        posterior = laplace_posterior(released[:, t], int(n_seen[t]), per_query, prior=prior)
        mean[:, t] = posterior.mean()
        low[:, t], high[:, t] = posterior.interval(level)
    return PolicyTrace(mean=mean, low=low, high=high, released=released)


# --- local model: randomized response -------------------------------------------------------------
def two_coin_theta1(epsilon: float, theta2: float = 0.5) -> float:
    """The seed's two-coin randomized response: truth probability ``theta1`` for ``epsilon``.

    With probability ``theta1`` answer truthfully, else answer 1 with probability ``theta2``.
    Its exact epsilon is ``ln(1 + theta1 / ((1 - theta1) m))``, ``m = min(theta2, 1 - theta2)``
    (the worse of the two answers), so ``theta1 = m (e^eps - 1) / (1 + m (e^eps - 1))``.
    ``theta2 = 1/2`` is the keep form with ``p = (1 + theta1) / 2``. The seed's aim
    ``p(y | answer) = p(y)`` (answers carry no information) only holds at ``theta1 = 0``.
    """
    epsilon = require_positive("epsilon", epsilon)
    theta2 = require_probability("theta2", theta2, low_open=True, high_open=True)
    spread = min(theta2, 1.0 - theta2) * math.expm1(epsilon)
    return spread / (1.0 + spread)


def two_coin_response(epsilon: float, theta2: float = 0.5) -> RandomizedResponse:
    """:meth:`RandomizedResponse.forced` calibrated to ``epsilon`` (:func:`two_coin_theta1`)."""
    return RandomizedResponse.forced(two_coin_theta1(epsilon, theta2), theta2)


def rr_debiased_posterior(
    yes_counts: ArrayLike,
    n: ArrayLike,
    response: RandomizedResponse,
    *,
    prior: tuple[float, float] = JEFFREYS,
) -> tuple[np.ndarray, np.ndarray]:
    """Beta posterior fed with the debiased estimate as pseudo-counts (naive, vectorised).

    ``p~ = clip((Y/n - P(1|0)) / (P(1|1) - P(1|0)), 0, 1)``, then ``(a + n p~, b + n (1 - p~))``.
    Ignores that ``p~`` is noisier than ``n`` true records (its variance is
    ``response.estimator_variance``); :func:`channel_posterior` with
    :func:`rr_count_log_likelihood` is exact.
    """
    size = np.asarray(n, dtype=float)
    gap = response.p_yes_given_yes - response.p_yes_given_no
    estimate = np.clip((np.asarray(yes_counts) / size - response.p_yes_given_no) / gap, 0, 1)
    return beta_posterior(estimate * size, size, prior=prior)


# --- error scalings -------------------------------------------------------------------------------
def central_error_variance(prevalence: ArrayLike, n: ArrayLike, epsilon: ArrayLike) -> np.ndarray:
    """Variance of ``(k + Laplace(1/epsilon)) / n`` around ``p``: ``p(1-p)/n + 2/(epsilon n)^2``.

    Unclamped (clamping only reduces it). The privacy part ``2/(epsilon n)^2`` gives an error
    ``sqrt(2)/(epsilon n)``.
    """
    p, size, eps = (np.asarray(v, dtype=float) for v in (prevalence, n, epsilon))
    return p * (1 - p) / size + 2.0 / (eps * size) ** 2


def local_error_variance(prevalence: ArrayLike, n: ArrayLike, epsilon: ArrayLike) -> np.ndarray:
    """Variance of the debiased randomized-response estimate (keep form at ``epsilon``).

    ``q (1 - q) / (n g^2)``, ``g = tanh(epsilon/2)``, ``q = (1 - g)/2 + g p``; for small
    epsilon about ``1 / (epsilon^2 n)``: error ``~ 1/(epsilon sqrt n)``. Includes the sampling
    variance ``p (1 - p) / n`` (``q(1-q)/g^2 = p(1-p) + (1 - g^2)/(4 g^2)``).
    """
    p, size, eps = (np.asarray(v, dtype=float) for v in (prevalence, n, epsilon))
    keep = expit(eps)
    gap = 2.0 * keep - 1.0
    q = (1.0 - keep) + gap * p
    return q * (1.0 - q) / (size * gap**2)


# --- data of the figures ------------------------------------------------------------------------
def scaling_rows(
    sizes: Sequence[int],
    epsilons: Sequence[float],
    prevalence: float,
    *,
    n_repetitions: int,
    rng: np.random.Generator,
) -> list[dict[str, float | str]]:
    """Local vs central error against ``n`` on the same populations (rows for a figure).

    For each ``n`` and epsilon, ``n_repetitions`` populations of ``n`` Bernoulli(p) records;
    the central estimate is the clamped noisy count over ``n``, the local one the debiased
    randomized-response proportion (keep form at epsilon), the non-private one ``k / n``.
    Rows: ``model`` in {central, local, non-private}, ``n``, ``epsilon``, empirical ``rmse``
    against the prevalence and the formula's ``predicted_rmse``, and the privacy part alone:
    ``privacy_rmse``, the RMS distance to the non-private ``k / n`` of the same population, with
    its formula ``predicted_privacy_rmse`` (``sqrt(2)/(epsilon n)`` central, unclamped;
    ``sqrt(1 - g^2)/(2 g sqrt(n))`` local, ``g = tanh(epsilon/2)``).
    """
    p = require_probability("prevalence", prevalence)
    reps = require_count("n_repetitions", n_repetitions)
    rows: list[dict[str, float | str]] = []
    for n in sizes:
        n = require_count("n", n)
        records = rng.random((reps, n)) < p
        k = records.sum(axis=1)
        sampling = p * (1 - p) / n
        plain = k / n
        rows.append(_scaling_row("non-private", n, math.nan, plain, plain, p, sampling, sampling))
        for eps in epsilons:
            central = noisy_counts(k, n, eps, rng=rng) / n
            response = RandomizedResponse.from_epsilon(eps)
            yes = response.sample(records, rng=rng).sum(axis=1)
            local = (yes / n - response.p_yes_given_no) / (
                response.p_yes_given_yes - response.p_yes_given_no
            )
            central_variance = float(central_error_variance(p, n, eps))
            local_variance = float(local_error_variance(p, n, eps))
            rows.append(
                _scaling_row("central", n, eps, central, plain, p, central_variance, sampling)
            )
            rows.append(_scaling_row("local", n, eps, local, plain, p, local_variance, sampling))
    return rows


def _scaling_row(
    model: str,
    n: int,
    eps: float,
    estimate: np.ndarray,
    plain: np.ndarray,
    p: float,
    variance: float,
    sampling: float,
) -> dict:
    return {
        "model": model,
        "n": n,
        "epsilon": float(eps),
        "rmse": float(np.sqrt(np.mean((estimate - p) ** 2))),
        "predicted_rmse": float(np.sqrt(variance)),
        "privacy_rmse": float(np.sqrt(np.mean((estimate - plain) ** 2))),
        "predicted_privacy_rmse": float(np.sqrt(max(variance - sampling, 0.0))),
    }


def coverage_rows(
    n: int,
    epsilons: Sequence[float],
    *,
    n_repetitions: int,
    rng: np.random.Generator,
    level: float = 0.95,
    prior: tuple[float, float] = JEFFREYS,
    prevalence: float | None = None,
) -> list[dict[str, float | str]]:
    """Coverage and width of the credible intervals of each method, per epsilon.

    Each repetition draws a prevalence from the prior (``prevalence=None``: Bayesian
    coverage, exactly ``level`` for the exact posterior) or uses the fixed ``prevalence``
    (frequentist coverage), draws ``n`` records, releases one clamped noisy count and builds
    the interval with every method of :data:`INTERVAL_METHODS` (and ``non-private``, the
    Beta posterior of the true count). Rows: ``method, epsilon, coverage, mean_width``.
    """
    reps = require_count("n_repetitions", n_repetitions)
    a, b = _prior(prior)
    theta = rng.beta(a, b, reps) if prevalence is None else np.full(reps, float(prevalence))
    k = rng.binomial(n, theta)
    rows: list[dict[str, float | str]] = []
    low, high = credible_interval(*beta_posterior(k, n, prior=prior), level)
    rows.append(_coverage_row("non-private", math.nan, theta, low, high))
    for eps in epsilons:
        released = noisy_counts(k, n, eps, rng=rng)
        for method in INTERVAL_METHODS:
            low, high = posterior_interval(
                released, n, eps, method=method, level=level, prior=prior
            )
            rows.append(_coverage_row(method, eps, theta, low, high))
    return rows


def _coverage_row(method: str, eps: float, theta, low, high) -> dict[str, float | str]:
    return {
        "method": method,
        "epsilon": float(eps),
        "coverage": float(np.mean((low <= theta) & (theta <= high))),
        "mean_width": float(np.mean(high - low)),
    }


def policy_rows(
    prevalence: float,
    n_queries: int,
    batch_size: int,
    epsilon: float,
    *,
    n_repetitions: int,
    rng: np.random.Generator,
    level: float = 0.95,
) -> list[dict[str, float | str]]:
    """The seed's two policies over ``Q`` batches on the same populations (rows for a figure).

    ``n_repetitions`` populations stream ``Q`` batches of ``batch_size`` Bernoulli(p)
    records; both policies spend ``epsilon`` per record in total. Rows: ``policy``,
    ``method`` (naive, exact), ``batch`` (1..Q), ``rmse`` of the posterior mean, ``coverage``
    of its ``level`` interval, and the count's ``noise_variance`` (:func:`policy_noise_variance`).
    """
    p = require_probability("prevalence", prevalence)
    reps = require_count("n_repetitions", n_repetitions)
    q = require_count("n_queries", n_queries)
    counts = rng.binomial(require_count("batch_size", batch_size), p, (reps, q))
    rows: list[dict[str, float | str]] = []
    for policy, run in (("accumulate", accumulate_policy), ("requery", requery_policy)):
        variance = policy_noise_variance(q, epsilon, policy)
        for method in ("naive", "exact"):
            trace = run(counts, batch_size, epsilon, rng=rng, method=method, level=level)
            rmse = np.sqrt(np.mean((trace.mean - p) ** 2, axis=0))
            coverage = np.mean((trace.low <= p) & (p <= trace.high), axis=0)
            for t in range(q):
                rows.append(
                    {
                        "policy": policy,
                        "method": method,
                        "batch": t + 1,
                        "epsilon": float(epsilon),
                        "rmse": float(rmse[t]),
                        "coverage": float(coverage[t]),
                        "noise_variance": float(variance[t]),
                    }
                )
    return rows
