from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pdp.core.errors import ConfigError
from p2pdp.data.partition import (
    PARTITION_SCHEMES,
    partition,
    partition_iid,
    partition_label_skew,
    partition_quantity_skew,
    stratified_folds,
)

# class sizes of Spambase: 1,813 spam / 2,788 non-spam
SPAMBASE_LABELS = np.repeat([1, 0], [1813, 2788])


def _assert_exact_cover(shards: list[np.ndarray], n_rows: int) -> None:
    for shard in shards:
        assert shard.dtype == np.int64
        assert np.all(np.diff(shard) > 0)  # sorted, no repeats
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(n_rows))


def _class_counts(y: np.ndarray, shards: list[np.ndarray]) -> np.ndarray:
    """(n_shards, n_classes) table of class counts."""
    classes = np.unique(y)
    return np.array([[np.sum(y[shard] == c) for c in classes] for shard in shards])


@st.composite
def _labels_and_peers(draw: st.DrawFn) -> tuple[np.ndarray, int, int]:
    y = np.array(draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=120)))
    n_peers = draw(st.integers(1, y.size))
    min_shard_size = draw(st.integers(1, y.size // n_peers))
    return y, n_peers, min_shard_size


@given(case=_labels_and_peers(), seed=st.integers(0, 2**32 - 1))
def test_iid_shards_cover_all_rows_with_balanced_sizes_and_classes(
    case: tuple[np.ndarray, int, int], seed: int
) -> None:
    y, n_peers, min_shard_size = case
    shards = partition_iid(
        y, n_peers, rng=np.random.default_rng(seed), min_shard_size=min_shard_size
    )
    assert len(shards) == n_peers
    _assert_exact_cover(shards, y.size)
    sizes = np.array([shard.size for shard in shards])
    assert sizes.max() - sizes.min() <= 1
    counts = _class_counts(y, shards)
    assert np.all(counts.max(axis=0) - counts.min(axis=0) <= 1)


@given(
    case=_labels_and_peers(),
    scheme=st.sampled_from(["label_skew", "quantity_skew"]),
    alpha=st.floats(0.01, 100.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_skewed_shards_cover_all_rows_and_respect_min_size(
    case: tuple[np.ndarray, int, int], scheme: str, alpha: float, seed: int
) -> None:
    y, n_peers, min_shard_size = case
    shards = partition(
        y,
        n_peers,
        scheme=scheme,
        alpha=alpha,
        rng=np.random.default_rng(seed),
        min_shard_size=min_shard_size,
    )
    assert len(shards) == n_peers
    _assert_exact_cover(shards, y.size)
    assert min(shard.size for shard in shards) >= min_shard_size


@pytest.mark.parametrize("scheme", PARTITION_SCHEMES)
def test_same_seed_gives_same_shards(scheme: str) -> None:
    def shards(seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return partition(SPAMBASE_LABELS, 100, scheme=scheme, rng=rng, min_shard_size=5)

    first, again, other = shards(11), shards(11), shards(12)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_label_skew_concentrates_classes_as_alpha_falls() -> None:
    def mean_deviation(alpha: float) -> float:
        rng = np.random.default_rng(5)
        shards = partition_label_skew(SPAMBASE_LABELS, 100, alpha=alpha, rng=rng)
        spam_share = np.array([SPAMBASE_LABELS[shard].mean() for shard in shards])
        return float(np.mean(np.abs(spam_share - SPAMBASE_LABELS.mean())))

    skewed, mixed = mean_deviation(0.1), mean_deviation(100.0)
    assert skewed > 0.3
    assert mixed < 0.1


def test_label_skew_repairs_small_shards() -> None:
    rng = np.random.default_rng(0)
    shards = partition_label_skew(SPAMBASE_LABELS, 100, alpha=0.05, rng=rng, min_shard_size=40)
    _assert_exact_cover(shards, SPAMBASE_LABELS.size)
    assert min(shard.size for shard in shards) >= 40


def test_quantity_skew_spreads_sizes_but_not_classes() -> None:
    rng = np.random.default_rng(2)
    shards = partition_quantity_skew(SPAMBASE_LABELS, 20, alpha=0.5, rng=rng, min_shard_size=10)
    sizes = np.array([shard.size for shard in shards])
    assert sizes.min() >= 10
    assert sizes.max() > 3 * sizes.min()
    large = [shard for shard in shards if shard.size >= 100]
    assert len(large) >= 5
    spam_share = np.array([SPAMBASE_LABELS[shard].mean() for shard in large])
    assert np.all(np.abs(spam_share - SPAMBASE_LABELS.mean()) < 0.15)


def test_stratified_folds_partition_rows_and_keep_class_balance() -> None:
    y = SPAMBASE_LABELS
    folds = stratified_folds(y, 10, rng=np.random.default_rng(1))
    assert len(folds) == 10
    for train, test in folds:
        assert train.dtype == np.int64 and test.dtype == np.int64
        np.testing.assert_array_equal(np.union1d(train, test), np.arange(y.size))
        assert np.intersect1d(train, test).size == 0
    tests = [test for _, test in folds]
    _assert_exact_cover(tests, y.size)
    counts = _class_counts(y, tests)
    assert np.all(counts.max(axis=0) - counts.min(axis=0) <= 1)
    again = stratified_folds(y, 10, rng=np.random.default_rng(1))
    for (_, a), (_, b) in zip(folds, again, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("n_folds", "named"),
    [(1, "got 1"), (4, "smallest class count 3, got 4")],
)
def test_stratified_folds_reject_bad_fold_counts(n_folds: int, named: str) -> None:
    y = np.array([0, 0, 0, 1, 1, 1, 1])
    with pytest.raises(ConfigError, match=named):
        stratified_folds(y, n_folds, rng=np.random.default_rng(0))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"n_peers": 0}, "n_peers must be >= 1, got 0"),
        ({"n_peers": 11}, "n_peers must be <= the number of rows 10, got 11"),
        ({"n_peers": 3, "min_shard_size": 4}, r"10 rows over 3 peers is 3\.33 rows per peer"),
        ({"n_peers": 2, "min_shard_size": 0}, "min_shard_size must be >= 1, got 0"),
        ({"n_peers": 2, "alpha": 0.0, "scheme": "label_skew"}, "alpha must be > 0.*got 0.0"),
        ({"n_peers": 2, "alpha": np.nan, "scheme": "quantity_skew"}, "alpha.*got nan"),
        ({"n_peers": 2, "scheme": "random"}, "one of .*'iid'.*got 'random'"),
    ],
)
def test_partition_rejects_bad_arguments(kwargs: dict, named: str) -> None:
    arguments = {"scheme": "iid", **kwargs}
    with pytest.raises(ConfigError, match=named):
        partition(np.arange(10) % 2, rng=np.random.default_rng(0), **arguments)


def test_labels_must_be_one_dimensional() -> None:
    with pytest.raises(ConfigError, match=r"y must be .*got shape \(2, 5\)"):
        partition_iid(np.zeros((2, 5)), 2, rng=np.random.default_rng(0))
