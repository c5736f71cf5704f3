"""Ensemble rules: what each peer classifies with, and what it holds to classify.

:class:`Ensembles` records who holds which model (each peer's own model, every published
model, and which peers received it); :class:`Margins` is what a rule sees for a block of test
rows; :class:`PeerData` is each peer's own shard, for rules that validate on it. The scoring
of a whole test set, shared between peers, is :mod:`p2pdp.learning.evaluation`.

Decision rules (``evaluation.vote``: an :class:`EnsembleRule` component):

``"majority"`` (:class:`MajorityVote`)
    score = (sum of signs of the ensemble's margins) + tanh(sum of margins). The integer vote
    decides; a tie is broken by the summed margin, and an exact zero goes to +1.
``"mean-margin"`` (:class:`MeanMargin`)
    score = sum of margins (the sign of the mean margin).
``"majority-own"`` (:class:`MajorityOwnTie`)
    score = (sum of signs) + tanh(own margin) / 2: as ``majority``, but a tied vote goes to
    the peer's own model (the seed's tie-break by summed margin hands it to the noisiest
    member). Reads: received models, own model.
``"average"`` (:class:`AverageRule`)
    One linear model per peer: its received models averaged with weights ``1/noise_std^2``
    (their public noise variances), shrunk towards the peer's own model by a James-Stein
    factor with a noise test and cap (:func:`p2pdp.learning.ensembles.average_rule`). Reads:
    received
    models, their public noise scales (release records), own model.
``"local-validated"`` (:class:`LocalValidatedRule`)
    As ``average``, but each peer chooses how much to trust the received average by k-fold
    cross validation on its own shard, its own model refitted on each training part
    (:func:`p2pdp.learning.ensembles.local_validated_rule`). Reads: received models, their noise
    scales, own model and own shard; the refits are computed once per training key.

The predicted label is +1 where ``score >= 0`` and -1 elsewhere. The same score is the
continuous output used for the ROC curve.

Why no rule costs privacy: each reads only what a peer holds at the end of a run (the
releases it received with their public records, its own model, its own shard) and the test
rows it classifies; the result is used by that peer alone. That is post-processing of the
releases plus the peer's own data, so the budget and the guarantee are unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from p2pdp.core.boundary import (
    calling,
    check_methods,
    check_numbers,
    problem,
    read_only,
)
from p2pdp.core.errors import ConfigError
from p2pdp.learning.ensembles import (
    CrossValidation,
    OwnShards,
    PublicView,
    average_rule,
    local_validated_rule,
)

if TYPE_CHECKING:  # scipy and scikit-learn are imported where used, not to validate a config
    import scipy.sparse as sp


@dataclass(frozen=True, slots=True, kw_only=True)
class Ensembles:
    """Who holds which model, without materialising P lists.

    Attributes
    ----------
    local_weights : (P, d) array
        Each peer's own unperturbed model (in its own ensemble only).
    published : (K, d) array
        Every published (noisy) model, in publication order.
    shared : (K,) bool array
        True where the model reached every peer (full publication, no churn).
    receipts : (P, K) sparse CSR matrix of 0/1
        Models received by specific peers (group publication, or full publication to the
        peers that were online). Rows of ``shared`` models are not stored here.
    noise_std : (K,) array
        Public per-coordinate noise standard deviation of each published model (from its
        release record); zeros when unknown.
    """

    local_weights: np.ndarray
    published: np.ndarray
    shared: np.ndarray
    receipts: sp.csr_matrix
    noise_std: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def n_peers(self) -> int:
        return int(self.local_weights.shape[0])

    def sizes(self) -> np.ndarray:
        """Number of models in each peer's ensemble, (P,) int (own model included)."""
        per_peer = np.asarray(self.receipts.sum(axis=1)).ravel()
        return 1 + int(self.shared.sum()) + per_peer.astype(np.int64)


def build_ensembles(
    local_weights: np.ndarray,
    published: np.ndarray,
    shared: np.ndarray,
    receipt_peers: np.ndarray,
    receipt_models: np.ndarray,
    noise_std: np.ndarray | None = None,
) -> Ensembles:
    """Assemble :class:`Ensembles` from receipt pairs ``(peer, model index)``."""
    import scipy.sparse as sp

    n_peers, n_models = local_weights.shape[0], published.shape[0]
    data = np.ones(len(receipt_peers), dtype=np.float64)
    receipts = sp.csr_matrix(
        (data, (np.asarray(receipt_peers), np.asarray(receipt_models))),
        shape=(n_peers, n_models),
    )
    receipts.sum_duplicates()
    if receipts.nnz and receipts.data.max() > 1:
        raise ValueError("a peer received the same published model twice")
    return Ensembles(
        local_weights=local_weights,
        published=published.reshape(n_models, local_weights.shape[1]),
        shared=np.asarray(shared, dtype=bool),
        receipts=receipts,
        noise_std=np.zeros(n_models) if noise_std is None else np.asarray(noise_std, float),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Margins:
    """What an ensemble rule sees for a block of test rows (everything a peer may use).

    Attributes
    ----------
    own : (P, n) array
        Margin ``w_j . x`` of each peer's own model on each row.
    published : (K, n) array
        Margin of each published model on each row.
    shared : (K,) float array of 0/1
        1 where the published model reached every peer.
    receipts : (P, K) sparse CSR matrix of 0/1
        Published models received by specific peers.
    noise_std : (K,) array
        Public per-coordinate noise standard deviation of each published model.
    rows : (n, d) array, optional
        The block of test rows themselves (for fitted rules that score with one linear
        model per peer, :class:`LinearRule`).
    """

    own: np.ndarray
    published: np.ndarray
    shared: np.ndarray
    receipts: sp.csr_matrix
    noise_std: np.ndarray
    rows: np.ndarray | None = None

    def held_sum(self, values: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
        """The sum of ``values`` (K, n) over the models each peer holds, plus ``start`` (P, n)
        if given: (P, n), or (1, n) without ``start`` when every model is shared (full
        publication: no (P, n) product of zeros)."""
        held = (self.shared @ values)[None, :]
        if start is not None:
            held = start + held
        if self.receipts.nnz:
            held = held + self.receipts @ values
        return held


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerData:
    """Each peer's own training rows, for rules that validate on them.

    Passed to :meth:`EnsembleRule.fit` when the rule's ``needs_own_data`` is True.

    ``shards``: the rows (each peer reads only its own); ``cv``: the k-fold refits of every
    peer's own model on its own shard (:func:`p2pdp.learning.ensembles.cross_validate_own_models`),
    computed once per training key by the task and shared by every run of that fold.
    """

    shards: OwnShards
    cv: CrossValidation


class EnsembleRule(ABC):
    """The rule a peer classifies with (the ``ensemble`` component kind, ``evaluation.vote``).

    A rule maps :class:`Margins` of a block of test rows to a decision score per row and
    peer, shape (n, P); label +1 where the score is >= 0. It must be vectorised over peers
    (full publication gives every peer the same published models: use
    :meth:`Margins.held_sum` instead of per-peer loops). A rule reads only a peer's own
    model and the published models with their public release records (and, if it says so
    with :attr:`needs_own_data`, the peer's own shard): post-processing, so it costs no
    privacy. Rules are constructed without arguments.

    Optional step :meth:`fit`: called once per run, before any row is scored, with the run's
    :class:`Ensembles` (own models, published models, their public ``noise_std``) and, for
    rules with ``needs_own_data = True``, the peers' :class:`PeerData`; it returns the rule
    that scores the rows (the default returns ``self``). Rules that turn what a peer holds
    into one linear model per peer return a :class:`LinearRule`.
    """

    name: ClassVar[str]
    #: True if :meth:`fit` needs each peer's own shard (:class:`PeerData`).
    needs_own_data: ClassVar[bool] = False

    def fit(self, ensembles: Ensembles, own: PeerData | None = None) -> EnsembleRule:
        """The rule to score this run's rows with (default: ``self``)."""
        return self

    def for_peers(self, peers: slice) -> EnsembleRule:
        """This rule for a subset of peers (:func:`evaluate_ensembles` scores the best peer)."""
        return self

    @abstractmethod
    def scores(self, margins: Margins) -> np.ndarray:
        """Decision scores, shape (n_rows, P)."""


class LinearRule(EnsembleRule):
    """A fitted rule: one linear model per peer, ``weights`` (P, d); score ``x . w_p``."""

    name: ClassVar[str] = "linear"

    def __init__(self, weights: np.ndarray) -> None:
        self.weights = np.asarray(weights, dtype=np.float64)

    def for_peers(self, peers: slice) -> LinearRule:
        return LinearRule(self.weights[peers])

    def scores(self, margins: Margins) -> np.ndarray:
        if margins.rows is None:
            raise ValueError("a LinearRule needs Margins.rows")
        return margins.rows @ self.weights.T


class TallyRule(EnsembleRule):
    """A rule whose score is a function of a peer's own margin and of sums over the published
    models it holds (its own model not included): of their margins (``margin``) and of their
    signs (``votes``), element by element (peer, test row).

    :func:`evaluate_ensembles` scores such a rule without the (K, n) margins of every published
    model in every block of rows when every model is shared (full publication without
    churn): it sums the published models' margins and signs over each test row once, then
    calls :meth:`tally_scores` on tiles of peers x rows (any subset of each: the rule keeps
    no per-peer state and reads nothing across rows). :meth:`scores` of :class:`Margins`
    computes the same sums (:meth:`Margins.held_sum`) and calls :meth:`tally_scores`: one
    formula for both. A subclass that overrides :meth:`~EnsembleRule.fit` or :meth:`scores`
    is scored through :meth:`scores` on blocks of rows instead.

    ``tallies`` names the sums the rule reads, a tuple of ``"margin"`` and ``"votes"``; the
    others are passed as None. Every input is read-only.
    """

    tallies: ClassVar[tuple[str, ...]] = ("margin", "votes")

    @abstractmethod
    def tally_scores(
        self, own: np.ndarray, margin: np.ndarray | None, votes: np.ndarray | None
    ) -> np.ndarray:
        """Scores of ``own``'s shape (p, n) (label +1 where >= 0): ``own`` the p peers' own
        margins on n test rows; ``margin`` and ``votes`` (p, n), or (1, n) when every peer
        holds the same models, the sums over each peer's published models of their margins
        and of their signs (None if not in :attr:`tallies`)."""

    def scores(self, margins: Margins) -> np.ndarray:
        published, tallies = margins.published, self.tallies
        margin = read_only(margins.held_sum(published)) if "margin" in tallies else None
        votes = read_only(margins.held_sum(np.sign(published))) if "votes" in tallies else None
        return _tally_scores(self, margins.own, margin, votes).T

    def _positive(
        self, own: np.ndarray, margin: np.ndarray | None, votes: np.ndarray | None
    ) -> np.ndarray:
        """``tally_scores(own, margin, votes) >= 0``, (P, n) bool: the labels. This package's
        rules skip there what only their scores need (their inputs are checked finite, so
        their scores need no check)."""
        return self.tally_scores(own, margin, votes) >= 0


def _vote_positive(total: np.ndarray, tie_break: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``total + tie_break >= 0``, (P, n) bool, for integer vote totals ``total`` and a
    tie-break in [-1, 1] computed only where it can decide: ``tie_break(at)`` gets the flat
    indices of the elements where ``total`` is 0 or -1 (see :func:`_at`). Elsewhere the sum
    has the sign of ``total`` (1 - 1 = 0 counts as +1, as in the scores)."""
    positive = total >= 1
    tied = np.flatnonzero((total > -2) != positive)
    if tied.size:
        positive.ravel()[tied] = total.ravel()[tied] + tie_break(tied) >= 0
    return positive


def _at(values: np.ndarray, shape: tuple[int, ...], at: np.ndarray) -> np.ndarray:
    """``values`` broadcast to ``shape``, at the flat indices ``at``."""
    return np.broadcast_to(values, shape)[np.unravel_index(at, shape)]


class MajorityVote(TallyRule):
    """Majority of the signs of every model a peer holds, ties broken by the summed margin.

    score = (sum of signs) + tanh(sum of margins): the integer vote decides, a tie goes to
    the sign of the summed margin, an exact zero to +1 (the seed's rule).
    """

    name: ClassVar[str] = "majority"

    def tally_scores(
        self, own: np.ndarray, margin: np.ndarray | None, votes: np.ndarray | None
    ) -> np.ndarray:
        assert margin is not None and votes is not None  # tallies
        score = np.sign(own)
        score += votes
        score += np.tanh(own + margin)
        return score

    def _positive(
        self, own: np.ndarray, margin: np.ndarray | None, votes: np.ndarray | None
    ) -> np.ndarray:
        assert margin is not None and votes is not None  # tallies
        shape = own.shape
        return _vote_positive(
            np.sign(own) + votes,
            lambda at: np.tanh(_at(own, shape, at) + _at(margin, shape, at)),
        )


class MeanMargin(TallyRule):
    """Sign of the mean margin of every model a peer holds (0 -> +1)."""

    name: ClassVar[str] = "mean-margin"
    tallies: ClassVar[tuple[str, ...]] = ("margin",)

    def tally_scores(
        self, own: np.ndarray, margin: np.ndarray | None, votes: np.ndarray | None
    ) -> np.ndarray:
        assert margin is not None  # tallies
        return own + margin


class MajorityOwnTie(TallyRule):
    """Majority of the signs of every model a peer holds, a tied vote going to the own model.

    ``score = (sum of signs) + tanh(own margin) / 2`` (a term below 1/2 in absolute value
    never overturns a vote that is not tied). As :func:`p2pdp.learning.ensembles.majority_rule`.
    Reads: received models, own model. Costs no privacy (post-processing; the result stays
    with the peer).
    """

    name: ClassVar[str] = "majority-own"
    tallies: ClassVar[tuple[str, ...]] = ("votes",)

    def tally_scores(
        self, own: np.ndarray, margin: np.ndarray | None, votes: np.ndarray | None
    ) -> np.ndarray:
        assert votes is not None  # tallies
        score = np.sign(own)
        score += votes
        score += 0.5 * np.tanh(own)
        return score

    def _positive(
        self, own: np.ndarray, margin: np.ndarray | None, votes: np.ndarray | None
    ) -> np.ndarray:
        assert votes is not None  # tallies
        return _vote_positive(
            np.sign(own) + votes, lambda at: 0.5 * np.tanh(_at(own, own.shape, at))
        )


def _public_view(ensembles: Ensembles) -> PublicView:
    return PublicView.from_ensembles(ensembles, ensembles.noise_std)


class AverageRule(EnsembleRule):
    """Own model mixed with the inverse-noise-variance average of the received models.

    :func:`p2pdp.learning.ensembles.average_rule`: the mix follows the average's public noise
    variance
    (James-Stein shrinkage with a noise test and a cap), no tuning. Reads: received models,
    their public ``noise_std`` (release records), own model. Costs no privacy.
    """

    name: ClassVar[str] = "average"

    def fit(self, ensembles: Ensembles, own: PeerData | None = None) -> LinearRule:
        return LinearRule(average_rule(_public_view(ensembles)).weights)

    def scores(self, margins: Margins) -> np.ndarray:
        raise ValueError("the average rule scores after fit(); use evaluate_ensembles")


class LocalValidatedRule(EnsembleRule):
    """Own model mixed with the received average, the mix chosen on the peer's own shard.

    :func:`p2pdp.learning.ensembles.local_validated_rule` with the k-fold refits of
    :class:`PeerData`
    (computed once per training key). Reads: received models, their noise scales, the own
    model and the own shard. Costs no privacy: nothing leaves the peer.
    """

    name: ClassVar[str] = "local-validated"
    needs_own_data: ClassVar[bool] = True

    def fit(self, ensembles: Ensembles, own: PeerData | None = None) -> LinearRule:
        if own is None:
            raise ConfigError(
                "evaluation.vote = 'local-validated' needs each peer's own shard; the task "
                "must pass PeerData (the logistic task does)"
            )
        rule = local_validated_rule(_public_view(ensembles), own.shards, cv=own.cv)
        return LinearRule(rule.weights)

    def scores(self, margins: Margins) -> np.ndarray:
        raise ValueError("the local-validated rule scores after fit(); use evaluate_ensembles")


def make_ensemble_rule(vote: str | EnsembleRule) -> EnsembleRule:
    """The rule ``evaluation.vote`` names (a built-in, an import string, or an instance)."""
    if isinstance(vote, EnsembleRule):
        _check_tallies(vote)
        return vote
    from p2pdp.core.components import resolve

    target = resolve("ensemble", vote, key="evaluation.vote")
    if isinstance(target, type):
        with calling("ensemble", target, "__init__"):
            target = target()
    check_methods(target, "ensemble", ("fit", "scores"), "p2pdp.learning.rules.EnsembleRule")
    _check_tallies(target)
    return target


def _check_tallies(rule: EnsembleRule) -> None:
    """A :class:`TallyRule`'s ``tallies`` name sums it can be given, else a ComponentError."""
    if not isinstance(rule, TallyRule):
        return
    tallies = rule.tallies
    if isinstance(tallies, str) or not set(tallies) <= {"margin", "votes"}:
        raise problem(
            "ensemble",
            rule,
            "tallies",
            f"is {tallies!r}: a TallyRule reads a tuple of 'margin' (the summed margins of "
            "the published models a peer holds) and 'votes' (their summed signs)",
        )


def _tally_scores(
    vote: TallyRule, own: np.ndarray, margin: np.ndarray | None, votes: np.ndarray | None
) -> np.ndarray:
    """``vote.tally_scores(own, margin, votes)``, (P, n), checked."""
    with calling("ensemble", vote, "tally_scores"):
        scores = vote.tally_scores(own, margin, votes)
    return check_numbers(scores, "ensemble", vote, "tally_scores", shape=own.shape)
