"""One peer of an iterative protocol as a transport-free state machine, and its streams.

:mod:`p2pdp.protocols.iterative` holds the whole population in arrays (the fast path of the
simulator); this module is what **one** peer runs alone: given ``(now, event)`` it updates
its own model and returns *effects* (messages to send, a timer to set, records of what it
did). It never touches a socket, a SimPy event or another peer's state, so the same machine
runs under the per-peer SimPy driver (:func:`p2pdp.sim.iterative.run_iterative` with
``driver = "reference"``) and under a network host.

**Streams.** Every peer draws its step's noise, its record sampling and (gossip learning) its
gossip targets from generators of its own; every overlay edge ``e`` (``(a, b)``, ``a < b``,
:func:`~p2pdp.protocols.correlated_dp.edge_pairs` order) has a pair stream shared by its two
ends (D-PSGD's correlated noise). :class:`StreamSeeds` holds one root entropy per family and
derives peer ``i``'s generator as ``SeedSequence(entropy, spawn_key=(i,))`` (what
``SeedSequence(entropy).spawn(P)[i]`` gives): any runtime hosting peer ``i`` draws the same
numbers from the same :class:`StreamSeeds`, and the batched protocol draws each stepping
peer's numbers from the same generators. :meth:`StreamSeeds.from_rngs` takes the run's named
streams (the simulator: ``generator(seed, name, fold, repetition)`` for ``noise``,
``sampling``, ``gossip``, ``pairs``); :meth:`StreamSeeds.fresh` takes the operating system's
CSPRNG (a network run without seeded noise: one host's own peers; an edge's pair stream then
comes from a secret its two ends agree over the wire: :mod:`p2pdp.net.pair_keys`).

**Building a machine.** :func:`make_peer` (the simulator calls it through
:meth:`IterativeProtocol.peer <p2pdp.protocols.iterative.IterativeProtocol.peer>`)::

    make_peer(kind, peer, settings=config.protocol, privacy=step_privacy_of_the_run,
              problem=LocalProblem holding only this peer's shard, mixing=the overlay's
              Mixing, denominators=(P,) public step denominators, seeds=StreamSeeds,
              pair_noise_multiplier=z_p as applied)

``kind`` is ``"synchronous"`` (``dpsgd``, ``muffliato``; ``exchanges`` =
``protocol.gossip_steps`` for Muffliato, 1 for D-PSGD) or ``"gossip"`` (``gossip-learning``).
Everything besides ``problem`` is public (the overlay, the step denominators, the settings).

**Events and effects** (a driver calls these in time order; ``now`` in seconds, any clock):

:class:`SynchronousPeer` (``dpsgd``, ``muffliato``), ``K = exchanges`` per round:

* ``on_round(now, round)`` (rounds ``1 .. protocol.rounds``, each at its start, only while
  the peer is online): its private step if its budget affords one (effect :class:`Stepped`),
  then exchange 0's sends (one :class:`Send` of its model to each neighbour) and a
  :class:`Deadline` at ``now + round_period / K`` (the exchange's deadline).
* ``on_message(now, sender, round, exchange, model)``: buffered (no effect) only if
  ``sender`` is a neighbour, ``(round, exchange)`` is the current exchange and still open,
  the sender has not already sent for it and ``model`` is a finite ``(d,)`` array. A message
  for a past exchange is **late**: read, not averaged (effect :class:`Late`, once per sender
  and exchange). Everything else (not a neighbour, a future or unknown exchange, a duplicate,
  a bad payload) is refused: no effect, counted in ``refused[reason]``.
* ``on_deadline(now)``: the peer averages its model with what arrived, by its own
  Metropolis-Hastings row ``x_i + sum_{j arrived} W_ij (x_j - x_i)`` (the weight of a missing
  neighbour stays on its own model; effect :class:`Averaged`), then sends exchange ``k + 1``
  with a new timer, or, after exchange ``K - 1``, returns :class:`RoundEnd`.

A peer offline for a round (churn, a dead host) gets none of these; its next ``on_round``
starts afresh.

:class:`GossipPeer` (``gossip-learning``, asynchronous):

* ``on_wake(now)`` (every ``round_period``, at the peer's own phase, while online): one
  :class:`Send` of its model to a neighbour drawn from its own ``gossip`` stream (``round``
  is the wake-up's number, ``exchange`` 0); nothing for a peer without neighbours.
* ``on_message(now, sender, round, exchange, model)``: accepted once per ``(sender, round)``
  from a neighbour: the model becomes the average of the two, then a private step while the
  budget lasts (effects :class:`Received`, then :class:`Stepped`); refused otherwise.

**State a driver may read** (never write): ``model`` (d,), ``steps``, ``round``,
``refused`` (a ``Counter`` of refused messages by reason). A :class:`Send`'s ``model`` is one
copy shared by that instant's sends: receivers only read it (a network driver serialises it).

**Records.** The driver passes every effect that is a record (:class:`Stepped`,
:class:`Averaged`, :class:`Late`, :class:`Received`) to an :class:`IterativeLedger`, the one
place a run's privacy comes from on every runtime: ``ledger.steps`` (P,) (local DP:
:meth:`StepPrivacy.epsilon <p2pdp.protocols.iterative.StepPrivacy.epsilon>` of it),
``ledger.averaged`` (messages averaged: ``messages sent - averaged`` are the lost and late
ones) and :meth:`IterativeLedger.trace` (the :class:`~p2pdp.protocols.network_dp.ViewTrace`
of network DP and correlated noise: every round's stepping peers, every exchange's averaged
and late messages).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
import scipy.sparse as sp
from scipy.special import expit

from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.protocols.correlated_dp import edge_pairs
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.network_dp import ViewTrace
from p2pdp.protocols.settings import ProtocolConfig

__all__ = [
    "Averaged",
    "Deadline",
    "GossipPeer",
    "IterativeLedger",
    "IterativePeer",
    "Late",
    "LocalProblem",
    "PairStream",
    "PairTerm",
    "PeerStreams",
    "Received",
    "RoundEnd",
    "Send",
    "Stepped",
    "StreamSeeds",
    "SynchronousPeer",
    "make_peer",
    "pair_ends",
    "private_step",
]

#: Stream families a peer draws from (the run's named streams of the same names).
PEER_STREAMS = ("noise", "sampling", "gossip")

#: How many past exchanges (synchronous) or wake-ups (gossip) per sender a peer remembers to
#: refuse duplicates; an older message is refused as ``"stale"`` (bounds the memory).
SEEN_WINDOW = 1024


# --------------------------------------------------------------------------------- shards


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalProblem:
    """Every peer's shard, stored peer by peer, for L2-regularised logistic regression.

    Attributes
    ----------
    X : (N, d) array
        Training rows; peer ``j`` holds rows ``indptr[j]:indptr[j + 1]``.
    y : (N,) array of -1.0 / +1.0
    indptr : (P + 1,) int64 array
    lam : float
        The L2 regularisation ``lambda``.
    """

    X: np.ndarray
    y: np.ndarray
    indptr: np.ndarray
    lam: float

    @classmethod
    def from_shards(
        cls, X: np.ndarray, y: np.ndarray, shards: tuple[np.ndarray, ...], lam: float
    ) -> LocalProblem:
        """Rows of ``X``, ``y`` regrouped so that each shard's rows are contiguous."""
        order = np.concatenate(shards)
        sizes = np.array([len(shard) for shard in shards], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(sizes)])
        return cls(X=X[order], y=np.asarray(y, float)[order], indptr=indptr, lam=lam)

    @property
    def n_peers(self) -> int:
        return len(self.indptr) - 1

    @property
    def sizes(self) -> np.ndarray:
        """Shard sizes, (P,)."""
        return np.diff(self.indptr)

    def shard(self, peer: int) -> LocalProblem:
        """Peer ``peer``'s shard alone (views, no copy): what its machine holds."""
        start, stop = int(self.indptr[peer]), int(self.indptr[peer + 1])
        return LocalProblem(
            X=self.X[start:stop],
            y=self.y[start:stop],
            indptr=np.array([0, stop - start], dtype=np.int64),
            lam=self.lam,
        )

    def clipped_sums(
        self,
        models: np.ndarray,
        peers: np.ndarray,
        mechanism: ClippedGaussianSum,
        rng: np.random.Generator | Sequence[np.random.Generator],
    ) -> np.ndarray:
        """Each of ``peers``' sum of clipped per-record loss gradients at its model.

        Parameters
        ----------
        models : (P, d) array
        peers : (m,) int array, distinct, increasing
        mechanism : ClippedGaussianSum
            Clipping norm and the sampling of records.
        rng : numpy.random.Generator, or one per entry of ``peers``
            The sampling's uniforms (:meth:`ClippedGaussianSum.select`): each peer's own
            stream when given one per peer.

        Returns
        -------
        (m, d) array: ``sum_r clip(grad_r)`` over the sampled records of each peer; the
        gradient of ``log(1 + exp(-y x.w))`` is ``-y sigmoid(-y x.w) x``.
        """
        if len(peers) == self.n_peers:
            rows: slice | np.ndarray = slice(None)
            indptr = self.indptr
        elif len(peers) == 1:  # one peer (gossip learning): its rows are one slice
            start, stop = self.indptr[peers[0]], self.indptr[peers[0] + 1]
            rows, indptr = slice(start, stop), np.array([0, stop - start])
        else:
            sizes = self.sizes[peers]
            indptr = np.concatenate([[0], np.cumsum(sizes)])
            rows = np.repeat(self.indptr[peers] - indptr[:-1], sizes) + np.arange(indptr[-1])
        X, y = self.X[rows], self.y[rows]
        owner = np.repeat(np.arange(len(peers)), np.diff(indptr))
        margins = y * np.einsum("ij,ij->i", X, models[peers][owner])
        coefficients = -y * expit(-margins)
        norms = np.abs(coefficients) * np.linalg.norm(X, axis=1)
        coefficients *= mechanism.clip_factors(norms) * mechanism.select(indptr, rng)
        if len(peers) == 1:
            return (coefficients @ X)[None, :]
        weights = sp.csr_array(
            (coefficients, np.arange(len(coefficients)), indptr), shape=(len(peers), len(y))
        )
        return np.asarray(weights @ X)


# --------------------------------------------------------------------------------- streams


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


# --------------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``model`` (d,) to peer ``to``, labelled with the sender's ``(round, exchange)``."""

    to: int
    round: int
    exchange: int
    model: np.ndarray


@dataclass(frozen=True, slots=True)
class Deadline:
    """Call ``on_deadline`` at time ``at`` (the deadline of ``(round, exchange)``)."""

    at: float
    round: int
    exchange: int


@dataclass(frozen=True, slots=True)
class Stepped:
    """Record: ``peer`` took a private step (its ``steps``-th) in ``round``."""

    peer: int
    round: int
    steps: int


@dataclass(frozen=True, slots=True)
class Averaged:
    """Record: ``peer`` averaged the models of ``senders`` (in its row's order) at the end
    of ``(round, exchange)``."""

    peer: int
    round: int
    exchange: int
    senders: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Late:
    """Record: ``peer`` read ``sender``'s model of ``(round, exchange)`` after its deadline
    (not averaged; it is in ``peer``'s view all the same)."""

    peer: int
    sender: int
    round: int
    exchange: int


@dataclass(frozen=True, slots=True)
class Received:
    """Record: ``peer`` merged ``sender``'s model (gossip learning)."""

    peer: int
    sender: int
    round: int


@dataclass(frozen=True, slots=True)
class RoundEnd:
    """``peer`` finished ``round`` (its last exchange's deadline passed)."""

    peer: int
    round: int


Effect = Send | Deadline | Stepped | Averaged | Late | Received | RoundEnd

#: The first name of :class:`Deadline`, kept for drivers written against it (not documented
#: under this name: :mod:`p2pdp.protocols.oneshot` has a ``Timer`` of its own).
Timer = Deadline


# --------------------------------------------------------------------------------- machines


class Budget(Protocol):
    """What a machine reads of the run's step privacy
    (:class:`~p2pdp.protocols.iterative.StepPrivacy`)."""

    @property
    def mechanism(self) -> ClippedGaussianSum: ...

    @property
    def max_steps(self) -> int | None: ...


def private_step(
    models: np.ndarray,
    sums: np.ndarray,
    noise: np.ndarray,
    denominators: np.ndarray,
    *,
    lam: float,
    step_size: float,
    pair_terms: np.ndarray | float = 0.0,
) -> np.ndarray:
    """``w - step_size * ((sum + noise) / m + lam w + pair_terms)``, row by row.

    Parameters
    ----------
    models, sums, noise : (k, d) arrays
        The stepping peers' models, clipped gradient sums and Gaussian noise.
    denominators : (k,) array
        Their public step denominators ``m``.
    pair_terms : (k, d) array or 0.0
        Correlated noise terms (already divided by ``m_e``).

    Returns
    -------
    (k, d) array: the models after the step (the one formula of every runtime).
    """
    gradient = (sums + noise) / denominators[:, None] + lam * models
    gradient += pair_terms
    return models - step_size * gradient


class IterativePeer:
    """One peer: its model, its steps, its neighbours and Metropolis-Hastings row, its shard
    and its streams. Subclasses add the events (:class:`SynchronousPeer`,
    :class:`GossipPeer`).

    Parameters
    ----------
    peer : int
        Its id (the overlay's numbering).
    settings : ProtocolConfig
    privacy : StepPrivacy
        The run's step mechanism and budget (:func:`~p2pdp.protocols.iterative.step_privacy`).
    problem : LocalProblem
        Its own shard only (``n_peers == 1``).
    neighbours, weights : (k,) arrays
        Its overlay neighbours and their weights ``W[peer, j]`` (its row of ``Mixing``).
    denominator : float
        Its public step denominator ``m``.
    streams : PeerStreams
    pairs : list of PairTerm
        Its edges' correlated noise (empty: none), in the order the terms are added
        (:func:`pair_ends`).
    """

    def __init__(
        self,
        peer: int,
        *,
        settings: ProtocolConfig,
        privacy: Budget,
        problem: LocalProblem,
        neighbours: np.ndarray,
        weights: np.ndarray,
        denominator: float,
        streams: PeerStreams,
        pairs: Sequence[PairTerm] = (),
    ) -> None:
        if problem.n_peers != 1:
            raise ValueError(f"a peer's problem holds one shard, got {problem.n_peers}")
        self.peer = int(peer)
        self.settings = settings
        self.privacy = privacy
        self.problem = problem
        self.neighbours = np.asarray(neighbours, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=float)
        self._slot = {int(j): k for k, j in enumerate(self.neighbours.tolist())}
        self.denominator = np.array([float(denominator)])
        self.streams = streams
        self.pairs = list(pairs)
        self.dim = int(problem.X.shape[1])
        self.model = np.zeros(self.dim)
        self.steps = 0
        #: Messages refused, by reason ("not a neighbour", "duplicate", "early", ...).
        self.refused: Counter[str] = Counter()

    def step(self, round_: int) -> Stepped | None:
        """Its private step in ``round_`` if its budget affords one."""
        max_steps = self.privacy.max_steps
        if max_steps is not None and self.steps >= max_steps:
            return None
        mechanism = self.privacy.mechanism
        models = self.model[None, :]
        sums = self.problem.clipped_sums(models, _ONE, mechanism, self.streams.sampling)
        noise = mechanism.noise((1, self.dim), [self.streams.noise] if mechanism.private else [])
        pair: np.ndarray | float = 0.0
        if self.pairs:
            terms = np.zeros(self.dim)
            for stream in self.pairs:
                terms += stream.sign * stream.draw(round_, self.dim)
            pair = terms[None, :]
        self.model = private_step(
            models,
            sums,
            noise,
            self.denominator,
            lam=self.problem.lam,
            step_size=self.settings.step_size,
            pair_terms=pair,
        )[0]
        self.steps += 1
        return Stepped(self.peer, round_, self.steps)

    def _valid(self, model: object) -> bool:
        return (
            isinstance(model, np.ndarray)
            and model.shape == (self.dim,)
            and bool(np.isfinite(model).all())
        )

    def _send_all(self, round_: int, exchange: int) -> list[Effect]:
        model = self.model.copy()  # one copy shared by the sends: receivers only read it
        return [Send(int(j), round_, exchange, model) for j in self.neighbours.tolist()]


_ONE = np.zeros(1, dtype=np.int64)


class _Seen:
    """Keys ``(sender, index)`` already accepted, the last :data:`SEEN_WINDOW` per sender."""

    def __init__(self) -> None:
        self._keys: dict[int, set[int]] = {}
        self._order: dict[int, deque[int]] = {}
        self.newest: dict[int, int] = {}

    def add(self, sender: int, index: int) -> str | None:
        """Remember ``index`` from ``sender``; the refusal reason if it cannot be accepted."""
        keys = self._keys.setdefault(sender, set())
        if index in keys:
            return "duplicate"
        if index <= self.newest.get(sender, -1) - SEEN_WINDOW:
            return "stale"
        keys.add(index)
        order = self._order.setdefault(sender, deque())
        order.append(index)
        self.newest[sender] = max(self.newest.get(sender, -1), index)
        while len(order) > SEEN_WINDOW:
            keys.discard(order.popleft())
        return None


class SynchronousPeer(IterativePeer):
    """D-PSGD and Muffliato: a private step per round, then ``exchanges`` averagings.

    State: ``round`` (0 before the first), ``exchange`` (the open one; ``exchanges`` once
    the round ended), the models buffered for it (at most one per neighbour).
    """

    def __init__(self, peer: int, *, exchanges: int, **kwargs: object) -> None:
        super().__init__(peer, **kwargs)  # type: ignore[arg-type]
        self.exchanges = int(exchanges)
        self.period = self.settings.round_period / self.exchanges
        self.round = 0
        self.exchange = self.exchanges
        self._buffer: dict[int, np.ndarray] = {}
        self._seen = _Seen()  # (sender, exchange index) of every model accepted

    def _index(self, round_: int, exchange: int) -> int:
        return (round_ - 1) * self.exchanges + exchange

    def on_round(self, now: float, round_: int) -> list[Effect]:
        """Round ``round_`` starts: its step, exchange 0's sends and deadline."""
        if not 1 <= round_ <= self.settings.rounds or round_ <= self.round:
            raise ValueError(f"peer {self.peer}: round {round_} after round {self.round}")
        self.round, self.exchange = round_, 0
        self._buffer.clear()
        effects: list[Effect] = []
        stepped = self.step(round_)
        if stepped is not None:
            effects.append(stepped)
        effects += self._send_all(round_, 0)
        effects.append(Deadline(now + self.period, round_, 0))
        return effects

    def on_message(
        self, now: float, sender: int, round_: int, exchange: int, model: np.ndarray
    ) -> list[Effect]:
        """A neighbour's model of ``(round_, exchange)``: buffered, read late, or refused."""
        if sender not in self._slot:
            self.refused["not a neighbour"] += 1
            return []
        if not (1 <= round_ <= self.settings.rounds and 0 <= exchange < self.exchanges):
            self.refused["no such exchange"] += 1
            return []
        if not self._valid(model):
            self.refused["bad payload"] += 1
            return []
        key, current = (round_, exchange), (self.round, self.exchange)
        if key > current or (key == current and self.round == 0):
            self.refused["early"] += 1
            return []
        reason = self._seen.add(sender, self._index(round_, exchange))
        if reason is not None:
            self.refused[reason] += 1
            return []
        if key == current:
            self._buffer[sender] = model
            return []
        return [Late(self.peer, sender, round_, exchange)]

    def on_deadline(self, now: float) -> list[Effect]:
        """The open exchange's deadline: average by its own row, then the next exchange."""
        if self.exchange >= self.exchanges:
            raise ValueError(f"peer {self.peer}: no exchange open in round {self.round}")
        slots = sorted(self._slot[j] for j in self._buffer)
        senders = tuple(int(self.neighbours[k]) for k in slots)
        if slots:
            weights = self.weights[slots]
            received = np.stack([self._buffer[j] for j in senders])
            self.model = self.model + weights @ received - weights.sum() * self.model
        self._buffer.clear()
        effects: list[Effect] = [Averaged(self.peer, self.round, self.exchange, senders)]
        self.exchange += 1
        if self.exchange < self.exchanges:
            effects += self._send_all(self.round, self.exchange)
            effects.append(Deadline(now + self.period, self.round, self.exchange))
        else:
            effects.append(RoundEnd(self.peer, self.round))
        return effects


class GossipPeer(IterativePeer):
    """Gossip learning: at each wake-up, its model to a random neighbour; on arrival, the
    receiver averages the two and steps. ``round`` counts its wake-ups."""

    def __init__(self, peer: int, **kwargs: object) -> None:
        super().__init__(peer, **kwargs)  # type: ignore[arg-type]
        self.round = 0
        self._seen = _Seen()

    def on_wake(self, now: float) -> list[Effect]:
        """Its wake-up: one :class:`Send` to a neighbour from its own gossip stream."""
        self.round += 1
        if not self.neighbours.size:
            return []
        target = self.neighbours[self.streams.gossip.integers(self.neighbours.size)]
        return [Send(int(target), self.round, 0, self.model.copy())]

    def on_message(
        self, now: float, sender: int, round_: int, exchange: int, model: np.ndarray
    ) -> list[Effect]:
        """A neighbour's model: merged (average of the two), then a private step."""
        if sender not in self._slot:
            self.refused["not a neighbour"] += 1
            return []
        if round_ < 1 or exchange != 0:
            self.refused["no such exchange"] += 1
            return []
        if not self._valid(model):
            self.refused["bad payload"] += 1
            return []
        reason = self._seen.add(sender, round_)
        if reason is not None:
            self.refused[reason] += 1
            return []
        self.model = (self.model + model) / 2.0
        effects: list[Effect] = [Received(self.peer, sender, round_)]
        stepped = self.step(self.steps + 1)
        if stepped is not None:
            effects.append(stepped)
        return effects


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


def make_peer(
    kind: Literal["synchronous", "gossip"],
    peer: int,
    *,
    settings: ProtocolConfig,
    privacy: Budget,
    problem: LocalProblem,
    mixing: Mixing,
    denominators: np.ndarray,
    seeds: StreamSeeds,
    exchanges: int = 1,
    pair_noise_multiplier: float = 0.0,
    streams: PeerStreams | None = None,
) -> IterativePeer:
    """Peer ``peer``'s machine (see the module docstring).

    Parameters
    ----------
    problem : LocalProblem
        Its own shard only.
    mixing : Mixing
        The overlay's weights (public): its row, and its edges for the pair streams.
    denominators : (P,) array
        Every peer's public step denominator (its own, and ``m_e`` of its edges).
    seeds : StreamSeeds
        Its streams (``streams`` overrides them) and its edges' pair streams.
    pair_noise_multiplier : float
        ``z_p`` as applied (0: no correlated noise).
    """
    start, stop = int(mixing.indptr[peer]), int(mixing.indptr[peer + 1])
    pairs: list[PairTerm] = []
    if pair_noise_multiplier > 0:
        scale = pair_noise_multiplier * privacy.mechanism.clip_norm
        for e, sign, std in pair_ends(peer, edge_pairs(mixing), denominators, scale):
            pairs.append(PairStream(e, sign, std, seeds.generator("pairs", e)))
    common = {
        "settings": settings,
        "privacy": privacy,
        "problem": problem,
        "neighbours": mixing.indices[start:stop],
        "weights": mixing.weights[start:stop],
        "denominator": float(denominators[peer]),
        "streams": streams if streams is not None else seeds.peer(peer),
        "pairs": pairs,
    }
    if kind == "synchronous":
        return SynchronousPeer(peer, exchanges=exchanges, **common)
    if kind == "gossip":
        return GossipPeer(peer, **common)
    raise ValueError(f"kind must be 'synchronous' or 'gossip', got {kind!r}")


# --------------------------------------------------------------------------------- records


class IterativeLedger:
    """A run's records, from the machines' effects or the batched protocol's arrays alike.

    Parameters
    ----------
    mixing : Mixing
        The overlay (edge ``e`` of row ``i`` carries ``indices[e]``'s model to ``i``).
    exchanges : int
        Exchanges per round (synchronous protocols).
    trace : bool
        Keep every step's peers and every exchange's masks (for :meth:`trace`); otherwise
        only the counts.

    Attributes
    ----------
    steps : (P,) int64
        Private steps each peer took: its local DP is ``privacy.epsilon(steps)``.
    averaged : int
        Messages averaged (on time); ``messages sent - averaged`` were lost or late.
    late : int
        Messages read after their deadline.
    """

    def __init__(self, mixing: Mixing, *, exchanges: int = 1, trace: bool = False) -> None:
        self.mixing = mixing
        self.exchanges = exchanges
        self.keep = trace
        self.steps = np.zeros(mixing.n_peers, dtype=np.int64)
        self.averaged = 0
        self.late = 0
        self._stepped: dict[int, list[int]] = {}
        self._delivered: dict[tuple[int, int], np.ndarray] = {}
        self._late: dict[tuple[int, int], np.ndarray] = {}
        self._edge: dict[tuple[int, int], int] | None = None

    def edge(self, receiver: int, sender: int) -> int:
        """The index of the edge carrying ``sender``'s model to ``receiver``."""
        if self._edge is None:
            receivers, senders = self.mixing.receivers.tolist(), self.mixing.indices.tolist()
            self._edge = {
                (r, s): e for e, (r, s) in enumerate(zip(receivers, senders, strict=True))
            }
        return self._edge[(receiver, sender)]

    def _mask(self, store: dict[tuple[int, int], np.ndarray], key: tuple[int, int]) -> np.ndarray:
        if key not in store:
            store[key] = np.zeros(self.mixing.indices.size, dtype=bool)
        return store[key]

    # the batched protocol's records (whole arrays)
    def stepped(self, round_: int, peers: np.ndarray) -> None:
        """``peers`` stepped in ``round_`` (the batched protocol)."""
        self.steps[peers] += 1
        if self.keep:
            self._stepped.setdefault(round_, []).extend(np.asarray(peers).tolist())

    def exchanged(
        self, round_: int, exchange: int, delivered: np.ndarray, late: np.ndarray
    ) -> None:
        """The (E,) masks of the messages of ``(round_, exchange)`` averaged and late."""
        self.averaged += int(np.count_nonzero(delivered))
        self.late += int(np.count_nonzero(late))
        if self.keep:
            self._mask(self._delivered, (round_, exchange))[:] |= delivered
            self._mask(self._late, (round_, exchange))[:] |= late

    # the machines' records (one effect at a time)
    def take(self, effects: Iterable[Effect]) -> None:
        """Record the records among a machine's ``effects`` (others are ignored)."""
        for effect in effects:
            if isinstance(effect, Stepped):
                self.steps[effect.peer] += 1
                if self.keep:
                    self._stepped.setdefault(effect.round, []).append(effect.peer)
            elif isinstance(effect, Averaged):
                self.averaged += len(effect.senders)
                if self.keep:
                    mask = self._mask(self._delivered, (effect.round, effect.exchange))
                    for sender in effect.senders:
                        mask[self.edge(effect.peer, sender)] = True
            elif isinstance(effect, Late):
                self.late += 1
                if self.keep:
                    mask = self._mask(self._late, (effect.round, effect.exchange))
                    mask[self.edge(effect.peer, effect.sender)] = True

    def trace(self, rounds: int) -> ViewTrace:
        """The run as :mod:`p2pdp.protocols.network_dp` reads it: per round, the stepping
        peers (increasing), then each exchange's averaged and late masks."""
        if not self.keep:
            raise ValueError("this ledger keeps no trace (trace=False)")
        trace = ViewTrace()
        empty = np.zeros(self.mixing.indices.size, dtype=bool)
        for round_ in range(1, rounds + 1):
            trace.step(np.sort(np.array(self._stepped.get(round_, []), dtype=np.int64)))
            for exchange in range(self.exchanges):
                key = (round_, exchange)
                trace.exchange(self._delivered.get(key, empty), self._late.get(key, empty))
        return trace
