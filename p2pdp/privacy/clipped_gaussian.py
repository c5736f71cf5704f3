"""The private step of the iterative protocols: clipped per-record terms, summed, plus noise.

A peer of an iterative protocol (:mod:`p2pdp.protocols`) computes one vector per record of
the records it samples (a gradient), clips each to L2 norm ``C`` (``clip_norm``), sums them,
adds ``N(0, (z C)^2 I_d)`` noise (``z`` = ``noise_multiplier``) and divides by a denominator
that depends on no private data under the step's neighbouring relation; only that noisy
vector, and models computed from it, ever leave the peer. What one step guarantees depends on
how the records are sampled (:data:`SAMPLINGS`), and the event the accountant composes says so
(its ``relation``, :mod:`p2pdp.privacy.events`):

``full``
    Every record. Neighbouring relation: **replace-one** (as in the one-shot protocol): the
    shard size ``n`` is the same in both neighbours, so it is public and is the denominator;
    the sum moves by at most ``2 C``, so the step is a Gaussian mechanism with noise
    multiplier ``z / 2`` relative to its sensitivity
    (:class:`~p2pdp.privacy.events.GaussianEvent`, composed exactly by ``gdp``).
``fixed``
    ``min(batch_size, n)`` records without replacement. The same event as ``full``
    (replace-one, sensitivity ``2 C``): no amplification by this sampling is claimed, so the
    accounting is valid and conservative. Denominator: ``min(batch_size, n)`` (public under
    replace-one).
``poisson``
    Each record independently with probability ``q`` (``sampling_rate``). Neighbouring
    relation: **add-remove** (the DP-SGD convention; sensitivity ``C``), the
    :class:`~p2pdp.privacy.events.SubsampledGaussianEvent`, amplification by sampling
    accounted by ``pld`` (or ``rdp``). Under add/remove the shard size is private, so the
    denominator is ``q * min_shard_size``, the expected batch of a shard of the public
    lower bound ``min_shard_size`` (``privacy.min_shard_size``), never the peer's own ``q n``.

Rows of full or fixed sampling (and of the one-shot protocol) state replace-one epsilons;
rows of Poisson sampling state add/remove epsilons, which are worth twice as much under
replace-one: compare rows of the same ``neighbouring_relation`` only.

``z = 0`` adds no noise: the step is NOT private (:class:`~p2pdp.privacy.events.NonPrivateEvent`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.privacy.events import (
    ADD_REMOVE,
    REPLACE_ONE,
    GaussianEvent,
    NonPrivateEvent,
    PrivacyEvent,
    SubsampledGaussianEvent,
)
from p2pdp.privacy.tolerance import BUDGET_TOLERANCE

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
    min_shard_size : int or None
        Public lower bound on every peer's records: Poisson sampling divides by
        ``sampling_rate * min_shard_size`` (required for it; unused otherwise).
    """

    clip_norm: float
    noise_multiplier: float
    sampling: str = "full"
    sampling_rate: float = 1.0
    batch_size: int = 1
    min_shard_size: int | None = None

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
        if self.sampling == "poisson" and not (self.min_shard_size or 0) >= 1:
            raise ConfigError(
                "min_shard_size (privacy.min_shard_size) must be a public shard-size bound >= 1 "
                "for Poisson sampling: its add/remove guarantee forbids dividing by the "
                f"peer's own shard size; got {self.min_shard_size!r}"
            )

    @property
    def private(self) -> bool:
        """Whether a step has a guarantee (noise on a bounded sum)."""
        return self.noise_multiplier > 0

    @property
    def relation(self) -> str:
        """The neighbouring relation the guarantee is stated for (:data:`RELATIONS
        <p2pdp.privacy.events.RELATIONS>`)."""
        return ADD_REMOVE if self.sampling == "poisson" else REPLACE_ONE

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
            return SubsampledGaussianEvent(
                self.noise_multiplier, self.sampling_rate, relation=self.relation
            )
        z = self.noise_multiplier * self.clip_norm / self.sensitivity  # = noise_multiplier / 2
        epsilon = math.inf
        if delta_per_step > 0:
            from p2pdp.privacy.gdp import gdp_epsilon

            epsilon = float(gdp_epsilon(1.0 / z, delta_per_step))
        return GaussianEvent(z, epsilon, delta_per_step, relation=self.relation)

    def denominators(self, sizes: np.ndarray) -> np.ndarray:
        """The divisor of each peer's noisy sum, (P,): public under :attr:`relation`.

        ``full``: the shard size; ``fixed``: ``min(batch_size, n)`` (both fixed under
        replace-one); ``poisson``: ``sampling_rate * min_shard_size`` for every peer, whatever
        its ``sizes`` (under add/remove they are private).
        """
        sizes = np.asarray(sizes, dtype=float)
        if self.sampling == "poisson":
            assert self.min_shard_size is not None  # checked on construction
            return np.full(sizes.shape, self.sampling_rate * self.min_shard_size)
        if self.sampling == "fixed":
            return np.minimum(float(self.batch_size), sizes)
        return sizes

    def select(
        self, indptr: np.ndarray, rng: np.random.Generator | Sequence[np.random.Generator]
    ) -> np.ndarray:
        """Which records a step uses: a (N,) bool mask over records stored peer by peer.

        ``indptr`` (P + 1,): peer ``j`` holds records ``indptr[j]:indptr[j + 1]``. For
        ``poisson`` and ``fixed``, one uniform per record: ``N`` from ``rng``, or, given one
        generator per peer (each peer's own sampling stream), peer ``j``'s from ``rng[j]``
        (a peer's mask is then the same whichever other peers step with it); none for
        ``full``.
        """
        n = int(indptr[-1])
        if self.sampling == "full":
            return np.ones(n, dtype=bool)
        keys = self.uniforms(indptr, rng)
        if self.sampling == "poisson":
            return keys < self.sampling_rate
        owner = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        order = np.lexsort((keys, owner))  # records of each peer, in random order
        rank = np.arange(n) - indptr[owner[order]]
        mask = np.zeros(n, dtype=bool)
        mask[order[rank < self.batch_size]] = True
        return mask

    @staticmethod
    def uniforms(
        indptr: np.ndarray, rng: np.random.Generator | Sequence[np.random.Generator]
    ) -> np.ndarray:
        """One uniform in [0, 1) per record, (N,): from ``rng``, or peer ``j``'s from
        ``rng[j]`` (:meth:`select`)."""
        if isinstance(rng, np.random.Generator):
            return rng.random(int(indptr[-1]))
        sizes = np.diff(indptr).tolist()
        return np.concatenate([g.random(k) for g, k in zip(rng, sizes, strict=True)])

    def clip_factors(self, norms: np.ndarray) -> np.ndarray:
        """``min(1, C / norm)`` for each record's vector norm: multiply to clip."""
        norms = np.asarray(norms, dtype=float)
        with np.errstate(divide="ignore"):
            return np.minimum(1.0, self.clip_norm / norms)

    def noise(
        self,
        shape: tuple[int, ...],
        rng: np.random.Generator | Sequence[np.random.Generator],
    ) -> np.ndarray:
        """``N(0, (z C)^2)`` noise of ``shape`` (zeros, drawing nothing, when ``z = 0``).

        ``rng``: one generator, or one per row of a (k, d) ``shape`` (each peer's own
        stream: row ``j`` is ``rng[j]``'s next ``d`` standard normals times ``z C``, the
        numbers ``rng[j].normal(0, z C, d)`` gives, drawn at a lower cost per row).
        """
        if not self.private:
            return np.zeros(shape)
        scale = self.noise_multiplier * self.clip_norm
        if isinstance(rng, np.random.Generator):
            return rng.normal(0.0, scale, size=shape)
        out = np.empty(shape)
        for row, generator in zip(out, rng, strict=True):
            generator.standard_normal(out=row)
        out *= scale
        return out


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
    bisection on ``z`` against the accountant's composed epsilon (``pld``: its PLD; relative
    precision 1e-6, or 1e-4 for ``pld`` whose grid is coarser than that anyway; rounded up,
    so the returned ``z`` always fits).
    """
    from dataclasses import replace

    from p2pdp.privacy.accountants import composed
    from p2pdp.privacy.accounting import make_accountant

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
    precision = 1e-4 if accountant == "pld" else 1e-6
    while (high - low) > precision * high:
        middle = (low + high) / 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high
