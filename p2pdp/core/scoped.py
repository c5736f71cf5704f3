"""A context variable set for the length of a ``with`` block: the settings a caller gives
the code it runs (the local workers, the evaluation's tiles, the hosts flag's name)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TypeVar

__all__ = ["scoped"]

_T = TypeVar("_T")


@contextlib.contextmanager
def scoped(variable: contextvars.ContextVar[_T], value: _T) -> Iterator[None]:
    """``variable`` is ``value`` inside the block, and what it was before once it is left
    (an exception included)."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)
