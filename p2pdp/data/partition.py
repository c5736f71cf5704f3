"""Cross-validation folds and partitions of training rows into peer shards.

Every function takes the label vector ``y`` (or the given peer of each row) of the rows to
split and returns sorted ``int64`` index arrays into it. Every partition scheme here covers the
rows exactly: the shards are pairwise disjoint and their union is ``arange(len(y))``. Results
are a deterministic function of the arguments and the state of ``rng``.

Schemes (:data:`PARTITION_SCHEMES`):

``iid``
    Equal shards (sizes differ by at most 1), each class spread evenly (the seed).
``label_skew``
    Per class, Dirichlet(``alpha``) proportions over peers (Hsu et al. 2019, in the per-class
    form of Yurochkin et al. 2019 / Li et al. 2022 "NIID-Bench"); small ``alpha`` gives peers
    dominated by one class.
``quantity_skew``
    Shard sizes from Dirichlet(``alpha``) over peers, rows assigned at random.

Given by the user (:data:`GIVEN_SCHEMES`): the peer of every row of the data set, read by
:func:`read_assignment` or taken from the data set itself, checked by :func:`check_assignment`
and cut into shards by :func:`partition_given` (no randomness).

``column``
    The data set's peer column (``data.peer_column`` of a CSV or ``.npy`` file, the named array
    of a ``.npz`` file, or ``RawData.peers`` of a loader).
``file``
    A text file (``partition.path``) with one peer id per row of the data set.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from p2pdp.core.errors import ConfigError, DataError

#: Schemes that draw the shards with ``rng`` (:func:`partition`).
DRAWN_SCHEMES: tuple[str, ...] = ("iid", "label_skew", "quantity_skew")
#: Schemes that cut the rows in their order (no randomness): :func:`partition_contiguous`.
ORDERED_SCHEMES: tuple[str, ...] = ("contiguous",)
#: Schemes whose shards the user gives (a peer per row of the data set) instead of drawing them.
GIVEN_SCHEMES: tuple[str, ...] = ("column", "file")
PARTITION_SCHEMES: tuple[str, ...] = (*DRAWN_SCHEMES, *ORDERED_SCHEMES, *GIVEN_SCHEMES)


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
    from sklearn.model_selection import StratifiedKFold

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
    ends = np.cumsum(np.bincount(owner, minlength=n_peers)).tolist()
    # slices, not np.split: the same views, without its per-piece overhead (0.24 s at 10^5)
    return [order[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


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
    n_rows = codes.size
    _check_common(n_rows, n_peers, min_shard_size)
    layout = np.concatenate(
        [rng.permutation(np.flatnonzero(codes == c)) for c in range(codes.max() + 1)]
    )
    dealt = rng.permutation(n_peers)  # the k-th row of the layout goes to dealt[k % n_peers]
    # Column j of the layout cut into rounds of n_peers is what dealt[j] gets; padded with
    # n_rows, which sorts after every row. No sort of all the rows (0.3 s at 2x10^6 rows).
    rounds = -(-n_rows // n_peers)
    table = np.full(rounds * n_peers, n_rows, dtype=np.int64)
    table[:n_rows] = layout
    table = np.ascontiguousarray(table.reshape(rounds, n_peers).T)
    table.sort(axis=1)
    full = n_rows - (rounds - 1) * n_peers  # the first `full` columns hold `rounds` rows
    row_of = np.empty(n_peers, dtype=np.int64)
    row_of[dealt] = np.arange(n_peers)  # peer dealt[j] gets row j of the table
    return [table[j, : rounds if j < full else rounds - 1] for j in row_of.tolist()]


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


def contiguous_starts(n_rows: int, n_peers: int) -> NDArray[np.int64]:
    """First row of every shard of :func:`partition_contiguous`, and ``n_rows``: (P + 1,) int64.

    Peer ``p`` holds rows ``[starts[p], starts[p + 1])`` with ``starts[p] = floor(p n / P)``
    (exact integer arithmetic), so shard sizes are ``floor(n / P)`` or ``ceil(n / P)``.
    """
    return (np.arange(n_peers + 1, dtype=np.int64) * n_rows) // n_peers


def partition_contiguous(
    y: ArrayLike, n_peers: int, *, min_shard_size: int = 1
) -> list[NDArray[np.int64]]:
    """Shards of consecutive rows: peer ``p`` holds rows ``[floor(p n / P), floor((p+1) n / P))``.

    No randomness: the rows in their order, sizes differing by at most 1. Only iid when the
    rows are exchangeable (independent draws, e.g. the ``synthetic`` data set); rows sorted by
    label, time or source give skewed shards.

    Parameters
    ----------
    y : ndarray of shape (n,)
        Class labels (only their number is used).
    n_peers : int
        Number of shards, ``1 <= n_peers <= n``.
    min_shard_size : int
        Smallest allowed shard, ``>= 1``; raises ConfigError if ``n < n_peers * min_shard_size``
        (then ``floor(n / P)`` rows are too few).

    Returns
    -------
    list of ndarray
        ``n_peers`` sorted int64 index arrays into ``y``; disjoint, their union is all rows.
    """
    n_rows = _class_codes(y).size
    _check_common(n_rows, n_peers, min_shard_size)
    starts = contiguous_starts(n_rows, n_peers).tolist()
    return [np.arange(a, b, dtype=np.int64) for a, b in itertools.pairwise(starts)]


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
        One of :data:`DRAWN_SCHEMES` or :data:`ORDERED_SCHEMES` (the schemes of
        :data:`GIVEN_SCHEMES` are :func:`partition_given`'s).
    rng : numpy.random.Generator
        Randomness of the scheme (not read by ``"contiguous"``).
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
    if scheme == "contiguous":
        return partition_contiguous(y, n_peers, min_shard_size=min_shard_size)
    if scheme in GIVEN_SCHEMES:
        raise ConfigError(
            f"partition scheme {scheme!r} takes the peer of every row from the user: "
            "use partition_given"
        )
    raise ConfigError(f"partition scheme must be one of {PARTITION_SCHEMES}, got {scheme!r}")


def read_assignment(path: str | os.PathLike[str]) -> NDArray[np.int64]:
    """The peer of every row of the data set, from a text file with one integer per line.

    Line ``i`` (1-based) holds the peer id of row ``i - 1`` of the data set (the rows the
    folds are cut from, in the data set's order); a final newline is optional, blank lines
    and anything else are errors.

    Parameters
    ----------
    path : path-like
        The file (``partition.path``).

    Returns
    -------
    ndarray of shape (n,), int64
        Non-negative peer ids (their range is checked by :func:`check_assignment`).

    Raises
    ------
    DataError
        The file is missing or unreadable, or a line is not a non-negative integer (naming
        the file, the 1-based line and its text).
    """
    file = Path(path).expanduser()
    where = f"partition.path = {os.fspath(path)!r}"
    try:
        text = file.read_bytes().decode("utf-8")
    except OSError as exc:
        raise DataError(f"{where}: cannot read the file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: not a text file (byte {exc.start} is not UTF-8)") from None
    lines = text.splitlines()
    if not lines:
        raise DataError(f"{where}: the file is empty; it needs one peer id per row of the data set")
    peers = np.empty(len(lines), dtype=np.int64)
    for number, line in enumerate(lines, 1):
        value = line.strip()
        if not (value.isascii() and value.isdigit()):
            raise DataError(
                f"{where}, line {number}: {line!r} is not a peer id (a non-negative integer, "
                "one per line, one line per row of the data set)"
            )
        peers[number - 1] = int(value)
    return peers


def check_assignment(
    peers: ArrayLike, n_peers: int, *, n_rows: int, where: str, first_line: int | None = None
) -> NDArray[np.int64]:
    """Check that ``peers`` assigns each of ``n_rows`` rows to one of peers ``0..n_peers-1``.

    Parameters
    ----------
    peers : array of shape (n_rows,)
        The peer id of every row of the data set (integers, possibly stored as floats).
    n_peers : int
        ``partition.n_peers``: the ids must be exactly ``0..n_peers - 1``, each used.
    n_rows : int
        The number of rows of the data set the assignment is for.
    where : str
        What the assignment is (``"partition.path = 'peers.txt'"``), for messages.
    first_line : int or None
        The file line of row 0 (messages then name lines), or None (they name 0-based rows).

    Returns
    -------
    ndarray of shape (n_rows,), int64

    Raises
    ------
    DataError
        A length other than ``n_rows``, a value that is not an integer in ``0..n_peers-1``
        (naming its row or line and the value), or a peer id no row uses.
    """
    values = np.asarray(peers)
    if values.ndim != 1 or values.shape[0] != n_rows:
        raise DataError(
            f"{where}: {values.shape[0] if values.ndim == 1 else values.shape} peer ids for "
            f"{n_rows} rows of the data set; give one per row"
        )
    numeric = values.astype(np.float64) if values.dtype.kind in "biuf" else None
    bad = (
        np.ones(n_rows, dtype=bool)
        if numeric is None
        else ~(np.isfinite(numeric) & (numeric == np.round(numeric)))
        | (numeric < 0)
        | (numeric >= n_peers)
    )
    if bad.any():
        row = int(np.argmax(bad))
        place = f"line {row + first_line}" if first_line is not None else f"row {row} (0-based)"
        raise DataError(
            f"{where}: {place} assigns peer {values[row].item()!r}, not an integer in "
            f"0..{n_peers - 1} (partition.n_peers = {n_peers})"
        )
    owner = values.astype(np.int64)
    unused = np.flatnonzero(np.bincount(owner, minlength=n_peers) == 0)
    if unused.size:
        used = n_peers - unused.size
        raise DataError(
            f"{where}: no row is assigned to peer {int(unused[0])} ({unused.size} of the "
            f"{n_peers} peers 0..{n_peers - 1} have no row, {used} do); "
            "partition.n_peers must be the number of peers the assignment names"
        )
    return owner


def partition_given(
    owner: ArrayLike, n_peers: int, *, min_shard_size: int = 1, where: str
) -> list[NDArray[np.int64]]:
    """Shards of the rows whose peers the user gave: peer ``j`` holds the rows ``owner == j``.

    Parameters
    ----------
    owner : ndarray of shape (n,), int
        The peer of each row to split (e.g. the training rows of one fold), in ``0..n_peers-1``
        (see :func:`check_assignment`).
    n_peers : int
        Number of shards.
    min_shard_size : int
        Smallest allowed shard, ``>= 1``.
    where : str
        What the assignment is and which rows these are, for messages.

    Returns
    -------
    list of ndarray
        ``n_peers`` sorted int64 index arrays into ``owner``; disjoint, their union is all rows.

    Raises
    ------
    ConfigError
        A peer holds fewer than ``min_shard_size`` rows (at least one) of these rows.
    """
    rows = np.asarray(owner, dtype=np.int64)
    if rows.size and not 0 <= rows.min() <= rows.max() < n_peers:
        raise ConfigError(f"{where}: peer ids must be in 0..{n_peers - 1}")
    sizes = np.bincount(rows, minlength=n_peers)
    small = np.flatnonzero(sizes < min_shard_size)
    if small.size:
        j = int(small[0])
        raise ConfigError(
            f"{where}: peer {j} holds {int(sizes[j])} training rows, fewer than "
            f"partition.min_shard_size = {min_shard_size} ({small.size} of {n_peers} peers do)"
        )
    return _shards(rows, n_peers)
