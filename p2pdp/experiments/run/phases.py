"""The steps both protocol families' runs share
(:mod:`~p2pdp.experiments.run.oneshot`, :mod:`~p2pdp.experiments.run.iterative`): the wall
seconds of a run's phases, shown to the progress report as each starts, and what the task
prepared for the fold.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from p2pdp.core.errors import ConfigError
from p2pdp.core.progress import set_phase
from p2pdp.tasks import prepared


class _Phases:
    """The wall seconds of a run's phases (:attr:`RunResult.wall_times`, by phase name), each
    phase also shown to the progress report (:func:`p2pdp.core.progress.set_phase`) as it
    starts: the steps of both protocol families are timed alike."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(
        self, name: str, shown: str | None = None, counter: Callable[[], str] | None = None
    ) -> Iterator[None]:
        """Time the block as phase ``name``, shown as ``shown`` (default ``name``) with the
        progress ``counter``."""
        start = time.perf_counter()
        set_phase(name if shown is None else shown, counter)
        yield
        self.seconds[name] = time.perf_counter() - start


def _trained(task: Any, trained: Any, *, fold: int, repetition: int) -> Any:
    """What ``task.prepare`` gives for the fold: ``trained`` if given (refused if it was
    prepared for another training key), else prepared now."""
    key = task.training_key(fold=fold, repetition=repetition)
    if trained is None:
        return prepared(task, fold=fold, repetition=repetition)
    if getattr(trained, "key", None) is not None and trained.key != key:
        raise ConfigError(
            "trained was prepared for another training key (data, fold, repetition, "
            "partition, lambda or model differ): its sensitivity would not match this config; "
            f"expected {key!r}, got {trained.key!r}"
        )
    return trained
