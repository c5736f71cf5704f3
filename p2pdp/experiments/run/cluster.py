"""One large run on a Dask cluster: its rows, local models, reference and scores in blocks.

``p2pdp run SCENARIO --scheduler tcp://...`` sends most scenarios' cells to the workers whole,
one future per training and one per cell (:mod:`p2pdp.experiments.run.dask_backend`). A cell
this plan covers (:func:`plan_gap`) is split instead, so a single run of a million peers uses every
worker of the cluster and no process holds all its training rows:

1. **rows**: worker tasks draw the synthetic blocks (:func:`p2pdp.data.synthetic.synthetic_block`,
   blocks of :data:`~p2pdp.data.synthetic.SYNTHETIC_BLOCK_ROWS` rows) from the run's seed
   sequence; a task carries the seed sequence and a block number, never rows, and its block
   stays in the worker's memory as a Dask future. Each returns its training rows' per-feature
   min and max; the client reduces them to the min-max bounds (exact in any order) and sends
   the fitted transform back; the transformed blocks stay on the workers. The test rows (the
   last ``data.synthetic_test_rows`` of the stream, a few thousand) come to the client.
2. **local models**: the ``partition.scheme = "contiguous"`` shards are ranges of rows, so the
   task of block ``b`` solves the exact models of the peers whose first row is in it
   (:func:`p2pdp.learning.models.fit_local_models`); the last of them may end in block
   ``b + 1``, whose first rows (fewer than a shard) a small task sends it. Only the models,
   their gradient norms and shard sizes come back.
3. **centralised reference**: the streamed Newton of :mod:`p2pdp.learning.models`
   (:func:`~p2pdp.learning.newton.newton_from_block_sums`), one round of block tasks per pass
   over the rows; the client adds their sums in block order, as the local run does.
4. **simulation**: in the client (it needs every peer's model), exactly as locally.
5. **evaluation**: the blocks of test rows of
   :func:`p2pdp.learning.evaluation.evaluate_ensembles` and
   :func:`~p2pdp.learning.evaluation.linear_error` (every peer's error counts, the best
   peer's scores, the local-only errors) on the workers: each such phase scatters what it
   reads (the ensembles, i.e. every local and published model, or the local models alone,
   and the test rows) to every worker once (:func:`dask_pieces`), then one task per run of
   blocks.

Every number is the local run's, bit for bit: the blocks are the ones the local run draws and
streams, a peer's model depends on its shard only, and error counts are integers (the rows
compared cell by cell, as text, and the trained models exactly, in
``tests/experiments/test_cluster_run.py``). On the client, the trained object
(:class:`~p2pdp.tasks.pipeline.TrainedPeers`) holds no training rows: ``fold.X_train`` has
none and ``shards`` is empty. What would read them is outside the plan (:func:`plan_gap`):
posterior sampling, a vote on the peers' own rows (``local-validated``), the best-lambda
reference, iterative protocols and plug-in tasks or models.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ClusterLostError, ConfigError, P2PDPError
from p2pdp.core.parallel import RemotePieces
from p2pdp.data.partition import contiguous_starts
from p2pdp.data.preprocess import FittedPreprocessor, Preprocessor
from p2pdp.data.synthetic import SYNTHETIC_BLOCK_ROWS, synthetic_block
from p2pdp.learning.models import MAX_NEWTON_STEPS, LocalModels, LogisticModel
from p2pdp.learning.newton import BlockSums, newton_from_block_sums, sums_of_block
from p2pdp.learning.rules import make_ensemble_rule
from p2pdp.tasks.pipeline import FoldData, TrainedPeers, training_key
from p2pdp.tasks.streamed import block_stream, stream_gap

#: A block on a worker: its training rows ``X`` (m, d), labels ``y`` (m,) int8, and its test
#: rows and labels (rows of the stream past ``data.synthetic_rows``; often none).
_Block = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def plan_gap(config: ScenarioConfig) -> str | None:
    """Why the cluster plan does not cover ``config``'s cells (``"setting = value ..."``), or
    None when it does. An uncovered cell runs whole on one worker, as before the plan. The
    training's settings are those of a local training in blocks
    (:func:`p2pdp.tasks.streamed.stream_gap`); the rest keep the cell off the training rows."""
    evaluation = config.evaluation
    settings: list[tuple[str, Any, bool, str]] = [
        ("task.name", config.task.name, config.task.name == "logistic", "'logistic'"),
        ("protocol.name", config.protocol.name, config.protocol.name == "one-shot", "'one-shot'"),
        (
            "privacy.mechanism",
            config.privacy.mechanism,
            not config.privacy.needs_records,
            "a mechanism that releases the local models, not the peers' records",
        ),
        (
            "evaluation.vote",
            evaluation.vote,
            not make_ensemble_rule(evaluation.vote).needs_own_data,
            "a rule that reads no peer's own rows",
        ),
        (
            "evaluation.best_lambda_reference",
            evaluation.best_lambda_reference,
            not evaluation.best_lambda_reference,
            "false (it refits on every training row)",
        ),
    ]
    gap = stream_gap(config, plan="the cluster plan")
    if gap is not None:
        return gap
    for name, value, covered, wanted in settings:
        if not covered:
            return f"{name} = {value!r} (the cluster plan needs {wanted})"
    return None


def prepare_on_cluster(
    client: Any, config: ScenarioConfig, *, fold: int, repetition: int
) -> TrainedPeers:
    """What :func:`p2pdp.tasks.pipeline.prepare_peers` returns for a covered ``config``
    (:func:`plan_gap`), computed in blocks on ``client``'s workers (see the module docstring);
    the same models, centralised model and test rows, without the training rows.

    Raises
    ------
    ConfigError
        The plan does not cover ``config`` (naming the setting), or the training rows are
        fewer than ``partition.n_peers * partition.min_shard_size``.
    """
    gap = plan_gap(config)
    if gap is not None:
        raise ConfigError(f"this run cannot be split over the cluster: {gap}")
    seed_seq, n_total, d, n = block_stream(config, fold=fold)
    data = config.data
    blocks = range(math.ceil(n_total / SYNTHETIC_BLOCK_ROWS))
    training = range(math.ceil(n / SYNTHETIC_BLOCK_ROWS))
    drawn = [
        client.submit(_draw, seed_seq, b, n_total=n_total, n_features=d, n_train=n, pure=False)
        for b in blocks
    ]
    bounds = client.gather([client.submit(_bounds, drawn[b], pure=False) for b in training])
    tests = client.gather([client.submit(_test_rows, block, pure=False) for block in drawn])
    low = np.minimum.reduce([bound[0] for bound in bounds])
    high = np.maximum.reduce([bound[1] for bound in bounds])
    # the fit on the two rows (low, high) gives the bounds of all the rows: min and max are
    # exact in any order (the plan has no standardize step, whose sums are not)
    fitted = Preprocessor(steps=tuple(data.transform)).fit(np.vstack([low, high]))
    ready = [client.submit(_transform, drawn[b], fitted, pure=False) for b in training]
    del drawn  # the raw blocks are freed once transformed
    models = _local_models(client, ready, config)
    centralized, _, _ = newton_from_block_sums(
        lambda w, hessian: client.gather(
            [client.submit(_sums, block, w, hessian, pure=False) for block in ready]
        ),
        n,
        fitted.n_features_out,
        config.training.lam,
        LogisticModel.gradient_tolerance,
        MAX_NEWTON_STEPS,
        0,
    )
    X_test = np.concatenate([test[0] for test in tests])
    y_test = np.concatenate([test[1] for test in tests])
    fold_data = FoldData(
        X_train=np.empty((0, fitted.n_features_out)),  # the training rows stay on the workers
        y_train=np.empty(0, dtype=np.int8),
        X_test=fitted.transform(X_test),
        y_test=y_test,
        data_dependent_bounds=fitted.data_dependent,
    )
    return TrainedPeers(
        fold=fold_data,
        shards=(),
        models=models,
        reference=centralized,
        key=training_key(config, fold=fold, repetition=repetition),
    )


def _local_models(client: Any, ready: Sequence[Any], config: ScenarioConfig) -> LocalModels:
    """Every peer's exact model, solved by the task of the block its first row is in."""
    n, n_peers = config.data.synthetic_rows, config.partition.n_peers
    starts = contiguous_starts(n, n_peers)
    B = SYNTHETIC_BLOCK_ROWS
    futures = []
    for b, block in enumerate(ready):
        first, last = np.searchsorted(starts[:-1], [b * B, min((b + 1) * B, n)])
        if first == last:  # no shard starts here (a short last block)
            continue
        rows = starts[first : last + 1] - b * B  # shard bounds within the block
        spill = int(rows[-1]) - B  # rows the last shard takes from the next block
        head = client.submit(_head, ready[b + 1], spill, pure=False) if spill > 0 else None
        futures.append(client.submit(_fit, block, head, rows, config.training.lam, pure=False))
    parts = client.gather(futures)
    return LocalModels(
        weights=np.concatenate([part.weights for part in parts]),
        grad_norms=np.concatenate([part.grad_norms for part in parts]),
        iterations=max(part.iterations for part in parts),
        shard_sizes=np.concatenate([part.shard_sizes for part in parts]),
    )


@contextlib.contextmanager
def on_dask_worker() -> Iterator[None]:
    """Label a p2pdp error raised meanwhile on a Dask worker ``on Dask worker ADDRESS: ...``,
    its own folder (a relative path resolved there) shown as ``<the worker's folder>``, so the
    client's one-line error says where it happened. Other exceptions pass unchanged."""
    try:
        yield
    except P2PDPError as exc:
        from dask.distributed import get_worker

        message = str(exc).replace(os.getcwd(), "<the worker's folder>")
        exc.args = (f"on Dask worker {get_worker().address}: {message}",)
        raise


class _LostScheduler(logging.Filter):
    """Drops dask's log records of a lost connection (one line says it instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, (OSError, asyncio.CancelledError))


@contextlib.contextmanager
def scheduler_watch(client: Any) -> Iterator[None]:
    """Turn the futures cancelled by the loss of ``client``'s scheduler into one
    :class:`~p2pdp.core.errors.ClusterLostError`. Dask's log records of a lost connection
    (tracebacks) are dropped meanwhile and, once it is lost, for the rest of the process (the
    client logs them as it closes)."""
    from distributed.comm.core import CommClosedError

    quiet = _LostScheduler()
    handlers = logging.getLogger("distributed").handlers  # where dask's modules log
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    except (concurrent.futures.CancelledError, CommClosedError) as exc:
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise ClusterLostError(
            f"--scheduler {client.scheduler.address}: lost the Dask scheduler mid-run "
            f"({reason}); the cells that finished are kept"
        ) from None
    for handler in handlers:
        handler.removeFilter(quiet)


def dask_pieces(client: Any) -> RemotePieces:
    """:data:`p2pdp.core.parallel.RemotePieces` on ``client``'s workers: ``shared`` is
    scattered to every worker once, then one task per item (one BLAS thread each)."""

    def pieces(function: Callable[[Any, Any], Any], shared: Any, items: Sequence[Any]) -> list:
        [on_workers] = client.scatter([shared], broadcast=True, hash=False)
        return client.gather(
            [client.submit(_piece, function, on_workers, item, pure=False) for item in items]
        )

    return pieces


# --- worker tasks (module-level, so a worker imports them by name) ----------------------------
def _draw(
    seed_seq: np.random.SeedSequence, block: int, *, n_total: int, n_features: int, n_train: int
) -> _Block:
    """Block ``block`` of the synthetic rows, split at ``n_train`` into training and test."""
    with threadpool_limits(limits=1):
        X, y = synthetic_block(seed_seq, block, n_total=n_total, n_features=n_features)
    cut = max(0, min(len(y), n_train - block * SYNTHETIC_BLOCK_ROWS))
    return X[:cut], y[:cut], X[cut:], y[cut:]


def _bounds(block: _Block) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature min and max of the block's training rows, (d,) each."""
    return block[0].min(axis=0), block[0].max(axis=0)


def _test_rows(block: _Block) -> tuple[np.ndarray, np.ndarray]:
    """The block's raw test rows and labels (none in most blocks)."""
    return block[2], block[3]


def _transform(block: _Block, fitted: FittedPreprocessor) -> tuple[np.ndarray, np.ndarray]:
    """The block's training rows transformed (m, d_out), and their labels (m,) int8."""
    with threadpool_limits(limits=1):
        return fitted.transform(block[0]), block[1]


def _head(block: tuple[np.ndarray, np.ndarray], rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The block's first ``rows`` transformed rows and labels (a copy: a small message)."""
    return block[0][:rows].copy(), block[1][:rows].copy()


def _fit(
    block: tuple[np.ndarray, np.ndarray],
    head: tuple[np.ndarray, np.ndarray] | None,
    bounds: np.ndarray,
    lam: float,
) -> LocalModels:
    """Exact models of the shards ``[bounds[i], bounds[i + 1])`` (offsets into the block, the
    last possibly past its end: then into ``head``, the next block's first rows)."""
    X, y = block
    if head is not None:
        X, y = np.concatenate([X, head[0]]), np.concatenate([y, head[1]])
    shards = [np.arange(a, b, dtype=np.int64) for a, b in itertools.pairwise(bounds.tolist())]
    with threadpool_limits(limits=1):
        return LogisticModel().fit(X, y, shards, lam)


def _sums(block: tuple[np.ndarray, np.ndarray], w: np.ndarray, hessian: bool) -> BlockSums:
    """:func:`p2pdp.learning.newton.sums_of_block` of the block's training rows at ``w``:
    their loss and gradient sums, or their Hessian sum if ``hessian``."""
    with threadpool_limits(limits=1):
        return sums_of_block(block[0], block[1].astype(np.float64), w, hessian)


def _piece(function: Callable[[Any, Any], Any], shared: Any, item: Any) -> Any:
    with threadpool_limits(limits=1):
        return function(shared, item)
