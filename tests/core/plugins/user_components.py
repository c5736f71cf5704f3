"""A user's own components, outside the p2pdp package: one per kind (tests/core/test_plugins.py).

Each does something the tests can observe in the results of a scenario that names it by
import string (``"user_components:Name"``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from p2pdp.core.rng import generator
from p2pdp.learning.models import LogisticModel
from p2pdp.learning.rules import EnsembleRule, Margins
from p2pdp.privacy.accountants import BasicAccountant
from p2pdp.privacy.mechanisms import Mechanism

MODEL_CALLS: list[int] = []


class CountingLogistic(LogisticModel):
    """The built-in exact logistic regression, counting its calls (model kind)."""

    def fit(self, X, y, shards, lam):
        MODEL_CALLS.append(len(shards))
        return super().fit(X, y, shards, lam)


class UndeclaredGaussian(Mechanism):
    """Gaussian noise of std 1 per unit sensitivity that declares NO guarantee (mechanism kind)."""

    name: ClassVar[str] = "undeclared-gaussian"
    splittable: ClassVar[bool] = False

    def noise_std(self, sensitivity: float, dim: int) -> float:
        return sensitivity

    def _draw(self, sensitivity, dim, n, rng):
        return rng.normal(0.0, sensitivity, (n, dim))


class DoubleCharging(BasicAccountant):
    """Charges every release twice: half the aggregations of ``basic`` (accountant kind)."""

    name: ClassVar[str] = "double-charging"

    def composed_epsilon(self, event, counts, *, delta_total):
        return super().composed_epsilon(event, 2 * np.asarray(counts), delta_total=delta_total)


class ConsecutiveSampler:
    """Groups of g consecutive idle solvent peers, curated by the lowest id (sampler kind)."""

    def __init__(self, world: Any, *, rng: np.random.Generator) -> None:
        self.world = world
        self.idle: list[int] = []
        self.done = world.env.event()

    def start(self, ready: list[int], n_not_ready: int) -> None:
        self.idle = sorted(ready)
        self._next()

    def peer_ready(self, peer: int) -> None:
        self.idle = sorted([*self.idle, peer])

    def group_finished(self, group: Any, *, published: bool) -> None:
        solvent = self.world.ledger.can_afford(group.members)
        self.idle = sorted([*self.idle, *group.members[solvent].tolist()])
        self._next()

    def _next(self) -> None:
        g = self.world.config.groups.group_size
        if len(self.idle) < g:
            if not self.done.triggered:
                self.done.succeed(f"fewer than {g} peers can afford another aggregation")
            return
        members = np.array(self.idle[:g])
        del self.idle[:g]
        self.world.start_group(members, int(members[0]))


class OwnModelOnly(EnsembleRule):
    """Ignores every published model (ensemble kind): errors equal the local-only errors."""

    name: ClassVar[str] = "own-only"

    def scores(self, margins: Margins) -> np.ndarray:
        return margins.own.T


class MeanEstimate:
    """Task kind: each peer holds values in [0, 1]; groups release the noisy mean of means.

    Neighbouring relation: replace one value of one peer (a record), which moves that peer's
    mean by at most 1 / n_j and the group's mean of means by at most 1 / (K n_min).
    """

    name: ClassVar[str] = "mean-estimate"
    aggregate: ClassVar[str] = "mean"

    def __init__(self, config: Any) -> None:
        self.config = config

    def training_key(self, *, fold: int, repetition: int) -> tuple:
        return (self.config.seed, self.config.partition.n_peers, fold, repetition)

    def prepare(self, *, fold: int, repetition: int) -> dict[str, np.ndarray]:
        rng = generator(self.config.seed, "mean-estimate", fold, repetition)
        sizes = rng.integers(5, 15, size=self.config.partition.n_peers)
        values = [rng.beta(2.0, 5.0, size=n) for n in sizes]
        return {"means": np.array([[v.mean()] for v in values]), "sizes": sizes}

    def statistics(self, prepared):
        return prepared["means"], prepared["sizes"]

    def sensitivity(self, sizes: list[int]) -> float:
        return 1.0 / (len(sizes) * min(sizes))

    def evaluate(self, prepared, outcome):
        return MeanEstimateScores(published=outcome.published[:, 0], truth=2.0 / 7.0)


class MeanEstimateScores:
    def __init__(self, published: np.ndarray, truth: float) -> None:
        self.published, self.truth = published, truth

    def summary(self) -> dict[str, float]:
        error = np.abs(self.published - self.truth)
        return {"releases": float(self.published.size), "mean_abs_error": float(error.mean())}

    def peer_columns(self) -> dict[str, np.ndarray]:
        return {}
