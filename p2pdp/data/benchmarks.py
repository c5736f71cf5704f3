"""The benchmark data sets: Spambase, Statlog Australian credit and Adult (LIBSVM a9a / a9a.t).

:func:`load_dataset` finds a data set's files (:mod:`p2pdp.data.files`), checks them against
its manifest (:mod:`p2pdp.data.manifests`) and parses them (:mod:`p2pdp.data.parsing`) into a
:class:`Dataset`; :func:`spambase`, :func:`australian` and :func:`adult` are the built-in
``dataset`` loaders over it. Every problem with a file (missing, wrong checksum, bad line,
wrong row count) raises :class:`~p2pdp.core.errors.DataError` naming the file.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from p2pdp.core.errors import ConfigError, DataError
from p2pdp.data.files import cache_dir, download_file, locate
from p2pdp.data.loaders import RawData, read_only
from p2pdp.data.manifests import Manifest, load_manifest
from p2pdp.data.parsing import parsed
from p2pdp.data.settings import DataConfig

__all__ = [
    "Dataset",
    "adult",
    "australian",
    "dataset_info",
    "fetch_dataset",
    "load_dataset",
    "spambase",
]


def _checked_split(
    X: Any, y: Any, n_features: int | None, prefix: str
) -> tuple[np.ndarray, np.ndarray]:
    """Validate one (X, y) split and return read-only float64 / int8 arrays."""
    X = np.asarray(X)
    y = np.asarray(y)
    if X.ndim != 2 or (n_features is not None and X.shape[1] != n_features):
        expected = "(n, d)" if n_features is None else f"(n, {n_features})"
        raise ConfigError(f"Dataset.{prefix}X must have shape {expected}, got {X.shape}")
    if not np.isfinite(X).all():
        raise ConfigError(f"Dataset.{prefix}X must be finite, got non-finite values")
    if y.shape != (X.shape[0],):
        raise ConfigError(f"Dataset.{prefix}y must have shape ({X.shape[0]},), got {y.shape}")
    if not np.isin(y, (-1, 1)).all():
        raise ConfigError(
            f"Dataset.{prefix}y must hold only -1 and +1, got values {np.unique(y).tolist()}"
        )
    return read_only(X, np.float64), read_only(y, np.int8)


@dataclass(frozen=True, slots=True, kw_only=True)
class Dataset:
    """A binary classification data set held in memory.

    Arrays are converted to the dtypes below and made read-only (copy before changing them).

    Attributes
    ----------
    name : str
    X : ndarray, shape (n, d), float64
        Dense features, one row per record.
    y : ndarray, shape (n,), int8
        Labels in {-1, +1}.
    feature_names : tuple of d str, or None
    X_test : ndarray, shape (n_test, d), float64, or None
        Predefined test split (Adult), else None.
    y_test : ndarray, shape (n_test,), int8, or None
    files : tuple of Path
        Where each file was found.
    feature_bounds : (low, high) arrays of shape (d,), or None
        Data-independent bounds from the manifest. None: min-max bounds must come from the
        training data, a non-private step.
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    feature_names: tuple[str, ...] | None
    X_test: np.ndarray | None
    y_test: np.ndarray | None
    files: tuple[Path, ...]
    feature_bounds: tuple[np.ndarray, np.ndarray] | None

    def __post_init__(self) -> None:
        X, y = _checked_split(self.X, self.y, None, "")
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        d = X.shape[1]
        if (self.X_test is None) != (self.y_test is None):
            raise ConfigError("Dataset.X_test and Dataset.y_test must both be given or both None")
        if self.X_test is not None:
            X_test, y_test = _checked_split(self.X_test, self.y_test, d, "test ")
            object.__setattr__(self, "X_test", X_test)
            object.__setattr__(self, "y_test", y_test)
        if self.feature_names is not None and len(self.feature_names) != d:
            raise ConfigError(
                f"Dataset.feature_names must have {d} names, got {len(self.feature_names)}"
            )
        if self.feature_bounds is not None:
            low, high = (read_only(bound, np.float64) for bound in self.feature_bounds)
            if low.shape != (d,) or high.shape != (d,) or not (low <= high).all():
                raise ConfigError(
                    f"Dataset.feature_bounds must be (low, high) arrays of shape ({d},) with "
                    f"low <= high, got shapes {low.shape} and {high.shape}"
                )
            object.__setattr__(self, "feature_bounds", (low, high))


def _load(
    name: str, *, path: str | os.PathLike[str] | None, download: bool, verify: bool
) -> tuple[Manifest, Dataset, list[dict[str, Any]]]:
    """Load a data set; also return one report per file (where found, sha256, check result)."""
    manifest = load_manifest(name)
    splits: dict[str, tuple[np.ndarray, ...]] = {}
    reports: list[dict[str, Any]] = []
    for located in locate(manifest, path, download=download):
        spec, file_path = located.spec, located.path
        try:
            data = file_path.read_bytes()
        except OSError as exc:
            raise DataError(f"cannot read {file_path}: {exc}") from exc
        actual = hashlib.sha256(data).hexdigest()
        canonical_name = file_path.name == spec.name
        if verify and canonical_name and actual != spec.sha256:
            raise DataError(
                f"{file_path}: sha256 mismatch: expected {spec.sha256} (manifest of {name!r}), "
                f"got {actual}. The file differs from {spec.url}; replace it with that file, "
                f"or load it with verify=False."
            )
        splits[spec.role] = parsed(data, actual, file_path, manifest, spec)
        reports.append(
            {
                "role": spec.role,
                "name": spec.name,
                "path": str(file_path),
                "origin": located.origin,
                "sha256": actual,
                "sha256_ok": (actual == spec.sha256) if canonical_name else None,
            }
        )
    X_test, y_test = splits.get("test", (None, None))
    bounds = manifest.feature_bounds
    dataset = Dataset(
        name=name,
        X=splits["train"][0],
        y=splits["train"][1],
        feature_names=manifest.feature_names,
        X_test=X_test,
        y_test=y_test,
        files=tuple(Path(report["path"]) for report in reports),
        feature_bounds=None if bounds is None else (np.asarray(bounds[0]), np.asarray(bounds[1])),
    )
    return manifest, dataset, reports


def load_dataset(
    name: str,
    *,
    path: str | os.PathLike[str] | None = None,
    download: bool = True,
    verify: bool = True,
) -> Dataset:
    """Load a benchmark data set as dense arrays with labels in {-1, +1}.

    Parameters
    ----------
    name : str
        One of :func:`available_datasets`: ``"adult"``, ``"australian"``, ``"spambase"``.
    path : path-like, optional
        A file (single-file data sets) or a directory holding the files; searched first.
    download : bool
        Download files found nowhere into the user cache (sha256-checked).
    verify : bool
        Check the sha256 of every file that has its canonical name. ``False`` loads a modified
        copy; its format, labels, row count and positive count are still checked.

    Returns
    -------
    Dataset
        ``X`` (n, d) float64, ``y`` (n,) int8; ``X_test`` / ``y_test`` for Adult's predefined
        split (32,561 + 16,281 rows, d = 123).

    Raises
    ------
    DataError
        A file is missing everywhere (the message lists each place searched and how to fix it),
        its checksum differs, or it is malformed (file name and 1-based line number).
    ConfigError
        Unknown data set name, or a file ``path`` for a multi-file data set.
    """
    return _load(name, path=path, download=download, verify=verify)[1]


def dataset_info(name: str, *, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Describe a data set as found on this machine (never downloads).

    Files are parsed and checked like :func:`load_dataset`, except that a checksum mismatch is
    reported (``sha256_ok: false``) instead of raised.

    Returns
    -------
    dict
        JSON-serialisable: ``name``, ``title``, ``rows``, ``features``, ``positives``,
        ``negatives``, ``test_rows``, ``test_positives``, ``test_negatives`` (the ``test_*``
        keys are None without a predefined split), ``feature_bounds`` (``"manifest"`` if
        data-independent bounds are known, else None) and ``files``: one dict per file with
        ``role``, ``name``, ``path``, ``origin`` (which search place), ``sha256`` and
        ``sha256_ok`` (None if the file has not its canonical name).
    """
    manifest, dataset, reports = _load(name, path=path, download=False, verify=False)
    info: dict[str, Any] = {"name": name, "title": manifest.title}
    for prefix, y in (("", dataset.y), ("test_", dataset.y_test)):
        positives = None if y is None else int((y == 1).sum())
        info[f"{prefix}rows"] = None if y is None else len(y)
        info[f"{prefix}positives"] = positives
        info[f"{prefix}negatives"] = None if y is None or positives is None else len(y) - positives
    info["features"] = dataset.X.shape[1]
    info["feature_bounds"] = None if manifest.feature_bounds is None else "manifest"
    info["files"] = reports
    return info


def fetch_dataset(name: str, *, force: bool = False) -> list[Path]:
    """Download the files of a data set into the user cache and verify their sha256.

    A cached file whose checksum matches is kept unless ``force`` is True.

    Returns
    -------
    list of Path
        The cached files, in manifest order.

    Raises
    ------
    DataError
        The download failed or its checksum does not match (nothing is kept).
    """
    manifest = load_manifest(name)
    directory = cache_dir()
    paths = []
    for spec in manifest.files:
        target = directory / spec.name
        cached = target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == spec.sha256
        paths.append(target if cached and not force else download_file(spec, directory))
    return paths


def _manifest_data(name: str, data: DataConfig) -> RawData:
    dataset = load_dataset(name, path=data.path)
    return RawData(
        name=name,
        X=dataset.X,
        y=dataset.y,
        X_test=dataset.X_test,
        y_test=dataset.y_test,
        feature_bounds=dataset.feature_bounds,
    )


def spambase(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """UCI Spambase (4,601 e-mails x 57 counts and frequencies); no test split, no bounds.

    Read from ``data.path`` (file or directory), ``$P2PDP_DATA_HOME``, the user cache, or
    downloaded (see :func:`load_dataset`). ``rng`` is not used.
    """
    return _manifest_data("spambase", data)


def australian(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """Statlog Australian credit approval (690 x 14); no test split, no bounds. ``rng`` unused."""
    return _manifest_data("australian", data)


def adult(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """Adult as LIBSVM a9a (32,561 x 123) with its test split a9a.t (16,281 rows).

    Every feature is binary, so the manifest's data-independent bounds [0, 1] come along.
    ``rng`` is not used.
    """
    return _manifest_data("adult", data)
