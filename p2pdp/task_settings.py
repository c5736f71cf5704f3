"""Settings of the prevalence tasks: the ``[prevalence]`` and ``[pooling]`` scenario tables.

Kept apart from :mod:`p2pdp.config` (which registers them in ``SECTIONS``) so the tasks' settings
do not depend on the engine's validation helpers. Frozen, keyword-only dataclasses validated on
construction; an invalid value raises :class:`~p2pdp.errors.ConfigError` naming the dotted key
and the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from p2pdp.errors import ConfigError

PREVALENCE_SOURCES = ("synthetic", "dataset")
RESPONSE_FORMS = ("keep", "two-coin")


def _fail(key: str, requirement: str, value: object) -> ConfigError:
    return ConfigError(f"{key} must be {requirement}, got {value!r}")


def _number(value: object) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return ok and math.isfinite(value)


def _open_unit(key: str, value: float) -> None:
    if not (_number(value) and 0.0 < value < 1.0):
        raise _fail(key, "in (0, 1)", value)


def _unit(key: str, value: float) -> None:
    if not (_number(value) and 0.0 <= value <= 1.0):
        raise _fail(key, "in [0, 1]", value)


def _positive(key: str, value: float) -> None:
    if not (_number(value) and value > 0):
        raise _fail(key, "> 0 and finite", value)


def _int_at_least(key: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _fail(key, f"an integer >= {low}", value)


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(allowed)}; got {value!r}")


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

    source: str = "synthetic"
    prevalence: float = 0.3
    records_per_peer: int = 20
    prior_a: float = 0.5
    prior_b: float = 0.5
    level: float = 0.95
    response: str = "keep"
    theta2: float = 0.5

    def __post_init__(self) -> None:
        _one_of("prevalence.source", self.source, PREVALENCE_SOURCES)
        _open_unit("prevalence.prevalence", self.prevalence)
        _int_at_least("prevalence.records_per_peer", self.records_per_peer, 1)
        _positive("prevalence.prior_a", self.prior_a)
        _positive("prevalence.prior_b", self.prior_b)
        _open_unit("prevalence.level", self.level)
        _one_of("prevalence.response", self.response, RESPONSE_FORMS)
        _open_unit("prevalence.theta2", self.theta2)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolingConfig:
    """Pooled testing (``pooled-testing`` task, ``pooled-test`` mechanism; seed 001).

    Each peer is one person with status ~ Bernoulli(``prevalence``); a group of
    ``groups.group_size`` = c people is one pool, tested once with sensitivity
    ``test_sensitivity`` (Se) and specificity ``test_specificity`` (Sp), ``Se + Sp > 1``; the
    result goes through randomized response with keep probability ``keep_probability``
    (1: none) before it is released. ``pools_per_person``: how many pools each person may be
    tested in; 1 charges a person's whole budget for one pool and declares the distributional
    per-pool loss; more declares (and composes) the worst-case DP loss instead (see
    :mod:`p2pdp.tasks.pooled_testing`).
    """

    prevalence: float = 0.05
    test_sensitivity: float = 0.85
    test_specificity: float = 0.75
    keep_probability: float = 1.0
    pools_per_person: int = 1

    def __post_init__(self) -> None:
        _open_unit("pooling.prevalence", self.prevalence)
        _unit("pooling.test_sensitivity", self.test_sensitivity)
        _unit("pooling.test_specificity", self.test_specificity)
        if not self.test_sensitivity + self.test_specificity > 1.0:
            raise ConfigError(
                "pooling.test_sensitivity + pooling.test_specificity must be > 1 (an "
                f"informative test), got {self.test_sensitivity!r} + {self.test_specificity!r}"
            )
        if not (_number(self.keep_probability) and 0.5 < self.keep_probability <= 1.0):
            raise _fail("pooling.keep_probability", "in (0.5, 1]", self.keep_probability)
        _int_at_least("pooling.pools_per_person", self.pools_per_person, 1)
