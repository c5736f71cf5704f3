"""``privacy.mechanism = "posterior-sampling"``: a peer releases a private posterior sample.

The exponential mechanism of Nguyễn's article (:mod:`p2pdp.privacy.posterior_sampling.posterior`)
as a peer's release in the
peer-to-peer world: a peer in a group of one publishes the means of a private sample of its own
logistic model's mean-field posterior in place of its output-perturbed model. The sampling
needs the peer's records, so the logistic task (:mod:`p2pdp.tasks.logistic.task`) draws every
release before the simulation and hands them to the world as per-release statistics; this
class only declares the release (no noise added) and its guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from p2pdp.core.validation import require_count
from p2pdp.privacy.events import EpsilonDeltaEvent, PrivacyEvent
from p2pdp.privacy.mechanisms import Mechanism
from p2pdp.privacy.posterior_sampling.posterior import GUARANTEE_LABEL

#: The label of every release of :class:`PosteriorSampling` (results rows, releases table).
POSTERIOR_GUARANTEE_LABEL = GUARANTEE_LABEL


@dataclass(frozen=True, slots=True)
class ApproximateSamplingEvent(EpsilonDeltaEvent):
    """An ``(epsilon, 0)`` release that holds only for an exact draw from the mechanism's law.

    Composed like any :class:`~p2pdp.privacy.events.EpsilonDeltaEvent` (basic composition);
    ``label``
    says that a finite sampler only approximates the law, so the epsilon is not guaranteed.
    """

    label: str = POSTERIOR_GUARANTEE_LABEL


@dataclass(frozen=True, slots=True, kw_only=True)
class PosteriorSampling(Mechanism):
    """A peer (a group of one) publishes a private sample of its own model's posterior.

    The exponential mechanism over mean-field Gaussian posteriors of the peer's L2-logistic
    model (Nguyễn, :func:`p2pdp.privacy.posterior_sampling.posterior.private_logistic_peers`): each
    release is a fresh
    draw ``z = (mu, rho)`` from ``f(z) ~ exp(epsilon U(z; x) / (2 tau))`` on the peer's own
    shard, approximated by Langevin chains, and the peer publishes ``mu`` in place of an
    output-perturbed model. Neighbouring relation: replace one record of one peer's shard.
    Guarantee: epsilon-DP per release **for exact sampling only**; the finite chain only
    approximates ``f`` (:data:`POSTERIOR_GUARANTEE_LABEL`). Releases compose by basic
    composition (each costs ``epsilon_per_aggregation``).

    The mechanism needs the peer's records, not a model or an aggregate: the task draws the
    samples (one per peer and release, :attr:`needs_records`) and hands them to the world as
    the peers' per-release statistics; the release path then adds nothing (:meth:`_draw` is
    zero). A group of more than one peer, or secure aggregation, would need the curator to
    see the members' records: refused in :class:`p2pdp.config.ScenarioConfig`.
    """

    name: ClassVar[str] = "posterior-sampling"
    scale_family: ClassVar[bool] = False
    #: The statistic a peer submits must be a private sample drawn from its records for each
    #: release (a (P, R, d) array of statistics), never its exact model.
    needs_records: ClassVar[bool] = True
    #: Reads the bound on each record's log-likelihood (:mod:`p2pdp.core.reads`).
    reads: ClassVar[tuple[str, ...]] = ("privacy.tau",)

    def noise_std(self, sensitivity: float, dim: int) -> float:
        """0: no additive noise (the randomness is in the sample, whose spread is not public)."""
        return 0.0

    def event(self, dim: int) -> PrivacyEvent:
        require_count("dim", dim)
        return ApproximateSamplingEvent(self.epsilon, 0.0)

    def _draw(self, sensitivity, dim, n, rng):
        return np.zeros((n, dim))
