"""The lock of a results folder: one writer (``p2pdp run``, ``p2pdp report``) at a time
(:class:`FolderLock`), and the creation of a folder (:func:`make_folder`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from p2pdp.core.errors import ConfigError
from p2pdp.core.files import write_atomic
from p2pdp.experiments.results.manifest import _now

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


LOCK_FILE = ".p2pdp.lock"


LOCK_INFO_FILE = ".p2pdp.lock.json"


class FolderInUseError(ConfigError):
    """Another process (or this one) holds the lock of a results folder."""


_HELD: dict[str, FolderLock] = {}  # this process's locks, by real path of the folder


class FolderLock:
    """Exclusive lock on a results folder: one writer (``run``, ``report``) at a time.

    A POSIX record lock (:func:`fcntl.lockf`) on ``.p2pdp.lock``, taken without waiting: a
    second writer fails at once with :class:`FolderInUseError` naming the holder (purpose,
    pid, host, start time, read from ``.p2pdp.lock.json``). The kernel drops the lock when
    the holding process ends in any way (even ``kill -9``), and unlike ``flock`` it is not
    inherited by worker processes forked from the holder, so orphaned workers never keep a
    folder locked: a lock whose holder died is free, and the next writer takes it over
    (:attr:`previous` then holds the dead holder's info). Works on local and NFS folders.
    A process can hold a folder's lock only once (a second attempt fails the same way).
    """

    def __init__(self, directory: str | Path, *, purpose: str) -> None:
        self.directory = Path(directory)
        self.purpose = purpose
        self.info: dict[str, Any] = {}
        self.previous: dict[str, Any] | None = None
        self._fd: int | None = None
        self._key = os.path.realpath(self.directory)

    def acquire(self) -> FolderLock:
        """Take the lock or raise :class:`FolderInUseError` (ConfigError if not writable)."""
        if fcntl is None:  # pragma: no cover - not POSIX
            raise ConfigError("results folders need POSIX file locks (fcntl)")
        if self._key in _HELD:
            raise FolderInUseError(_in_use(self.directory, _HELD[self._key].info))
        try:
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"{self.directory}: cannot write there ({exc.strerror})") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # this process holds no lock on the file, so closing drops nothing
            info = _read_lock_info(self.directory)
            raise FolderInUseError(_in_use(self.directory, info)) from None
        self.previous = _read_lock_info(self.directory)  # left by a holder that died
        self.info = {
            "purpose": self.purpose,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": _now(),
            "command": " ".join(sys.argv),
        }
        self._fd = fd
        _HELD[self._key] = self
        try:
            write_atomic(self.directory / LOCK_INFO_FILE, json.dumps(self.info) + "\n")
        except OSError as exc:
            self.release()
            raise ConfigError(f"{self.directory}: cannot write there ({exc.strerror})") from None
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Drop the lock (and its info file); does nothing if not held."""
        if self._fd is None:
            return
        try:
            (self.directory / LOCK_INFO_FILE).unlink(missing_ok=True)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
            _HELD.pop(self._key, None)

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_lock_info(directory: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((directory / LOCK_INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _in_use(directory: Path, info: dict[str, Any] | None) -> str:
    if not info:
        holder = "another process (starting up)"
    else:
        holder = (
            f"{info.get('purpose', 'another process')} (pid {info.get('pid')} on "
            f"{info.get('host')}, started {info.get('started')})"
        )
    return f"{directory} is in use by {holder}; wait for it to finish or stop it first"


def make_folder(directory: str | Path, what: str = "--out") -> Path:
    """Create ``directory`` (and parents) or raise a one-line ConfigError naming the path.

    ``what`` names the argument in the message (``"--out"``).
    """
    directory = Path(directory)
    try:
        if directory.exists() and not directory.is_dir():
            raise ConfigError(f"{what} {directory} is a file, not a folder")
        for parent in directory.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise ConfigError(f"{what} {directory}: {parent} is a file, not a folder")
                break
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{what} {directory}: cannot create the folder ({exc.strerror})"
        ) from None
    return directory
