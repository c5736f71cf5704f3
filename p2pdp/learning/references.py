"""Honest reference lines: the non-private centralised model at its own best lambda.

The simulator's ``centralized_error`` fits all training rows at the *peers'* lambda, which is
chosen for shards of ~40 rows and over-regularises a model that sees every row. The real
ceiling a user should compare against is the centralised model at the lambda that suits it,
chosen by cross-validation on the training fold only (never on the test rows). This is a
non-private reference: it reads every training row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from p2pdp.core.errors import ConfigError
from p2pdp.data.partition import stratified_folds
from p2pdp.learning.models import fit_local_models

__all__ = ["LAMBDA_GRID", "CentralisedReference", "centralised_best_lambda"]

#: Candidate lambdas: powers of two from 2^-20 to 2^0.
LAMBDA_GRID: np.ndarray = 2.0 ** np.arange(-20, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class CentralisedReference:
    """Result of :func:`centralised_best_lambda`.

    ``lam`` the chosen lambda; ``weights`` (d,) the model refitted on all training rows at it;
    ``cv_errors`` (len(lambdas),) mean held-out error of each candidate; ``lambdas`` the grid.
    """

    lam: float
    weights: np.ndarray
    cv_errors: np.ndarray
    lambdas: np.ndarray


def centralised_best_lambda(
    X_train: np.ndarray,
    y_train: np.ndarray,
    *,
    lambdas: np.ndarray = LAMBDA_GRID,
    cv_folds: int = 10,
    rng: np.random.Generator,
) -> CentralisedReference:
    """Centralised L2-regularised logistic regression at its own cross-validated lambda.

    Stratified ``cv_folds``-fold cross validation on the training rows only; the lambda with
    the lowest mean held-out error wins (the largest such lambda on ties, the simpler model);
    the model is then refitted on all training rows. Each candidate lambda is one batched
    :func:`p2pdp.learning.models.fit_local_models` call over the folds' training parts.

    Parameters
    ----------
    X_train : (N, d) array
    y_train : (N,) array of {-1, +1}
    lambdas : 1-D array of lambdas > 0
    cv_folds : int, >= 2
    rng : numpy.random.Generator
        Draws the fold split.
    """
    lambdas = np.asarray(lambdas, dtype=np.float64).reshape(-1)
    if lambdas.size == 0 or np.any(~(lambdas > 0)):
        raise ConfigError(f"lambdas must be a non-empty list of values > 0, got {lambdas!r}")
    X = np.asarray(X_train, dtype=np.float64)
    y = np.asarray(y_train)
    folds = stratified_folds(y, cv_folds, rng=rng)
    errors = np.empty(lambdas.size)
    for i, candidate in enumerate(lambdas):
        models = fit_local_models(X, y, [train for train, _ in folds], float(candidate)).weights
        wrong = sum(
            int(np.count_nonzero(np.where(X[test] @ w >= 0, 1, -1) != y[test]))
            for w, (_, test) in zip(models, folds, strict=True)
        )
        errors[i] = wrong / len(y)
    best = np.flatnonzero(errors == errors.min())
    choice = int(best[np.argmax(lambdas[best])])
    lam = float(lambdas[choice])
    weights = fit_local_models(X, y, [np.arange(len(y))], lam).weights[0]
    return CentralisedReference(lam=lam, weights=weights, cv_errors=errors, lambdas=lambdas)
