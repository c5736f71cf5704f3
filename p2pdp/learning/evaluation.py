"""Ensemble prediction and metrics, computed from shared work.

Every peer classifies with an ensemble: its own unperturbed local model plus every published
model it received (no pruning, as in the seed), scored by the rule ``evaluation.vote`` names
(:mod:`p2pdp.learning.rules`, which also says why no rule costs privacy). With full
publication all peers hold the same published models, so scoring each peer separately would
cost ``P`` times the group case. Instead each published model is scored on the test rows once
(one matrix product); a peer's tally is the *shared* tally of models everyone received plus
the sum over the models only it received (a sparse peer x model incidence matrix) plus its
own local model. The built-in votes are :class:`~p2pdp.learning.rules.TallyRule` s,
functions of the own margin and of those sums alone: when every model is shared,
:func:`evaluate_ensembles` sums the published models once per test row and never holds their
margins for all of them at once.

The predicted label is +1 where ``score >= 0`` and -1 elsewhere. The same score is the
continuous output used for the ROC curve.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeGuard

import numpy as np

from p2pdp.core.boundary import (
    calling,
    check_methods,
    check_numbers,
    is_builtin,
    read_only,
)
from p2pdp.core.parallel import current_workers, forked_map, one_blas_thread
from p2pdp.learning.rules import (
    EnsembleRule,
    Ensembles,
    Margins,
    PeerData,
    TallyRule,
    _check_tallies,
    _tally_scores,
    make_ensemble_rule,
)
from p2pdp.learning.tiles import EvaluationTiles, current_tiles


def ensemble_scores(ensembles: Ensembles, X: np.ndarray, *, vote: str | EnsembleRule) -> np.ndarray:
    """Decision score of every peer's ensemble on every row, (n_rows, P).

    Memory grows with ``n_rows * P``: use :func:`evaluate_ensembles` for large runs, which
    streams over row chunks.
    """
    return _scores(make_ensemble_rule(vote), ensembles, _margins(ensembles, X))


def _margins(ensembles: Ensembles, X: np.ndarray) -> Margins:
    """The :class:`Margins` of the rows ``X`` (n, d), read-only."""
    # Work in (peers or models) x rows orientation: contiguous operands for the sparse product.
    rows_t = np.ascontiguousarray(X.T)
    return Margins(
        own=read_only(ensembles.local_weights @ rows_t),
        published=read_only(ensembles.published @ rows_t),
        shared=ensembles.shared.astype(np.float64),
        receipts=ensembles.receipts,
        noise_std=ensembles.noise_std,
        rows=X,
    )


def _scores(rule: EnsembleRule, ensembles: Ensembles, margins: Margins) -> np.ndarray:
    """``rule``'s scores of ``margins``, (n_rows, P), checked."""
    with calling("ensemble", rule, "scores"):
        scores = rule.scores(margins)
    shape = (margins.published.shape[1], ensembles.n_peers)
    return check_numbers(scores, "ensemble", rule, "scores", shape=shape)


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
    #: Each peer's own model's error alone (P,), when :func:`evaluate_ensembles` was asked for
    #: it (``own_errors=True``), else None.
    own_errors: np.ndarray | None = None

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
    ensembles: Ensembles,
    X: np.ndarray,
    y: np.ndarray,
    *,
    vote: str | EnsembleRule,
    own: PeerData | None = None,
    own_errors: bool = False,
    tiles: EvaluationTiles | None = None,
) -> Metrics:
    """Per-peer errors, pooled confusion matrix, and the best peer's ROC, in row chunks.

    With ``own_errors``, :attr:`Metrics.own_errors` is also each peer's own model's error
    alone (what :func:`linear_error` gives for ``ensembles.local_weights``), counted from the
    own margins the scoring computes anyway instead of a second product.

    The rule is fitted once (:meth:`EnsembleRule.fit`, with ``own`` for rules that need the
    peers' own shards), then scores the test rows in one of two ways:

    - a :class:`TallyRule` (the built-in votes) when every published model is shared (full
      publication without churn) and every label is +1 or -1: the published models' margins
      and signs are summed per test row once, by blocks of models, and tiles of
      ``tiles.peer_tile`` peers x ``tiles.row_tile`` rows are scored against those sums (in
      cache, each peer's model read once per tile of rows); the best peer's ROC reuses the
      sums. From :data:`PARALLEL_MIN_PEERS` peers on, a built-in rule's blocks of models,
      then its tiles of peers, are shared out to the local workers
      (:func:`p2pdp.core.parallel.local_workers`);
    - any other rule or ensemble: blocks of test rows, each with every peer's and every
      published model's margins (:class:`Margins`), shared out to the local workers by rows
      (the published models' margins would otherwise be computed by every worker), then the
      best peer's scores in a second pass.

    Either way the blocks are those of one process (partial sums added in block order) and
    the error counts are integers, so the metrics do not depend on the number of workers,
    nor the counts on ``tiles`` (:class:`~p2pdp.learning.tiles.EvaluationTiles`; None: those
    of :func:`~p2pdp.learning.tiles.current_tiles`), which cut the work into blocks.
    """
    import sklearn
    from sklearn.metrics import auc, roc_curve

    rule = make_ensemble_rule(vote)
    with calling("ensemble", rule, "fit"):
        vote = rule.fit(ensembles, own)
    check_methods(vote, "ensemble", ("scores",), "p2pdp.learning.rules.EnsembleRule.fit")
    _check_tallies(vote)
    y = np.asarray(y)
    n_rows, n_peers = X.shape[0], ensembles.n_peers
    workers = current_workers() if is_builtin(rule) and n_peers >= PARALLEL_MIN_PEERS else 1
    n_pos = int((y == 1).sum())
    tiles = tiles or current_tiles()
    if _tallied(vote, ensembles, X, y):
        counts = _tallied_counts(ensembles, X, y, vote, workers, own_errors, tiles)
    else:
        counts = _blocked_counts(ensembles, X, y, vote, workers, own_errors, tiles)
    wrong, positive_on_pos, positive_on_neg, own_wrong, scores_of = counts
    best = int(np.argmin(wrong))
    best_scores = scores_of(best)
    n_neg = n_rows - n_pos
    confusion = np.array(
        [
            [n_neg * n_peers - positive_on_neg, positive_on_neg],
            [n_pos * n_peers - positive_on_pos, positive_on_pos],
        ],
        dtype=np.int64,
    )
    if len(np.unique(y)) == 2:
        # arrays of our own making: sklearn's check of its arguments was most of the cost
        with sklearn.config_context(skip_parameter_validation=True):
            fpr, tpr, _ = roc_curve(y, best_scores, pos_label=1)
            area = float(auc(fpr, tpr))
    else:  # a test set with one class has no ROC
        fpr, tpr, area = np.array([0.0, 1.0]), np.array([0.0, 1.0]), float("nan")
    return Metrics(
        errors=wrong / n_rows,
        confusion=confusion,
        best_peer=best,
        roc_fpr=fpr,
        roc_tpr=tpr,
        auc=area,
        own_errors=own_wrong / n_rows if own_errors else None,
    )


def _tallied(
    vote: EnsembleRule, ensembles: Ensembles, X: np.ndarray, y: np.ndarray
) -> TypeGuard[TallyRule]:
    """Whether :func:`evaluate_ensembles` scores ``vote`` from the published models' sums:
    a :class:`TallyRule` that overrides neither ``fit`` (no per-peer state) nor ``scores``,
    every published model shared (no receipts), every label +1 or -1, and (what lets this
    package's rules skip checking their scores) finite models and rows."""
    return (
        isinstance(vote, TallyRule)
        and type(vote).fit is EnsembleRule.fit
        and type(vote).scores is TallyRule.scores
        and not ensembles.receipts.nnz
        and bool(np.isin(y, (-1, 1)).all())
        and all(np.isfinite(a).all() for a in (X, ensembles.local_weights, ensembles.published))
    )


#: What scoring every peer gives :func:`evaluate_ensembles`: wrong labels per peer (P,),
#: positive predictions on positive rows and on negative rows (summed over the peers), wrong
#: labels of each own model alone (P,), and the scores (n,) of a peer given its index.
_Counts = tuple[np.ndarray, int, int, np.ndarray, Callable[[int], np.ndarray]]


def _tallied_counts(
    ensembles: Ensembles,
    X: np.ndarray,
    y: np.ndarray,
    vote: TallyRule,
    workers: int,
    own_errors: bool,
    tiles: EvaluationTiles,
) -> _Counts:
    """:data:`_Counts` of a :class:`TallyRule` whose published models are all shared, and
    labels all +1 or -1: tiles of peers against the published models' sums per row."""
    n_peers, tile = ensembles.n_peers, tiles.peer_tile
    peers = [slice(a, a + tile) for a in range(0, n_peers, tile)]
    with one_blas_thread():  # also in this process: two BLAS threads were 1.2x slower
        sums = _published_sums(vote, ensembles, X, workers, tiles)
        parts = forked_map(
            _count_tallied,
            (ensembles.local_weights, X, y == 1, vote, sums, own_errors, tiles.row_tile),
            _split(peers, workers),
            workers=workers,
        )
    positives, wrong, own_wrong = (np.concatenate(column) for column in zip(*parts, strict=True))
    # per peer, a and b its positive predictions on positive and on negative rows:
    # positives = a + b and wrong = (n_pos - a) + b
    total = int(positives.sum())
    on_negative = (total + int(wrong.sum()) - int((y == 1).sum()) * n_peers) // 2

    def scores(peer: int) -> np.ndarray:
        own = ensembles.local_weights[peer : peer + 1] @ np.ascontiguousarray(X.T)
        return _tally_scores(vote, read_only(own), *_tallies(sums, slice(None)))[0]

    return wrong, total - on_negative, on_negative, own_wrong, scores


def _blocked_counts(
    ensembles: Ensembles,
    X: np.ndarray,
    y: np.ndarray,
    vote: EnsembleRule,
    workers: int,
    own_errors: bool,
    tiles: EvaluationTiles,
) -> _Counts:
    """:data:`_Counts` of any rule: blocks of test rows with every model's margins."""
    n_rows = X.shape[0]
    blocks = tiles.row_blocks(n_rows, ensembles.n_peers + ensembles.published.shape[0])
    parts = forked_map(
        _count_errors,
        (ensembles, X, y, vote, own_errors),
        _split(blocks, workers),
        workers=workers,
    )

    def scores(peer: int) -> np.ndarray:
        if len(parts) == 1 and parts[0][3] is not None:  # one block held every row: reuse it
            return parts[0][3][:, peer]
        # as costly as every peer's scores when the published models dominate: split too
        one = (_one_peer(ensembles, peer), X, vote.for_peers(slice(peer, peer + 1)))
        blocks = tiles.row_blocks(n_rows, 1 + ensembles.published.shape[0])
        scored = forked_map(_first_scores, one, _split(blocks, workers), workers=workers)
        return np.concatenate(scored)

    return (
        sum((part[0] for part in parts), np.zeros(ensembles.n_peers, dtype=np.int64)),
        sum(part[1] for part in parts),
        sum(part[2] for part in parts),
        sum((part[4] for part in parts), np.zeros(ensembles.n_peers, dtype=np.int64)),
        scores,
    )


#: Fewest peers for which :func:`evaluate_ensembles` splits the test rows over local workers.
PARALLEL_MIN_PEERS = 20_000


def _split(blocks: list[slice], workers: int) -> list[list[slice]]:
    """``blocks`` in at most ``workers`` runs of consecutive blocks, one per worker. Every
    block is scored as it would be in one process, so scores do not depend on ``workers``."""
    cuts = np.linspace(0, len(blocks), max(1, min(workers, len(blocks))) + 1).astype(int)
    return [blocks[a:b] for a, b in itertools.pairwise(cuts.tolist())]


def _count_errors(
    problem: tuple[Ensembles, np.ndarray, np.ndarray, EnsembleRule, bool], blocks: list[slice]
) -> tuple[np.ndarray, int, int, np.ndarray | None, np.ndarray]:
    """Errors of every peer's ensemble on the test rows of ``blocks``: wrong labels per peer
    (P,), positive predictions on positive rows and on negative rows (summed over the
    peers), the scores of the last block's rows when it is the only one (else None), and
    (when ``problem``'s last item is True, else zeros) wrong labels per peer of the own
    model alone (P,), as :func:`_linear_wrong` counts them."""
    ensembles, X, y, vote, own_errors = problem
    wrong = np.zeros(ensembles.n_peers, dtype=np.int64)
    own_wrong = np.zeros(ensembles.n_peers, dtype=np.int64)
    on_positive = on_negative = 0
    for rows in blocks:
        margins = _margins(ensembles, X[rows])
        scores = _scores(vote, ensembles, margins)
        labels = predict(scores)
        wrong += (labels != y[rows][:, None]).sum(axis=0)
        positive = labels == 1
        on_positive += int(positive[y[rows] == 1].sum())
        on_negative += int(positive[y[rows] != 1].sum())
        if own_errors:
            own_wrong += np.count_nonzero(np.where(margins.own >= 0, 1, -1) != y[rows], axis=1)
    return wrong, on_positive, on_negative, scores if len(blocks) == 1 else None, own_wrong


def _first_scores(
    problem: tuple[Ensembles, np.ndarray, EnsembleRule], blocks: list[slice]
) -> np.ndarray:
    """The first peer's scores on the test rows of ``blocks``, (n,)."""
    ensembles, X, vote = problem
    return np.concatenate([ensemble_scores(ensembles, X[rows], vote=vote)[:, 0] for rows in blocks])


def _published_sums(
    vote: TallyRule, ensembles: Ensembles, X: np.ndarray, workers: int, tiles: EvaluationTiles
) -> dict[str, np.ndarray]:
    """``{tally: (n,)}`` for the tallies ``vote`` reads: the sums over the shared published
    models of their margins (``"margin"``) and of their signs (``"votes"``) on each row of
    ``X``. By blocks of models, each block's partial sums added in block order, so they do
    not depend on ``workers``."""
    blocks = tiles.row_blocks(ensembles.published.shape[0], X.shape[0])
    margins = tiles.peer_tile * tiles.row_tile  # a step's margins stay in cache
    parts = forked_map(
        _published_partials,
        (ensembles.published, ensembles.shared.astype(np.float64), X, vote.tallies, margins),
        _split(blocks, workers),
        workers=workers,
    )
    partials = list(itertools.chain.from_iterable(parts))
    sums = {
        tally: sum((partial[tally] for partial in partials), np.zeros(X.shape[0]))
        for tally in vote.tallies
    }
    for total in sums.values():
        read_only(total)
    return sums


def _published_partials(
    problem: tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...], int], blocks: list[slice]
) -> list[dict[str, np.ndarray]]:
    """Per block of models: the shared ones' summed margins and signs on every row, (n,),
    summed over slices of the block of at most ``problem[4]`` margins, which fit in cache
    (in order: a block's sums are the same in any process)."""
    published, shared, X, tallies, margins_in_cache = problem
    rows_t = np.ascontiguousarray(X.T)
    step = max(1, margins_in_cache // X.shape[0])  # models whose margins stay in cache
    partials = []
    for block in blocks:
        partial = {tally: np.zeros(X.shape[0]) for tally in tallies}
        for start in range(block.start, block.stop, step):
            models = slice(start, min(start + step, block.stop))
            margins = published[models] @ rows_t
            weights = shared[models]
            if "margin" in tallies:
                partial["margin"] += weights @ margins
            if "votes" in tallies:
                partial["votes"] += weights @ np.sign(margins)
        partials.append(partial)
    return partials


def _tallies(
    sums: dict[str, np.ndarray], rows: slice
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(margin, votes)`` of :func:`_published_sums` on ``rows``, (1, n) each (or None):
    views of the read-only sums."""
    margin, votes = (sums[t][None, rows] if t in sums else None for t in ("margin", "votes"))
    return margin, votes


def _count_tallied(
    problem: tuple[np.ndarray, np.ndarray, np.ndarray, TallyRule, dict[str, np.ndarray], bool, int],
    blocks: list[slice],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per peer of ``blocks``: positive predictions, wrong ones, and wrong ones of the own
    model alone (with ``own_errors``, else zeros), on every test row, (p,) each. ``problem =
    (local_weights, X, positive, vote, sums, own_errors, row_tile)``: ``positive`` (n,) bool
    where the label is +1 (every label is +1 or -1), ``sums`` those of
    :func:`_published_sums`. Scored tile by tile (a block's peers x ``row_tile`` rows)."""
    weights, X, positive_rows, vote, sums, own_errors, row_tile = problem
    ours = is_builtin(vote)  # their inputs checked finite: labels without checked scores
    tiles = [slice(a, a + row_tile) for a in range(0, X.shape[0], row_tile)]
    rows_t = [np.ascontiguousarray(X[rows].T) for rows in tiles]
    positives, wrong, own_wrong = [], [], []
    for peers in blocks:
        local = weights[peers]
        counts = np.zeros((3, local.shape[0]), dtype=np.int64)
        for rows, block_t in zip(tiles, rows_t, strict=True):
            own = read_only(local @ block_t)
            if ours:
                positive = vote._positive(own, *_tallies(sums, rows))
            else:
                positive = _tally_scores(vote, own, *_tallies(sums, rows)) >= 0
            counts[0] += np.count_nonzero(positive, axis=1)
            counts[1] += np.count_nonzero(positive != positive_rows[rows], axis=1)
            if own_errors:
                counts[2] += np.count_nonzero((own >= 0) != positive_rows[rows], axis=1)
        positives.append(counts[0])
        wrong.append(counts[1])
        own_wrong.append(counts[2])
    return np.concatenate(positives), np.concatenate(wrong), np.concatenate(own_wrong)


def _one_peer(ensembles: Ensembles, peer: int) -> Ensembles:
    return _peer_slice(ensembles, slice(peer, peer + 1))


def _peer_slice(ensembles: Ensembles, peers: slice) -> Ensembles:
    """The ensembles of the peers ``peers`` (every published model kept)."""
    return Ensembles(
        local_weights=ensembles.local_weights[peers],
        published=ensembles.published,
        shared=ensembles.shared,
        receipts=ensembles.receipts[peers],
        noise_std=ensembles.noise_std,
    )


def linear_error(
    weights: np.ndarray, X: np.ndarray, y: np.ndarray, *, tiles: EvaluationTiles | None = None
) -> np.ndarray:
    """Test error of each linear model in ``weights`` (m, d) alone: (m,) fractions.

    Computed in blocks of models (:meth:`~p2pdp.learning.tiles.EvaluationTiles.row_blocks`
    of ``tiles``, None: :func:`~p2pdp.learning.tiles.current_tiles`), so memory stays
    bounded for 100,000 local models; the same errors for any blocks.
    """
    weights = np.atleast_2d(weights)
    workers = current_workers() if weights.shape[0] >= PARALLEL_MIN_PEERS else 1
    blocks = (tiles or current_tiles()).row_blocks(weights.shape[0], X.shape[0])
    parts = forked_map(
        _linear_wrong,
        (weights, X, np.asarray(y)),
        _split(blocks, workers),
        workers=workers,
    )
    return np.concatenate(parts) / X.shape[0]


def _linear_wrong(
    problem: tuple[np.ndarray, np.ndarray, np.ndarray], blocks: list[slice]
) -> np.ndarray:
    """Wrong labels of the models ``weights[blocks]`` on every row (label +1 where the
    margin is >= 0, else -1), ``problem = (weights, X, y)``."""
    weights, X, y = problem
    return np.concatenate(
        [
            np.count_nonzero(np.where(weights[models] @ X.T >= 0, 1, -1) != y, axis=1)
            for models in blocks
        ]
    )
