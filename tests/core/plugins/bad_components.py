"""Plug-ins that return bad output, one per way a user's component can go wrong.

Used by tests/core/test_plugins.py: each must stop the run with one line naming the component (its
import string), the method and what was wrong, never a traceback from inside the engine.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from p2pdp.learning.models import LogisticModel
from p2pdp.learning.rules import EnsembleRule, Margins
from p2pdp.privacy.accountants import BasicAccountant
from p2pdp.privacy.mechanisms import VectorLaplace


class NaNNoise(VectorLaplace):
    """Noise of NaN."""

    def _draw(self, sensitivity, dim, n, rng):
        return np.full((n, dim), np.nan)


class WrongShapeNoise(VectorLaplace):
    """One coordinate too many."""

    def _draw(self, sensitivity, dim, n, rng):
        return np.zeros((n, dim + 1))


class TextNoise(VectorLaplace):
    """Strings instead of numbers."""

    def _draw(self, sensitivity, dim, n, rng):
        return np.full((n, dim), "noise")


class NoEvent(VectorLaplace):
    """Declares None instead of a privacy event."""

    def event(self, dim):
        return None


class NotAMechanism:
    """A class with none of a mechanism's methods."""

    name: ClassVar[str] = "not-a-mechanism"


class NaNWeights(LogisticModel):
    """Returns NaN weights."""

    def fit(self, X, y, shards, lam):
        models = super().fit(X, y, shards, lam)
        return dataclasses.replace(models, weights=np.full_like(models.weights, np.nan))


class TooFewColumns(LogisticModel):
    """Drops the last coordinate of every model."""

    def fit(self, X, y, shards, lam):
        models = super().fit(X, y, shards, lam)
        return dataclasses.replace(models, weights=models.weights[:, :-1])


class NaNScores(EnsembleRule):
    """Scores of NaN."""

    name: ClassVar[str] = "nan-scores"

    def scores(self, margins: Margins) -> np.ndarray:
        return np.full_like(margins.own.T, np.nan)


class RaisingRule(EnsembleRule):
    """Raises inside scores."""

    name: ClassVar[str] = "raising"

    def scores(self, margins: Margins) -> np.ndarray:
        raise RuntimeError("my rule has a bug")


def raising_loader():
    """A data loader that raises."""
    raise RuntimeError("cannot reach my database")


class NaNAccountant(BasicAccountant):
    """Composes to NaN."""

    name: ClassVar[str] = "nan-accountant"

    def composed_epsilon(self, event, counts, *, delta_total):
        return np.full(np.shape(counts), np.nan)


class FreeAccountant(BasicAccountant):
    """Charges nothing, however many releases: a budget would never run out."""

    name: ClassVar[str] = "free"

    def composed_epsilon(self, event, counts, *, delta_total):
        return np.zeros(np.shape(counts))


class RepeatingSampler:
    """Forms a group with one peer twice."""

    def __init__(self, world, *, rng):
        self.world = world

    def start(self, ready, n_not_ready):
        self.world.start_group(np.array([ready[0], ready[0], ready[1]]), int(ready[0]))

    def peer_ready(self, peer):
        pass

    def group_finished(self, group, *, published):
        pass


class NaNSensitivity:
    """The MeanEstimate task of user_components, with a sensitivity of NaN."""

    name: ClassVar[str] = "nan-sensitivity"
    aggregate: ClassVar[str] = "mean"

    def __init__(self, config):
        from user_components import MeanEstimate

        self.inner = MeanEstimate(config)

    def training_key(self, *, fold, repetition):
        return self.inner.training_key(fold=fold, repetition=repetition)

    def prepare(self, *, fold, repetition):
        return self.inner.prepare(fold=fold, repetition=repetition)

    def statistics(self, prepared):
        return self.inner.statistics(prepared)

    def sensitivity(self, sizes):
        return float("nan")

    def evaluate(self, prepared, outcome):
        return self.inner.evaluate(prepared, outcome)


class ShortStatistics(NaNSensitivity):
    """Statistics for one peer too few."""

    def statistics(self, prepared):
        statistics, sizes = self.inner.statistics(prepared)
        return statistics[:-1], sizes
