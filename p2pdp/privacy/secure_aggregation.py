"""Secure aggregation with distributed noise: the curator learns only the noisy sum.

In the seed protocol every member of a group sends its local model to the curator in the clear,
so the curator sees un-noised models. Here the K members of a group instead run plain additive
secret sharing over the ring Z_(2^64):

1. **Noise.** Member ``i`` adds its own noise share ``eta_i`` (:func:`member_noise_share`,
   drawn from the member's own generator) to ``w_i / K``, so the contributions sum to the
   group mean plus the mechanism's noise and no single party knows the total noise.
2. **Encoding.** Each contribution is encoded in fixed point (:class:`FixedPoint`) as ``uint64``
   (two's complement for negatives).
3. **Share phase.** Member ``i`` splits its encoding into K shares, uniform mod 2^64 and summing
   to it (:func:`share`); it keeps share ``i`` and sends share ``j`` to member ``j``:
   ``K (K - 1)`` messages of ``8 d`` bytes.
4. **Partial phase.** Member ``j`` adds the K shares it holds (mod 2^64) and sends that partial
   sum to the curator (a member too): ``K - 1`` messages.
5. **Decode.** The curator adds the K partial sums mod 2^64 and decodes the noisy mean.

Who sees what (honest-but-curious parties). Any K - 1 of the K shares of a value are iid uniform
on the ring whatever the value, so a coalition of fewer than K members learns nothing from the
shares beyond its own inputs; the partial sums it additionally sees (the curator sees all of
them) are uniform subject to adding up to the released total. Hence the curator's view is a
function of its own input and the noisy mean only (tests check this by two-sample tests on the
curator's messages). What the total reveals is governed by the DP mechanism.

Privacy of the released mean. Neighbouring datasets differ by replacing one record of one
member's shard; the unit protected is that record. The caller calibrates the mechanism on the L2
sensitivity of the group mean, ``2 / (K n_min lambda)``. Every member knows its own noise share
and can subtract it from the release, so :func:`member_noise_share` sizes the shares so that any
K - 1 of them already add up to the mechanism's noise: the guarantee holds against the curator,
every member and every outsider. Coalitions of two or more members that pool their noise shares
are not covered (they remove more than one share).

Dropouts. A member that vanishes before its partial sum reaches the curator (mid-way through its
shares or after them), or a curator that vanishes before decoding, leaves the sum unrecoverable
and the noise short. The round is then aborted: :func:`secure_sum` raises
:class:`SecureAggregationAborted` before anything is decoded; nothing is released, so the caller
charges nobody and retries with a new group.

A group of one (K = 1) is its own curator: no message is sent and its noise share is the full
noise.

numpy generators are not cryptographically secure: fine for a simulator, not for deployment
(:func:`share` with ``rng=None`` draws the masks from the operating system's CSPRNG, as the
network runtime's members do).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from p2pdp.core.errors import ConfigError, P2PDPError
from p2pdp.core.validation import require_count
from p2pdp.privacy.mechanisms import Mechanism

RING_BYTES = 8
"""Bytes per ring element (one ``uint64``)."""


class SecureAggregationAborted(P2PDPError):
    """A member or the curator dropped out; the round produced no output.

    Attributes
    ----------
    dropped : tuple of int
        Sorted member indices (0..K-1 within the group) that dropped out.
    """

    def __init__(self, dropped: Collection[int]) -> None:
        self.dropped = tuple(sorted(dropped))
        super().__init__(
            f"secure aggregation aborted: member(s) {list(self.dropped)} dropped out before "
            "the curator held every partial sum; nothing was released"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedPoint:
    """Fixed-point codec between float64 and the ring Z_(2^64), stored as ``uint64``.

    A real ``x`` is encoded as ``round(x * 2^frac_bits) mod 2^64`` (two's complement for
    negatives) and decoded by reading the word as ``int64`` and dividing by ``2^frac_bits``.
    Rounding moves each encoded value by at most ``2^-(frac_bits + 1)``, so a sum of K encodings
    decodes to within ``K * 2^-(frac_bits + 1)`` per coordinate of the float sum.

    Range. The ring holds signed values of magnitude below ``2^(63 - frac_bits)``; the codec
    keeps one bit of headroom, ``max_abs = 2^(62 - frac_bits)`` (2^26 ~ 6.7e7 for the default
    36 fractional bits), so that rounding and float error can never wrap. The check is made on
    the actual values: with ``sum_axis`` given, the sum of magnitudes along that axis must stay
    below ``max_abs``, which guarantees that the modular sum of the encodings decodes correctly.

    For logistic-regression models the bound is loose by many orders of magnitude: the exact
    minimiser of ``J(w) = mean log-loss + (lambda/2) ||w||^2`` satisfies
    ``(lambda/2) ||w||^2 <= J(w) <= J(0) = ln 2``, i.e. ``||w||_2 <= sqrt(2 ln 2 / lambda)``
    (37 for lambda = 1e-3), and a contribution ``w_i / K`` is K times smaller. DP noise has
    unbounded tails, which is why the check is on the values; noise large enough to leave the
    range would make the aggregate useless anyway.

    Parameters
    ----------
    frac_bits : int
        Fractional bits, ``1 <= frac_bits <= 61``. The default 36 gives a resolution of
        1.5e-11 (a sum over 100 members is within 7.3e-10 of the float sum, typically 5e-11)
        while leaving room for noise up to ~1e7; lower it for larger values.
    """

    frac_bits: int = 36

    def __post_init__(self) -> None:
        bits = self.frac_bits
        if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 61:
            raise ConfigError(f"frac_bits must be an integer in [1, 61], got {bits!r}")

    @property
    def scale(self) -> float:
        """Encoding scale ``2^frac_bits``."""
        return float(2**self.frac_bits)

    @property
    def max_abs(self) -> float:
        """Largest magnitude (exclusive) of an encoded value or of a sum of encoded values."""
        return float(2 ** (62 - self.frac_bits))

    def encode(self, x: ArrayLike, *, sum_axis: int | None = None) -> NDArray[np.uint64]:
        """Encode reals into ring elements.

        Parameters
        ----------
        x : array_like of float, any shape
            Finite values with ``|x| < max_abs``.
        sum_axis : int, optional
            Axis along which the encodings will be added: then the sum of ``|x|`` along it must
            be below ``max_abs`` (implies the element-wise bound).

        Returns
        -------
        numpy.ndarray of uint64, shape of ``x``

        Raises
        ------
        ConfigError
            A value (or sum of magnitudes) is out of range or not finite; the message names it.
        """
        x = np.asarray(x, dtype=np.float64)
        magnitude = np.abs(x) if sum_axis is None else np.abs(x).sum(axis=sum_axis)
        outside = ~(magnitude < self.max_abs)  # also catches nan
        if outside.any():
            where = np.unravel_index(np.argmax(outside), outside.shape)
            what, shown = ("value", x) if sum_axis is None else ("sum of |values|", magnitude)
            limit = f"2^{62 - self.frac_bits}"
            raise ConfigError(
                f"{what} {float(shown[where])!r} at index {tuple(map(int, where))} is outside "
                f"the fixed-point range (-{limit}, {limit}) of frac_bits={self.frac_bits}"
            )
        return np.rint(x * self.scale).astype(np.int64).view(np.uint64)

    def decode(self, v: ArrayLike) -> NDArray[np.float64]:
        """Decode ring elements (``uint64``, any shape) into float64 of the same shape."""
        return np.asarray(v, dtype=np.uint64).view(np.int64) / self.scale


def share(
    values: ArrayLike, n_shares: int, *, rng: np.random.Generator | None
) -> NDArray[np.uint64]:
    """Split ring elements into additive shares mod 2^64.

    The first ``n_shares - 1`` shares are iid uniform on Z_(2^64); the last is the value minus
    their sum. Any ``n_shares - 1`` of the shares are therefore iid uniform whatever the value.

    Parameters
    ----------
    values : numpy.ndarray of uint64, shape (..., d)
    n_shares : int
        Number of shares, >= 1.
    rng : numpy.random.Generator or None
        Draws the uniform shares (reproducible: the simulator). None: the operating system's
        cryptographically secure generator (:func:`os.urandom`), as a real member must use
        (:mod:`p2pdp.net.host`): a share drawn from a seeded generator hides nothing from
        whoever knows the seed.

    Returns
    -------
    numpy.ndarray of uint64, shape (..., n_shares, d)
        ``shares.sum(axis=-2) == values`` (mod 2^64).
    """
    n_shares = require_count("n_shares", n_shares)
    values = np.asarray(values, dtype=np.uint64)
    shape = (*values.shape[:-1], n_shares, values.shape[-1])
    if rng is None:
        shares = np.frombuffer(os.urandom(RING_BYTES * math.prod(shape)), dtype=np.uint64)
        shares = shares.reshape(shape).copy()  # writable
    else:
        shares = rng.integers(0, 2**64, size=shape, dtype=np.uint64)  # last row is overwritten
    np.subtract(values, shares[..., :-1, :].sum(axis=-2), out=shares[..., -1, :])
    return shares


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolCost:
    """Messages and payload bytes of one secure-aggregation round of K members.

    Payload only (one ``uint64`` per coordinate); the transport adds its own headers.

    Attributes
    ----------
    payload_bytes : int
        Bytes of every message, ``8 d``.
    share_messages : int
        Share phase: ``K (K - 1)`` messages, member ``i`` to member ``j != i``.
    partial_messages : int
        Partial phase: ``K - 1`` messages, every non-curator member to the curator.
    messages : int
        ``share_messages + partial_messages``.
    bytes_per_round : int
        ``messages * payload_bytes``.
    bytes_per_member : int
        Most bytes any member sends: ``K * payload_bytes`` for a non-curator member (the
        curator sends ``(K - 1) * payload_bytes``); 0 when K = 1. Plaintext: ``payload_bytes``.
    """

    payload_bytes: int
    share_messages: int
    partial_messages: int
    messages: int
    bytes_per_round: int
    bytes_per_member: int


def protocol_cost(n_members: int, dim: int) -> ProtocolCost:
    """Message counts and sizes of one round, without building any payload.

    Parameters
    ----------
    n_members : int
        Group size K, >= 1.
    dim : int
        Model dimension d, >= 1.
    """
    n_members = require_count("n_members", n_members)
    payload = RING_BYTES * require_count("dim", dim)
    shares = n_members * (n_members - 1)
    partials = n_members - 1
    return ProtocolCost(
        payload_bytes=payload,
        share_messages=shares,
        partial_messages=partials,
        messages=shares + partials,
        bytes_per_round=(shares + partials) * payload,
        bytes_per_member=(n_members - 1 + min(partials, 1)) * payload,
    )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Message:
    """One protocol message as it travels on the wire.

    Attributes
    ----------
    sender, receiver : int
        Member indices within the group (0..K-1).
    kind : {"share", "partial"}
        A share of the sender's encoded contribution, or the sender's partial sum.
    payload : numpy.ndarray of uint64, shape (d,)
    """

    sender: int
    receiver: int
    kind: Literal["share", "partial"]
    payload: NDArray[np.uint64]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SecureSumResult:
    """Output of one round.

    Attributes
    ----------
    total : numpy.ndarray of float64, shape (d,)
        The decoded sum of the contributions, known to the curator only.
    cost : ProtocolCost
    transcript : tuple of Message or None
        Every message of the round (share phase first), when requested.
    """

    total: NDArray[np.float64]
    cost: ProtocolCost
    transcript: tuple[Message, ...] | None


def secure_sum(
    contributions: ArrayLike,
    *,
    curator: int,
    rng: np.random.Generator,
    codec: FixedPoint = FixedPoint(),
    dropped: Collection[int] = (),
    record: bool = False,
) -> SecureSumResult:
    """Run one round of additive secret sharing; the curator learns only the sum.

    Parameters
    ----------
    contributions : numpy.ndarray of float64, shape (K, d)
        Row ``i`` is member ``i``'s private input (already including its noise share). The sum
        of magnitudes per coordinate must be below ``codec.max_abs``.
    curator : int
        Index of the member acting as curator, ``0 <= curator < K``.
    rng : numpy.random.Generator
        Draws the shares.
    codec : FixedPoint
    dropped : collection of int
        Members that stopped before their partial sum reached the curator (during the share
        phase or after it), and the curator if it stopped before decoding. A member that stops
        after delivering its partial sum is not a dropout here. Any entry aborts the round.
    record : bool
        Return the transcript of every message (slow; for tests and inspection).

    Returns
    -------
    SecureSumResult

    Raises
    ------
    SecureAggregationAborted
        ``dropped`` is not empty; raised before any share is drawn or anything decoded.
    ConfigError
        Bad shapes, indices or values outside the fixed-point range.
    """
    contributions = np.asarray(contributions, dtype=np.float64)
    if contributions.ndim != 2 or 0 in contributions.shape:
        raise ConfigError(f"contributions must have shape (K, d), got {contributions.shape}")
    n_members, dim = contributions.shape
    for name, member in [("curator", curator), *(("dropped member", m) for m in dropped)]:
        if not isinstance(member, (int, np.integer)) or not 0 <= member < n_members:
            raise ConfigError(f"{name} must be a member index in [0, {n_members}), got {member!r}")
    encoded = codec.encode(contributions, sum_axis=0)
    if dropped:
        raise SecureAggregationAborted(dropped)

    shares = share(encoded, n_members, rng=rng)  # shares[i, j]: from member i to member j
    partials = shares.sum(axis=0)  # partials[j]: member j's partial sum
    total = codec.decode(partials.sum(axis=0))
    transcript = None
    if record:
        transcript = tuple(
            Message(sender=i, receiver=j, kind="share", payload=shares[i, j])
            for i in range(n_members)
            for j in range(n_members)
            if i != j
        ) + tuple(
            Message(sender=j, receiver=curator, kind="partial", payload=partials[j])
            for j in range(n_members)
            if j != curator
        )
    return SecureSumResult(total=total, cost=protocol_cost(n_members, dim), transcript=transcript)


def member_noise_share(
    mechanism: Mechanism,
    *,
    sensitivity: float,
    n_members: int,
    dim: int,
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """One member's noise share: one share of a ``max(K - 1, 1)``-way split of the noise.

    Every member knows its own share and could subtract it from the release; with shares of a
    ``(K - 1)``-way split the other K - 1 shares still carry the full noise of ``mechanism``
    (calibrated on ``sensitivity``), so the guarantee holds against every single member, the
    curator included. The release carries the noise of K shares, ``K / (K - 1)`` times the
    mechanism's variance. With K = 1 and K = 2 each member adds the full noise.

    Each member draws its share alone, from its own generator (the simulator and the network
    runtime both give member ``peer`` of group ``group`` the stream
    :meth:`Releaser.member_stream <p2pdp.privacy.release.Releaser.member_stream>`): no party
    ever holds another member's share.

    Parameters
    ----------
    mechanism : Mechanism
        Must be splittable (``mechanism.splittable``): coordinate Laplace (differences of
        Gamma(1/m, b) per coordinate) or Gaussian (N(0, sigma^2 / m)).
    sensitivity : float
        L2 sensitivity of the group's aggregate, e.g. ``2 / (K n_min lambda)`` for the mean.
    n_members : int
        Group size K, >= 1.
    dim : int
        Model dimension d, >= 1.
    rng : numpy.random.Generator
        The member's own generator.

    Returns
    -------
    numpy.ndarray of float64, shape (d,)

    Raises
    ------
    ConfigError
        The mechanism is not ``splittable`` (vector Laplace; raised by
        :meth:`~p2pdp.privacy.mechanisms.Mechanism.noise_shares`, naming the splittable ones).
    """
    split = max(require_count("n_members", n_members) - 1, 1)
    one = getattr(mechanism, "noise_share", None)  # a plug-in may only split whole draws
    if one is None:  # the shares of a split are iid: any one of them is a member's
        return np.asarray(mechanism.noise_shares(sensitivity, dim, split, rng=rng))[0]
    return np.asarray(one(sensitivity, dim, split, rng=rng))


def draw_noise_shares(
    mechanism: Mechanism,
    *,
    sensitivity: float,
    n_members: int,
    dim: int,
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """Every member's noise share (:func:`member_noise_share`), drawn in turn from ``rng``.

    Returns
    -------
    numpy.ndarray of float64, shape (K, d)
        Row ``i`` is member ``i``'s noise share; any K - 1 rows add up to the mechanism's
        noise.
    """
    return np.stack(
        [
            member_noise_share(
                mechanism, sensitivity=sensitivity, n_members=n_members, dim=dim, rng=rng
            )
            for _ in range(require_count("n_members", n_members))
        ]
    )


def secure_noisy_mean(
    models: ArrayLike,
    noise_shares: ArrayLike,
    *,
    curator: int,
    rng: np.random.Generator,
    codec: FixedPoint = FixedPoint(),
    dropped: Collection[int] = (),
    record: bool = False,
) -> SecureSumResult:
    """Noisy group mean by secure aggregation: member ``i`` contributes ``w_i / K + eta_i``.

    Parameters
    ----------
    models : numpy.ndarray of float64, shape (K, d)
        The members' exact local models (never leave their owners in the clear).
    noise_shares : numpy.ndarray of float64, shape (K, d)
        Row ``i`` is member ``i``'s noise share (from :func:`draw_noise_shares`).
    curator, rng, codec, dropped, record
        As in :func:`secure_sum`.

    Returns
    -------
    SecureSumResult
        ``total`` is ``mean(models) + sum(noise_shares)`` up to fixed-point rounding
        (at most ``K * 2^-(frac_bits + 1)`` per coordinate). Released to the curator, who
        publishes it.
    """
    models = np.asarray(models, dtype=np.float64)
    noise_shares = np.asarray(noise_shares, dtype=np.float64)
    if models.ndim != 2 or noise_shares.shape != models.shape:
        raise ConfigError(
            "models and noise_shares must both have shape (K, d), got "
            f"{models.shape} and {noise_shares.shape}"
        )
    return secure_sum(
        models / models.shape[0] + noise_shares,
        curator=curator,
        rng=rng,
        codec=codec,
        dropped=dropped,
        record=record,
    )
