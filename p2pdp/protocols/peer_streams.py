"""The random streams of an iterative protocol's peers, and the pair streams of its edges.

Every peer draws its step's noise, its record sampling and (gossip learning) its gossip
targets from generators of its own (:class:`PeerStreams`); every overlay edge ``e`` (``(a,
b)``, ``a < b``, :func:`~p2pdp.protocols.correlated_dp.edge_pairs` order) has a pair stream
shared by its two ends (D-PSGD's correlated noise, :class:`PairStream`; :func:`pair_ends`
lists a peer's ends). :class:`StreamSeeds` holds one root entropy per family and derives peer
``i``'s generator as ``SeedSequence(entropy, spawn_key=(i,))`` (what
``SeedSequence(entropy).spawn(P)[i]`` gives): any runtime hosting peer ``i`` draws the same
numbers from the same :class:`StreamSeeds`, and the batched protocol draws each stepping
peer's numbers from the same generators. :meth:`StreamSeeds.from_rngs` takes the run's named
streams (the simulator: ``generator(seed, name, fold, repetition)`` for ``noise``,
``sampling``, ``gossip``, ``pairs``); :meth:`StreamSeeds.fresh` takes the operating system's
CSPRNG (a network run without seeded noise: one host's own peers; an edge's pair stream then
comes from a secret its two ends agree over the wire: :mod:`p2pdp.net.pair_keys`). The
machines that draw from them are :mod:`p2pdp.protocols.iterative_peer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["PairStream", "PairTerm", "PeerStreams", "StreamSeeds", "pair_ends"]

#: Stream families a peer draws from (the run's named streams of the same names).
PEER_STREAMS = ("noise", "sampling", "gossip")


class PeerStreams:
    """One peer's generators: its step noise, its record sampling, its gossip targets.

    Each is the one given, or else created from ``seeds`` on first use
    (:meth:`StreamSeeds.generator`, ~20 us; a family the run has no root for raises
    ``KeyError`` only if it is used).
    """

    __slots__ = ("_given", "_peer", "_seeds")

    def __init__(
        self,
        seeds: StreamSeeds | None = None,
        peer: int = 0,
        **given: np.random.Generator,
    ) -> None:
        unknown = set(given) - set(PEER_STREAMS)
        if unknown:
            raise TypeError(f"unknown streams {sorted(unknown)}; a peer has {PEER_STREAMS}")
        self._seeds, self._peer, self._given = seeds, int(peer), dict(given)

    def _get(self, family: str) -> np.random.Generator:
        if family not in self._given:
            if self._seeds is None:
                raise KeyError(f"no {family!r} stream given")
            self._given[family] = self._seeds.generator(family, self._peer)
        return self._given[family]

    @property
    def noise(self) -> np.random.Generator:
        return self._get("noise")

    @property
    def sampling(self) -> np.random.Generator:
        return self._get("sampling")

    @property
    def gossip(self) -> np.random.Generator:
        return self._get("gossip")

    def replaced(self, **given: np.random.Generator) -> PeerStreams:
        """The same streams with ``given`` ones replaced (audits record draws this way)."""
        streams = PeerStreams(self._seeds, self._peer)
        streams._given = {**self._given, **given}
        return streams


@dataclass(frozen=True, slots=True)
class StreamSeeds:
    """Root entropy of each stream family of a run; peer ``i``'s and edge ``e``'s generators.

    Attributes
    ----------
    entropy : mapping of str to tuple of int
        ``"noise"``, ``"sampling"``, ``"gossip"``, ``"pairs"``: four 63-bit integers each.
    """

    entropy: Mapping[str, tuple[int, ...]]

    @classmethod
    def from_rngs(cls, rngs: Mapping[str, np.random.Generator]) -> StreamSeeds:
        """Roots drawn from the run's named streams (four integers from each present)."""
        families = (*PEER_STREAMS, "pairs")
        return cls(
            entropy={
                name: tuple(int(v) for v in rngs[name].integers(0, 2**63, size=4))
                for name in families
                if name in rngs
            }
        )

    @classmethod
    def fresh(cls) -> StreamSeeds:
        """Roots from the operating system's CSPRNG (``SeedSequence()`` reads :mod:`secrets`)."""
        families = (*PEER_STREAMS, "pairs")
        return cls(entropy={name: _os_entropy() for name in families})

    def generator(self, family: str, key: int) -> np.random.Generator:
        """The generator ``key`` (a peer, or an edge for ``"pairs"``) of ``family``."""
        if family not in self.entropy:
            raise KeyError(f"no {family!r} stream in this run's seeds")
        return np.random.default_rng(
            np.random.SeedSequence(list(self.entropy[family]), spawn_key=(int(key),))
        )

    def peer(self, peer: int) -> PeerStreams:
        """Peer ``peer``'s generators (each created on first use)."""
        return PeerStreams(self, peer)


def _os_entropy() -> tuple[int, ...]:
    root = np.random.SeedSequence()
    return tuple(int(v) for v in root.generate_state(4, np.uint64) >> np.uint64(1))


@dataclass(slots=True)
class PairStream:
    """One end's view of an overlay edge's correlated noise (D-PSGD's pair secret).

    The stream gives one ``standard_normal(d)`` draw per round (round ``r``: its ``r``-th
    draw), whichever end asks and whether or not it steps: an end that skipped rounds
    discards their draws, so both ends always use the same draw for the same round.

    Attributes
    ----------
    edge : int
        Index in :func:`~p2pdp.protocols.correlated_dp.edge_pairs` order.
    sign : float
        ``+1`` at the smaller end, ``-1`` at the other.
    std : float
        ``z_p C / min(m_a, m_b)``: the term's standard deviation in the step's gradient.
    rng : numpy.random.Generator
        The pair's stream.
    drawn : int
        Rounds drawn so far.
    """

    edge: int
    sign: float
    std: float
    rng: np.random.Generator
    drawn: int = 0

    def draw(self, round_: int, dim: int) -> np.ndarray:
        """Round ``round_``'s draw (d,), times ``std`` (earlier undrawn rounds discarded)."""
        while self.drawn < round_ - 1:
            self.rng.standard_normal(dim)
            self.drawn += 1
        self.drawn = round_
        return self.rng.standard_normal(dim) * self.std


class PairTerm(Protocol):
    """What a machine reads of one of its pair streams (:class:`PairStream`, or one drawn
    from a secret agreed over the wire: :class:`p2pdp.net.pair_keys.KeyedPairStream`)."""

    @property
    def sign(self) -> float: ...

    def draw(self, round_: int, dim: int) -> np.ndarray: ...


def pair_ends(
    peer: int, edges: np.ndarray, denominators: np.ndarray, scale: float
) -> list[tuple[int, float, float]]:
    """Peer ``peer``'s ends of the overlay's pairs: ``(edge, sign, std)`` in the order the
    batched protocol adds them (as the smaller end, then as the other, each by edge index),
    ``sign`` ``+1`` at the smaller end, ``std = scale / min(m_a, m_b)`` (``scale = z_p C``).

    Parameters
    ----------
    edges : (U, 2) int array
        :func:`~p2pdp.protocols.correlated_dp.edge_pairs` of the overlay.
    denominators : (P,) array
        Public step denominators (at least of ``peer`` and its neighbours).
    """
    ends = []
    for column, sign in ((0, 1.0), (1, -1.0)):
        for e in np.flatnonzero(edges[:, column] == peer).tolist():
            m_e = min(denominators[edges[e, 0]], denominators[edges[e, 1]])
            ends.append((int(e), sign, float(scale / m_e)))
    return ends
