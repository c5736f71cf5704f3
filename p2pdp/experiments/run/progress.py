"""The runner's progress line: cells done, rate, elapsed time, ETA, and what the running
cells are doing (:class:`_Progress`)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import TextIO

from p2pdp.core.progress import running

#: Longest silence (seconds) of the progress report while a run is going.
PROGRESS_INTERVAL_S = 2.0


class _Progress:
    """Cells done, rate, elapsed time and ETA: a redrawn bar on a TTY, log lines otherwise.

    A background thread redraws the bar, or prints a line, whenever nothing was shown for
    :data:`PROGRESS_INTERVAL_S` seconds, so a long cell does not leave the run silent. Off a
    TTY, lines come at most that often (and once at the end). The line also says what the
    running cells are doing, as ``running()`` says (:func:`p2pdp.core.progress.running` of
    this process, or what the workers reported): ``(running: p0-f1-r0 simulation, round 12
    of 100; p1-f0-r0 data and local models; +2 more)``. On a TTY the bar is cut to the
    terminal's width.
    """

    def __init__(
        self,
        total: int,
        done: int,
        stream: TextIO | None,
        *,
        running: Callable[[], dict[str, str]] = running,
    ) -> None:
        self.total, self.done, self.stream = total, done, stream
        self.running = running
        self.finished: set[str] = set()  # a report may come after the cell's record
        self.start_done, self.start = done, time.perf_counter()
        self.interval = PROGRESS_INTERVAL_S
        self.tty = stream is not None and stream.isatty()
        self._lock = threading.Lock()
        self._shown = self.start
        self._stop = threading.Event()
        self._thread = None
        if stream is not None:
            if done:
                self._print(f"resuming: {done} of {total} cells already done")
            self._thread = threading.Thread(target=self._beat, name="p2pdp-progress", daemon=True)
            self._thread.start()

    def update(self, cell_id: str) -> None:
        """Count the cell ``cell_id`` done (and show the line, if due)."""
        with self._lock:
            self.done += 1
            self.finished.add(cell_id)
        due = time.perf_counter() - self._shown >= self.interval
        if self.tty or due or self.done == self.total:
            self._show()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.tty:
            self._print("")

    def _beat(self) -> None:
        while not self._stop.wait(max(0.01, self._shown + self.interval - time.perf_counter())):
            if time.perf_counter() - self._shown >= self.interval:
                self._show()

    def _show(self) -> None:
        with self._lock:
            now = time.perf_counter()
            elapsed = now - self.start
            rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            status = (
                f"{self.done}/{self.total} cells, {rate:.2f} cells/s, "
                f"{_duration(elapsed)} elapsed, ETA {_duration(eta)}"
            )
            if self.done < self.total:
                status += self._running()
            if self.tty:
                filled = round(30 * self.done / max(self.total, 1))
                line = f"[{'#' * filled}{'.' * (30 - filled)}] {status}"
                width = shutil.get_terminal_size().columns - 1
                self._print(f"\r{line[:width]}\x1b[K", end="")  # erase the longer line before
            else:
                self._print(f"p2pdp run: {status}")
            self._shown = now

    def _running(self) -> str:
        """`` (running: CELL WHAT; ...)`` for the first two running cells, in grid order."""
        cells = sorted(
            (cell, text) for cell, text in self.running().items() if cell not in self.finished
        )
        if not cells:
            return ""
        shown = "; ".join(f"{cell} {text}".rstrip() for cell, text in cells[:2])
        more = f"; +{len(cells) - 2} more" if len(cells) > 2 else ""
        return f" (running: {shown}{more})"

    def _print(self, text: str, end: str = "\n") -> None:
        if self.stream is not None:
            print(text, end=end, file=self.stream, flush=True)


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"
