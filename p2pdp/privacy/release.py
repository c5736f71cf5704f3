"""One release path: a group's statistics in, the noisy aggregate and its record out.

Plaintext and secure aggregation both go through :meth:`Releaser.release`; the curator
process calls nothing else, so every release is calibrated, drawn and recorded the same way.

A mechanism with ``additive = False`` (e.g. ``pooled-test``) instead defines the whole release
from the exact aggregate through :meth:`~p2pdp.privacy.mechanisms.Mechanism.release` (plaintext
only).

What is released to whom: the curator publishes ``aggregate(statistics) + eta``, with ``eta``
drawn by the run's :class:`~p2pdp.privacy.mechanisms.Mechanism` at the group's L2 sensitivity (the
task's :meth:`~p2pdp.tasks.Task.sensitivity` of this group's sizes, under the task's
neighbouring relation). In plaintext the curator sees every member's statistic and draws the
noise. With secure aggregation each member adds a share of the noise, drawn from its own
stream (:meth:`Releaser.member_stream`), to its own contribution and splits the sum into
additive shares (:mod:`p2pdp.privacy.secure_aggregation`); the curator learns only the noisy
aggregate, whose noise has ``K / max(K - 1, 1)`` times the mechanism's variance
(any ``K - 1`` shares carry the full noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, overload

import numpy as np

from p2pdp.core.boundary import calling, check_numbers
from p2pdp.core.columns import Rows
from p2pdp.core.errors import ConfigError
from p2pdp.privacy.mechanisms import Mechanism
from p2pdp.privacy.secure_aggregation import member_noise_share, secure_sum

#: Aggregates a group can release; "mean" and "sum" also work under secure aggregation.
LINEAR_AGGREGATES = ("mean", "sum")

Aggregate = str | Callable[[np.ndarray], np.ndarray]


class ReleaseRecord(NamedTuple):
    """What one release declares (every field but ``noise_norm`` is public).

    :meth:`as_row` gives the ``releases`` table's columns. A named tuple (immutable;
    ``_replace`` gives a copy with some fields changed): a run at 10^5 peers made its 10^5
    records in 0.11 s, against 0.30 s as a frozen dataclass.

    Attributes
    ----------
    group_size : int
        ``K``, members whose statistics were aggregated.
    n_min : int
        Smallest member shard size (the sensitivity depends on it).
    sensitivity : float
        L2 sensitivity of the aggregate the noise was calibrated to.
    mechanism : str
        The mechanism's name.
    epsilon, delta : float
        The guarantee of this one release (``inf`` when the mechanism declares none).
    noise_scale : float
        The scale parameter of the noise law (:meth:`Mechanism.noise_scale`).
    noise_std : float
        Standard deviation of one noise coordinate of the released vector, including the
        ``K / (K - 1)`` variance of secure aggregation: public (ensembles may weight by it).
    noise_norm : float
        ``||released - exact aggregate||_2``. FOR ANALYSIS ONLY: no party of the protocol
        learns it (it would reveal the exact aggregate).
    secure : bool
        Whether secure aggregation produced the release.
    """

    group_size: int
    n_min: int
    sensitivity: float
    mechanism: str
    epsilon: float
    delta: float
    noise_scale: float
    noise_std: float
    noise_norm: float
    secure: bool

    def as_row(self) -> dict[str, Any]:
        """The record as ``{column: value}``."""
        return dict(zip(self._fields, self, strict=True))

    @classmethod
    def from_row(cls, row: Any) -> ReleaseRecord:
        """The record of :meth:`as_row`, checked field by field (a record that arrives from
        another process, :mod:`p2pdp.net.coordinator`): exactly the record's fields; counts
        are ints >= 1; the mechanism a str of at most 100 characters; ``secure`` a bool;
        the other fields numbers >= 0 (``epsilon``, ``delta`` may be inf; ``noise_norm``
        NaN, unknown). ValueError naming the first field that is not."""
        if not isinstance(row, dict) or set(row) != set(_RECORD_FIELDS):
            raise ValueError(f"a release record needs exactly the fields {_RECORD_FIELDS}")
        for name in ("group_size", "n_min"):
            if type(row[name]) is not int or row[name] < 1:
                raise ValueError(f"record {name} must be an integer >= 1, got {row[name]!r}")
        if not isinstance(row["mechanism"], str) or len(row["mechanism"]) > 100:
            raise ValueError(f"record mechanism must be a short str, got {row['mechanism']!r:.40}")
        if type(row["secure"]) is not bool:
            raise ValueError(f"record secure must be a bool, got {row['secure']!r}")
        values = dict(row)
        for name in ("sensitivity", "epsilon", "delta", "noise_scale", "noise_std", "noise_norm"):
            value = values[name]
            finite = name in ("sensitivity", "noise_scale", "noise_std")
            if (
                type(value) not in (int, float)
                or (finite and not math.isfinite(value))
                or (name != "noise_norm" and math.isnan(value))
                or value < 0
            ):
                raise ValueError(f"record {name} must be a number >= 0, got {value!r}")
            values[name] = float(value)
        return cls(**values)


_RECORD_FIELDS = ReleaseRecord._fields


def record_column(records: Sequence[ReleaseRecord], name: str) -> np.ndarray:
    """Field ``name`` (a numeric one) of every record, (K,) (a new contiguous array)."""
    if isinstance(records, ReleaseTable):
        return np.array(records.column(name))
    return np.array([getattr(record, name) for record in records])


#: A :class:`ReleaseRecord` as one row of numbers (the mechanism's name as its index in the
#: table's list of names): 67 bytes a release instead of ~230 for the named tuple.
_RECORD_DTYPE = np.dtype(
    [
        (
            name,
            {"group_size": "i8", "n_min": "i8", "mechanism": "u2", "secure": "?"}.get(name, "f8"),
        )
        for name in _RECORD_FIELDS
    ]
)


class ReleaseTable(Sequence[ReleaseRecord]):
    """Release records kept as one row of numbers each (:class:`~p2pdp.core.columns.Rows`):
    what a run holds for its releases' records, without a Python object per release.

    Reads as the sequence of its :class:`ReleaseRecord` (built on access, field types as
    given: ints, floats, the mechanism's str, a bool), and by column (:meth:`column`). A
    record's ``group_size`` and ``n_min`` must be integers, the other numbers floats (int64
    and float64 hold them exactly).
    """

    __slots__ = ("_names", "_rows")

    def __init__(self) -> None:
        self._rows = Rows((), _RECORD_DTYPE)
        self._names: list[str] = []  # the mechanisms' names; a row holds the index

    def reserve(self, capacity: int) -> None:
        """Room for ``capacity`` records (:meth:`p2pdp.core.columns.Rows.reserve`)."""
        self._rows.reserve(capacity)

    def _code(self, name: str) -> int:
        if name not in self._names:
            self._names.append(name)
        return self._names.index(name)

    def append(self, record: ReleaseRecord) -> None:
        """Append one record."""
        self._rows.append((*record[:3], self._code(record.mechanism), *record[4:]))

    def extend(self, records: Sequence[ReleaseRecord]) -> None:
        """Append ``records``, in order (field by field: no row object per record)."""
        block = np.empty(len(records), _RECORD_DTYPE)
        for name, values in zip(_RECORD_FIELDS, zip(*records, strict=True), strict=False):
            if name == "mechanism":
                codes = {mechanism: self._code(mechanism) for mechanism in set(values)}
                values = tuple(map(codes.__getitem__, values))
            block[name] = values
        self._rows.extend(block)

    def column(self, name: str) -> np.ndarray:
        """Field ``name`` of every record, (K,): a view for a number; the names for
        ``mechanism`` (an object array)."""
        values = self._rows.array[name]
        if name == "mechanism":
            return np.array(self._names, dtype=object)[values]
        return values

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> ReleaseRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[ReleaseRecord]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        values = list(self._rows.array[index].tolist())  # IndexError past the end
        values[3] = self._names[values[3]]
        return ReleaseRecord(*values)


class NoiseStream:
    """Noise for one run, drawn in batches of unit-sensitivity vectors.

    For a mechanism whose noise is a scale family in the sensitivity
    (:attr:`Mechanism.scale_family`: noise for ``Delta`` is ``Delta`` times noise for 1),
    drawing a batch of unit vectors and scaling each by its group's sensitivity has the same
    distribution as one call per group, and is much faster. Other mechanisms are called once
    per release.
    """

    _BATCH = 256

    def __init__(self, mechanism: Mechanism, dim: int, *, rng: np.random.Generator) -> None:
        self.mechanism = mechanism
        self.dim = dim
        self.rng = rng
        self._unit: list[np.ndarray] = []

    def draw(self, sensitivity: float, *, rng: np.random.Generator | None = None) -> np.ndarray:
        """One noise vector (dim,) for a release of L2 sensitivity ``sensitivity``; from
        ``rng`` if given (the stream then does not move), else from the run's stream."""
        if rng is not None:
            return self._sample(sensitivity, None, rng=rng)
        if not getattr(self.mechanism, "scale_family", False):
            return self._sample(sensitivity, None)
        if not self._unit:
            self._unit = list(self._sample(1.0, self._BATCH)[::-1])
        return sensitivity * self._unit.pop()

    def draw_many(self, sensitivities: list[float]) -> np.ndarray:
        """:meth:`draw` for each of ``sensitivities`` in turn, from the run's stream: the same
        vectors, as the rows of an array of shape (n, dim) (a scale family's unit vectors
        scaled in one operation), and the stream left where those draws leave it."""
        n = len(sensitivities)
        if not getattr(self.mechanism, "scale_family", False):
            return np.array([self.draw(s) for s in sensitivities]).reshape(n, self.dim)
        left = self._unit  # the current batch's unused vectors, the next one last
        used = min(n, len(left))
        units = [np.array(left[: -used - 1 : -1]).reshape(used, self.dim)]
        del left[len(left) - used :]
        while n > used:
            batch = self._sample(1.0, self._BATCH)
            units.append(batch[: n - used])
            if n - used < self._BATCH:
                self._unit = list(batch[n - used :][::-1])
            used += min(n - used, self._BATCH)
        return np.asarray(sensitivities, dtype=np.float64)[:, None] * np.concatenate(units)

    def state(self) -> tuple[Mapping[str, Any], list[np.ndarray]]:
        """Where the stream stands (its generator's state and the batch's unused vectors):
        :meth:`restore` moves a copy of this stream (a forked process's) there."""
        return self.rng.bit_generator.state, list(self._unit)

    def restore(self, state: tuple[Mapping[str, Any], list[np.ndarray]]) -> None:
        """Move the stream to ``state`` (:meth:`state` of a copy of it that drew on)."""
        self.rng.bit_generator.state, unit = state
        self._unit = list(unit)

    def skip(self, n: int) -> None:
        """Discard the next ``n`` draws: a replica of the run's stream held by one curator
        moves to the draw of the release it makes (:mod:`p2pdp.net.host`).

        Only for scale families: another mechanism's draws may depend on the sensitivities
        of the releases skipped, which this replica does not know.
        """
        if n < 0:
            raise ValueError(f"cannot skip {n} draws: the stream only moves forward")
        if n and not getattr(self.mechanism, "scale_family", False):
            raise ConfigError(
                f"mechanism {getattr(self.mechanism, 'name', self.mechanism)!r} is not a scale "
                "family: a curator cannot reproduce the run's noise stream (network runtime)"
            )
        for _ in range(n):
            if not self._unit:
                self._unit = list(self._sample(1.0, self._BATCH)[::-1])
            self._unit.pop()

    def _sample(
        self, sensitivity: float, size: int | None, *, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        """The mechanism's noise, checked: numbers, finite, of shape (dim,) or (size, dim)."""
        with calling("mechanism", self.mechanism, "sample"):
            noise = self.mechanism.sample(
                sensitivity, self.dim, rng=self.rng if rng is None else rng, size=size
            )
        shape = (self.dim,) if size is None else (size, self.dim)
        return check_numbers(noise, "mechanism", self.mechanism, "sample", shape=shape)


class Releaser:
    """Releases groups' aggregates through one mechanism, in plaintext or securely.

    Parameters
    ----------
    mechanism : Mechanism
        Calibrated to one release's epsilon (and delta).
    dim : int
        Length ``d`` of every statistic.
    aggregate : "mean", "sum" or callable
        How a group combines its members' statistics, shape (K, d) -> (d,). A callable
        (e.g. a median) needs the curator to see every statistic: not with ``secure``.
    secure : bool
        Secure aggregation (the mechanism must be splittable; the aggregate linear).
    noise_rng, share_rng : numpy.random.Generator
        Mechanism draws (plaintext); secure-aggregation masks (simulated: a masked share
        cancels out of the sum, so the masks never change a release).
    member_seed : numpy.random.SeedSequence
        Secure aggregation: the root of every member's own noise stream
        (:meth:`member_stream`). Required with ``secure``.
    """

    def __init__(
        self,
        mechanism: Mechanism,
        dim: int,
        *,
        aggregate: Aggregate,
        secure: bool,
        noise_rng: np.random.Generator,
        share_rng: np.random.Generator,
        member_seed: np.random.SeedSequence | None = None,
    ) -> None:
        if secure and aggregate not in LINEAR_AGGREGATES:
            raise ConfigError(
                "privacy.secure_aggregation = true needs a linear aggregate (mean or sum); "
                f"the task aggregates with {aggregate!r}"
            )
        if secure and not getattr(mechanism, "additive", True):
            raise ConfigError(
                "privacy.secure_aggregation = true needs additive noise the members can split; "
                f"mechanism {getattr(mechanism, 'name', mechanism)!r} defines its own release"
            )
        if not callable(aggregate) and aggregate not in LINEAR_AGGREGATES:
            raise ConfigError(
                f"a task's aggregate must be one of {LINEAR_AGGREGATES} or a callable, "
                f"got {aggregate!r}"
            )
        if secure and member_seed is None:
            raise ConfigError(
                "secure aggregation draws each member's noise share from its own stream: "
                "give the Releaser a member_seed"
            )
        self.mechanism = mechanism
        self.dim = dim
        self.member_seed = member_seed
        self.aggregate = aggregate
        self.secure = secure
        self.noise = NoiseStream(mechanism, dim, rng=noise_rng)
        self.share_rng = share_rng
        self.name = getattr(mechanism, "name", type(mechanism).__name__)
        self.epsilon, self.delta = (float(v) for v in mechanism.guarantee(dim))
        # Scale and std are linear in the sensitivity for a scale family: compute them once.
        self._unit = (
            (float(mechanism.noise_scale(1.0, dim)), float(mechanism.noise_std(1.0, dim)))
            if getattr(mechanism, "scale_family", False)
            else None
        )

    def exact(self, statistics: np.ndarray) -> np.ndarray:
        """The aggregate without noise (the curator's view in plaintext), shape (d,)."""
        if callable(self.aggregate):
            return np.asarray(self.aggregate(statistics), dtype=np.float64)
        # Reducing axis 0 of a C-contiguous (K, d) array adds the rows in order.
        total = statistics.sum(axis=0)
        return total / statistics.shape[0] if self.aggregate == "mean" else total

    def member_stream(self, group: int, peer: int) -> np.random.Generator:
        """The generator peer ``peer`` draws its noise share for group ``group`` from (secure
        aggregation): a child of ``member_seed`` keyed by both, so every member's share is
        its own draw, reproduced by the network runtime's member (:mod:`p2pdp.net.host`)
        without any other party's. Seeded, hence NOT private as deployed: on the network a
        member draws from :func:`~p2pdp.core.rng.os_generator` unless
        ``network.seeded_noise`` asks for this stream (tests of parity)."""
        assert self.member_seed is not None  # __init__ requires it with secure
        seed = self.member_seed
        return np.random.Generator(
            np.random.PCG64(
                np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, group, peer))
            )
        )

    def noise_share(
        self, sensitivity: float, n_members: int, *, rng: np.random.Generator
    ) -> np.ndarray:
        """A member's noise share for a group of ``n_members``, shape (d,), drawn from ``rng``
        (the member's own: :meth:`member_stream` in simulation)."""
        with calling("mechanism", self.mechanism, "noise_shares"):
            share = member_noise_share(
                self.mechanism,
                sensitivity=sensitivity,
                n_members=n_members,
                dim=self.dim,
                rng=rng,
            )
        return check_numbers(share, "mechanism", self.mechanism, "noise_shares", shape=(self.dim,))

    def contribution(
        self, statistic: np.ndarray, n_members: int, noise_share: np.ndarray
    ) -> np.ndarray:
        """What a member feeds into secure aggregation: its part of the aggregate plus its
        noise share (``statistic / K + share`` for the mean, ``statistic + share`` for the
        sum). Rows of ``statistic`` (..., d) and ``noise_share`` are members."""
        if self.aggregate == "mean":
            return statistic / n_members + noise_share
        return statistic + noise_share

    def release(
        self,
        statistics: np.ndarray,
        sizes: list[int],
        sensitivity: float,
        *,
        curator: int = 0,
        group: int = 0,
        members: list[int] | None = None,
        noise_rng: np.random.Generator | None = None,
    ) -> tuple[np.ndarray, ReleaseRecord]:
        """The noisy aggregate of one group, and its record.

        Parameters
        ----------
        statistics : ndarray, shape (K, d)
            Members' statistics (plaintext: in arrival order; secure: in member order).
        sizes : list of int, length K
            Members' shard sizes (public inside the group).
        sensitivity : float
            L2 sensitivity of the aggregate for this group.
        curator : int
            Row of the curator in ``statistics`` (secure aggregation).
        group, members : int, list of int
            Secure aggregation: the group's id and the peer behind each row (default
            ``0 .. K-1``), which select every member's noise stream.
        noise_rng : numpy.random.Generator, optional
            Plaintext: draw this release's noise from ``noise_rng`` (the network runtime's
            curator: :func:`~p2pdp.core.rng.os_generator`) instead of the run's seeded stream.

        Returns
        -------
        released : ndarray, shape (d,)
        record : ReleaseRecord
        """
        n_members = statistics.shape[0]
        if self.secure:
            peers = range(n_members) if members is None else members
            shares = np.stack(
                [
                    self.noise_share(sensitivity, n_members, rng=self.member_stream(group, peer))
                    for peer in peers
                ]
            )
            contributions = self.contribution(statistics, n_members, shares)
            released = secure_sum(contributions, curator=curator, rng=self.share_rng).total
            noise_norm = float(np.linalg.norm(released - self.exact(statistics)))
        elif not getattr(self.mechanism, "additive", True):  # the mechanism defines the release
            exact = self.exact(statistics)
            with calling("mechanism", self.mechanism, "release"):
                value = self.mechanism.release(
                    exact, sensitivity, rng=self.noise.rng if noise_rng is None else noise_rng
                )
            released = check_numbers(
                value, "mechanism", self.mechanism, "release", shape=np.shape(exact)
            )
            noise_norm = float(np.linalg.norm(released - exact))
        else:
            noise = self.noise.draw(sensitivity, rng=noise_rng)
            released = self.exact(statistics) + noise
            noise_norm = math.sqrt(float(noise @ noise))
        return released, self.record(n_members, sizes, sensitivity, noise_norm)

    def record(
        self, n_members: int, sizes: list[int], sensitivity: float, noise_norm: float
    ) -> ReleaseRecord:
        """The public record of a release of ``n_members`` statistics (``noise_norm`` is
        analysis-only: NaN where the curator cannot know it, secure aggregation on the
        network)."""
        return self._record(n_members, int(min(sizes)), sensitivity, noise_norm)

    def records(
        self,
        n_members: int,
        n_min: list[int],
        sensitivities: list[float],
        noise_norms: list[float],
    ) -> list[ReleaseRecord]:
        """:meth:`record` of many releases of ``n_members`` statistics each, given each one's
        smallest shard size, sensitivity and noise norm."""
        record = self._record
        return [
            record(n_members, smallest, sensitivity, norm)
            for smallest, sensitivity, norm in zip(n_min, sensitivities, noise_norms, strict=True)
        ]

    def _record(
        self, n_members: int, n_min: int, sensitivity: float, noise_norm: float
    ) -> ReleaseRecord:
        sensitivity = float(sensitivity)
        if self._unit is not None:
            scale, std = self._unit[0] * sensitivity, self._unit[1] * sensitivity
        else:
            scale = float(self.mechanism.noise_scale(sensitivity, self.dim))
            std = float(self.mechanism.noise_std(sensitivity, self.dim))
        inflation = math.sqrt(n_members / max(n_members - 1, 1)) if self.secure else 1.0
        return ReleaseRecord(
            n_members,
            n_min,
            sensitivity,
            self.name,
            self.epsilon,
            self.delta,
            scale,
            std * inflation,
            noise_norm,
            self.secure,
        )
