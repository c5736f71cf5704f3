"""The ``synthetic`` data set: rows drawn in blocks from the run's seed.

:func:`make_synthetic` draws its rows in blocks of :data:`SYNTHETIC_BLOCK_ROWS` rows, each from
its own child of the seed (:func:`synthetic_seed`), so the rows do not depend on how many
processes draw them; :func:`synthetic_block` draws one block alone (a streamed or clustered run).
"""

from __future__ import annotations

import math

import numpy as np

from p2pdp.core.errors import DataError
from p2pdp.core.parallel import current_workers, forked_map, prefault, shared_empty
from p2pdp.data.loaders import RawData
from p2pdp.data.settings import DataConfig

__all__ = [
    "LOG1P_LOGNORMAL_MEAN",
    "SYNTHETIC_BLOCK_ROWS",
    "make_synthetic",
    "synthetic",
    "synthetic_block",
    "synthetic_block_bounds",
    "synthetic_block_features",
    "synthetic_block_logged",
    "synthetic_seed",
]

#: Rows per block of :func:`make_synthetic`: a constant, so the rows do not depend on how
#: many processes draw the blocks.
SYNTHETIC_BLOCK_ROWS = 65_536


def _log1p_lognormal_mean() -> float:
    """``E[log1p(exp(Z))]`` for ``Z ~ N(0, 1)`` (Gauss-Hermite, 64 nodes; 0.80606)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(64)
    return float(weights @ np.logaddexp(0.0, nodes) / np.sqrt(2 * np.pi))


#: The expectation of every log-feature of :func:`make_synthetic`: the labels' logits are
#: centred by it (a constant, not the rows' mean, so each block is drawn on its own).
LOG1P_LOGNORMAL_MEAN = _log1p_lognormal_mean()


def synthetic_seed(seed_seq: np.random.SeedSequence, child: int) -> np.random.SeedSequence:
    """Child ``child`` of ``seed_seq``, as ``seed_seq.spawn`` gives it to a fresh sequence.

    Built from its spawn key, so it does not depend on which children were spawned before:
    child 0 draws the weight vector of :func:`make_synthetic`, child ``1 + b`` its block ``b``.
    """
    return np.random.SeedSequence(
        seed_seq.entropy, spawn_key=(*seed_seq.spawn_key, child), pool_size=seed_seq.pool_size
    )


def synthetic_block(
    seed_seq: np.random.SeedSequence, block: int, *, n_total: int, n_features: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``[block * B, min((block + 1) * B, n_total))`` of :func:`make_synthetic`.

    ``B`` is :data:`SYNTHETIC_BLOCK_ROWS`. A pure function of its arguments: any process
    draws the same block from the same seed sequence. Returns ``X`` (m, n_features) lognormal
    features and ``y`` (m,) int8 labels in {-1, +1}, ``P(y = 1) = expit((log1p(x) - mu) . w)``
    with ``mu`` = :data:`LOG1P_LOGNORMAL_MEAN` and ``w`` drawn from child 0 (N(0, 16 / d) per
    coordinate).
    """
    X, _, y = synthetic_block_logged(seed_seq, block, n_total=n_total, n_features=n_features)
    return X, y


def _block_rows(block: int, n_total: int) -> int:
    """Rows of block ``block`` of ``n_total`` rows; ValueError outside them."""
    rows = min(SYNTHETIC_BLOCK_ROWS, n_total - block * SYNTHETIC_BLOCK_ROWS)
    if block < 0 or rows <= 0:
        raise ValueError(f"block {block} is outside the {n_total} rows")
    return rows


def _drawn_features(
    seed_seq: np.random.SeedSequence, block: int, n_total: int, n_features: int
) -> tuple[np.random.Generator, np.ndarray, np.ndarray]:
    """Block ``block``'s stream, advanced past its features, its ``X`` and ``log1p(X)``."""
    rows = _block_rows(block, n_total)
    rng = np.random.default_rng(synthetic_seed(seed_seq, 1 + block))
    X = rng.lognormal(mean=0.0, sigma=1.0, size=(rows, n_features))
    return rng, X, np.log1p(X)


def synthetic_block_logged(
    seed_seq: np.random.SeedSequence, block: int, *, n_total: int, n_features: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`synthetic_block`'s ``X`` (m, n_features) and ``y`` (m,), with ``log1p(X)``
    (m, n_features) between them: the labels' logits read it, and so can the default
    transform's first step (``sign(x) log1p(|x|)`` is ``log1p(x)`` for these positive rows,
    bit for bit), instead of computing it again."""
    w_rng = np.random.default_rng(synthetic_seed(seed_seq, 0))
    w = w_rng.normal(size=n_features) * (4.0 / np.sqrt(n_features))
    rng, X, logged = _drawn_features(seed_seq, block, n_total, n_features)
    logits = (logged - LOG1P_LOGNORMAL_MEAN) @ w
    y = np.where(rng.random(len(X)) < 1.0 / (1.0 + np.exp(-logits)), 1, -1).astype(np.int8)
    return X, logged, y


def synthetic_block_features(
    seed_seq: np.random.SeedSequence, block: int, *, n_total: int, n_features: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`synthetic_block_logged`'s ``X`` and ``log1p(X)`` (m, n_features) without its
    labels, which its stream draws after the features (the same features; about a fifth of
    the block's cost saved: the logits' product and its temporary), for a reader that holds
    the labels already."""
    _, X, logged = _drawn_features(seed_seq, block, n_total, n_features)
    return X, logged


def synthetic_block_bounds(
    seed_seq: np.random.SeedSequence, block: int, *, n_total: int, n_features: int, n_rows: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-feature minimum and maximum, (n_features,) each, of the rows of block ``block`` of
    :func:`synthetic_block` before row ``n_rows`` (the training rows), or None if it has none.

    Exactly the extremes of its ``X``, at about half the cost: ``X = exp(z)`` elementwise for
    the block's standard normal draws ``z`` (numpy's lognormal is the C library's ``exp`` of
    ``0 + 1 z``, drawn in the same order), and ``exp`` is monotone, so the extremes are
    ``exp`` (the same C library function, through :func:`math.exp`) of the extremes of ``z``,
    which are drawn without the ``exp`` of every entry.
    """
    rows = _block_rows(block, n_total)
    cut = min(rows, n_rows - block * SYNTHETIC_BLOCK_ROWS)
    if cut <= 0:
        return None
    rng = np.random.default_rng(synthetic_seed(seed_seq, 1 + block))
    z = rng.standard_normal(size=(rows, n_features))[:cut]
    exp = np.frompyfunc(math.exp, 1, 1)
    return (
        exp(z.min(axis=0)).astype(np.float64),
        exp(z.max(axis=0)).astype(np.float64),
    )


def _draw_block(shared: tuple[np.ndarray, np.ndarray, np.random.SeedSequence], block: int) -> None:
    """Draw block ``block`` into the shared ``(X, y)`` arrays (in a forked worker)."""
    X, y, seed_seq = shared
    start = block * SYNTHETIC_BLOCK_ROWS
    Xb, yb = synthetic_block(seed_seq, block, n_total=len(y), n_features=X.shape[1])
    prefault(X[start : start + len(yb)])  # fresh memory: its pages in at once
    X[start : start + len(yb)] = Xb
    y[start : start + len(yb)] = yb


def make_synthetic(
    n_rows: int, n_test_rows: int, n_features: int, *, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Synthetic logistic data with heavy-tailed non-negative features (count-like).

    Features are lognormal (so the default ``log1p`` transform applies); labels are drawn
    from a logistic model with a random weight vector. Returns
    ``(X_train, y_train, X_test, y_test)``, labels in {-1, +1}.

    The ``n_rows + n_test_rows`` rows are drawn in blocks of :data:`SYNTHETIC_BLOCK_ROWS`,
    each from its own child of ``rng``'s seed sequence (:func:`synthetic_block`), in the
    local worker processes (:func:`p2pdp.core.parallel.local_workers`) when there are
    several: the same rows for any number of workers. ``rng`` is only a seed: its state is
    neither read nor advanced.
    """
    n_total = n_rows + n_test_rows
    seed_seq = rng.bit_generator.seed_seq
    if not isinstance(seed_seq, np.random.SeedSequence):
        raise DataError("make_synthetic needs a generator seeded by a numpy SeedSequence")
    blocks = list(range(-(-n_total // SYNTHETIC_BLOCK_ROWS)))
    workers = min(current_workers(), len(blocks))
    # The rows live in the first n_features columns of an array with one spare column, so
    # the default transform (which appends the bias column) can write its output into the
    # same memory (p2pdp.tasks.pipeline.load_fold): no second copy of a million peers' rows.
    # With several workers, in shared memory that they draw their blocks into.
    empty = shared_empty if workers > 1 else np.empty
    buffer = empty((n_total, n_features + 1))
    X, y = buffer[:, :n_features], empty((n_total,), np.int8)
    forked_map(_draw_block, (X, y, seed_seq), blocks, workers=workers)
    return X[:n_rows], y[:n_rows], X[n_rows:], y[n_rows:]


def synthetic(data: DataConfig, *, rng: np.random.Generator) -> RawData:
    """Logistic data of :func:`make_synthetic`, sized by ``data.synthetic_*``.

    ``synthetic_rows`` training and ``synthetic_test_rows`` test rows of
    ``synthetic_features`` features; cross-validation pools both (they are all iid draws).
    """
    X, y, X_test, y_test = make_synthetic(
        data.synthetic_rows, data.synthetic_test_rows, data.synthetic_features, rng=rng
    )
    return RawData(name="synthetic", X=X, y=y, X_test=X_test, y_test=y_test, cv_pools_test=True)
