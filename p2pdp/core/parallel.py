"""Local worker processes for the embarrassingly parallel phases of one large run.

One run's local training (a model per peer) and its evaluation (an error per peer) split into
independent pieces. :func:`forked_map` runs such pieces in forked processes, which read the
run's arrays copy-on-write (no copy, no pickling of the data); only each piece's small result
travels back. How many processes: :func:`local_workers` sets it for a block of code (``p2pdp
run --jobs N`` with a single task gives its N workers to the run), 1 by default. A piece's
result must not depend on the others, so results are identical for any number of workers.
:func:`forked_pool` keeps the processes for several rounds of pieces (an iterative solver's
passes over the rows), and :func:`shared_empty` allocates an array the forked workers write
into (a large data set generated or transformed block by block in the workers).
:func:`remote_workers` sends :func:`forked_map`'s pieces to other machines instead (a Dask
cluster's workers scoring one large run's peers, :mod:`p2pdp.experiments.run.cluster`).
:func:`in_background` computes one function in a forked process while this one goes on (a
large run's centralised reference during its simulation, which runs in one process), and
:func:`forked_worker` a stream of pieces of work (the exact aggregates of a large run's
releases while its driver draws the next groups).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import mmap
import multiprocessing
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

from p2pdp.core.errors import P2PDPError
from p2pdp.core.scoped import scoped

_WORKERS: contextvars.ContextVar[int] = contextvars.ContextVar("local_workers", default=1)

_S = TypeVar("_S")
_I = TypeVar("_I")
_R = TypeVar("_R")
_R_co = TypeVar("_R_co", covariant=True)

#: ``(function, shared)`` of the running :func:`forked_map`, read by its forked workers.
_TASK: tuple[Callable[[Any, Any], Any], Any] | None = None
#: True in a forked worker: its own pieces run in it, never in processes of its own.
_IN_WORKER = False
#: ``pieces(function, shared, items)``: ``[function(shared, item) for item in items]``, elsewhere.
RemotePieces = Callable[[Callable[[Any, Any], Any], Any, Sequence[Any]], list]
#: The :data:`RemotePieces` set by :func:`remote_workers`, or None.
_REMOTE: contextvars.ContextVar[RemotePieces | None] = contextvars.ContextVar(
    "remote_workers", default=None
)


def local_workers(workers: int) -> contextlib.AbstractContextManager[None]:
    """Let the parallel phases inside the block use ``workers`` local processes."""
    return scoped(_WORKERS, workers)


@contextlib.contextmanager
def remote_workers(pieces: RemotePieces, workers: int) -> Iterator[None]:
    """Inside the block, :func:`forked_map` calls ``pieces(function, shared, items)`` (which
    must return ``[function(shared, item) for item in items]``, e.g. on a Dask cluster)
    instead of forking, and :func:`current_workers` is ``workers``.

    Only for code whose pieces return their results: a piece that writes into
    :func:`shared_empty` memory would write into a copy. The one caller runs a run's
    simulation and evaluation in it, never its data or training phases.
    """
    token, remote = _WORKERS.set(workers), _REMOTE.set(pieces)
    try:
        yield
    finally:
        _REMOTE.reset(remote)
        _WORKERS.reset(token)


def current_workers() -> int:
    """The number of local processes :func:`local_workers` set (1 outside any block, and
    in a worker process: a worker's pieces run in it, not in processes of its own)."""
    return 1 if _IN_WORKER else _WORKERS.get()


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


def _pool_worker() -> None:
    """Start a forked worker (:func:`forked_pool`, :func:`forked_worker`, :class:`Background`):
    the parent's signals, no pool of its own."""
    global _IN_WORKER
    _IN_WORKER = True
    worker_signals()
    _keep_freed_memory()


#: glibc's ``mallopt`` parameters (malloc.h) and the values a worker sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
_TRIM_THRESHOLD = 2**31 - 1


def _keep_freed_memory() -> None:
    """In this forked worker (a pool's, a :func:`forked_worker` or a :class:`Background`, all
    gone by the end of the run), let glibc's malloc keep the memory numpy frees, for the
    next block's temporaries, instead of returning it to the kernel.

    glibc maps an allocation above its threshold (128 KB, raised to the largest mapping
    freed so far) afresh and trims the top of its heap: a block's temporaries of a few tens of
    MB were faulted in and zeroed again at every block (a 24 MB one took about 1,500 faults
    each time). Drawing the 10^5-peer synthetic rows spent 0.55 s per worker in the kernel and
    their transform 0.45 s; with allocations up to 32 MB served from the heap and the heap
    never trimmed, 0.35 s and 0.05-0.3 s. Both settings are needed (neither helps alone), so
    the second is set only if the first was. No-op where the C library has no ``mallopt``
    (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return
    if mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD):  # 1 on success (0: a 32-bit glibc)
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


#: This process's BLAS libraries and the number of modules imported when they were found.
_BLAS: tuple[int, ThreadpoolController] | None = None


def _blas() -> ThreadpoolController:
    """This process's BLAS libraries, found again only after new modules were imported:
    ``threadpool_limits`` reads the process's loaded libraries at every call (about 3 ms,
    more than a small run's whole scoring), but a library found once would miss one loaded
    later (importing ``scipy.linalg`` after numpy loads a second OpenBLAS), whose threads a
    forked worker then kept."""
    global _BLAS
    imported = len(sys.modules)
    if _BLAS is None or _BLAS[0] != imported:
        _BLAS = (imported, ThreadpoolController())
    return _BLAS[1]


def one_blas_thread() -> contextlib.AbstractContextManager:
    """One BLAS thread in this process until the returned context exits.

    A :func:`forked_pool`'s workers inherit it: the pool is forked inside it, so a worker
    never sets a thread count itself (after a fork, OpenBLAS restarts its threads at the first
    such call, and they spin for about 0.1 s of CPU each). With 2 workers on 2 cores, each
    worker's idle BLAS threads took CPU from the other: drawing the synthetic rows at 10^5
    peers took 2.5 s instead of 1.9 s."""
    return _blas().limit(limits=1, user_api="blas")


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
    or where the platform cannot fork (Windows). Inside :func:`remote_workers` (and not in a
    forked worker), the pieces go to its ``pieces`` instead (``shared`` is then pickled).
    """
    if not maps_here(workers, len(items)):
        remote = _REMOTE.get()
        assert remote is not None
        return remote(function, shared, items)
    with forked_pool(function, shared, workers=min(workers, len(items))) as pieces:
        return pieces(items)


def maps_here(workers: int, items: int) -> bool:
    """Whether :func:`forked_map` of ``items`` items with ``workers`` computes on this machine
    (in processes forked from this one, or in this one), so that what its function writes
    into :func:`shared_empty` memory it was given is seen here; False inside
    :func:`remote_workers`, where the items go to other machines."""
    return _IN_WORKER or _REMOTE.get() is None or workers <= 1 or items <= 1


@contextlib.contextmanager
def forked_pool(
    function: Callable[[_S, _I], _R], shared: _S, *, workers: int
) -> Iterator[Callable[[Sequence[_I]], list[_R]]]:
    """A :func:`forked_map` whose processes serve every call inside the block.

    Yields ``pieces(items) == [function(shared, item) for item in items]`` (in order). The
    workers fork once, on entry, so ``shared`` is what it was then: pass what changes between
    calls in the items. Runs in this process when ``workers <= 1`` or where the platform
    cannot fork.
    """

    def here(items: Sequence[_I]) -> list[_R]:
        return [function(shared, item) for item in items]

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield here
        return
    global _TASK
    _TASK = (function, shared)
    try:  # the workers are the parallelism: one BLAS thread each (one_blas_thread)
        with (
            one_blas_thread(),
            multiprocessing.get_context("fork").Pool(workers, _pool_worker) as pool,
        ):
            yield (
                lambda items: pool.map(_call, items, chunksize=1) if len(items) > 1 else here(items)
            )
    finally:
        _TASK = None


@contextlib.contextmanager
def forked_worker(
    function: Callable[[_S, _I], _R], shared: _S, *, workers: int
) -> Iterator[Callable[[_I], Callable[[], _R]]]:
    """One forked process computing ``function(shared, item)`` for each item sent to it, in
    order, while this process goes on with serial work.

    Yields ``submit(item)``, which returns at once a ``result()`` that waits for and returns
    ``function(shared, item)`` (re-raising its exception). The process forks once, on entry:
    ``shared`` is what it was then, inherited copy-on-write; pass large inputs and outputs
    through :func:`shared_empty` memory allocated before. Items and results travel through
    pipes, with no helper thread: keep them small (a few KB) and the results waited for
    few, or both processes may wait on a full pipe. With ``workers <= 1``, inside
    :func:`remote_workers`, in a worker process or where the platform cannot fork, ``submit``
    computes the value here, at once (an error is raised by ``result()``).
    """

    def here(item: _I) -> Callable[[], _R]:
        try:
            value = function(shared, item)
        except Exception as error:  # raised where the value is read, as from the process
            failure = error

            def fail() -> _R:
                raise failure

            return fail
        return lambda: value

    local = workers > 1 and not _IN_WORKER and _REMOTE.get() is None
    if not local or "fork" not in multiprocessing.get_all_start_methods():
        yield here
        return
    context = multiprocessing.get_context("fork")
    items, send = context.Pipe(duplex=False)
    receive, results = context.Pipe(duplex=False)
    process = context.Process(
        target=_worker_main, args=(function, shared, items, results, (send, receive)), daemon=True
    )
    process.start()
    items.close()  # the child holds the only ends it reads and writes
    results.close()
    sent, received = 0, 0
    values: dict[int, tuple[bool, Any]] = {}

    def submit(item: _I) -> Callable[[], _R]:
        nonlocal sent
        number = sent
        send.send(item)
        sent += 1

        def result() -> _R:
            nonlocal received
            while number not in values:  # the results come in order
                try:
                    values[received] = receive.recv()
                except EOFError:
                    process.join()  # it closed its end: it is gone
                    raise P2PDPError(
                        f"the forked worker computing {getattr(function, '__name__', function)} "
                        f"died (exit code {process.exitcode})"
                    ) from None
                received += 1
            ok, value = values.pop(number)
            if not ok:
                raise value
            return value

        return result

    try:
        yield submit
    finally:
        send.close()  # the worker's loop ends ...
        receive.close()  # ... or its send of a result nobody reads fails
        process.join()


def _worker_main(
    function: Callable[[Any, Any], Any], shared: Any, items: Any, results: Any, parents: Any
) -> None:
    """A :func:`forked_worker`'s process: ``(True, value)`` or ``(False, error)`` per item,
    until the parent closes its end of ``items`` (``parents``: the parent's ends, inherited:
    closed here so that the parent's close is seen)."""
    _pool_worker()
    for end in parents:
        end.close()
    while True:
        try:
            item = items.recv()
        except EOFError:  # the parent is done
            break
        try:
            message: tuple[bool, Any] = (True, function(shared, item))
        except BaseException as error:  # re-raised in the parent
            message = (False, error)
        try:
            results.send(message)
        except BrokenPipeError:  # the parent stopped reading
            break
    results.close()


class Background(Generic[_R]):
    """``function(shared)`` being computed in one forked process (:func:`in_background`).

    Where idle priority can be undone (:func:`_can_idle`: Linux, with ``CAP_SYS_NICE`` or an
    ``RLIMIT_NICE`` of at least 20), the process runs at idle priority (``SCHED_IDLE``: it gets
    a core only when nothing else wants it, though its memory traffic still costs what runs
    beside it) until :meth:`hurry` or :meth:`result` asks for it or it is stopped, which give
    it back this process's policy. Elsewhere it runs at normal priority throughout.

    :meth:`result` waits for it (in the process that started it). Pickling waits for it too
    and pickles the value. A background process whose result is never read is stopped when
    this object is collected, or when the interpreter exits (it is a daemon).
    """

    def __init__(self, function: Callable[[_S], _R], shared: _S, *, what: str) -> None:
        context = multiprocessing.get_context("fork")
        self._receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_background_main, args=(function, shared, send), daemon=True
        )
        self._idle = _can_idle()  # (its first call starts a thread: before the fork)
        process.start()
        assert process.pid is not None  # started
        self._stop = weakref.finalize(self, _stop_background, process, self._receive, self._idle)
        if self._idle:  # set here, so that result() cannot undo it before it is done
            _set_policy(process.pid, os.SCHED_IDLE)
        send.close()  # the child holds the only write end left here
        self._process, self._owner, self._what = process, os.getpid(), what
        self._done: tuple[_R] | None = None

    def hurry(self) -> None:
        """Give the background process this process's policy back now, without waiting: its
        value is read soon, after work of this process's that may take every core (the
        cores are then shared with it instead of it running alone at the end)."""
        if self._idle and self._done is None and os.getpid() == self._owner:
            _normal_priority(self._process)

    def result(self) -> _R:
        """The value of ``function(shared)``, once the background process has sent it (its
        exception, re-raised here, if it raised one)."""
        if self._done is None:
            if os.getpid() != self._owner:
                raise RuntimeError(
                    f"{self._what} is computed in a background process of process "
                    f"{self._owner}: read it there before forking"
                )
            self.hurry()
            try:
                ok, value = self._receive.recv()
            except EOFError:
                self._stop()
                raise P2PDPError(
                    f"the background process computing {self._what} died (exit code "
                    f"{self._process.exitcode})"
                ) from None
            self._stop()
            if not ok:
                raise value
            self._done = (value,)
        return self._done[0]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_value, (self.result(),))


class Pending(Protocol[_R_co]):
    """A value still being computed in other processes: a :class:`Background`, or an object
    driving one (the large run's centralised reference, :mod:`p2pdp.tasks.streamed`).
    :meth:`hurry` says it is read soon; :meth:`result` waits for it (and may compute part of
    it in this process)."""

    def hurry(self) -> None: ...

    def result(self) -> _R_co: ...


def _value(value: _R) -> _R:
    return value


def _background_main(function: Callable[[Any], Any], shared: Any, send: Any) -> None:
    """A :class:`Background`'s process: compute, send ``(True, value)`` or ``(False, error)``."""
    _pool_worker()
    try:
        message: tuple[bool, Any] = (True, function(shared))
    except BaseException as error:  # re-raised in the parent
        message = (False, error)
    try:
        send.send(message)
    except Exception as error:  # an exception or value that does not pickle
        send.send((False, P2PDPError(f"{type(error).__name__}: {error}")))
    send.close()


@functools.cache
def _can_idle() -> bool:
    """Whether a :class:`Background` may start at idle priority here: the platform has
    ``SCHED_IDLE`` (Linux) and this process may move a process back from it to normal
    priority (``CAP_SYS_NICE``, or an ``RLIMIT_NICE`` of at least 20). Without that, a
    background process waited for on a machine busy with other work would hardly run.
    Tried once, on a thread that exits."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    undone: list[bool] = []

    def trial() -> None:  # policies are per thread: this one's ends with it
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            return
        undone.append(True)

    thread = threading.Thread(target=trial)
    thread.start()
    thread.join()
    return bool(undone)


def _set_policy(pid: int, policy: int) -> None:
    """Move every thread of process ``pid`` that still runs to the scheduling ``policy``
    (Linux: a policy is per thread, and ``sched_setscheduler(pid)`` sets the first one's)."""
    try:
        threads = [int(task) for task in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # no /proc, or the process is gone
        threads = [pid]
    for thread in threads:
        try:
            os.sched_setscheduler(thread, policy, os.sched_param(0))
        except OSError:  # done already; or no longer allowed
            pass


def _normal_priority(process: Any) -> None:
    """Give an idle :class:`Background` process this process's scheduling policy back."""
    if process.is_alive():  # (reaped: its pid may be someone else's)
        policy = os.sched_getscheduler(0)
        own = policy in (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE)
        _set_policy(process.pid, policy if own else os.SCHED_OTHER)


def _stop_background(process: Any, receive: Any, idle: bool) -> None:
    receive.close()
    if process.is_alive():
        if idle:  # an idle process would take long to exit on a busy machine
            _normal_priority(process)
        process.terminate()
    process.join()


def in_background(function: Callable[[_S], _R], shared: _S, *, what: str) -> Background[_R] | _R:
    """``function(shared)``: started in one forked process, a :class:`Background` returned at
    once, or computed here where the platform cannot fork.

    ``shared`` is inherited (copy-on-write), never pickled; the value is pickled back. The
    process counts as a worker (:func:`current_workers` is 1 in it), so it forks nothing of
    its own. ``what`` names the value in errors. For work whose value is not needed until
    later: at idle priority until then where the platform allows (:class:`Background`), it
    takes mostly the core time that this process and its workers leave. Computed here too
    in a forked worker (which forks nothing of its own).
    """
    if _IN_WORKER or "fork" not in multiprocessing.get_all_start_methods():
        return function(shared)
    return Background(function, shared, what=what)


class _SharedMemory(mmap.mmap):
    """Anonymous memory mapped shared: what a forked worker writes there, its parent reads."""


def shared_empty(shape: tuple[int, ...], dtype: Any = np.float64) -> np.ndarray:
    """An uninitialised C-ordered array that forked workers (:func:`forked_map`) write into.

    An ordinary array is copy-on-write in a forked worker: its writes stay in the worker.
    This one lives in an anonymous shared mapping (``MAP_SHARED``), so every worker's writes
    land in the parent's array, without pickling.
    """
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return np.ndarray(shape, dtype=dtype, buffer=_SharedMemory(-1, max(size, 1)))


#: Linux's ``madvise`` advice (5.14+) that faults a range in for writing, in one call.
_MADV_POPULATE_WRITE = 23


def prefault(view: np.ndarray) -> None:
    """Bring in the pages of ``view``, a view of :func:`shared_empty` memory about to be
    written for the first time, in one call (Linux's ``MADV_POPULATE_WRITE``: every page
    from its first element to its last) instead of a page fault per 4 KB page: drawing the
    10^5-peer synthetic rows into fresh shared memory took 0.35-0.45 s of kernel time per
    worker, 0.25-0.29 s with it. No-op for other arrays, views with a negative stride, or
    where the kernel lacks it."""
    base: Any = view
    while isinstance(base, np.ndarray):
        base = base.base
    if (
        sys.platform != "linux"
        or not isinstance(base, _SharedMemory)
        or view.size == 0
        or min(view.strides) < 0
    ):
        return
    first = view.ctypes.data - ctypes.addressof(ctypes.c_char.from_buffer(base))
    last = first + sum((n - 1) * step for n, step in zip(view.shape, view.strides, strict=True))
    page = mmap.PAGESIZE
    start = first // page * page
    end = min(len(base), (last + view.itemsize + page - 1) // page * page)
    if 0 <= start < end:  # (a view made by hand could point outside the mapping)
        with contextlib.suppress(OSError):  # a kernel older than 5.14
            base.madvise(_MADV_POPULATE_WRITE, start, end - start)


def is_shared(array: np.ndarray) -> bool:
    """True when ``array`` is (a view of) memory from :func:`shared_empty`."""
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, _SharedMemory)
