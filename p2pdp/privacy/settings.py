"""Settings of the privacy layer: the ``[privacy]`` table.

:class:`PrivacyConfig` lives with the mechanisms and accountants that read it (not in
:mod:`p2pdp.config`, which composes it into a :class:`~p2pdp.config.ScenarioConfig`); its fields
declare their constraints (:mod:`p2pdp.core.validation`), checked on construction. Rules across
tables (e.g. a per-aggregation budget checked only when the protocol reads it) stay in
:class:`~p2pdp.config.ScenarioConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from p2pdp.core import components
from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import (
    Boolean,
    ComponentName,
    Derived,
    IntAtLeast,
    OneOf,
    Optional,
    Positive,
    check,
    invalid,
    validate_fields,
)
from p2pdp.privacy.accounting import resolve_accountant_name
from p2pdp.privacy.calibration import SENSITIVITY_MODES
from p2pdp.privacy.gdp import MAX_MU, gdp_epsilon
from p2pdp.privacy.mechanisms import Gaussian

DEFAULT_EPSILON_PER_AGGREGATION = 0.1
#: Most aggregations a peer's budget may be meant for (``epsilon / epsilon_per_aggregation``):
#: far beyond any simulated run, and a guard against a typo such as ``epsilon = 1e308``.
MAX_AGGREGATIONS_PER_PEER = 1e6


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
    sampling, :meth:`p2pdp.protocols.settings.ProtocolConfig.accountant`); ``pld`` composes
    privacy loss distributions (dp-accounting) of any of them. Results rows record the resolved
    name (:attr:`resolved_accountant`).
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
        cls = components.resolve("mechanism", self.mechanism, key="privacy.mechanism")
        return "gaussian" if isinstance(cls, type) and issubclass(cls, Gaussian) else self.mechanism

    @property
    def resolved_accountant(self) -> str:
        """``accountant`` with ``"auto"`` resolved (``gdp`` for gaussian, else ``basic``)."""
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
        :class:`~p2pdp.config.ScenarioConfig` only when the protocol reads them (an iterative
        protocol spends its budget by steps, not aggregations).
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
