"""Ensemble rules from public information: each against a naive per-peer implementation."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from p2pdp.core.errors import ConfigError
from p2pdp.learning.ensembles import (
    ENSEMBLE_RULES,
    OwnShards,
    PublicView,
    apply_rule,
    average_rule,
    cross_validate_own_models,
    fit_towards,
    local_validated_rule,
    majority_rule,
    mean_margin_rule,
    personalised_refit_rule,
    received_average,
    shrinkage_weights,
)
from p2pdp.learning.evaluation import linear_error
from p2pdp.learning.models import (
    fit_local_models,
    fit_local_models_sklearn,
    logistic_objective_gradient,
)
from p2pdp.learning.rules import build_ensembles


def random_view(rng: np.random.Generator, n_peers=7, n_models=9, dim=5, exact=False) -> PublicView:
    own = rng.normal(size=(n_peers, dim))
    published = rng.normal(size=(n_models, dim)) * 3
    noise_std = rng.uniform(0.1, 5.0, n_models)
    if exact:
        noise_std[[2, 5]] = 0.0
    shared = rng.random(n_models) < 0.3
    mask = (rng.random((n_peers, n_models)) < 0.4) & ~shared[None, :]
    mask[0] = False  # peer 0 receives only the shared models (maybe none)
    return PublicView(
        own_weights=own,
        published=published,
        noise_std=noise_std,
        shared=shared,
        receipts=sp.csr_matrix(mask.astype(float)),
    )


def received_lists(view: PublicView) -> list[list[int]]:
    dense = view.receipts.toarray() > 0
    return [
        [k for k in range(len(view.shared)) if view.shared[k] or dense[p, k]]
        for p in range(view.n_peers)
    ]


def naive_average(view: PublicView, p: int) -> tuple[np.ndarray, float]:
    models = received_lists(view)[p]
    if not models:
        return np.zeros(view.own_weights.shape[1]), np.inf
    exact = [k for k in models if view.noise_std[k] == 0]
    if exact:
        return np.mean([view.published[k] for k in exact], axis=0), 0.0
    weights = np.array([1 / view.noise_std[k] ** 2 for k in models])
    stacked = np.array([view.published[k] for k in models])
    return (weights[:, None] * stacked).sum(0) / weights.sum(), 1 / weights.sum()


def naive_beta(view: PublicView, p: int, kappa: float, cap: float = np.inf) -> float:
    average, variance = naive_average(view, p)
    if not received_lists(view)[p]:
        return 0.0
    if variance == 0:
        return 1.0
    d = view.own_weights.shape[1]
    sq = float(np.sum((average - view.own_weights[p]) ** 2))
    c = (d - 2 + kappa * np.sqrt(2 * d)) * variance / sq
    limit = cap * np.linalg.norm(view.own_weights[p]) / np.sqrt(d * variance)
    return min(1 - min(1.0, max(0.0, c)), limit)


@pytest.mark.parametrize("exact", [False, True])
def test_received_average_matches_per_peer_loop(exact: bool) -> None:
    rng = np.random.default_rng(1)
    for _ in range(5):
        view = random_view(rng, exact=exact)
        average, variance = received_average(view)
        for p in range(view.n_peers):
            expected, expected_var = naive_average(view, p)
            np.testing.assert_allclose(average[p], expected, rtol=1e-12, atol=1e-12)
            assert variance[p] == pytest.approx(expected_var, rel=1e-12)


@pytest.mark.parametrize(("kappa", "cap"), [(0.0, np.inf), (4.0, np.inf), (2.0, 0.2)])
def test_average_rule_matches_per_peer_loop(kappa: float, cap: float) -> None:
    rng = np.random.default_rng(2)
    for _ in range(5):
        view = random_view(rng, exact=bool(rng.random() < 0.3))
        weights = average_rule(view, kappa=kappa, noise_cap=cap).weights
        _, beta = shrinkage_weights(view, kappa, cap)
        for p in range(view.n_peers):
            b = naive_beta(view, p, kappa, cap)
            assert beta[p] == pytest.approx(b, abs=1e-12)
            expected = (1 - b) * view.own_weights[p] + b * naive_average(view, p)[0]
            np.testing.assert_allclose(weights[p], expected, rtol=1e-12, atol=1e-12)


def naive_vote(view: PublicView, p: int, x: np.ndarray, vote: str) -> int:
    models = [view.own_weights[p]] + [view.published[k] for k in received_lists(view)[p]]
    margins = np.array([m @ x for m in models])
    if vote == "mean-margin":
        return 1 if margins.sum() >= 0 else -1
    total = np.sign(margins).sum()
    if total == 0:  # a tie goes to the own model (0 margin -> +1)
        return 1 if margins[0] >= 0 else -1
    return 1 if total > 0 else -1


@pytest.mark.parametrize("vote", ["majority", "mean-margin"])
def test_votes_match_per_peer_loop(vote: str) -> None:
    rng = np.random.default_rng(3)
    rule = majority_rule if vote == "majority" else mean_margin_rule
    for _ in range(3):
        view = random_view(rng)
        X = rng.normal(size=(12, 5))
        scores = rule(view).scores(X)
        assert scores.shape == (12, view.n_peers)
        labels = np.where(scores >= 0, 1, -1)
        for p in range(view.n_peers):
            expected = [naive_vote(view, p, x, vote) for x in X]
            np.testing.assert_array_equal(labels[:, p], expected)


def test_view_from_evaluation_ensembles() -> None:
    rng = np.random.default_rng(11)
    view = random_view(rng)
    pairs = np.argwhere(view.receipts.toarray() > 0)
    ensembles = build_ensembles(
        view.own_weights, view.published, view.shared, pairs[:, 0], pairs[:, 1]
    )
    again = PublicView.from_ensembles(ensembles, view.noise_std)
    assert (again.receipts != view.receipts).nnz == 0
    np.testing.assert_array_equal(again.received_counts(), ensembles.sizes() - 1)


def test_majority_ties_go_to_the_own_model_not_the_noisiest() -> None:
    # own model says +1 weakly; one release says -1 with a huge margin: a 1-1 tie
    view = PublicView(
        own_weights=np.array([[0.1, 0.0]]),
        published=np.array([[-100.0, 0.0]]),
        noise_std=np.array([50.0]),
        shared=np.array([True]),
        receipts=sp.csr_matrix((1, 1)),
    )
    x = np.array([[1.0, 0.0]])
    assert majority_rule(view).scores(x)[0, 0] > 0
    # evaluation.py's seed rule breaks it by the summed margin: the noisy model wins
    from p2pdp.learning.evaluation import ensemble_scores

    seed = build_ensembles(view.own_weights, view.published, view.shared, [], [])
    assert ensemble_scores(seed, x, vote="majority")[0, 0] < 0


def synthetic_task(rng: np.random.Generator, n_peers=12, n_rows=40, dim=6):
    truth = rng.normal(size=dim) * 2.5
    X = rng.normal(size=(n_peers * n_rows + 2000, dim))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = np.where(rng.random(len(X)) < 1 / (1 + np.exp(-X @ truth)), 1, -1).astype(np.int8)
    n_train = n_peers * n_rows
    shards = tuple(np.arange(p * n_rows, (p + 1) * n_rows) for p in range(n_peers))
    lam = 0.05
    own = OwnShards(X=X[:n_train], y=y[:n_train], shards=shards, lam=lam)
    local = fit_local_models(X[:n_train], y[:n_train], shards, lam).weights
    central = fit_local_models(X[:n_train], y[:n_train], [np.arange(n_train)], lam).weights[0]
    return own, local, central, X[n_train:], y[n_train:]


def test_cross_validation_matches_sklearn_refits_per_peer() -> None:
    rng = np.random.default_rng(4)
    own, *_ = synthetic_task(rng, n_peers=3, n_rows=17)
    cv = cross_validate_own_models(own, n_folds=3, rng=np.random.default_rng(0))
    for p, shard in enumerate(own.shards):
        mine = cv.peer == p
        assert np.array_equal(np.sort(cv.rows[mine]), np.sort(shard))  # folds cover the shard
        counts = np.bincount(cv.fold[mine], minlength=3)
        assert counts.max() - counts.min() <= 1
        for f in range(3):
            held = mine & (cv.fold == f)
            train = np.setdiff1d(shard, cv.rows[held])
            ref = fit_local_models_sklearn(own.X, own.y, [train], own.lam).weights[0]
            np.testing.assert_allclose(cv.models[p, f], ref, atol=1e-6)
            np.testing.assert_allclose(cv.own_margin[held], own.X[cv.rows[held]] @ ref, atol=1e-6)


def naive_local_validated(view, own, cv, candidates, margin) -> np.ndarray:
    """Per peer: candidates [first, own, rest...], k-fold errors, leave the first if better."""
    out = np.empty_like(view.own_weights)
    for p in range(view.n_peers):
        average, _ = naive_average(view, p)
        betas = [naive_beta(view, p, *candidates[0]), 0.0]
        betas += [naive_beta(view, p, *c) for c in candidates[1:]]
        errors = []
        for b in betas:
            wrong = 0
            for i in np.flatnonzero(cv.peer == p):
                w = (1 - b) * cv.models[p, cv.fold[i]] + b * average
                label = 1 if own.X[cv.rows[i]] @ w >= 0 else -1
                wrong += label != own.y[cv.rows[i]]
            errors.append(wrong)
        choice = 0
        best = min(errors)
        if errors[0] - best > margin:
            choice = errors.index(best)
        b = betas[choice]
        out[p] = (1 - b) * view.own_weights[p] + b * average
    return out


@pytest.mark.parametrize("margin", [0, 1])
def test_local_validated_matches_per_peer_loop(margin: int) -> None:
    rng = np.random.default_rng(5)
    own, local, central, _, _ = synthetic_task(rng, n_peers=8, n_rows=30)
    cv = cross_validate_own_models(own, n_folds=5, rng=np.random.default_rng(1))
    for noise in (0.05, 0.5, 5.0):
        n_models = 6
        published = central + rng.normal(scale=noise, size=(n_models, central.size))
        mask = rng.random((8, n_models)) < 0.5
        view = PublicView(
            own_weights=local,
            published=published,
            noise_std=np.full(n_models, noise),
            shared=np.zeros(n_models, bool),
            receipts=sp.csr_matrix(mask.astype(float)),
        )
        for candidates in (((2.0, 0.2), (0.0, 0.3)), ((4.0, np.inf), (0.0, np.inf), (1.0, 1.0))):
            fast = local_validated_rule(
                view, own, cv=cv, candidates=candidates, margin=margin
            ).weights
            naive = naive_local_validated(view, own, cv, candidates, margin)
            np.testing.assert_allclose(fast, naive, atol=1e-12)


def test_never_hurts_and_helps_where_the_noise_allows() -> None:
    """Noisy releases leave every peer near its own model; clean releases help it.

    Full publication of 10 releases around the centralised model; 8 independent noise draws
    per level, since one draw of the average's noise is shared by every peer.
    """
    rng = np.random.default_rng(6)
    n_peers, n_models = 20, 10
    own, local, central, X_test, y_test = synthetic_task(rng, n_peers=n_peers, n_rows=30)
    cv = cross_validate_own_models(own, rng=np.random.default_rng(2))
    local_error = linear_error(local, X_test, y_test).mean()

    def mean_errors(noise: float, draws: int) -> dict[str, float]:
        errors: dict[str, list[float]] = {}
        for _ in range(draws):
            view = PublicView(
                own_weights=local,
                published=central + rng.normal(scale=noise, size=(n_models, central.size)),
                noise_std=np.full(n_models, noise),
                shared=np.ones(n_models, bool),
                receipts=sp.csr_matrix((n_peers, n_models)),
            )
            rules = {name: apply_rule(name, view, own, cv=cv) for name in ENSEMBLE_RULES}
            rules["plain James-Stein"] = average_rule(view, kappa=0.0, noise_cap=np.inf)
            for name, predictors in rules.items():
                wrong = np.where(predictors.scores(X_test) >= 0, 1, -1) != y_test[:, None]
                errors.setdefault(name, []).append(float(wrong.mean()))
        return {name: float(np.mean(values)) for name, values in errors.items()}

    for noise in (3.0, 10.0, 60.0):
        noisy = mean_errors(noise, draws=8)
        assert noisy["average"] <= local_error + 0.006, (noise, noisy)
        assert noisy["local-validated"] <= local_error + 0.006, (noise, noisy)
        assert noisy["majority"] > local_error + 0.05  # the seed-style vote is hurt
        if noise >= 10:  # MSE-optimal shrinkage alone is not enough for the sign
            assert noisy["plain James-Stein"] > local_error + 0.05
    central_error = linear_error(central, X_test, y_test)[0]
    assert local_error - central_error > 0.03  # there is something to gain
    clean = mean_errors(0.02, draws=1)
    assert clean["average"] <= central_error + 0.005
    assert clean["local-validated"] <= central_error + 0.005


def test_no_releases_means_the_own_model() -> None:
    rng = np.random.default_rng(7)
    own, local, *_ = synthetic_task(rng, n_peers=4, n_rows=20)
    view = PublicView(
        own_weights=local,
        published=np.zeros((0, local.shape[1])),
        noise_std=np.zeros(0),
        shared=np.zeros(0, bool),
        receipts=sp.csr_matrix((4, 0)),
    )
    np.testing.assert_array_equal(average_rule(view).weights, local)
    lv = local_validated_rule(view, own, rng=np.random.default_rng(0)).weights
    np.testing.assert_array_equal(lv, local)


def test_fit_towards_zero_is_the_local_model_and_solves_the_shifted_problem() -> None:
    rng = np.random.default_rng(8)
    own, local, central, _, _ = synthetic_task(rng, n_peers=5, n_rows=25)
    zero = fit_towards(own.X, own.y, own.shards, own.lam, np.zeros_like(local))
    np.testing.assert_allclose(zero, local, atol=1e-7)
    centres = np.tile(central, (5, 1))
    moved = fit_towards(own.X, own.y, own.shards, own.lam, centres)
    for p, shard in enumerate(own.shards):
        _, grad = logistic_objective_gradient(moved[p], own.X[shard], own.y[shard], own.lam)
        # gradient of the shifted objective: the plain gradient minus lam * centre
        assert np.linalg.norm(grad - own.lam * centres[p]) < 1e-7


def test_personalised_refit_helps_with_clean_releases() -> None:
    rng = np.random.default_rng(9)
    own, local, central, X_test, y_test = synthetic_task(rng, n_peers=10, n_rows=30)
    view = PublicView(
        own_weights=local,
        published=central + rng.normal(scale=0.01, size=(3, central.size)),
        noise_std=np.full(3, 0.01),
        shared=np.ones(3, bool),
        receipts=sp.csr_matrix((10, 3)),
    )
    refit = personalised_refit_rule(view, own, rng=np.random.default_rng(0)).weights
    assert linear_error(refit, X_test, y_test).mean() < linear_error(local, X_test, y_test).mean()


def test_registry_and_errors() -> None:
    assert set(ENSEMBLE_RULES) == {"majority", "mean-margin", "average", "local-validated"}
    rng = np.random.default_rng(10)
    view = random_view(rng)
    with pytest.raises(ConfigError, match="evaluation.vote"):
        apply_rule("nope", view)
    with pytest.raises(ConfigError, match="own shards"):
        apply_rule("local-validated", view)
    with pytest.raises(ConfigError, match="noise_std"):
        PublicView(
            own_weights=view.own_weights,
            published=view.published,
            noise_std=-view.noise_std,
            shared=view.shared,
            receipts=view.receipts,
        )
    with pytest.raises(ConfigError, match="receipts"):
        PublicView(
            own_weights=view.own_weights,
            published=view.published,
            noise_std=view.noise_std,
            shared=view.shared,
            receipts=sp.csr_matrix((3, 3)),
        )
    with pytest.raises(ConfigError, match="kappa"):
        shrinkage_weights(view, -1.0)
