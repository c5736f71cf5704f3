"""Scenario configuration: frozen, validated dataclasses, one per table of a scenario file.

A :class:`ScenarioConfig` describes one simulated world (data, partition, training, privacy,
groups, network, publication, evaluation); sweeps are the scenario's
(:mod:`p2pdp.experiments.scenarios.scenario`).
Every field declares its constraint next to its default (``field(metadata=check(...))``, the
constraints of :mod:`p2pdp.core.validation`), checked on construction; an invalid value raises
:class:`~p2pdp.core.errors.ConfigError` naming the dotted key and the value, e.g.
``privacy.epsilon must be > 0 and finite, got -1``. Cross-field rules stay in
``__post_init__``. Settings that name a component take their options from the registry.

Section dataclasses are keyword-only and frozen; derive variants with :func:`with_value`,
which takes a dotted key path such as ``"groups.group_size"``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from p2pdp.core import components
from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import When, declared_reads, declares_reads
from p2pdp.core.validation import (
    Boolean,
    ComponentName,
    Derived,
    FileName,
    IntAtLeast,
    Interval,
    NonNegative,
    OneOf,
    Positive,
    Probability,
    check,
    validate_fields,
)
from p2pdp.data.preprocess import NORM_STEPS, Preprocessor
from p2pdp.data.settings import FILE_LOADER_OPTIONS, DataConfig, PartitionConfig
from p2pdp.learning.settings import EvaluationConfig, TrainingConfig
from p2pdp.privacy.mechanisms import NoNoise
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GossipConfig, GroupsConfig, ProtocolConfig, PublicationConfig

# Settings that name a component (data.dataset, training.model, privacy.mechanism,
# privacy.accountant, groups.sampler, evaluation.vote, task.name) take their options from the
# registry (p2pdp.core.components): a registered name or an import string 'package.module:Name'.
LATENCY_MODELS = ("constant", "exponential", "lognormal")


#: Settings every run reads, whatever its components: the grid's seed, repetitions and split
#: (its folds: ``EvaluationConfig.option_reads``), the workload and the number of peers
#: (:mod:`p2pdp.experiments.run.runner`).
ENGINE_READS = (
    "name",
    "seed",
    "repetitions",
    "task.name",
    "partition.n_peers",
    "evaluation.split",
)

#: Settings that name a component, and the component kind they name: the named component's
#: ``reads`` (:mod:`p2pdp.core.reads`) are read while the setting is.
COMPONENT_SETTINGS = {
    "task.name": "task",
    "protocol.name": "protocol",
    "groups.sampler": "sampler",
    "privacy.mechanism": "mechanism",
    "privacy.accountant": "accountant",
    "evaluation.vote": "ensemble",
    "training.model": "model",
    "data.dataset": "dataset",
}

#: The tables a plug-in that declares no ``reads`` is taken to read, by kind (what a component
#: of that kind is given); a task or protocol plug-in may read any table.
UNDECLARED_READS = {
    "dataset": ("data",),
    "model": ("training",),
    "mechanism": ("privacy",),
    "accountant": ("privacy",),
    "sampler": ("groups", "gossip"),
    "ensemble": ("evaluation",),
}


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


#: What each runtime (``p2pdp run --runtime``) reads besides its components: the simulator's
#: message model (:class:`p2pdp.sim.transport.Transport`) the transport settings (and
#: ``network.latency_sigma`` for the lognormal model, :attr:`NetworkConfig.option_reads`); the
#: network runtime (:class:`p2pdp.net.coordinator.NetworkWorld`), whose messages cross a real
#: network, only where its noise comes from. Declared here as data, which each runtime takes as
#: its ``reads``, so that checking a config loads no runtime.
RUNTIME_READS: dict[str, tuple[str, ...]] = {
    "simulation": ("network.latency", "network.latency_mean", "network.bandwidth", "network.loss"),
    "network": ("network.seeded_noise",),
}


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


#: Every table's ``option_reads``: settings read only for some values of an option (while the
#: option is read), each declared on its table next to the option's constraint.
_OPTION_ENTRIES: tuple[When, ...] = tuple(
    entry for table in SECTIONS.values() for entry in getattr(table, "option_reads", ())
)


def option_reads(key: str) -> tuple[When, ...]:
    """What the option ``key`` reads for some of its values (e.g. ``partition.scheme = 'file'``
    reads ``partition.path``): its table's ``option_reads`` entries on ``key``."""
    return tuple(entry for entry in _OPTION_ENTRIES if entry.key == key)


#: The same as setting -> value -> settings, for listings (``p2pdp components``, the guide).
OPTION_READS: dict[str, dict[Any, tuple[str, ...]]] = {
    key: {entry.value: entry.keys for entry in option_reads(key)}
    for key in dict.fromkeys(entry.key for entry in _OPTION_ENTRIES)
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioConfig:
    """One simulated world: every section's settings, the seed and the repetitions.

    ``seed`` is the root of every random stream of every cell; ``repetitions`` repeats each
    cell with independent streams. A sweep over settings is the scenario's
    (:class:`p2pdp.experiments.scenarios.scenario.Scenario`: a base config plus grid axes),
    not a config's.
    """

    name: str = field(default="scenario", metadata=check(FileName()))
    seed: int = field(default=0, metadata=check(IntAtLeast(0)))
    repetitions: int = field(default=1, metadata=check(IntAtLeast(1)))
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    groups: GroupsConfig = field(default_factory=GroupsConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    publication: PublicationConfig = field(default_factory=PublicationConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    prevalence: PrevalenceConfig = field(default_factory=PrevalenceConfig)
    pooling: PoolingConfig = field(default_factory=PoolingConfig)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)

    def __post_init__(self) -> None:
        for section, cls in SECTIONS.items():
            object.__setattr__(self, section, _section(section, cls, getattr(self, section)))
        validate_fields(self, "")
        read = settings_read(self)  # cross-field rules apply only to settings that are read
        if "privacy.epsilon_per_aggregation" in read and self.privacy.per_aggregation_derived:
            self.privacy.check_per_aggregation()
        if "groups.group_size" in read and self.groups.group_size > self.partition.n_peers:
            raise ConfigError(
                f"groups.group_size must be <= partition.n_peers ({self.partition.n_peers}), "
                f"got {self.groups.group_size}"
            )
        if (
            "groups.group_size" in read
            and self.groups.group_size > 1
            and self.privacy.needs_records
        ):
            raise ConfigError(
                f"groups.group_size must be 1 for privacy.mechanism = "
                f"{self.privacy.mechanism!r} (each peer samples from its own records; a group "
                f"of more than one would need the curator to see the members' records), "
                f"got {self.groups.group_size}"
            )
        if "gossip.formation" in read and self.gossip.formation == "rounds":
            _check_round_formation(self)
        if self.evaluation.split == "fixed" or self.data.bounds == "manifest":
            _check_data_provides(self.data, self.evaluation)
        if self.data.test_path is not None and self.evaluation.split != "fixed":
            raise ConfigError(
                f"data.test_path = {self.data.test_path!r} is a predefined test split, which "
                f"evaluation.split = {self.evaluation.split!r} does not use (its folds are cut "
                "from data.path alone): set evaluation.split = 'fixed' to test on it, or "
                "remove data.test_path"
            )
        _check_row_norm_bound(self)
        _check_peer_column(self.data, self.partition)
        if "protocol.name" in read and self.protocol.iterative:
            self._check_iterative_privacy()

    def _check_iterative_privacy(self) -> None:
        """Cross-field rules of an iterative protocol's private steps."""
        settings = self.protocol
        if settings.sampling == "poisson" and self.privacy.min_shard_size is None:
            raise ConfigError(
                "protocol.sampling = 'poisson' needs privacy.min_shard_size (a public lower "
                "bound on shard sizes): its add/remove guarantee forbids dividing a step by "
                "the peer's own shard size, so it divides by sampling_rate * min_shard_size; "
                "got privacy.min_shard_size = None"
            )
        if self.privacy.mechanism == "none" and settings.noise_multiplier not in (None, 0.0):
            raise ConfigError(
                f"protocol.noise_multiplier = {settings.noise_multiplier!r} adds noise, but "
                "privacy.mechanism = 'none' asks for a non-private run: remove "
                "protocol.noise_multiplier, or set privacy.mechanism = 'gaussian'"
            )
        if not settings.private(self.privacy):
            return  # NOT private: no noise, any clipping norm, no delta
        if math.isinf(settings.clip_norm):
            raise ConfigError(
                "protocol.clip_norm = inf bounds no gradient, so no noise can make a step "
                f"private: set privacy.mechanism = 'none' (not private), got "
                f"protocol.noise_multiplier = {settings.noise_multiplier!r}"
            )
        accountant = self.protocol.accountant(self.privacy)
        if self.protocol.sampling == "poisson" and accountant not in ("rdp", "pld"):
            raise ConfigError(
                f"privacy.accountant = {accountant!r} cannot compose Poisson-subsampled "
                "steps (protocol.sampling = 'poisson'): use 'pld', 'rdp' or 'auto'"
            )
        if not 0 < self.privacy.delta < 1:
            raise ConfigError(
                f"protocol.name = {self.protocol.name!r} takes Gaussian steps, which need "
                f"privacy.delta in (0, 1) (with privacy.mechanism = 'gaussian'; 'none' for a "
                f"run without noise, NOT private); got privacy.delta = {self.privacy.delta!r}"
            )


def _section(name: str, cls: type, value: Any) -> Any:
    """A section's config: ``value`` itself, or built from a mapping of its settings."""
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(_field_names(cls)))
        if unknown:
            raise ConfigError(
                f"{name}.{unknown[0]} is not a setting of [{name}]; valid: "
                f"{', '.join(_field_names(cls))}"
            )
        return cls(**value)
    raise ConfigError(
        f"{name} must be a {cls.__name__} or a dict of its settings, got {type(value).__name__}"
    )


def gossip_faults(config: ScenarioConfig) -> dict[str, Any]:
    """The faults ``config`` sets that formation in rounds does not model: setting -> value."""
    faults = {
        "network.loss": config.network.loss,
        "gossip.churn": config.gossip.churn,
        "gossip.curator_crash_probability": config.gossip.curator_crash_probability,
        "gossip.member_crash_probability": config.gossip.member_crash_probability,
    }
    return {key: value for key, value in faults.items() if value}


def _check_round_formation(config: ScenarioConfig) -> None:
    """Formation in rounds models a fault-free network only: refuse it with any fault."""
    faults = gossip_faults(config)
    if faults:
        key, value = next(iter(faults.items()))
        raise ConfigError(
            f"gossip.formation = 'rounds' models a network without faults, got {key} = "
            f"{value!r} (use gossip.formation = 'messages', or 'auto', which falls back "
            "to messages when a fault is set)"
        )


def _check_peer_column(data: DataConfig, partition: PartitionConfig) -> None:
    """``data.peer_column`` and ``partition.scheme = "column"`` go together for the file loaders.

    An import-string loader may return ``RawData.peers`` without any setting: it is checked
    when loaded (:func:`p2pdp.tasks.pipeline.load_fold`).
    """
    if data.peer_column is not None and partition.scheme != "column":
        raise ConfigError(
            f"data.peer_column = {data.peer_column!r} is read only by partition.scheme = "
            f"'column'; got partition.scheme = {partition.scheme!r}"
        )
    if (
        partition.scheme == "column"
        and data.peer_column is None
        and components.is_builtin("dataset", data.dataset)
    ):
        where = (
            "set data.peer_column to the column of peer ids"
            if "peer_column" in FILE_LOADER_OPTIONS.get(data.dataset, ())
            else f"data.dataset = {data.dataset!r} has no peer column (csv and numpy files "
            "do, with data.peer_column; a loader of your own returns RawData.peers)"
        )
        raise ConfigError(
            f"partition.scheme = 'column' takes each row's peer from the data: {where}"
        )


def _check_row_norm_bound(config: ScenarioConfig) -> None:
    """Refuse a transform without a norm step where the release's sensitivity needs one.

    A one-shot release of exact local models (output perturbation, sensitivity
    ``2 L / (K n_min lambda)``, or posterior sampling) is private only if every training row
    has ``||x||_2 <= 1`` (DESIGN.md section 3). Iterative protocols clip every per-record
    gradient (the clipping bounds their sensitivity whatever the rows), a non-private run
    (``privacy.mechanism = "none"``) has no sensitivity, and a task that reads no features
    (``reads_features = False``) has no rows to bound: they need no norm step.
    """
    if Preprocessor(steps=config.data.transform).bounds_row_norms or config.protocol.iterative:
        return
    task = components.resolve("task", config.task.name, key="task.name")
    mechanism = components.resolve("mechanism", config.privacy.mechanism, key="privacy.mechanism")
    if not getattr(task, "reads_features", True) or (
        isinstance(mechanism, type) and issubclass(mechanism, NoNoise)
    ):
        return
    raise ConfigError(
        f"data.transform = {list(config.data.transform)} leaves row norms unbounded, but "
        f"privacy.mechanism = {config.privacy.mechanism!r} releases one-shot models whose "
        "sensitivity holds only for rows of L2 norm <= 1: end data.transform with one of "
        f"{', '.join(NORM_STEPS)} (an iterative protocol, which clips gradients, or "
        "privacy.mechanism = 'none', which is not private, needs neither)"
    )


def _check_data_provides(data: DataConfig, evaluation: EvaluationConfig) -> None:
    """Reject a fixed split or manifest bounds that the configured data set cannot provide.

    Known without loading for the built-ins (:func:`p2pdp.data.loaders.provides`); an import
    string is checked when it is loaded (:func:`p2pdp.tasks.pipeline.load_fold`).
    """
    from p2pdp.data import loaders  # imported when a data set is checked, not with config

    provided = loaders.provides(data)
    if evaluation.split == "fixed" and provided.test_split is False:
        if data.dataset in FILE_LOADER_OPTIONS:
            raise ConfigError(
                "evaluation.split = 'fixed' needs a predefined test split: set data.test_path "
                f"to the test file for data.dataset = {data.dataset!r}"
            )
        raise ConfigError(
            "evaluation.split = 'fixed' needs a data set with a predefined test split "
            f"({', '.join(loaders.builtins_with('test_split'))}); "
            f"got data.dataset = {data.dataset!r}"
        )
    if data.bounds == "manifest" and provided.feature_bounds is False:
        if data.dataset in FILE_LOADER_OPTIONS:
            raise ConfigError(
                "data.bounds = 'manifest' needs data-independent bounds, which a "
                f"{data.dataset} file does not carry (a loader of your own can return them, "
                f"see p2pdp.data.loaders.RawData); got data.dataset = {data.dataset!r}"
            )
        having = loaders.builtins_with("feature_bounds")
        raise ConfigError(
            f"data.bounds = 'manifest' needs data-independent bounds, which only "
            f"{', '.join(having)} {'has' if len(having) == 1 else 'have'}; "
            f"got data.dataset = {data.dataset!r}"
        )


def _field_names(cls: type) -> tuple[str, ...]:
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


def with_value(config: ScenarioConfig, key: str, value: Any) -> ScenarioConfig:
    """A copy of ``config`` with the dotted ``key`` (e.g. ``"privacy.epsilon"``) set.

    Top-level keys (``"seed"``, ``"name"``) have no dot; ``"training.lambda"`` and the
    attribute path ``"training.lam"`` both set lambda. Validation runs again, so an invalid
    value raises :class:`ConfigError`.
    """
    section, dot, name = field_key(key).partition(".")
    if not dot:
        if section not in _field_names(ScenarioConfig) or section in SECTIONS:
            raise ConfigError(f"unknown setting {key!r}")
        return dataclasses.replace(config, **{section: value})
    if section not in SECTIONS or name not in _field_names(SECTIONS[section]):
        raise ConfigError(f"unknown setting {key!r}")
    new_section = dataclasses.replace(getattr(config, section), **{name: value})
    return dataclasses.replace(config, **{section: new_section})


def flat_settings(config: ScenarioConfig, read: Any = None) -> dict[str, Any]:
    """Every setting as ``{"section.field": value}`` for results rows (tuples joined by ``+``).

    Keys are public names (:func:`public_key`): lambda is ``"training.lambda"``. A setting
    not in ``read`` (default: :func:`settings_read` of the simulator) is None: no value is
    recorded for a setting the run never read.
    """
    read = settings_read(config) if read is None else read
    row: dict[str, Any] = {"name": config.name, "seed": config.seed}
    for section in SECTIONS:
        for key, value in dataclasses.asdict(getattr(config, section)).items():
            row[public_key(f"{section}.{key}")] = (
                "+".join(map(str, value)) if isinstance(value, tuple) else value
            )
    # resolved values: what the run used ("auto" -> gdp/basic; the default or z's epsilon_A)
    row["privacy.accountant"] = (
        config.protocol.accountant(config.privacy)
        if config.protocol.iterative
        else config.privacy.resolved_accountant
    )
    row["privacy.epsilon_per_aggregation"] = config.privacy.step_epsilon
    return {key: value if key in read or "." not in key else None for key, value in row.items()}


# --- which settings a config's components read ------------------------------------------------
def _reader_of(key: str, value: Any) -> Any:
    """The object declaring what the component ``key = value`` reads (None: not resolvable)."""
    if key == "privacy.accountant" and value == "auto":
        return None
    return components.resolve(COMPONENT_SETTINGS[key], value, key=key)


def _expand(key: str) -> tuple[str, ...]:
    """``"gossip.*"`` -> every setting of ``[gossip]``; a dotted key -> itself."""
    section, _, name = key.partition(".")
    if name == "*":
        return tuple(public_key(f"{section}.{n}") for n in _field_names(SECTIONS[section]))
    return (key,)


def setting_value(config: ScenarioConfig, key: str) -> Any:
    """The value of the dotted setting ``key`` (public name, e.g. ``"training.lambda"``)."""
    section, dot, name = field_key(key).partition(".")
    return getattr(getattr(config, section), name) if dot else getattr(config, section)


def settings_read(config: ScenarioConfig, runtime: str | None = "simulation") -> dict[str, str]:
    """Every setting that ``config``'s selected components read, and the first reader found.

    Starts from :data:`ENGINE_READS` and the runtime's reads (``runtime = None``: every
    runtime's, for a scenario, which may run on either); a setting naming a component
    (:data:`COMPONENT_SETTINGS`) adds that component's declared ``reads``
    (:mod:`p2pdp.core.reads`), an option (its table's ``option_reads``) the settings of its
    value. A task that does not read ``protocol.name`` runs the one-shot protocol, whose reads
    are added.

    Returns
    -------
    dict
        Public dotted key -> who reads it (``"protocol.name = 'dpsgd'"``, ``"the engine"``).
    """
    read: dict[str, str] = {}
    pending: list[tuple[str, str]] = [(key, "the engine") for key in ENGINE_READS]
    for name in RUNTIME_READS if runtime is None else (runtime,):
        pending += [(key, f"runtime {name!r}") for key in RUNTIME_READS[name]]
    implicit_protocol = False
    while pending:
        key, reader = pending.pop(0)
        for name in _expand(key):
            if name in read:
                continue
            read[name] = reader
            value = setting_value(config, name)
            entries: tuple[Any, ...] = ()
            who = f"{name} = {value!r}"
            if name in COMPONENT_SETTINGS:
                reader_object = _reader_of(name, value)
                entries = declared_reads(reader_object)
                kind = COMPONENT_SETTINGS[name]
                if reader_object is not None and not (
                    declares_reads(reader_object) or components.is_builtin(kind, value)
                ):  # a plug-in that does not say: whatever a component of its kind is given
                    entries = tuple(f"{s}.*" for s in UNDECLARED_READS.get(kind, SECTIONS))
            else:
                entries = option_reads(name)
            for entry in entries:
                if isinstance(entry, When):
                    if entry.holds(setting_value(config, entry.key)):
                        pending += [(k, who) for k in entry.keys]
                else:
                    pending.append((entry, who))
        if not pending and "protocol.name" not in read and not implicit_protocol:
            implicit_protocol = True  # tasks without [protocol] run the one-shot protocol
            one_shot = components.resolve("protocol", "one-shot")
            reader = f"task.name = {config.task.name!r} (one-shot protocol)"
            pending = [(k, reader) for k in declared_reads(one_shot) if isinstance(k, str)]
    return read


def _default_sections() -> dict[str, Any]:
    return {section: cls() for section, cls in SECTIONS.items()}


def unread_settings(config: ScenarioConfig, read: Any) -> list[str]:
    """Settings of ``config`` that differ from their default and are not in ``read``.

    Only an explicit setting can differ from its default; a value derived from others
    (:class:`Derived`) counts as a default.
    """
    defaults = _default_sections()
    unread = []
    for section in SECTIONS:
        values, default = getattr(config, section), defaults[section]
        for f in dataclasses.fields(values):
            key = public_key(f"{section}.{f.name}")
            value = getattr(values, f.name)
            if key in read or isinstance(value, Derived) or value == getattr(default, f.name):
                continue
            unread.append(key)
    return unread


class _AnythingBut(str):
    """A condition ``!= value`` in messages: its repr reads ``anything but 'none'``."""

    def __repr__(self) -> str:
        return f"anything but {str.__repr__(self)}"


def readers_of(key: str) -> dict[str, list[Any]]:
    """Which settings' values make the dotted setting ``key`` read: setting -> its values
    (built-in components, option values, ``"runtime"`` -> runtimes), for error messages."""

    def names(entries: Any) -> set[str]:
        keys = [k for e in entries for k in (e.keys if isinstance(e, When) else (e,))]
        return {name for k in keys for name in _expand(k)}

    found: dict[str, list[Any]] = {}
    for setting, kind in COMPONENT_SETTINGS.items():
        for name in components.names(kind):
            try:
                entries = declared_reads(components.resolve(kind, name))
            except ConfigError:
                continue
            if key in names(e for e in entries if not isinstance(e, When)):
                found.setdefault(setting, []).append(name)
            for entry in entries:  # read under a condition: name the condition
                if isinstance(entry, When) and key in names([entry]):
                    value = _AnythingBut(entry.value) if entry.negate else entry.value
                    if value not in found.setdefault(entry.key, []):
                        found[entry.key].append(value)
    for entry in _OPTION_ENTRIES:
        if key in names([entry]) and entry.value not in found.setdefault(entry.key, []):
            found[entry.key].append(entry.value)
    for runtime, keys in RUNTIME_READS.items():
        if key in names(keys):
            found.setdefault("runtime", []).append(runtime)
    return found


def check_reads(config: ScenarioConfig, runtime: str = "simulation") -> dict[str, str]:
    """What ``config``'s components read (:func:`settings_read`); ConfigError if a setting
    that none of them reads differs from its default (it would change nothing)."""
    read = settings_read(config, runtime)
    refuse_unread(unread_settings(config, read), config, read)
    return read


def _here(setting: str, config: ScenarioConfig, read: dict[str, str]) -> str:
    """What ``config`` has for ``setting``, or which components would read it, for messages."""
    if setting == "runtime":  # not a setting of the file: say where it is chosen
        return " (chosen by `p2pdp run --runtime`, not by the scenario)"
    if setting in read:
        return f" (here {setting_value(config, setting)!r})"
    readers = readers_of(setting)
    return (
        " (itself read only with "
        + "; ".join(f"{s} = {' or '.join(map(repr, values))}" for s, values in readers.items())
        + ")"
    )


def unread_reason(key: str, config: ScenarioConfig, read: dict[str, str]) -> str:
    """Why nothing ``config`` selects reads the setting ``key``: its value, the components
    that would read it and what ``config`` selects instead (``read``: what it reads), e.g.
    ``"groups.group_size = 1 is read only with protocol.name = 'one-shot' (here 'dpsgd')"``."""
    readers = readers_of(key)
    would = "; ".join(
        f"{setting} = {' or '.join(map(repr, values))}" + _here(setting, config, read)
        for setting, values in readers.items()
    )
    if not readers:
        return f"{key} = {setting_value(config, key)!r} is read by no built-in component"
    if list(readers.get("runtime", ())) == ["simulation"]:  # the simulated transport model
        would = would.removesuffix(")") + (
            "; on the network runtime messages cross a real network, whose latency and loss "
            "are its own: `--unset` it, or emulate them with benchmarks/netns_run.py)"
        )
    return f"{key} = {setting_value(config, key)!r} is read only with {would}"


def refuse_unread(keys: list[str], config: ScenarioConfig, read: dict[str, str]) -> None:
    """ConfigError naming each of ``keys`` (settings no selected component reads), its value,
    the components that would read it and what this config selects instead."""
    if not keys:
        return
    lines = [unread_reason(key, config, read) for key in keys]
    raise ConfigError(
        f"{'; '.join(lines)}: nothing this scenario selects reads "
        f"{'it' if len(keys) == 1 else 'them'}, so {'it' if len(keys) == 1 else 'they'} "
        f"would change nothing; remove {'it' if len(keys) == 1 else 'them'} or select a "
        f"component that reads {'it' if len(keys) == 1 else 'them'}"
    )
