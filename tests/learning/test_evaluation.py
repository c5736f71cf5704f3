"""Shared-tally ensemble evaluation equals the naive per-peer computation."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_curve

from p2pdp.core.errors import ConfigError
from p2pdp.learning.evaluation import ensemble_scores, evaluate_ensembles, linear_error, predict
from p2pdp.learning.rules import build_ensembles
from p2pdp.learning.tiles import EvaluationTiles


def _random_world(rng, n_peers=7, n_models=11, dim=5, n_rows=40, share_fraction=0.4):
    local = rng.normal(size=(n_peers, dim))
    published = rng.normal(size=(n_models, dim))
    shared = rng.random(n_models) < share_fraction
    pairs = [
        (peer, model)
        for model in np.flatnonzero(~shared)
        for peer in rng.choice(n_peers, size=rng.integers(1, n_peers + 1), replace=False)
    ]
    pairs = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    X = rng.normal(size=(n_rows, dim))
    y = np.where(rng.random(n_rows) < 0.5, 1, -1)
    return local, published, shared, pairs, X, y


def _naive_labels(local, published, shared, pairs, X, vote):
    """Each peer builds its ensemble list explicitly and votes."""
    labels = np.empty((X.shape[0], local.shape[0]), dtype=np.int8)
    for peer in range(local.shape[0]):
        members = [local[peer]] + [published[k] for k in np.flatnonzero(shared)]
        members += [published[k] for p, k in pairs if p == peer]
        margins = X @ np.array(members).T
        if vote == "mean-margin":
            decision = margins.mean(axis=1)
            labels[:, peer] = np.where(decision >= 0, 1, -1)
        elif vote == "majority-own":
            votes = np.sign(margins).sum(axis=1)
            own = np.where(margins[:, 0] >= 0, 1, -1)
            labels[:, peer] = np.where(votes > 0, 1, np.where(votes < 0, -1, own))
        else:
            votes = np.sign(margins).sum(axis=1)
            tie_break = np.where(margins.sum(axis=1) >= 0, 1, -1)
            labels[:, peer] = np.where(votes > 0, 1, np.where(votes < 0, -1, tie_break))
    return labels


@pytest.mark.parametrize("vote", ["majority", "mean-margin"])
@pytest.mark.parametrize("seed", range(5))
def test_shared_tally_equals_naive_per_peer(vote, seed):
    rng = np.random.default_rng(seed)
    local, published, shared, pairs, X, y = _random_world(rng)
    ensembles = build_ensembles(local, published, shared, pairs[:, 0], pairs[:, 1])
    fast = predict(ensemble_scores(ensembles, X, vote=vote))
    naive = _naive_labels(local, published, shared, pairs, X, vote)
    np.testing.assert_array_equal(fast, naive)
    metrics = evaluate_ensembles(ensembles, X, y, vote=vote)
    np.testing.assert_array_equal(metrics.errors, (naive != y[:, None]).mean(axis=0))
    assert metrics.confusion.sum() == X.shape[0] * local.shape[0]
    tp = int(((naive == 1) & (y[:, None] == 1)).sum())
    assert metrics.confusion[1, 1] == tp


@pytest.mark.parametrize("vote", ["majority", "mean-margin", "majority-own"])
@pytest.mark.parametrize("workers", [1, 2])
def test_full_publication_is_scored_from_the_published_sums(vote, workers, monkeypatch):
    """With every model shared, evaluate_ensembles scores tiles of peers against the
    published models' summed margins and signs per row (_count_tallied): its errors,
    confusion and own errors equal each peer's ensemble voted explicitly and linear_error,
    with tiles and blocks of models of a few rows, in one process or two; its ROC is the
    best peer's scores, as ensemble_scores gives them."""
    from p2pdp.core.parallel import local_workers
    from p2pdp.learning import evaluation

    rng = np.random.default_rng(6)
    local, published, _, _, X, y = _random_world(rng, n_peers=13, n_models=9, n_rows=47)
    local[0] = 0.0  # zero margins: ties decided by the published models (majority-own: +1)
    X[0] = 0.0  # every margin zero on a row: every vote tied, every score 0 -> +1
    shared = np.ones(len(published), dtype=bool)
    shared[2] = False  # a model nobody received (its members went offline): in no ensemble
    no_pairs = np.zeros(0, dtype=np.int64)
    ensembles = build_ensembles(local, published, shared, no_pairs, no_pairs)
    pieces = []
    split = evaluation.forked_map

    def recording(function, shared, items, *, workers):
        pieces.append((function.__name__, [len(item) for item in items]))
        return split(function, shared, items, workers=workers)

    monkeypatch.setattr(evaluation, "forked_map", recording)
    monkeypatch.setattr(evaluation, "PARALLEL_MIN_PEERS", 2)
    # blocks of 2 published models, tiles of 4 peers x 10 rows
    tiles = EvaluationTiles(chunk_elements=100, min_chunk_rows=1, peer_tile=4, row_tile=10)
    with local_workers(workers):
        metrics = evaluate_ensembles(ensembles, X, y, vote=vote, own_errors=True, tiles=tiles)
    # 9 models in blocks of 2, 13 peers in tiles of 4, shared out to the workers
    assert pieces == [
        ("_published_partials", [5] if workers == 1 else [2, 3]),
        ("_count_tallied", [4] if workers == 1 else [2, 2]),
    ]
    kept = np.flatnonzero(shared)
    naive = _naive_labels(local, published[kept], np.ones(len(kept), bool), no_pairs, X, vote)
    wrong = naive != y[:, None]
    np.testing.assert_array_equal(metrics.errors, wrong.mean(axis=0))
    assert 0 < metrics.errors.min() < metrics.errors.max() < 1
    np.testing.assert_array_equal(metrics.own_errors, linear_error(local, X, y))
    positive = naive == 1
    expected = [
        [(~positive & (y[:, None] == -1)).sum(), (positive & (y[:, None] == -1)).sum()],
        [(~positive & (y[:, None] == 1)).sum(), (positive & (y[:, None] == 1)).sum()],
    ]
    np.testing.assert_array_equal(metrics.confusion, expected)
    assert metrics.best_peer == int(np.argmin(wrong.mean(axis=0)))
    best = ensemble_scores(ensembles, X, vote=vote)[:, metrics.best_peer]
    fpr, tpr, _ = roc_curve(y, best, pos_label=1)
    np.testing.assert_allclose(metrics.roc_fpr, fpr)
    np.testing.assert_allclose(metrics.roc_tpr, tpr)


@pytest.mark.parametrize("rule", ["majority", "majority-own", "mean-margin"])
@pytest.mark.parametrize("per_peer", [False, True])
def test_labels_skip_the_tie_break_only_where_the_vote_decides(rule, per_peer):
    """A built-in rule's labels on the tallied path (_positive) are its scores' signs
    exactly, with tied votes (0, and -1 where tanh rounds to 1 above a margin of ~19),
    zero margins and published sums per row or per peer."""
    from p2pdp.learning.rules import make_ensemble_rule

    vote = make_ensemble_rule(rule)
    rng = np.random.default_rng(8)
    own = rng.normal(scale=3.0, size=(40, 60))
    own[0] = 0.0
    own[1, ::2] = -0.0
    shape = own.shape if per_peer else (1, own.shape[1])
    margin = rng.choice([-30.0, -19.0, -1e-300, 0.0, 0.5, 19.0, 19.5, 30.0], size=shape)
    votes = rng.integers(-3, 3, size=shape).astype(float)
    labels = vote._positive(own, margin, votes)
    np.testing.assert_array_equal(labels, vote.tally_scores(own, margin, votes) >= 0)
    assert labels.any() and not labels.all()


def test_a_tally_rule_of_your_own_is_checked_like_any_rule():
    """A TallyRule from outside the package scored on the tallied path: NaN scores are a
    ComponentError naming its tally_scores, as its scores would be on the margins path."""
    from p2pdp.core.errors import ComponentError
    from p2pdp.learning.rules import TallyRule

    class NaNTally(TallyRule):
        name = "nan-tally"
        tallies = ("votes",)

        def tally_scores(self, own, margin, votes):
            return np.full(own.shape, np.nan)

    rng = np.random.default_rng(7)
    local, published, _, _, X, y = _random_world(rng)
    no_pairs = np.zeros(0, dtype=np.int64)
    shared = np.ones(len(published), dtype=bool)
    ensembles = build_ensembles(local, published, shared, no_pairs, no_pairs)
    with pytest.raises(ComponentError, match=r"NaNTally.*tally_scores returned .* NaN"):
        evaluate_ensembles(ensembles, X, y, vote=NaNTally())


@pytest.mark.parametrize("tallies", [("margins",), "votes", ("margin", "signs")])
def test_a_tally_rule_naming_sums_nobody_gives_is_refused(tallies):
    """``tallies`` other than a tuple of 'margin' and 'votes' is a ComponentError naming the
    rule and its tallies before anything is scored (the tallied path would look them up)."""
    from p2pdp.core.errors import ComponentError
    from p2pdp.learning.rules import TallyRule, make_ensemble_rule

    class Misnamed(TallyRule):
        name = "misnamed"

        def tally_scores(self, own, margin, votes):
            return own

    Misnamed.tallies = tallies
    rng = np.random.default_rng(9)
    local, published, shared, pairs, X, y = _random_world(rng)
    ensembles = build_ensembles(local, published, shared, pairs[:, 0], pairs[:, 1])
    with pytest.raises(ComponentError, match=r"Misnamed.*tallies is .*'margin'.*'votes'"):
        make_ensemble_rule(Misnamed())
    with pytest.raises(ComponentError, match=r"Misnamed.*tallies is"):
        evaluate_ensembles(ensembles, X, y, vote=Misnamed())


class _WritesMargin:
    tallies = ("margin",)

    def tally_scores(self, own, margin, votes):
        margin -= 1.0
        return own + margin


class _WritesOwn:
    tallies = ("margin",)

    def tally_scores(self, own, margin, votes):
        if own.shape[0] > 1:  # every peer's own margins, not the best peer's alone (ROC)
            own += margin
        return own + 0.0


class _OneColumn:
    tallies = ("votes",)

    def tally_scores(self, own, margin, votes):
        return own[:, :1]


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        (_WritesMargin, r"tally_scores raised ValueError: .*read-only"),
        (_WritesOwn, r"tally_scores raised ValueError: .*read-only"),
        (_OneColumn, r"tally_scores returned shape \(7, 1\), expected \(7, 40\)"),
    ],
)
def test_a_tally_rule_is_told_of_its_mistakes_the_same_way_under_either_publication(
    full, behaviour, message
):
    """What a TallyRule is given is read-only (writing into the shared sums changed later
    tiles' scores, into its own margins the local-only errors), and a wrong result is
    reported against tally_scores in its own orientation, whether the ensembles are scored
    from per-row sums (full publication) or through scores (group publication)."""
    from p2pdp.core.errors import ComponentError
    from p2pdp.learning.rules import TallyRule

    rule = type("Rule", (behaviour, TallyRule), {"name": "rule"})()
    rng = np.random.default_rng(10)
    local, published, shared, pairs, X, y = _random_world(rng, share_fraction=float(full))
    ensembles = build_ensembles(local, published, shared, pairs[:, 0], pairs[:, 1])
    assert bool(ensembles.receipts.nnz) is not full
    with pytest.raises(ComponentError, match=message):
        evaluate_ensembles(ensembles, X, y, vote=rule, own_errors=True)


def test_a_tally_rule_with_per_peer_state_is_scored_on_whole_blocks(monkeypatch):
    """A TallyRule whose fit keeps per-peer state (or that overrides scores) is scored
    through scores on blocks of rows with every peer, never on tiles of some peers."""
    from p2pdp.learning import evaluation
    from p2pdp.learning.rules import TallyRule

    class PerPeer(TallyRule):
        name = "per-peer"
        tallies = ("margin",)

        def fit(self, ensembles, own=None):
            self.weight = np.linspace(0.5, 2.0, ensembles.n_peers)[:, None]
            return self

        def tally_scores(self, own, margin, votes):
            return own * self.weight + margin

    rng = np.random.default_rng(11)
    local, published, _, _, X, y = _random_world(rng, n_peers=9)
    no_pairs = np.zeros(0, dtype=np.int64)
    ensembles = build_ensembles(local, published, np.ones(11, bool), no_pairs, no_pairs)
    used = []
    split = evaluation.forked_map

    def recording(function, shared, items, *, workers):
        used.append(function.__name__)
        return split(function, shared, items, workers=workers)

    monkeypatch.setattr(evaluation, "forked_map", recording)
    metrics = evaluate_ensembles(
        ensembles, X, y, vote=PerPeer(), tiles=EvaluationTiles(peer_tile=4)
    )
    assert used == ["_count_errors"]
    weight = np.linspace(0.5, 2.0, 9)[:, None]
    scores = (local @ X.T) * weight + (published @ X.T).sum(axis=0)
    np.testing.assert_array_equal(metrics.errors, ((scores >= 0) != (y == 1)).mean(axis=1))


def test_many_models_are_read_a_chunk_of_rows_at_a_time(monkeypatch):
    """However many peers and models, a chunk holds at least min_chunk_rows test rows:
    every chunk reads every model, so chunks of a row or two made a million peers' evaluation
    read 930 GB. Here the element budget alone would give chunks of 2 rows."""
    from p2pdp.learning import evaluation

    rng = np.random.default_rng(4)
    local, published, shared, pairs, X, y = _random_world(rng, n_rows=97)
    ensembles = build_ensembles(local, published, shared, pairs[:, 0], pairs[:, 1])
    width = ensembles.n_peers + ensembles.published.shape[0]
    tiles = EvaluationTiles(chunk_elements=2 * (width + 1))
    chunks = []
    margins = evaluation._margins

    def counting(ensembles, X):
        chunks.append(len(X))
        return margins(ensembles, X)

    monkeypatch.setattr(evaluation, "_margins", counting)
    evaluate_ensembles(ensembles, X, y, vote="majority", tiles=tiles)
    rows = tiles.min_chunk_rows
    assert rows > 2
    assert chunks[: -(-97 // rows)] == [rows] * (97 // rows) + [97 % rows]


@pytest.mark.parametrize("vote", ["majority", "mean-margin", "average"])
@pytest.mark.parametrize("workers", [1, 2])
def test_own_errors_are_counted_from_the_scoring_margins(vote, workers, monkeypatch):
    """The own models' errors a one-shot run reports come from the margins its ensembles'
    scoring computes (no second product): equal to linear_error of the own models, in one
    chunk or many, in one process or two."""
    from p2pdp.core.parallel import local_workers
    from p2pdp.learning import evaluation

    rng = np.random.default_rng(5)
    local, published, shared, pairs, X, y = _random_world(rng, n_peers=9, n_rows=97)
    local[0] = 0.0  # a zero margin: label +1, as linear_error counts it
    ensembles = build_ensembles(local, published, shared, pairs[:, 0], pairs[:, 1])
    expected = linear_error(local, X, y)
    assert evaluate_ensembles(ensembles, X, y, vote=vote).own_errors is None
    monkeypatch.setattr(evaluation, "PARALLEL_MIN_PEERS", 2)
    tiles = EvaluationTiles(chunk_elements=50, min_chunk_rows=1)
    with local_workers(workers):
        metrics = evaluate_ensembles(ensembles, X, y, vote=vote, own_errors=True, tiles=tiles)
    np.testing.assert_array_equal(metrics.own_errors, expected)
    assert 0 < expected.min() < expected.max() < 1


#: Tiles from one block of everything to a row, a model or a peer at a time.
TILINGS = [
    EvaluationTiles(),
    EvaluationTiles(chunk_elements=50, min_chunk_rows=1),
    EvaluationTiles(chunk_elements=1, min_chunk_rows=1, peer_tile=1, row_tile=1),
    EvaluationTiles(chunk_elements=700, min_chunk_rows=3, peer_tile=3, row_tile=7),
]


@pytest.mark.parametrize("shared_only", [False, True])  # blocks of rows, or the tallied sums
def test_the_metrics_are_the_same_for_any_tiles(shared_only):
    """Tiles cut the work, never the result: the same error counts, confusion, best peer and
    own errors for every tiling (and the same ROC to rounding: sums in other blocks)."""
    rng = np.random.default_rng(3)
    local, published, shared, pairs, X, y = _random_world(rng, n_rows=97)
    if shared_only:  # full publication: scored from the published models' sums
        shared, pairs = np.ones_like(shared), pairs[:0]
    ensembles = build_ensembles(local, published, shared, pairs[:, 0], pairs[:, 1])
    results = [
        evaluate_ensembles(ensembles, X, y, vote="majority", own_errors=True, tiles=tiles)
        for tiles in TILINGS
    ]
    whole = results[0]
    assert 0 < whole.errors.min() < whole.errors.max() < 1
    for tiled in results[1:]:
        np.testing.assert_array_equal(tiled.errors, whole.errors)
        np.testing.assert_array_equal(tiled.confusion, whole.confusion)
        np.testing.assert_array_equal(tiled.own_errors, whole.own_errors)
        assert tiled.best_peer == whole.best_peer
        np.testing.assert_allclose(tiled.roc_tpr, whole.roc_tpr)  # best peer scored in blocks
        assert tiled.auc == pytest.approx(whole.auc)


def test_majority_tie_uses_margin():
    local = np.array([[1.0, 0.0]])
    published = np.array([[-0.5, 0.0]])
    ensembles = build_ensembles(local, published, np.array([True]), np.array([]), np.array([]))
    X = np.array([[1.0, 0.0], [-1.0, 0.0]])
    # one vote each way; margins 1 - 0.5 > 0 on row 0 and -1 + 0.5 < 0 on row 1
    np.testing.assert_array_equal(
        predict(ensemble_scores(ensembles, X, vote="majority"))[:, 0], [1, -1]
    )


def test_best_peer_roc_and_sizes():
    rng = np.random.default_rng(0)
    local, published, shared, pairs, X, y = _random_world(rng)
    ensembles = build_ensembles(local, published, shared, pairs[:, 0], pairs[:, 1])
    metrics = evaluate_ensembles(ensembles, X, y, vote="majority")
    assert metrics.errors[metrics.best_peer] == metrics.errors.min()
    assert 0.0 <= metrics.auc <= 1.0
    expected_sizes = 1 + shared.sum() + np.bincount(pairs[:, 0], minlength=local.shape[0])
    np.testing.assert_array_equal(ensembles.sizes(), expected_sizes)


def test_duplicate_receipt_rejected():
    local = np.zeros((2, 2))
    with pytest.raises(ValueError, match="twice"):
        build_ensembles(
            local, np.ones((1, 2)), np.array([False]), np.array([0, 0]), np.array([0, 0])
        )


def test_unknown_vote_rule():
    local = np.zeros((1, 2))
    ensembles = build_ensembles(
        local, np.ones((0, 2)), np.array([], bool), np.array([]), np.array([])
    )
    with pytest.raises(ConfigError, match="evaluation.vote"):
        ensemble_scores(ensembles, np.ones((1, 2)), vote="plurality")


def test_linear_error():
    X = np.array([[1.0], [-1.0], [2.0]])
    y = np.array([1, -1, -1])
    np.testing.assert_allclose(linear_error(np.array([[1.0], [-1.0]]), X, y), [1 / 3, 2 / 3])


def test_linear_error_in_blocks_equals_one_block():
    rng = np.random.default_rng(5)
    weights, X = rng.normal(size=(23, 4)), rng.normal(size=(17, 4))
    y = np.where(rng.random(17) < 0.5, 1, -1)
    whole = linear_error(weights, X, y)
    assert 0 < whole.min() < whole.max() < 1
    naive = (np.where(weights @ X.T >= 0, 1, -1) != y).mean(axis=1)
    np.testing.assert_array_equal(whole, naive)
    for tiles in TILINGS:  # 23 models in one block, or blocks of 2 (a short last), 1, 3
        np.testing.assert_array_equal(linear_error(weights, X, y, tiles=tiles), whole)


def test_a_plugin_written_against_the_evaluation_module_still_imports_the_rule_classes():
    """The extending guide named ``p2pdp.learning.evaluation.EnsembleRule`` before the rules
    moved to :mod:`p2pdp.learning.rules`: a plug-in importing the base classes from there gets
    the same classes."""
    from p2pdp.learning import evaluation, rules

    for name in ("EnsembleRule", "TallyRule", "Margins"):
        assert getattr(evaluation, name) is getattr(rules, name)
