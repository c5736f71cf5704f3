"""Everything before the SimPy world: data -> fold -> preprocessing -> shards -> local models.

Local models do not depend on the group size, epsilon, mechanism or publication mode (noise
is added after training), so :func:`train_peers` is keyed by :func:`training_key` and an
experiment shares one training between all cells with the same key.

Random streams are derived by name from the scenario seed (:mod:`p2pdp.core.rng`): the folds from
``("folds", repetition)``, the shards from ``("partition", fold, repetition)``, the data (for
loaders that take an ``rng``, such as ``synthetic``) from ``("synthetic",)``. Two cells that
differ only in, say, the publication mode therefore see the same folds, shards and local
models (common random numbers).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.boundary import calling, check_numbers, check_type
from p2pdp.core.errors import ConfigError
from p2pdp.core.parallel import Pending, current_workers, in_background
from p2pdp.core.rng import generator
from p2pdp.data.loaders import RawData, load_data
from p2pdp.data.partition import (
    GIVEN_SCHEMES,
    check_assignment,
    partition,
    partition_given,
    read_assignment,
    stratified_folds,
)
from p2pdp.data.preprocess import Preprocessor
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.learning.models import LocalModel, LocalModels, LogisticModel, make_model
from p2pdp.learning.newton import STREAM_MIN_ROWS
from p2pdp.learning.settings import EvaluationConfig
from p2pdp.tasks.streamed import stream_gap, train_in_blocks


@dataclass(frozen=True, slots=True, kw_only=True)
class FoldData:
    """Preprocessed training and test rows of one fold.

    ``X_train``/``X_test`` rows have L2 norm <= 1 (bias included) when ``data.transform`` has a
    norm step; labels are in {-1, +1}. ``data_dependent_bounds`` is True when min-max bounds
    or standardisation statistics were fitted on the pooled training fold, a global step
    outside the DP guarantee (as in the seed). ``peers`` is the peer of each training row when
    the user gives the partition (``partition.scheme = "column"`` or ``"file"``), else None.
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    data_dependent_bounds: bool
    peers: np.ndarray | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainedPeers:
    """A fold, its peer shards (index arrays into ``fold.X_train``) and the exact local models.

    ``reference`` is the non-private model fitted on all of the fold's training rows, the
    upper reference line of every accuracy result (d,), or the
    :class:`~p2pdp.core.parallel.Pending` value being solved (:func:`train_peers`,
    :func:`~p2pdp.tasks.streamed.train_in_blocks`); read it as
    :attr:`centralized`. ``key`` is the :func:`training_key` it was prepared for (``None`` if
    built by hand): a simulation refuses models of another key. ``cache`` holds what a task
    computes lazily from this training and reuses across cells.
    """

    fold: FoldData
    shards: tuple[np.ndarray, ...]
    models: LocalModels
    reference: np.ndarray | Pending[np.ndarray] = field(compare=False)
    key: tuple | None = None
    #: Lazily computed, per-training-key extras a task shares between the runs of this fold
    #: (e.g. the logistic task's k-fold refits of the own models); not part of equality.
    cache: dict = field(default_factory=dict, compare=False, repr=False)
    #: ``source() -> (fold, shards)``: the training rows and shards, loaded again, when
    #: ``fold`` holds none (a training drawn in blocks, :mod:`p2pdp.tasks.streamed`); None
    #: when ``fold`` and ``shards`` hold them. Read through :meth:`training_rows`.
    source: Callable[[], tuple[FoldData, tuple[np.ndarray, ...]]] | None = field(
        default=None, compare=False, repr=False
    )

    def training_rows(self) -> tuple[FoldData, tuple[np.ndarray, ...]]:
        """The fold with its training rows, and the peers' shards (index arrays into its
        ``X_train``): ``(fold, shards)`` as held, or loaded again by ``source`` (kept in
        :attr:`cache` for the next reader) when the training was drawn in blocks."""
        if self.source is None:
            return self.fold, self.shards
        if "training_rows" not in self.cache:
            self.cache["training_rows"] = self.source()
        return self.cache["training_rows"]

    def centralized_soon(self) -> None:
        """The centralised model is read soon (:attr:`centralized`): if it is still being
        solved at idle priority, it now shares the cores with what comes first
        (:meth:`Pending.hurry <p2pdp.core.parallel.Pending.hurry>`)."""
        if not isinstance(self.reference, np.ndarray):
            self.reference.hurry()

    @property
    def centralized(self) -> np.ndarray:
        """The centralised model (d,), waiting for it if it is still being solved."""
        reference = self.reference
        return reference if isinstance(reference, np.ndarray) else reference.result()


def load_fold(
    data: DataConfig,
    evaluation: EvaluationConfig,
    *,
    seed: int,
    fold: int,
    repetition: int = 0,
    partition_config: PartitionConfig | None = None,
) -> FoldData:
    """Load ``data.dataset``, take fold ``fold``'s train/test split and preprocess it.

    The loader (:func:`p2pdp.data.loaders.load_data`) gets the stream ``("synthetic",)`` of
    ``seed``. ``evaluation.split = "fixed"`` trains on the loader's ``X, y`` and tests on its
    test split; ``"cv"`` cuts stratified folds from ``X, y`` (pooled with the test split if the
    loader says so). The transform is fitted on the training rows only, then applied to the
    test rows; ``data.bounds = "manifest"`` takes the loader's data-independent bounds. With a
    given partition (``partition_config.scheme`` ``"column"`` or ``"file"``) the peer of every
    row of the data set is read and checked, and the fold keeps those of its training rows.

    Raises
    ------
    ConfigError
        A fixed split or manifest bounds that the data set does not provide, too few rows
        of a class for ``evaluation.cv_folds``, or a peer column the data set lacks.
    DataError
        The loader's rows, or the given peer ids, are invalid (see
        :class:`p2pdp.data.loaders.RawData`, :func:`p2pdp.data.partition.check_assignment`).
    """
    raw = load_data(data, rng=generator(seed, "synthetic"))
    X, y = raw.X, raw.y
    if evaluation.split != "fixed" and raw.X_test is not None and data.dataset == "numpy":
        raise ConfigError(  # data.test_path is refused with the config; this is in data.path
            f"data.path = {data.path!r} holds a test split (X_test, y_test), which "
            f"evaluation.split = {evaluation.split!r} does not use (its folds are cut from X, "
            "y): set evaluation.split = 'fixed' to test on it, or save the file without them"
        )
    if evaluation.split != "fixed" and raw.cv_pools_test:
        if raw.X_test is not None and raw.y_test is not None:
            X, y = np.vstack([raw.X, raw.X_test]), np.concatenate([raw.y, raw.y_test])
    peers = _given_peers(raw, len(y), partition_config)
    if evaluation.split == "fixed":
        if raw.X_test is None or raw.y_test is None:
            raise ConfigError(
                f"evaluation.split = 'fixed' but data set {raw.name!r} has no test split "
                "(its loader returned no X_test, y_test)"
            )
        X_train, y_train, X_test, y_test = raw.X, raw.y, raw.X_test, raw.y_test
    else:
        _check_fold_counts(raw.name, y, evaluation.cv_folds)
        train, test = _cv_split(y, evaluation, seed, fold, repetition)
        X_train, y_train, X_test, y_test = X[train], y[train], X[test], y[test]
        peers = peers[train] if peers is not None else None
    if data.bounds == "manifest" and raw.feature_bounds is None:
        raise ConfigError(
            f"data.bounds = 'manifest' needs data-independent bounds, but data set "
            f"{raw.name!r} has none (its loader returned no feature_bounds)"
        )
    bounds = raw.feature_bounds if data.bounds == "manifest" else None
    fitted = Preprocessor(steps=tuple(data.transform), bounds=bounds).fit(X_train)
    return FoldData(
        X_train=fitted.transform(X_train, out=_spare_room(X_train, fitted.n_features_out)),
        y_train=np.asarray(y_train, dtype=np.int8),
        X_test=fitted.transform(X_test, out=_spare_room(X_test, fitted.n_features_out)),
        y_test=np.asarray(y_test, dtype=np.int8),
        data_dependent_bounds=fitted.data_dependent,
        peers=peers,
    )


def _given_peers(
    raw: RawData, n_rows: int, partition_config: PartitionConfig | None
) -> np.ndarray | None:
    """The checked peer of each of the ``n_rows`` rows folds are cut from, if the user gives it."""
    if partition_config is None or partition_config.scheme not in GIVEN_SCHEMES:
        return None
    n_peers = partition_config.n_peers
    if partition_config.scheme == "file":
        path = str(partition_config.path)
        where = f"partition.path = {path!r} (for data set {raw.name!r})"
        return check_assignment(
            read_assignment(path), n_peers, n_rows=n_rows, where=where, first_line=1
        )
    if raw.peers is None:
        raise ConfigError(
            f"partition.scheme = 'column' but data set {raw.name!r} has no peer column (its "
            "loader returned no RawData.peers; csv and numpy files take data.peer_column)"
        )
    where = f"the peer column of data set {raw.name!r}"
    return check_assignment(raw.peers, n_peers, n_rows=n_rows, where=where)


def _spare_room(X: np.ndarray, columns: int) -> np.ndarray | None:
    """The rows of ``X``'s own array with ``columns`` columns, if ``X`` is their first columns.

    The synthetic loader leaves a spare column after its rows (see
    :func:`p2pdp.data.synthetic.make_synthetic`), so the transform can write its output (one
    column more: the bias) over the raw rows instead of into a second array. None otherwise
    (the transform then allocates its output). Only the loader's own arrays qualify, which
    nothing else holds once the fold is built.
    """
    base = X.base
    if not (
        isinstance(base, np.ndarray)
        and base.ndim == 2
        and base.dtype == np.float64
        and X.dtype == np.float64
        and base.flags.c_contiguous
        and base.shape[1] == columns
        and X.shape[1] <= columns
        and X.strides == base.strides
    ):
        return None
    offset = X.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    first, rest = divmod(offset, base.strides[0])
    if rest or first + X.shape[0] > base.shape[0]:
        return None
    return base[first : first + X.shape[0]]


def _check_fold_counts(name: str, y: np.ndarray, cv_folds: int) -> None:
    """Stratified folds need at least ``cv_folds`` rows of each class."""
    for label in (-1, 1):
        count = int((y == label).sum())
        if count < cv_folds:
            raise ConfigError(
                f"data set {name!r} has {count} rows of class {label:+d}, too few for "
                f"evaluation.cv_folds = {cv_folds} (each fold needs one of each class): "
                "lower evaluation.cv_folds or bring more rows"
            )


def _cv_split(
    y: np.ndarray, evaluation: EvaluationConfig, seed: int, fold: int, repetition: int
) -> tuple[np.ndarray, np.ndarray]:
    """Row indices ``(train, test)`` of fold ``fold``."""
    folds = stratified_folds(y, evaluation.cv_folds, rng=generator(seed, "folds", repetition))
    return folds[fold]


def peer_shards(
    fold: FoldData,
    partition_config: PartitionConfig,
    *,
    rng: np.random.Generator,
    fold_name: str = "the fold",
) -> list[np.ndarray]:
    """Split the fold's training rows into peer shards: ``partition_config.n_peers`` sorted
    int64 index arrays into ``fold.X_train`` (the partition's stream ``rng``; a given partition
    takes the fold's peer ids). ``fold_name`` names the fold in messages."""
    if partition_config.scheme in GIVEN_SCHEMES:
        if fold.peers is None:
            raise ConfigError(
                f"partition.scheme = {partition_config.scheme!r} but the fold carries no peer "
                "ids: load it with load_fold(..., partition_config=...)"
            )
        return partition_given(
            fold.peers,
            partition_config.n_peers,
            min_shard_size=partition_config.min_shard_size,
            where=(
                f"partition.path = {partition_config.path!r}"
                if partition_config.scheme == "file"
                else "the data set's peer column (partition.scheme = 'column')"
            )
            + f", {fold_name}",
        )
    return partition(
        fold.y_train,
        partition_config.n_peers,
        scheme=partition_config.scheme,
        alpha=partition_config.alpha,
        min_shard_size=partition_config.min_shard_size,
        rng=rng,
    )


def train_peers(
    fold: FoldData,
    partition_config: PartitionConfig,
    lam: float,
    *,
    rng: np.random.Generator,
    model: LocalModel | None = None,
    key: tuple | None = None,
    fold_name: str = "the fold",
) -> TrainedPeers:
    """Split the fold's training rows into peer shards (:func:`peer_shards`) and fit every
    peer's exact model.

    ``model`` is the local learner (default: exact logistic regression); ``fold_name`` names
    the fold in messages.
    """
    model = model if model is not None else LogisticModel()
    everyone = (model, fold, lam)
    background = (
        current_workers() > 1
        and len(fold.y_train) >= BACKGROUND_MIN_ROWS
        and type(model) is LogisticModel
    )
    reference: np.ndarray | Pending[np.ndarray] | None = (
        in_background(_centralised, everyone, what="the centralised reference model")
        if background
        else None
    )
    shards = peer_shards(fold, partition_config, rng=rng, fold_name=fold_name)
    models = _fit(model, fold, shards, lam)
    if reference is None:
        reference = _centralised(everyone)
    return TrainedPeers(
        fold=fold, shards=tuple(shards), models=models, reference=reference, key=key
    )


#: With several local workers (:func:`p2pdp.core.parallel.local_workers`) and at least this
#: many training rows, :func:`train_peers` starts solving the centralised reference in a
#: background process as soon as the fold is loaded, at idle priority where the platform
#: allows (:class:`~p2pdp.core.parallel.Background`): it takes mostly the core time that the
#: partition, the local fits, the simulation (one process) and the evaluation leave, and
#: normal priority once the evaluation waits for it. The same model, bit for bit
#: (:func:`p2pdp.learning.models.fit_local_models` does not depend on the workers).
BACKGROUND_MIN_ROWS = STREAM_MIN_ROWS


def _centralised(everyone: tuple[LocalModel, FoldData, float]) -> np.ndarray:
    """The model fitted on every training row of the fold, ``everyone = (model, fold, lam)``."""
    model, fold, lam = everyone
    return _fit(model, fold, [np.arange(len(fold.y_train))], lam).weights[0]


def own_peers(
    config: ScenarioConfig,
    X: np.ndarray,
    y: np.ndarray,
    shards: Sequence[np.ndarray],
    *,
    data_dependent_bounds: bool,
    key: tuple | None = None,
) -> TrainedPeers:
    """The exact local models of one host's peers, from their own training rows only.

    ``X`` (n, d), ``y`` (n,) in {-1, +1}: the host's peers' preprocessed training rows (a
    per-host shard file, :mod:`p2pdp.experiments.network.shards`); ``shards``: one index array into
    them per peer of the host, in peer order. Nothing else is read: the fold's test rows are
    empty and the centralised model, which needs every peer's rows, is NaN.
    """
    fold = FoldData(
        X_train=X,
        y_train=np.asarray(y, dtype=np.int8),
        X_test=np.zeros((0, X.shape[1])),
        y_test=np.zeros(0, dtype=np.int8),
        data_dependent_bounds=data_dependent_bounds,
    )
    models = _fit(make_model(config.training.model), fold, shards, config.training.lam)
    return TrainedPeers(
        fold=fold,
        shards=tuple(shards),
        models=models,
        reference=np.full(X.shape[1], np.nan),
        key=key,
    )


def shard_key(config: ScenarioConfig) -> tuple:
    """Everything the peers' training rows depend on (the seed, data, split and partition):
    the :func:`training_key` without the fold, repetition, lambda and model."""
    evaluation = config.evaluation
    return (config.seed, config.data, evaluation.split, evaluation.cv_folds, config.partition)


def _fit(
    model: LocalModel, fold: FoldData, shards: Sequence[np.ndarray], lam: float
) -> LocalModels:
    """``model.fit`` on ``shards`` of the fold's training rows, its output checked."""
    with calling("model", model, "fit"):
        models = model.fit(fold.X_train, fold.y_train, shards, lam)
    check_type(models, LocalModels, "model", model, "fit")
    shape = (len(shards), fold.X_train.shape[1])
    check_numbers(models.weights, "model", model, "fit (weights)", shape=shape)
    check_numbers(models.grad_norms, "model", model, "fit (grad_norms)", shape=shape[:1])
    return models


def training_key(config: ScenarioConfig, *, fold: int, repetition: int) -> tuple:
    """Everything :func:`prepare_peers` depends on: cells with equal keys share a training."""
    evaluation = config.evaluation
    return (
        config.seed,
        fold,
        repetition,
        config.data,
        evaluation.split,
        evaluation.cv_folds,
        config.partition,
        config.training.lam,
        config.training.model,
    )


def load_peer_fold(config: ScenarioConfig, *, fold: int, repetition: int = 0) -> FoldData:
    """Fold ``fold`` of ``config``'s data (:func:`load_fold`), checked to hold enough rows.

    Raises
    ------
    ConfigError
        The fold has fewer training rows than ``partition.n_peers * partition.min_shard_size``.
    """
    data = load_fold(
        config.data,
        config.evaluation,
        seed=config.seed,
        fold=fold,
        repetition=repetition,
        partition_config=config.partition,
    )
    partition_config = config.partition
    needed = partition_config.n_peers * partition_config.min_shard_size
    if len(data.y_train) < needed:
        raise ConfigError(
            f"data set {config.data.dataset!r}: fold {fold} has {len(data.y_train)} training "
            f"rows, fewer than partition.n_peers ({partition_config.n_peers}) x "
            f"partition.min_shard_size ({partition_config.min_shard_size}) = {needed}"
        )
    return data


def fold_name(fold: int, repetition: int) -> str:
    """How messages name fold ``fold`` of repetition ``repetition``."""
    return f"fold {fold}" + (f" of repetition {repetition}" if repetition else "")


def partition_stream(config: ScenarioConfig, *, fold: int, repetition: int) -> np.random.Generator:
    """The stream the peer shards of a fold are drawn from (:func:`peer_shards`)."""
    return generator(config.seed, "partition", fold, repetition)


def prepare_peers(config: ScenarioConfig, *, fold: int, repetition: int = 0) -> TrainedPeers:
    """Load fold ``fold`` of ``config``'s data (:func:`load_peer_fold`) and train every
    peer's local model.

    A large synthetic training with contiguous shards
    (:func:`p2pdp.tasks.streamed.stream_gap`) is drawn, fitted and dropped block by block
    instead (:func:`p2pdp.tasks.streamed.prepare_streamed`): the same models, centralised
    model and test rows, its training rows loaded again only if something reads them
    (:meth:`TrainedPeers.training_rows`)."""
    if stream_gap(config) is not None:
        return train_in_memory(config, fold=fold, repetition=repetition)
    trained = train_in_blocks(config, fold=fold)
    return TrainedPeers(
        fold=FoldData(
            X_train=np.empty((0, trained.X_test.shape[1])),  # drawn again when read
            y_train=np.empty(0, dtype=np.int8),
            X_test=trained.X_test,
            y_test=trained.y_test,
            data_dependent_bounds=trained.data_dependent_bounds,
        ),
        shards=(),
        models=trained.models,
        reference=trained.centralized,
        key=training_key(config, fold=fold, repetition=repetition),
        source=functools.partial(load_training_rows, config, fold=fold, repetition=repetition),
    )


def train_in_memory(config: ScenarioConfig, *, fold: int, repetition: int = 0) -> TrainedPeers:
    """:func:`prepare_peers` with every training row in memory (:func:`load_peer_fold`, then
    :func:`train_peers`), whatever the settings."""
    return train_peers(
        load_peer_fold(config, fold=fold, repetition=repetition),
        config.partition,
        config.training.lam,
        rng=partition_stream(config, fold=fold, repetition=repetition),
        model=make_model(config.training.model),
        key=training_key(config, fold=fold, repetition=repetition),
        fold_name=fold_name(fold, repetition),
    )


def load_training_rows(
    config: ScenarioConfig, *, fold: int, repetition: int = 0
) -> tuple[FoldData, tuple[np.ndarray, ...]]:
    """Fold ``fold``'s training rows and the peers' shards (:func:`load_peer_fold`,
    :func:`peer_shards`): what a training drawn in blocks loads again for a reader of its
    rows (:attr:`TrainedPeers.source`)."""
    data = load_peer_fold(config, fold=fold, repetition=repetition)
    shards = peer_shards(
        data,
        config.partition,
        rng=partition_stream(config, fold=fold, repetition=repetition),
        fold_name=fold_name(fold, repetition),
    )
    return data, tuple(shards)
