"""A large synthetic run's training in blocks, its rows never all in memory (issue 43).

The synthetic rows are a pure function of the scenario's seed and the block number
(:func:`p2pdp.data.synthetic.synthetic_block`, blocks of
:data:`~p2pdp.data.synthetic.SYNTHETIC_BLOCK_ROWS` rows), so a run whose training reads its
rows only block by block can draw each block when it needs it and drop it after:

1. **bounds**: every training block's per-feature minimum and maximum
   (:func:`~p2pdp.data.synthetic.synthetic_block_bounds`: exact, from the block's normal draws
   without the ``exp`` of each entry), reduced to the min-max bounds (exact in any order); the
   test rows (the last ``data.synthetic_test_rows`` of the stream) are kept, transformed.
2. **local models**: each block drawn again and transformed (its ``log1p`` reused from the
   labels' logits, :meth:`~p2pdp.data.preprocess.FittedPreprocessor.transform_logged`, in
   compiled code: :func:`~p2pdp.data.compiled.minmax_rows`); the
   ``partition.scheme = "contiguous"`` shards are ranges of rows, so the block's task solves
   the exact models of the shards inside it (shards of fewer rows than features one by one
   in compiled code, :func:`~p2pdp.learning.compiled.fit_consecutive_shards`) and writes
   them into shared memory
   (:func:`~p2pdp.core.parallel.shared_empty`), and gives back the rows of the shard that
   straddles each of its ends (fewer than a shard), which are solved here at the end. The
   same pass gives the centralised reference's first Newton pass (at ``w = 0``), and keeps
   every label (one byte a row) and the first blocks' rows.
3. **centralised reference**: the streamed Newton of :mod:`p2pdp.learning.models`
   (:func:`~p2pdp.learning.newton.newton_from_block_sums`), each further pass over the rows
   drawing and transforming the features of every block again (not its labels: kept,
   :func:`~p2pdp.data.synthetic.synthetic_block_features`) but the first ones, which the
   fits' pass kept (up to :data:`KEPT_ROWS_BYTES`, freed once these passes end), its
   gradient and Hessian sums computed together (a Newton step's second pass at the same
   point is then free). The last pass, which would only confirm that the last step reached
   the tolerance, is skipped when a bound on the loss's third derivative certifies it
   (:func:`logistic_remainder`): the same model, one pass fewer (a million peers: 3 passes
   over the rows instead of 4). With several local workers (and at most
   :data:`BACKGROUND_MAX_PEERS` peers) the first of these passes runs in a background process
   while the simulation runs (:func:`~p2pdp.core.parallel.in_background`), and in this
   process too once the evaluation reads the model (:class:`_ReferenceBeside`).

Blocks are shared out to the local worker processes (:func:`p2pdp.core.parallel.local_workers`).
Every number is the in-memory training's (:func:`p2pdp.tasks.pipeline.train_peers`): the same
blocks, a peer's model depending on its shard only, the Newton's block sums added in block
order; but the compiled fits' models, which agree with the batched Newton's to about 1e-15
relative, each certified to the tolerance (``tests/tasks/test_streamed.py`` compares the
models and the centralised model to 1e-12, their test errors and the test rows exactly),
and the same for any number of workers. The :class:`~p2pdp.tasks.pipeline.TrainedPeers`
holds no training rows and no shard arrays; what reads them (a vote on the peers' own
rows, posterior sampling, the best-lambda reference, an iterative protocol) loads them
again (:meth:`TrainedPeers.training_rows <p2pdp.tasks.pipeline.TrainedPeers.training_rows>`).

Memory: the local models (P, d), the kept rows and labels (at most
:data:`KEPT_ROWS_BYTES`) and, per worker, a block and its temporaries (about 0.2 GB),
instead of every row (20 rows of 58 features a peer: 9.3 GB at a million peers).
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.boundary import check_numbers
from p2pdp.core.errors import ConfigError
from p2pdp.core.parallel import (
    Background,
    Pending,
    current_workers,
    forked_map,
    forked_pool,
    in_background,
    one_blas_thread,
    shared_empty,
)
from p2pdp.core.progress import set_phase
from p2pdp.core.rng import generator
from p2pdp.data.partition import contiguous_starts
from p2pdp.data.preprocess import FittedPreprocessor, Preprocessor
from p2pdp.data.synthetic import (
    SYNTHETIC_BLOCK_ROWS,
    synthetic_block_bounds,
    synthetic_block_features,
    synthetic_block_logged,
)
from p2pdp.learning.models import MAX_NEWTON_STEPS, LocalModels, LogisticModel
from p2pdp.learning.newton import (
    STREAM_MIN_ROWS,
    BlockSums,
    block_hessian,
    block_sums,
    newton_from_block_sums,
)

__all__ = ["BlockTraining", "block_stream", "stream_gap", "train_in_blocks"]


def stream_gap(config: ScenarioConfig, *, plan: str = "the plan in blocks") -> str | None:
    """Why ``config``'s training is not drawn in blocks (``"setting = value (PLAN needs
    ...)"``), or None when it is (:func:`train_in_blocks`). Only settings of the training
    key: cells that share a training share this answer."""
    data, evaluation = config.data, config.evaluation
    settings: list[tuple[str, Any, bool, str]] = [
        ("data.dataset", data.dataset, data.dataset == "synthetic", "'synthetic'"),
        ("evaluation.split", evaluation.split, evaluation.split == "fixed", "'fixed'"),
        (
            "partition.scheme",
            config.partition.scheme,
            config.partition.scheme == "contiguous",
            "'contiguous'",
        ),
        (
            "training.model",
            config.training.model,
            config.training.model == "logistic",
            "'logistic'",
        ),
        (
            "data.transform",
            data.transform,
            "standardize" not in data.transform,
            "no 'standardize' (its mean and variance are sums, not exact in any order)",
        ),
        ("data.bounds", data.bounds, data.bounds == "data", "'data'"),
        (
            "data.synthetic_rows",
            data.synthetic_rows,
            data.synthetic_rows >= STREAM_MIN_ROWS,
            f">= {STREAM_MIN_ROWS} (smaller runs fit in memory)",
        ),
        (
            "partition.n_peers",
            config.partition.n_peers,
            -(-data.synthetic_rows // config.partition.n_peers) <= SYNTHETIC_BLOCK_ROWS,
            f"shards of at most {SYNTHETIC_BLOCK_ROWS} rows (a shard spans at most two blocks)",
        ),
    ]
    for name, value, covered, wanted in settings:
        if not covered:
            return f"{name} = {value!r} ({plan} needs {wanted})"
    return None


#: What a block's tasks read: the data stream's seed sequence, the rows in all (training and
#: test), the raw features, the training rows.
_Stream = tuple[np.random.SeedSequence, int, int, int]


def block_stream(config: ScenarioConfig, *, fold: int) -> _Stream:
    """``(seed sequence, rows in all, raw features, training rows)`` of ``config``'s synthetic
    rows, which its blocks are drawn from (:func:`~p2pdp.data.synthetic.synthetic_block`);
    ConfigError, naming fold ``fold`` as :func:`p2pdp.tasks.pipeline.load_peer_fold` does, if
    the training rows are fewer than ``partition.n_peers * partition.min_shard_size``."""
    data, partition = config.data, config.partition
    n = data.synthetic_rows
    needed = partition.n_peers * partition.min_shard_size
    if n < needed:
        raise ConfigError(
            f"data set 'synthetic': fold {fold} has {n} training rows, fewer than "
            f"partition.n_peers ({partition.n_peers}) x partition.min_shard_size "
            f"({partition.min_shard_size}) = {needed}"
        )
    seed_seq = generator(config.seed, "synthetic").bit_generator.seed_seq
    assert isinstance(seed_seq, np.random.SeedSequence)  # default_rng's
    return seed_seq, n + data.synthetic_test_rows, data.synthetic_features, n


def _bounds_and_tests(
    stream: _Stream, block: int
) -> tuple[tuple[np.ndarray, np.ndarray] | None, np.ndarray, np.ndarray]:
    """Block ``block``'s training rows' per-feature (min, max) (None without any), and its
    raw test rows (k, d) and labels (k,) (none in most blocks)."""
    seed_seq, n_total, d, n_rows = stream
    bounds = synthetic_block_bounds(seed_seq, block, n_total=n_total, n_features=d, n_rows=n_rows)
    cut = n_rows - block * SYNTHETIC_BLOCK_ROWS
    if cut >= min(SYNTHETIC_BLOCK_ROWS, n_total - block * SYNTHETIC_BLOCK_ROWS):
        return bounds, np.empty((0, d)), np.empty(0, dtype=np.int8)
    X, _, y = synthetic_block_logged(seed_seq, block, n_total=n_total, n_features=d)
    cut = max(cut, 0)
    return bounds, X[cut:], y[cut:]


def _training_block(
    stream: _Stream, fitted: FittedPreprocessor, block: int, kept: _Kept | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Block ``block``'s transformed training rows (m, d_out) and their labels (m,) float64;
    with ``kept`` (:data:`_Kept`), the labels written into its labels and the rows into its
    rows if they have room for the block."""
    seed_seq, n_total, d, n_rows = stream
    _, logged, y = synthetic_block_logged(seed_seq, block, n_total=n_total, n_features=d)
    cut = min(len(y), n_rows - block * SYNTHETIC_BLOCK_ROWS)
    rows = slice(block * SYNTHETIC_BLOCK_ROWS, block * SYNTHETIC_BLOCK_ROWS + cut)
    out = None
    if kept is not None:
        kept[1][rows] = y[:cut]
        out = kept[0][rows] if rows.stop <= len(kept[0]) else None
    return fitted.transform_logged(logged[:cut], out=out), y[:cut].astype(np.float64)


#: A block's share of the fits: (Newton steps, head rows (X, y) of the shard it continues,
#: tail rows (X, y) of the shard it starts and does not end, the reference's loss and
#: gradient sums at w = 0, its Hessian sum there, its rows' largest L2 norm).
_Fitted = tuple[
    int,
    tuple[np.ndarray, np.ndarray],
    tuple[np.ndarray, np.ndarray],
    BlockSums,
    np.ndarray,
    float,
]


#: Rows the reference's later passes may keep instead of drawing again: every training
#: row's label and the first blocks' transformed rows, up to this many bytes in all (2 GiB:
#: every row up to about 4.6 million rows, 230,000 peers of 20 rows, and a fifth of a
#: million peers' rows), held only while the reference's passes run (beside the simulation
#: up to :data:`BACKGROUND_MAX_PEERS` peers: at a million peers the simulation holds the
#: local models and the releases, about 1.4 GiB, so the whole stays under 4 GiB).
KEPT_ROWS_BYTES = 2 * 2**30

#: The kept rows (k B, d_out) float64 of the first k blocks, and the labels (n,) int8 of
#: every training row (written by the fits' pass: a block drawn again for the reference then
#: draws only its features, :func:`~p2pdp.data.synthetic.synthetic_block_features`).
_Kept = tuple[np.ndarray, np.ndarray]


def _fit_block(
    shared: tuple[
        _Stream, FittedPreprocessor, np.ndarray, float, tuple[np.ndarray, np.ndarray], _Kept
    ],
    block: int,
) -> _Fitted:
    """Draw and transform block ``block`` (kept in ``kept`` if it has room), solve the shards
    inside it into the shared ``(weights, grad_norms)``, and return what straddles its ends
    and the reference's sums at ``w = 0`` (:data:`_Fitted`)."""
    stream, fitted, starts, lam, (weights, norms), kept = shared
    X, y = _training_block(stream, fitted, block, kept)
    begin = block * SYNTHETIC_BLOCK_ROWS
    end = begin + len(y)
    first = int(np.searchsorted(starts, begin, side="left"))  # first shard starting here
    last = int(np.searchsorted(starts, end, side="right")) - 1  # shards ending by `end`
    head = int(starts[first]) - begin if first < len(starts) else len(y)
    tail = int(starts[last]) - begin  # the rows of a shard starting here, ending past it
    steps = 0
    cuts = starts[first : last + 1] - begin
    if last > first and np.diff(cuts).max() < X.shape[1]:  # every shard in the dual form
        from p2pdp.learning.compiled import fit_consecutive_shards

        tol = LogisticModel.gradient_tolerance
        weights[first:last], norms[first:last], steps = fit_consecutive_shards(
            X, y, cuts, lam, tol, MAX_NEWTON_STEPS, first_peer=first
        )
    elif last > first:
        shards = [np.arange(a, b, dtype=np.int64) for a, b in itertools.pairwise(cuts.tolist())]
        models = LogisticModel().fit(X, y, shards, lam)
        weights[first:last], norms[first:last] = models.weights, models.grad_norms
        steps = models.iterations
    zero = np.zeros(X.shape[1])
    return (
        steps,
        (X[:head].copy(), y[:head].copy()),
        (X[tail:].copy(), y[tail:].copy()),
        block_sums(X, y, zero),
        block_hessian(X, zero),
        float(np.sqrt(np.einsum("ij,ij->i", X, X).max())),
    )


def _reference_block(
    shared: tuple[_Stream, FittedPreprocessor, _Kept], item: tuple[int, np.ndarray]
) -> tuple[BlockSums, np.ndarray]:
    """Block ``item[0]`` (kept, or drawn and transformed again): its loss and gradient sums
    and its Hessian sum at the model ``item[1]`` (d_out,)."""
    stream, fitted, kept = shared
    block, w = item
    seed_seq, n_total, d, n_rows = stream
    rows = slice(block * SYNTHETIC_BLOCK_ROWS, min((block + 1) * SYNTHETIC_BLOCK_ROWS, n_rows))
    y = kept[1][rows].astype(np.float64)
    if rows.stop <= len(kept[0]):
        X = kept[0][rows]
    else:
        _, logged = synthetic_block_features(seed_seq, block, n_total=n_total, n_features=d)
        X = fitted.transform_logged(logged[: len(y)])
    return block_sums(X, y, w), block_hessian(X, w)


#: The largest ``|sigma''(t)|`` of the logistic function ``sigma`` (where ``sigma(t) = 1/2
#: +- 1 / (2 sqrt 3)``): ``sqrt(3) / 18``, which bounds the third derivative of the loss.
_SIGMA_CURVATURE = math.sqrt(3) / 18


def logistic_remainder(
    second_moments: np.ndarray, radius: float
) -> Callable[[np.ndarray], tuple[float, float]]:
    """The ``remainder`` bounds of :func:`~p2pdp.learning.newton.newton_from_block_sums` for
    the regularised logistic loss on rows of L2 norm at most ``radius`` whose second moments
    ``X^T X / n`` are ``second_moments`` (d, d).

    Each row's loss ``log(1 + exp(-y x.w))`` has a third derivative in ``t = x.w`` of at
    most ``c = sqrt(3) / 18`` in absolute value, so over a step ``s`` (``t`` moving by
    ``x.s``) Taylor's theorem bounds the gradient's remainder by ``mean_i (c / 2) (x_i.s)^2
    ||x_i|| <= (c / 2) radius q`` and the objective's by ``mean_i (c / 6) |x_i.s|^3 <= (c /
    6) radius ||s|| q``, with ``q = s^T (X^T X / n) s`` (the regulariser is quadratic: no
    remainder)."""

    def bounds(step: np.ndarray) -> tuple[float, float]:
        q = abs(float(step @ second_moments @ step))
        return (
            _SIGMA_CURVATURE / 2 * radius * q,
            _SIGMA_CURVATURE / 6 * radius * float(np.linalg.norm(step)) * q,
        )

    return bounds


class _Unknown(Exception):
    """A pass at a point ``w`` (d_out,) whose sums are not known (:class:`_ReferencePasses`
    without pieces)."""

    def __init__(self, w: np.ndarray) -> None:
        super().__init__("a pass over the rows at a point not known yet")
        self.w = w


class _ReferencePasses:
    """``block_sums(w, hessian)`` of :func:`~p2pdp.learning.newton.newton_from_block_sums`
    over blocks drawn again: one pass gives a point's loss, gradient and Hessian sums, kept
    for the Newton step's next call at the same point (``known``: at ``w = 0`` from the fits'
    pass, and any pass computed before). With ``pieces`` None, a point not known raises
    :class:`_Unknown`."""

    def __init__(
        self,
        pieces: Any,
        blocks: Sequence[int],
        known: dict[bytes, tuple[list[BlockSums], list[np.ndarray]]],
    ) -> None:
        self._pieces, self._blocks = pieces, blocks
        self._known = dict(known)
        self.passes = 0

    def __call__(self, w: np.ndarray, hessian: bool) -> Sequence[BlockSums]:
        key = np.asarray(w, dtype=np.float64).tobytes()
        if key not in self._known:
            if self._pieces is None:
                raise _Unknown(np.array(w, dtype=np.float64))
            self.passes += 1
            set_phase(f"training: centralised reference, pass {self.passes + 2} over the rows")
            sums = self._pieces([(block, w) for block in self._blocks])
            self._known = {key: ([s[0] for s in sums], [s[1] for s in sums])}
        return self._known[key][1 if hessian else 0]


#: Up to this many peers, a training in blocks on several local workers solves the
#: centralised reference's later passes beside the simulation (:class:`_ReferenceBeside`:
#: a background process at idle priority until the evaluation says it reads the model, and
#: then this process too, once its evaluation is done), instead of on every worker before
#: the simulation: at a million peers, about 28 s of CPU that no longer hold up the
#: simulation. The kept rows (:data:`KEPT_ROWS_BYTES`) are held until the passes end;
#: beyond this many peers the simulation's own peak (13.2 GiB at ten million) leaves no
#: room for them, and the passes run on the workers, before the simulation, as they did.
BACKGROUND_MAX_PEERS = 2_000_000


@dataclass(frozen=True, slots=True)
class _Reference:
    """What the centralised reference's later passes read: the rows' stream and transform,
    the kept rows, the training blocks, the sums at ``w = 0`` from the fits' pass (loss and
    gradient, Hessian: one per block), ``lam`` and the certifying bound
    (:func:`logistic_remainder`)."""

    stream: _Stream
    fitted: FittedPreprocessor
    kept: _Kept
    blocks: list[int]
    zero: tuple[list[BlockSums], list[np.ndarray]]
    lam: float
    remainder: Callable[[np.ndarray], tuple[float, float]]

    def known(self) -> dict[bytes, tuple[list[BlockSums], list[np.ndarray]]]:
        """The passes known from the fits' pass: the one at ``w = 0``."""
        return {np.zeros(len(self.zero[1][0])).tobytes(): self.zero}


def _newton(reference: _Reference, passes: _ReferencePasses) -> np.ndarray:
    """The centralised model (d_out,): the streamed Newton over ``passes``."""
    stream, fitted = reference.stream, reference.fitted
    centralized, _, _ = newton_from_block_sums(
        passes,
        stream[3],
        fitted.n_features_out,
        reference.lam,
        LogisticModel.gradient_tolerance,
        MAX_NEWTON_STEPS,
        0,
        remainder=reference.remainder,
    )
    return centralized


def _solve_reference(
    reference: _Reference,
    known: dict[bytes, tuple[list[BlockSums], list[np.ndarray]]] | None = None,
) -> np.ndarray:
    """The centralised model (d_out,): the streamed Newton from the sums at ``w = 0`` (and
    the passes ``known``), each later pass over the kept blocks and the others drawn again,
    on the local workers; the same model for any number of them (sums in block order)."""
    stream, fitted, kept = reference.stream, reference.fitted, reference.kept
    known = {**reference.known(), **(known or {})}
    with forked_pool(_reference_block, (stream, fitted, kept), workers=current_workers()) as pieces:
        return _newton(reference, _ReferencePasses(pieces, reference.blocks, known))


@dataclass(frozen=True, slots=True)
class _SharedPass:
    """One pass of the reference at the point ``w`` (d_out,), its blocks shared out to the
    processes that compute it: each takes the next block not taken (``taken``, a counter in
    shared memory with its lock) and writes the block's loss ``(B,)``, gradient ``(B,
    d_out)`` and Hessian ``(B, d_out, d_out)`` sums into shared memory, B training blocks."""

    w: np.ndarray
    taken: Any  # multiprocessing.Value("q")
    losses: np.ndarray
    gradients: np.ndarray
    hessians: np.ndarray

    @classmethod
    def at(cls, w: np.ndarray, blocks: int) -> _SharedPass:
        taken = multiprocessing.get_context("fork").Value("q", 0)
        d = len(w)
        sums = shared_empty((blocks,)), shared_empty((blocks, d)), shared_empty((blocks, d, d))
        return cls(w, taken, *sums)

    def sums(self) -> tuple[list[BlockSums], list[np.ndarray]]:
        """The pass's sums (:class:`_ReferencePasses`), once every block is done."""
        pairs = zip(self.losses, self.gradients, strict=True)
        return [(float(loss), gradient) for loss, gradient in pairs], list(self.hessians)


def _take_blocks(shared: tuple[_Reference, _SharedPass]) -> None:
    """Compute blocks of the pass ``shared[1]``, the next one not taken each time, until
    every block is taken. One BLAS thread: the sums are those of the pool's workers
    (:func:`_reference_block`)."""
    reference, one_pass = shared
    rows = (reference.stream, reference.fitted, reference.kept)
    with one_blas_thread():
        while True:
            with one_pass.taken.get_lock():
                index = one_pass.taken.value
                one_pass.taken.value = index + 1
            if index >= len(reference.blocks):
                return
            block = reference.blocks[index]
            (loss, gradient), hessian = _reference_block(rows, (block, one_pass.w))
            one_pass.losses[index], one_pass.gradients[index] = loss, gradient
            one_pass.hessians[index] = hessian


class _ReferenceBeside:
    """The centralised model (d_out,), its first later pass computed beside the simulation
    (a :class:`~p2pdp.core.parallel.Pending` value, :data:`BACKGROUND_MAX_PEERS`).

    The pass's point ``w`` (d_out,) is known as the fits' pass ends (the Newton from the sums
    at ``w = 0`` up to its first pass at another point: :class:`_Unknown`); its blocks are
    taken one at a time (:class:`_SharedPass`) by a background process (:func:`in_background
    <p2pdp.core.parallel.in_background>`: at idle priority, the simulation keeps the cores
    busy, until :meth:`hurry`) and, from :meth:`result` on, by this process too, whose
    evaluation is then done and leaves its core to the pass. Any later pass (none at a
    million peers: the step after it is certified) runs on the local workers there
    (:func:`_solve_reference`). The same sums in block order: the same model."""

    def __init__(self, reference: _Reference, w: np.ndarray) -> None:
        self._reference: _Reference | None = reference
        self._pass = _SharedPass.at(w, len(reference.blocks))
        with one_blas_thread():  # the background process inherits it (one_blas_thread)
            self._background = in_background(
                _take_blocks, (reference, self._pass), what="the centralised reference's pass"
            )
        self._done: np.ndarray | None = None

    def hurry(self) -> None:
        if isinstance(self._background, Background):
            self._background.hurry()

    def result(self) -> np.ndarray:
        if self._done is None:
            assert self._reference is not None
            self.hurry()
            _take_blocks((self._reference, self._pass))  # the blocks still untaken
            if isinstance(self._background, Background):
                self._background.result()  # and those it took, done
            known = {self._pass.w.tobytes(): self._pass.sums()}
            self._done = _solve_reference(self._reference, known)
            self._reference = None  # the kept rows, freed
        return self._done

    def __reduce__(self) -> tuple[Any, ...]:
        return (np.asarray, (self.result(),))  # the model itself


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockTraining:
    """What a training drawn in blocks (:func:`train_in_blocks`) gives: every peer's exact
    local model, the centralised model (d_out,) (or the :class:`~p2pdp.core.parallel.Pending`
    value computing it: :data:`BACKGROUND_MAX_PEERS`), the transformed test rows ``X_test``
    (n_test, d_out) and labels ``y_test`` (n_test,) int8 in {-1, +1}, and whether the
    transform's bounds came from the training rows (always: min-max bounds, ``data.bounds
    = "data"``)."""

    models: LocalModels
    centralized: np.ndarray | Pending[np.ndarray]
    X_test: np.ndarray
    y_test: np.ndarray
    data_dependent_bounds: bool


def train_in_blocks(config: ScenarioConfig, *, fold: int) -> BlockTraining:
    """The training of :func:`p2pdp.tasks.pipeline.train_in_memory` for ``config`` (which
    :func:`stream_gap` must cover), with the rows drawn block by block and dropped (see the
    module docstring): the same local models, centralised model and test rows. ``fold``
    only names the fold in messages (a fixed split has one).

    Raises
    ------
    ConfigError
        :func:`stream_gap` does not cover ``config`` (naming the setting), or the training
        rows are fewer than ``partition.n_peers * partition.min_shard_size``.
    """
    gap = stream_gap(config)
    if gap is not None:
        raise ConfigError(f"this training cannot be drawn in blocks: {gap}")
    stream = block_stream(config, fold=fold)
    _, n_total, _, n = stream
    data, partition = config.data, config.partition
    blocks = range(math.ceil(n_total / SYNTHETIC_BLOCK_ROWS))
    training = list(range(math.ceil(n / SYNTHETIC_BLOCK_ROWS)))
    workers = current_workers()

    set_phase("training: bounds of the rows, pass 1 over the rows")
    with one_blas_thread():
        drawn = forked_map(_bounds_and_tests, stream, list(blocks), workers=workers)
    low = np.minimum.reduce([b[0][0] for b in drawn if b[0] is not None])
    high = np.maximum.reduce([b[0][1] for b in drawn if b[0] is not None])
    # the fit on the two rows (low, high) gives the bounds of all the rows: min and max are
    # exact in any order (the plan has no standardize step, whose sums are not)
    fitted = Preprocessor(steps=tuple(data.transform)).fit(np.vstack([low, high]))
    X_test = fitted.transform(np.concatenate([b[1] for b in drawn]))
    y_test = np.concatenate([b[2] for b in drawn])
    del drawn

    set_phase("training: local models, pass 2 over the rows")
    n_peers, d_out = partition.n_peers, fitted.n_features_out
    starts = contiguous_starts(n, n_peers)
    if np.diff(starts).max() < d_out:  # the blocks' fits compiled (_fit_block): once, here
        from p2pdp.learning.compiled import compile_fits

        compile_fits()
    if fitted.low is not None:  # their transform compiled (transform_logged): once, here
        from p2pdp.data.compiled import compile_transform

        compile_transform()
    many = workers > 1 and len(training) > 1
    empty = shared_empty if many else np.empty
    weights, norms = empty((n_peers, d_out)), empty((n_peers,))
    lam = config.training.lam
    kept_blocks = (KEPT_ROWS_BYTES - n) // (8 * d_out * SYNTHETIC_BLOCK_ROWS)  # n labels
    kept_rows = min(n, max(kept_blocks, 0) * SYNTHETIC_BLOCK_ROWS)  # whole blocks
    kept = (empty((kept_rows, d_out)), empty((n,), np.int8))
    with one_blas_thread():
        parts = forked_map(
            _fit_block,
            (stream, fitted, starts, lam, (weights, norms), kept),
            training,
            workers=workers,
        )
    iterations = _fit_straddling(parts, starts, lam, weights, norms)
    models = LocalModels(
        weights=weights,
        grad_norms=norms,
        iterations=iterations,
        shard_sizes=np.diff(starts),
    )
    shape = (n_peers, d_out)
    check_numbers(models.weights, "model", LogisticModel(), "fit (weights)", shape=shape)

    zero = ([part[3] for part in parts], [part[4] for part in parts])
    # the rows' second moments X^T X / n: four times the Hessian sums at w = 0 over n
    remainder = logistic_remainder(4 * np.sum(zero[1], axis=0) / n, max(p[5] for p in parts))
    del parts
    reference = _Reference(stream, fitted, kept, training, zero, lam, remainder)
    del kept  # held by the reference's passes (until they end)
    centralized: np.ndarray | Pending[np.ndarray]
    if workers > 1 and n_peers <= BACKGROUND_MAX_PEERS:
        try:  # the Newton from the sums at w = 0, up to its first pass at another point
            centralized = _newton(reference, _ReferencePasses(None, training, reference.known()))
        except _Unknown as unknown:
            centralized = _ReferenceBeside(reference, unknown.w)
    else:
        centralized = _solve_reference(reference)
    return BlockTraining(
        models=models,
        centralized=centralized,
        X_test=X_test,
        y_test=y_test,
        data_dependent_bounds=fitted.data_dependent,
    )


def _fit_straddling(
    parts: Sequence[_Fitted],
    starts: np.ndarray,
    lam: float,
    weights: np.ndarray,
    norms: np.ndarray,
) -> int:
    """Solve the shards that straddle two blocks (the tail of one block's rows and the head
    of the next's) into ``weights`` and ``norms``; the most Newton steps of any shard."""
    X, y, shards, peers = [], [], [], []
    offset = 0
    for block, part in enumerate(parts[:-1]):
        tail, head = part[2], parts[block + 1][1]
        if len(tail[1]) == 0:
            continue
        rows = len(tail[1]) + len(head[1])
        X += [tail[0], head[0]]
        y += [tail[1], head[1]]
        shards.append(np.arange(offset, offset + rows, dtype=np.int64))
        first = (block + 1) * SYNTHETIC_BLOCK_ROWS - len(tail[1])
        peers.append(int(np.searchsorted(starts, first)))
        offset += rows
    steps = max(part[0] for part in parts)
    if shards:
        models = LogisticModel().fit(np.concatenate(X), np.concatenate(y), shards, lam)
        weights[peers], norms[peers] = models.weights, models.grad_norms
        steps = max(steps, models.iterations)
    return steps
