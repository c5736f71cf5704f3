"""Pooled testing on the engine: each peer one person, each group one pool.

Task ``pooled-testing``: peer ``i`` is a person with status ``x_i ~ Bernoulli(p)``
(``pooling.prevalence``); its statistic is ``x_i`` (d = 1, one record). A group of
``groups.group_size = c`` people is a pool; its exact aggregate is the pool's status (the OR,
i.e. the max, of the members' statuses) and the mechanism ``pooled-test`` releases the pool's
TEST RESULT: positive with probability ``Se`` if the pool is positive, ``1 - Sp`` otherwise,
then (``pooling.keep_probability < 1``) passed through randomized response. This is not
"aggregate + additive noise": the mechanism defines the whole release
(:meth:`PooledTest.release`, ``additive = False``); plaintext only (no secure aggregation:
the OR is not linear). Released to: the pool or every peer (``publication.mode``).

Privacy of one person (neighbouring relation: that person's status changes) and its threat
model, declared by the mechanism's event (:func:`pool_privacy`):

* ``pooling.pools_per_person = 1`` (default): each person is charged their whole budget
  ``privacy.epsilon`` for one pool, so nobody is in two pools; the declared per-pool loss is
  the DISTRIBUTIONAL :func:`~p2pdp.tasks.pooled_testing.pooling.individual_epsilon` (an adversary
  who knows ``p``
  but not the other members' statuses; NOT worst-case DP), as a
  :class:`~p2pdp.privacy.events.DistributionalEvent`;
* ``pools_per_person = T > 1``: per-pool distributional losses do not add up across pools
  that share members (:func:`~p2pdp.tasks.pooled_testing.pooling.repeated_pool_epsilon`), so the
  event declares the
  worst-case DP loss :func:`~p2pdp.tasks.pooled_testing.pooling.worst_case_epsilon` of the
  (effective) test, which
  composes; each pool is charged ``privacy.epsilon / T``.

Results rows say which (``threat_model``) next to both numbers. Receivers estimate ``p`` with
:func:`~p2pdp.tasks.pooled_testing.pooling.pooled_mle` from the fraction of positive results they
received, and
report :func:`~p2pdp.tasks.pooled_testing.pooling.pooled_variance` at the true ``p`` and their
number of pools.
The non-private reference is the tested people's sample prevalence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.core.validation import require_count
from p2pdp.privacy.counting import RandomizedResponse
from p2pdp.privacy.events import DistributionalEvent, EpsilonDeltaEvent, PrivacyEvent
from p2pdp.privacy.mechanisms import Mechanism
from p2pdp.tasks import Outcome, received_releases
from p2pdp.tasks.pooled_testing import pooling

DISTRIBUTIONAL = "distributional (adversary knows p, not the other members)"
WORST_CASE = "worst-case DP"


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolPrivacy:
    """One pool's privacy for one member: both losses, the declared one and its threat model.

    ``sensitivity``/``specificity``: the effective test (after randomized response);
    ``budget_per_pool``: what the ledger charges per pool.
    """

    sensitivity: float
    specificity: float
    distributional: float
    worst_case: float
    declared: float
    threat_model: str
    budget_per_pool: float


def _response(keep_probability: float) -> RandomizedResponse | None:
    return RandomizedResponse.keep(keep_probability) if keep_probability < 1.0 else None


def pool_privacy(config: ScenarioConfig) -> PoolPrivacy:
    """The per-pool loss ``config`` declares (see the module docstring for the rule).

    Raises ConfigError if ``privacy.epsilon`` cannot pay for ``pooling.pools_per_person``
    pools at the declared loss.
    """
    settings = config.pooling
    se, sp = settings.test_sensitivity, settings.test_specificity
    response = _response(settings.keep_probability)
    if response is not None:
        se, sp = (float(v) for v in pooling.effective_accuracy(se, sp, response))
    c = config.groups.group_size
    distributional = float(pooling.individual_epsilon(settings.prevalence, c, se, sp))
    worst = float(pooling.worst_case_epsilon(se, sp))
    pools = settings.pools_per_person
    declared, threat = (distributional, DISTRIBUTIONAL) if pools == 1 else (worst, WORST_CASE)
    budget = config.privacy.epsilon / pools
    if declared > budget * (1 + 1e-12):
        raise ConfigError(
            f"privacy.epsilon must be >= {declared * pools:.6g} to test each person in "
            f"pooling.pools_per_person = {pools} pool(s) at {declared:.6g} per pool "
            f"({threat}), got {config.privacy.epsilon!r}"
        )
    return PoolPrivacy(
        sensitivity=se,
        specificity=sp,
        distributional=distributional,
        worst_case=worst,
        declared=declared,
        threat_model=threat,
        budget_per_pool=budget,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PooledTest(Mechanism):
    """The pooled test result as a release, built from the config by :meth:`from_config`.

    :meth:`release` maps the exact pool status (1 if any member is positive) to the test
    result (``Se`` / ``1 - Sp``) and then, with ``keep_probability < 1``, to the randomized
    answer. Neighbouring relation: one member's status changes. :meth:`event` declares
    ``epsilon`` with its threat model (:func:`pool_privacy`); :meth:`budget_event` charges
    ``budget_per_pool``. Not additive, not splittable.
    """

    name: ClassVar[str] = "pooled-test"
    additive: ClassVar[bool] = False
    scale_family: ClassVar[bool] = False
    test_sensitivity: float = 0.85
    test_specificity: float = 0.75
    keep_probability: float = 1.0
    threat_model: str = WORST_CASE
    budget_per_pool: float = math.inf

    @classmethod
    def from_config(cls, config: ScenarioConfig) -> PooledTest:
        """Calibrated to ``config.pooling`` and the pool size; only for ``pooled-testing``.

        Its declared privacy is about one person's status in a pool of people: with any other
        task's statistics it would be a false claim, so other tasks are refused.
        """
        if config.task.name != PooledTesting.name:
            raise ConfigError(
                "privacy.mechanism = 'pooled-test' releases pooled test results of people: "
                f"task.name must be 'pooled-testing', got {config.task.name!r}"
            )
        privacy = pool_privacy(config)
        return cls(
            epsilon=privacy.declared,
            test_sensitivity=config.pooling.test_sensitivity,
            test_specificity=config.pooling.test_specificity,
            keep_probability=config.pooling.keep_probability,
            threat_model=privacy.threat_model,
            budget_per_pool=privacy.budget_per_pool,
        )

    def release(
        self, exact: np.ndarray, sensitivity: float, *, rng: np.random.Generator
    ) -> np.ndarray:
        """``[z]``: the (randomized) test result of a pool of status ``exact[0] > 0``."""
        positive = np.asarray(exact, dtype=float) > 0.5
        p_positive = pooling.result_positive_probability(
            positive, self.test_sensitivity, self.test_specificity
        )
        result = rng.random(positive.shape) < p_positive
        response = _response(self.keep_probability)
        if response is not None:
            result = response.sample(result, rng=rng)
        return result.astype(np.float64)

    def noise_std(self, sensitivity: float, dim: int) -> float:
        return math.nan  # not additive noise

    def event(self, dim: int) -> PrivacyEvent:
        require_count("dim", dim)
        if self.threat_model == WORST_CASE:
            return EpsilonDeltaEvent(self.epsilon, 0.0)
        return DistributionalEvent(self.epsilon, 0.0, threat_model=self.threat_model)

    def budget_event(self, dim: int) -> PrivacyEvent:
        return EpsilonDeltaEvent(self.budget_per_pool, 0.0)

    def _draw(self, sensitivity, dim, n, rng):
        raise ConfigError("pooled-test defines its release; it has no additive noise")


def _pool_status(statistics: np.ndarray) -> np.ndarray:
    """The OR of the members' statuses, shape (1,)."""
    return (statistics.max(axis=0) > 0.5).astype(np.float64)


@dataclass(frozen=True, slots=True, kw_only=True)
class People:
    key: tuple
    status: np.ndarray  # (P,) bool


@dataclass(frozen=True, slots=True, kw_only=True)
class PooledEvaluation:
    """Receivers' estimates of one run (per peer, (P,)) and the run's pool-level counts."""

    prevalence: float
    privacy: PoolPrivacy
    pool_size: int
    estimates: np.ndarray
    pools_received: np.ndarray
    positive_fraction: np.ndarray
    sample_prevalence: float
    pools: int
    positive_pools: int
    positive_results_of_positive_pools: int
    negative_results_of_negative_pools: int

    def summary(self) -> dict[str, Any]:
        privacy = self.privacy
        received = self.pools_received > 0
        estimates = self.estimates[received]
        j = float(self.pools_received[received].mean()) if received.any() else 0.0
        variance = (
            float(
                pooling.pooled_variance(
                    self.prevalence,
                    self.pool_size,
                    j,
                    privacy.sensitivity,
                    privacy.specificity,
                )
            )
            if j >= 1
            else math.nan
        )
        negatives = self.pools - self.positive_pools
        return {
            "threat_model": privacy.threat_model,
            "epsilon_per_pool": privacy.declared,
            "epsilon_distributional": privacy.distributional,
            "epsilon_worst_case": privacy.worst_case,
            "effective_sensitivity": privacy.sensitivity,
            "effective_specificity": privacy.specificity,
            "pools": self.pools,
            "pools_received": j,
            "positive_fraction": float(self.positive_fraction[received].mean())
            if received.any()
            else math.nan,
            "p_hat": float(estimates.mean()) if received.any() else math.nan,
            "squared_error": float(np.mean((estimates - self.prevalence) ** 2))
            if received.any()
            else math.nan,
            "asymptotic_variance": variance,
            "sample_prevalence": self.sample_prevalence,
            "nonprivate_squared_error": (self.sample_prevalence - self.prevalence) ** 2,
            "observed_sensitivity": self.positive_results_of_positive_pools / self.positive_pools
            if self.positive_pools
            else math.nan,
            "observed_specificity": self.negative_results_of_negative_pools / negatives
            if negatives
            else math.nan,
        }

    def peer_columns(self) -> dict[str, np.ndarray]:
        return {
            "p_hat": self.estimates,
            "pools_received": self.pools_received,
            "positive_fraction": self.positive_fraction,
        }


class PooledTesting:
    """Pooled testing: people as peers, groups as pools, the prevalence by the pooled MLE.

    Needs ``privacy.mechanism = "pooled-test"``. See the module docstring.
    """

    name: ClassVar[str] = "pooled-testing"
    #: Counts binary records: no features, so no lambda or min-max bounds to disclose.
    #: The settings it reads (:mod:`p2pdp.core.reads`).
    reads: ClassVar[tuple[str, ...]] = ("pooling.*",)
    reads_features: ClassVar[bool] = False
    aggregate: ClassVar[Any] = staticmethod(_pool_status)

    def __init__(self, config: ScenarioConfig) -> None:
        if config.privacy.mechanism != "pooled-test":
            raise ConfigError(
                "task pooled-testing releases pooled test results: privacy.mechanism must be "
                f"'pooled-test', got {config.privacy.mechanism!r}"
            )
        self.config = config
        self.privacy = pool_privacy(config)

    def training_key(self, *, fold: int, repetition: int) -> tuple:
        config = self.config
        return (
            self.name,
            config.seed,
            config.partition.n_peers,
            config.pooling.prevalence,
            fold,
            repetition,
        )

    def prepare(self, *, fold: int, repetition: int) -> People:
        rng = generator(self.config.seed, "pooled-testing-people", fold, repetition)
        status = rng.random(self.config.partition.n_peers) < self.config.pooling.prevalence
        return People(key=self.training_key(fold=fold, repetition=repetition), status=status)

    def statistics(self, prepared: People) -> tuple[np.ndarray, np.ndarray]:
        """Each person's status (P, 1) and one record each (P,)."""
        status = prepared.status.astype(np.float64)[:, None]
        return status, np.ones(status.shape[0], dtype=np.int64)

    def sensitivity(self, sizes: list[int]) -> float:
        """One member's status moves the pool's OR by at most 1 (unused by ``pooled-test``)."""
        return 1.0

    def evaluate(self, prepared: People, outcome: Outcome) -> PooledEvaluation:
        status = prepared.status
        n_peers = status.size
        results = outcome.published[:, 0] > 0.5 if outcome.published.size else np.zeros(0, bool)
        truth = np.array([status[group].any() for group in outcome.members], dtype=bool)
        privacy = self.privacy
        c = self.config.groups.group_size
        estimates = np.full(n_peers, math.nan)
        fractions = np.full(n_peers, math.nan)
        counts = np.zeros(n_peers, dtype=np.int64)
        cache: dict[tuple[int, ...], tuple[float, float, int]] = {}
        shared, extra = received_releases(outcome, n_peers)
        shared_set = set(shared)
        for peer, others in enumerate(extra):
            if others not in cache:
                indices = sorted(shared_set.union(others))
                if not indices:
                    cache[others] = (math.nan, math.nan, 0)
                    continue
                fraction = float(results[indices].mean())
                estimate = pooling.pooled_mle(fraction, c, privacy.sensitivity, privacy.specificity)
                cache[others] = (fraction, float(estimate), len(indices))
            fractions[peer], estimates[peer], counts[peer] = cache[others]
        tested = np.unique(np.concatenate(outcome.members)) if outcome.members else np.zeros(0)
        return PooledEvaluation(
            prevalence=self.config.pooling.prevalence,
            privacy=privacy,
            pool_size=c,
            estimates=estimates,
            pools_received=counts,
            positive_fraction=fractions,
            sample_prevalence=float(status[tested.astype(int)].mean()) if tested.size else math.nan,
            pools=int(truth.size),
            positive_pools=int(truth.sum()),
            positive_results_of_positive_pools=int((results & truth).sum()),
            negative_results_of_negative_pools=int((~results & ~truth).sum()),
        )

    @classmethod
    def figures(cls, rows: list[dict[str, Any]], directory: Path) -> list[tuple[str, str, str]]:
        """Report figures from result rows: ``[(title, file name, caption)]``."""
        from p2pdp.tasks.pooled_testing.figures import pooled_figures

        return pooled_figures(rows, directory)


__all__ = [
    "DISTRIBUTIONAL",
    "WORST_CASE",
    "PoolPrivacy",
    "PooledEvaluation",
    "PooledTest",
    "PooledTesting",
    "pool_privacy",
]
