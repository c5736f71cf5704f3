"""Iterative decentralized learning with local DP: D-PSGD, Muffliato, gossip learning.

Every peer ``i`` holds a model ``w_i`` (zeros at the start) and minimises its own
L2-regularised logistic loss ``f_i(w) = mean_r log(1 + exp(-y_r x_r.w)) + lam/2 ||w||^2``
over its shard; averaging with neighbours pulls the models towards the minimiser of the mean
of the ``f_i`` (the centralised model, for equal shards). One **private step** of peer ``i``:

``w_i <- w_i - step_size * ((sum_r clip_C(grad_r) + N(0, (z C)^2 I)) / m_i + lam w_i)``

over the records its sampling picks, ``m_i`` a denominator public under the step's relation
(:class:`~p2pdp.privacy.clipped_gaussian.ClippedGaussianSum`). The regulariser's gradient uses
no data. Everything a peer sends afterwards (its model, averages with received models) is
post-processing of its noisy steps and of what it received, so the peer's local DP is the
composition of its steps: the accountant turns the number of steps a peer took into its
``epsilon_spent``; a peer that cannot afford one more step stops stepping and only averages.

Released to: each overlay neighbour (``dpsgd``, ``muffliato``: every message of a round;
``gossip-learning``: the neighbour the model is sent to).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from p2pdp.core import components
from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import Read, When
from p2pdp.learning.local_problem import LocalProblem
from p2pdp.privacy.accountants import composed
from p2pdp.privacy.accounting import affordable, make_accountant
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum, calibrated_noise_multiplier
from p2pdp.privacy.events import PrivacyEvent
from p2pdp.protocols.correlated_dp import edge_pairs
from p2pdp.protocols.iterative_ledger import IterativeLedger
from p2pdp.protocols.iterative_peer import IterativePeer, make_peer, private_step
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.peer_streams import PeerStreams, StreamSeeds
from p2pdp.protocols.settings import MAX_EXCHANGES, ProtocolConfig, RunSettings

__all__ = [
    "DecentralizedSGD",
    "GossipLearning",
    "IterativeProtocol",
    "Muffliato",
    "StepPrivacy",
    "applied_pair_noise",
    "central_dp_reference",
    "step_privacy",
    "threat_model_privacy",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPrivacy:
    """The private step of a run and what the budget affords.

    ``max_steps`` is ``None`` for non-private steps (no budget to spend).
    """

    mechanism: ClippedGaussianSum
    event: PrivacyEvent
    accountant: str
    max_steps: int | None
    delta_total: float
    #: Epsilon by number of steps, as the accountant stated it (asked once per count: the
    #: driver asks every round).
    _known: dict[int, float] = field(default_factory=dict, compare=False, repr=False)

    def epsilon(self, steps: np.ndarray) -> np.ndarray:
        """Local DP epsilon (at ``delta_total``) of peers that took ``steps`` steps."""
        steps = np.asarray(steps, dtype=np.int64)
        if not self.mechanism.private:
            return np.where(steps == 0, 0.0, np.inf)
        unique, inverse = np.unique(steps, return_inverse=True)
        new = np.array([k for k in unique.tolist() if k not in self._known], dtype=np.int64)
        if new.size:
            account = make_accountant(self.accountant)
            values = composed(account, self.event, new, delta_total=self.delta_total)
            self._known.update(zip(new.tolist(), values.tolist(), strict=True))
        known = np.array([self._known[k] for k in unique.tolist()])
        return known[inverse].reshape(steps.shape)


def step_privacy(config: RunSettings) -> StepPrivacy:
    """The step mechanism of ``config``: noise calibrated to the budget unless given.

    ``privacy.accountant = "auto"``: ``gdp`` (exact) for full and fixed sampling, ``pld`` for
    Poisson sampling (exact up to its grid; it accounts the amplification by sampling).
    """
    settings, privacy = config.protocol, config.privacy
    private = settings.private(privacy)
    mechanism = ClippedGaussianSum(
        clip_norm=settings.clip_norm,
        noise_multiplier=(settings.noise_multiplier or 0.0) if private else 0.0,
        sampling=settings.sampling,
        sampling_rate=settings.sampling_rate,
        batch_size=settings.batch_size,
        min_shard_size=privacy.min_shard_size,
    )
    accountant = settings.accountant(privacy)
    if private and settings.noise_multiplier is None:
        z = calibrated_noise_multiplier(
            mechanism,
            steps=settings.rounds,
            epsilon_total=privacy.epsilon,
            delta_total=privacy.delta,
            accountant=accountant,
        )
        mechanism = dataclasses.replace(mechanism, noise_multiplier=z)
    delta_step = privacy.delta / settings.rounds if privacy.delta > 0 else 0.0
    # no peer steps more often in one cell (a synchronous protocol: once a round), so the
    # budget's count stops there (a search far beyond is slow under PLD, and pointless)
    protocol = components.resolve("protocol", settings.name, key="protocol.name")
    most_steps = settings.rounds if getattr(protocol, "synchronous", False) else MAX_EXCHANGES
    event = mechanism.event(delta_step)
    max_steps = None
    if mechanism.private:
        account = make_accountant(accountant)
        account.check(event)
        calibrated = settings.noise_multiplier is None
        for _ in range(60):  # a calibration at the budget's very edge may afford one step less
            max_steps = affordable(
                account,
                event,
                epsilon_total=privacy.epsilon,
                delta_total=privacy.delta,
                at_most=most_steps,
            )
            if not calibrated or max_steps >= settings.rounds:
                break
            z = mechanism.noise_multiplier * (1 + 1e-6)
            mechanism = dataclasses.replace(mechanism, noise_multiplier=z)
            event = mechanism.event(delta_step)
    result = StepPrivacy(
        mechanism=mechanism,
        event=event,
        accountant=accountant,
        max_steps=max_steps,
        delta_total=privacy.delta,
    )
    if max_steps == 0:  # no peer could take one step: refuse before the run
        try:
            one = f"epsilon = {float(result.epsilon(np.array([1]))[0]):.4g}"
        except ConfigError as exc:
            one = f"more than can be accounted ({exc})"
        raise ConfigError(
            f"privacy.epsilon = {privacy.epsilon!r} (at privacy.delta = {privacy.delta!r}) "
            f"affords no step at protocol.noise_multiplier = {settings.noise_multiplier!r}: one "
            f"step costs {one}; raise privacy.epsilon to at least that, or the noise "
            "multiplier (unset, it is calibrated so that protocol.rounds steps fit the budget)"
        )
    return result


def threat_model_privacy(
    config: RunSettings, privacy: StepPrivacy, mixing: Mixing, sizes: np.ndarray
) -> StepPrivacy:
    """``privacy`` with the noise multiplier calibrated to ``protocol.threat_model``.

    ``"local"``: ``privacy`` unchanged. Otherwise ``z`` spends exactly ``privacy.epsilon`` at
    ``privacy.delta`` against the worst target under that threat model, on the run in which
    every peer steps every round and every message arrives
    (:func:`~p2pdp.protocols.correlated_dp.threat_calibration`, ``z_p = ratio z``, ``ratio``
    = ``protocol.pairwise_noise_multiplier``); every peer may take every round's step (the
    budget is the threat model's, not local DP's; ``epsilon_spent`` still reports local DP).
    A run that then loses a message, or has churn, no longer matches the calibration: refused
    (churn, loss before the run; the driver's trace is checked after it).

    Parameters
    ----------
    config : RunSettings
        The run's :class:`~p2pdp.config.ScenarioConfig`.
    privacy : StepPrivacy
        The local-DP step (:func:`step_privacy`): its sampling and clipping are kept.
    mixing : Mixing
        The overlay's weights.
    sizes : (P,) int array
        Shard sizes (the step denominators).
    """
    from p2pdp.protocols import correlated_dp

    settings = config.protocol
    if settings.threat_model == "local":
        return privacy
    mechanism = privacy.mechanism
    if mechanism.sampling == "poisson" or config.gossip.churn or config.network.loss > 0:
        raise ConfigError(
            f"protocol.threat_model = {settings.threat_model!r} is calibrated on a run in which "
            "every peer steps and every message arrives: it needs full or fixed sampling, "
            "gossip.churn = false and network.loss = 0"
        )
    z = correlated_dp.threat_calibration(
        mixing,
        rounds=settings.rounds,
        scales=settings.step_size / mechanism.denominators(sizes),
        decay=1.0 - settings.step_size * config.training.lam,
        ratio=settings.pairwise_noise_multiplier,
        threat=settings.threat_model.replace("-", "_"),
        epsilon=config.privacy.epsilon,
        delta=config.privacy.delta,
        sensitivity_over_clip=mechanism.sensitivity / mechanism.clip_norm,
    )
    mechanism = dataclasses.replace(mechanism, noise_multiplier=z)
    delta_step = config.privacy.delta / settings.rounds
    return StepPrivacy(
        mechanism=mechanism,
        event=mechanism.event(delta_step),
        accountant=privacy.accountant,
        max_steps=settings.rounds,
        delta_total=privacy.delta_total,
    )


def central_dp_reference(
    problem: LocalProblem,
    settings: ProtocolConfig,
    privacy: StepPrivacy,
    *,
    rng: np.random.Generator,
) -> tuple[np.ndarray, float]:
    """Central DP-SGD on the pooled training rows: where a trusted curator would be.

    A reference only: it needs a **trusted curator** holding every peer's rows. The curator
    runs ``protocol.rounds`` private steps of :meth:`IterativePeer.step
    <p2pdp.protocols.iterative_peer.IterativePeer.step>` (a peer's own code)
    on one shard of all ``N`` rows, from zeros, at the peers' ``step_size``, lambda and clip
    norm, with ``privacy``'s mechanism: the same sampling and noise multiplier ``z``. Every
    record is in one shard of the run and in the pooled shard alike, so a record's privacy
    loss is the same event composed ``rounds`` times, under the same neighbouring relation
    (replace-one for full and fixed sampling, add/remove for Poisson): the curator's epsilon
    is ``privacy.epsilon([rounds])``, the peers' local DP budget. Only difference: the
    divisor is the pooled one (``N``, ``min(batch_size, N)``; for Poisson
    ``q * P * min_shard_size``, a public lower bound on ``N`` under add/remove), so the noise
    per row is ``~P`` times smaller than a peer's. Released to: nobody in the run (the row
    reports its test error).

    Parameters
    ----------
    problem : LocalProblem
        The peers' shards; pooled here.
    settings : ProtocolConfig
        ``rounds`` and ``step_size``.
    privacy : StepPrivacy
        The peers' step mechanism (:func:`step_privacy`), local-DP calibrated.
    rng : numpy.random.Generator
        The curator's sampling and noise (its own stream: the run's draws are unchanged).

    Returns
    -------
    model : (d,) array
        The curator's model after its steps (``rounds``, or fewer if ``privacy`` affords
        fewer, as for the peers).
    epsilon : float
        Its DP epsilon at ``privacy.delta_total``, by ``privacy``'s accountant.
    """
    pooled = LocalProblem(
        X=problem.X,
        y=problem.y,
        indptr=np.array([0, len(problem.y)]),
        lam=problem.lam,
        model=problem.model,
    )
    mechanism = privacy.mechanism
    if mechanism.min_shard_size is not None:
        mechanism = dataclasses.replace(
            mechanism, min_shard_size=mechanism.min_shard_size * problem.n_peers
        )
    private = dataclasses.replace(privacy, mechanism=mechanism)
    curator = make_peer(
        "synchronous",
        0,
        settings=settings,
        privacy=private,
        problem=pooled,
        mixing=Mixing(
            indptr=np.zeros(2, np.int64), indices=np.zeros(0, np.int64), weights=np.zeros(0)
        ),
        denominators=mechanism.denominators(pooled.sizes),
        seeds=StreamSeeds(entropy={}),
        streams=PeerStreams(noise=rng, sampling=rng, gossip=rng),
    )
    for round_ in range(1, settings.rounds + 1):
        curator.step(round_)
    return curator.model, float(private.epsilon(np.array([curator.steps]))[0])


def applied_pair_noise(settings: ProtocolConfig, mechanism: ClippedGaussianSum) -> float:
    """D-PSGD's ``z_p`` as applied: 0 for steps without noise, else
    ``protocol.pairwise_noise_multiplier``, times ``z`` under a threat model (the setting is
    then the ratio ``z_p / z``)."""
    if not mechanism.private:
        return 0.0
    ratio = float(settings.pairwise_noise_multiplier)
    return ratio * mechanism.noise_multiplier if settings.threat_model != "local" else ratio


class IterativeProtocol:
    """Peers that keep a model and update it from their data and what they receive.

    Every peer at once, as arrays: the batched driver (:mod:`p2pdp.sim.iterative`) calls,
    for a synchronous protocol (``synchronous = True``), each round: :meth:`step` (every
    peer's private step), then ``gossip_steps`` times: the transport decides which of the
    messages along the overlay's edges arrive in time, and :meth:`average` merges them. For an
    asynchronous one, each peer's wake-up: :meth:`wake` (who to send the model to) and, on
    arrival, :meth:`receive`. Each peer draws from its own streams (:attr:`peer_streams`),
    as its machine (:meth:`peer`, :mod:`p2pdp.protocols.iterative_peer`) does under the
    per-peer driver. A subclass sets ``name`` and ``synchronous`` (and adds
    ``"protocol.gossip_steps"`` to ``reads`` if it averages more than once a round) and may
    override any of these; one that changes what a peer does must also override :meth:`peer`
    to run under the per-peer driver (:meth:`peer` refuses otherwise).

    State: ``models`` (P, d), ``steps`` (P,) private steps taken, ``ledger`` (the records the
    run's privacy is computed from: :class:`~p2pdp.protocols.iterative_ledger.IterativeLedger`).
    """

    name: ClassVar[str] = "iterative"
    synchronous: ClassVar[bool] = True
    #: Whether rows get the pairwise network DP bound (:mod:`p2pdp.protocols.network_dp`).
    network_dp: ClassVar[bool] = False
    #: The settings it reads (:mod:`p2pdp.core.reads`); ``protocol.gossip_steps`` only if
    #: it averages more than once a round (the scenario refuses it otherwise).
    reads: ClassVar[tuple[Read, ...]] = (
        "protocol.rounds",
        "protocol.round_period",
        "protocol.step_size",
        "protocol.sampling",
        "protocol.clip_norm",
        "protocol.noise_multiplier",
        "protocol.eval_every",
        "privacy.mechanism",
        # a budget only for private steps: 'none' (no noise) spends nothing
        When(
            "privacy.mechanism",
            "none",
            ("privacy.epsilon", "privacy.delta", "privacy.accountant"),
            negate=True,
        ),
        "gossip.overlay",
        "gossip.allow_disconnected",
        "gossip.churn",
        "training.lambda",
    )

    def __init__(
        self,
        settings: ProtocolConfig,
        problem: LocalProblem,
        mixing: Mixing,
        privacy: StepPrivacy,
        *,
        rngs: dict[str, np.random.Generator],
    ) -> None:
        self.settings = settings
        self.problem = problem
        self.mixing = mixing
        self.privacy = privacy
        self.rngs = rngs
        #: Every peer's streams derive from these (:mod:`p2pdp.protocols.iterative_peer`).
        self.seeds = StreamSeeds.from_rngs(rngs)
        self.models = np.zeros((problem.n_peers, problem.X.shape[1]))
        self.steps = np.zeros(problem.n_peers, dtype=np.int64)
        self.round = 0  # synchronous: the round of the last step()
        self.exchange = 0  # synchronous: the next average()'s exchange in the round
        self.ledger = IterativeLedger(mixing, exchanges=self.gossip_steps)
        self._denominators = privacy.mechanism.denominators(problem.sizes)

    @property
    def gossip_steps(self) -> int:
        """Averagings per round (synchronous protocols)."""
        return 1

    @functools.cached_property
    def peer_streams(self) -> list[PeerStreams]:
        """(P,) each peer's own generators, as its machine draws them (:meth:`peer`)."""
        return [self.seeds.peer(peer) for peer in range(self.problem.n_peers)]

    def peer(self, peer: int) -> IterativePeer:
        """Peer ``peer``'s transport-free machine, drawing what this object draws for it
        (:mod:`p2pdp.protocols.iterative_peer`): the per-peer drivers run these.

        Raises
        ------
        ConfigError
            For a subclass that overrides what a peer does (:meth:`step`, :meth:`average`,
            :meth:`wake`, :meth:`receive`, :meth:`pair_terms`) but not this method: its
            machine would run the built-in protocol's steps instead of its own.
        """
        builtin = next(c for c in type(self).__mro__ if c in _BUILTIN)
        if type(self) is not builtin and type(self).peer is IterativeProtocol.peer:
            changed = [
                name
                for name in ("step", "average", "wake", "receive", "pair_terms")
                if getattr(type(self), name) is not getattr(builtin, name)
            ]
            if changed:
                raise ConfigError(
                    f"protocol.name = {self.name!r} overrides {', '.join(changed)} but not "
                    "peer(): the per-peer driver (driver = 'reference') would run "
                    f"{builtin.__name__}'s machine instead; override peer() or use the "
                    "batched driver"
                )
        return make_peer(
            "synchronous" if self.synchronous else "gossip",
            peer,
            settings=self.settings,
            privacy=self.privacy,
            problem=self.problem.shard(peer),
            mixing=self.mixing,
            denominators=self._denominators,
            seeds=self.seeds,
            exchanges=self.gossip_steps,
            pair_noise_multiplier=self.pair_noise_multiplier,
        )

    def step(self, peers: np.ndarray | None = None) -> np.ndarray:
        """One private local step of each of ``peers`` (default: all) that can afford one;
        returns the peers that stepped, (k,) int array.

        Each peer draws its sampling and noise from its own streams (:attr:`peer_streams`),
        as its machine would. Synchronous protocols call it once a round (``round`` counts
        the calls), and it records the steps in :attr:`ledger`.
        """
        if self.synchronous:
            self.round, self.exchange = self.round + 1, 0
        if peers is None:
            peers = np.arange(self.problem.n_peers)
        if self.privacy.max_steps is not None:
            peers = peers[self.steps[peers] < self.privacy.max_steps]
        if not len(peers):
            return peers
        mechanism = self.privacy.mechanism
        streams = self.peer_streams
        chosen = [streams[peer] for peer in peers.tolist()]
        sums = self.problem.clipped_sums(
            self.models, peers, mechanism, [s.sampling for s in chosen]
        )
        dim = sums.shape[1]
        noise = mechanism.noise(sums.shape, [s.noise for s in chosen] if mechanism.private else [])
        self.models[peers] = private_step(
            self.models[peers],
            sums,
            noise,
            self._denominators[peers],
            lam=self.problem.lam,
            step_size=self.settings.step_size,
            pair_terms=self.pair_terms(peers, dim),
        )
        self.steps[peers] += 1
        self.ledger.stepped(self.round, peers)
        return peers

    @property
    def pair_noise_multiplier(self) -> float:
        """``z_p`` of the correlated noise the steps add (0: none; :class:`DecentralizedSGD`)."""
        return 0.0

    def pair_terms(self, peers: np.ndarray, dim: int) -> np.ndarray | float:
        """What ``peers`` add to their step's gradient besides their own noise: 0 here
        (correlated noise: :class:`DecentralizedSGD`)."""
        return 0.0

    def average(self, delivered: np.ndarray, late: np.ndarray | None = None) -> None:
        """Merge an exchange's messages: ``delivered`` (E,) marks the edges whose model
        arrived in time, ``late`` (E,) those read after the deadline (recorded, not averaged)."""
        exchange = self.exchange
        self.exchange += 1
        self.models = self.mixing.average(self.models, delivered)
        self.ledger.exchanged(
            self.round,
            exchange,
            delivered,
            np.zeros_like(delivered) if late is None else late,
        )

    def wake(self, peer: int) -> int | None:
        """The neighbour ``peer`` sends its model to at a wake-up (asynchronous protocols):
        uniform over its overlay neighbours, from its own ``gossip`` stream; None for a peer
        without any."""
        mixing = self.mixing
        start, stop = mixing.indptr[peer], mixing.indptr[peer + 1]
        if stop == start:
            return None
        draw = self.peer_streams[peer].gossip.integers(stop - start)
        return int(mixing.indices[start + draw])

    def receive(self, peer: int, model: np.ndarray) -> None:
        """``peer`` received ``model`` (asynchronous protocols)."""
        raise NotImplementedError(f"{type(self).__name__} is synchronous")


class DecentralizedSGD(IterativeProtocol):
    """D-PSGD: one private step, then one Metropolis-Hastings averaging, per round.

    With ``protocol.pairwise_noise_multiplier = z_p > 0``, correlated noise (DECOR): every
    overlay edge ``e = (a, b)``, ``a < b``, has its own stream (a ``SeedSequence`` seeded from
    the run's ``pairs`` stream, spawned per edge: the pair's shared secret), and in a round
    where an end steps it draws a fresh ``p_e ~ N(0, (z_p C)^2 I)`` (the stream's ``r``-th draw
    in round ``r``) that ``a`` adds to its step's gradient as ``+p_e / m_e`` and ``b`` as
    ``-p_e / m_e``, ``m_e = min(m_a, m_b)`` (public step denominators). Each end adds it when
    it steps: both do in every round of a run without churn. What this changes for privacy,
    per threat model, and what a lost message does: :mod:`p2pdp.protocols.correlated_dp`.
    """

    name: ClassVar[str] = "dpsgd"
    network_dp: ClassVar[bool] = True  # Muffliato's view model with one averaging per round
    reads: ClassVar[tuple[Read, ...]] = (
        *IterativeProtocol.reads,
        When(
            "privacy.mechanism",
            "none",
            ("protocol.pairwise_noise_multiplier", "protocol.threat_model"),
            negate=True,
        ),
    )

    @property
    def pair_noise_multiplier(self) -> float:
        """``z_p`` as applied (0 when there is no pair noise: unset, or steps without noise);
        with ``protocol.threat_model`` the setting is ``z_p / z``."""
        return applied_pair_noise(self.settings, self.privacy.mechanism)

    @functools.cached_property
    def pairs(self) -> np.ndarray:
        """(U, 2) the overlay's edges ``(a, b)``, ``a < b`` (:func:`edge_pairs`)."""
        return edge_pairs(self.mixing)

    @functools.cached_property
    def pair_std(self) -> np.ndarray:
        """(U,) standard deviation of each pair's term in a step's gradient: ``z_p C / m_e``."""
        m = self._denominators
        m_e = np.minimum(m[self.pairs[:, 0]], m[self.pairs[:, 1]])
        return self.pair_noise_multiplier * self.privacy.mechanism.clip_norm / m_e

    @functools.cached_property
    def _pair_streams(self) -> list[np.random.Generator]:
        """One generator per pair, from the run's ``pairs`` stream: edge ``e``'s is
        :meth:`StreamSeeds.generator("pairs", e) <p2pdp.protocols.peer_streams.StreamSeeds>`,
        the stream both of its ends' machines hold."""
        if "pairs" not in self.seeds.entropy:
            raise ConfigError("protocol.pairwise_noise_multiplier needs a 'pairs' stream")
        return [self.seeds.generator("pairs", e) for e in range(len(self.pairs))]

    @functools.cached_property
    def _pair_drawn(self) -> np.ndarray:
        """(U,) rounds drawn so far from each pair's stream."""
        return np.zeros(len(self.pairs), dtype=np.int64)

    def pair_terms(self, peers: np.ndarray, dim: int) -> np.ndarray | float:
        """(k, dim): the pair terms of ``peers`` this round.

        Edge ``e``'s stream gives its ``r``-th draw to round ``r`` (rounds in which neither
        end steps are discarded when an end next steps), and each end that steps adds it with
        its sign (:class:`~p2pdp.protocols.peer_streams.PairStream`, what each end's
        machine does): where both ends step the two terms cancel in the sum of the models;
        an end that steps alone (its neighbour offline, under churn) adds its term uncancelled.
        """
        if self.pair_noise_multiplier == 0:
            return 0.0
        stepping = np.zeros(self.problem.n_peers, dtype=bool)
        stepping[peers] = True
        a, b = self.pairs[:, 0], self.pairs[:, 1]
        active = np.flatnonzero(stepping[a] | stepping[b])
        terms = np.zeros((self.problem.n_peers, dim))
        if active.size:
            streams, drawn = self._pair_streams, self._pair_drawn
            draws = []
            for e in active.tolist():
                for _ in range(self.round - 1 - int(drawn[e])):  # rounds nobody stepped
                    streams[e].standard_normal(dim)
                draws.append(streams[e].standard_normal(dim))
            drawn[active] = self.round
            values = np.stack(draws) * self.pair_std[active, None]
            at_a, at_b = stepping[a[active]], stepping[b[active]]
            np.add.at(terms, a[active][at_a], values[at_a])
            np.add.at(terms, b[active][at_b], -values[at_b])
        return terms[peers]


class Muffliato(IterativeProtocol):
    """Noise-then-gossip: one private step, then ``protocol.gossip_steps`` averagings."""

    name: ClassVar[str] = "muffliato"
    network_dp: ClassVar[bool] = True
    reads: ClassVar[tuple[Read, ...]] = (*IterativeProtocol.reads, "protocol.gossip_steps")

    @property
    def gossip_steps(self) -> int:
        return self.settings.gossip_steps


class GossipLearning(IterativeProtocol):
    """Gossip learning: models random-walk the overlay, merged and updated at each hop.

    Every ``round_period`` (each peer at its own phase) a peer sends its current model to a
    uniformly random overlay neighbour; the receiver replaces its model by the average of the
    two, then takes one private step (while its budget lasts).
    """

    name: ClassVar[str] = "gossip-learning"
    synchronous: ClassVar[bool] = False

    def receive(self, peer: int, model: np.ndarray) -> None:
        self.models[peer] = (self.models[peer] + model) / 2.0
        self.step(np.array([peer]))


#: The built-in protocols, whose machines :meth:`IterativeProtocol.peer` builds.
_BUILTIN = (IterativeProtocol, DecentralizedSGD, Muffliato, GossipLearning)
