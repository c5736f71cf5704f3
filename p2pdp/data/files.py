"""Where the files of a benchmark data set are found, and their download.

Each file of a data set is looked up in this order:

1. the ``path`` argument: a file (single-file data sets only) or a directory holding the files;
2. the directory ``$P2PDP_DATA_HOME``;
3. the user cache, ``$XDG_CACHE_HOME/p2pdp`` or ``~/.cache/p2pdp``;
4. with ``download=True``, a download from the canonical address into the user cache, kept only
   if its sha256 matches the manifest.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from p2pdp.core.errors import ConfigError, DataError
from p2pdp.data.manifests import DataFile, Manifest

__all__ = [
    "DATA_HOME_ENV",
    "DOWNLOAD_TIMEOUT_SECONDS",
    "Located",
    "cache_dir",
    "data_home_candidates",
    "download_file",
    "locate",
]

DATA_HOME_ENV = "P2PDP_DATA_HOME"
DOWNLOAD_TIMEOUT_SECONDS = 60.0


def cache_dir() -> Path:
    """The user cache: ``$XDG_CACHE_HOME/p2pdp`` or ``~/.cache/p2pdp`` (where downloads go)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "p2pdp"


def _search_dirs(explicit: Path | None) -> list[tuple[Path, str]]:
    """Directories to search, in order, each with a label for messages."""
    dirs = [] if explicit is None else [(explicit, "path argument")]
    env = os.environ.get(DATA_HOME_ENV)
    if env:
        dirs.append((Path(env).expanduser(), f"${DATA_HOME_ENV}"))
    dirs.append((cache_dir(), "user cache"))
    return dirs


def data_home_candidates() -> list[Path]:
    """Directories searched for data files after an explicit ``path``, in order.

    ``$P2PDP_DATA_HOME`` (if set), then the user cache (``$XDG_CACHE_HOME/p2pdp`` or
    ``~/.cache/p2pdp``), which is also where downloads go.
    """
    return [directory for directory, _ in _search_dirs(None)]


def download_file(spec: DataFile, directory: Path) -> Path:
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
class Located:
    """A data set's file ``spec`` found at ``path``; ``origin`` says where (for messages)."""

    spec: DataFile
    path: Path
    origin: str


def _locate_file(
    dataset: str, spec: DataFile, dirs: list[tuple[Path, str]], *, download: bool
) -> Located:
    for directory, origin in dirs:
        candidate = directory / spec.name
        if candidate.is_file():
            return Located(spec, candidate, origin)
    reason = "downloads are off (download=False)"
    if download:
        try:
            return Located(spec, download_file(spec, cache_dir()), "downloaded")
        except DataError as exc:
            reason = str(exc)
    looked = "\n".join(f"  - {directory / spec.name} ({origin})" for directory, origin in dirs)
    unset = "" if os.environ.get(DATA_HOME_ENV) else f" (${DATA_HOME_ENV} is not set)"
    raise DataError(
        f"data file {spec.name!r} of data set {dataset!r} not found. Looked in:\n{looked}\n"
        f"Not downloaded: {reason}.\n"
        f"Fix: export {DATA_HOME_ENV}=/dir/with/files{unset}, "
        f"or run `p2pdp datasets fetch {dataset}` (downloads {spec.url} into {cache_dir()})."
    )


def locate(
    manifest: Manifest, path: str | os.PathLike[str] | None, *, download: bool
) -> list[Located]:
    """Every file of ``manifest``: at ``path`` (a file or a directory), else in the search
    order of the module docstring, else downloaded if ``download``; DataError if not found."""
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
        return [Located(manifest.files[0], explicit, "path argument")]
    dirs = _search_dirs(explicit)
    return [_locate_file(manifest.name, spec, dirs, download=download) for spec in manifest.files]
