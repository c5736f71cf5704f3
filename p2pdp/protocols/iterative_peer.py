"""One peer of an iterative protocol as a transport-free state machine, and its streams.

:mod:`p2pdp.protocols.iterative` holds the whole population in arrays (the fast path of the
simulator); this module is what **one** peer runs alone: given ``(now, event)`` it updates
its own model and returns *effects* (messages to send, a timer to set, records of what it
did). It never touches a socket, a SimPy event or another peer's state, so the same machine
runs under the per-peer SimPy driver (:func:`p2pdp.sim.iterative.run_iterative` with
``driver = "reference"``) and under a network host.

**Streams.** Every peer draws its noise, its record sampling and its gossip targets from
generators of its own, and every overlay edge has a pair stream shared by its two ends
(:mod:`p2pdp.protocols.peer_streams`: any runtime hosting a peer draws the same numbers).

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
:class:`Averaged`, :class:`Late`, :class:`Received`) to an
:class:`~p2pdp.protocols.iterative_ledger.IterativeLedger`, the one place a run's privacy
comes from on every runtime.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from p2pdp.learning.local_problem import LocalProblem
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from p2pdp.protocols.correlated_dp import edge_pairs
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.peer_streams import PairStream, PairTerm, PeerStreams, StreamSeeds, pair_ends
from p2pdp.protocols.settings import ProtocolConfig

__all__ = [
    "Averaged",
    "Deadline",
    "GossipPeer",
    "IterativePeer",
    "Late",
    "Received",
    "RoundEnd",
    "Send",
    "Stepped",
    "SynchronousPeer",
    "make_peer",
    "private_step",
]


#: How many past exchanges (synchronous) or wake-ups (gossip) per sender a peer remembers to
#: refuse duplicates; an older message is refused as ``"stale"`` (bounds the memory).
SEEN_WINDOW = 1024


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
