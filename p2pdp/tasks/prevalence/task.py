"""The prevalence of a binary outcome from private counts (after Hatlelid et al. 2021).

Two tasks share the data and the receivers' Bayesian model.

``prevalence-counts`` (central DP, a curator per group)
    Each peer holds ``m`` binary records (:class:`~p2pdp.config.tables.PrevalenceConfig`: a
    synthetic population with a known prevalence, or the positive label of a real data set). Its
    statistic is its positive count (d = 1); a group releases the SUM of its members' counts
    plus the mechanism's noise. Neighbouring relation: replace one record of one peer's shard,
    which moves the sum by at most 1: L2 (= L1) sensitivity 1, so ``coordinate-laplace`` at
    ``privacy.epsilon_per_aggregation`` adds ``Laplace(1/epsilon)`` (the seed's noisy count);
    secure aggregation works (Laplace splits into Gamma-difference shares). Released to: the
    group or every peer (``publication.mode``).

``randomized-response`` (local DP, no trusted curator)
    Every record is answered ONCE through randomized response (``prevalence.response``: the
    keep form or the seed's two-coin form, exact epsilon = ``privacy.epsilon_per_aggregation``)
    on its owner's peer, before anything is shared; the peer's statistic is its count of "yes"
    answers, and a group releases the sum with NO curator noise (``privacy.mechanism =
    "local"``: the privacy was applied locally, every release is post-processing). Neighbouring
    relation: one record changes; guarantee: epsilon-LDP per record, charged once per peer
    (the task requires ``privacy.epsilon_per_aggregation = privacy.epsilon``).

What receivers do (the same for both tasks)
-------------------------------------------
A peer's records are fixed, and the engine lets a peer join several groups
(``privacy.epsilon / privacy.epsilon_per_aggregation`` of them): two releases whose groups
share a member count that member's records twice, so multiplying their likelihoods as
independent evidence would be wrong (too confident). Design: each receiving peer keeps a
maximal set of received releases over pairwise DISJOINT member sets (greedily, in release
order; group membership is public) and discards the rest. Given the prevalence, the counts of
disjoint record sets are independent binomials, so the posterior from that set is exact:

* ``naive`` (the seed): ``Beta(a + sum c~, b + N - sum c~)`` from the clamped noisy counts
  (randomized response: the debiased proportion as pseudo-counts), noise ignored;
* ``exact``: the noise-aware posterior, a Beta mixture over the true total count
  (:func:`p2pdp.tasks.prevalence.estimators.combine_log_likelihoods` of each release's law given
  its count:
  :func:`~p2pdp.tasks.prevalence.estimators.laplace_count_log_likelihood` for the clamped Laplace
  count,
  :func:`~p2pdp.tasks.prevalence.estimators.rr_count_log_likelihood` for randomized response).
  Under secure
  aggregation the noise is a sum of shares with ``K/(K-1)`` times the Laplace variance; the
  likelihood then uses a Laplace law of the recorded noise std (an approximation);
* ``non-private``: the Beta posterior of the TRUE counts of the same records (the
  experimenter's reference; no party computes it).

The seed's two policies map onto the budget: ``accumulate`` is ``epsilon_per_aggregation =
epsilon`` (every record released once, at the full epsilon; every release is used);
``requery`` is ``epsilon_per_aggregation = epsilon / Q`` (every peer in Q groups at epsilon/Q,
Laplace noise Q times larger; a receiver uses one disjoint set of releases, as the seed uses
only its latest query). Using the overlapping releases too would need their joint likelihood
over the members' individual counts: not done here.

Metrics (per peer, then means in the results row): posterior-mean absolute error against the
truth for each posterior, the privacy part ``privacy_error`` (exact posterior mean against the
non-private one), whether each ``prevalence.level`` credible interval covers the truth
(averaged over repetitions: the coverage) and its width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy.special import betainc

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.privacy.counting import RandomizedResponse
from p2pdp.tasks import Outcome, received_releases
from p2pdp.tasks.prevalence.estimators import (
    BetaMixture,
    beta_posterior,
    channel_posterior,
    combine_log_likelihoods,
    credible_interval,
    laplace_count_log_likelihood,
    rr_debiased_posterior,
    two_coin_response,
)

#: Posteriors every receiver computes, in column order.
POSTERIORS: tuple[str, ...] = ("naive", "exact", "plain")


@dataclass(frozen=True, slots=True, kw_only=True)
class Population:
    """Binary records of every peer: ``records`` (P, m) bool; ``truth`` the prevalence.

    ``answers`` (P, m) bool: the randomized-response answers (``randomized-response``
    only; drawn on each peer before anything is shared), else None.
    """

    key: tuple
    records: np.ndarray
    truth: float
    answers: np.ndarray | None = None

    @property
    def counts(self) -> np.ndarray:
        """True positive count of each peer, (P,)."""
        return self.records.sum(axis=1)


def binary_population(config: ScenarioConfig, *, fold: int, repetition: int) -> Population:
    """The peers' binary records for ``config`` (same for both tasks: common random numbers)."""
    settings = config.prevalence
    n_peers, m = config.partition.n_peers, settings.records_per_peer
    rng = generator(config.seed, "prevalence-population", fold, repetition)
    key = population_key(config, fold=fold, repetition=repetition)
    if settings.source == "synthetic":
        records = rng.random((n_peers, m)) < settings.prevalence
        return Population(key=key, records=records, truth=settings.prevalence)
    from p2pdp.data.loaders import load_data

    raw = load_data(config.data, rng=generator(config.seed, "data"))
    labels = raw.y if raw.y_test is None else np.concatenate([raw.y, raw.y_test])
    positive = np.asarray(labels) > 0
    if n_peers * m > positive.size:
        raise ConfigError(
            f"prevalence.records_per_peer must be <= {positive.size // n_peers} for "
            f"{raw.name} ({positive.size} rows, {n_peers} peers), got {m}"
        )
    rows = rng.choice(positive.size, size=n_peers * m, replace=False)
    return Population(
        key=key, records=positive[rows].reshape(n_peers, m), truth=float(positive.mean())
    )


def population_key(config: ScenarioConfig, *, fold: int, repetition: int) -> tuple:
    settings = config.prevalence
    data = config.data.dataset if settings.source == "dataset" else settings.prevalence
    return (
        config.seed,
        config.partition.n_peers,
        settings.source,
        data,
        settings.records_per_peer,
        fold,
        repetition,
    )


def disjoint_releases(indices: list[int], members: Sequence[np.ndarray]) -> tuple[int, ...]:
    """Greedy maximal subset of ``indices`` (in release order) with pairwise disjoint members."""
    covered: set[int] = set()
    chosen = []
    for index in sorted(indices):
        group = set(members[index].tolist())
        if covered.isdisjoint(group):
            chosen.append(index)
            covered |= group
    return tuple(chosen)


def mixture_interval(mixture: BetaMixture, level: float) -> tuple[float, float]:
    """Equal-tailed ``level`` interval of one (scalar) :class:`BetaMixture`, fast.

    Same answer as :meth:`BetaMixture.interval` (to ~1e-9 in cdf) at a fraction of the cost:
    the cdf is tabulated on 41 points within 8 posterior standard deviations of the mean
    (plus 0 and 1) instead of a 365-point grid over [0, 1], then refined by safeguarded Newton.
    """
    mean, sd = float(mixture.mean()), math.sqrt(max(float(mixture.variance()), 0.0))
    grid = np.unique(
        np.clip(np.concatenate([[0.0, 1.0], mean + sd * np.linspace(-8, 8, 41)]), 0, 1)
    )
    cdf = mixture.cdf(grid)
    tails = []
    for probability in ((1 - level) / 2, (1 + level) / 2):
        above = int(np.clip(np.searchsorted(cdf, probability), 1, grid.size - 1))
        low, high = grid[above - 1], grid[above]
        theta = 0.5 * (low + high)
        for _ in range(50):
            excess = float(mixture.cdf(theta)) - probability
            if abs(excess) < 1e-11:
                break
            low, high = (theta, high) if excess < 0 else (low, theta)
            with np.errstate(divide="ignore", invalid="ignore"):
                step = theta - excess / float(mixture.pdf(theta))
            theta = step if low <= step <= high else 0.5 * (low + high)
        tails.append(theta)
    return tails[0], tails[1]


#: Midpoints of this many equal bins of (0, 1) carry the randomized-response posterior.
RR_GRID = 100_000


def rr_grid_posterior(
    yes: int,
    n: int,
    response: RandomizedResponse,
    prior: tuple[float, float],
    level: float,
) -> tuple[float, float, float]:
    """``(mean, low, high)`` of ``Beta(a, b)`` prior times ``q^yes (1 - q)^(n - yes)``.

    ``q = P(1|0) + (P(1|1) - P(1|0)) theta``; each of :data:`RR_GRID` equal bins of (0, 1)
    gets its exact prior mass times the likelihood at its midpoint; the equal-tailed ``level``
    interval by linear interpolation of the cumulative sum.
    """
    a, b = prior
    edges = np.arange(RR_GRID + 1) / RR_GRID
    theta = 0.5 * (edges[1:] + edges[:-1])
    q = response.p_yes_given_no + (response.p_yes_given_yes - response.p_yes_given_no) * theta
    with np.errstate(divide="ignore"):
        log_likelihood = yes * np.log(q) + (n - yes) * np.log1p(-q)
    prior_mass = np.diff(betainc(a, b, edges))  # exact prior mass per bin (Jeffreys: U-shaped)
    weights = prior_mass * np.exp(log_likelihood - log_likelihood.max())
    weights /= weights.sum()
    cdf = np.concatenate([[0.0], np.cumsum(weights)])  # mass below each edge
    low = float(np.interp((1 - level) / 2, cdf, edges))
    high = float(np.interp((1 + level) / 2, cdf, edges))
    return float(weights @ theta), low, high


@dataclass(frozen=True, slots=True, kw_only=True)
class PrevalenceEvaluation:
    """Per-peer posteriors of one run (arrays of shape (P,)) and the truth.

    ``means[name]``, ``low[name]``, ``high[name]`` for each of :data:`POSTERIORS`;
    ``releases_used`` and ``records_used``: the disjoint releases behind a peer's posterior.
    """

    truth: float
    means: dict[str, np.ndarray]
    low: dict[str, np.ndarray]
    high: dict[str, np.ndarray]
    releases_used: np.ndarray
    records_used: np.ndarray
    queries_per_peer: int

    def summary(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "truth": self.truth,
            "policy": "accumulate" if self.queries_per_peer == 1 else "requery",
            "queries_per_peer": self.queries_per_peer,
            "releases_used": float(self.releases_used.mean()),
            "records_used": float(self.records_used.mean()),
        }
        for name in POSTERIORS:
            covered = (self.low[name] <= self.truth) & (self.truth <= self.high[name])
            row[f"posterior_mean_{name}"] = float(self.means[name].mean())
            row[f"error_{name}"] = float(np.abs(self.means[name] - self.truth).mean())
            row[f"covered_{name}"] = float(covered.mean())
            row[f"width_{name}"] = float((self.high[name] - self.low[name]).mean())
        row["privacy_error"] = float(np.abs(self.means["exact"] - self.means["plain"]).mean())
        return row

    def peer_columns(self) -> dict[str, np.ndarray]:
        columns = {f"posterior_mean_{name}": self.means[name] for name in POSTERIORS}
        for name in ("naive", "exact"):
            columns[f"covered_{name}"] = (self.low[name] <= self.truth) & (
                self.truth <= self.high[name]
            )
        columns["releases_used"] = self.releases_used
        columns["records_used"] = self.records_used
        return columns


class _BinaryCounts:
    """Shared part of the two tasks: data, statistics, receivers' posteriors, figures."""

    name: ClassVar[str]
    #: Counts binary records: no features, so no lambda or min-max bounds to disclose.
    reads_features: ClassVar[bool] = False
    aggregate: ClassVar[str] = "sum"
    locally_private: ClassVar[bool] = False
    #: The settings it reads (:mod:`p2pdp.core.reads`; ``prevalence.source`` adds the truth
    #: or the data set's settings).
    reads: ClassVar[tuple[str, ...]] = (
        "prevalence.source",
        "prevalence.records_per_peer",
        "prevalence.prior_a",
        "prevalence.prior_b",
        "prevalence.level",
    )

    def __init__(self, config: ScenarioConfig) -> None:
        self.config = config
        self.prior = (config.prevalence.prior_a, config.prevalence.prior_b)
        self.level = config.prevalence.level

    def training_key(self, *, fold: int, repetition: int) -> tuple:
        return (self.name, *population_key(self.config, fold=fold, repetition=repetition))

    def prepare(self, *, fold: int, repetition: int) -> Population:
        population = binary_population(self.config, fold=fold, repetition=repetition)
        return replace(population, key=self.training_key(fold=fold, repetition=repetition))

    def sensitivity(self, sizes: list[int]) -> float:
        """Replace one record of one member: the group's sum moves by at most 1."""
        return 1.0

    # -- what a receiver computes from a set of disjoint releases ------------------------------
    def _naive(self, released: np.ndarray, n: np.ndarray) -> tuple[float, float]:
        raise NotImplementedError

    def _exact(
        self, released: np.ndarray, n: np.ndarray, records: list[Any]
    ) -> tuple[float, float, float]:
        """``(mean, low, high)`` of the noise-aware posterior from disjoint releases."""
        raise NotImplementedError

    def evaluate(self, prepared: Population, outcome: Outcome) -> PrevalenceEvaluation:
        n_peers, m = prepared.records.shape
        if len(outcome.members) != len(outcome.releases):
            raise ConfigError("the outcome must list each release's members")
        counts = prepared.counts
        released = outcome.published[:, 0] if outcome.published.size else np.zeros(0)
        sizes = np.array([m * len(group) for group in outcome.members], dtype=np.int64)
        truths = np.array([counts[group].sum() for group in outcome.members], dtype=np.int64)
        cache: dict[tuple[int, ...], dict[str, tuple[float, float, float]]] = {}
        means = {name: np.empty(n_peers) for name in POSTERIORS}
        low = {name: np.empty(n_peers) for name in POSTERIORS}
        high = {name: np.empty(n_peers) for name in POSTERIORS}
        used = np.empty(n_peers)
        records = np.empty(n_peers)
        shared, extra = received_releases(outcome, n_peers)
        choices: dict[tuple[int, ...], tuple[int, ...]] = {}
        for peer, others in enumerate(extra):
            if others not in choices:
                choices[others] = disjoint_releases([*shared, *others], outcome.members)
            chosen = choices[others]
            if chosen not in cache:
                cache[chosen] = self._posteriors(chosen, released, sizes, truths, outcome)
            for name, (mean, lo, hi) in cache[chosen].items():
                means[name][peer], low[name][peer], high[name][peer] = mean, lo, hi
            used[peer] = len(chosen)
            records[peer] = sizes[list(chosen)].sum() if chosen else 0
        privacy = self.config.privacy
        queries = math.floor(privacy.epsilon / privacy.step_epsilon + 1e-9)
        return PrevalenceEvaluation(
            truth=prepared.truth,
            means=means,
            low=low,
            high=high,
            releases_used=used,
            records_used=records,
            queries_per_peer=queries,
        )

    def _posteriors(
        self,
        chosen: tuple[int, ...],
        released: np.ndarray,
        sizes: np.ndarray,
        truths: np.ndarray,
        outcome: Outcome,
    ) -> dict[str, tuple[float, float, float]]:
        """``{posterior: (mean, low, high)}`` from the releases ``chosen`` (disjoint)."""
        a, b = self.prior
        index = list(chosen)
        n_total = int(sizes[index].sum()) if chosen else 0
        if not chosen:  # nothing received: the prior
            lo, hi = credible_interval(a, b, self.level)
            prior = (a / (a + b), float(lo), float(hi))
            return dict.fromkeys(POSTERIORS, prior)
        result = {}
        a_naive, b_naive = self._naive(released[index], sizes[index])
        lo, hi = credible_interval(a_naive, b_naive, self.level)
        result["naive"] = (a_naive / (a_naive + b_naive), float(lo), float(hi))
        records = [outcome.releases[i] for i in index]
        result["exact"] = self._exact(released[index], sizes[index], records)
        a_plain, b_plain = beta_posterior(truths[index].sum(), n_total, prior=self.prior)
        lo, hi = credible_interval(a_plain, b_plain, self.level)
        result["plain"] = (float(a_plain / (a_plain + b_plain)), float(lo), float(hi))
        return result

    @classmethod
    def figures(cls, rows: list[dict[str, Any]], directory: Path) -> list[tuple[str, str, str]]:
        """Report figures from result rows: ``[(title, file name, caption)]``."""
        from p2pdp.tasks.prevalence.figures import prevalence_figures

        return prevalence_figures(rows, directory)


class PrevalenceCounts(_BinaryCounts):
    """Central DP: Laplace counts per group into Beta posteriors per peer.

    See the module docstring for the neighbouring relation, what is released to whom and
    how receivers combine releases.
    """

    name: ClassVar[str] = "prevalence-counts"
    #: Mechanisms whose noise on a count (d = 1) is ``Laplace(1/epsilon)``, the law the exact
    #: posterior assumes (vector Laplace in one dimension is the same law).
    MECHANISMS: ClassVar[tuple[str, ...]] = ("coordinate-laplace", "vector-laplace")

    def __init__(self, config: ScenarioConfig) -> None:
        super().__init__(config)
        if config.privacy.mechanism not in self.MECHANISMS:
            raise ConfigError(
                "task prevalence-counts releases Laplace counts: privacy.mechanism must be one "
                f"of {', '.join(self.MECHANISMS)}, got {config.privacy.mechanism!r}"
            )

    def statistics(self, prepared: Population) -> tuple[np.ndarray, np.ndarray]:
        """Each peer's positive count (P, 1) and its number of records (P,)."""
        n_peers, m = prepared.records.shape
        return prepared.counts.astype(np.float64)[:, None], np.full(n_peers, m, dtype=np.int64)

    def _naive(self, released, n):
        clamped = np.clip(released, 0, n)  # post-processing: the count lies in [0, n]
        a, b = beta_posterior(clamped.sum(), n.sum(), prior=self.prior)
        return float(a), float(b)

    def _exact(self, released, n, records):
        """Beta mixture over the true total count (each release's clamped Laplace law)."""
        parts = []
        for value, size, record in zip(released.tolist(), n.tolist(), records, strict=True):
            if not record.noise_std > 0:
                raise ConfigError(
                    "the exact posterior of prevalence-counts needs Laplace noise "
                    f"(privacy.mechanism = 'coordinate-laplace'), got {record.mechanism!r}"
                )
            epsilon = math.sqrt(2.0) / record.noise_std  # Laplace(b): std sqrt(2) b, b = 1/eps
            parts.append(laplace_count_log_likelihood(min(max(value, 0.0), size), size, epsilon))
        mixture = channel_posterior(combine_log_likelihoods(parts), int(n.sum()), prior=self.prior)
        low, high = mixture_interval(mixture, self.level)
        return float(mixture.mean()), float(low), float(high)


def response_for(config: ScenarioConfig) -> RandomizedResponse:
    """The randomized response ``config`` asks for, at ``privacy.epsilon_per_aggregation``."""
    epsilon = config.privacy.step_epsilon
    if config.prevalence.response == "two-coin":
        return two_coin_response(epsilon, config.prevalence.theta2)
    return RandomizedResponse.from_epsilon(epsilon)


class RandomizedResponseCounts(_BinaryCounts):
    """Local DP: every record answered once by randomized response, yes counts summed.

    Needs ``privacy.mechanism = "local"`` and ``privacy.epsilon_per_aggregation =
    privacy.epsilon`` (the local randomization is the peer's whole budget, charged once).
    See the module docstring.
    """

    name: ClassVar[str] = "randomized-response"
    locally_private: ClassVar[bool] = True
    reads: ClassVar[tuple[str, ...]] = (*_BinaryCounts.reads, "prevalence.response")

    def __init__(self, config: ScenarioConfig) -> None:
        super().__init__(config)
        privacy = config.privacy
        if privacy.mechanism != "local":
            raise ConfigError(
                "task randomized-response applies its privacy locally: privacy.mechanism must "
                f"be 'local', got {privacy.mechanism!r}"
            )
        if not math.isclose(privacy.step_epsilon, privacy.epsilon, rel_tol=1e-12):
            raise ConfigError(
                "task randomized-response answers each record once, which costs a peer its "
                "whole budget once: privacy.epsilon_per_aggregation must equal privacy.epsilon "
                f"({privacy.epsilon!r}), got {privacy.epsilon_per_aggregation!r}"
            )
        self.response = response_for(config)

    def training_key(self, *, fold: int, repetition: int) -> tuple:
        settings = self.config.prevalence
        return (
            *super().training_key(fold=fold, repetition=repetition),
            self.config.privacy.epsilon_per_aggregation,
            settings.response,
            settings.theta2,
        )

    def prepare(self, *, fold: int, repetition: int) -> Population:
        """The population plus every record's randomized answer (drawn on its peer)."""
        population = binary_population(self.config, fold=fold, repetition=repetition)
        rng = generator(self.config.seed, "randomized-response", fold, repetition)
        answers = self.response.sample(population.records, rng=rng)
        return replace(
            population, key=self.training_key(fold=fold, repetition=repetition), answers=answers
        )

    def statistics(self, prepared: Population) -> tuple[np.ndarray, np.ndarray]:
        """Each peer's count of "yes" ANSWERS (P, 1) (never its true count) and sizes (P,)."""
        if prepared.answers is None:
            raise ConfigError("randomized-response needs the answers drawn by its prepare")
        n_peers, m = prepared.answers.shape
        yes = prepared.answers.sum(axis=1).astype(np.float64)
        return yes[:, None], np.full(n_peers, m, dtype=np.int64)

    def _naive(self, released, n):
        a, b = rr_debiased_posterior(released.sum(), n.sum(), self.response, prior=self.prior)
        return float(a), float(b)

    def _exact(self, released, n, records):
        """Exact posterior of the prevalence given the total number of "yes" answers.

        Every answer is 1 with probability ``q(theta) = P(1|0) + (P(1|1) - P(1|0)) theta``
        independently, so the releases' yes counts are binomials in ``q`` and their total
        ``Y`` over ``N`` answers is sufficient: the posterior density is proportional to
        ``prior(theta) q^Y (1 - q)^(N - Y)``, on :data:`RR_GRID` bins of (0, 1)
        (the same posterior as :func:`~p2pdp.tasks.prevalence.estimators.channel_posterior` of
        :func:`~p2pdp.tasks.prevalence.estimators.rr_count_log_likelihood`, without its ``O(N Y)``
        cost).
        """
        return rr_grid_posterior(
            round(float(released.sum())), int(n.sum()), self.response, self.prior, self.level
        )
