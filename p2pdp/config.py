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
import os
from dataclasses import dataclass, field
from typing import Any

from p2pdp.core import components
from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import (
    AllOf,
    Boolean,
    ComponentName,
    FileName,
    IntAtLeast,
    Interval,
    NonNegative,
    OneOf,
    Optional,
    Positive,
    Probability,
    as_list,
    check,
    invalid,
    validate_fields,
)
from p2pdp.data.settings import FILE_LOADER_OPTIONS, DataConfig
from p2pdp.data.settings import TRANSFORM_STEPS as TRANSFORM_STEPS  # the schema lists it

# Settings that name a component (data.dataset, training.model, privacy.mechanism,
# privacy.accountant, groups.sampler, evaluation.vote, task.name) take their options from the
# registry (p2pdp.core.components): a registered name or an import string 'package.module:Name'.
PARTITION_SCHEMES = ("iid", "label_skew", "quantity_skew", "contiguous", "column", "file")
SENSITIVITY_MODES = ("group-mean", "pathak")
LATENCY_MODELS = ("constant", "exponential", "lognormal")
PUBLICATION_MODES = ("group", "full")
SPLITS = ("cv", "fixed")
DEFAULT_EPSILON_PER_AGGREGATION = 0.1
OVERLAYS = ("random-regular", "erdos-renyi", "watts-strogatz", "barabasi-albert")
#: How the gossip sampler advances group formation (:mod:`p2pdp.sim.gossip.rounds`).
FORMATIONS = ("auto", "messages", "rounds")
#: How a peer of an iterative protocol picks the records of one private step.
RECORD_SAMPLINGS = ("full", "poisson", "fixed")
#: Whom ``privacy.epsilon`` is spent against when D-PSGD's noise is calibrated
#: (``protocol.threat_model``).
THREAT_MODELS = ("local", "eavesdropper", "curious-peer")
#: Most rounds, and averaging exchanges (rounds x gossip steps), of one iterative cell: about
#: an hour of one core at P = 100 (a guard against a typo such as ``rounds = 1e11``).
MAX_ROUNDS = 1_000_000
MAX_EXCHANGES = 10_000_000


#: Settings every run reads, whatever its components: the grid's seed, repetitions and split
#: (its folds: :data:`OPTION_READS`), the workload and the number of peers
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

#: What each runtime reads (its driver's ``reads``): the simulator's transport model reads
#: ``[network]``; on the network runtime messages cross a real network.
RUNTIME_READERS = {
    "simulation": "p2pdp.sim.transport:Transport",
    "network": "p2pdp.net.coordinator:NetworkWorld",
}

#: Settings an option-valued setting reads only for some of its values (while it is read
#: itself): setting -> value -> settings. A value missing here (a plug-in's) reads them all.
OPTION_READS: dict[str, dict[Any, tuple[str, ...]]] = {
    "partition.scheme": {
        "iid": (),
        "label_skew": ("partition.alpha",),
        "quantity_skew": ("partition.alpha",),
        "contiguous": (),
        "column": (),
        "file": ("partition.path",),
    },
    "protocol.sampling": {
        "full": (),
        "poisson": ("protocol.sampling_rate", "privacy.min_shard_size"),
        "fixed": ("protocol.batch_size",),
    },
    "gossip.overlay": {
        "random-regular": ("gossip.degree",),
        "erdos-renyi": ("gossip.degree", "gossip.edge_probability"),
        "watts-strogatz": ("gossip.degree", "gossip.rewiring"),
        "barabasi-albert": ("gossip.attachment",),
    },
    "gossip.churn": {
        False: (),
        True: (
            "gossip.session_median",
            "gossip.session_sigma",
            "gossip.downtime_median",
            "gossip.downtime_sigma",
        ),
    },
    "network.latency": {
        "constant": (),
        "exponential": (),
        "lognormal": ("network.latency_sigma",),
    },
    "prevalence.source": {"synthetic": ("prevalence.prevalence",), "dataset": ("data.*",)},
    "prevalence.response": {"keep": (), "two-coin": ("prevalence.theta2",)},
    "evaluation.split": {"cv": ("evaluation.cv_folds", "evaluation.folds"), "fixed": ()},
}

#: Most aggregations a peer's budget may be meant for (``epsilon / epsilon_per_aggregation``):
#: far beyond any simulated run, and a guard against a typo such as ``epsilon = 1e308``.
MAX_AGGREGATIONS_PER_PEER = 1e6


class Derived(float):
    """A float setting computed from other settings (e.g. ``privacy.delta_per_aggregation``).

    It compares, prints and computes like the float it holds; its type only tells
    ``__post_init__`` to compute it again when a copy changes the settings it depends on.
    """

    __slots__ = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionConfig:
    """How training rows are split into peer shards (:mod:`p2pdp.data.partition`).

    ``scheme``: ``"iid"``, ``"label_skew"`` / ``"quantity_skew"`` (Dirichlet ``alpha``),
    ``"contiguous"`` (consecutive rows in their order: iid only for exchangeable rows such as
    ``synthetic``'s), or a partition the user gives, one peer id in ``0..n_peers-1`` per row
    of the data set (the rows the folds are cut from; a fold's test rows are simply not used
    for training):
    ``"column"`` takes it from the data set (``data.peer_column``, or a loader's
    ``RawData.peers``), ``"file"`` from the text file ``path`` (one id per line). Every peer
    id must be used, and every peer must hold at least ``min_shard_size`` training rows in
    every fold.
    """

    n_peers: int = field(default=100, metadata=check(IntAtLeast(1)))
    scheme: str = field(default="iid", metadata=check(OneOf(PARTITION_SCHEMES)))
    alpha: float = field(default=0.5, metadata=check(Positive()))
    min_shard_size: int = field(default=1, metadata=check(IntAtLeast(1)))
    path: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.path, os.PathLike):
            object.__setattr__(self, "path", os.fspath(self.path))
        validate_fields(self, "partition")
        if self.path is not None and not (isinstance(self.path, str) and self.path):
            raise invalid("partition.path", "a non-empty path string", self.path)
        if self.scheme == "file" and self.path is None:
            raise ConfigError(
                "partition.path is required for partition.scheme = 'file': the file of "
                "peer ids, one per row of the data set"
            )
        if self.scheme != "file" and self.path is not None:
            raise ConfigError(
                f"partition.path is read only by partition.scheme = 'file'; got "
                f"partition.path = {self.path!r} with partition.scheme = {self.scheme!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingConfig:
    """Local training: L2 regularisation ``lam`` (TOML key, ``--set`` key and results column
    ``training.lambda``), optional simulated time.

    ``model`` is the local learner (a ``model`` component: ``"logistic"`` or an import
    string). ``seconds_per_row`` > 0 makes a peer available only after
    ``n_j * seconds_per_row`` seconds of simulated training time. ``lambda_source`` says
    where ``lambda`` came from when it was chosen by looking at data (e.g. ``"chosen by the
    lambda_grid sweep on Spambase (reads every peer's data and the test folds)"``); empty
    means the user chose it without looking at the data. A non-empty value is listed as a
    non-private step (:mod:`p2pdp.experiments.scenarios.disclosure`).
    """

    lam: float = field(default=1e-2, metadata=check(Positive()))
    model: str = field(default="logistic", metadata=check(ComponentName("model")))
    seconds_per_row: float = field(default=0.0, metadata=check(NonNegative()))
    lambda_source: str = ""

    def __post_init__(self) -> None:
        validate_fields(self, "training", {"lam": "lambda"})
        if not isinstance(self.lambda_source, str) or ";" in self.lambda_source:
            raise invalid(
                "training.lambda_source",
                "a string without ';' (results join non-private steps with '; ')",
                self.lambda_source,
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyConfig:
    """Per-peer budget and the aggregation mechanism.

    Each peer has ``epsilon`` (and ``delta`` for the Gaussian mechanism) in total; every
    aggregation it joins costs ``epsilon_per_aggregation`` (``delta_per_aggregation``).
    ``delta_per_aggregation = None`` (the default) derives it as
    ``delta * epsilon_per_aggregation / epsilon``, so basic composition spends ``delta`` with the
    budget's last aggregation. The derived value is stored in the field as a :class:`Derived`
    float, which is derived again whenever ``epsilon``, ``epsilon_per_aggregation`` or
    ``delta`` change (``dataclasses.replace``, a sweep); a value given explicitly is kept.
    ``sensitivity = "group-mean"`` calibrates on 2/(K n_min lambda); ``"pathak"`` on the
    seed's 2/(n_min lambda). ``secure_aggregation`` hides individual models from the curator.

    ``noise_multiplier`` (Gaussian only) is the alternative to ``epsilon_per_aggregation``:
    fix the noise ``sigma = z * Delta_2`` of every release and let the accountant say how many
    aggregations the budget affords. Give at most one of the two (neither: ``epsilon_A =
    0.1``); with ``z`` the per-release guarantee is ``epsilon_A = gdp_epsilon(1/z, delta_A)``,
    the analytic Gaussian calibration of that ``z`` (:attr:`step_epsilon`).

    ``accountant = "auto"`` (the default) is ``gdp`` (exact composition) for the Gaussian
    mechanism and ``basic`` for every other (the iterative protocols: ``pld`` for Poisson
    sampling, :meth:`ProtocolConfig.accountant`); ``pld`` composes privacy loss distributions
    (dp-accounting) of any of them. Results rows record the resolved name
    (:attr:`resolved_accountant`).
    ``tau`` bounds each record's log-likelihood for ``mechanism = "posterior-sampling"`` (the
    utility's sensitivity, :mod:`p2pdp.privacy.posterior_sampling.posterior`); other mechanisms
    ignore it.

    ``min_shard_size`` (default None) is a public lower bound on every peer's records: when
    set, a group's sensitivity is computed from it (as if every member held that many) instead
    of the members' claimed shard sizes, so no claim can shrink the noise; a peer with fewer
    records is refused (the simulator: before the run; the network runtime: a submission
    claiming fewer). Valid for tasks whose sensitivity does not grow with shard sizes (every
    built-in one). None: the members' own sizes, taken on trust. The iterative protocols'
    Poisson sampling needs it: its steps divide by ``sampling_rate * min_shard_size`` (under
    add/remove the peer's own shard size is private).
    """

    epsilon: float = field(default=1.0, metadata=check(Positive()))
    epsilon_per_aggregation: float | None = field(
        default=None, metadata=check(Optional(Positive()))
    )
    delta: float = 0.0
    delta_per_aggregation: float | None = None
    mechanism: str = field(default="vector-laplace", metadata=check(ComponentName("mechanism")))
    sensitivity: str = field(default="group-mean", metadata=check(OneOf(SENSITIVITY_MODES)))
    accountant: str = field(
        default="auto", metadata=check(ComponentName("accountant", extra=("auto",)))
    )
    secure_aggregation: bool = field(default=False, metadata=check(Boolean()))
    noise_multiplier: float | None = field(default=None, metadata=check(Optional(Positive())))
    min_shard_size: int | None = field(default=None, metadata=check(Optional(IntAtLeast(1))))

    def resolve_mechanism_name(self) -> str:
        """``"gaussian"`` when the mechanism's class is (a subclass of) the Gaussian mechanism."""
        from p2pdp.privacy.mechanisms import Gaussian

        cls = components.resolve("mechanism", self.mechanism, key="privacy.mechanism")
        return "gaussian" if isinstance(cls, type) and issubclass(cls, Gaussian) else self.mechanism

    @property
    def resolved_accountant(self) -> str:
        """``accountant`` with ``"auto"`` resolved (``gdp`` for gaussian, else ``basic``)."""
        from p2pdp.privacy.accounting import resolve_accountant_name

        return resolve_accountant_name(self.accountant, self.mechanism)

    @property
    def step_epsilon(self) -> float:
        """Epsilon of one aggregation (``epsilon_per_aggregation``, resolved on construction)."""
        return float(self.epsilon_per_aggregation)  # type: ignore[arg-type]  # never None here

    tau: float = field(default=1.0, metadata=check(Positive()))

    @property
    def needs_records(self) -> bool:
        """Whether the mechanism draws from a peer's records (``posterior-sampling``)."""
        cls = components.resolve("mechanism", self.mechanism, key="privacy.mechanism")
        return bool(getattr(cls, "needs_records", False))

    @property
    def approximate(self) -> bool:
        """Whether the mechanism needs ``delta > 0`` (``gaussian``, or a plug-in that says so)."""
        cls = components.resolve("mechanism", self.mechanism, key="privacy.mechanism")
        return bool(getattr(cls, "approximate", False))

    def _resolve_epsilon_per_aggregation(self) -> None:
        """Store the epsilon of one release: given, implied by ``noise_multiplier``, or 0.1.

        A resolved value is a :class:`Derived` float, so a copy with other settings resolves
        it again; after construction the field is never None.
        """
        given = self.epsilon_per_aggregation
        explicit = given is not None and not isinstance(given, Derived)
        if self.noise_multiplier is None:
            value = given if explicit else Derived(DEFAULT_EPSILON_PER_AGGREGATION)
        else:
            if explicit:
                raise ConfigError(
                    "set only one of privacy.epsilon_per_aggregation and "
                    f"privacy.noise_multiplier; got {given!r} and {self.noise_multiplier!r}"
                )
            if self.resolve_mechanism_name() != "gaussian":
                raise ConfigError(
                    "privacy.noise_multiplier calibrates the one-shot protocol's Gaussian "
                    f"releases and needs privacy.mechanism = 'gaussian'; got {self.mechanism!r} "
                    "(set privacy.epsilon_per_aggregation instead)"
                )
            delta_step = self.delta_per_aggregation
            if delta_step is None or isinstance(delta_step, Derived):
                raise ConfigError(
                    "privacy.delta_per_aggregation must be given with privacy.noise_multiplier "
                    "(the delta at which one release's epsilon is stated); got None. "
                    "privacy.noise_multiplier calibrates the one-shot protocol's releases; "
                    "iterative protocols take protocol.noise_multiplier"
                )
            from p2pdp.privacy.gdp import MAX_MU, gdp_epsilon

            if 1.0 / self.noise_multiplier > MAX_MU:
                raise ConfigError(
                    f"privacy.noise_multiplier must be >= {1 / MAX_MU:g} (below it one release's "
                    f"epsilon exceeds 5e11: no privacy), got {self.noise_multiplier!r}; for a "
                    "run without noise set privacy.mechanism = 'none'"
                )
            value = Derived(float(gdp_epsilon(1.0 / self.noise_multiplier, delta_step)))
        object.__setattr__(self, "epsilon_per_aggregation", value)

    @property
    def per_aggregation_derived(self) -> bool:
        """Whether the user gave neither ``epsilon_per_aggregation``, ``delta_per_aggregation``
        nor ``noise_multiplier`` (both per-aggregation values are the derived defaults)."""
        return (
            self.noise_multiplier is None
            and isinstance(self.epsilon_per_aggregation, Derived)
            and isinstance(self.delta_per_aggregation, Derived)
        )

    def check_per_aggregation(self) -> None:
        """ConfigError unless one aggregation's (epsilon, delta) fit the budget.

        Checked on construction when a per-aggregation value was given, else by
        :class:`ScenarioConfig` only when the protocol reads them (an iterative protocol
        spends its budget by steps, not aggregations).
        """
        step = self.step_epsilon  # first: a derived delta_per_aggregation follows from it
        if step > self.epsilon * (1 + 1e-12):
            key = (
                "privacy.epsilon_per_aggregation"
                if self.noise_multiplier is None
                else "the epsilon of one release at privacy.noise_multiplier"
            )
            raise ConfigError(f"{key} must be <= privacy.epsilon ({self.epsilon!r}), got {step!r}")
        if self.approximate:
            value = self.delta_per_aggregation
            if not (isinstance(value, (int, float)) and 0.0 < value < 1.0):
                raise invalid(
                    "privacy.delta_per_aggregation",
                    f"in (0, 1) for the {self.mechanism} mechanism",
                    value,
                )
            if value > self.delta:
                raise ConfigError(
                    "privacy.delta_per_aggregation must be <= privacy.delta "
                    f"({self.delta!r}), got {value!r}"
                )
        if self.epsilon / step > MAX_AGGREGATIONS_PER_PEER:
            raise ConfigError(
                f"privacy.epsilon / privacy.epsilon_per_aggregation must be <= "
                f"{MAX_AGGREGATIONS_PER_PEER:g} (aggregations per peer), got {self.epsilon!r} / "
                f"{step!r} = {self.epsilon / step:g}"
            )

    def __post_init__(self) -> None:
        validate_fields(self, "privacy")
        self._resolve_epsilon_per_aggregation()
        if self.delta_per_aggregation is None or isinstance(self.delta_per_aggregation, Derived):
            delta = self.delta
            ok = isinstance(delta, (int, float)) and not isinstance(delta, bool)
            step = self.step_epsilon
            derived = Derived(delta / (self.epsilon / step) if ok else 0.0)
            object.__setattr__(self, "delta_per_aggregation", derived)
        if self.approximate:
            if not (isinstance(self.delta, (int, float)) and 0.0 < self.delta < 1.0):
                raise invalid(
                    "privacy.delta", f"in (0, 1) for the {self.mechanism} mechanism", self.delta
                )
        elif self.delta != 0 or self.delta_per_aggregation != 0:
            raise ConfigError(
                f"privacy.delta must be 0 for privacy.mechanism = {self.mechanism!r} (pure "
                f"epsilon-DP: it uses no delta), got delta = {self.delta!r}, "
                f"delta_per_aggregation = {self.delta_per_aggregation!r}; set them to 0, or use "
                "an approximate mechanism such as 'gaussian'"
            )
        if self.accountant in ("rdp", "gdp") and not self.approximate:
            raise ConfigError(
                f"privacy.accountant = {self.accountant!r} needs privacy.mechanism = "
                f"'gaussian'; got mechanism {self.mechanism!r}"
            )
        if not self.per_aggregation_derived:
            self.check_per_aggregation()
        if self.secure_aggregation and self.needs_records:
            raise ConfigError(
                f"privacy.secure_aggregation = true cannot be used with privacy.mechanism = "
                f"{self.mechanism!r}: the mechanism samples from a peer's own records, which "
                "no curator may see; set privacy.secure_aggregation = false (groups of one)"
            )
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

    sampler: str = field(default="central", metadata=check(ComponentName("sampler")))
    group_size: int = field(default=10, metadata=check(IntAtLeast(1)))
    max_concurrent_groups: int = field(default=1, metadata=check(IntAtLeast(1)))
    collect_timeout: float = field(default=10.0, metadata=check(Positive()))
    max_failed_attempts: int = field(default=100, metadata=check(IntAtLeast(1)))

    def __post_init__(self) -> None:
        validate_fields(self, "groups")


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

    def __post_init__(self) -> None:
        validate_fields(self, "network")


@dataclass(frozen=True, slots=True, kw_only=True)
class GossipConfig:
    """Decentralised group formation (``groups.sampler = "gossip"``, see :mod:`p2pdp.sim.gossip`).

    Overlay (the peers' initial neighbours, :mod:`p2pdp.sim.overlay`): ``overlay`` is one of
    ``OVERLAYS``; ``degree`` is the degree of ``random-regular`` and the ring degree of
    ``watts-strogatz`` (rewired with probability ``rewiring``); ``erdos-renyi`` links each pair
    with ``edge_probability`` (None: ``degree / (P - 1)``, mean degree ``degree``);
    ``barabasi-albert`` attaches each new peer to ``attachment`` peers. A disconnected overlay
    is an error unless ``allow_disconnected``.

    Peer sampling (Newscast): views of ``view_size`` entries exchanged every ``gossip_period``
    simulated seconds. Group formation: a free peer initiates after an exponential backoff of
    mean ``backoff`` seconds; each request waits ``invite_timeout`` seconds for replies and is
    repeated at most ``max_retries`` times; an invited peer stays locked ``lock_timeout``
    seconds after the last message of the group being formed. ``formation``: ``"messages"``
    simulates every formation message (the reference), ``"rounds"`` advances every attempt by
    one round trip per tick over arrays (fault-free runs only: no loss, churn or crashes),
    ``"auto"`` takes rounds from ``ROUNDS_FROM_PEERS`` peers on for fault-free runs (see
    :mod:`p2pdp.sim.gossip.rounds`).

    Faults: with ``churn``, peers alternate lognormal online sessions (median
    ``session_median`` s, log-space std ``session_sigma``) and offline periods (median
    ``downtime_median`` s, ``downtime_sigma``). Each started aggregation loses its curator
    with probability ``curator_crash_probability`` and one member with probability
    ``member_crash_probability``; a crashed peer is offline for a downtime draw.
    """

    overlay: str = field(default="random-regular", metadata=check(OneOf(OVERLAYS)))
    degree: int = field(default=10, metadata=check(IntAtLeast(1)))
    edge_probability: float | None = field(
        default=None,
        metadata=check(Optional(AllOf((Positive(), Probability(open_upper=False))))),
    )
    rewiring: float = field(default=0.1, metadata=check(Probability(open_upper=False)))
    attachment: int = field(default=5, metadata=check(IntAtLeast(1)))
    allow_disconnected: bool = field(default=False, metadata=check(Boolean()))
    view_size: int = field(default=20, metadata=check(IntAtLeast(1)))
    gossip_period: float = field(default=1.0, metadata=check(Positive()))
    backoff: float = field(default=10.0, metadata=check(Positive()))
    invite_timeout: float = field(default=0.5, metadata=check(Positive()))
    lock_timeout: float = field(default=5.0, metadata=check(Positive()))
    max_retries: int = field(default=3, metadata=check(IntAtLeast(0)))
    formation: str = field(default="auto", metadata=check(OneOf(FORMATIONS)))
    churn: bool = field(default=False, metadata=check(Boolean()))
    session_median: float = field(default=60.0, metadata=check(Positive()))
    session_sigma: float = field(default=1.0, metadata=check(NonNegative()))
    downtime_median: float = field(default=20.0, metadata=check(Positive()))
    downtime_sigma: float = field(default=1.0, metadata=check(NonNegative()))
    curator_crash_probability: float = field(
        default=0.0, metadata=check(Probability(open_upper=False))
    )
    member_crash_probability: float = field(
        default=0.0, metadata=check(Probability(open_upper=False))
    )

    def __post_init__(self) -> None:
        validate_fields(self, "gossip")


@dataclass(frozen=True, slots=True, kw_only=True)
class PublicationConfig:
    """Who receives a published model: ``"group"`` (members) or ``"full"`` (every peer)."""

    mode: str = field(default="full", metadata=check(OneOf(PUBLICATION_MODES)))

    def __post_init__(self) -> None:
        validate_fields(self, "publication")


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationConfig:
    """How runs are evaluated.

    ``split = "cv"``: stratified ``cv_folds``-fold cross-validation; ``"fixed"``: the data
    set's predefined train/test split (adult). ``folds`` limits which folds run (empty = all).
    ``vote``: ensemble rule, ``"majority"`` of signs (ties broken by the summed margin, then
    +1), ``"mean-margin"`` (sign of the mean margin, 0 -> +1), ``"majority-own"`` (ties to
    the own model), ``"average"`` or ``"local-validated"`` (noise-aware, see
    :mod:`p2pdp.learning.evaluation`). ``best_lambda_reference``: also report the non-private
    centralised model at its own cross-validated lambda (``centralized_best_lambda_error``;
    a few seconds per fold, computed once per training key).
    """

    vote: str = field(default="majority", metadata=check(ComponentName("ensemble")))
    split: str = field(default="cv", metadata=check(OneOf(SPLITS)))
    cv_folds: int = field(default=10, metadata=check(IntAtLeast(2)))
    folds: tuple[int, ...] = ()
    best_lambda_reference: bool = field(default=False, metadata=check(Boolean()))

    def __post_init__(self) -> None:
        validate_fields(self, "evaluation")
        object.__setattr__(self, "folds", as_list("evaluation.folds", self.folds))
        for fold in self.folds:
            if isinstance(fold, bool) or not isinstance(fold, int) or not 0 <= fold < self.cv_folds:
                raise invalid("evaluation.folds", f"fold indices in [0, {self.cv_folds})", fold)
        repeated = sorted({fold for fold in self.folds if self.folds.count(fold) > 1})
        if repeated:
            raise ConfigError(
                f"evaluation.folds must not repeat a fold (each fold is one set of cells), "
                f"got {list(self.folds)}: {repeated} more than once"
            )

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolConfig:
    """How peers learn from what they receive (``[protocol]``; logistic task only).

    ``name`` is a ``protocol`` component: ``"one-shot"`` (the default: the group protocol of
    the seed, every other setting here unused), ``"dpsgd"``, ``"muffliato"``,
    ``"gossip-learning"`` (:mod:`p2pdp.protocols`) or an import string.

    Iterative protocols run ``rounds`` rounds of ``round_period`` simulated seconds. In a round
    a peer takes one private local step on its own shard (step size ``step_size``): per-record
    gradients of the logistic loss clipped to L2 norm ``clip_norm``, summed over the records
    ``sampling`` picks (``"full"``: all; ``"poisson"``: each with probability
    ``sampling_rate``, guarantee stated for add/remove and divided by ``sampling_rate *
    privacy.min_shard_size``, which must be set; ``"fixed"``: ``batch_size`` without
    replacement; full and fixed are stated for replace-one), plus Gaussian noise of
    standard deviation ``noise_multiplier * clip_norm`` added by the peer before anything
    leaves it. ``noise_multiplier = None`` (the default) calibrates the noise so that
    ``rounds`` steps spend ``privacy.epsilon`` at ``privacy.delta``; ``0`` adds none (NOT
    private: every row then says epsilon = inf). ``gossip_steps`` is Muffliato's number of
    gossip (averaging) steps per private step. ``pairwise_noise_multiplier`` (``z_p``, D-PSGD
    only, 0 = off) adds correlated noise that cancels in the network average: each pair of
    neighbours adds a fresh ``N(0, (z_p C)^2 I)`` draw of their shared stream to their steps
    with opposite signs (:mod:`p2pdp.protocols.correlated_dp`). ``threat_model`` (D-PSGD
    only): whom the calibrated noise spends ``privacy.epsilon`` against: ``"local"`` (the
    default: every peer's local DP, any adversary), ``"eavesdropper"`` (one that sees every
    message; a proof, the models being known to it before each step) or ``"curious-peer"``
    (the worst neighbour, with its own noise and edge secrets; exact only under the
    fixed-gradient assumption of :mod:`p2pdp.protocols.network_dp`, not a proven guarantee
    of the run). With a threat model, ``pairwise_noise_multiplier`` is the ratio ``z_p / z``
    (required > 0), ``noise_multiplier`` must be unset (it is calibrated, exactly, on the run
    every message of which arrives), and peers take every round's step: their local DP
    (``epsilon_spent``) is then larger than ``privacy.epsilon``. ``eval_every``: rounds
    between two records of the test error in the ``rounds`` table.
    """

    name: str = field(default="one-shot", metadata=check(ComponentName("protocol")))
    rounds: int = field(default=100, metadata=check(IntAtLeast(1)))
    round_period: float = field(default=1.0, metadata=check(Positive()))
    step_size: float = field(default=1.0, metadata=check(Positive()))
    gossip_steps: int = field(default=1, metadata=check(IntAtLeast(1)))
    sampling: str = field(default="full", metadata=check(OneOf(RECORD_SAMPLINGS)))
    sampling_rate: float = field(default=1.0, metadata=check(Interval(0.0, 1.0, low_open=True)))
    batch_size: int = field(default=16, metadata=check(IntAtLeast(1)))
    clip_norm: float = field(default=1.0, metadata=check(Positive(allow_inf=True)))
    noise_multiplier: float | None = field(default=None, metadata=check(Optional(NonNegative())))
    pairwise_noise_multiplier: float = field(default=0.0, metadata=check(NonNegative()))
    threat_model: str = field(default="local", metadata=check(OneOf(THREAT_MODELS)))
    eval_every: int = field(default=1, metadata=check(IntAtLeast(1)))

    def __post_init__(self) -> None:
        validate_fields(self, "protocol")
        if self.rounds > MAX_ROUNDS:
            raise invalid("protocol.rounds", f"<= {MAX_ROUNDS:,} (one cell)", self.rounds)
        if self.rounds * self.gossip_steps > MAX_EXCHANGES:
            raise ConfigError(
                f"protocol.rounds x protocol.gossip_steps must be <= {MAX_EXCHANGES:,} averaging "
                f"exchanges per cell, got {self.rounds} x {self.gossip_steps}"
            )
        if self.threat_model != "local" and (
            self.noise_multiplier is not None or self.pairwise_noise_multiplier == 0
        ):
            raise ConfigError(
                f"protocol.threat_model = {self.threat_model!r} calibrates the noise multiplier "
                "at the ratio protocol.pairwise_noise_multiplier = z_p / z: leave "
                "protocol.noise_multiplier unset and set protocol.pairwise_noise_multiplier > 0, "
                f"got {self.noise_multiplier!r} and {self.pairwise_noise_multiplier!r}"
            )
        if self.noise_multiplier == 0:
            raise ConfigError(
                "protocol.noise_multiplier must be > 0, got 0: for a run without noise (NOT "
                "private) set privacy.mechanism = 'none', the non-private setting of every "
                "protocol"
            )
        from p2pdp.privacy.gdp import MAX_MU

        if self.noise_multiplier is not None and 2.0 / self.noise_multiplier > MAX_MU:
            raise ConfigError(
                f"protocol.noise_multiplier must be >= {2 / MAX_MU:g} (below it one step's "
                f"epsilon exceeds 5e11: no privacy), got {self.noise_multiplier!r}; for a run "
                "without noise set privacy.mechanism = 'none'"
            )

    @staticmethod
    def private(privacy: PrivacyConfig) -> bool:
        """Whether the steps add noise: not with ``privacy.mechanism = "none"`` (the
        non-private setting of every protocol)."""
        return privacy.mechanism != "none"

    @property
    def iterative(self) -> bool:
        """Whether peers learn from what they receive (any protocol but ``one-shot``)."""
        return self.name != "one-shot"

    def accountant(self, privacy: PrivacyConfig) -> str:
        """The accountant of the private steps: ``privacy.accountant``, with ``"auto"``
        resolved to ``pld`` for Poisson sampling (it accounts the amplification exactly, up
        to 7x tighter than ``rdp``) and ``gdp`` (exact) otherwise."""
        if privacy.accountant != "auto":
            return privacy.accountant
        return "pld" if self.sampling == "poisson" else "gdp"


#: Deprecated (kept for importers of the 0.2 layout until 0.3): the task-specific tables and the
#: built-in tasks that read them. What reads a setting is now declared by each component
#: (:func:`settings_read`); nothing here reads this.
TASK_SECTIONS: dict[str, tuple[str, ...]] = {
    "prevalence": ("prevalence-counts", "randomized-response"),
    "pooling": ("pooled-testing",),
    "protocol": ("logistic",),
}

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
    from p2pdp.data.preprocess import NORM_STEPS, Preprocessor
    from p2pdp.privacy.mechanisms import NoNoise

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

    Known without loading for the built-ins (:func:`p2pdp.data.datasets.provides`); an import
    string is checked when it is loaded (:func:`p2pdp.tasks.pipeline.load_fold`).
    """
    from p2pdp.data import datasets  # not at module level: datasets imports scikit-learn

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
                f"see p2pdp.data.datasets.RawData); got data.dataset = {data.dataset!r}"
            )
        having = datasets.builtins_with("feature_bounds")
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
    (:mod:`p2pdp.core.reads`), an option (:data:`OPTION_READS`) the settings of its value. A
    task that does not read ``protocol.name`` runs the one-shot protocol, whose reads are added.

    Returns
    -------
    dict
        Public dotted key -> who reads it (``"protocol.name = 'dpsgd'"``, ``"the engine"``).
    """
    from p2pdp.core.reads import When, declared_reads, declares_reads

    read: dict[str, str] = {}
    pending: list[tuple[str, str]] = [(key, "the engine") for key in ENGINE_READS]
    for name in RUNTIME_READERS if runtime is None else (runtime,):
        runtime_reader = components.load(RUNTIME_READERS[name], key="runtime")
        pending += [
            (key, f"runtime {name!r}")
            for key in declared_reads(runtime_reader)
            if isinstance(key, str)  # a runtime declares plain keys
        ]
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
            elif name in OPTION_READS:
                options = OPTION_READS[name]
                entries = options.get(value, tuple({k for ks in options.values() for k in ks}))
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
    from p2pdp.core.reads import When, declared_reads

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
    for setting, options in OPTION_READS.items():
        for value, keys in options.items():
            if key in names(keys):
                found.setdefault(setting, []).append(value)
    for runtime, target in RUNTIME_READERS.items():
        if key in names(declared_reads(components.load(target, key="runtime"))):
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
