"""Reproducible random streams.

One root :class:`numpy.random.SeedSequence` per run; every component gets its own stream,
derived from the root seed and a fixed *name*, never from execution order. Two runs with the
same seed therefore draw identical numbers whatever the order in which components ask for
them, and whichever worker process runs them.

numpy generators are not cryptographically secure: fine for a simulator, not for deployment.
"""

from __future__ import annotations

import hashlib

import numpy as np

from p2pdp.core.errors import ConfigError


def _name_key(name: str) -> int:
    """A stable 64-bit integer derived from ``name`` (independent of PYTHONHASHSEED)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def derive_seed(seed: int, *names: str | int) -> np.random.SeedSequence:
    """Seed sequence for the component identified by ``names`` under root ``seed``.

    Parameters
    ----------
    seed : int
        Root seed of the run (>= 0).
    *names : str or int
        Path of the component, e.g. ``("fold", 3, "noise")``.
    """
    if seed < 0:
        raise ConfigError(f"seed must be >= 0, got {seed}")  # a ValueError too
    entropy = [int(seed)] + [_name_key(str(name)) for name in names]
    return np.random.SeedSequence(entropy)


def os_generator() -> np.random.Generator:
    """A fresh generator seeded with 128 bits from the operating system's CSPRNG.

    :class:`numpy.random.SeedSequence` without entropy reads them with :mod:`secrets`
    (``os.urandom``), so nothing any other party holds (a scenario, its seed) determines the
    draws. PCG64 itself is not a cryptographic generator: its state follows from enough of its
    outputs. That is why a caller takes a fresh one for each release or noise share (the
    network runtime, :mod:`p2pdp.net.host`): no output of one ever helps predict another's,
    and the draws of one stay in the process that made them.
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence()))


def generator(seed: int, *names: str | int) -> np.random.Generator:
    """A :class:`numpy.random.Generator` for the component ``names`` of run ``seed``."""
    return np.random.default_rng(derive_seed(seed, *names))


class Uniforms:
    """Uniform [0, 1) floats drawn from ``rng`` in batches, for per-event scalar draws.

    One ``rng.random()`` call per event costs about a microsecond; popping from a batch
    costs a tenth of that. A batch is drawn whenever the previous one is used up, so the
    values depend on how other draws from ``rng`` interleave with the batches: share one
    instance among the components of a sampler and keep the order of the draws. Keep the
    bound method (``uniform = Uniforms(rng).draw``) in per-event code: calling it costs as
    little as a plain method of the sampler.

    Parameters
    ----------
    rng : numpy.random.Generator
    batch : int
        Values drawn at a time (>= 1).
    """

    __slots__ = ("_batch", "_rng", "_values")

    def __init__(self, rng: np.random.Generator, *, batch: int = 4096) -> None:
        self._rng = rng
        self._batch = batch
        self._values: list[float] = []

    def draw(self) -> float:
        """The next uniform float in [0, 1)."""
        if not self._values:
            self._values = self._rng.random(self._batch).tolist()
        return self._values.pop()

    def take(self, n: int) -> list[float]:
        """The next ``n`` uniform floats in [0, 1), in order: what ``n`` calls of :meth:`draw`
        give (the same batches, drawn at the same points), at a fraction of the cost."""
        taken: list[float] = []
        values = self._values
        while n > len(values):  # use this batch up, then draw the next
            taken.extend(reversed(values))
            n -= len(values)
            values = self._values = self._rng.random(self._batch).tolist()
        if n:
            taken.extend(values[: -n - 1 : -1])
            del values[-n:]
        return taken
