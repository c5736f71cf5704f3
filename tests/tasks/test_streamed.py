"""A large synthetic training drawn, fitted and dropped block by block (issue 43): the
in-memory training's models, centralised model and test rows, without its rows."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from p2pdp.core.parallel import local_workers
from p2pdp.data import synthetic
from p2pdp.data.partition import contiguous_starts
from p2pdp.data.preprocess import Preprocessor
from p2pdp.data.synthetic import (
    SYNTHETIC_BLOCK_ROWS,
    synthetic_block,
    synthetic_block_bounds,
    synthetic_block_features,
    synthetic_block_logged,
)
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import parse_scenario
from p2pdp.learning.evaluation import linear_error
from p2pdp.learning.newton import STREAM_MIN_ROWS, newton_from_block_sums, sums_of_block
from p2pdp.tasks import pipeline, streamed
from p2pdp.tasks.streamed import stream_gap

ROWS, TEST_ROWS, PEERS, FEATURES = 200_003, 2_000, 15_000, 5

#: 4 blocks of training rows (the last one short, with the test rows after it), shards of 13
#: or 14 rows, so a shard straddles every inner block boundary.
SCENARIO = f"""
name = "in_blocks"
seed = 5

[data]
dataset = "synthetic"
synthetic_rows = {ROWS}
synthetic_test_rows = {TEST_ROWS}
synthetic_features = {FEATURES}

[partition]
n_peers = {PEERS}
scheme = "contiguous"

[groups]
group_size = 10

[publication]
mode = "full"

[evaluation]
split = "fixed"
"""


def config(*overrides: str):
    return parse_scenario(SCENARIO, overrides=list(overrides)).config


@pytest.fixture(scope="module")
def in_memory():
    return pipeline.train_in_memory(config(), fold=0)


def test_the_scenario_straddles_blocks() -> None:
    starts = contiguous_starts(ROWS, PEERS)
    crossing = (starts[:-1] // SYNTHETIC_BLOCK_ROWS) != ((starts[1:] - 1) // SYNTHETIC_BLOCK_ROWS)
    assert crossing.sum() == ROWS // SYNTHETIC_BLOCK_ROWS  # every inner boundary
    assert ROWS >= STREAM_MIN_ROWS and stream_gap(config()) is None


def test_other_trainings_stay_in_memory_and_say_why() -> None:
    assert stream_gap(config("partition.scheme=iid")) == (
        "partition.scheme = 'iid' (the plan in blocks needs 'contiguous')"
    )
    assert "data.synthetic_rows = 1000" in stream_gap(config("data.synthetic_rows=1000"))
    assert "evaluation.split = 'cv'" in stream_gap(config("evaluation.split=cv"))


def errors_of(models: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Misclassified test rows of each model: integers, compared exactly."""
    return np.rint(linear_error(models, X, y) * len(y)).astype(np.int64)


@pytest.mark.parametrize(("workers", "kept"), [(1, None), (2, None), (2, 2)])
def test_the_training_in_blocks_is_the_in_memory_one(in_memory, workers, kept, monkeypatch) -> None:
    """Every local model (straddling shards included), gradient norm, shard size, the
    centralised model and the test rows are the in-memory training's (the same blocks, the
    same per-shard solves, the reference's block sums added in block order), whether its
    later passes read kept blocks (all of them by default here, the first 2 of 4 with
    ``kept = 2``) or draw them again: the models' test errors are the same integers; and no
    training row is drawn in one piece."""

    def whole(*args, **kwargs):
        raise AssertionError("the training rows were drawn in one piece")

    monkeypatch.setattr(synthetic, "make_synthetic", whole)
    if kept is not None:
        monkeypatch.setattr(
            streamed, "KEPT_ROWS_BYTES", kept * 8 * (FEATURES + 2) * SYNTHETIC_BLOCK_ROWS
        )
    with local_workers(workers):
        trained = pipeline.prepare_peers(config(), fold=0)
    assert trained.fold.X_train.shape[0] == 0 and trained.shards == ()
    assert trained.key == in_memory.key
    np.testing.assert_array_equal(trained.models.shard_sizes, in_memory.models.shard_sizes)
    assert trained.models.iterations == in_memory.models.iterations
    np.testing.assert_allclose(trained.models.weights, in_memory.models.weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(trained.models.grad_norms, in_memory.models.grad_norms, atol=1e-15)
    np.testing.assert_allclose(trained.centralized, in_memory.centralized, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(trained.fold.y_test, in_memory.fold.y_test)
    np.testing.assert_allclose(trained.fold.X_test, in_memory.fold.X_test, rtol=0, atol=1e-15)
    X, y = in_memory.fold.X_test, in_memory.fold.y_test
    for mine, theirs in (
        (trained.models.weights, in_memory.models.weights),
        (trained.centralized[None, :], in_memory.centralized[None, :]),
    ):
        np.testing.assert_array_equal(errors_of(mine, X, y), errors_of(theirs, X, y))
    assert trained.fold.data_dependent_bounds and in_memory.fold.data_dependent_bounds


def test_a_reader_of_the_rows_gets_them_loaded_again(in_memory) -> None:
    trained = pipeline.prepare_peers(config(), fold=0)
    fold, shards = trained.training_rows()
    assert trained.training_rows()[0] is fold  # loaded once
    assert len(shards) == PEERS
    for mine, theirs in zip(shards, in_memory.shards, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_array_equal(fold.y_train, in_memory.fold.y_train)
    np.testing.assert_allclose(fold.X_train, in_memory.fold.X_train, rtol=0, atol=1e-15)
    assert in_memory.training_rows() == (in_memory.fold, in_memory.shards)


@pytest.mark.parametrize("block", [0, 3, 4])
def test_the_bounds_of_a_block_are_those_of_its_rows(block) -> None:
    """min and max are exact, and the C library's exp is the one numpy's lognormal calls:
    the extremes drawn without the exp of every entry are the rows' own."""
    seed_seq = np.random.SeedSequence(7)
    n_total = 4 * SYNTHETIC_BLOCK_ROWS + 10
    n_rows = 3 * SYNTHETIC_BLOCK_ROWS + 5  # block 3: 5 training rows; block 4: none
    X, _ = synthetic_block(seed_seq, block, n_total=n_total, n_features=FEATURES)
    bounds = synthetic_block_bounds(
        seed_seq, block, n_total=n_total, n_features=FEATURES, n_rows=n_rows
    )
    training = X[: max(0, n_rows - block * SYNTHETIC_BLOCK_ROWS)]
    if len(training) == 0:
        assert bounds is None
        return
    assert bounds is not None
    np.testing.assert_array_equal(bounds[0], training.min(axis=0))  # not computed by SIMD
    np.testing.assert_array_equal(bounds[1], training.max(axis=0))


def test_a_block_logged_is_transformed_as_the_raw_block() -> None:
    seed_seq = np.random.SeedSequence(8)
    X, logged, y = synthetic_block_logged(seed_seq, 1, n_total=70_000, n_features=FEATURES)
    again, labels = synthetic_block(seed_seq, 1, n_total=70_000, n_features=FEATURES)
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_allclose(logged, np.log1p(again), rtol=1e-15)
    fitted = Preprocessor().fit(X)
    np.testing.assert_allclose(fitted.transform_logged(logged), fitted.transform(X), atol=1e-15)
    with pytest.raises(Exception, match="log1p"):
        Preprocessor(steps=("minmax", "bias")).fit(X).transform_logged(logged)


@pytest.mark.slow
def test_a_vote_on_the_own_rows_reads_them_loaded_again(in_memory) -> None:
    """A local-validated vote (the peers' own rows and k-fold refits) after a training in
    blocks gives the in-memory training's row."""
    cell = config("evaluation.vote=local-validated")
    streamed = simulate(cell, trained=pipeline.prepare_peers(cell, fold=0))
    whole = simulate(cell, trained=in_memory)
    assert streamed.evaluation.summary() == whole.evaluation.summary()


@pytest.mark.parametrize("kept", [None, 2])
def test_the_reference_draws_again_only_the_blocks_not_kept(kept, monkeypatch) -> None:
    """The bounds' pass draws the block with test rows whole and the fits' pass the 4
    training blocks; the reference's later passes (one at each Newton step's point but the
    last, whose gradient a bound certifies: 2 here) draw no block when every one is kept,
    and only the features of the 2 not kept otherwise (their labels kept by the fits' pass)."""
    calls, features = [], []

    def counted(*args, **kwargs):
        calls.append(args[1])
        return synthetic_block_logged(*args, **kwargs)

    def counted_features(*args, **kwargs):
        features.append(args[1])
        return synthetic_block_features(*args, **kwargs)

    monkeypatch.setattr(streamed, "synthetic_block_logged", counted)
    monkeypatch.setattr(streamed, "synthetic_block_features", counted_features)
    if kept is not None:
        monkeypatch.setattr(
            streamed, "KEPT_ROWS_BYTES", kept * 8 * (FEATURES + 2) * SYNTHETIC_BLOCK_ROWS
        )
    pipeline.prepare_peers(config(), fold=0)
    assert calls == [3, 0, 1, 2, 3]
    if kept is None:
        assert features == []
    else:
        assert len(features) >= 4 and features == [2, 3] * (len(features) // 2)


def test_a_block_s_features_are_those_of_its_rows() -> None:
    """The features drawn without the labels are the block's (the same stream, the labels
    drawn after them)."""
    seed_seq = np.random.SeedSequence(11)
    for block in (0, 2):
        X, logged, _ = synthetic_block_logged(seed_seq, block, n_total=150_000, n_features=4)
        X2, logged2 = synthetic_block_features(seed_seq, block, n_total=150_000, n_features=4)
        np.testing.assert_array_equal(X2, X)  # the same draws: exact
        np.testing.assert_allclose(logged2, logged, rtol=1e-15, atol=0)


@pytest.mark.parametrize("most", [PEERS, PEERS - 1])
def test_the_reference_s_passes_run_beside_the_simulation_up_to_a_peer_count(
    in_memory, most, monkeypatch
) -> None:
    """With 2 workers and at most BACKGROUND_MAX_PEERS peers, the training returns with the
    reference's later passes still running in a background process (the simulation leaves
    it a core); beyond that, solved before it returns; the same model either way."""
    monkeypatch.setattr(streamed, "BACKGROUND_MAX_PEERS", most)
    with local_workers(2):
        trained = streamed.train_in_blocks(config(), fold=0)
    background = not isinstance(trained.centralized, np.ndarray)
    assert background == (PEERS <= most)
    centralized = trained.centralized.result() if background else trained.centralized
    np.testing.assert_allclose(centralized, in_memory.centralized, rtol=0, atol=1e-12)
    with local_workers(1):  # one worker: nothing runs beside
        assert isinstance(streamed.train_in_blocks(config(), fold=0).centralized, np.ndarray)


@pytest.mark.parametrize("background", [True, False])
def test_the_pass_beside_holds_every_block_s_sums(background, monkeypatch) -> None:
    """The reference's pass beside the simulation, its blocks taken one at a time by the
    background process and by this one when it reads the model (here: all of them when the
    background takes none), holds every block's sums at its point, those of the pool's
    pieces (to 1e-12: the Newton after it converges to the same model even from a wrong
    Hessian, so the model alone would not tell)."""
    if not background:  # a background process that takes no block: this one takes them all
        monkeypatch.setattr(streamed, "in_background", lambda function, shared, *, what: 0)
    with local_workers(2):
        beside = streamed.train_in_blocks(config(), fold=0).centralized
    assert isinstance(beside, streamed._ReferenceBeside)
    reference, one_pass = beside._reference, beside._pass
    assert reference is not None
    model = beside.result()
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(beside)), model)  # the model itself
    assert one_pass.taken.value >= len(reference.blocks)
    rows = (reference.stream, reference.fitted, reference.kept)
    for index, block in enumerate(reference.blocks):
        (loss, gradient), hessian = streamed._reference_block(rows, (block, one_pass.w))
        assert one_pass.losses[index] == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(one_pass.gradients[index], gradient, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(one_pass.hessians[index], hessian, rtol=1e-12, atol=1e-12)


def logistic_rows(n: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows (n, d) in the unit ball (some on its sphere) and labels (n,) float64 in
    {-1, +1} drawn from a logistic model."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.maximum(np.linalg.norm(X, axis=1), 1.0)[:, None]
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-X @ rng.normal(size=d) * 3)), 1.0, -1.0)
    return X, y


def loss_gradient_hessian(X, y, w, lam):
    """The regularised logistic objective, gradient (d,) and Hessian (d, d) at ``w``,
    computed directly (not from the block sums)."""
    from scipy.special import expit, log_expit

    margins = y * (X @ w)
    value = -log_expit(margins).mean() + lam / 2 * w @ w
    gradient = X.T @ (-y * expit(-margins)) / len(y) + lam * w
    weights = expit(margins) * expit(-margins)
    return value, gradient, (X.T * weights) @ X / len(y) + lam * np.eye(len(w))


def test_the_remainder_bounds_what_the_second_order_model_misses() -> None:
    """logistic_remainder's bounds on the gradient's and the objective's Taylor remainders
    hold against both computed directly at ``w + s``, for steps of length 1e-3 to 3 from
    random points; the gradient's is within 20x of the true remainder for a step along a
    row (where the bound's inequalities are nearly tight)."""
    X, y = logistic_rows(400, 5, seed=7)
    lam, radius = 1e-2, float(np.linalg.norm(X, axis=1).max())
    bounds = streamed.logistic_remainder(X.T @ X / len(y), radius)
    rng = np.random.default_rng(8)
    for scale in (1e-3, 1e-1, 1.0, 3.0):
        for _ in range(10):
            w, s = rng.normal(size=5), rng.normal(size=5)
            s *= scale / np.linalg.norm(s)
            value, gradient, hessian = loss_gradient_hessian(X, y, w, lam)
            after, gradient_after, _ = loss_gradient_hessian(X, y, w + s, lam)
            gradient_bound, value_bound = bounds(s)
            missed = np.linalg.norm(gradient_after - gradient - hessian @ s)
            assert missed <= gradient_bound + 1e-14
            assert after - value - gradient @ s - s @ hessian @ s / 2 <= value_bound + 1e-14
    s = X[np.argmax(np.linalg.norm(X, axis=1))] * 0.5
    value, gradient, hessian = loss_gradient_hessian(X, y, np.zeros(5), lam)
    missed = np.linalg.norm(loss_gradient_hessian(X, y, s, lam)[1] - gradient - hessian @ s)
    assert 0 < missed <= bounds(s)[0] <= 20 * missed


def test_a_certified_newton_step_skips_only_the_pass_that_would_confirm_it() -> None:
    """With the logistic remainder, the streamed Newton returns the model it returns
    without it (the same steps, to 1e-15), one pass over the rows fewer, and a gradient
    norm that bounds the one computed directly at that model and is within the tolerance."""
    X, y = logistic_rows(3000, 8, seed=9)
    n, d, lam, tol = X.shape[0], X.shape[1], 1e-2, 1e-9
    passes = []

    def sums(w, hessian):
        passes.append(hessian)
        return [sums_of_block(X[a : a + 700], y[a : a + 700], w, hessian) for a in range(0, n, 700)]

    plain = newton_from_block_sums(sums, n, d, lam, tol, 50, 0)
    plain_passes, passes[:] = passes.count(False), []
    remainder = streamed.logistic_remainder(X.T @ X / n, float(np.linalg.norm(X, axis=1).max()))
    w, norm, steps = newton_from_block_sums(sums, n, d, lam, tol, 50, 0, remainder=remainder)
    assert steps == plain[2] >= 2
    assert passes.count(False) == plain_passes - 1
    np.testing.assert_allclose(w, plain[0], rtol=0, atol=1e-15)
    assert np.linalg.norm(loss_gradient_hessian(X, y, w, lam)[1]) <= norm <= tol / 4


def test_shards_of_fewer_rows_than_features_are_fitted_compiled(monkeypatch) -> None:
    """With more features than a shard has rows (17 with the bias against 13-14 rows, the
    dual form, as 58 against 20 at a million peers), the blocks' shards are solved by the
    compiled kernel (a kernel that fails stops the training), and with 2 workers the
    models and the centralised model are the in-memory training's to 1e-12, their test
    errors the same integers."""
    from p2pdp.learning import compiled

    cell = config("data.synthetic_features=16")
    whole = pipeline.train_in_memory(cell, fold=0)
    with local_workers(2):
        trained = pipeline.prepare_peers(cell, fold=0)
    assert trained.fold.X_train.shape[0] == 0
    np.testing.assert_allclose(trained.models.weights, whole.models.weights, rtol=0, atol=1e-12)
    np.testing.assert_allclose(trained.centralized, whole.centralized, rtol=0, atol=1e-12)
    assert trained.models.grad_norms.max() <= 1e-9
    X, y = whole.fold.X_test, whole.fold.y_test
    np.testing.assert_array_equal(
        errors_of(trained.models.weights, X, y), errors_of(whole.models.weights, X, y)
    )

    def failing(*args, **kwargs):
        raise RuntimeError("the compiled kernel")

    monkeypatch.setattr(compiled, "fit_consecutive_shards", failing)
    with pytest.raises(RuntimeError, match="the compiled kernel"):
        pipeline.prepare_peers(cell, fold=0)
