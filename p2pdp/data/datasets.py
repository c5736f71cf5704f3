"""Data sets: the benchmark files, synthetic data, your own files and your own loader.

A scenario's ``data.dataset`` names a *loader* (:class:`DatasetLoader`, the ``dataset`` kind
of :mod:`p2pdp.core.components`) that returns the rows as :class:`RawData`; :func:`load_data` calls
it. Built-in loaders: :func:`spambase`, :func:`australian`, :func:`adult` (the benchmark
files below), :func:`synthetic`, :func:`csv_file`, :func:`libsvm_file` and :func:`numpy_file`
(your own file at ``data.path``). Anything else is an import string
``"package.module:function"`` whose function returns ``(X, y)`` or ``(X, y, X_test, y_test)``.

Benchmark data sets: Spambase, Statlog Australian credit and Adult (LIBSVM a9a / a9a.t).

Each data set is described by a TOML manifest, ``datasets/<name>.toml`` in the repository
(``p2pdp/_manifests/`` in an installed wheel): canonical download address, format, file names,
expected rows, features and positives, sha256 and, where the domain gives them,
data-independent per-feature bounds.

Each file of a data set is looked up in this order:

1. the ``path`` argument: a file (single-file data sets only) or a directory holding the files;
2. the directory ``$P2PDP_DATA_HOME``;
3. the user cache, ``$XDG_CACHE_HOME/p2pdp`` or ``~/.cache/p2pdp``;
4. with ``download=True``, a download from the canonical address into the user cache, kept only
   if its sha256 matches the manifest.

Labels become ``-1`` / ``+1`` (int8) and features dense float64 arrays. Every problem with a
file (missing, wrong checksum, bad line, wrong row count) raises
:class:`~p2pdp.core.errors.DataError`
naming the file and, for a bad line, its 1-based line number.

Feature bounds: only a manifest's ``feature_bounds`` are data-independent (Adult: every feature
is binary). Without them, min-max bounds must be computed from the training data, a global step
that reads every peer's records and is not covered by the differential-privacy guarantee.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib.util
import inspect
import io
import math
import os
import re
import sys
import tempfile
import urllib.request
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from p2pdp.core import components
from p2pdp.core.boundary import calling
from p2pdp.core.errors import ConfigError, DataError
from p2pdp.core.parallel import current_workers, forked_map, prefault, shared_empty
from p2pdp.data.settings import FILE_LOADER_OPTIONS, DataConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "DATA_HOME_ENV",
    "DOWNLOAD_TIMEOUT_SECONDS",
    "DataFile",
    "Dataset",
    "DatasetLoader",
    "Manifest",
    "Provides",
    "RawData",
    "adult",
    "as_raw_data",
    "australian",
    "available_datasets",
    "builtins_with",
    "csv_file",
    "data_home_candidates",
    "dataset_info",
    "fetch_dataset",
    "file_fingerprint",
    "libsvm_file",
    "load_data",
    "load_dataset",
    "load_manifest",
    "make_synthetic",
    "numpy_file",
    "provides",
    "spambase",
    "synthetic",
    "synthetic_block",
    "synthetic_block_bounds",
    "synthetic_block_logged",
    "synthetic_seed",
]

DATA_HOME_ENV = "P2PDP_DATA_HOME"
DOWNLOAD_TIMEOUT_SECONDS = 60.0
FORMATS = ("csv", "whitespace", "libsvm")
_DELIMITERS = {"csv": ",", "whitespace": None}
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


# --- manifests --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class DataFile:
    """One file of a data set, as its manifest describes it.

    Attributes
    ----------
    role : {"train", "test"}
        ``"test"`` marks a predefined test split.
    name : str
        File name looked up in each data directory.
    url : str
        Canonical ``https://`` download address.
    sha256 : str
        Lowercase hex digest of the canonical file.
    rows : int
        Number of records (data lines), >= 1.
    positives : int
        Number of records with the positive label, in ``0..rows``.
    """

    role: str
    name: str
    url: str
    sha256: str
    rows: int
    positives: int

    def __post_init__(self) -> None:
        where = f"data file {self.name!r}"
        if self.role not in ("train", "test"):
            raise ConfigError(f"{where}: role must be 'train' or 'test', got {self.role!r}")
        if not self.name or Path(self.name).name != self.name:
            raise ConfigError(f"{where}: name must be a bare file name, got {self.name!r}")
        if not self.url.startswith("https://"):
            raise ConfigError(f"{where}: url must start with https://, got {self.url!r}")
        if not _SHA256_HEX.fullmatch(self.sha256):
            raise ConfigError(
                f"{where}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}"
            )
        if type(self.rows) is not int or self.rows < 1:
            raise ConfigError(f"{where}: rows must be an integer >= 1, got {self.rows!r}")
        if type(self.positives) is not int or not 0 <= self.positives <= self.rows:
            raise ConfigError(
                f"{where}: positives must be an integer in 0..{self.rows}, got {self.positives!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Manifest:
    """What a data set is, where it comes from and what its files must contain.

    Attributes
    ----------
    name, title, homepage, license, citation : str
        Identity and provenance.
    format : {"csv", "whitespace", "libsvm"}
        Dense formats have one record per line, features then the label; ``libsvm`` lines are
        ``<label> <index>:<value> ...`` with 1-based, strictly increasing indices.
    n_features : int
        Number of features d (the label column not counted).
    negative_label, positive_label : float
        Raw label values mapped to -1 and +1.
    files : tuple of DataFile
        One ``"train"`` file and at most one ``"test"`` file.
    feature_names : tuple of str, length d, or None
    feature_bounds : (low, high) tuples of d floats, or None
        Data-independent bounds every value must lie in (checked on load). ``None`` means that
        min-max bounds have to come from the training data, which is a non-private step.
    """

    name: str
    title: str
    homepage: str
    license: str
    citation: str
    format: str
    n_features: int
    negative_label: float
    positive_label: float
    files: tuple[DataFile, ...]
    feature_names: tuple[str, ...] | None = None
    feature_bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        where = f"manifest {self.name!r}"
        if self.format not in FORMATS:
            raise ConfigError(f"{where}: format must be one of {FORMATS}, got {self.format!r}")
        d = self.n_features
        if type(d) is not int or d < 1:
            raise ConfigError(f"{where}: n_features must be an integer >= 1, got {d!r}")
        if self.negative_label == self.positive_label:
            raise ConfigError(
                f"{where}: negative_label and positive_label must differ, "
                f"got {self.negative_label!r} for both"
            )
        roles = sorted(file.role for file in self.files)
        if roles not in (["train"], ["test", "train"]):
            raise ConfigError(
                f"{where}: files must be one 'train' file and at most one 'test' file, "
                f"got roles {roles}"
            )
        if self.feature_names is not None and (
            len(self.feature_names) != d or len(set(self.feature_names)) != d
        ):
            raise ConfigError(
                f"{where}: feature_names must be {d} distinct names, "
                f"got {len(self.feature_names)} names ({len(set(self.feature_names))} distinct)"
            )
        if self.feature_bounds is not None:
            low, high = (np.asarray(bound, dtype=np.float64) for bound in self.feature_bounds)
            if low.shape != (d,) or high.shape != (d,):
                raise ConfigError(
                    f"{where}: feature_bounds low and high must have {d} values each, "
                    f"got {low.size} and {high.size}"
                )
            if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
                raise ConfigError(
                    f"{where}: feature_bounds must be finite with low <= high, "
                    f"got low={low.tolist()}, high={high.tolist()}"
                )


def _manifest_dir() -> Path:
    """Directory of the manifests: ``p2pdp/_manifests`` (wheel) or ``<repo>/datasets``."""
    package_dir = Path(__file__).resolve().parents[1]  # p2pdp/
    installed = package_dir / "_manifests"
    return installed if installed.is_dir() else package_dir.parent / "datasets"


def available_datasets() -> list[str]:
    """Names of the data sets that have a manifest, sorted."""
    return sorted(path.stem for path in _manifest_dir().glob("*.toml"))


def _check_keys(cls: type, raw: Any, where: str) -> None:
    """Reject a TOML value that is not a table, or has keys unknown to or missing from ``cls``."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table, got {raw!r}")
    known = {field.name for field in fields(cls)}
    unknown = sorted(raw.keys() - known)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown}; allowed keys are {sorted(known)}")
    required = [field.name for field in fields(cls) if field.default is MISSING]
    missing = [key for key in required if key not in raw]
    if missing:
        raise ConfigError(f"{where}: missing keys {missing}")


def _expand_bounds(raw: Any, n_features: int, where: str) -> tuple[tuple[float, ...], ...]:
    """``{low = number | list, high = number | list}`` -> (low, high) tuples of d floats."""
    try:
        if set(raw) != {"low", "high"}:
            raise ValueError
        return tuple(
            tuple(np.broadcast_to(np.asarray(raw[key], dtype=np.float64), (n_features,)).tolist())
            for key in ("low", "high")
        )
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where}: feature_bounds must be a table with keys 'low' and 'high', each a number "
            f"or a list of n_features={n_features} numbers, got {raw!r}"
        ) from None


def load_manifest(name: str) -> Manifest:
    """Read and validate the manifest of data set ``name``.

    Raises
    ------
    ConfigError
        Unknown data set, invalid TOML, unknown or missing keys, or invalid values.
    """
    names = available_datasets()
    if name not in names:
        raise ConfigError(f"dataset must be one of {names}, got {name!r}")
    source = _manifest_dir() / f"{name}.toml"
    try:
        raw = tomllib.loads(source.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from exc
    _check_keys(Manifest, raw, str(source))
    files = raw["files"]
    if not isinstance(files, list):
        raise ConfigError(f"{source}: files must be an array of tables ([[files]]), got {files!r}")
    for i, table in enumerate(files):
        _check_keys(DataFile, table, f"{source}: files[{i}]")
    bounds = raw.get("feature_bounds")
    manifest = Manifest(
        **{
            **raw,
            "files": tuple(DataFile(**table) for table in files),
            "feature_names": None if "feature_names" not in raw else tuple(raw["feature_names"]),
            "feature_bounds": None
            if bounds is None
            else _expand_bounds(bounds, raw["n_features"], str(source)),
        }
    )
    if manifest.name != name:
        raise ConfigError(f"{source}: name must be {name!r} (the file name), got {manifest.name!r}")
    return manifest


# --- the loaded data set ----------------------------------------------------------------------
def _read_only(value: Any, dtype: type) -> np.ndarray:
    """``value`` as a read-only array of ``dtype`` (a view: the caller's array stays writable)."""
    array = np.asarray(value, dtype=dtype).view()
    array.flags.writeable = False
    return array


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
    return _read_only(X, np.float64), _read_only(y, np.int8)


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
            low, high = (_read_only(bound, np.float64) for bound in self.feature_bounds)
            if low.shape != (d,) or high.shape != (d,) or not (low <= high).all():
                raise ConfigError(
                    f"Dataset.feature_bounds must be (low, high) arrays of shape ({d},) with "
                    f"low <= high, got shapes {low.shape} and {high.shape}"
                )
            object.__setattr__(self, "feature_bounds", (low, high))


# --- locating and downloading files -----------------------------------------------------------
def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "p2pdp"


def _search_dirs(explicit: Path | None) -> list[tuple[Path, str]]:
    """Directories to search, in order, each with a label for messages."""
    dirs = [] if explicit is None else [(explicit, "path argument")]
    env = os.environ.get(DATA_HOME_ENV)
    if env:
        dirs.append((Path(env).expanduser(), f"${DATA_HOME_ENV}"))
    dirs.append((_cache_dir(), "user cache"))
    return dirs


def data_home_candidates() -> list[Path]:
    """Directories searched for data files after an explicit ``path``, in order.

    ``$P2PDP_DATA_HOME`` (if set), then the user cache (``$XDG_CACHE_HOME/p2pdp`` or
    ``~/.cache/p2pdp``), which is also where downloads go.
    """
    return [directory for directory, _ in _search_dirs(None)]


def _download(spec: DataFile, directory: Path) -> Path:
    """Download ``spec.url`` to ``directory / spec.name``, keeping it only if sha256 matches.

    The bytes go to a temporary file in ``directory`` that is renamed into place once the
    checksum is verified, so an interrupted or corrupted download never leaves a file behind.
    """
    target = directory / spec.name
    digest = hashlib.sha256()
    temporary: Path | None = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=directory, prefix=f".{spec.name}.", suffix=".part")
        temporary = Path(name)
        with (
            os.fdopen(handle, "wb") as out,
            urllib.request.urlopen(spec.url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response,
        ):
            while chunk := response.read(1 << 16):
                digest.update(chunk)
                out.write(chunk)
        actual = digest.hexdigest()
        if actual != spec.sha256:
            raise DataError(
                f"downloaded {spec.url} has sha256 {actual}, the manifest expects {spec.sha256}; "
                f"the download was discarded"
            )
        os.replace(temporary, target)
    except (OSError, http.client.HTTPException) as exc:
        raise DataError(f"could not download {spec.url} to {target}: {exc}") from exc
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
    return target


@dataclass(frozen=True, slots=True)
class _Located:
    spec: DataFile
    path: Path
    origin: str


def _locate_file(
    dataset: str, spec: DataFile, dirs: list[tuple[Path, str]], *, download: bool
) -> _Located:
    for directory, origin in dirs:
        candidate = directory / spec.name
        if candidate.is_file():
            return _Located(spec, candidate, origin)
    reason = "downloads are off (download=False)"
    if download:
        try:
            return _Located(spec, _download(spec, _cache_dir()), "downloaded")
        except DataError as exc:
            reason = str(exc)
    looked = "\n".join(f"  - {directory / spec.name} ({origin})" for directory, origin in dirs)
    unset = "" if os.environ.get(DATA_HOME_ENV) else f" (${DATA_HOME_ENV} is not set)"
    raise DataError(
        f"data file {spec.name!r} of data set {dataset!r} not found. Looked in:\n{looked}\n"
        f"Not downloaded: {reason}.\n"
        f"Fix: export {DATA_HOME_ENV}=/dir/with/files{unset}, "
        f"or run `p2pdp datasets fetch {dataset}` (downloads {spec.url} into {_cache_dir()})."
    )


def _locate(
    manifest: Manifest, path: str | os.PathLike[str] | None, *, download: bool
) -> list[_Located]:
    explicit = None if path is None else Path(path).expanduser()
    if explicit is not None and not explicit.exists():
        raise DataError(f"path {explicit} does not exist")
    if explicit is not None and explicit.is_file():
        if len(manifest.files) != 1:
            names = [spec.name for spec in manifest.files]
            raise ConfigError(
                f"path must be a directory holding {names} for data set {manifest.name!r}, "
                f"got the file {explicit}"
            )
        return [_Located(manifest.files[0], explicit, "path argument")]
    dirs = _search_dirs(explicit)
    return [_locate_file(manifest.name, spec, dirs, download=download) for spec in manifest.files]


# --- parsing ----------------------------------------------------------------------------------
def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _width_problem(n_columns: int, n_features: int) -> str:
    return f"{n_columns} columns, expected {n_features + 1} ({n_features} features and the label)"


def _dense_line_problem(line: str, delimiter: str | None, n_features: int) -> str | None:
    cells = line.split(delimiter)
    if len(cells) != n_features + 1:
        return _width_problem(len(cells), n_features)
    for column, cell in enumerate(cells, 1):
        if not _is_number(cell):
            return f"column {column}: non-numeric cell {cell.strip()!r}"
    return None


def _libsvm_line_problem(line: str, n_features: int) -> str | None:
    label, *pairs = line.split()
    if not _is_number(label):
        return f"label {label!r} is not a number"
    previous = 0
    for pair in pairs:
        index_text, colon, value = pair.partition(":")
        if not colon:
            return f"token {pair!r} is not <index>:<value>"
        try:
            index = int(index_text)
        except ValueError:
            return f"feature index {index_text!r} is not an integer"
        if not 1 <= index <= n_features:
            return f"feature index {index} is outside 1..{n_features}"
        if index <= previous:
            return f"feature indices must increase, got {index} after {previous}"
        if not _is_number(value):
            return f"value {value!r} of feature {index} is not a number"
        previous = index
    return None


def _line_error(path: Path, line_number: int, problem: str) -> DataError:
    return DataError(f"{path}, line {line_number}: {problem}")


def _parse_table(
    data: bytes, rows: list[tuple[int, str]], path: Path, manifest: Manifest
) -> tuple[np.ndarray, np.ndarray]:
    """Fast parse into dense (X, raw labels); on failure find and report the first bad line."""
    from sklearn.datasets import load_svmlight_file

    d = manifest.n_features
    try:
        if manifest.format == "libsvm":
            sparse, labels = load_svmlight_file(
                io.BytesIO(data), n_features=d, zero_based=False, dtype=np.float64
            )
            return sparse.toarray(), labels
        delimiter = _DELIMITERS[manifest.format]
        table = np.loadtxt(
            [line for _, line in rows],
            delimiter=delimiter,
            dtype=np.float64,
            ndmin=2,
            comments=None,
        )
    except (ValueError, OverflowError) as exc:
        for line_number, line in rows:
            problem = (
                _libsvm_line_problem(line, d)
                if manifest.format == "libsvm"
                else _dense_line_problem(line, _DELIMITERS[manifest.format], d)
            )
            if problem is not None:
                raise _line_error(path, line_number, problem) from exc
        raise DataError(f"{path}: cannot be read as {manifest.format}: {exc}") from exc
    if table.shape[1] != d + 1:
        raise _line_error(path, rows[0][0], _width_problem(table.shape[1], d))
    return table[:, :-1], table[:, -1]


def _parse(data: bytes, path: Path, manifest: Manifest, spec: DataFile) -> tuple[np.ndarray, ...]:
    """Parse and check one file; return (X, y) with y in {-1, +1}."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from exc
    # (1-based line number, content) of every data line; libsvm allows '#' comments.
    strip_comment = manifest.format == "libsvm"
    rows = [
        (number, line.split("#", 1)[0] if strip_comment else line)
        for number, line in enumerate(text.split("\n"), 1)
    ]
    rows = [(number, line) for number, line in rows if line.strip()]
    if not rows:
        raise DataError(f"{path}: the file is empty (no data lines)")
    X, labels = _parse_table(data, rows, path, manifest)

    def fail(row: int, problem: str) -> DataError:
        return _line_error(path, rows[row][0], problem)

    def feature(column: int) -> str:
        names = manifest.feature_names
        return f"feature {column + 1}" + ("" if names is None else f" ({names[column]})")

    non_finite = np.argwhere(~np.isfinite(X))
    if non_finite.size:
        row, column = non_finite[0]
        raise fail(row, f"{feature(column)} is {X[row, column]}, not a finite number")
    positive = labels == manifest.positive_label
    known = positive | (labels == manifest.negative_label)
    if not known.all():
        row = int(np.argmin(known))
        raise fail(
            row,
            f"unexpected label {labels[row]:g}, expected {manifest.negative_label:g} (negative) "
            f"or {manifest.positive_label:g} (positive)",
        )
    if manifest.feature_bounds is not None:
        low, high = (np.asarray(bound) for bound in manifest.feature_bounds)
        outside = np.argwhere((X < low) | (X > high))
        if outside.size:
            row, column = outside[0]
            raise fail(
                row,
                f"{feature(column)} = {X[row, column]:g} is outside the manifest's "
                f"data-independent bounds [{low[column]:g}, {high[column]:g}]",
            )
    if len(labels) != spec.rows:
        raise DataError(
            f"{path}: {len(labels)} data lines, the manifest of {manifest.name!r} expects "
            f"{spec.rows} (truncated file, or extra lines)"
        )
    if positive.sum() != spec.positives:
        raise DataError(
            f"{path}: {positive.sum()} positive labels, the manifest of {manifest.name!r} "
            f"expects {spec.positives}"
        )
    return X, np.where(positive, 1, -1).astype(np.int8)


#: Parsed files of this process, by (manifest, file, sha256 of the bytes, path): a sweep reads
#: the same file for every fold (parsing Spambase takes 40 ms); at most _PARSED_FILES kept.
_PARSED: dict[tuple[Manifest, DataFile, str, str], tuple[np.ndarray, ...]] = {}
_PARSED_FILES = 4


def _parsed(
    data: bytes, sha256: str, path: Path, manifest: Manifest, spec: DataFile
) -> tuple[np.ndarray, ...]:
    """:func:`_parse` of ``data`` (whose sha256 is ``sha256``), parsed once per process; the
    arrays are read-only (every load shares them)."""
    key = (manifest, spec, sha256, str(path))
    arrays = _PARSED.get(key)
    if arrays is None:
        arrays = _parse(data, path, manifest, spec)
        for array in arrays:
            array.flags.writeable = False
        while len(_PARSED) >= _PARSED_FILES:
            del _PARSED[next(iter(_PARSED))]  # the oldest
        _PARSED[key] = arrays
    return arrays


# --- public loaders ---------------------------------------------------------------------------
def _load(
    name: str, *, path: str | os.PathLike[str] | None, download: bool, verify: bool
) -> tuple[Manifest, Dataset, list[dict[str, Any]]]:
    """Load a data set; also return one report per file (where found, sha256, check result)."""
    manifest = load_manifest(name)
    splits: dict[str, tuple[np.ndarray, ...]] = {}
    reports: list[dict[str, Any]] = []
    for located in _locate(manifest, path, download=download):
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
        splits[spec.role] = _parsed(data, actual, file_path, manifest, spec)
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
    directory = _cache_dir()
    paths = []
    for spec in manifest.files:
        target = directory / spec.name
        cached = target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == spec.sha256
        paths.append(target if cached and not force else _download(spec, directory))
    return paths


# --- data set loaders: the `dataset` component kind -------------------------------------------
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
    return _read_only(X, np.float64)


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
    return _read_only(np.where(y.astype(np.float64) == 1.0, 1, -1).astype(np.int8), np.int8)


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
    return _read_only(peers.astype(np.int64), np.int64)


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
    return _read_only(low, np.float64), _read_only(high, np.float64)


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
        "(X, y, X_test, y_test) or a p2pdp.data.datasets.RawData"
    )


# --- built-in loaders (registered in p2pdp.core.components)
# ----------------------------------------
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


def synthetic_block_logged(
    seed_seq: np.random.SeedSequence, block: int, *, n_total: int, n_features: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`synthetic_block`'s ``X`` (m, n_features) and ``y`` (m,), with ``log1p(X)``
    (m, n_features) between them: the labels' logits read it, and so can the default
    transform's first step (``sign(x) log1p(|x|)`` is ``log1p(x)`` for these positive rows,
    bit for bit), instead of computing it again."""
    rows = _block_rows(block, n_total)
    w_rng = np.random.default_rng(synthetic_seed(seed_seq, 0))
    w = w_rng.normal(size=n_features) * (4.0 / np.sqrt(n_features))
    rng = np.random.default_rng(synthetic_seed(seed_seq, 1 + block))
    X = rng.lognormal(mean=0.0, sigma=1.0, size=(rows, n_features))
    logged = np.log1p(X)
    logits = (logged - LOG1P_LOGNORMAL_MEAN) @ w
    y = np.where(rng.random(rows) < 1.0 / (1.0 + np.exp(-logits)), 1, -1).astype(np.int8)
    return X, logged, y


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


def _file(value: str | None, key: str) -> Path:
    if value is None:
        raise ConfigError(f"{key} is required to read a file")
    path = Path(value).expanduser()
    if path.is_dir():
        raise DataError(f"{key} = {value!r} is a folder, not a file: give the data file in it")
    if not path.is_file():
        raise DataError(f"{key} = {value!r}: no such file ({path.resolve()})")
    return path


def _text_lines(path: Path) -> list[tuple[int, str]]:
    """(1-based line number, line) of every non-blank line of the UTF-8 text file ``path``."""
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        numpy = (
            " but a numpy file: set data.dataset = 'numpy'" if data.startswith(_NUMPY_MAGIC) else ""
        )
        raise DataError(f"{path}: not a text file (byte {exc.start} is not UTF-8){numpy}") from exc
    return [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def _read_csv(path: Path, data: DataConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Features, labels and (with ``data.peer_column``) the peer column of a CSV file."""
    rows = _text_lines(path)
    names: list[str] = []
    if data.header and rows:
        delimiter = None if data.delimiter == "whitespace" else data.delimiter
        names = [name.strip().strip('"') for name in rows[0][1].split(delimiter)]
        if all(_is_number(name) for name in names):  # skipping it would lose a row unseen
            raise DataError(
                f"{path}, line {rows[0][0]}: data.header = true skips this line as column "
                "names, but it holds numbers: a data row; set data.header = false"
            )
        rows = rows[1:]
    if not rows:
        raise DataError(f"{path}: the file has no data lines")
    delimiter = None if data.delimiter == "whitespace" else data.delimiter
    n_columns = len(rows[0][1].split(delimiter))
    if n_columns < 2:
        raise DataError(
            f"{path}, line {rows[0][0]}: 1 column; a row needs features and a label "
            f"(is data.delimiter = {data.delimiter!r} right?)"
        )
    label, peer = _label_and_peer_columns(data, names, n_columns, path)
    try:
        table = np.loadtxt(
            [line for _, line in rows],
            delimiter=delimiter,
            dtype=np.float64,
            ndmin=2,
            comments=None,
            quotechar='"',
        )
    except (ValueError, OverflowError) as exc:
        for line_number, line in rows:
            problem = _dense_line_problem(line, delimiter, n_columns - 1)
            if problem is not None:
                if line_number == rows[0][0] and not data.header and "non-numeric" in problem:
                    problem += " (column names? set data.header = true)"
                raise _line_error(path, line_number, problem) from exc
        raise DataError(f"{path}: cannot be read as CSV: {exc}") from exc
    non_finite = np.argwhere(~np.isfinite(table))
    if non_finite.size:
        row, column = non_finite[0]
        raise _line_error(
            path,
            rows[row][0],
            f"column {column + 1} is {table[row, column]}, not a finite number "
            f"({len(non_finite)} non-finite cells in the file)",
        )
    labels = _file_labels(table[:, label], rows, path)
    if peer is None:
        return np.delete(table, label, axis=1), labels, None
    peers = table[:, peer]
    bad = (peers != np.round(peers)) | (peers < 0)
    if bad.any():
        row = int(np.argmax(bad))
        raise _line_error(
            path, rows[row][0], f"peer id {peers[row]:g} (column {peer + 1}) is not an integer >= 0"
        )
    return np.delete(table, [label, peer], axis=1), labels, peers


def _label_and_peer_columns(
    data: DataConfig, names: list[str], n_columns: int, path: Path
) -> tuple[int, int | None]:
    """0-based columns of the label and of ``data.peer_column`` (None if unset) in a table.

    ``names`` is the header (empty without one); a string ``data.peer_column`` is one of them.
    """
    for key, column in (("label_column", data.label_column), ("peer_column", data.peer_column)):
        if isinstance(column, int) and not -n_columns <= column < n_columns:
            raise ConfigError(
                f"data.{key} must index one of the {n_columns} columns of {path} "
                f"(0..{n_columns - 1}, or -1 for the last), got {column}"
            )
    label = data.label_column % n_columns
    column = data.peer_column
    if column is None:
        return label, None
    if isinstance(column, str) and column not in names:
        raise ConfigError(
            f"data.peer_column = {column!r} is not a column of {path}; its header names {names}"
        )
    peer = names.index(column) if isinstance(column, str) else column % n_columns
    if peer == label:
        raise ConfigError(
            f"data.peer_column = {column!r} and data.label_column = {data.label_column!r} "
            f"are the same column {peer} of {path}"
        )
    return label, peer


def _file_labels(labels: np.ndarray, rows: list[tuple[int, str]], path: Path) -> np.ndarray:
    """Check that file labels are binary, naming the first bad line; return them unchanged."""
    known = np.isin(labels, (-1.0, 0.0, 1.0))
    if not known.all():
        row = int(np.argmin(known))
        label = np.format_float_positional(labels[row], trim="-")  # 1.0000001, not 1
        raise _line_error(path, rows[row][0], f"label {label} is not 0 or 1 (or -1 or +1)")
    if {-1.0, 0.0} <= set(np.unique(labels).tolist()):
        raise DataError(f"{path}: labels mix -1 and 0; use 0/1 or -1/+1")
    return labels


def csv_file(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """Your own CSV file: ``data.path`` (and ``data.test_path``, a predefined test split).

    One record per line, numeric cells separated by ``data.delimiter`` (``","`` by default,
    ``"whitespace"`` for runs of spaces and tabs), the label in column ``data.label_column``
    (0-based, default -1: the last) with values 0/1 or -1/+1, and a first line of column
    names to skip if ``data.header``. Blank lines are skipped; cells may be quoted with ``"``.
    ``data.peer_column`` (an index, or a name of the header) is a column of peer ids
    (integers >= 0), returned as ``peers`` rather than as a feature. A bad line raises
    :class:`~p2pdp.core.errors.DataError` naming the file, the 1-based line number and the
    problem (wrong column count, non-numeric or empty cell, NaN or inf, unexpected label or
    peer id). ``rng`` is not used.
    """
    path = _file(data.path, "data.path")
    X, y, peers = _read_csv(path, data)
    X_test = y_test = None
    if data.test_path is not None:  # its peer column, if any, is dropped: test rows train no peer
        X_test, y_test, _ = _read_csv(_file(data.test_path, "data.test_path"), data)
    return RawData(name=str(path), X=X, y=y, X_test=X_test, y_test=y_test, peers=peers)


def _read_libsvm(paths: list[Path], n_features: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_svmlight_files

    try:
        loaded = load_svmlight_files(
            [str(path) for path in paths],
            n_features=n_features,
            zero_based=False,
            dtype=np.float64,
        )
    except (ValueError, OverflowError) as exc:
        limit = n_features if n_features is not None else sys.maxsize
        for path in paths:
            for number, line in _text_lines(path):
                content = line.split("#", 1)[0]
                problem = _libsvm_line_problem(content, limit) if content.strip() else None
                if problem is not None:
                    problem = problem.replace(f"outside 1..{sys.maxsize}", "below 1")
                    raise _line_error(path, number, problem) from exc
        raise DataError(f"{', '.join(map(str, paths))}: cannot be read as LIBSVM: {exc}") from exc
    splits = []
    for path, (sparse, labels) in zip(
        paths, zip(loaded[::2], loaded[1::2], strict=True), strict=True
    ):
        rows = [
            (number, line) for number, line in _text_lines(path) if line.split("#", 1)[0].strip()
        ]
        X = sparse.toarray()
        non_finite = np.argwhere(~np.isfinite(X))
        if non_finite.size:
            row, column = non_finite[0]
            raise _line_error(
                path, rows[row][0], f"feature {column + 1} is {X[row, column]}, not finite"
            )
        splits.append((X, _file_labels(labels, rows, path)))
    return splits


def libsvm_file(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """Your own LIBSVM file: ``data.path`` (and ``data.test_path``, a predefined test split).

    Lines ``<label> <index>:<value> ...`` with 1-based, increasing feature indices (as written
    by LIBSVM and scikit-learn's ``dump_svmlight_file(..., zero_based=False)``); ``#`` starts
    a comment. Labels 0/1 or -1/+1. ``data.n_features`` fixes d (default: the largest index
    in the file, or in both files with a test split). A bad line raises
    :class:`~p2pdp.core.errors.DataError` naming the file and its 1-based line number.
    ``rng`` is not used.
    """
    paths = [_file(data.path, "data.path")]
    if data.test_path is not None:
        paths.append(_file(data.test_path, "data.test_path"))
    splits = _read_libsvm(paths, data.n_features)
    X_test, y_test = splits[1] if len(splits) == 2 else (None, None)
    return RawData(name=str(paths[0]), X=splits[0][0], y=splits[0][1], X_test=X_test, y_test=y_test)


#: Arrays a ``.npz`` file of the ``numpy`` data set may hold (besides ``data.peer_column``).
NPZ_ARRAYS = ("X", "y", "X_test", "y_test")


#: How the files numpy writes begin: ``numpy.save`` (.npy) and ``numpy.savez`` (a zip archive).
_NUMPY_MAGIC = (b"\x93NUMPY", b"PK\x03\x04", b"PK\x05\x06")


def _read_numpy(path: Path, data: DataConfig, key: str) -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` file, or ``X``, ``y`` (and ``peers``) of a ``.npy`` table."""
    where = f"{key} = {str(path)!r}"
    try:
        with path.open("rb") as file:
            head = file.read(6)
        if not head.startswith(_NUMPY_MAGIC):
            raise DataError(
                f"{where} is not a file written by numpy.save or numpy.savez ("
                + (f"it begins {head!r}" if head else "it is empty")
                + "): write it with one of them, or read a text table with data.dataset = 'csv'"
            )
        loaded = np.load(path, allow_pickle=False)  # never unpickle a data file
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                arrays = {name: _numpy_array(loaded, name, where) for name in loaded.files}
            return _npz_arrays(arrays, path, data, key)
        table = np.asarray(loaded)
    except (OSError, ValueError, EOFError) as exc:
        if "pickle" in str(exc):  # np.load refuses object arrays without allow_pickle
            raise DataError(_object_array(where, "the table")) from None
        raise DataError(f"{where}: cannot be read as a numpy file: {exc}") from None
    return _npy_arrays(table, path, data, key)


def _numpy_array(archive: Any, name: str, where: str) -> np.ndarray:
    """Array ``name`` of a ``.npz`` archive, or DataError if it holds Python objects."""
    try:
        return np.asarray(archive[name])
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DataError(_object_array(where, f"array {name!r}")) from None
        raise


def _object_array(where: str, what: str) -> str:
    return (
        f"{where}: {what} holds Python objects (an object array: None, strings or mixed "
        "types), which are not read (allow_pickle=False); save numbers only, e.g. "
        "numpy.asarray(values, dtype=float)"
    )


def _npz_arrays(
    arrays: dict[str, np.ndarray], path: Path, data: DataConfig, key: str
) -> dict[str, np.ndarray]:
    peer = [str(data.peer_column)] if data.peer_column is not None else []
    unknown = sorted(set(arrays) - {*NPZ_ARRAYS, *peer})
    if unknown:
        raise DataError(
            f"{key} = {str(path)!r}: array {unknown[0]!r} is not read (a .npz file holds "
            f"X, y, optionally X_test, y_test, and the array named by data.peer_column); "
            f"it holds {sorted(arrays)}"
        )
    for name in ("X", "y", *peer):
        if name not in arrays:
            raise DataError(f"{key} = {str(path)!r}: no array {name!r}; it holds {sorted(arrays)}")
    if peer:
        arrays["peers"] = arrays.pop(peer[0])
    return arrays


def _npy_arrays(table: np.ndarray, path: Path, data: DataConfig, key: str) -> dict[str, np.ndarray]:
    if table.ndim != 2 or table.shape[1] < 2:
        raise DataError(
            f"{key} = {str(path)!r}: a .npy file must hold a 2-D table (rows x columns: the "
            f"features and the label), got shape {table.shape}"
        )
    label, peer = _label_and_peer_columns(data, [], table.shape[1], path)
    dropped = [label] if peer is None else [label, peer]
    arrays = {"y": table[:, label], "X": np.delete(table, dropped, axis=1)}
    if peer is not None:
        arrays["peers"] = table[:, peer]
    return arrays


def numpy_file(data: DataConfig, *, rng: np.random.Generator | None = None) -> RawData:
    """Your own numpy arrays: ``data.path`` (and ``data.test_path``), both ``.npz`` or ``.npy``.

    A ``.npz`` file (``numpy.savez``) holds the arrays ``X`` (n, d) and ``y`` (n,), optionally
    a predefined test split ``X_test`` (n_test, d) and ``y_test`` (n_test,), and the array of
    peer ids (n,) named by ``data.peer_column``; any other array is an error (it would be
    silently unused). A ``.npy`` file (``numpy.save``) holds one 2-D table (n, d + 1) whose
    column ``data.label_column`` (default -1: the last) is the label, and column
    ``data.peer_column`` (if set) the peer ids. ``data.test_path`` is a second file of the
    same kind, the test split (its peer ids are dropped). Labels 0/1 or -1/+1; files are read
    with ``allow_pickle=False`` (no object arrays). ``rng`` is not used.
    """
    path = _file(data.path, "data.path")
    arrays = _read_numpy(path, data, "data.path")
    if data.test_path is not None:
        if "X_test" in arrays or "y_test" in arrays:
            raise DataError(
                f"data.path = {data.path!r} holds a test split (X_test, y_test) and "
                f"data.test_path = {data.test_path!r} gives another: keep one"
            )
        test = _read_numpy(_file(data.test_path, "data.test_path"), data, "data.test_path")
        if "X_test" in test or "y_test" in test:
            raise DataError(f"data.test_path = {data.test_path!r}: holds X_test, y_test; give X, y")
        arrays["X_test"], arrays["y_test"] = test["X"], test["y"]
    return RawData(
        name=str(path),
        X=arrays["X"],
        y=arrays["y"],
        X_test=arrays.get("X_test"),
        y_test=arrays.get("y_test"),
        peers=arrays.get("peers"),
    )


# --- what a data set declares before it is loaded ---------------------------------------------
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
