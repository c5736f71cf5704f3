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
        raise ValueError(f"seed must be >= 0, got {seed}")
    entropy = [int(seed)] + [_name_key(str(name)) for name in names]
    return np.random.SeedSequence(entropy)


def generator(seed: int, *names: str | int) -> np.random.Generator:
    """A :class:`numpy.random.Generator` for the component ``names`` of run ``seed``."""
    return np.random.default_rng(derive_seed(seed, *names))
