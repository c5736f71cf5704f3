"""Settings of the protocols: the ``[groups]``, ``[gossip]``, ``[publication]`` and ``[protocol]``
tables.

They live with the transport-free protocols that read them (one aggregation and the one-shot
parties, :mod:`p2pdp.protocols.groups` and :mod:`p2pdp.protocols.oneshot`; gossip group
formation, :mod:`p2pdp.protocols.gossip`; the iterative protocols,
:mod:`p2pdp.protocols.iterative`), not in :mod:`p2pdp.config`, which composes them into a
:class:`~p2pdp.config.ScenarioConfig`; the simulator's drivers of these protocols (:mod:`p2pdp.sim`)
read them too. Fields declare their constraints (:mod:`p2pdp.core.validation`), checked on
construction; what an option reads for some of its values is its table's ``option_reads``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import When
from p2pdp.core.validation import (
    AllOf,
    Boolean,
    ComponentName,
    IntAtLeast,
    Interval,
    NonNegative,
    OneOf,
    Optional,
    Positive,
    Probability,
    check,
    invalid,
    validate_fields,
)
from p2pdp.learning.settings import TrainingConfig
from p2pdp.privacy.gdp import MAX_MU
from p2pdp.privacy.settings import PrivacyConfig

PUBLICATION_MODES = ("group", "full")
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

    #: Settings read only for some values of this table's options, while the option itself is
    #: read (:func:`p2pdp.config.settings_read`).
    option_reads: ClassVar[tuple[When, ...]] = (
        When("gossip.overlay", "random-regular", ("gossip.degree",)),
        When("gossip.overlay", "erdos-renyi", ("gossip.degree", "gossip.edge_probability")),
        When("gossip.overlay", "watts-strogatz", ("gossip.degree", "gossip.rewiring")),
        When("gossip.overlay", "barabasi-albert", ("gossip.attachment",)),
        When(
            "gossip.churn",
            True,
            (
                "gossip.session_median",
                "gossip.session_sigma",
                "gossip.downtime_median",
                "gossip.downtime_sigma",
            ),
        ),
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

    #: Settings read only for some values of this table's options, while the option itself is
    #: read (:func:`p2pdp.config.settings_read`).
    option_reads: ClassVar[tuple[When, ...]] = (
        When("protocol.sampling", "poisson", ("protocol.sampling_rate", "privacy.min_shard_size")),
        When("protocol.sampling", "fixed", ("protocol.batch_size",)),
    )

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


class NetworkLoss(Protocol):
    """What the iterative protocols read of ``[network]`` (its loss probability)."""

    @property
    def loss(self) -> float: ...


class RunSettings(Protocol):
    """The tables of a :class:`~p2pdp.config.ScenarioConfig` that the iterative protocols'
    privacy reads (:func:`p2pdp.protocols.iterative.step_privacy`): declared here because
    :mod:`p2pdp.config` imports this module (a protocol, not an import of it)."""

    @property
    def protocol(self) -> ProtocolConfig: ...

    @property
    def privacy(self) -> PrivacyConfig: ...

    @property
    def training(self) -> TrainingConfig: ...

    @property
    def gossip(self) -> GossipConfig: ...

    @property
    def network(self) -> NetworkLoss: ...
