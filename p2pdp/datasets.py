"""Benchmark data sets: Spambase, Statlog Australian credit and Adult (LIBSVM a9a / a9a.t).

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
file (missing, wrong checksum, bad line, wrong row count) raises :class:`~p2pdp.errors.DataError`
naming the file and, for a bad line, its 1-based line number.

Feature bounds: only a manifest's ``feature_bounds`` are data-independent (Adult: every feature
is binary). Without them, min-max bounds must be computed from the training data, a global step
that reads every peer's records and is not covered by the differential-privacy guarantee.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import re
import sys
import tempfile
import urllib.request
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.datasets import load_svmlight_file

from p2pdp.errors import ConfigError, DataError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "DATA_HOME_ENV",
    "DOWNLOAD_TIMEOUT_SECONDS",
    "DataFile",
    "Dataset",
    "Manifest",
    "available_datasets",
    "data_home_candidates",
    "dataset_info",
    "fetch_dataset",
    "load_dataset",
    "load_manifest",
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
    package_dir = Path(__file__).resolve().parent
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


# --- public loaders ---------------------------------------------------------------------------
def _load(
    name: str, *, path: str | os.PathLike[str] | None, download: bool, verify: bool
) -> tuple[Manifest, Dataset, list[dict[str, Any]]]:
    """Load a data set; also return one report per file (where found, sha256, check result)."""
    manifest = load_manifest(name)
    splits: dict[str, tuple[np.ndarray, ...]] = {}
    reports = []
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
        splits[spec.role] = _parse(data, file_path, manifest, spec)
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
    dataset = Dataset(
        name=name,
        X=splits["train"][0],
        y=splits["train"][1],
        feature_names=manifest.feature_names,
        X_test=X_test,
        y_test=y_test,
        files=tuple(Path(report["path"]) for report in reports),
        feature_bounds=manifest.feature_bounds,
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
        info[f"{prefix}negatives"] = None if y is None else len(y) - positives
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
