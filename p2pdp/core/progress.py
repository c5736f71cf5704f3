"""What the cells running in this process are doing, for the progress line of a long run.

The code running a cell (:func:`running_cell`) names its phase (:func:`set_phase`:
``"data and local models"``, ``"simulation"``, ...) and may give a *counter* with it: a
callable read only when a report is due (the round an iterative run is in, the aggregations a
one-shot run has done), so the loops that move what it reads pay nothing for it, not even a
look at the clock. :func:`running` is what a reporter reads: ``{cell id: what it is doing}``
for every cell running in this process (one per thread running a cell: a Dask worker may run
several at once). The runner's progress line shows it; a worker process sends it to its
parent every so often (:func:`report_every`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["report_every", "running", "running_cell", "set_phase"]


@dataclass(slots=True)
class _Status:
    """One running cell: its id, its phase and the counter read with it (or None)."""

    cell: str
    phase: str = ""
    counter: Callable[[], str] | None = None


#: Thread id -> the cell that thread is running (only the running thread writes its entry).
_RUNNING: dict[int, _Status] = {}


@contextlib.contextmanager
def running_cell(cell_id: str) -> Iterator[None]:
    """Inside the block, this thread runs the cell ``cell_id``: :func:`running` lists it with
    the phase :func:`set_phase` last gave (none at first)."""
    thread = threading.get_ident()
    outer = _RUNNING.get(thread)
    _RUNNING[thread] = _Status(cell_id)
    try:
        yield
    finally:
        if outer is None:
            _RUNNING.pop(thread, None)
        else:
            _RUNNING[thread] = outer


def set_phase(phase: str, counter: Callable[[], str] | None = None) -> None:
    """Say what the cell this thread runs is doing (nothing happens outside
    :func:`running_cell`, e.g. a :func:`~p2pdp.simulate` called directly).

    Parameters
    ----------
    phase : str
        ``"simulation"``, say; empty between phases.
    counter : callable, optional
        ``counter() -> str`` (``"round 12 of 100"``), called by the reporting thread each
        time it reports: it must only read (ints, lengths) what the cell's loop writes.
    """
    status = _RUNNING.get(threading.get_ident())
    if status is not None:
        status.phase, status.counter = phase, counter


def running() -> dict[str, str]:
    """``{cell id: "phase, counter"}`` of every cell running in this process, in no order."""
    report = {}
    for status in list(_RUNNING.values()):
        text = status.phase
        if text and status.counter is not None:
            text = f"{text}, {status.counter()}"
        report[status.cell] = text
    return report


def report_every(seconds: float, send: Callable[[dict[str, str]], None]) -> threading.Event:
    """Start a daemon thread calling ``send(running())`` every ``seconds`` when it changed
    since the last call (in a worker process: to tell the parent); set the returned event
    to stop it."""
    stop = threading.Event()

    def report() -> None:
        last: dict[str, str] = {}
        while not stop.wait(seconds):
            now = running()
            if now != last:
                send(now)
                last = now

    threading.Thread(target=report, name="p2pdp-cell-progress", daemon=True).start()
    return stop
