"""The tables whose readers sit above :mod:`p2pdp.config` in the layers, and the list of tables.

``[task]`` (read by the task framework, :mod:`p2pdp.tasks`), ``[network]`` (read by the two
runtimes, :mod:`p2pdp.sim.transport` and :mod:`p2pdp.net.coordinator`), ``[prevalence]`` and
``[pooling]`` (read by the workloads :mod:`p2pdp.tasks.prevalence` and
:mod:`p2pdp.tasks.pooled_testing`) cannot live beside their readers: :mod:`p2pdp.config`
composes every table into :class:`~p2pdp.config.ScenarioConfig`, and each of those packages
imports :mod:`p2pdp.config`, so the composition would import a package that imports it (the
``layers`` contract). The other tables live beside their readers, below :mod:`p2pdp.config`
(:mod:`p2pdp.data.settings`, :mod:`p2pdp.learning.settings`, :mod:`p2pdp.privacy.settings`,
:mod:`p2pdp.protocols.settings`); :data:`SECTIONS` lists them all, and :data:`PUBLIC_NAMES`
the settings whose public name differs from their attribute.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import ClassVar

from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import When
from p2pdp.core.validation import (
    Boolean,
    ComponentName,
    IntAtLeast,
    Interval,
    NonNegative,
    OneOf,
    Positive,
    Probability,
    check,
    validate_fields,
)
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.learning.settings import EvaluationConfig, TrainingConfig
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GossipConfig, GroupsConfig, ProtocolConfig, PublicationConfig

LATENCY_MODELS = ("constant", "exponential", "lognormal")


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkConfig:
    """Message transport: one-way latency (seconds), bandwidth (bytes/s), loss probability.

    ``latency = "constant"`` uses ``latency_mean``; ``"exponential"`` draws with that mean;
    ``"lognormal"`` has mean ``latency_mean`` and log-space std ``latency_sigma``.
    ``bandwidth = inf`` means transfers take no time beyond the latency.

    ``seeded_noise`` (network runtime only, :mod:`p2pdp.net`): draw every noise (a curator's,
    or with secure aggregation each member's share) from the scenario's seeded streams, so that
    the run releases exactly what the simulator releases. For tests of parity: anyone who knows
    the seed can remove that noise, and the rows say so (``non_private_steps``). By default
    each draw comes from the operating system's CSPRNG in the process that adds it. The
    simulator always draws from the seeded streams (it is a simulation) and does not read
    the setting.
    """

    latency: str = field(default="constant", metadata=check(OneOf(LATENCY_MODELS)))
    latency_mean: float = field(default=0.05, metadata=check(NonNegative()))
    latency_sigma: float = field(default=0.5, metadata=check(NonNegative()))
    bandwidth: float = field(default=math.inf, metadata=check(Positive(allow_inf=True)))
    loss: float = field(default=0.0, metadata=check(Probability()))
    seeded_noise: bool = field(default=False, metadata=check(Boolean()))

    #: Settings read only for some values of this table's options, while the option itself is
    #: read (:func:`p2pdp.config.settings_read`).
    option_reads: ClassVar[tuple[When, ...]] = (
        When("network.latency", "lognormal", ("network.latency_sigma",)),
    )

    def __post_init__(self) -> None:
        validate_fields(self, "network")


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskConfig:
    """The workload (a ``task`` component, see :mod:`p2pdp.tasks`).

    ``name`` is a registered task (``"logistic"``: the seed's logistic-regression ensembles)
    or an import string ``package.module:Class``.
    """

    name: str = field(default="logistic", metadata=check(ComponentName("task")))

    def __post_init__(self) -> None:
        validate_fields(self, "task")


# --- settings of the built-in workloads' tables -----------------------------------------------
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

    #: Settings read only for some values of this table's options, while the option itself is
    #: read (:func:`p2pdp.config.settings_read`).
    option_reads: ClassVar[tuple[When, ...]] = (
        When("prevalence.source", "synthetic", ("prevalence.prevalence",)),
        When("prevalence.source", "dataset", ("data.*",)),
        When("prevalence.response", "two-coin", ("prevalence.theta2",)),
    )

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
    :mod:`p2pdp.tasks.pooled_testing.task`).
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


SECTIONS: dict[str, type] = {
    "task": TaskConfig,
    "data": DataConfig,
    "partition": PartitionConfig,
    "training": TrainingConfig,
    "privacy": PrivacyConfig,
    "groups": GroupsConfig,
    "network": NetworkConfig,
    "gossip": GossipConfig,
    "publication": PublicationConfig,
    "evaluation": EvaluationConfig,
    "prevalence": PrevalenceConfig,
    "pooling": PoolingConfig,
    "protocol": ProtocolConfig,
}


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


#: Settings whose public name (scenario files, ``--set``, sweep keys, results columns, report
#: labels) differs from the dataclass attribute: (section, attribute) -> public name.
PUBLIC_NAMES = {("training", "lam"): "lambda"}
_ATTRIBUTES = {(section, public): name for (section, name), public in PUBLIC_NAMES.items()}


def public_key(key: str) -> str:
    """``"training.lam"`` -> ``"training.lambda"``: the dotted name a user reads and types."""
    section, dot, name = key.partition(".")
    return f"{section}{dot}{PUBLIC_NAMES.get((section, name), name)}"


def field_key(key: str) -> str:
    """``"training.lambda"`` -> ``"training.lam"``: the dotted dataclass attribute path."""
    section, dot, name = key.partition(".")
    return f"{section}{dot}{_ATTRIBUTES.get((section, name), name)}"
