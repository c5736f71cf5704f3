"""Scenario configuration: frozen, validated dataclasses, one per table of a scenario file.

A :class:`ScenarioConfig` describes one simulated world (data, partition, training, privacy,
groups, network, publication, evaluation) plus an optional ``sweep`` grid. Every value is
validated on construction and an invalid one raises :class:`~p2pdp.errors.ConfigError` naming
the dotted key and the value, e.g. ``privacy.epsilon must be > 0 and finite, got -1``.

Section dataclasses are keyword-only and frozen; derive variants with :func:`with_value`,
which takes a dotted key path such as ``"groups.group_size"``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from p2pdp import components
from p2pdp.errors import ConfigError

# Settings that name a component (data.dataset, training.model, privacy.mechanism,
# privacy.accountant, groups.sampler, evaluation.vote, task.name) take their options from the
# registry (p2pdp.components): a registered name or an import string 'package.module:Name'.
TRANSFORM_STEPS = ("log1p", "minmax", "bias", "project_unit_ball", "scale_sqrt_d")
PARTITION_SCHEMES = ("iid", "label_skew", "quantity_skew")
SENSITIVITY_MODES = ("group-mean", "pathak")
LATENCY_MODELS = ("constant", "exponential", "lognormal")
PUBLICATION_MODES = ("group", "full")
SPLITS = ("cv", "fixed")
DEFAULT_EPSILON_PER_AGGREGATION = 0.1
OVERLAYS = ("random-regular", "erdos-renyi", "watts-strogatz", "barabasi-albert")


def _fail(key: str, requirement: str, value: object) -> ConfigError:
    return ConfigError(f"{key} must be {requirement}, got {value!r}")


def _positive(key: str, value: float, *, allow_inf: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if not ok or math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise _fail(key, "> 0" + ("" if allow_inf else " and finite"), value)


def _non_negative(key: str, value: float) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0:
        raise _fail(key, ">= 0 and finite", value)


def _int_at_least(key: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise _fail(key, f"an integer >= {low}", value)


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(allowed)}; got {value!r}")


def _probability(key: str, value: float, *, open_upper: bool = True) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (0.0 <= value < 1.0 if open_upper else 0.0 <= value <= 1.0):
        raise _fail(key, "in [0, 1)" if open_upper else "in [0, 1]", value)


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig:
    """Which data set, and how rows are transformed before training.

    ``dataset`` names a registered loader (``p2pdp components dataset``: ``spambase``,
    ``australian``, ``adult``, ``synthetic``, ``csv``, ``libsvm``) or gives an import string
    ``"package.module:function"`` of your own loader (see
    :class:`p2pdp.datasets.DatasetLoader`). ``path`` is where a built-in data set's files are
    searched first, the file ``csv`` and ``libsvm`` read (required for them), and free for
    your own loader to read.

    Options of the file loaders (an error for any other data set unless left at the default):
    ``test_path`` a second file in the same format, the predefined test split
    (``csv``, ``libsvm``); ``delimiter`` a single character or ``"whitespace"`` (``csv``);
    ``header`` skip a first line of column names (``csv``); ``label_column`` 0-based column of
    the label, negative from the end, default -1: the last (``csv``); ``n_features`` the number
    of features d, default: the largest index in the file(s) (``libsvm``).

    ``transform`` steps are applied in order (see :mod:`p2pdp.preprocess`); the last step must
    bound every row's L2 norm by 1, which the privacy proof needs. ``bounds = "data"`` fits
    min-max on the pooled training fold (a global, non-private step, recorded in results);
    ``"manifest"`` uses the data set's data-independent feature bounds.
    ``synthetic_*`` size the ``synthetic`` data set (a logistic model with lognormal features).
    """

    dataset: str = "spambase"
    path: str | None = None
    test_path: str | None = None
    delimiter: str = ","
    header: bool = False
    label_column: int = -1
    n_features: int | None = None
    transform: tuple[str, ...] = ("log1p", "minmax", "bias", "project_unit_ball")
    bounds: str = "data"
    synthetic_rows: int = 4000
    synthetic_test_rows: int = 1000
    synthetic_features: int = 57

    def __post_init__(self) -> None:
        components.check("dataset", self.dataset, "data.dataset")
        for key in ("path", "test_path"):
            value = getattr(self, key)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, key, value := os.fspath(value))
            if value is not None and not (isinstance(value, str) and value):
                raise _fail(f"data.{key}", "a non-empty path string", value)
        if self.dataset in FILE_LOADER_OPTIONS and self.path is None:
            raise ConfigError(
                f"data.path is required for data.dataset = {self.dataset!r}: "
                f"the {self.dataset} file to read"
            )
        if not isinstance(self.delimiter, str) or not (
            self.delimiter == "whitespace"
            or (len(self.delimiter) == 1 and self.delimiter not in '\r\n"0123456789.+-eE')
        ):
            raise _fail(
                "data.delimiter",
                "one character (not a digit, sign, '.', 'e', quote or newline) or 'whitespace'",
                self.delimiter,
            )
        if not isinstance(self.header, bool):
            raise _fail("data.header", "true or false", self.header)
        if not isinstance(self.label_column, int) or isinstance(self.label_column, bool):
            requirement = "an integer (0-based; -1 is the last column)"
            raise _fail("data.label_column", requirement, self.label_column)
        if self.n_features is not None:
            _int_at_least("data.n_features", self.n_features, 1)
        for key, default in _FILE_OPTION_DEFAULTS.items():
            value = getattr(self, key)
            if value != default and key not in FILE_LOADER_OPTIONS.get(self.dataset, ()):
                users = [name for name, keys in FILE_LOADER_OPTIONS.items() if key in keys]
                raise ConfigError(
                    f"data.{key} is an option of data.dataset = {' or '.join(map(repr, users))}; "
                    f"got data.{key} = {value!r} with data.dataset = {self.dataset!r}"
                )
        if not self.transform:
            raise _fail("data.transform", "a non-empty list of steps", list(self.transform))
        for step in self.transform:
            _one_of("data.transform", step, TRANSFORM_STEPS)
        _one_of("data.bounds", self.bounds, ("data", "manifest"))
        _int_at_least("data.synthetic_rows", self.synthetic_rows, 2)
        _int_at_least("data.synthetic_test_rows", self.synthetic_test_rows, 1)
        _int_at_least("data.synthetic_features", self.synthetic_features, 1)


#: Options of the built-in file loaders (data.dataset = "csv" / "libsvm") and their defaults.
FILE_LOADER_OPTIONS = {
    "csv": ("test_path", "delimiter", "header", "label_column"),
    "libsvm": ("test_path", "n_features"),
}
_FILE_OPTION_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(DataConfig)
    if any(f.name in options for options in FILE_LOADER_OPTIONS.values())
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionConfig:
    """How training rows are split into peer shards (``alpha`` for the skewed schemes)."""

    n_peers: int = 100
    scheme: str = "iid"
    alpha: float = 0.5
    min_shard_size: int = 1

    def __post_init__(self) -> None:
        _int_at_least("partition.n_peers", self.n_peers, 1)
        _one_of("partition.scheme", self.scheme, PARTITION_SCHEMES)
        _positive("partition.alpha", self.alpha)
        _int_at_least("partition.min_shard_size", self.min_shard_size, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """Local training: L2 regularisation ``lam`` (TOML key ``lambda``), optional simulated time.

    ``model`` is the local learner (a ``model`` component: ``"logistic"`` or an import
    string). ``seconds_per_row`` > 0 makes a peer available only after
    ``n_j * seconds_per_row`` seconds of simulated training time.
    """

    lam: float = 1e-2
    model: str = "logistic"
    seconds_per_row: float = 0.0

    def __post_init__(self) -> None:
        _positive("training.lambda", self.lam)
        components.check("model", self.model, "training.model")
        _non_negative("training.seconds_per_row", self.seconds_per_row)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyConfig:
    """Per-peer budget and the aggregation mechanism.

    Each peer has ``epsilon`` (and ``delta`` for the Gaussian mechanism) in total; every
    aggregation it joins costs ``epsilon_per_aggregation`` (``delta_per_aggregation``).
    ``sensitivity = "group-mean"`` calibrates on 2/(K n_min lambda); ``"pathak"`` on the
    seed's 2/(n_min lambda). ``secure_aggregation`` hides individual models from the curator.

    ``noise_multiplier`` (Gaussian only) is the alternative to ``epsilon_per_aggregation``:
    fix the noise ``sigma = z * Delta_2`` of every release and let the accountant say how many
    aggregations the budget affords. Give at most one of the two (neither: ``epsilon_A =
    0.1``); with ``z`` the per-release guarantee is ``epsilon_A = gdp_epsilon(1/z, delta_A)``,
    the analytic Gaussian calibration of that ``z`` (:attr:`step_epsilon`).

    ``accountant = "auto"`` (the default) is ``gdp`` (exact composition) for the Gaussian
    mechanism and ``basic`` for every other; results rows record the resolved name
    (:attr:`resolved_accountant`).
    """

    epsilon: float = 1.0
    epsilon_per_aggregation: float | None = None
    delta: float = 0.0
    delta_per_aggregation: float = 0.0
    mechanism: str = "vector-laplace"
    sensitivity: str = "group-mean"
    accountant: str = "auto"
    secure_aggregation: bool = False
    noise_multiplier: float | None = None

    def resolve_mechanism_name(self) -> str:
        """``"gaussian"`` when the mechanism's class is (a subclass of) the Gaussian mechanism."""
        from p2pdp.mechanisms import Gaussian

        cls = components.resolve("mechanism", self.mechanism, key="privacy.mechanism")
        return "gaussian" if isinstance(cls, type) and issubclass(cls, Gaussian) else self.mechanism

    @property
    def resolved_accountant(self) -> str:
        """``accountant`` with ``"auto"`` resolved (``gdp`` for gaussian, else ``basic``)."""
        from p2pdp.accounting import resolve_accountant_name

        return resolve_accountant_name(self.accountant, self.mechanism)

    @property
    def step_epsilon(self) -> float:
        """Epsilon of one aggregation: ``epsilon_per_aggregation``, or the one ``z`` implies.

        With ``noise_multiplier = z``: ``gdp_epsilon(1/z, delta_per_aggregation)``, the tight
        ``(epsilon, delta_A)`` of one Gaussian release at ``sigma = z Delta_2`` (the analytic
        Gaussian calibration at that point gives back ``z``).
        """
        if self.noise_multiplier is not None:
            from p2pdp.gdp import gdp_epsilon

            return float(gdp_epsilon(1.0 / self.noise_multiplier, self.delta_per_aggregation))
        if self.epsilon_per_aggregation is None:
            return DEFAULT_EPSILON_PER_AGGREGATION
        return self.epsilon_per_aggregation

    @property
    def approximate(self) -> bool:
        """Whether the mechanism needs ``delta > 0`` (``gaussian``, or a plug-in that says so)."""
        cls = components.resolve("mechanism", self.mechanism, key="privacy.mechanism")
        return bool(getattr(cls, "approximate", False))

    def __post_init__(self) -> None:
        _positive("privacy.epsilon", self.epsilon)
        if self.epsilon_per_aggregation is not None:
            _positive("privacy.epsilon_per_aggregation", self.epsilon_per_aggregation)
        components.check("mechanism", self.mechanism, "privacy.mechanism")
        _one_of("privacy.sensitivity", self.sensitivity, SENSITIVITY_MODES)
        if self.accountant != "auto":
            components.check("accountant", self.accountant, "privacy.accountant")
        if self.approximate:
            for key, value in (
                ("privacy.delta", self.delta),
                ("privacy.delta_per_aggregation", self.delta_per_aggregation),
            ):
                if not (isinstance(value, (int, float)) and 0.0 < value < 1.0):
                    raise _fail(key, f"in (0, 1) for the {self.mechanism} mechanism", value)
            if self.delta_per_aggregation > self.delta:
                raise ConfigError(
                    "privacy.delta_per_aggregation must be <= privacy.delta "
                    f"({self.delta!r}), got {self.delta_per_aggregation!r}"
                )
        if self.accountant in ("rdp", "gdp") and not self.approximate:
            raise ConfigError(
                f"privacy.accountant = {self.accountant!r} needs privacy.mechanism = "
                f"'gaussian'; got mechanism {self.mechanism!r}"
            )
        if self.noise_multiplier is not None:
            _positive("privacy.noise_multiplier", self.noise_multiplier)
            if self.epsilon_per_aggregation is not None:
                raise ConfigError(
                    "set only one of privacy.epsilon_per_aggregation and "
                    f"privacy.noise_multiplier; got {self.epsilon_per_aggregation!r} and "
                    f"{self.noise_multiplier!r}"
                )
            if self.resolve_mechanism_name() != "gaussian":
                raise ConfigError(
                    "privacy.noise_multiplier needs privacy.mechanism = 'gaussian'; "
                    f"got {self.mechanism!r}"
                )
        step = self.step_epsilon
        if step > self.epsilon * (1 + 1e-12):
            key = (
                "privacy.epsilon_per_aggregation"
                if self.noise_multiplier is None
                else "the epsilon of one release at privacy.noise_multiplier"
            )
            raise ConfigError(f"{key} must be <= privacy.epsilon ({self.epsilon!r}), got {step!r}")
        if not isinstance(self.secure_aggregation, bool):
            raise _fail("privacy.secure_aggregation", "true or false", self.secure_aggregation)
        if self.secure_aggregation and not getattr(
            components.resolve("mechanism", self.mechanism, key="privacy.mechanism"),
            "splittable",
            False,
        ):
            splittable = [
                name
                for name in components.names("mechanism")
                if getattr(components.resolve("mechanism", name), "splittable", False)
            ]
            raise ConfigError(
                "privacy.secure_aggregation = true needs noise the members can split: "
                f"privacy.mechanism must be one of {', '.join(splittable)}; "
                f"got {self.mechanism!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupsConfig:
    """Group formation.

    ``group_size`` peers per aggregation; ``max_concurrent_groups`` disjoint groups in flight
    (1 = the seed's sequential loop). ``collect_timeout`` (simulated seconds) bounds how long a
    curator waits for the members' models before aborting the group without charging anyone;
    after ``max_failed_attempts`` consecutive aborted groups the run stops.
    ``sampler = "gossip"`` forms groups from local views only (see :mod:`p2pdp.sim.gossip`).
    """

    sampler: str = "central"
    group_size: int = 10
    max_concurrent_groups: int = 1
    collect_timeout: float = 10.0
    max_failed_attempts: int = 100

    def __post_init__(self) -> None:
        components.check("sampler", self.sampler, "groups.sampler")
        _int_at_least("groups.group_size", self.group_size, 1)
        _int_at_least("groups.max_concurrent_groups", self.max_concurrent_groups, 1)
        _positive("groups.collect_timeout", self.collect_timeout)
        _int_at_least("groups.max_failed_attempts", self.max_failed_attempts, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkConfig:
    """Message transport: one-way latency (seconds), bandwidth (bytes/s), loss probability.

    ``latency = "constant"`` uses ``latency_mean``; ``"exponential"`` draws with that mean;
    ``"lognormal"`` has mean ``latency_mean`` and log-space std ``latency_sigma``.
    ``bandwidth = inf`` means transfers take no time beyond the latency.
    """

    latency: str = "constant"
    latency_mean: float = 0.05
    latency_sigma: float = 0.5
    bandwidth: float = math.inf
    loss: float = 0.0

    def __post_init__(self) -> None:
        _one_of("network.latency", self.latency, LATENCY_MODELS)
        _non_negative("network.latency_mean", self.latency_mean)
        _non_negative("network.latency_sigma", self.latency_sigma)
        _positive("network.bandwidth", self.bandwidth, allow_inf=True)
        _probability("network.loss", self.loss)


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipConfig:
    """Decentralised group formation (``groups.sampler = "gossip"``, see :mod:`p2pdp.sim.gossip`).

    Overlay (the peers' initial neighbours, :mod:`p2pdp.overlay`): ``overlay`` is one of
    ``OVERLAYS``; ``degree`` is the degree of ``random-regular`` and the ring degree of
    ``watts-strogatz`` (rewired with probability ``rewiring``); ``erdos-renyi`` links each pair
    with ``edge_probability`` (None: ``degree / (P - 1)``, mean degree ``degree``);
    ``barabasi-albert`` attaches each new peer to ``attachment`` peers. A disconnected overlay
    is an error unless ``allow_disconnected``.

    Peer sampling (Newscast): views of ``view_size`` entries exchanged every ``gossip_period``
    simulated seconds. Group formation: a free peer initiates after an exponential backoff of
    mean ``backoff`` seconds; each request waits ``invite_timeout`` seconds for replies and is
    repeated at most ``max_retries`` times; an invited peer stays locked ``lock_timeout``
    seconds after the last message of the group being formed.

    Faults: with ``churn``, peers alternate lognormal online sessions (median
    ``session_median`` s, log-space std ``session_sigma``) and offline periods (median
    ``downtime_median`` s, ``downtime_sigma``). Each started aggregation loses its curator
    with probability ``curator_crash_probability`` and one member with probability
    ``member_crash_probability``; a crashed peer is offline for a downtime draw.
    """

    overlay: str = "random-regular"
    degree: int = 10
    edge_probability: float | None = None
    rewiring: float = 0.1
    attachment: int = 5
    allow_disconnected: bool = False
    view_size: int = 20
    gossip_period: float = 1.0
    backoff: float = 10.0
    invite_timeout: float = 0.5
    lock_timeout: float = 5.0
    max_retries: int = 3
    churn: bool = False
    session_median: float = 60.0
    session_sigma: float = 1.0
    downtime_median: float = 20.0
    downtime_sigma: float = 1.0
    curator_crash_probability: float = 0.0
    member_crash_probability: float = 0.0

    def __post_init__(self) -> None:
        _one_of("gossip.overlay", self.overlay, OVERLAYS)
        _int_at_least("gossip.degree", self.degree, 1)
        if self.edge_probability is not None:
            _positive("gossip.edge_probability", self.edge_probability)
            _probability("gossip.edge_probability", self.edge_probability, open_upper=False)
        _probability("gossip.rewiring", self.rewiring, open_upper=False)
        _int_at_least("gossip.attachment", self.attachment, 1)
        for key in ("allow_disconnected", "churn"):
            if not isinstance(getattr(self, key), bool):
                raise _fail(f"gossip.{key}", "true or false", getattr(self, key))
        _int_at_least("gossip.view_size", self.view_size, 1)
        for key in (
            "gossip_period",
            "backoff",
            "invite_timeout",
            "lock_timeout",
            "session_median",
            "downtime_median",
        ):
            _positive(f"gossip.{key}", getattr(self, key))
        _int_at_least("gossip.max_retries", self.max_retries, 0)
        _non_negative("gossip.session_sigma", self.session_sigma)
        _non_negative("gossip.downtime_sigma", self.downtime_sigma)
        for key in ("curator_crash_probability", "member_crash_probability"):
            _probability(f"gossip.{key}", getattr(self, key), open_upper=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicationConfig:
    """Who receives a published model: ``"group"`` (members) or ``"full"`` (every peer)."""

    mode: str = "full"

    def __post_init__(self) -> None:
        _one_of("publication.mode", self.mode, PUBLICATION_MODES)


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationConfig:
    """How runs are evaluated.

    ``split = "cv"``: stratified ``cv_folds``-fold cross-validation; ``"fixed"``: the data
    set's predefined train/test split (adult). ``folds`` limits which folds run (empty = all).
    ``vote``: ensemble rule, ``"majority"`` of signs (ties broken by the summed margin, then
    +1), ``"mean-margin"`` (sign of the mean margin, 0 -> +1), ``"majority-own"`` (ties to
    the own model), ``"average"`` or ``"local-validated"`` (noise-aware, see
    :mod:`p2pdp.evaluation`). ``best_lambda_reference``: also report the non-private
    centralised model at its own cross-validated lambda (``centralized_best_lambda_error``;
    a few seconds per fold, computed once per training key).
    """

    vote: str = "majority"
    split: str = "cv"
    cv_folds: int = 10
    folds: tuple[int, ...] = ()
    best_lambda_reference: bool = False

    def __post_init__(self) -> None:
        components.check("ensemble", self.vote, "evaluation.vote")
        if not isinstance(self.best_lambda_reference, bool):
            raise _fail(
                "evaluation.best_lambda_reference", "true or false", self.best_lambda_reference
            )
        _one_of("evaluation.split", self.split, SPLITS)
        _int_at_least("evaluation.cv_folds", self.cv_folds, 2)
        for fold in self.folds:
            if not isinstance(fold, int) or not 0 <= fold < self.cv_folds:
                raise _fail("evaluation.folds", f"fold indices in [0, {self.cv_folds})", fold)

    def fold_indices(self) -> tuple[int, ...]:
        """Folds a run covers: ``(0,)`` for a fixed split, else ``folds`` or all."""
        if self.split == "fixed":
            return (0,)
        return self.folds or tuple(range(self.cv_folds))


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskConfig:
    """The workload (a ``task`` component, see :mod:`p2pdp.tasks`).

    ``name`` is a registered task (``"logistic"``: the seed's logistic-regression ensembles)
    or an import string ``package.module:Class``.
    """

    name: str = "logistic"

    def __post_init__(self) -> None:
        components.check("task", self.name, "task.name")


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
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioConfig:
    """One simulated world, plus an optional sweep grid.

    ``sweep`` maps dotted keys (``"groups.group_size"``) to tuples of values; the cells of the
    grid are the cartesian product (see :attr:`p2pdp.scenario.Scenario.points`).
    ``seed`` is the root of every random stream of every cell; ``repetitions`` repeats each
    cell with independent streams.
    """

    name: str = "scenario"
    seed: int = 0
    repetitions: int = 1
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
    sweep: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise _fail("name", "a non-empty string", self.name)
        _int_at_least("seed", self.seed, 0)
        _int_at_least("repetitions", self.repetitions, 1)
        if self.groups.group_size > self.partition.n_peers:
            raise ConfigError(
                f"groups.group_size must be <= partition.n_peers ({self.partition.n_peers}), "
                f"got {self.groups.group_size}"
            )
        if self.evaluation.split == "fixed" or self.data.bounds == "manifest":
            _check_data_provides(self.data, self.evaluation)
        for key, values in self.sweep:
            section, _, name = key.partition(".")
            if section not in SECTIONS or name not in _field_names(SECTIONS[section]):
                raise ConfigError(f"sweep key {key!r} is not a scenario setting")
            if len(values) == 0:
                raise ConfigError(f"sweep.{key} must list at least one value, got []")

    def without_sweep(self) -> ScenarioConfig:
        return dataclasses.replace(self, sweep=())


def _check_data_provides(data: DataConfig, evaluation: EvaluationConfig) -> None:
    """Reject a fixed split or manifest bounds that the configured data set cannot provide.

    Known without loading for the built-ins (:func:`p2pdp.datasets.provides`); an import
    string is checked when it is loaded (:func:`p2pdp.pipeline.load_fold`).
    """
    from p2pdp import datasets  # not at module level: datasets imports scikit-learn

    provided = datasets.provides(data)
    if evaluation.split == "fixed" and provided.test_split is False:
        if data.dataset in FILE_LOADER_OPTIONS:
            raise ConfigError(
                "evaluation.split = 'fixed' needs a predefined test split: set data.test_path "
                f"to the test file for data.dataset = {data.dataset!r}"
            )
        raise ConfigError(
            "evaluation.split = 'fixed' needs a data set with a predefined test split "
            f"({', '.join(datasets.builtins_with('test_split'))}); "
            f"got data.dataset = {data.dataset!r}"
        )
    if data.bounds == "manifest" and provided.feature_bounds is False:
        if data.dataset in FILE_LOADER_OPTIONS:
            raise ConfigError(
                "data.bounds = 'manifest' needs data-independent bounds, which a "
                f"{data.dataset} file does not carry (a loader of your own can return them, "
                f"see p2pdp.datasets.RawData); got data.dataset = {data.dataset!r}"
            )
        having = datasets.builtins_with("feature_bounds")
        raise ConfigError(
            f"data.bounds = 'manifest' needs data-independent bounds, which only "
            f"{', '.join(having)} {'has' if len(having) == 1 else 'have'}; "
            f"got data.dataset = {data.dataset!r}"
        )


def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def with_value(config: ScenarioConfig, key: str, value: Any) -> ScenarioConfig:
    """A copy of ``config`` with the dotted ``key`` (e.g. ``"privacy.epsilon"``) set.

    Top-level keys (``"seed"``, ``"name"``) have no dot. Validation runs again, so an invalid
    value raises :class:`ConfigError`.
    """
    section, dot, name = key.partition(".")
    if not dot:
        if section not in _field_names(ScenarioConfig) or section in SECTIONS:
            raise ConfigError(f"unknown setting {key!r}")
        return dataclasses.replace(config, **{section: value})
    if section not in SECTIONS or name not in _field_names(SECTIONS[section]):
        raise ConfigError(f"unknown setting {key!r}")
    new_section = dataclasses.replace(getattr(config, section), **{name: value})
    return dataclasses.replace(config, **{section: new_section})


def flat_settings(config: ScenarioConfig) -> dict[str, Any]:
    """Every setting as ``{"section.field": value}`` for results rows (tuples joined by ``+``)."""
    row: dict[str, Any] = {"name": config.name, "seed": config.seed}
    for section in SECTIONS:
        for key, value in dataclasses.asdict(getattr(config, section)).items():
            row[f"{section}.{key}"] = (
                "+".join(map(str, value)) if isinstance(value, tuple) else value
            )
    # resolved values: what the run used ("auto" -> gdp/basic; the default or z's epsilon_A)
    row["privacy.accountant"] = config.privacy.resolved_accountant
    row["privacy.epsilon_per_aggregation"] = config.privacy.step_epsilon
    return row
