"""Tests of p2pdp.learning.models: exact batched local training against the scikit-learn
reference."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import check_grad
from scipy.special import expit

from p2pdp.core.errors import ConfigError, P2PDPError
from p2pdp.core.parallel import local_workers
from p2pdp.learning.models import (
    LocalModels,
    fit_local_models,
    fit_local_models_sklearn,
    logistic_objective_gradient,
)
from p2pdp.learning.newton import block_hessian, block_sums, newton_from_block_sums, sums_of_block

TOL = 1e-9


def unit_ball_rows(n: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian features plus bias, rows scaled into the unit ball; noisy linear labels."""
    X = np.hstack([rng.normal(size=(n, d - 1)), np.ones((n, 1))])
    X /= np.linalg.norm(X, axis=1, keepdims=True) * rng.uniform(1.0, 2.0, size=(n, 1))
    y = np.where(X @ rng.normal(scale=4.0, size=d) + rng.logistic(size=n) > 0, 1.0, -1.0)
    return X, y


def spambase_like_rows(n: int, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sparse, heavy-tailed non-negative counts -> log1p, min-max, bias, unit-ball projection."""
    raw = rng.lognormal(sigma=2.0, size=(n, d - 1)) * (rng.random((n, d - 1)) < 0.25)
    y = np.where(raw[:, : (d - 1) // 2].sum(1) > raw[:, (d - 1) // 2 :].sum(1), 1.0, -1.0)
    y[rng.random(n) < 0.1] *= -1
    features = np.log1p(raw)
    features = (features - features.min(0)) / np.maximum(np.ptp(features, axis=0), 1e-12)
    X = np.hstack([features, np.ones((n, 1))])
    return X / np.maximum(np.linalg.norm(X, axis=1), 1.0)[:, None], y


def unequal_shards(n_rows: int, sizes: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Disjoint random shards with the given sizes."""
    cuts = np.cumsum(sizes)[:-1]
    return np.split(rng.permutation(n_rows)[: sizes.sum()], cuts)


def gradient_norms(models: LocalModels, X, y, shards, lam) -> np.ndarray:
    return np.array(
        [
            np.linalg.norm(logistic_objective_gradient(w, X[s], y[s], lam)[1])
            for w, s in zip(models.weights, shards, strict=True)
        ]
    )


@pytest.mark.parametrize("d", [58, 124])
@pytest.mark.parametrize("rows", [unit_ball_rows, spambase_like_rows])
@pytest.mark.parametrize("lam", [1e-2, 1e-3])
def test_matches_sklearn_on_unequal_shards(d, rows, lam):
    rng = np.random.default_rng(d)
    # sizes on both sides of d: the dual (n < d) and the primal (n >= d) Newton forms
    sizes = np.concatenate([rng.integers(1, d, size=14), rng.integers(d, 3 * d, size=6)])
    X, y = rows(int(sizes.sum()) + 50, d, rng)
    shards = unequal_shards(X.shape[0], rng.permutation(sizes), rng)

    batched = fit_local_models(X, y, shards, lam)
    reference = fit_local_models_sklearn(X, y, shards, lam)

    assert batched.weights.shape == (len(shards), d)
    assert np.abs(batched.weights - reference.weights).max() <= 1e-6
    assert batched.grad_norms.max() <= TOL
    np.testing.assert_allclose(
        batched.grad_norms, gradient_norms(batched, X, y, shards, lam), rtol=0, atol=1e-14
    )
    np.testing.assert_array_equal(batched.shard_sizes, [len(s) for s in shards])
    assert 1 <= batched.iterations <= 50


@pytest.mark.parametrize("lam", [1e-3, 1e-4])
def test_tiny_separable_shards_and_small_lambda_converge(lam):
    rng = np.random.default_rng(7)
    X, y = unit_ball_rows(400, 58, rng)
    sizes = np.tile([1, 2, 3], 40)  # tiny shards are linearly separable (many single-class)
    shards = unequal_shards(X.shape[0], sizes, rng)

    batched = fit_local_models(X, y, shards, lam)
    reference = fit_local_models_sklearn(X, y, shards, lam)

    true_norms = gradient_norms(batched, X, y, shards, lam)
    assert true_norms.max() <= TOL
    # strong convexity: ||w - w*|| <= ||grad J(w)|| / lam for both solutions
    distance = np.linalg.norm(batched.weights - reference.weights, axis=1)
    assert np.all(distance <= (true_norms + reference.grad_norms) / lam + 1e-12)
    # one row: w* = t y x with t > 0 (the minimiser lies in the span of the rows)
    for w, shard in zip(batched.weights, shards, strict=True):
        if len(shard) == 1:
            t = w @ (y[shard[0]] * X[shard[0]]) / (X[shard[0]] @ X[shard[0]])
            assert t > 0
            np.testing.assert_allclose(w, t * y[shard[0]] * X[shard[0]], atol=1e-12)


def test_replacing_one_record_moves_model_within_sensitivity():
    """The privacy-critical property: ||w(D) - w(D')|| <= 2 / (n lam) for neighbouring shards."""
    rng = np.random.default_rng(11)
    lam, n = 1e-2, 30
    X, y = unit_ball_rows(2 * 200 * n, 58, rng)
    shards = list(np.arange(200 * n).reshape(200, n))
    neighbours = [np.append(s[:-1], 200 * n + j) for j, s in enumerate(shards)]  # replace one
    moved = np.linalg.norm(
        fit_local_models(X, y, shards, lam).weights
        - fit_local_models(X, y, neighbours, lam).weights,
        axis=1,
    )
    assert moved.max() <= 2 / (n * lam) + 2 * TOL / lam
    assert moved.max() > 0.1 * 2 / (n * lam)  # the bound is not vacuous for these data


def test_chunking_and_per_peer_give_identical_results():
    rng = np.random.default_rng(3)
    X, y = spambase_like_rows(3000, 58, rng)
    sizes = rng.choice([3, 40, 90], size=40)  # several peers per size: real batches of each form
    shards = unequal_shards(X.shape[0], sizes, rng)
    whole = fit_local_models(X, y, shards, 1e-3)
    for other in (
        fit_local_models(X, y, shards, 1e-3, method="batched"),
        fit_local_models(X, y, shards, 1e-3, chunk_size=1),
        fit_local_models(X, y, shards, 1e-3, chunk_size=3),
        fit_local_models(X, y, shards, 1e-3, method="per_peer"),
    ):
        np.testing.assert_array_equal(other.weights, whole.weights)
        np.testing.assert_array_equal(other.grad_norms, whole.grad_norms)


def test_deterministic_and_independent_of_other_peers():
    rng = np.random.default_rng(5)
    X, y = unit_ball_rows(2000, 58, rng)
    shards = unequal_shards(X.shape[0], rng.integers(1, 100, size=30), rng)
    first = fit_local_models(X, y, shards, 1e-3)
    second = fit_local_models(X, y, shards, 1e-3)
    np.testing.assert_array_equal(first.weights, second.weights)
    order = rng.permutation(len(shards))
    permuted = fit_local_models(X, y, [shards[k] for k in order], 1e-3)
    np.testing.assert_array_equal(permuted.weights, first.weights[order])


def test_large_shards_match_sklearn():
    rng = np.random.default_rng(9)
    X, y = spambase_like_rows(5000, 58, rng)
    shards = unequal_shards(X.shape[0], np.array([2500, 2400]), rng)
    models = fit_local_models(X, y, shards, 1e-3)
    reference = fit_local_models_sklearn(X, y, shards, 1e-3)
    assert models.grad_norms.max() <= TOL
    assert np.abs(models.weights - reference.weights).max() <= 1e-6


@pytest.mark.parametrize("rows", [unit_ball_rows, spambase_like_rows])
@pytest.mark.parametrize("block", [700, 1200, 3000])  # several blocks (a short last), two, one
def test_a_streamed_large_shard_matches_the_batched_solver(rows, block, monkeypatch):
    """The centralised reference on a large data set is solved block by block (no copy of the
    shard): the same minimiser to the certified tolerance for any block size."""
    from p2pdp.learning import newton

    rng = np.random.default_rng(11)
    X, y = rows(3000, 58, rng)
    shards = [np.arange(3000), rng.permutation(3000)[:1200], np.arange(40)]
    batched = fit_local_models(X, y, shards, 1e-3)
    blocks, block_sums = set(), newton._block_sums

    def recording(problem, item):
        blocks.add((len(problem[2]), len(problem[2][item[0] : item[0] + problem[3]])))
        return block_sums(problem, item)

    monkeypatch.setattr(newton, "_block_sums", recording)
    streamed = fit_local_models(X, y, shards, 1e-3, stream_min_rows=1000, stream_block=block)
    # the two large shards read in blocks of ``block`` rows (a short last), the small batched
    expected = {(n, min(block, n - start)) for n in (3000, 1200) for start in range(0, n, block)}
    assert blocks == expected
    assert streamed.grad_norms.max() <= TOL
    np.testing.assert_array_less(gradient_norms(streamed, X, y, shards, 1e-3), TOL)
    # both within tol / lam of the exact minimiser (strong convexity): within 2 tol / lam
    assert np.abs(streamed.weights - batched.weights).max() <= 2 * TOL / 1e-3
    np.testing.assert_array_equal(streamed.weights[2], batched.weights[2])  # small: batched
    with pytest.raises(P2PDPError, match=r"max_iter=1 .*worst peer 0 has gradient norm"):
        fit_local_models(X, y, shards[:1], 1e-4, max_iter=1)


@pytest.mark.parametrize("setting", ["stream_min_rows", "stream_block"])
def test_stream_sizes_are_positive_integers(setting):
    X, y = unit_ball_rows(20, 3, np.random.default_rng(1))
    with pytest.raises(ConfigError, match=rf"{setting} must be an integer >= 1, got 0"):
        fit_local_models(X, y, [np.arange(20)], 1e-3, **{setting: 0})


def test_local_processes_give_bitwise_identical_models():
    rng = np.random.default_rng(12)
    X, y = spambase_like_rows(4000, 58, rng)
    shards = unequal_shards(X.shape[0], rng.integers(5, 80, size=60), rng)
    alone = fit_local_models(X, y, shards, 1e-3, chunk_size=7)  # many batches
    with local_workers(3):
        forked = fit_local_models(X, y, shards, 1e-3, chunk_size=7)
    np.testing.assert_array_equal(forked.weights, alone.weights)
    np.testing.assert_array_equal(forked.grad_norms, alone.grad_norms)
    assert forked.iterations == alone.iterations
    with pytest.raises(ConfigError, match="workers must be an integer >= 1, got 0"):
        fit_local_models(X, y, shards, 1e-3, workers=0)


def test_non_convergence_names_worst_peer():
    rng = np.random.default_rng(1)
    X, y = unit_ball_rows(200, 58, rng)
    shards = unequal_shards(X.shape[0], np.array([5, 60, 20]), rng)
    with pytest.raises(P2PDPError, match=r"max_iter=1 .*worst peer \d+ has gradient norm"):
        fit_local_models(X, y, shards, 1e-4, max_iter=1)


def test_objective_gradient_is_correct_and_stable():
    rng = np.random.default_rng(2)
    X, y = unit_ball_rows(25, 10, rng)
    w = rng.normal(size=10)
    value, gradient = logistic_objective_gradient(w, X, y, 0.1)
    naive = np.mean(np.log1p(np.exp(-y * (X @ w)))) + 0.05 * w @ w
    assert value == pytest.approx(naive, rel=1e-12)
    error = check_grad(
        lambda v: logistic_objective_gradient(v, X, y, 0.1)[0],
        lambda v: logistic_objective_gradient(v, X, y, 0.1)[1],
        w,
    )
    assert error < 1e-6 * np.linalg.norm(gradient) + 1e-7
    with np.errstate(all="raise"):  # margins of +-1e4: no overflow, finite value
        value, gradient = logistic_objective_gradient(1e4 * X[0], X[:2], np.array([-1.0, 1.0]), 1)
    assert np.isfinite(value) and np.all(np.isfinite(gradient))


def _inputs():
    rng = np.random.default_rng(0)
    X, y = unit_ball_rows(20, 4, rng)
    return X, y, [np.arange(10), np.arange(10, 20)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda X, y, s: (X, y, s, 0.0, {}), "lam must be > 0 and finite, got 0.0"),
        (lambda X, y, s: (X, y, s, -1.0, {}), "lam must be > 0 and finite, got -1.0"),
        (lambda X, y, s: (X, y, s, float("nan"), {}), "lam must be > 0 and finite, got nan"),
        (lambda X, y, s: (X, y, s, float("inf"), {}), "lam must be > 0 and finite, got inf"),
        (lambda X, y, s: (X, y, [s[0], np.array([], int)], 1.0, {}), r"shards\[1\] must be"),
        (lambda X, y, s: (X, y, [], 1.0, {}), "shards must hold at least one peer, got 0"),
        (lambda X, y, s: (X, y, [np.array([0, 20])], 1.0, {}), "row index 20, out of range"),
        (lambda X, y, s: (X, y, [np.array([-1, 2])], 1.0, {}), "row index -1, out of range"),
        (  # in a later chunk of range-checked shards: the message names the shard
            lambda X, y, s: (X, y, [np.array([1])] * 5000 + [np.array([3, 21])], 1.0, {}),
            r"shards\[5000\] holds row index 21, out of range",
        ),
        (lambda X, y, s: (X, y, [np.array([0.0, 1.0])], 1.0, {}), r"shards\[0\].*float64"),
        (lambda X, y, s: (X, np.r_[y[:-1], 0.0], s, 1.0, {}), "y must contain only -1 and \\+1"),
        (lambda X, y, s: (X, (y + 1) / 2, s, 1.0, {}), "-1 and \\+1, got 0.0"),
        (lambda X, y, s: (X, y[:-1], s, 1.0, {}), r"y must have shape \(20,\).*\(19,\)"),
        (lambda X, y, s: (X[:, 0], y, s, 1.0, {}), r"X must be a non-empty 2-D array.*\(20,\)"),
        (lambda X, y, s: (np.where(X > 0.3, np.nan, X), y, s, 1.0, {}), "X must .* NaN"),
        (lambda X, y, s: (X, y, s, 1.0, {"method": "lbfgs"}), "method must be one of .*lbfgs"),
        (lambda X, y, s: (X, y, s, 1.0, {"chunk_size": 0}), "chunk_size must be >= 1, got 0"),
        (lambda X, y, s: (X, y, s, 1.0, {"tol": 0.0}), "tol must be > 0 and finite, got 0.0"),
        (lambda X, y, s: (X, y, s, 1.0, {"max_iter": 0}), "max_iter must be >= 1, got 0"),
    ],
)
def test_bad_inputs_raise_config_error(change, message):
    X, y, shards, lam, options = change(*_inputs())
    with pytest.raises(ConfigError, match=message):
        fit_local_models(X, y, shards, lam, **options)
    if not options:
        with pytest.raises(ConfigError, match=message):
            fit_local_models_sklearn(X, y, shards, lam)


def test_converges_on_badly_scaled_rows():
    """Rows of norm up to 1e3 (allowed: only the privacy bound needs ||x|| <= 1) and mixed
    labels make undamped Newton oscillate or diverge; the line search must still converge."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(1000, 4)) * 10 ** rng.uniform(-2, 3, size=(1000, 1))
    y = np.where(rng.random(1000) < 0.5, 1.0, -1.0)
    shards = np.array_split(np.arange(1000), 200)
    for lam in (1e-2, 1e-6):
        models = fit_local_models(X, y, shards, lam)
        assert gradient_norms(models, X, y, shards, lam).max() <= TOL


def test_the_streamed_newton_asks_for_a_hessian_only_where_a_step_needs_it():
    """newton_from_block_sums asks for the Hessian sums once per Newton step, at the point
    the step starts from, never at the last point nor at a rejected trial; its steps and
    model are those of a Newton that sums the Hessian at every point it visits (as it did
    before), and the gradient is certified."""
    rng = np.random.default_rng(14)
    X, y = spambase_like_rows(5000, 58, rng)
    y = y.astype(np.float64)
    n, d, lam = X.shape[0], X.shape[1], 1e-3
    starts = range(0, n, 700)
    asked = []

    def sums(w, hessian):
        asked.append(hessian)
        return [sums_of_block(X[a : a + 700], y[a : a + 700], w, hessian) for a in starts]

    w, norm, steps = newton_from_block_sums(sums, n, d, lam, TOL, 50, 0)
    assert norm <= TOL and steps >= 2
    assert asked.count(True) == steps and asked[-1] is False
    assert len(asked) == 2 * steps + 1  # no line search backtracked here

    def every_point(v):  # the gradient and Hessian sums at v, in block order
        gradient, hessian = np.zeros(d), np.zeros((d, d))
        for block, curvature in zip(sums(v, False), sums(v, True), strict=True):
            gradient, hessian = gradient + block[1], hessian + curvature
        return gradient / n + lam * v, hessian / n + lam * np.eye(d)

    v = np.zeros(d)
    gradient, hessian = every_point(v)
    for _ in range(steps):  # full steps: what the solver took above
        v = v - np.linalg.solve(hessian, gradient)
        gradient, hessian = every_point(v)
    np.testing.assert_allclose(w, v, rtol=1e-12, atol=1e-15)
    assert np.linalg.norm(gradient) <= TOL


def test_a_block_hessian_is_the_weighted_gram_matrix_exactly_symmetric():
    """block_hessian (symmetric rank-k updates over chunks of rows, the last one partial)
    is sum_i s_i x_i x_i^T with s_i = expit(m_i) expit(-m_i), exactly symmetric; block_sums
    gives the loss and gradient sums over the same chunks."""
    rng = np.random.default_rng(15)
    X, y = spambase_like_rows(2 * 1024 + 300, 58, rng)  # two chunks and a part
    y = y.astype(np.float64)
    w = rng.normal(size=58)
    margins = y * (X @ w)
    weights = expit(margins) * expit(-margins)
    hessian = block_hessian(X, w)
    np.testing.assert_allclose(hessian, (X.T * weights) @ X, rtol=1e-12, atol=1e-12)
    assert np.array_equal(hessian, hessian.T)
    loss, gradient = block_sums(X, y, w)
    assert loss == pytest.approx(np.logaddexp(0.0, -margins).sum(), rel=1e-12)
    np.testing.assert_allclose(gradient, (-y * expit(-margins)) @ X, rtol=1e-12, atol=1e-12)


def test_the_streamed_reference_does_not_depend_on_the_number_of_workers():
    """The centralised reference's blockwise gradient and Hessian sums are computed in the
    local workers and added in block order: the same model with 1 or 3 workers, and the
    one-process batched solve's minimiser within the certified tolerance."""
    rng = np.random.default_rng(13)
    X, y = spambase_like_rows(5000, 58, rng)
    everyone = [np.arange(5000)]
    batched = fit_local_models(X, y, everyone, 1e-3)
    stream = {"stream_min_rows": 1000, "stream_block": 700}  # 8 blocks, a short last
    alone = fit_local_models(X, y, everyone, 1e-3, workers=1, **stream)
    forked = fit_local_models(X, y, everyone, 1e-3, workers=3, **stream)
    np.testing.assert_allclose(forked.weights, alone.weights, rtol=1e-12, atol=1e-15)
    assert forked.iterations == alone.iterations
    np.testing.assert_array_less(gradient_norms(forked, X, y, everyone, 1e-3), TOL)
    assert np.abs(forked.weights - batched.weights).max() <= 2 * TOL / 1e-3


def test_local_models_are_the_same_fitted_here_in_forked_workers_or_on_other_machines():
    """Forked workers write each batch's models into shared memory (nothing pickled back);
    in this process, into the result; on other machines (``remote_workers``: each item
    computed on its own copy of the problem) they come back as values: the same models."""
    import pickle

    from p2pdp.core.parallel import is_shared, remote_workers

    rng = np.random.default_rng(21)
    X, y = spambase_like_rows(600, 12, rng)
    sizes = [20, 9] * 15  # two shard sizes: batches of 4 peers of one size, a short last
    shards = [
        np.arange(start, start + size) for start, size in zip(range(0, 600, 20), sizes, strict=True)
    ]

    def elsewhere(function, shared, items):
        return [function(pickle.loads(pickle.dumps(shared)), item) for item in items]

    here = fit_local_models(X, y, shards, 1e-2, chunk_size=4, workers=1)
    forked = fit_local_models(X, y, shards, 1e-2, chunk_size=4, workers=2)
    with remote_workers(elsewhere, 2):
        remote = fit_local_models(X, y, shards, 1e-2, chunk_size=4)
    assert is_shared(forked.weights) and not is_shared(here.weights)
    for models in (forked, remote):
        np.testing.assert_allclose(models.weights, here.weights, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(models.grad_norms, here.grad_norms, rtol=1e-9, atol=1e-15)
        assert models.iterations == here.iterations
    np.testing.assert_array_less(here.grad_norms, TOL)
