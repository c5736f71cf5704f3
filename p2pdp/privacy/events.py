"""Privacy events: what one release declares about its privacy, for an accountant to compose.

As in dp-accounting's ``dp_event`` / ``privacy_accountant`` split, a mechanism does not know
how releases compose; it only *declares* each release as an event, and the accountant
(:mod:`p2pdp.privacy.accounting`) turns a peer's sequence of events into the ``(epsilon, delta)`` it
has spent. The noise multiplier of a Gaussian release is therefore computed once, by the
mechanism, and read from its event by every accountant.

Every event is stated for one release and for the neighbouring relation it declares in its
``relation`` field (:data:`RELATIONS`): ``"replace-one"`` (one record of one peer's shard
replaced by any other; the shard size is unchanged, so it may be public) or ``"add-remove"``
(one record added to or removed from one peer's shard; nothing the release divides by may then
depend on the shard size). Results rows carry it as ``neighbouring_relation``. Epsilons under
the two relations are not interchangeable: an add/remove guarantee ``epsilon`` implies
replace-one at ``2 epsilon`` (a replacement is a removal then an addition), and a replace-one
guarantee says nothing about add/remove.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from p2pdp.core.errors import ConfigError

#: Replace one record of one peer's shard by any other record (the shard size is unchanged).
REPLACE_ONE = "replace-one"
#: Add one record to, or remove one from, one peer's shard.
ADD_REMOVE = "add-remove"
#: The neighbouring relations an event may state.
RELATIONS: tuple[str, ...] = (REPLACE_ONE, ADD_REMOVE)


def _check_relation(event: object, relation: str) -> None:
    if relation not in RELATIONS:
        raise ConfigError(
            f"{type(event).__name__}.relation must be one of {RELATIONS}, got {relation!r}"
        )


@dataclass(frozen=True, slots=True)
class PrivacyEvent:
    """Base class of every event. ``private`` is False only for :class:`NonPrivateEvent`."""

    @property
    def private(self) -> bool:
        return True

    @property
    def relation(self) -> str:
        """The neighbouring relation the event is stated for: replace-one unless it says
        otherwise (the events below have it as a field)."""
        return REPLACE_ONE

    def epsilon_delta(self) -> tuple[float, float]:
        """One valid ``(epsilon, delta)`` guarantee of the single release."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class EpsilonDeltaEvent(PrivacyEvent):
    """A release that is ``(epsilon, delta)``-DP and nothing more is known (delta 0: pure DP)."""

    epsilon: float
    delta: float = 0.0
    relation: str = REPLACE_ONE

    def __post_init__(self) -> None:
        _check_relation(self, self.relation)

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

    ``Delta_2`` is the release's L2 sensitivity under ``relation`` (so the relation is already
    in the noise multiplier: one release is the Gaussian shift of ``1 / noise_multiplier``
    standard deviations). ``epsilon`` and ``delta`` are the guarantee it was calibrated for
    (analytic Gaussian), so accountants that only understand ``(epsilon, delta)`` can still
    compose it.
    """

    noise_multiplier: float
    epsilon: float
    delta: float
    relation: str = REPLACE_ONE

    def __post_init__(self) -> None:
        _check_relation(self, self.relation)

    def epsilon_delta(self) -> tuple[float, float]:
        return self.epsilon, self.delta


@dataclass(frozen=True, slots=True)
class LaplaceEvent(PrivacyEvent):
    """A scalar Laplace release with scale ``Delta_1 / epsilon``: ``epsilon``-DP.

    ``Delta_1`` is the release's sensitivity under ``relation`` (one release is a Laplace
    shift of at most ``Delta_1``). Basic composition reads its ``(epsilon, 0)``; the ``pld``
    accountant composes its exact privacy loss distribution, tighter once ``delta > 0``.
    """

    epsilon: float
    relation: str = REPLACE_ONE

    def __post_init__(self) -> None:
        _check_relation(self, self.relation)

    def epsilon_delta(self) -> tuple[float, float]:
        return self.epsilon, 0.0


@dataclass(frozen=True, slots=True)
class SubsampledGaussianEvent(PrivacyEvent):
    """A Gaussian release of a sum over a Poisson sample of a peer's records.

    Every record joins the sum independently with probability ``sampling_rate``; each term is
    clipped to L2 norm ``C`` and the noise has standard deviation ``noise_multiplier * C``.
    ``relation``: ``"add-remove"`` (the DP-SGD convention: the sum moves by at most ``C``, if
    the record is sampled) or ``"replace-one"`` (the record is replaced: its term moves by at
    most ``2 C`` if sampled; its privacy loss is that of ``q N(C, .) + (1-q) N(0, .)`` against
    ``q N(-C, .) + (1-q) N(0, .)``). The amplification by this sampling is accounted by ``pld``
    (exact, either relation) and ``rdp`` (add/remove only:
    :func:`p2pdp.privacy.accountants.subsampled_gaussian_rdp`). No ``(epsilon, delta)`` is
    stated for one release (``epsilon_delta`` is ``(inf, 0)``, so basic composition gives inf).
    """

    noise_multiplier: float
    sampling_rate: float
    relation: str = ADD_REMOVE

    def __post_init__(self) -> None:
        _check_relation(self, self.relation)

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

    @property
    def relation(self) -> str:
        """No relation: nothing is guaranteed under any."""
        return "none"

    def epsilon_delta(self) -> tuple[float, float]:
        return math.inf, 0.0
