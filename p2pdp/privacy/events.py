"""Privacy events: what one release declares about its privacy, for an accountant to compose.

As in dp-accounting's ``dp_event`` / ``privacy_accountant`` split, a mechanism does not know
how releases compose; it only *declares* each release as an event, and the accountant
(:mod:`p2pdp.privacy.accounting`) turns a peer's sequence of events into the ``(epsilon, delta)`` it
has spent. The noise multiplier of a Gaussian release is therefore computed once, by the
mechanism, and read from its event by every accountant.

Every event is stated for the mechanism's neighbouring relation (for the output-perturbation
mechanisms: replace one record of one peer's shard) and for one release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrivacyEvent:
    """Base class of every event. ``private`` is False only for :class:`NonPrivateEvent`."""

    @property
    def private(self) -> bool:
        return True

    def epsilon_delta(self) -> tuple[float, float]:
        """One valid ``(epsilon, delta)`` guarantee of the single release."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class EpsilonDeltaEvent(PrivacyEvent):
    """A release that is ``(epsilon, delta)``-DP and nothing more is known (delta 0: pure DP)."""

    epsilon: float
    delta: float = 0.0

    def epsilon_delta(self) -> tuple[float, float]:
        return self.epsilon, self.delta


@dataclass(frozen=True, slots=True)
class DistributionalEvent(EpsilonDeltaEvent):
    """A release whose ``epsilon`` holds only in a stated, weaker threat model than DP.

    ``threat_model`` says against whom (e.g. pooled testing: an adversary who knows the
    prevalence but not the other pool members' statuses). Accountants compose it like
    ``(epsilon, delta)``; results must quote ``threat_model`` with the number, never call it
    worst-case differential privacy.
    """

    threat_model: str = ""

    @property
    def label(self) -> str:
        """The ``guarantee`` column of its releases: not ``exact`` worst-case DP."""
        return "distributional"


@dataclass(frozen=True, slots=True)
class GaussianEvent(PrivacyEvent):
    """A Gaussian release with noise standard deviation ``noise_multiplier * Delta_2``.

    ``epsilon`` and ``delta`` are the guarantee it was calibrated for (analytic Gaussian), so
    accountants that only understand ``(epsilon, delta)`` can still compose it.
    """

    noise_multiplier: float
    epsilon: float
    delta: float

    def epsilon_delta(self) -> tuple[float, float]:
        return self.epsilon, self.delta


@dataclass(frozen=True, slots=True)
class SubsampledGaussianEvent(PrivacyEvent):
    """A Gaussian release of a sum over a Poisson sample of a peer's records.

    Every record joins the sum independently with probability ``sampling_rate``; each term is
    clipped to L2 norm ``C`` and the noise has standard deviation ``noise_multiplier * C``.
    Neighbouring relation: **add or remove** one record (the sum's sensitivity is ``C``); the
    privacy amplification by this sampling is accounted by the ``rdp`` accountant
    (:func:`p2pdp.privacy.accounting.subsampled_gaussian_rdp`). No ``(epsilon, delta)`` is
    stated for one release (``epsilon_delta`` is ``(inf, 0)``, so basic composition gives inf).
    """

    noise_multiplier: float
    sampling_rate: float

    def epsilon_delta(self) -> tuple[float, float]:
        return math.inf, 0.0


@dataclass(frozen=True, slots=True)
class NonPrivateEvent(PrivacyEvent):
    """A release with no privacy guarantee (no noise, or a component that declares none).

    ``reason`` says why, for results and reports. Composed, it gives epsilon = inf.
    """

    reason: str

    @property
    def private(self) -> bool:
        return False

    def epsilon_delta(self) -> tuple[float, float]:
        return math.inf, 0.0
