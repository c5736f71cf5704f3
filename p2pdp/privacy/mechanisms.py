"""Output-perturbation mechanisms: the noise a curator adds to a group's average, and its shares.

Output perturbation (the curator's step)
----------------------------------------
A group of ``K`` peers publishes the average of its members' exact local models. The unit
protected is **one record of one peer's shard**; neighbouring data sets differ by *replacing*
that record. The curator releases ``avg + eta`` to the group or to everyone (publication is
post-processing); ``eta`` is drawn by a :class:`Mechanism` calibrated to the L2 sensitivity
``Delta_2`` of the average (:func:`~p2pdp.privacy.calibration.group_sensitivity`):

============================  ==================================================  ==============
name                          noise ``eta`` (d coordinates, ``b = Delta_2/eps``)  guarantee
============================  ==================================================  ==============
``vector-laplace`` (default)  density ~ ``exp(-||eta||_2 / b)``: norm              epsilon-DP
                              ``Gamma(shape=d, scale=b)``, uniform direction
``coordinate-laplace``        iid ``Laplace(sqrt(d) * b)`` (L1 bound)             epsilon-DP
``gaussian``                  iid ``N(0, sigma^2)``, analytic calibration         (epsilon, delta)
``seed-laplace``              iid ``Laplace(b)`` (the seed, mis-calibrated)       sqrt(d)*eps-DP
``none``                      zero (tests only)                                   none
``local``                     zero: each peer randomized its records before       the local
                              sharing (``randomized-response`` task only)         epsilon (LDP)
============================  ==================================================  ==============

A mechanism may also define the whole release from the exact aggregate instead of adding
noise (``additive = False``, :meth:`Mechanism.release`): ``pooled-test``
(:mod:`p2pdp.tasks.pooled_testing.task`) releases a pool's imperfect test result.

Coordinate Laplace and Gaussian noise are infinitely divisible, so the members of a group can
each add a *share* and nobody (not even the curator) knows the total noise
(:func:`laplace_noise_shares`, :func:`gaussian_noise_shares`, :meth:`Mechanism.noise_shares`).

What the noise is calibrated to (the sensitivity, the analytic Gaussian's sigma) is in
:mod:`p2pdp.privacy.calibration`; the mechanisms of the other seeds on 0/1 records (randomized
response, the Laplace count) are in :mod:`p2pdp.privacy.counting`.

numpy generators are not cryptographically secure: fine for a simulator, not for deployment.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from p2pdp.core.boundary import calling, check_methods, check_number, check_numbers, check_type
from p2pdp.core.errors import ConfigError, PrivacyWarning
from p2pdp.core.validation import require_count, require_positive, require_probability
from p2pdp.privacy.calibration import analytic_gaussian_sigma
from p2pdp.privacy.events import (
    EpsilonDeltaEvent,
    GaussianEvent,
    LaplaceEvent,
    NonPrivateEvent,
    PrivacyEvent,
)

MECHANISMS: tuple[str, ...] = (
    "vector-laplace",
    "coordinate-laplace",
    "gaussian",
    "seed-laplace",
    "none",
)
#: What the engine calls on a mechanism (:class:`Mechanism` provides them all).
MECHANISM_METHODS = (
    "sample",
    "release",
    "noise_shares",
    "noise_std",
    "noise_scale",
    "event",
    "budget_event",
    "guarantee",
)


# --- distributed noise ----------------------------------------------------------------------------
def laplace_noise_shares(
    scale: float, n_shares: int, dim: int, *, rng: np.random.Generator, rows: int | None = None
) -> np.ndarray:
    """Per-member shares whose sum is iid ``Laplace(0, scale)`` per coordinate.

    Uses the infinite divisibility of the Laplace law (Rastogi & Nath 2010): each share is
    ``G - G'`` with ``G, G' ~ Gamma(shape=1/K, scale)`` iid, so the sum over ``K`` shares is the
    difference of two ``Exponential(scale)`` variables, i.e. ``Laplace(scale)``. A single share
    (or any ``K - 1`` of them) does not reveal the total.

    ``rows``: draw only that many of the (iid) shares, e.g. 1 for one member's own.

    Returns
    -------
    ndarray, shape (rows, dim); rows defaults to n_shares
    """
    scale = require_positive("scale", scale)
    n_shares = require_count("n_shares", n_shares)
    dim = require_count("dim", dim)
    shape = (n_shares if rows is None else require_count("rows", rows), dim)
    return rng.gamma(1.0 / n_shares, scale, shape) - rng.gamma(1.0 / n_shares, scale, shape)


def gaussian_noise_shares(
    sigma: float, n_shares: int, dim: int, *, rng: np.random.Generator, rows: int | None = None
) -> np.ndarray:
    """Per-member shares whose sum is iid ``N(0, sigma^2)`` per coordinate.

    Each share is ``N(0, sigma^2 / K)``. ``rows``: draw only that many of the (iid) shares.

    Returns
    -------
    ndarray, shape (rows, dim); rows defaults to n_shares
    """
    sigma = require_positive("sigma", sigma)
    n_shares = require_count("n_shares", n_shares)
    dim = require_count("dim", dim)
    rows = n_shares if rows is None else require_count("rows", rows)
    return rng.normal(0.0, sigma / math.sqrt(n_shares), (rows, dim))


# --- output-perturbation mechanisms ---------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Mechanism(ABC):
    """Additive noise for a d-dimensional vector of known L2 sensitivity.

    Neighbouring relation: replace one record of one peer's shard; ``sensitivity`` passed to
    the methods is the L2 sensitivity ``Delta_2`` of the released vector under that relation
    (see :func:`~p2pdp.privacy.calibration.group_sensitivity`). Every noise law here scales
    linearly with the sensitivity (``sample(s)`` has the law of ``s * sample(1)``), so a caller
    may draw unit-sensitivity noise in batches and rescale it. Build instances with
    :func:`make_mechanism`.

    Attributes
    ----------
    epsilon : float
        Nominal epsilon the noise is calibrated to (> 0, finite).
    delta : float
        Nominal delta: 0.0 for pure DP, in (0, 1) for ``gaussian``.
    name : str
        One of :data:`MECHANISMS`.
    splittable : bool
        Whether :meth:`noise_shares` can split the noise among group members.
    """

    epsilon: float
    delta: float = 0.0
    name: ClassVar[str]
    splittable: ClassVar[bool] = False
    approximate: ClassVar[bool] = False  # True when the guarantee needs delta > 0
    #: ``sample(s)`` has the law of ``s * sample(1)``: the release path may then draw unit
    #: noise in batches and rescale it (same distribution, much faster).
    scale_family: ClassVar[bool] = True
    #: True: the release is ``exact + noise`` (:meth:`sample`), drawn by the release path.
    #: False: :meth:`release` defines the whole release from the exact aggregate (e.g. a
    #: pooled test result); the release path then calls it once per group (plaintext only).
    additive: ClassVar[bool] = True
    #: True for a mechanism whose privacy was applied by each peer to its own records before
    #: anything was shared (``local``): only a task that declares ``locally_private`` may use it.
    local: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", require_positive("epsilon", self.epsilon))
        if self.approximate:
            delta = require_probability("delta", self.delta, low_open=True, high_open=True)
        elif self.delta != 0:
            raise ConfigError(f"delta must be 0 for the pure-DP {self.name}, got {self.delta!r}")
        else:
            delta = 0.0
        object.__setattr__(self, "delta", delta)

    def sample(
        self,
        sensitivity: float,
        dim: int,
        *,
        rng: np.random.Generator,
        size: int | None = None,
    ) -> np.ndarray:
        """Draw noise vectors.

        Parameters
        ----------
        sensitivity : float
            L2 sensitivity ``Delta_2`` > 0 of the vector the noise is added to.
        dim : int
            Dimension ``d >= 1``.
        rng : numpy.random.Generator
        size : int, optional
            Number of independent vectors; ``None`` for one.

        Returns
        -------
        ndarray, shape (dim,) if ``size`` is None else (size, dim)
        """
        sensitivity = require_positive("sensitivity", sensitivity)
        dim = require_count("dim", dim)
        n = 1 if size is None else require_count("size", size)
        noise = self._draw(sensitivity, dim, n, rng)
        return noise[0] if size is None else noise

    def release(
        self, exact: np.ndarray, sensitivity: float, *, rng: np.random.Generator
    ) -> np.ndarray:
        """The released value for a group's exact aggregate ``exact`` (d,): here ``exact + eta``.

        The release path (:class:`p2pdp.privacy.release.Releaser`) calls this only for mechanisms
        with
        ``additive = False``, which override it to define the whole release (its law must be
        what :meth:`event` declares); additive mechanisms are released as ``exact`` plus
        :meth:`sample` noise, drawn in batches.
        """
        return exact + self.sample(sensitivity, int(np.size(exact)), rng=rng)

    def noise_shares(
        self, sensitivity: float, dim: int, n_shares: int, *, rng: np.random.Generator
    ) -> np.ndarray:
        """Split one noise draw among ``n_shares`` group members.

        Returns
        -------
        ndarray, shape (n_shares, dim)
            Rows sum to a vector with the same distribution as :meth:`sample`.

        Raises
        ------
        ConfigError
            If the mechanism is not :attr:`splittable` (``vector-laplace``).
        """
        sensitivity = require_positive("sensitivity", sensitivity)
        dim = require_count("dim", dim)
        n_shares = require_count("n_shares", n_shares)
        return self._shares(sensitivity, dim, n_shares, rng)

    def noise_share(
        self, sensitivity: float, dim: int, n_shares: int, *, rng: np.random.Generator
    ) -> np.ndarray:
        """One share of an ``n_shares``-way split (a member's own), shape (dim,).

        The shares of :meth:`noise_shares` are iid, so any one of them will do: the first,
        by default; a mechanism that can draw one share alone overrides this (the built-in
        splittable ones do: a member then draws ``dim`` values, not ``n_shares * dim``).
        """
        return self.noise_shares(sensitivity, dim, n_shares, rng=rng)[0]

    @abstractmethod
    def noise_std(self, sensitivity: float, dim: int) -> float:
        """Standard deviation of one noise coordinate (same units as ``sensitivity``)."""

    def noise_scale(self, sensitivity: float, dim: int) -> float:
        """The scale parameter of the noise law at ``sensitivity`` (recorded per release).

        Vector Laplace: ``b`` with ``||eta|| ~ Gamma(d, b)``; coordinate Laplace: the Laplace
        scale per coordinate; Gaussian: ``sigma``. Defaults to :meth:`noise_std`.
        """
        return self.noise_std(sensitivity, dim)

    def event(self, dim: int) -> PrivacyEvent:
        """What one release of dimension ``dim`` actually guarantees, for the accountant.

        A mechanism that makes a privacy claim overrides this and returns its event (e.g.
        :class:`~p2pdp.privacy.events.EpsilonDeltaEvent` for pure epsilon-DP). The default declares
        nothing: results record such a mechanism as non-private (epsilon = inf), never as
        its nominal epsilon.
        """
        require_count("dim", dim)
        return NonPrivateEvent(f"mechanism {self.name!r} declares no privacy guarantee")

    def budget_event(self, dim: int) -> PrivacyEvent:
        """What the budget ledger charges per release.

        :meth:`event` for a mechanism with a guarantee. A mechanism without one (or with
        a weaker one than its calibration suggests, ``seed-laplace``) is charged its nominal
        ``(epsilon, delta)``, so runs keep the seed's schedule of aggregations, while results
        report the real guarantee from :meth:`event`.
        """
        event = self.event(dim)
        return event if event.private else EpsilonDeltaEvent(self.epsilon, self.delta)

    def guarantee(self, dim: int) -> tuple[float, float]:
        """``(epsilon, delta)`` actually guaranteed by one release of dimension ``dim``."""
        return self.event(dim).epsilon_delta()

    @abstractmethod
    def _draw(self, sensitivity: float, dim: int, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` noise vectors, shape (n, dim); arguments already validated."""

    def _shares(
        self, sensitivity: float, dim: int, n_shares: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Noise shares, shape (n_shares, dim); splittable subclasses override this."""
        raise ConfigError(
            f"mechanism {self.name!r} has no per-member noise split; use coordinate-laplace "
            "or gaussian with secure aggregation"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class VectorLaplace(Mechanism):
    """epsilon-DP noise with density ``~ exp(-epsilon ||eta||_2 / Delta_2)`` (Chaudhuri et al.).

    ``||eta||_2 ~ Gamma(shape=d, scale=Delta_2/epsilon)`` and the direction is uniform on the
    sphere; ``E ||eta||^2 = d (d+1) (Delta_2/epsilon)^2``. Not splittable into shares.
    """

    name: ClassVar[str] = "vector-laplace"

    def noise_std(self, sensitivity: float, dim: int) -> float:
        return math.sqrt(dim + 1) * sensitivity / self.epsilon

    def noise_scale(self, sensitivity: float, dim: int) -> float:
        return sensitivity / self.epsilon

    def event(self, dim: int) -> PrivacyEvent:
        require_count("dim", dim)
        return EpsilonDeltaEvent(self.epsilon, 0.0)

    def _draw(self, sensitivity, dim, n, rng):
        direction = rng.standard_normal((n, dim))
        direction /= np.linalg.norm(direction, axis=1, keepdims=True)
        norm = rng.gamma(dim, sensitivity / self.epsilon, (n, 1))
        return norm * direction


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinateLaplace(Mechanism):
    """epsilon-DP iid ``Laplace(sqrt(d) * Delta_2 / epsilon)`` noise per coordinate.

    ``sqrt(d) * Delta_2`` bounds the L1 sensitivity. Splittable (Gamma-difference shares).
    In one dimension a release is the scalar Laplace mechanism
    (:class:`~p2pdp.privacy.events.LaplaceEvent`, whose exact privacy loss the ``pld``
    accountant composes); in more, only its ``epsilon`` is declared.
    """

    name: ClassVar[str] = "coordinate-laplace"
    splittable: ClassVar[bool] = True

    def scale(self, sensitivity: float, dim: int) -> float:
        """Laplace scale ``b`` per coordinate."""
        return math.sqrt(dim) * sensitivity / self.epsilon

    def noise_std(self, sensitivity: float, dim: int) -> float:
        return math.sqrt(2.0) * self.scale(sensitivity, dim)

    def noise_scale(self, sensitivity: float, dim: int) -> float:
        return self.scale(sensitivity, dim)

    def event(self, dim: int) -> PrivacyEvent:
        if require_count("dim", dim) == 1:
            return LaplaceEvent(self.epsilon)
        return EpsilonDeltaEvent(self.epsilon, 0.0)

    def _draw(self, sensitivity, dim, n, rng):
        return rng.laplace(0.0, self.scale(sensitivity, dim), (n, dim))

    def _shares(self, sensitivity, dim, n_shares, rng):
        return laplace_noise_shares(self.scale(sensitivity, dim), n_shares, dim, rng=rng)

    def noise_share(self, sensitivity, dim, n_shares, *, rng):
        scale = self.scale(require_positive("sensitivity", sensitivity), require_count("dim", dim))
        return laplace_noise_shares(scale, n_shares, dim, rng=rng, rows=1)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class SeedLaplace(CoordinateLaplace):
    """The seed's iid ``Laplace(Delta_2 / epsilon)`` per coordinate: only sqrt(d)*epsilon-DP.

    The scale is calibrated to the L2 sensitivity although the Laplace mechanism needs the L1
    sensitivity (up to ``sqrt(d) * Delta_2``). Kept only to reproduce the seed; constructing it
    emits a :class:`~p2pdp.core.errors.PrivacyWarning` and :meth:`guarantee` reports
    ``sqrt(d) * epsilon``.
    """

    name: ClassVar[str] = "seed-laplace"

    def __post_init__(self) -> None:
        Mechanism.__post_init__(self)
        warnings.warn(
            f"seed-laplace with epsilon={self.epsilon} is only sqrt(d)*epsilon-DP in d "
            "dimensions; use vector-laplace, coordinate-laplace or gaussian",
            PrivacyWarning,
            stacklevel=3,
        )

    def scale(self, sensitivity: float, dim: int) -> float:
        return sensitivity / self.epsilon

    def event(self, dim: int) -> PrivacyEvent:
        return EpsilonDeltaEvent(math.sqrt(require_count("dim", dim)) * self.epsilon, 0.0)

    def budget_event(self, dim: int) -> PrivacyEvent:
        return EpsilonDeltaEvent(self.epsilon, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gaussian(Mechanism):
    """(epsilon, delta)-DP iid ``N(0, sigma^2)`` noise, ``sigma`` from the analytic Gaussian.

    ``sigma = noise_multiplier * Delta_2`` with ``noise_multiplier`` =
    :func:`analytic_gaussian_sigma` ``(epsilon, delta, 1)``. Splittable (Gaussian shares).
    """

    name: ClassVar[str] = "gaussian"
    splittable: ClassVar[bool] = True
    approximate: ClassVar[bool] = True
    noise_multiplier: float = field(init=False)

    def __post_init__(self) -> None:
        Mechanism.__post_init__(self)
        sigma = analytic_gaussian_sigma(self.epsilon, self.delta, 1.0)
        object.__setattr__(self, "noise_multiplier", sigma)

    def noise_std(self, sensitivity: float, dim: int) -> float:
        return self.noise_multiplier * sensitivity

    def event(self, dim: int) -> PrivacyEvent:
        require_count("dim", dim)
        return GaussianEvent(self.noise_multiplier, self.epsilon, self.delta)

    def _draw(self, sensitivity, dim, n, rng):
        return rng.normal(0.0, self.noise_std(sensitivity, dim), (n, dim))

    def _shares(self, sensitivity, dim, n_shares, rng):
        return gaussian_noise_shares(self.noise_std(sensitivity, dim), n_shares, dim, rng=rng)

    def noise_share(self, sensitivity, dim, n_shares, *, rng):
        std = self.noise_std(
            require_positive("sensitivity", sensitivity), require_count("dim", dim)
        )
        return gaussian_noise_shares(std, n_shares, dim, rng=rng, rows=1)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class NoNoise(Mechanism):
    """No noise at all: ONLY for tests (e.g. that the simulator reproduces a plain average).

    Emits a :class:`~p2pdp.core.errors.PrivacyWarning`; :meth:`guarantee` reports epsilon = inf.
    """

    name: ClassVar[str] = "none"
    splittable: ClassVar[bool] = True

    def __post_init__(self) -> None:
        Mechanism.__post_init__(self)
        warnings.warn(
            "mechanism 'none' adds no noise and gives no privacy: the run is NOT private "
            "(its rows say epsilon = inf)",
            PrivacyWarning,
            stacklevel=3,
        )

    def noise_std(self, sensitivity: float, dim: int) -> float:
        return 0.0

    def event(self, dim: int) -> PrivacyEvent:
        require_count("dim", dim)
        return NonPrivateEvent("mechanism 'none' adds no noise")

    def _draw(self, sensitivity, dim, n, rng):
        return np.zeros((n, dim))

    def _shares(self, sensitivity, dim, n_shares, rng):
        return np.zeros((n_shares, dim))


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalRandomization(Mechanism):
    """Privacy applied locally: each peer randomized its own records before sharing anything.

    For a task whose statistics are already epsilon-locally-DP (``locally_private = True``,
    e.g. ``randomized-response``: every record answered once through randomized response at
    ``epsilon`` on its owner's device). The curator adds nothing (a release is the exact
    aggregate of noisy answers: post-processing) and :meth:`event` declares the local
    ``epsilon`` (neighbouring relation: one record changes; released: the aggregate of the
    randomized answers, to the group or everyone).

    Budget semantics: the local randomization happens once per record, so a peer's cost is
    ``epsilon`` once, however often its noisy answers are aggregated afterwards. The ledger
    charges :meth:`budget_event` (``epsilon``) per aggregation joined, so a task using this
    mechanism sets ``privacy.epsilon_per_aggregation = privacy.epsilon``: each peer joins one
    aggregation and is charged exactly once (the task refuses any other setting). The engine
    refuses ``local`` with a task that does not declare local randomization: releasing exact
    statistics under an epsilon claim would be a false guarantee.
    """

    name: ClassVar[str] = "local"
    splittable: ClassVar[bool] = True
    local: ClassVar[bool] = True

    def noise_std(self, sensitivity: float, dim: int) -> float:
        return 0.0

    def event(self, dim: int) -> PrivacyEvent:
        require_count("dim", dim)
        return EpsilonDeltaEvent(self.epsilon, 0.0)

    def _draw(self, sensitivity, dim, n, rng):
        return np.zeros((n, dim))

    def _shares(self, sensitivity, dim, n_shares, rng):
        return np.zeros((n_shares, dim))


_MECHANISM_CLASSES: dict[str, type[Mechanism]] = {
    cls.name: cls
    for cls in (
        VectorLaplace,
        CoordinateLaplace,
        Gaussian,
        SeedLaplace,
        NoNoise,
        LocalRandomization,
    )
}


def mechanism_class(name: str) -> type[Mechanism]:
    """The mechanism class a config names: a built-in name or an import string."""
    if name in _MECHANISM_CLASSES:
        return _MECHANISM_CLASSES[name]
    from p2pdp.core.components import resolve

    cls = resolve("mechanism", name, key="privacy.mechanism")
    check_methods(cls, "mechanism", MECHANISM_METHODS, "p2pdp.privacy.mechanisms.Mechanism")
    return cls


def checked(mechanism: Mechanism, dim: int) -> Mechanism:
    """``mechanism`` after checking what the engine reads from it once per run.

    Its privacy events (:meth:`~Mechanism.event`, :meth:`~Mechanism.budget_event`) must be
    :class:`~p2pdp.privacy.events.PrivacyEvent` instances, its :meth:`~Mechanism.guarantee` a pair
    of
    numbers >= 0, and (additive mechanisms) its noise scale and std at unit sensitivity
    numbers >= 0 (inf allowed: a mechanism may have no finite std). The noise itself is
    checked where it is drawn (:mod:`p2pdp.privacy.release`). Raises
    :class:`~p2pdp.core.errors.ComponentError` (one line).
    """
    for method in ("event", "budget_event"):
        with calling("mechanism", mechanism, method):
            event = getattr(mechanism, method)(dim)
        check_type(event, PrivacyEvent, "mechanism", mechanism, method)
    with calling("mechanism", mechanism, "guarantee"):
        guarantee = mechanism.guarantee(dim)
    check_numbers(guarantee, "mechanism", mechanism, "guarantee", shape=(2,), finite=False)
    if getattr(mechanism, "additive", True):  # else there is no noise scale: nan is right
        for method in ("noise_scale", "noise_std"):
            with calling("mechanism", mechanism, method):
                value = getattr(mechanism, method)(1.0, dim)
            check_number(value, "mechanism", mechanism, method, inf=True)
    return mechanism


def make_mechanism(name: str, *, epsilon: float, delta: float | None = None) -> Mechanism:
    """Build the mechanism ``name`` (a built-in or an import string) at ``epsilon`` (``delta``).

    ``delta`` is required for approximate mechanisms (``gaussian``: in (0, 1)) and must be
    None or 0 otherwise.
    """
    from p2pdp.core.components import names

    if name not in _MECHANISM_CLASSES and ":" not in str(name) and name not in names("mechanism"):
        raise ConfigError(f"mechanism must be one of {MECHANISMS}, got {name!r}")
    cls = mechanism_class(name)
    if getattr(cls, "approximate", False) and delta is None:
        raise ConfigError(f"delta is required for mechanism {name!r}, got None")
    with calling("mechanism", cls, "__init__"):
        return cls(epsilon=epsilon, delta=0.0 if delta is None else delta)
