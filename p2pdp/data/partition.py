"""Cross-validation folds and partitions of training rows into peer shards.

Every function takes the label vector ``y`` of the rows to split and returns sorted ``int64``
index arrays into ``y``. Every partition scheme here covers the rows exactly: the shards are
pairwise disjoint and their union is ``arange(len(y))``. Results are a deterministic function of
the arguments and the state of ``rng``.

Schemes (:data:`PARTITION_SCHEMES`):

``iid``
    Equal shards (sizes differ by at most 1), each class spread evenly (the seed).
``label_skew``
    Per class, Dirichlet(``alpha``) proportions over peers (Hsu et al. 2019, in the per-class
    form of Yurochkin et al. 2019 / Li et al. 2022 "NIID-Bench"); small ``alpha`` gives peers
    dominated by one class.
``quantity_skew``
    Shard sizes from Dirichlet(``alpha``) over peers, rows assigned at random.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from sklearn.model_selection import StratifiedKFold

from p2pdp.core.errors import ConfigError

PARTITION_SCHEMES: tuple[str, ...] = ("iid", "label_skew", "quantity_skew")


def _class_codes(y: ArrayLike) -> NDArray[np.intp]:
    """Class index ``0..k-1`` of every row of the non-empty 1-D label vector ``y``."""
    labels = np.asarray(y)
    if labels.ndim != 1 or labels.size == 0:
        raise ConfigError(f"y must be a non-empty 1-D label array, got shape {labels.shape}")
    return np.unique(labels, return_inverse=True)[1].reshape(-1)


def stratified_folds(
    y: ArrayLike, n_folds: int, *, rng: np.random.Generator
) -> list[tuple[NDArray[np.int64], NDArray[np.int64]]]:
    """Stratified, shuffled K-fold split (scikit-learn ``StratifiedKFold``).

    Parameters
    ----------
    y : ndarray of shape (n,)
        Class labels.
    n_folds : int
        Number of folds, ``2 <= n_folds <=`` the smallest class count.
    rng : numpy.random.Generator
        Source of the shuffling seed (one draw).

    Returns
    -------
    list of (train_idx, test_idx)
        ``n_folds`` pairs of sorted int64 index arrays into ``y``. The test sets are disjoint
        and cover all rows; ``train_idx`` is the complement of ``test_idx``.
    """
    codes = _class_codes(y)
    smallest_class = int(np.bincount(codes).min())
    if not 2 <= n_folds <= smallest_class:
        raise ConfigError(
            f"n_folds must be between 2 and the smallest class count {smallest_class}, "
            f"got {n_folds}"
        )
    splitter = StratifiedKFold(
        n_splits=n_folds, shuffle=True, random_state=int(rng.integers(2**32))
    )
    return [
        (train.astype(np.int64), test.astype(np.int64))
        for train, test in splitter.split(np.zeros((codes.size, 1)), codes)
    ]


def _check_common(n_rows: int, n_peers: int, min_shard_size: int) -> None:
    if n_peers < 1:
        raise ConfigError(f"n_peers must be >= 1, got {n_peers}")
    if min_shard_size < 1:
        raise ConfigError(f"min_shard_size must be >= 1, got {min_shard_size}")
    if n_peers > n_rows:
        raise ConfigError(f"n_peers must be <= the number of rows {n_rows}, got {n_peers}")
    if n_rows < n_peers * min_shard_size:
        raise ConfigError(
            f"min_shard_size {min_shard_size} is too large: {n_rows} rows over {n_peers} peers "
            f"is {n_rows / n_peers:.2f} rows per peer"
        )


def _check_alpha(alpha: float) -> None:
    if not (np.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"alpha must be > 0 and finite, got {alpha}")


def _shards(owner: NDArray[np.int64], n_peers: int) -> list[NDArray[np.int64]]:
    """Sorted int64 row indices of each peer, given the peer ``owner[i]`` of every row ``i``."""
    order = np.argsort(owner, kind="stable").astype(np.int64)
    return np.split(order, np.cumsum(np.bincount(owner, minlength=n_peers))[:-1])


def partition_iid(
    y: ArrayLike, n_peers: int, *, rng: np.random.Generator, min_shard_size: int = 1
) -> list[NDArray[np.int64]]:
    """Equal-size stratified shards (the seed's partition).

    Rows are shuffled within each class, laid out class after class and dealt round-robin to a
    random order of peers, so shard sizes differ by at most 1 and so do the counts of each
    class across shards.

    Parameters
    ----------
    y : ndarray of shape (n,)
        Class labels.
    n_peers : int
        Number of shards, ``1 <= n_peers <= n``.
    rng : numpy.random.Generator
        Randomness for the shuffles.
    min_shard_size : int
        Smallest allowed shard, ``>= 1``; raises ConfigError if ``n // n_peers`` is smaller.

    Returns
    -------
    list of ndarray
        ``n_peers`` sorted int64 index arrays into ``y``; disjoint, their union is all rows.
    """
    codes = _class_codes(y)
    _check_common(codes.size, n_peers, min_shard_size)
    layout = np.concatenate(
        [rng.permutation(np.flatnonzero(codes == c)) for c in range(codes.max() + 1)]
    )
    owner = np.empty(codes.size, dtype=np.int64)
    owner[layout] = rng.permutation(n_peers)[np.arange(codes.size) % n_peers]
    return _shards(owner, n_peers)


def _raise_small_shards(
    owner: NDArray[np.int64], n_peers: int, min_shard_size: int, *, rng: np.random.Generator
) -> None:
    """Move random rows from the largest shards to shards below ``min_shard_size``, in place.

    Each move takes one row from the currently largest shard and gives it to the currently
    smallest one; requires ``len(owner) >= n_peers * min_shard_size``.
    """
    sizes = np.bincount(owner, minlength=n_peers)
    given = np.zeros(n_peers, dtype=np.int64)
    recipients: list[int] = []
    while sizes.min() < min_shard_size:
        donor, recipient = int(np.argmax(sizes)), int(np.argmin(sizes))
        sizes[donor] -= 1
        sizes[recipient] += 1
        given[donor] += 1
        recipients.append(recipient)
    if not recipients:
        return
    moved = np.concatenate(
        [
            rng.choice(np.flatnonzero(owner == donor), size=count, replace=False)
            for donor, count in enumerate(given)
            if count
        ]
    )
    owner[moved] = rng.permutation(recipients)


def partition_label_skew(
    y: ArrayLike,
    n_peers: int,
    *,
    alpha: float,
    rng: np.random.Generator,
    min_shard_size: int = 1,
) -> list[NDArray[np.int64]]:
    """Label-skewed shards: per class, Dirichlet(``alpha``) proportions over peers.

    For every class ``c`` draw ``p_c ~ Dirichlet(alpha * 1_P)`` and deal the shuffled rows of
    class ``c`` to peers with multinomial counts ``Multinomial(n_c, p_c)``. A shard left below
    ``min_shard_size`` is then filled by moving random rows one at a time from the currently
    largest shard (a small repair that always succeeds when ``n >= n_peers * min_shard_size``).

    Parameters
    ----------
    y : ndarray of shape (n,)
        Class labels.
    n_peers : int
        Number of shards, ``1 <= n_peers <= n``.
    alpha : float
        Dirichlet concentration, ``> 0``; small is skewed, large approaches IID class mixes.
    rng : numpy.random.Generator
        Randomness for the proportions, counts and row choices.
    min_shard_size : int
        Smallest allowed shard, ``>= 1``; raises ConfigError if ``n < n_peers * min_shard_size``.

    Returns
    -------
    list of ndarray
        ``n_peers`` sorted int64 index arrays into ``y``; disjoint, their union is all rows.
    """
    codes = _class_codes(y)
    _check_common(codes.size, n_peers, min_shard_size)
    _check_alpha(alpha)
    owner = np.empty(codes.size, dtype=np.int64)
    for c in range(codes.max() + 1):
        rows = rng.permutation(np.flatnonzero(codes == c))
        counts = rng.multinomial(rows.size, rng.dirichlet(np.full(n_peers, alpha)))
        owner[rows] = np.repeat(np.arange(n_peers), counts)
    _raise_small_shards(owner, n_peers, min_shard_size, rng=rng)
    return _shards(owner, n_peers)


def partition_quantity_skew(
    y: ArrayLike,
    n_peers: int,
    *,
    alpha: float,
    rng: np.random.Generator,
    min_shard_size: int = 1,
) -> list[NDArray[np.int64]]:
    """Quantity-skewed shards: sizes from Dirichlet(``alpha``) over peers, rows at random.

    Shard ``j`` gets ``min_shard_size + m_j`` rows with
    ``m ~ Multinomial(n - n_peers * min_shard_size, Dirichlet(alpha * 1_P))``; the rows are a
    uniformly random assignment, so class mixes are IID in expectation.

    Parameters
    ----------
    y : ndarray of shape (n,)
        Class labels (only their number is used).
    n_peers : int
        Number of shards, ``1 <= n_peers <= n``.
    alpha : float
        Dirichlet concentration, ``> 0``; small gives very unequal sizes.
    rng : numpy.random.Generator
        Randomness for the sizes and the assignment.
    min_shard_size : int
        Smallest allowed shard, ``>= 1``; raises ConfigError if ``n < n_peers * min_shard_size``.

    Returns
    -------
    list of ndarray
        ``n_peers`` sorted int64 index arrays into ``y``; disjoint, their union is all rows.
    """
    n_rows = _class_codes(y).size
    _check_common(n_rows, n_peers, min_shard_size)
    _check_alpha(alpha)
    spare = rng.multinomial(
        n_rows - n_peers * min_shard_size, rng.dirichlet(np.full(n_peers, alpha))
    )
    owner = np.empty(n_rows, dtype=np.int64)
    owner[rng.permutation(n_rows)] = np.repeat(np.arange(n_peers), min_shard_size + spare)
    return _shards(owner, n_peers)


def partition(
    y: ArrayLike,
    n_peers: int,
    *,
    scheme: str,
    rng: np.random.Generator,
    alpha: float = 0.5,
    min_shard_size: int = 1,
) -> list[NDArray[np.int64]]:
    """Split rows into ``n_peers`` shards with the named scheme.

    Parameters
    ----------
    y : ndarray of shape (n,)
        Class labels of the rows to split (e.g. the training rows of one fold).
    n_peers : int
        Number of shards.
    scheme : str
        One of :data:`PARTITION_SCHEMES`.
    rng : numpy.random.Generator
        Randomness of the scheme.
    alpha : float
        Dirichlet concentration of the skewed schemes (ignored by ``"iid"``).
    min_shard_size : int
        Smallest allowed shard.

    Returns
    -------
    list of ndarray
        ``n_peers`` sorted int64 index arrays into ``y``; disjoint, their union is all rows.
    """
    if scheme == "iid":
        return partition_iid(y, n_peers, rng=rng, min_shard_size=min_shard_size)
    if scheme == "label_skew":
        return partition_label_skew(y, n_peers, alpha=alpha, rng=rng, min_shard_size=min_shard_size)
    if scheme == "quantity_skew":
        return partition_quantity_skew(
            y, n_peers, alpha=alpha, rng=rng, min_shard_size=min_shard_size
        )
    raise ConfigError(f"partition scheme must be one of {PARTITION_SCHEMES}, got {scheme!r}")
