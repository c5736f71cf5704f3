from __future__ import annotations

import warnings

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pdp.core.errors import ConfigError
from p2pdp.data.preprocess import DEFAULT_STEPS, SEED_STEPS, Preprocessor

MINMAX_PROJECT = ("minmax", "bias", "project_unit_ball")


@pytest.fixture
def split() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return rng.exponential(2.0, size=(30, 5)), rng.exponential(2.0, size=(10, 5))


def _minmax(X: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return np.clip((X - low) / (high - low), 0.0, 1.0)


@pytest.mark.parametrize(
    ("steps", "named"),
    [
        (("minmax", "bias", "normalize"), "'normalize'"),
        (("bias", "minmax", "project_unit_ball"), "'minmax' may not follow 'bias'"),
        (("minmax", "minmax", "project_unit_ball"), "'minmax' may not follow 'minmax'"),
        (("minmax", "bias", "project_unit_ball", "scale_sqrt_d"), "at most one of"),
        (("minmax", "standardize", "bias"), "at most one of"),
        (("standardize", "minmax", "bias"), "'minmax' may not follow 'standardize'"),
        (("bias", "scale_sqrt_d"), "requires 'minmax'"),
    ],
)
def test_invalid_steps_name_the_step(steps: tuple[str, ...], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Preprocessor(steps=steps)


@pytest.mark.parametrize(
    ("steps", "bounds", "named"),
    [
        (("bias", "project_unit_ball"), (np.zeros(2), np.ones(2)), "'minmax'"),
        (DEFAULT_STEPS, (np.zeros(2), np.ones(3)), r"shapes \(2,\) and \(3,\)"),
        (DEFAULT_STEPS, (np.zeros(2), np.array([1.0, np.inf])), "finite"),
        (DEFAULT_STEPS, (np.zeros(2), np.array([1.0, -1.0])), "low=0.0 > high=-1.0 for feature 1"),
    ],
)
def test_invalid_bounds(steps: tuple[str, ...], bounds: tuple, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Preprocessor(steps=steps, bounds=bounds)


def test_steps_given_as_list_are_stored_as_tuple() -> None:
    assert Preprocessor(steps=list(SEED_STEPS)).steps == SEED_STEPS


def test_fit_uses_training_rows_only(split: tuple[np.ndarray, np.ndarray]) -> None:
    X_train, X_test = split
    X_test = X_test.copy()
    X_test[0] = 1e6  # extreme values exist only in the test rows
    X_test[1] = 0.0
    fitted = Preprocessor(steps=MINMAX_PROJECT).fit(X_train)
    np.testing.assert_array_equal(fitted.low, X_train.min(axis=0))
    np.testing.assert_array_equal(fitted.high, X_train.max(axis=0))
    assert fitted.data_dependent
    low, high = fitted.low.copy(), fitted.high.copy()
    Z_test = fitted.transform(X_test)
    np.testing.assert_array_equal(fitted.low, low)
    np.testing.assert_array_equal(fitted.high, high)
    with pytest.raises(ValueError, match="read-only"):
        fitted.high[0] = 0.0
    # out-of-range test values are clipped to [0, 1] before the bias and the projection
    scale = 1.0 / Z_test[:, -1:]
    np.testing.assert_allclose(Z_test[:2, :-1] * scale[:2], [np.ones(5), np.zeros(5)])


def test_transform_does_not_modify_its_input(split: tuple[np.ndarray, np.ndarray]) -> None:
    X_train, X_test = split
    before = X_test.copy()
    Preprocessor().fit(X_train).transform(X_test)
    np.testing.assert_array_equal(X_test, before)


def test_bias_is_exactly_one_before_projection(split: tuple[np.ndarray, np.ndarray]) -> None:
    X_train, X_test = split
    fitted = Preprocessor(steps=MINMAX_PROJECT).fit(X_train)
    for X in (X_train, X_test):
        Z = fitted.transform(X)
        scaled = _minmax(X, X_train.min(axis=0), X_train.max(axis=0))
        # the projection divides the whole row (scaled, 1) by its norm
        np.testing.assert_allclose(Z[:, -1], 1.0 / np.sqrt(1.0 + np.sum(scaled**2, axis=1)))
        np.testing.assert_allclose(Z[:, :-1] / Z[:, -1:], scaled, atol=1e-12)
    # a row at the training minimum is (0, ..., 0, 1): norm 1, left unchanged
    at_min = fitted.transform(X_train.min(axis=0, keepdims=True))
    np.testing.assert_array_equal(at_min, np.eye(6)[-1:])


def test_seed_steps_divide_by_sqrt_of_columns(split: tuple[np.ndarray, np.ndarray]) -> None:
    X_train, X_test = split
    fitted = Preprocessor(steps=SEED_STEPS).fit(X_train)
    scaled = _minmax(X_test, X_train.min(axis=0), X_train.max(axis=0))
    expected = np.hstack([scaled, np.ones((10, 1))]) / np.sqrt(6)
    np.testing.assert_allclose(fitted.transform(X_test), expected, atol=1e-15)
    assert fitted.n_features_out == 6


def test_log1p_is_signed_and_applied_before_minmax() -> None:
    X_train = np.array([[-3.0, 0.0], [0.0, 1.0], [7.0, 3.0]])
    fitted = Preprocessor().fit(X_train)
    np.testing.assert_allclose(fitted.low, [-np.log(4.0), 0.0])
    np.testing.assert_allclose(fitted.high, [np.log(8.0), np.log(4.0)])
    Z = fitted.transform(np.array([[0.0, 1.0]]))
    expected = np.array([np.log(4.0) / np.log(32.0), 0.5, 1.0])
    np.testing.assert_allclose(Z[0], expected / np.linalg.norm(expected))


def test_constant_column_maps_to_zero_without_warnings() -> None:
    X_train = np.array([[2.0, 1.0], [2.0, 3.0]])
    fitted = Preprocessor(steps=MINMAX_PROJECT).fit(X_train)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Z = fitted.transform(np.array([[2.0, 1.0], [5.0, 1.0]]))
    np.testing.assert_array_equal(Z[:, 0], [0.0, 0.0])


def test_tiny_span_saturates_instead_of_overflowing() -> None:
    fitted = Preprocessor(steps=MINMAX_PROJECT).fit(np.array([[0.0], [5e-324]]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Z = fitted.transform(np.array([[0.0], [1e6], [-1e6]]))
    np.testing.assert_allclose(Z, [[0.0, 1.0], [np.sqrt(0.5), np.sqrt(0.5)], [0.0, 1.0]])


def test_bounds_path_reads_no_data() -> None:
    class ShapeOnly:
        shape = (4, 2)

    bounds = (np.array([0.0, 0.0]), np.array([np.e - 1.0, 10.0]))
    preprocessor = Preprocessor(bounds=bounds)
    fitted = preprocessor.fit(ShapeOnly())
    assert not fitted.data_dependent
    np.testing.assert_allclose(fitted.low, [0.0, 0.0])
    np.testing.assert_allclose(fitted.high, [1.0, np.log(11.0)])
    rng = np.random.default_rng(3)
    other = preprocessor.fit(rng.normal(size=(4, 2)))
    np.testing.assert_array_equal(other.low, fitted.low)
    np.testing.assert_array_equal(other.high, fitted.high)
    # training values outside the given bounds are clipped: the norm bound holds regardless
    Z = fitted.transform(np.array([[100.0, -5.0]]))
    np.testing.assert_allclose(Z, np.array([[1.0, 0.0, 1.0]]) / np.sqrt(2.0))


def test_bounds_must_match_the_number_of_columns() -> None:
    preprocessor = Preprocessor(bounds=(np.zeros(3), np.ones(3)))
    with pytest.raises(ConfigError, match=r"shape \(n, 3\).*got \(4, 2\)"):
        preprocessor.fit(np.zeros((4, 2)))


@pytest.mark.parametrize(
    ("X", "named"),
    [
        (np.array([[1.0, np.nan]]), "finite"),
        (np.ones((2, 3)), r"2 columns.*got 3"),
        (np.ones(2), "2-D"),
    ],
)
def test_transform_rejects_bad_input(X: np.ndarray, named: str) -> None:
    fitted = Preprocessor().fit(np.array([[0.0, 1.0], [1.0, 0.0]]))
    with pytest.raises(ConfigError, match=named):
        fitted.transform(X)


def test_fit_rejects_empty_and_non_finite_training_rows() -> None:
    with pytest.raises(ConfigError, match="X_train"):
        Preprocessor().fit(np.empty((0, 3)))
    with pytest.raises(ConfigError, match=r"X_train.*finite"):
        Preprocessor().fit(np.array([[np.inf, 0.0]]))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("steps", [DEFAULT_STEPS, ("bias",), ("log1p", "standardize")])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_in_a_late_block_is_refused(workers, steps, bad) -> None:
    """Fit and transform check finiteness block by block (in the local workers): a value in
    the last block of rows, one column, is found by both."""
    from p2pdp.core.parallel import local_workers

    X = np.ones((2 * 7 + 5, 3))  # three blocks of 7 rows, a short last
    X[:, 0] = np.arange(len(X))  # something to scale
    bad_rows = X.copy()
    bad_rows[-2, 1] = bad
    with local_workers(workers):
        with pytest.raises(ConfigError, match=r"X_train must contain only finite values"):
            Preprocessor(steps=steps).fit(bad_rows, block_rows=7)
        fitted = Preprocessor(steps=steps).fit(X, block_rows=7)
        with pytest.raises(ConfigError, match=r"X must contain only finite values"):
            fitted.transform(bad_rows, block_rows=7)


@pytest.mark.parametrize("steps", [DEFAULT_STEPS, SEED_STEPS, ("log1p", "standardize", "bias")])
def test_fit_and_transform_give_the_same_numbers_for_any_blocks_and_workers(steps) -> None:
    """Blocks of rows bound the temporaries and are shared out to the local workers (the
    output then in shared memory): the same bounds and rows for any block size and number
    of workers."""
    from p2pdp.core.parallel import is_shared, local_workers

    rng = np.random.default_rng(8)
    X = rng.normal(size=(50, 4)) * [1.0, 10.0, 1e3, 0.1]
    whole = Preprocessor(steps=steps).fit(X)
    expected = whole.transform(X)
    for workers, block_rows in [(1, 7), (2, 7), (2, 1), (2, 50), (1, 1000)]:
        with local_workers(workers):
            fitted = Preprocessor(steps=steps).fit(X, block_rows=block_rows)
            rows = fitted.transform(X, block_rows=block_rows)
        for bound in ("low", "high", "mean", "std"):
            np.testing.assert_array_equal(getattr(fitted, bound), getattr(whole, bound))
        np.testing.assert_array_equal(rows, expected)
        assert is_shared(rows) == (workers > 1 and block_rows < 50)  # split: in the workers
    with pytest.raises(ConfigError, match="block_rows must be an integer >= 1, got 0"):
        whole.transform(X, block_rows=0)


_matrices = st.integers(1, 6).flatmap(
    lambda d: st.tuples(
        *(
            hnp.arrays(
                np.float64,
                st.tuples(st.integers(1, 12), st.just(d)),
                elements=st.floats(-1e6, 1e6, allow_nan=False),
            )
            for _ in range(2)
        )
    )
)


@settings(deadline=None)  # a loaded CI machine is not a failure
@given(
    matrices=_matrices,
    steps=st.sampled_from([DEFAULT_STEPS, SEED_STEPS, MINMAX_PROJECT, ("project_unit_ball",)]),
)
def test_rows_of_train_and_test_have_norm_at_most_one(
    matrices: tuple[np.ndarray, np.ndarray], steps: tuple[str, ...]
) -> None:
    X_train, X_test = matrices
    fitted = Preprocessor(steps=steps).fit(X_train)
    for X in (X_train, X_test):
        Z = fitted.transform(X)
        assert Z.shape == (X.shape[0], fitted.n_features_out)
        assert np.all(np.linalg.norm(Z, axis=1) <= 1.0 + 1e-12)


def test_transform_in_place_over_a_spare_column_equals_a_fresh_output():
    """The synthetic loader's rows sit in an array with a spare column; the fold's transform
    writes the output (bias column included) over them: same numbers, no second array."""
    from p2pdp.core.rng import generator
    from p2pdp.data.settings import DataConfig
    from p2pdp.data.synthetic import make_synthetic
    from p2pdp.learning.settings import EvaluationConfig
    from p2pdp.tasks.pipeline import load_fold

    data = DataConfig(dataset="synthetic", synthetic_rows=3000, synthetic_test_rows=700,
                      synthetic_features=6)  # fmt: skip
    fold = load_fold(data, EvaluationConfig(split="fixed"), seed=4, fold=0)
    X, _, X_test, _ = make_synthetic(3000, 700, 6, rng=generator(4, "synthetic"))
    assert X.base is not None and X.base.shape == (3700, 7)  # the spare column
    reference = Preprocessor(steps=data.transform).fit(X.copy())
    np.testing.assert_allclose(fold.X_train, reference.transform(X.copy()), rtol=1e-12)
    np.testing.assert_allclose(fold.X_test, reference.transform(X_test.copy()), rtol=1e-12)
    assert fold.X_train.base is not None and fold.X_train.base.shape == (3700, 7)  # in place
    with pytest.raises(ConfigError, match="out must be a float64 array of shape"):
        reference.transform(X, out=np.empty((3000, 6)))


def test_standardize_is_fitted_on_training_rows_only(split: tuple[np.ndarray, np.ndarray]) -> None:
    X_train, X_test = split
    X_train = X_train.copy()
    X_train[:, 2] = 3.0  # a constant feature maps to 0, without a warning
    fitted = Preprocessor(steps=("standardize", "bias")).fit(X_train)
    assert fitted.data_dependent and fitted.n_features_out == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Z_train, Z_test = fitted.transform(X_train), fitted.transform(X_test)
    np.testing.assert_allclose(Z_train[:, :5].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Z_train[:, :5].std(axis=0), [1, 1, 0, 1, 1], atol=1e-12)
    np.testing.assert_array_equal(Z_train[:, 5], 1.0)
    # the test rows use the training statistics, not their own
    expected = (X_test - X_train.mean(axis=0)) / np.where(
        X_train.std(axis=0) > 0, X_train.std(axis=0), 1
    )
    expected[:, 2] = 0.0
    np.testing.assert_allclose(Z_test[:, :5], expected, rtol=1e-12)
    assert not np.allclose(Z_test[:, [0, 1, 3, 4]].mean(axis=0), 0.0, atol=1e-3)
    assert not Preprocessor(steps=("standardize", "bias")).bounds_row_norms


def test_standardize_follows_log1p_and_precedes_the_projection(
    split: tuple[np.ndarray, np.ndarray],
) -> None:
    X_train, X_test = split
    steps = ("log1p", "standardize", "bias", "project_unit_ball")
    assert Preprocessor(steps=steps).bounds_row_norms
    fitted = Preprocessor(steps=steps).fit(X_train)
    logged = np.log1p(X_train)
    np.testing.assert_allclose(fitted.mean, logged.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(fitted.std, logged.std(axis=0), rtol=1e-12)
    for Z in (fitted.transform(X_train), fitted.transform(X_test)):
        assert np.linalg.norm(Z, axis=1).max() <= 1 + 1e-12
