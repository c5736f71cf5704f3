"""A party's first fault in code the run does not await, and the run that ends on it.

asyncio runs a connection's handler, a timer's callback and a spawned task on their own: an
exception there is logged when its task is collected, if ever, and the coroutine that waits
for the run's progress waits on (a run that hangs instead of failing). Each party of a
network run (the coordinator, a host) keeps one :class:`Failure`: every callback it does not
await reports an exception that is not a refusal there (:meth:`Failure.handler`,
:meth:`Failure.spawn`, :meth:`Failure.call`), and its main coroutine runs under
:meth:`Failure.race`, which cancels it at the first such fault and raises an error naming
where it happened. (A frame that breaks the protocol is refused and counted where it is read,
never reported here: only a fault of the party's own code ends its run.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["Failure"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Failure:
    """The first fault of one party's callbacks; :meth:`race` ends its run on it.

    Parameters
    ----------
    error : type
        The exception :meth:`race` raises (the coordinator's
        :class:`~p2pdp.core.errors.NetworkRunError`, a host's
        :class:`~p2pdp.net.hosts.HostError`), its message ``prefix`` + where + the fault.
    prefix : str
        What the message starts with (``"network runtime: "``).
    """

    def __init__(self, error: type[Exception] = RuntimeError, prefix: str = "") -> None:
        self.error, self.prefix = error, prefix
        self.where = ""  # where the first fault happened ("" while there is none)
        self.fault: BaseException | None = None
        self._event: asyncio.Event | None = None  # made in the run's loop, by race

    def report(self, where: str, fault: BaseException) -> None:
        """``fault`` happened in ``where`` (e.g. ``"peer 3's connection"``): the first one
        ends the run (logged with its traceback; later ones are logged only)."""
        log.error("%s%s failed", self.prefix, where, exc_info=fault)
        if self.fault is None:
            self.where, self.fault = where, fault
            if self._event is not None:
                self._event.set()

    def message(self) -> str:
        """The first fault, in one line: where, its type and message."""
        return f"{self.prefix}{self.where} failed: {type(self.fault).__name__}: {self.fault}"

    async def guard(self, where: str, awaitable: Awaitable[T]) -> T | None:
        """``await awaitable``; a fault (not a cancellation) is reported, then None."""
        try:
            return await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as fault:
            self.report(where, fault)
            return None

    def handler(
        self, where: str, function: Callable[..., Coroutine[Any, Any, None]]
    ) -> Callable[..., Coroutine[Any, Any, None]]:
        """A connection handler (``asyncio`` runs it as a task of its own) whose fault is
        reported under ``where``."""

        async def guarded(*arguments: Any) -> None:
            await self.guard(where, function(*arguments))

        return guarded

    def spawn(self, where: str, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """A task running ``coroutine``, whose fault is reported under ``where``."""
        return asyncio.ensure_future(self.guard(where, coroutine))

    def call(self, where: str, function: Callable[..., object]) -> Callable[..., None]:
        """A callback (a timer's: ``loop.call_later``) whose fault is reported under
        ``where`` (the loop would only log it)."""

        def guarded(*arguments: Any) -> None:
            try:
                function(*arguments)
            except Exception as fault:
                self.report(where, fault)

        return guarded

    async def race(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main`` until it ends or a fault is reported: then ``main`` is cancelled (its
        ``finally`` clauses run) and :attr:`error` raised, naming where the fault happened
        (chained to it)."""
        if self._event is None:
            self._event = asyncio.Event()
        if self.fault is not None:
            self._event.set()
        task = asyncio.ensure_future(main)
        faulted = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, faulted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            faulted.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})  # its clean-up runs before the error is raised
        if self.fault is not None:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the fault reported first is the cause
            raise self.error(self.message()) from self.fault
        return task.result()
