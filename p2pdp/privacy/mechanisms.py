"""Differential-privacy mechanisms: output perturbation, noise shares, randomized response, counts.

Output perturbation (the curator's step)
----------------------------------------
A group of ``K`` peers publishes the average of its members' exact local models. The unit
protected is **one record of one peer's shard**; neighbouring data sets differ by *replacing*
that record. The curator releases ``avg + eta`` to the group or to everyone (publication is
post-processing); ``eta`` is drawn by a :class:`Mechanism` calibrated to the L2 sensitivity
``Delta_2`` of the average (:func:`group_sensitivity`):

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

Related mechanisms of the other seeds: :class:`RandomizedResponse` (one private bit per
respondent) and :func:`noisy_count` with :func:`beta_bernoulli_update` (a Laplace count fed into
a Beta-Bernoulli model).

numpy generators are not cryptographically secure: fine for a simulator, not for deployment.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike

from p2pdp.core.boundary import calling, check_methods, check_number, check_numbers, check_type
from p2pdp.core.errors import ConfigError, PrivacyWarning
from p2pdp.core.validation import require_count, require_positive, require_probability
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
SENSITIVITY_MODES: tuple[str, ...] = ("group-mean", "pathak")
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


def _as_binary(name: str, values: ArrayLike) -> np.ndarray:
    """``values`` as a bool array; ConfigError unless every entry is 0/1 (or bool)."""
    array = np.asarray(values)
    if array.dtype != bool and not np.isin(array, (0, 1)).all():
        raise ConfigError(
            f"{name} must contain only 0/1 or booleans, got values {np.unique(array)}"
        )
    return array.astype(bool)


def _is_count(n: object) -> bool:
    if not isinstance(n, (int, float, np.integer, np.floating)) or isinstance(n, bool):
        return False
    return bool(math.isfinite(n) and n >= 1 and n == int(n))


# --- sensitivity --------------------------------------------------------------------------------
def group_sensitivity(
    shard_sizes: Sequence[int] | np.ndarray,
    lam: float,
    *,
    mode: str = "group-mean",
    gradient_tolerance: float = 0.0,
    lipschitz: float = 1.0,
) -> float:
    """L2 sensitivity of a group's average of exact L2-regularised logistic-regression models.

    Replacing one record of member ``j`` (rows of L2 norm <= 1, lambda-strongly convex objective,
    exact minimiser) moves its model by at most ``2 / (n_j * lam)`` (Chaudhuri et al. 2011), and
    the group average ``(1/K) sum_j w_j`` by at most ``2 / (K * n_j * lam)``.

    Parameters
    ----------
    shard_sizes : sequence of int, shape (K,)
        Number of records of each member, all >= 1; ``K >= 1``.
    lam : float
        Regularisation strength lambda > 0.
    mode : {"group-mean", "pathak"}
        ``"group-mean"`` (default): ``2 / (K * n_min * lam)``, the sensitivity of the average.
        ``"pathak"``: ``2 / (n_min * lam)``, the seed's (Pathak et al. 2010) bound: valid but
        ``K`` times larger, i.e. ``K`` times more noise than needed.
    gradient_tolerance : float
        Bound ``tau >= 0`` on the gradient norm every local model was solved to. A model with
        ``||grad J|| <= tau`` lies within ``tau / lam`` of the exact minimiser (lambda-strong
        convexity), so a released model moves by at most ``2 (1/n_j + tau) / lam`` and the
        bounds above become ``2 (1/n_min + tau) / (K lam)`` and ``2 (1/n_min + tau) / lam``.
        The simulator passes the solver's tolerance (1e-9): a negligible, honest correction.
    lipschitz : float
        Lipschitz constant ``L`` of the loss in ``w`` for rows of norm <= 1 (1 for the
        logistic loss); the bounds scale as ``2 (L/n_min + tau) / ...``.

    Returns
    -------
    float
        ``Delta_2`` in the same units as the model weights.
    """
    # Plain Python on the (short) list: this runs once per aggregation in the simulator.
    sizes = shard_sizes.tolist() if isinstance(shard_sizes, np.ndarray) else list(shard_sizes)
    if not sizes or any(isinstance(n, (list, tuple)) for n in sizes):
        raise ConfigError(f"shard_sizes must be a non-empty 1-D sequence, got {shard_sizes!r}")
    plain = all(type(n) is int for n in sizes)  # the simulator's case: skip the slow check
    if not (min(sizes) >= 1 if plain else all(_is_count(n) for n in sizes)):
        raise ConfigError(f"shard_sizes must be integers >= 1, got {shard_sizes!r}")
    lam = require_positive("lam", lam)
    if not (math.isfinite(gradient_tolerance) and gradient_tolerance >= 0):
        raise ConfigError(f"gradient_tolerance must be >= 0 and finite, got {gradient_tolerance!r}")
    pathak = 2.0 * (lipschitz / min(sizes) + gradient_tolerance) / lam
    if mode == "pathak":
        return pathak
    if mode == "group-mean":
        return pathak / len(sizes)
    raise ConfigError(f"mode must be one of {SENSITIVITY_MODES}, got {mode!r}")


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


# --- analytic Gaussian calibration ----------------------------------------------------------------
def _gaussian_log_delta(log_sigma: float, epsilon: float, sensitivity: float) -> float:
    """``log delta(sigma)``, the exact privacy profile of the Gaussian mechanism at ``epsilon``.

    ``delta(sigma) = Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D)`` (Balle & Wang 2018,
    Theorem 8), evaluated as ``Phi(A) * (1 - exp(eps + log Phi(B) - log Phi(A)))`` in log space.
    """
    from scipy.special import log_ndtr

    sigma = math.exp(log_sigma)
    half = sensitivity / (2.0 * sigma)
    shift = epsilon * sigma / sensitivity
    log_first = float(log_ndtr(half - shift))
    remainder = -math.expm1(epsilon + float(log_ndtr(-half - shift)) - log_first)
    return log_first + math.log(remainder) if remainder > 0 else -math.inf


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest ``sigma`` for which ``N(0, sigma^2 I)`` noise is (epsilon, delta)-DP.

    Analytic Gaussian mechanism (Balle & Wang 2018, Algorithm 1): solves the exact condition
    ``Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D) <= delta`` for ``s`` (the left side
    decreases in ``s``) by root finding in ``log s``, then steps up until the condition holds,
    so the returned value is never below the exact calibration. Valid for every ``epsilon > 0``
    (the classic ``D sqrt(2 ln(1.25/delta)) / eps`` needs ``epsilon < 1`` and is larger).

    Parameters
    ----------
    epsilon : float
        > 0.
    delta : float
        In (0, 1).
    sensitivity : float
        L2 sensitivity ``D`` > 0.

    Returns
    -------
    float
        Per-coordinate standard deviation, same units as ``sensitivity``.
    """
    from scipy.optimize import brentq

    epsilon = require_positive("epsilon", epsilon)
    delta = require_probability("delta", delta, low_open=True, high_open=True)
    sensitivity = require_positive("sensitivity", sensitivity)
    log_delta = math.log(delta)

    def excess(log_sigma: float) -> float:
        return _gaussian_log_delta(log_sigma, epsilon, sensitivity) - log_delta

    start = math.log(sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon)
    low = high = start
    while excess(low) <= 0:
        low -= 1.0
    while excess(high) > 0:
        high += 1.0
    root = brentq(excess, low, high, xtol=1e-14)
    while excess(root) > 0:
        root += 1e-13 * max(1.0, abs(root))
    return math.exp(root)


# --- output-perturbation mechanisms ---------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Mechanism(ABC):
    """Additive noise for a d-dimensional vector of known L2 sensitivity.

    Neighbouring relation: replace one record of one peer's shard; ``sensitivity`` passed to
    the methods is the L2 sensitivity ``Delta_2`` of the released vector under that relation
    (see :func:`group_sensitivity`). Every noise law here scales linearly with the sensitivity
    (``sample(s)`` has the law of ``s * sample(1)``), so a caller may draw unit-sensitivity
    noise in batches and rescale it. Build instances with :func:`make_mechanism`.

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


# --- randomized response --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class RandomizedResponse:
    """Binary randomized response, in the local model.

    Each respondent holds one private bit and releases only its noisy answer (to the analyst,
    who may publish it). Neighbouring relation: one respondent's bit changes. The guarantee is
    ``epsilon = max over answers of |ln(P(answer | 1) / P(answer | 0))|`` (:attr:`epsilon`).

    Build it with :meth:`keep` (answer truthfully with probability ``p``, else flip:
    ``epsilon = ln(p / (1 - p))``), :meth:`forced` (the seed's form: truthful with probability
    ``theta1``, otherwise "yes" with probability ``theta2``:
    ``epsilon = ln(1 + theta1 / ((1 - theta1) min(theta2, 1 - theta2)))``) or
    :meth:`from_epsilon`.

    Attributes
    ----------
    p_yes_given_yes, p_yes_given_no : float
        ``P(answer 1 | bit 1) > P(answer 1 | bit 0)``, both in [0, 1].
    """

    p_yes_given_yes: float
    p_yes_given_no: float

    def __post_init__(self) -> None:
        high = require_probability("p_yes_given_yes", self.p_yes_given_yes)
        low = require_probability("p_yes_given_no", self.p_yes_given_no)
        if not high > low:
            raise ConfigError(
                f"p_yes_given_yes must exceed p_yes_given_no (else answers carry no signal), "
                f"got {high!r} <= {low!r}"
            )

    @classmethod
    def keep(cls, p: float) -> RandomizedResponse:
        """Answer truthfully with probability ``p`` in (1/2, 1], else flip the bit."""
        p = require_probability("p", p, low=0.5, low_open=True)
        return cls(p_yes_given_yes=p, p_yes_given_no=1.0 - p)

    @classmethod
    def forced(cls, theta1: float, theta2: float) -> RandomizedResponse:
        """With probability ``theta1`` in (0, 1] answer truthfully, else "yes" w.p. ``theta2``."""
        theta1 = require_probability("theta1", theta1, low_open=True)
        theta2 = require_probability("theta2", theta2)
        forced_yes = (1.0 - theta1) * theta2
        return cls(p_yes_given_yes=theta1 + forced_yes, p_yes_given_no=forced_yes)

    @classmethod
    def from_epsilon(cls, epsilon: float) -> RandomizedResponse:
        """The keep form calibrated to ``epsilon``: ``p = e^eps / (1 + e^eps)``."""
        from scipy.special import expit

        return cls.keep(float(expit(require_positive("epsilon", epsilon))))

    def output_probabilities(self) -> np.ndarray:
        """``P[bit, answer]``, shape (2, 2); rows sum to 1."""
        yes = np.array([self.p_yes_given_no, self.p_yes_given_yes])
        return np.column_stack([1.0 - yes, yes])

    @property
    def epsilon(self) -> float:
        """Exact epsilon: ln of the worst likelihood ratio over both answers (inf if unbounded)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            log_p = np.log(self.output_probabilities())
            return float(np.nanmax(np.abs(log_p[1] - log_p[0])))

    def sample(self, bits: ArrayLike, *, rng: np.random.Generator) -> np.ndarray:
        """Noisy answers for private ``bits`` (0/1 or bool, any shape); bool array, same shape."""
        truth = _as_binary("bits", bits)
        p_yes = np.where(truth, self.p_yes_given_yes, self.p_yes_given_no)
        return rng.random(truth.shape) < p_yes

    def estimate_proportion(self, answers: ArrayLike) -> float:
        """Unbiased estimate of the proportion of 1-bits from noisy ``answers`` (shape (n,)).

        ``(mean(answers) - P(1|0)) / (P(1|1) - P(1|0))``; not clipped to [0, 1] (clipping would
        bias it). Its variance is :meth:`estimator_variance`.
        """
        noisy = _as_binary("answers", answers)
        if noisy.size == 0:
            raise ConfigError("answers must be non-empty, got 0 answers")
        gap = self.p_yes_given_yes - self.p_yes_given_no
        return float((noisy.mean() - self.p_yes_given_no) / gap)

    def estimator_variance(self, proportion: float, n: int) -> float:
        """Variance of :meth:`estimate_proportion` over ``n`` answers at true ``proportion``.

        ``q (1 - q) / (n (P(1|1) - P(1|0))^2)`` with ``q = P(answer 1)``; plug in the estimate
        (clipped to [0, 1]) for an estimated variance.
        """
        proportion = require_probability("proportion", proportion)
        n = require_count("n", n)
        gap = self.p_yes_given_yes - self.p_yes_given_no
        q = self.p_yes_given_no + gap * proportion
        return q * (1.0 - q) / (n * gap**2)


# --- noisy count --------------------------------------------------------------------------------
def noisy_count(records: ArrayLike, epsilon: float, *, rng: np.random.Generator) -> float:
    """epsilon-DP count of 1-records: ``sum(records) + Laplace(1/epsilon)``, clamped to [0, n].

    Neighbouring relation: *replace* one 0/1 record, so ``n`` is public and the count changes
    by at most 1 (sensitivity 1). Clamping to [0, n] is post-processing. Released to the
    analyst (Hatlelid et al. 2021: feeds :func:`beta_bernoulli_update`).

    Parameters
    ----------
    records : array_like of 0/1 or bool, shape (n,)
    epsilon : float
        > 0.
    rng : numpy.random.Generator

    Returns
    -------
    float
        In [0, n].
    """
    values = _as_binary("records", records)
    epsilon = require_positive("epsilon", epsilon)
    return float(np.clip(values.sum() + rng.laplace(0.0, 1.0 / epsilon), 0, values.size))


def beta_bernoulli_update(a: float, b: float, count: float, n: int) -> tuple[float, float]:
    """Beta posterior from a (noisy) count: ``(a + count, b + n - count)``.

    Parameters
    ----------
    a, b : float
        Prior Beta parameters, > 0.
    count : float
        Number of 1-records among ``n``, e.g. from :func:`noisy_count`; in [0, n].
    n : int
        Number of records, >= 0.
    """
    a = require_positive("a", a)
    b = require_positive("b", b)
    n = require_count("n", n, minimum=0)
    count = require_probability("count", count, high=float(n))
    return a + count, b + n - count
