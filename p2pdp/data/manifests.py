"""Manifests of the benchmark data sets: what each file is and how to check it.

Each data set is described by a TOML manifest, ``datasets/<name>.toml`` in the repository
(``p2pdp/_manifests/`` in an installed wheel): canonical download address, format, file names,
expected rows, features and positives, sha256 and, where the domain gives them,
data-independent per-feature bounds (only these are data-independent: min-max bounds computed
from the training data read every peer's records and are not covered by the
differential-privacy guarantee).
"""

from __future__ import annotations

import re
import sys
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from p2pdp.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["DataFile", "Manifest", "available_datasets", "load_manifest"]

FORMATS = ("csv", "whitespace", "libsvm")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


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
