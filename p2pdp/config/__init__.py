"""Scenario configuration: every table of a scenario file composed into one frozen config.

A :class:`ScenarioConfig` describes one simulated world (data, partition, training, privacy,
groups, network, publication, evaluation); sweeps are the scenario's
(:mod:`p2pdp.experiments.scenarios.scenario`). Each table is a frozen dataclass declared beside
the code that reads it (:mod:`p2pdp.data.settings`, :mod:`p2pdp.learning.settings`,
:mod:`p2pdp.privacy.settings`, :mod:`p2pdp.protocols.settings`; the tables whose readers sit
above this package in :mod:`p2pdp.config.tables`). Every field declares its constraint next to
its default (``field(metadata=check(...))``, the constraints of :mod:`p2pdp.core.validation`),
checked on construction; an invalid value raises :class:`~p2pdp.core.errors.ConfigError`
naming the dotted key and the value, e.g. ``privacy.epsilon must be > 0 and finite, got -1``.
A table's own cross-field rules are in its ``__post_init__``; the rules across tables are
:class:`ScenarioConfig`'s, and apply only to the settings a run reads
(:mod:`p2pdp.config.reads`). Settings that name a component take their options from the
registry.

Section dataclasses are keyword-only and frozen; derive variants with :func:`with_value`,
which takes a dotted key path such as ``"groups.group_size"``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from p2pdp.config.reads import (
    COMPONENT_SETTINGS,
    ENGINE_READS,
    OPTION_READS,
    RUNTIME_READS,
    UNDECLARED_READS,
    check_reads,
    option_reads,
    readers_of,
    refuse_unread,
    setting_value,
    settings_read,
    unread_reason,
    unread_settings,
)
from p2pdp.config.tables import (
    LATENCY_MODELS,
    PREVALENCE_SOURCES,
    PUBLIC_NAMES,
    RESPONSE_FORMS,
    SECTIONS,
    NetworkConfig,
    PoolingConfig,
    PrevalenceConfig,
    TaskConfig,
    field_key,
    field_names,
    public_key,
)
from p2pdp.core import components
from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import FileName, IntAtLeast, check, validate_fields
from p2pdp.data.preprocess import NORM_STEPS, Preprocessor
from p2pdp.data.settings import FILE_LOADER_OPTIONS, DataConfig, PartitionConfig
from p2pdp.learning.settings import EvaluationConfig, TrainingConfig
from p2pdp.privacy.mechanisms import NoNoise
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GossipConfig, GroupsConfig, ProtocolConfig, PublicationConfig

#: What this module defines and what it re-exports of the analysis of reads and of the
#: constants of its own tables (each table class is documented in its own module, and imported
#: from here by name like every other public name).
__all__ = [
    "COMPONENT_SETTINGS",
    "ENGINE_READS",
    "LATENCY_MODELS",
    "OPTION_READS",
    "PREVALENCE_SOURCES",
    "PUBLIC_NAMES",
    "RESPONSE_FORMS",
    "RUNTIME_READS",
    "UNDECLARED_READS",
    "ScenarioConfig",
    "check_reads",
    "flat_settings",
    "gossip_faults",
    "option_reads",
    "readers_of",
    "refuse_unread",
    "setting_value",
    "settings_read",
    "unread_reason",
    "unread_settings",
    "with_value",
]


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
        unknown = sorted(set(value) - set(field_names(cls)))
        if unknown:
            raise ConfigError(
                f"{name}.{unknown[0]} is not a setting of [{name}]; valid: "
                f"{', '.join(field_names(cls))}"
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


def with_value(config: ScenarioConfig, key: str, value: Any) -> ScenarioConfig:
    """A copy of ``config`` with the dotted ``key`` (e.g. ``"privacy.epsilon"``) set.

    Top-level keys (``"seed"``, ``"name"``) have no dot; ``"training.lambda"`` and the
    attribute path ``"training.lam"`` both set lambda. Validation runs again, so an invalid
    value raises :class:`ConfigError`.
    """
    section, dot, name = field_key(key).partition(".")
    if not dot:
        if section not in field_names(ScenarioConfig) or section in SECTIONS:
            raise ConfigError(f"unknown setting {key!r}")
        return dataclasses.replace(config, **{section: value})
    if section not in SECTIONS or name not in field_names(SECTIONS[section]):
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
