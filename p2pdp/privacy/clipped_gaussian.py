"""The private step of the iterative protocols: clipped per-record terms, summed, plus noise.

A peer of an iterative protocol (:mod:`p2pdp.protocols`) computes one vector per record of
the records it samples (a gradient), clips each to L2 norm ``C`` (``clip_norm``), sums them,
adds ``N(0, (z C)^2 I_d)`` noise (``z`` = ``noise_multiplier``) and divides by a public
denominator; only that noisy vector, and models computed from it, ever leave the peer. What
one step guarantees depends on how the records are sampled (:data:`SAMPLINGS`), and the event
the accountant composes says so:

``full``
    Every record. Neighbouring relation: **replace** one record of the peer's shard (as in
    the one-shot protocol); the sum moves by at most ``2 C``, so the step is a Gaussian
    mechanism with noise multiplier ``z / 2`` relative to its sensitivity
    (:class:`~p2pdp.privacy.events.GaussianEvent`, composed exactly by ``gdp``). Denominator:
    the shard size ``n``.
``fixed``
    ``min(batch_size, n)`` records without replacement. The same event as ``full`` (replace
    one record, sensitivity ``2 C``): no amplification by this sampling is claimed, so the
    accounting is valid and conservative. Denominator: ``min(batch_size, n)``.
``poisson``
    Each record independently with probability ``q`` (``sampling_rate``). Neighbouring
    relation: **add or remove** one record (sensitivity ``C``; the DP-SGD convention), the
    :class:`~p2pdp.privacy.events.SubsampledGaussianEvent`, amplification by sampling
    accounted by ``rdp``. Denominator: ``q n``, a public constant (the shard size is public in
    p2pdp, as in the one-shot protocol whose group sensitivities use it).

``z = 0`` adds no noise: the step is NOT private (:class:`~p2pdp.privacy.events.NonPrivateEvent`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.privacy.events import (
    GaussianEvent,
    NonPrivateEvent,
    PrivacyEvent,
    SubsampledGaussianEvent,
)

#: How a peer picks the records of one step (see the module docstring).
SAMPLINGS: tuple[str, ...] = ("full", "poisson", "fixed")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClippedGaussianSum:
    """One private step's mechanism: clip every record's vector to ``clip_norm``, sum, add noise.

    Attributes
    ----------
    clip_norm : float
        ``C``: the L2 norm every record's vector is clipped to (``inf``: no clipping, only
        with ``noise_multiplier = 0``).
    noise_multiplier : float
        ``z``: the noise standard deviation is ``z * C`` per coordinate (0: no noise).
    sampling : {"full", "poisson", "fixed"}
    sampling_rate : float
        ``q`` of Poisson sampling.
    batch_size : int
        Records per step of fixed-size sampling.
    """

    clip_norm: float
    noise_multiplier: float
    sampling: str = "full"
    sampling_rate: float = 1.0
    batch_size: int = 1

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise ConfigError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if not self.clip_norm > 0:
            raise ConfigError(f"clip_norm must be > 0, got {self.clip_norm!r}")
        if not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            raise ConfigError(f"noise_multiplier must be >= 0, got {self.noise_multiplier!r}")
        if math.isinf(self.clip_norm) and self.noise_multiplier > 0:
            raise ConfigError("clip_norm = inf leaves the sum unbounded: noise cannot hide it")
        if not 0 < self.sampling_rate <= 1:
            raise ConfigError(f"sampling_rate must be in (0, 1], got {self.sampling_rate!r}")

    @property
    def private(self) -> bool:
        """Whether a step has a guarantee (noise on a bounded sum)."""
        return self.noise_multiplier > 0

    @property
    def relation(self) -> str:
        """The neighbouring relation the guarantee is stated for."""
        if self.sampling == "poisson":
            return "add or remove one record of a peer's shard"
        return "replace one record of a peer's shard"

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the clipped sum under :attr:`relation`: ``C`` or ``2 C``."""
        return self.clip_norm if self.sampling == "poisson" else 2.0 * self.clip_norm

    def event(self, delta_per_step: float = 0.0) -> PrivacyEvent:
        """What one step releases, for the accountant.

        ``delta_per_step`` only sets the ``(epsilon, delta)`` a :class:`GaussianEvent` states
        for accountants that compose ``(epsilon, delta)`` pairs (``basic``); ``gdp`` and
        ``rdp`` read the noise multiplier.
        """
        if not self.private:
            return NonPrivateEvent("privacy.mechanism = 'none': no noise on the steps")
        if self.sampling == "poisson":
            return SubsampledGaussianEvent(self.noise_multiplier, self.sampling_rate)
        z = self.noise_multiplier * self.clip_norm / self.sensitivity  # = noise_multiplier / 2
        epsilon = math.inf
        if delta_per_step > 0:
            from p2pdp.privacy.gdp import gdp_epsilon

            epsilon = float(gdp_epsilon(1.0 / z, delta_per_step))
        return GaussianEvent(z, epsilon, delta_per_step)

    def denominators(self, sizes: np.ndarray) -> np.ndarray:
        """The public divisor of each peer's noisy sum (its expected number of records), (P,)."""
        sizes = np.asarray(sizes, dtype=float)
        if self.sampling == "poisson":
            return self.sampling_rate * sizes
        if self.sampling == "fixed":
            return np.minimum(float(self.batch_size), sizes)
        return sizes

    def select(self, indptr: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Which records a step uses: a (N,) bool mask over records stored peer by peer.

        ``indptr`` (P + 1,): peer ``j`` holds records ``indptr[j]:indptr[j + 1]``. One draw of
        ``N`` uniforms from ``rng`` for ``poisson`` and ``fixed``; none for ``full``.
        """
        n = int(indptr[-1])
        if self.sampling == "full":
            return np.ones(n, dtype=bool)
        keys = rng.random(n)
        if self.sampling == "poisson":
            return keys < self.sampling_rate
        owner = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        order = np.lexsort((keys, owner))  # records of each peer, in random order
        rank = np.arange(n) - indptr[owner[order]]
        mask = np.zeros(n, dtype=bool)
        mask[order[rank < self.batch_size]] = True
        return mask

    def clip_factors(self, norms: np.ndarray) -> np.ndarray:
        """``min(1, C / norm)`` for each record's vector norm: multiply to clip."""
        norms = np.asarray(norms, dtype=float)
        with np.errstate(divide="ignore"):
            return np.minimum(1.0, self.clip_norm / norms)

    def noise(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """``N(0, (z C)^2)`` noise of ``shape`` (zeros, drawing nothing, when ``z = 0``)."""
        if not self.private:
            return np.zeros(shape)
        return rng.normal(0.0, self.noise_multiplier * self.clip_norm, size=shape)


def calibrated_noise_multiplier(
    mechanism: ClippedGaussianSum,
    *,
    steps: int,
    epsilon_total: float,
    delta_total: float,
    accountant: str,
) -> float:
    """Smallest ``z`` with which ``steps`` steps of ``mechanism`` spend at most the budget.

    ``gdp`` on full or fixed sampling is exact (``z / 2 = sqrt(steps) / mu*``); otherwise a
    bisection on ``z`` against the accountant's composed epsilon (relative precision 1e-6,
    rounded up, so the returned ``z`` always fits).
    """
    from dataclasses import replace

    from p2pdp.privacy.accounting import BUDGET_TOLERANCE, composed, make_accountant

    if accountant == "gdp" and mechanism.sampling != "poisson":
        from p2pdp.privacy.gdp import noise_multiplier_for_gdp

        return 2.0 * noise_multiplier_for_gdp(epsilon_total, delta_total, steps)
    account = make_accountant(accountant)
    limit = epsilon_total * (1 + BUDGET_TOLERANCE)

    def fits(z: float) -> bool:
        event = replace(mechanism, noise_multiplier=z).event(delta_total / steps)
        account.check(event)
        return bool(composed(account, event, np.array(steps), delta_total=delta_total) <= limit)

    low, high = 1e-3, 1.0
    while not fits(high):
        low, high = high, 2 * high
        if high > 1e9:
            raise ConfigError(
                f"no noise multiplier lets {steps} steps fit epsilon = {epsilon_total:g}, "
                f"delta = {delta_total:g} under the {accountant} accountant"
            )
    while (high - low) > 1e-6 * high:
        middle = (low + high) / 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high
