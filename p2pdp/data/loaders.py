"""Data set loaders: the ``dataset`` component kind, what it returns and what it declares.

A scenario's ``data.dataset`` names a *loader* (:class:`DatasetLoader`, the ``dataset`` kind
of :mod:`p2pdp.core.components`) that returns the rows as :class:`RawData`; :func:`load_data` calls
it. Built-in loaders: :func:`~p2pdp.data.benchmarks.spambase`,
:func:`~p2pdp.data.benchmarks.australian`, :func:`~p2pdp.data.benchmarks.adult` (the benchmark
files), :func:`~p2pdp.data.synthetic.synthetic`, and :func:`~p2pdp.data.own_files.csv_file`,
:func:`~p2pdp.data.own_files.libsvm_file` and :func:`~p2pdp.data.own_files.numpy_file` (your
own file at ``data.path``). Anything else is an import string ``"package.module:function"``
whose function returns ``(X, y)`` or ``(X, y, X_test, y_test)``. :func:`provides` says what a
configured data set will provide before it is loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from p2pdp.core import components
from p2pdp.core.boundary import calling
from p2pdp.core.errors import ConfigError, DataError
from p2pdp.data.manifests import available_datasets, load_manifest
from p2pdp.data.settings import FILE_LOADER_OPTIONS, DataConfig

__all__ = [
    "DatasetLoader",
    "Provides",
    "RawData",
    "as_raw_data",
    "builtins_with",
    "data_fingerprint",
    "file_fingerprint",
    "load_data",
    "provides",
    "read_only",
]


def read_only(value: Any, dtype: type) -> np.ndarray:
    """``value`` as a read-only array of ``dtype`` (a view: the caller's array stays writable)."""
    array = np.asarray(value, dtype=dtype).view()
    array.flags.writeable = False
    return array


@dataclass(frozen=True, slots=True, kw_only=True)
class RawData:
    """The rows a data set loader returns, before any fold split or preprocessing.

    Arrays are converted on construction (any array-like: numpy arrays, lists, pandas
    objects, scipy sparse matrices) and made read-only; labels ``{0, 1}`` become ``{-1, +1}``.
    Every problem raises :class:`~p2pdp.core.errors.DataError` naming the data set and the problem
    (non-finite values with their count and first position, wrong shapes, one class only,
    labels other than ``{0, 1}`` or ``{-1, +1}``).

    Attributes
    ----------
    name : str
        What to call the data set in messages (``"spambase"``, ``"mydata:load"``, a file path).
    X : ndarray, shape (n, d), float64
        Features, one row per record, finite; ``n >= 2`` with both classes in ``y``.
    y : ndarray, shape (n,), int8
        Labels in {-1, +1}.
    X_test : ndarray, shape (n_test, d), float64, or None
        A predefined test split (needed by ``evaluation.split = "fixed"``), or None.
    y_test : ndarray, shape (n_test,), int8, or None
        Its labels; given exactly when ``X_test`` is.
    feature_bounds : (low, high) arrays of shape (d,), or None
        Data-independent per-feature bounds (needed by ``data.bounds = "manifest"``): known
        from the domain, never computed from the rows. Values outside are clipped by the
        ``minmax`` step. None: min-max bounds are fitted on the training fold, a global step
        outside the differential-privacy guarantee.
    cv_pools_test : bool
        Under ``evaluation.split = "cv"``, pool the test split with ``X`` before cutting folds
        (True: the test rows are just more draws, as for ``synthetic``) or leave it out and
        cut folds from ``X`` only (False, the default: a predefined test split stays unseen).
    peers : ndarray, shape (n,), int64, or None
        The peer of each row of ``X`` (non-negative integers), read by
        ``partition.scheme = "column"``; None: the data set assigns no peers. Not with
        ``cv_pools_test`` (the pooled test rows would have none).
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    feature_bounds: tuple[np.ndarray, np.ndarray] | None = None
    cv_pools_test: bool = False
    peers: np.ndarray | None = None

    def __post_init__(self) -> None:
        where = f"data set {self.name!r}"
        X = _features(self.X, "X", where)
        y = _labels(self.y, "y", X.shape[0], where)
        if np.unique(y).size < 2:
            label = "+1" if y[0] == 1 else "-1"
            raise DataError(
                f"{where}: y holds only the label {label} (all {y.size} rows); "
                "a classifier needs rows of both classes"
            )
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        if (self.X_test is None) != (self.y_test is None):
            raise DataError(f"{where}: X_test and y_test must both be given or both be None")
        if self.X_test is not None:
            X_test = _features(self.X_test, "X_test", where)
            if X_test.shape[1] != X.shape[1]:
                raise DataError(
                    f"{where}: X_test has {X_test.shape[1]} features but X has {X.shape[1]}; "
                    "the test split needs the same columns"
                )
            object.__setattr__(self, "X_test", X_test)
            object.__setattr__(self, "y_test", _labels(self.y_test, "y_test", len(X_test), where))
        if self.feature_bounds is not None:
            object.__setattr__(
                self, "feature_bounds", _bounds(self.feature_bounds, X.shape[1], where)
            )
        if not isinstance(self.cv_pools_test, bool):
            raise DataError(f"{where}: cv_pools_test must be True or False")
        if self.peers is not None:
            if self.cv_pools_test:
                raise DataError(
                    f"{where}: peers cannot be given with cv_pools_test = True (the pooled "
                    "test rows would have no peer)"
                )
            object.__setattr__(self, "peers", _peer_ids(self.peers, X.shape[0], where))


def _dense(value: Any) -> Any:
    """Scipy sparse matrices become dense arrays; anything else is returned as is."""
    toarray = getattr(value, "toarray", None)
    return toarray() if callable(toarray) and hasattr(value, "nnz") else value


def _features(value: Any, what: str, where: str) -> np.ndarray:
    try:
        X = np.asarray(_dense(value), dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"{where}: {what} must be numeric (convertible to float64): {exc}"
        ) from None
    if X.ndim != 2:
        raise DataError(
            f"{where}: {what} must be a 2-D array (rows x features), got shape {X.shape}"
        )
    if X.shape[0] == 0 or X.shape[1] == 0:
        missing = "rows" if X.shape[0] == 0 else "features"
        raise DataError(f"{where}: {what} has no {missing}, shape {X.shape}")
    # O(d) memory; a NaN or inf always makes its column's sum non-finite. Column sums: 2.7x
    # faster than one sum over a strided view (the synthetic rows' spare column)
    if not np.isfinite(X.sum(axis=0)).all():
        bad = ~np.isfinite(X)
        if bad.any():
            row, column = np.argwhere(bad)[0]
            raise DataError(
                f"{where}: {what} has {int(bad.sum())} non-finite values (NaN or inf); the "
                f"first is {X[row, column]} at row {row}, column {column} (0-based)"
            )
    return read_only(X, np.float64)


def _labels(value: Any, what: str, n_rows: int, where: str) -> np.ndarray:
    y = np.asarray(_dense(value))
    if y.ndim == 2 and y.shape[1] == 1:  # a one-column table
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{where}: {what} must be 1-D (one label per row), got shape {y.shape}")
    if y.shape[0] != n_rows:
        X_name = "X" if what == "y" else "X_test"
        raise DataError(f"{where}: {what} has {y.shape[0]} labels but {X_name} has {n_rows} rows")
    try:
        values = np.unique(y.astype(np.float64))
    except (TypeError, ValueError):
        values = np.unique(y.astype(str))
    if not (set(values.tolist()) <= {0.0, 1.0} or set(values.tolist()) <= {-1.0, 1.0}):
        shown = values[:10].tolist()
        more = f" and {values.size - 10} more" if values.size > 10 else ""
        raise DataError(
            f"{where}: {what} labels must be 0/1 or -1/+1 (binary classification), "
            f"got the values {shown}{more}"
        )
    return read_only(np.where(y.astype(np.float64) == 1.0, 1, -1).astype(np.int8), np.int8)


def _peer_ids(value: Any, n_rows: int, where: str) -> np.ndarray:
    """``value`` as read-only int64 peer ids, one per row: non-negative integers."""
    peers = np.asarray(_dense(value))
    if peers.ndim != 1 or peers.shape[0] != n_rows:
        raise DataError(
            f"{where}: peers must have shape ({n_rows},), one per row, got {peers.shape}"
        )
    if peers.dtype.kind not in "biuf":
        raise DataError(f"{where}: peers must be integer peer ids, got dtype {peers.dtype}")
    numbers = peers.astype(np.float64)
    bad = ~np.isfinite(numbers) | (numbers != np.round(numbers)) | (numbers < 0)
    if bad.any():
        row = int(np.argmax(bad))
        raise DataError(
            f"{where}: peers must be non-negative integers; row {row} (0-based) has "
            f"{peers[row].item()!r}"
        )
    return read_only(peers.astype(np.int64), np.int64)


def _bounds(value: Any, d: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        low, high = (np.asarray(bound, dtype=np.float64) for bound in value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: feature_bounds must be a (low, high) pair of arrays") from None
    if low.shape != (d,) or high.shape != (d,):
        raise DataError(
            f"{where}: feature_bounds low and high must have d = {d} values each, "
            f"got shapes {low.shape} and {high.shape}"
        )
    if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
        raise DataError(f"{where}: feature_bounds must be finite with low <= high")
    return read_only(low, np.float64), read_only(high, np.float64)


class DatasetLoader(Protocol):
    """Where the rows come from: the protocol of the ``dataset`` component kind.

    A loader is any callable named by ``data.dataset`` (a registered name such as
    ``"spambase"``, or an import string ``"package.module:function"``). It is called once per
    fold in the process that trains the fold (worker processes import its module by name, so
    the module must be importable there too: installed, or on ``PYTHONPATH``).

    The full form receives the scenario's ``[data]`` table and a random generator, and returns
    a :class:`RawData`::

        def my_loader(data: DataConfig, *, rng: numpy.random.Generator) -> RawData:
            X, y = ...  # read data.path, draw with rng, ...
            return RawData(name="mine", X=X, y=y)

    Simpler forms are accepted too (:func:`load_data` looks at the signature): the function
    may take no argument, only ``data``, or ``data`` and the keyword ``rng``, and it may
    return a tuple ``(X, y)`` or ``(X, y, X_test, y_test)`` instead of a :class:`RawData`,
    with labels in {0, 1} or {-1, +1} and arrays as numpy arrays, lists or pandas objects::

        def load():
            return X, y

    Parameters
    ----------
    data : DataConfig
        The ``[data]`` table: ``path`` and the other fields a loader may read.
    rng : numpy.random.Generator
        The scenario's data stream (derived from its seed and the name ``"synthetic"``), the
        only randomness a loader may use, so that every fold and worker sees the same rows.

    Returns
    -------
    RawData
        ``X`` (n, d), ``y`` (n,) in {-1, +1}; optionally a test split (needed by
        ``evaluation.split = "fixed"``) and data-independent ``feature_bounds`` (needed by
        ``data.bounds = "manifest"``).
    """

    def __call__(self, data: DataConfig, *, rng: np.random.Generator) -> RawData: ...


def load_data(data: DataConfig, *, rng: np.random.Generator) -> RawData:
    """Resolve ``data.dataset`` to its loader, call it and validate what it returns.

    Parameters
    ----------
    data : DataConfig
        ``data.dataset`` names a registered loader or gives ``"package.module:function"``.
    rng : numpy.random.Generator
        Passed to loaders that take an ``rng`` keyword.

    Returns
    -------
    RawData

    Raises
    ------
    ConfigError
        ``data.dataset`` cannot be resolved, or the loader's signature does not fit.
    DataError
        The loader returned something other than a RawData, ``(X, y)`` or
        ``(X, y, X_test, y_test)``, or the arrays are invalid (see :class:`RawData`).
    """
    key = f"data.dataset = {data.dataset!r}"
    loader = components.resolve("dataset", data.dataset, key="data.dataset")
    if not callable(loader):
        raise ConfigError(f"{key}: {loader!r} is not callable")
    with calling("dataset", loader, "__call__"):
        raw = _call(loader, data, rng, key)
    return as_raw_data(raw, name=data.dataset)


def data_fingerprint(data: DataConfig) -> dict[str, str]:
    """sha256 of what ``data`` reads, by file: to tell whether a data set changed between runs.

    A built-in data set: its manifest's checksums (its files are checked against them when
    read). Any other: the files at ``data.path`` and ``data.test_path`` if they exist, and for
    ``"module:function"`` the module's source file. Files are hashed as bytes (exact). A file
    that does not exist is left out (reading it fails with its own error).
    """
    fingerprint: dict[str, str] = {}
    if data.dataset in available_datasets():
        for spec in load_manifest(data.dataset).files:
            fingerprint[f"{data.dataset}/{spec.name}"] = spec.sha256
        return fingerprint
    files = [Path(value).expanduser() for value in (data.path, data.test_path) if value]
    module, colon, _ = data.dataset.partition(":")
    if colon:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is not None and found.origin and Path(found.origin).is_file():
            files.append(Path(found.origin))
    return {**fingerprint, **file_fingerprint(files)}


def file_fingerprint(paths: Iterable[str | os.PathLike[str]]) -> dict[str, str]:
    """sha256 of each existing file of ``paths`` (as bytes), by its resolved path."""
    fingerprint: dict[str, str] = {}
    for path in map(Path, paths):
        path = path.expanduser()
        if path.is_file():
            fingerprint[str(path.resolve())] = hashlib.sha256(path.read_bytes()).hexdigest()
    return fingerprint


def _call(loader: Any, data: DataConfig, rng: np.random.Generator, key: str) -> Any:
    """Call ``loader`` with what its signature asks for: nothing, ``data``, ``rng=``."""
    try:
        parameters = list(inspect.signature(loader).parameters.values())
    except (TypeError, ValueError):  # no signature (some builtins): assume loader(data)
        return loader(data)
    takes_rng = any(p.name == "rng" and p.kind != p.POSITIONAL_ONLY for p in parameters)
    others = [p for p in parameters if p.name != "rng" or p.kind == p.POSITIONAL_ONLY]
    required = [
        p.name
        for p in others
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    keyword_only = [p.name for p in others if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if len(required) > 1 or keyword_only:
        raise ConfigError(
            f"{key}: a loader takes no argument, or the DataConfig (and optionally the keyword "
            f"rng); {getattr(loader, '__name__', loader)!r} requires {required}"
        )
    takes_data = any(p.kind in _POSITIONAL or p.kind == p.VAR_POSITIONAL for p in others)
    return loader(*((data,) if takes_data else ()), **({"rng": rng} if takes_rng else {}))


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def as_raw_data(result: Any, *, name: str) -> RawData:
    """A loader's return value as :class:`RawData`: a RawData, ``(X, y)`` or
    ``(X, y, X_test, y_test)``.

    Raises
    ------
    DataError
        Anything else, or invalid arrays (naming the data set ``name``).
    """
    if isinstance(result, RawData):
        return result
    if isinstance(result, (tuple, list)) and len(result) in (2, 4):
        X, y, *test = result
        X_test, y_test = test or (None, None)
        return RawData(name=name, X=X, y=y, X_test=X_test, y_test=y_test)
    what = f"a {type(result).__name__}" + (
        f" of {len(result)} items" if isinstance(result, (tuple, list)) else ""
    )
    raise DataError(
        f"data set {name!r}: the loader returned {what}; it must return (X, y), "
        "(X, y, X_test, y_test) or a p2pdp.data.loaders.RawData"
    )


@dataclass(frozen=True, slots=True)
class Provides:
    """What a configured data set will provide, known without loading it (None: unknown).

    ``test_split``: a predefined test split (``evaluation.split = "fixed"``);
    ``feature_bounds``: data-independent bounds (``data.bounds = "manifest"``).
    """

    test_split: bool | None
    feature_bounds: bool | None


def provides(data: DataConfig) -> Provides:
    """What ``data.dataset`` provides, from its manifest or its file settings.

    Manifest data sets answer from their manifest, ``synthetic`` has a test split and no
    bounds, ``csv`` / ``libsvm`` have a test split exactly when ``data.test_path`` is set and
    never bounds (``numpy``: a ``.npz`` file without ``test_path`` may hold a test split, known
    once loaded). Anything else (an import string, a plug-in) is only known once loaded:
    :func:`p2pdp.tasks.pipeline.load_fold` checks it then.
    """
    if data.dataset in available_datasets():
        manifest = load_manifest(data.dataset)
        return Provides(
            any(file.role == "test" for file in manifest.files),
            manifest.feature_bounds is not None,
        )
    if data.dataset == "synthetic":
        return Provides(True, False)
    if data.dataset == "numpy" and data.test_path is None:
        # a .npy table has no test split; a .npz file may hold X_test, y_test
        return Provides(None if str(data.path).lower().endswith(".npz") else False, False)
    if data.dataset in FILE_LOADER_OPTIONS:
        return Provides(data.test_path is not None, False)
    return Provides(None, None)


def builtins_with(what: str) -> list[str]:
    """Names of the built-in data sets that always provide ``what`` (a :class:`Provides` field).

    For messages: ``builtins_with("test_split") == ["adult", "synthetic"]``.
    """
    names = [*available_datasets(), "synthetic"]
    return sorted(name for name in names if getattr(provides(DataConfig(dataset=name)), what))
