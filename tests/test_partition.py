from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pdp.core.errors import ConfigError, DataError
from p2pdp.data import settings
from p2pdp.data.partition import (
    DRAWN_SCHEMES,
    PARTITION_SCHEMES,
    check_assignment,
    partition,
    partition_given,
    partition_iid,
    partition_label_skew,
    partition_quantity_skew,
    read_assignment,
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
    # the deal its docstring describes, row by row: the same stream gives the same shards
    rng = np.random.default_rng(seed)
    codes = np.unique(y, return_inverse=True)[1]
    layout = np.concatenate(
        [rng.permutation(np.flatnonzero(codes == c)) for c in range(codes.max() + 1)]
    )
    owner = np.empty(y.size, dtype=np.int64)
    owner[layout] = rng.permutation(n_peers)[np.arange(y.size) % n_peers]
    for peer, shard in enumerate(shards):
        np.testing.assert_array_equal(shard, np.flatnonzero(owner == peer))


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


@pytest.mark.parametrize("scheme", DRAWN_SCHEMES)
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


def test_the_schema_offers_every_scheme_the_data_layer_implements() -> None:
    assert settings.PARTITION_SCHEMES == PARTITION_SCHEMES
    with pytest.raises(ConfigError, match="'file' takes the peer of every row from the user"):
        partition(np.arange(10) % 2, 2, scheme="file", rng=np.random.default_rng(0))


# --- partitions the user gives ----------------------------------------------------------------
def test_given_shards_are_the_rows_of_each_peer(tmp_path) -> None:
    path = tmp_path / "peers.txt"
    path.write_text("2\n0\n1\n2\n0\n1\n1", encoding="utf-8")  # no final newline
    owner = check_assignment(read_assignment(path), 3, n_rows=7, where="w", first_line=1)
    np.testing.assert_array_equal(owner, [2, 0, 1, 2, 0, 1, 1])
    shards = partition_given(owner, 3, min_shard_size=2, where="w")
    assert [shard.tolist() for shard in shards] == [[1, 4], [2, 5, 6], [0, 3]]
    assert all(shard.dtype == np.int64 for shard in shards)
    # a fold's training rows are a subset: the shards index into that subset
    train = np.array([0, 1, 2, 3, 5, 6])
    shards = partition_given(owner[train], 3, where="w")
    assert [shard.tolist() for shard in shards] == [[1], [2, 4, 5], [0, 3]]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("0\n1\n\n1\n", r"line 3: '' is not a peer id"),
        ("0\n1\n-1\n", r"line 3: '-1' is not a peer id"),
        ("0\n1.5\n", r"line 2: '1.5' is not a peer id"),
        ("0,1\n", r"line 1: '0,1' is not a peer id"),
        ("", "the file is empty"),
    ],
)
def test_a_bad_assignment_file_names_the_file_and_line(tmp_path, text: str, named: str) -> None:
    path = tmp_path / "peers.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=rf"^partition.path = '.*peers.txt'.*{named}"):
        read_assignment(path)
    with pytest.raises(DataError, match="cannot read the file"):
        read_assignment(tmp_path / "missing.txt")


@pytest.mark.parametrize(
    ("peers", "first_line", "named"),
    [
        ([0, 1, 2], None, "3 peer ids for 4 rows of the data set"),
        (
            [0, 1, 2, 3],
            1,
            r"line 4 assigns peer 3, not an integer in 0\.\.2 \(partition.n_peers = 3\)",
        ),
        ([0, 1, 2.5, 1], None, r"row 2 \(0-based\) assigns peer 2.5"),
        ([0, 1, np.nan, 1], None, r"row 2 \(0-based\) assigns peer nan"),
        ([0, 1, 1, 0], None, r"no row is assigned to peer 2 \(1 of the 3 peers"),
        (["a", "b", "c", "d"], None, "row 0 .* assigns peer 'a'"),
    ],
)
def test_a_bad_assignment_names_the_row_and_value(peers, first_line, named: str) -> None:
    with pytest.raises(DataError, match=f"^mine: {named}"):
        check_assignment(np.array(peers), 3, n_rows=4, where="mine", first_line=first_line)


def test_given_shards_respect_min_shard_size() -> None:
    owner = np.array([0, 1, 1, 2, 2, 2])
    assert [len(s) for s in partition_given(owner, 3, min_shard_size=1, where="w")] == [1, 2, 3]
    with pytest.raises(
        ConfigError,
        match=r"^fold 1: peer 0 holds 1 training rows, fewer than "
        r"partition.min_shard_size = 2 \(1 of 3 peers do\)",
    ):
        partition_given(owner, 3, min_shard_size=2, where="fold 1")
    with pytest.raises(ConfigError, match="peer 1 holds 0 training rows"):
        partition_given(np.array([0, 2, 2]), 3, where="w")
