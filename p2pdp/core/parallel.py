"""Local worker processes for the embarrassingly parallel phases of one large run.

One run's local training (a model per peer) and its evaluation (an error per peer) split into
independent pieces. :func:`forked_map` runs such pieces in forked processes, which read the
run's arrays copy-on-write (no copy, no pickling of the data); only each piece's small result
travels back. How many processes: :func:`local_workers` sets it for a block of code (``p2pdp
run --jobs N`` with a single task gives its N workers to the run), 1 by default. A piece's
result must not depend on the others, so results are identical for any number of workers.
"""

from __future__ import annotations

import contextlib
import contextvars
import multiprocessing
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

_WORKERS: contextvars.ContextVar[int] = contextvars.ContextVar("local_workers", default=1)

_S = TypeVar("_S")
_I = TypeVar("_I")
_R = TypeVar("_R")

#: ``(function, shared)`` of the running :func:`forked_map`, read by its forked workers.
_TASK: tuple[Callable[[Any, Any], Any], Any] | None = None


@contextlib.contextmanager
def local_workers(workers: int) -> Iterator[None]:
    """Let the parallel phases inside the block use ``workers`` local processes."""
    token = _WORKERS.set(workers)
    try:
        yield
    finally:
        _WORKERS.reset(token)


def current_workers() -> int:
    """The number of local processes :func:`local_workers` set (1 outside any block)."""
    return _WORKERS.get()


def worker_signals() -> None:
    """In a worker process: signals are the parent's business. A terminal's Ctrl-C reaches
    the whole process group, so a worker ignores SIGINT; it dies at once on SIGTERM and
    SIGHUP, which its parent sends to stop it (a handler inherited from the parent, say one
    raising KeyboardInterrupt, could stop it while it holds its pool's queue lock and hang the
    pool)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)


def _call(item: Any) -> Any:
    assert _TASK is not None  # set by forked_map before the fork
    function, shared = _TASK
    return function(shared, item)


def forked_map(
    function: Callable[[_S, _I], _R], shared: _S, items: Sequence[_I], *, workers: int
) -> list[_R]:
    """``[function(shared, item) for item in items]``, in up to ``workers`` forked processes.

    ``shared`` is inherited by the forked workers (copy-on-write), never pickled; items and
    results are. One process (no fork) when ``workers <= 1``, when there is at most one item,
    or where the platform cannot fork (Windows).
    """
    workers = min(workers, len(items))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [function(shared, item) for item in items]
    global _TASK
    _TASK = (function, shared)
    try:
        with multiprocessing.get_context("fork").Pool(workers, worker_signals) as pool:
            return pool.map(_call, items, chunksize=1)
    finally:
        _TASK = None
