"""Settings of the prevalence tasks: the ``[prevalence]`` and ``[pooling]`` scenario tables.

Registered in :mod:`p2pdp.config`'s ``SECTIONS``. Frozen, keyword-only dataclasses whose fields
declare their constraints (:mod:`p2pdp.validation`); an invalid value raises
:class:`~p2pdp.errors.ConfigError` naming the dotted key and the value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from p2pdp.errors import ConfigError
from p2pdp.validation import IntAtLeast, Interval, OneOf, Positive, check, validate_fields

PREVALENCE_SOURCES = ("synthetic", "dataset")
RESPONSE_FORMS = ("keep", "two-coin")
_OPEN_UNIT = Interval(0.0, 1.0, low_open=True, high_open=True)
_UNIT = Interval(0.0, 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrevalenceConfig:
    """Binary records per peer, for the ``prevalence-counts`` and ``randomized-response`` tasks.

    ``source = "synthetic"``: every peer holds ``records_per_peer`` iid Bernoulli(``prevalence``)
    records (the truth is ``prevalence``). ``"dataset"``: the positive label of
    ``data.dataset`` (e.g. spambase's spam, adult's income > 50K), ``records_per_peer`` rows
    per peer drawn without replacement; the truth is the label's prevalence in the whole data
    set. Receivers' Beta prior is ``Beta(prior_a, prior_b)`` (Jeffreys by default) and their
    credible intervals have level ``level``. ``response`` is the randomized-response form of the
    ``randomized-response`` task: ``"keep"`` (truthful with probability ``e^eps/(1+e^eps)``,
    else flipped) or the seed's ``"two-coin"`` (truthful with probability ``theta1``, else
    "yes" with probability ``theta2``; ``theta1`` set for the exact epsilon).
    """

    source: str = field(default="synthetic", metadata=check(OneOf(PREVALENCE_SOURCES)))
    prevalence: float = field(default=0.3, metadata=check(_OPEN_UNIT))
    records_per_peer: int = field(default=20, metadata=check(IntAtLeast(1)))
    prior_a: float = field(default=0.5, metadata=check(Positive()))
    prior_b: float = field(default=0.5, metadata=check(Positive()))
    level: float = field(default=0.95, metadata=check(_OPEN_UNIT))
    response: str = field(default="keep", metadata=check(OneOf(RESPONSE_FORMS)))
    theta2: float = field(default=0.5, metadata=check(_OPEN_UNIT))

    def __post_init__(self) -> None:
        validate_fields(self, "prevalence")


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolingConfig:
    """Pooled testing (``pooled-testing`` task, ``pooled-test`` mechanism).

    Each peer is one person with status ~ Bernoulli(``prevalence``); a group of
    ``groups.group_size`` = c people is one pool, tested once with sensitivity
    ``test_sensitivity`` (Se) and specificity ``test_specificity`` (Sp), ``Se + Sp > 1``; the
    result goes through randomized response with keep probability ``keep_probability``
    (1: none) before it is released. ``pools_per_person``: how many pools each person may be
    tested in; 1 charges a person's whole budget for one pool and declares the distributional
    per-pool loss; more declares (and composes) the worst-case DP loss instead (see
    :mod:`p2pdp.tasks.pooled_testing`).
    """

    prevalence: float = field(default=0.05, metadata=check(_OPEN_UNIT))
    test_sensitivity: float = field(default=0.85, metadata=check(_UNIT))
    test_specificity: float = field(default=0.75, metadata=check(_UNIT))
    keep_probability: float = field(default=1.0, metadata=check(Interval(0.5, 1.0, low_open=True)))
    pools_per_person: int = field(default=1, metadata=check(IntAtLeast(1)))

    def __post_init__(self) -> None:
        validate_fields(self, "pooling")
        if not self.test_sensitivity + self.test_specificity > 1.0:
            raise ConfigError(
                "pooling.test_sensitivity + pooling.test_specificity must be > 1 (an "
                f"informative test), got {self.test_sensitivity!r} + {self.test_specificity!r}"
            )
