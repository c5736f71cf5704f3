"""Ensemble prediction and metrics, computed from shared work.

Every peer classifies with an ensemble: its own unperturbed local model plus every published
model it received (no pruning, as in the seed). With full publication all peers hold the same
published models, so scoring each peer separately would cost ``P`` times the group case.
Instead each published model is scored on the test rows once (one matrix product); a peer's
tally is the *shared* tally of models everyone received plus the sum over the models only it
received (a sparse peer x model incidence matrix) plus its own local model.

Decision rules (``evaluation.vote``: an :class:`EnsembleRule` component):

``"majority"`` (:class:`MajorityVote`)
    score = (sum of signs of the ensemble's margins) + tanh(sum of margins). The integer vote
    decides; a tie is broken by the summed margin, and an exact zero goes to +1.
``"mean-margin"`` (:class:`MeanMargin`)
    score = sum of margins (the sign of the mean margin).

The predicted label is +1 where ``score >= 0`` and -1 elsewhere. The same score is the
continuous output used for the ROC curve.

Evaluation reads only test rows and released (published) models plus each peer's own model:
it is post-processing and costs no privacy budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
from sklearn.metrics import auc, roc_curve

_CHUNK_ELEMENTS = 4_000_000  # test rows x (models + peers) per chunk: bounds memory to ~100 MB


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
    """

    own: np.ndarray
    published: np.ndarray
    shared: np.ndarray
    receipts: sp.csr_matrix
    noise_std: np.ndarray

    def held_sum(self, values: np.ndarray, start: np.ndarray) -> np.ndarray:
        """``start`` (P, n) plus the sum of ``values`` (K, n) over the models each peer holds."""
        return start + (self.shared @ values)[None, :] + self.receipts @ values


class EnsembleRule(ABC):
    """The rule a peer classifies with (the ``ensemble`` component kind, ``evaluation.vote``).

    A rule maps :class:`Margins` of a block of test rows to a decision score per row and
    peer, shape (n, P); label +1 where the score is >= 0. It must be vectorised over peers
    (full publication gives every peer the same published models: use
    :meth:`Margins.held_sum` instead of per-peer loops). A rule reads only a peer's own
    model and the published models with their public release records: post-processing, so
    it costs no privacy. Rules are constructed without arguments.
    """

    name: ClassVar[str]

    @abstractmethod
    def scores(self, margins: Margins) -> np.ndarray:
        """Decision scores, shape (n_rows, P)."""


class MajorityVote(EnsembleRule):
    """Majority of the signs of every model a peer holds, ties broken by the summed margin.

    score = (sum of signs) + tanh(sum of margins): the integer vote decides, a tie goes to
    the sign of the summed margin, an exact zero to +1 (the seed's rule).
    """

    name: ClassVar[str] = "majority"

    def scores(self, margins: Margins) -> np.ndarray:
        margin_total = margins.held_sum(margins.published, margins.own)
        vote_total = margins.held_sum(np.sign(margins.published), np.sign(margins.own))
        return (vote_total + np.tanh(margin_total)).T


class MeanMargin(EnsembleRule):
    """Sign of the mean margin of every model a peer holds (0 -> +1)."""

    name: ClassVar[str] = "mean-margin"

    def scores(self, margins: Margins) -> np.ndarray:
        return margins.held_sum(margins.published, margins.own).T


def make_ensemble_rule(vote: str | EnsembleRule) -> EnsembleRule:
    """The rule ``evaluation.vote`` names (a built-in, an import string, or an instance)."""
    if isinstance(vote, EnsembleRule):
        return vote
    from p2pdp.components import resolve

    target = resolve("ensemble", vote, key="evaluation.vote")
    return target() if isinstance(target, type) else target


def ensemble_scores(ensembles: Ensembles, X: np.ndarray, *, vote: str | EnsembleRule) -> np.ndarray:
    """Decision score of every peer's ensemble on every row, (n_rows, P).

    Memory grows with ``n_rows * P``: use :func:`evaluate_ensembles` for large runs, which
    streams over row chunks.
    """
    rule = make_ensemble_rule(vote)
    # Work in (peers or models) x rows orientation: contiguous operands for the sparse product.
    rows_t = np.ascontiguousarray(X.T)
    margins = Margins(
        own=ensembles.local_weights @ rows_t,
        published=ensembles.published @ rows_t,
        shared=ensembles.shared.astype(np.float64),
        receipts=ensembles.receipts,
        noise_std=ensembles.noise_std,
    )
    return rule.scores(margins)


def predict(scores: np.ndarray) -> np.ndarray:
    """Labels in {-1, +1} from decision scores (``score >= 0`` -> +1)."""
    return np.where(scores >= 0, 1, -1).astype(np.int8)


@dataclass(frozen=True, slots=True, kw_only=True)
class Metrics:
    """Test metrics of every peer's ensemble.

    ``errors`` is the per-peer error rate on the test rows (fraction in [0, 1]); ``confusion``
    pools every peer's predictions: ``[[TN, FP], [FN, TP]]`` with label -1 first.
    ``roc_fpr``/``roc_tpr``/``auc`` are those of the best peer (lowest error, lowest index on
    ties), as in the seed.
    """

    errors: np.ndarray
    confusion: np.ndarray
    best_peer: int
    roc_fpr: np.ndarray
    roc_tpr: np.ndarray
    auc: float

    def summary(self) -> dict[str, float]:
        e = self.errors
        return {
            "mean_error": float(e.mean()),
            "std_error": float(e.std()),
            "min_error": float(e.min()),
            "median_error": float(np.median(e)),
            "max_error": float(e.max()),
            "best_peer_auc": float(self.auc),
        }


def evaluate_ensembles(
    ensembles: Ensembles, X: np.ndarray, y: np.ndarray, *, vote: str | EnsembleRule
) -> Metrics:
    """Per-peer errors, pooled confusion matrix, and the best peer's ROC, in row chunks."""
    vote = make_ensemble_rule(vote)
    y = np.asarray(y)
    n_rows, n_peers = X.shape[0], ensembles.n_peers
    wrong = np.zeros(n_peers, dtype=np.int64)
    predicted_positive_on_pos = 0
    predicted_positive_on_neg = 0
    for rows in _row_blocks(n_rows, n_peers + ensembles.published.shape[0]):
        scores = ensemble_scores(ensembles, X[rows], vote=vote)
        labels = predict(scores)
        truth = y[rows][:, None]
        wrong += (labels != truth).sum(axis=0)
        positive = labels == 1
        predicted_positive_on_pos += int(positive[y[rows] == 1].sum())
        predicted_positive_on_neg += int(positive[y[rows] != 1].sum())
    n_pos = int((y == 1).sum()) * n_peers
    n_neg = n_rows * n_peers - n_pos
    confusion = np.array(
        [
            [n_neg - predicted_positive_on_neg, predicted_positive_on_neg],
            [n_pos - predicted_positive_on_pos, predicted_positive_on_pos],
        ],
        dtype=np.int64,
    )
    errors = wrong / n_rows
    best = int(np.argmin(errors))
    if scores.shape[0] == n_rows:  # one block held every row: reuse its scores
        best_scores = scores[:, best]
    else:
        one = _one_peer(ensembles, best)
        blocks = _row_blocks(n_rows, 1 + ensembles.published.shape[0])
        best_scores = np.concatenate([ensemble_scores(one, X[r], vote=vote)[:, 0] for r in blocks])
    if len(np.unique(y)) == 2:
        fpr, tpr, _ = roc_curve(y, best_scores, pos_label=1)
        area = float(auc(fpr, tpr))
    else:  # a test set with one class has no ROC
        fpr, tpr, area = np.array([0.0, 1.0]), np.array([0.0, 1.0]), float("nan")
    return Metrics(
        errors=errors, confusion=confusion, best_peer=best, roc_fpr=fpr, roc_tpr=tpr, auc=area
    )


def _row_blocks(n_rows: int, width: int) -> list[slice]:
    """Row slices such that a block times ``width`` columns stays under ``_CHUNK_ELEMENTS``."""
    block = max(1, _CHUNK_ELEMENTS // (width + 1))
    return [slice(start, start + block) for start in range(0, n_rows, block)]


def _one_peer(ensembles: Ensembles, peer: int) -> Ensembles:
    return Ensembles(
        local_weights=ensembles.local_weights[peer : peer + 1],
        published=ensembles.published,
        shared=ensembles.shared,
        receipts=ensembles.receipts[peer : peer + 1],
        noise_std=ensembles.noise_std,
    )


def linear_error(weights: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Test error of each linear model in ``weights`` (m, d) alone: (m,) fractions.

    Computed in blocks of models, so memory stays bounded for 100,000 local models.
    """
    weights = np.atleast_2d(weights)
    y = np.asarray(y)
    errors = np.empty(weights.shape[0])
    for models in _row_blocks(weights.shape[0], X.shape[0]):
        labels = np.where(weights[models] @ X.T >= 0, 1, -1)
        errors[models] = (labels != y[None, :]).mean(axis=1)
    return errors
