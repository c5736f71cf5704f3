"""The centralised reference at its own cross-validated lambda."""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.data.partition import stratified_folds
from p2pdp.learning.models import fit_local_models_sklearn
from p2pdp.learning.references import centralised_best_lambda


def data(rng: np.random.Generator, n=240, d=5):
    truth = rng.normal(size=d) * 3
    X = rng.normal(size=(n, d))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-X @ truth)), 1, -1).astype(np.int8)
    return X, y


def test_cv_errors_and_choice_match_a_per_fold_sklearn_loop() -> None:
    X, y = data(np.random.default_rng(0))
    lambdas = 2.0 ** np.array([-8, -4, -1, 2])
    result = centralised_best_lambda(
        X, y, lambdas=lambdas, cv_folds=4, rng=np.random.default_rng(1)
    )
    folds = stratified_folds(y, 4, rng=np.random.default_rng(1))  # the same split
    expected = []
    for lam in lambdas:
        wrong = 0
        for train, test in folds:
            w = fit_local_models_sklearn(X, y, [train], lam).weights[0]
            wrong += int(np.sum(np.where(X[test] @ w >= 0, 1, -1) != y[test]))
        expected.append(wrong / len(y))
    np.testing.assert_allclose(result.cv_errors, expected)
    best = np.flatnonzero(np.isclose(expected, min(expected)))
    assert result.lam == lambdas[best].max()  # the largest lambda among the best
    refit = fit_local_models_sklearn(X, y, [np.arange(len(y))], result.lam).weights[0]
    np.testing.assert_allclose(result.weights, refit, atol=1e-6)


def test_heavy_regularisation_loses_and_is_not_chosen() -> None:
    X, y = data(np.random.default_rng(2))
    lambdas = np.array([1e-3, 1e3])  # 1e3 shrinks the model to ~0: near-chance error
    result = centralised_best_lambda(
        X, y, lambdas=lambdas, cv_folds=3, rng=np.random.default_rng(0)
    )
    assert result.lam == 1e-3
    assert result.cv_errors[0] < result.cv_errors[1]


def test_bad_grid() -> None:
    X, y = data(np.random.default_rng(3))
    with pytest.raises(ConfigError, match="lambdas"):
        centralised_best_lambda(X, y, lambdas=np.array([0.1, -1.0]), rng=np.random.default_rng(0))
