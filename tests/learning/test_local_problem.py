"""The iterative protocols step along the configured model's per-record gradients.

:class:`~p2pdp.learning.local_problem.LocalProblem` sums each record's loss gradient clipped to
``C``; the loss is ``training.model``'s (:class:`~p2pdp.learning.models.GradientModel`), so a
second model runs D-PSGD, and a model that declares no gradient is refused by name.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import pytest

from p2pdp import simulate
from p2pdp.core.errors import ComponentError, ConfigError
from p2pdp.core.rng import generator
from p2pdp.learning.local_problem import LocalProblem
from p2pdp.learning.models import GRADIENT_TOLERANCE, LocalModels, LogisticModel
from p2pdp.privacy.clipped_gaussian import ClippedGaussianSum
from tests.conftest import tiny_config

HERE = "tests.learning.test_local_problem"


class LeastSquaresModel:
    """Ridge regression on the labels: loss ``(x.w - y)^2 / 2``, solved in closed form.

    For the iterative protocols only: its loss is not Lipschitz over all ``w``, so it gives the
    output-perturbation mechanisms no sensitivity (``lipschitz`` is a placeholder)."""

    lipschitz = 1.0
    gradient_tolerance = GRADIENT_TOLERANCE
    #: Every ``loss_derivative`` call's record count (the wiring tests read it).
    calls: ClassVar[list[int]] = []

    def fit(
        self, X: np.ndarray, y: np.ndarray, shards: Sequence[np.ndarray], lam: float
    ) -> LocalModels:
        d = X.shape[1]
        weights = np.array(
            [
                np.linalg.solve(X[s].T @ X[s] / len(s) + lam * np.eye(d), X[s].T @ y[s] / len(s))
                for s in shards
            ]
        )
        return LocalModels(
            weights=weights,
            grad_norms=np.zeros(len(shards)),
            iterations=1,
            shard_sizes=np.array([len(s) for s in shards], dtype=np.int64),
        )

    def loss_derivative(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
        LeastSquaresModel.calls.append(len(scores))
        return scores - y


class NoGradientModel:
    """A model for the one-shot protocol only: it declares no per-record gradient."""

    lipschitz = 1.0
    gradient_tolerance = GRADIENT_TOLERANCE

    def fit(
        self, X: np.ndarray, y: np.ndarray, shards: Sequence[np.ndarray], lam: float
    ) -> LocalModels:
        return LogisticModel().fit(X, y, shards, lam)


class WrongShapeModel(LeastSquaresModel):
    """Returns one derivative for all records: it would broadcast into a wrong sum."""

    def loss_derivative(self, scores: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.array([1.0])


def _problem(model, n_peers: int = 5, rows: int = 7, d: int = 3) -> LocalProblem:
    rng = generator(4, "problem")
    X = rng.normal(size=(n_peers * rows, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    y = np.where(rng.random(n_peers * rows) < 0.5, -1.0, 1.0)
    shards = tuple(np.arange(i * rows, (i + 1) * rows) for i in range(n_peers))
    return LocalProblem.from_shards(X, y, shards, lam=0.1, model=model)


def _finite_difference_gradient(loss, w: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of ``loss`` at ``w``, coordinate by coordinate."""
    basis = np.eye(len(w))
    return np.array([(loss(w + h * e) - loss(w - h * e)) / (2 * h) for e in basis])


@pytest.mark.parametrize(
    ("model", "loss"),
    [
        (LeastSquaresModel(), lambda s, y: 0.5 * (s - y) ** 2),
        (LogisticModel(), lambda s, y: math.log1p(math.exp(-y * s))),
    ],
    ids=["least-squares", "logistic"],
)
def test_clipped_sums_are_the_models_record_gradients_clipped_and_summed(model, loss) -> None:
    """Against finite differences of the loss written here, record by record, clipped to C
    (C chosen so that some records are clipped and some not)."""
    problem = _problem(model)
    models = generator(5, "models").normal(size=(problem.n_peers, problem.X.shape[1]))
    clip = 0.6
    mechanism = ClippedGaussianSum(clip_norm=clip, noise_multiplier=0.0)
    expected = np.zeros_like(models)
    clipped = 0
    for peer in range(problem.n_peers):
        for r in range(problem.indptr[peer], problem.indptr[peer + 1]):
            x, y = problem.X[r], float(problem.y[r])
            gradient = _finite_difference_gradient(
                lambda w, x=x, y=y: loss(float(x @ w), y), models[peer]
            )
            norm = np.linalg.norm(gradient)
            clipped += norm > clip
            expected[peer] += gradient * min(1.0, clip / norm)
    assert 0 < clipped < len(problem.y)
    peers = np.arange(problem.n_peers)
    got = problem.clipped_sums(models, peers, mechanism, generator(6, "sampling"))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-8)
    # one peer alone (gossip learning, a peer's machine) sums the same records
    alone = problem.shard(2).clipped_sums(models[2:3], np.array([0]), mechanism, generator(6, "s"))
    np.testing.assert_allclose(alone[0], expected[2], rtol=1e-6, atol=1e-8)


def _dpsgd(model: str, **settings):
    return tiny_config(
        training={"lam": 0.01, "model": model},
        privacy={"mechanism": "gaussian", "epsilon": 4.0, "delta": 1e-5},
        gossip={"degree": 4},
        evaluation={"cv_folds": 2},
        protocol={"name": "dpsgd", "rounds": 6, "eval_every": 3, "clip_norm": 0.5, **settings},
    )


def _column(result, key: str) -> np.ndarray:
    return np.array([row[key] for row in result.round_rows()], dtype=float)


def test_a_second_model_runs_dpsgd_along_its_own_gradients() -> None:
    """``training.model`` names the loss the steps follow: the least-squares model's
    derivative is called for every step, the per-peer machines give the batched rows, and
    the run differs from the logistic model's with the same streams."""
    config = _dpsgd(f"{HERE}:LeastSquaresModel")
    LeastSquaresModel.calls.clear()
    batched = simulate(config)
    assert len(LeastSquaresModel.calls) >= config.protocol.rounds
    reference = simulate(config, driver="reference")
    logistic = simulate(dataclasses.replace(config, training=_dpsgd("logistic").training))
    for key in ("mean_error", "consensus_distance"):  # NaN on rounds without a record
        np.testing.assert_allclose(
            _column(batched, key), _column(reference, key), rtol=1e-9, atol=1e-12, err_msg=key
        )
    assert _column(batched, "consensus_distance")[-1] != pytest.approx(
        _column(logistic, "consensus_distance")[-1], rel=1e-6
    )


def test_the_logistic_model_named_by_import_string_steps_as_the_builtin() -> None:
    """Both names give one class: the same steps, the same rows."""
    builtin = simulate(_dpsgd("logistic"))
    named = simulate(_dpsgd("p2pdp.learning.models:LogisticModel"))
    for key in ("mean_error", "consensus_distance"):
        np.testing.assert_allclose(
            _column(named, key), _column(builtin, key), rtol=1e-12, atol=1e-15, err_msg=key
        )


def test_a_model_without_a_record_gradient_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"training.model = '.*NoGradientModel' \(NoGradient"):
        simulate(_dpsgd(f"{HERE}:NoGradientModel"))


def test_a_plugin_derivative_of_the_wrong_shape_stops_the_run() -> None:
    problem = _problem(WrongShapeModel())
    mechanism = ClippedGaussianSum(clip_norm=1.0, noise_multiplier=0.0)
    models = np.zeros((problem.n_peers, problem.X.shape[1]))
    with pytest.raises(ComponentError, match="loss_derivative returned shape"):
        problem.clipped_sums(models, np.arange(problem.n_peers), mechanism, generator(1, "s"))
