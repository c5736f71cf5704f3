"""Python's ``random.Random(seed).shuffle``, compiled (numba), for long integer lists.

:func:`p2pdp.sim.overlay.random_regular_edges` draws networkx's random-regular graph, whose
algorithm shuffles a list of ``degree * P`` stubs with ``random.Random(seed)`` at least once
per attempt (about 0.5 s of CPU for a million stubs in Python, two or more per attempt at
P = 100,000). :class:`CompiledShuffle` gives the same permutations from the same seed, word
for word: CPython's ``shuffle`` swaps ``x[i]`` with ``x[j]``, ``j = randbelow(i + 1)``, for
``i`` from the end down to 1; ``randbelow(n)`` takes ``k = n.bit_length()`` bits, the top
``k`` bits of the Mersenne Twister's next 32-bit word (``getrandbits(k)`` for ``k <= 32``),
until one is below ``n``. The twister is numpy's :class:`~numpy.random.MT19937` put in the
state of ``random.Random(seed)`` (the same 624 words and position), so its raw words are
CPython's (``tests/sim/test_overlay.py`` compares the permutations and the streams after
them). Words are drawn only as the swaps use them (each swap uses at least one), so the
stream never runs ahead of CPython's.

This module (hence numba) is imported only for lists of
:data:`~p2pdp.sim.overlay.COMPILED_STUBS` entries or more (a million: 10^5 peers of degree 10),
so smaller overlays (every shipped scenario's) pay nothing for it.
"""

from __future__ import annotations

import random

import numba
import numpy as np

__all__ = ["CompiledShuffle"]


@numba.njit(cache=True, nogil=True)
def _shuffle(values, i, words):  # pragma: no cover
    """Swaps of CPython's shuffle from index ``i`` down, using ``words`` (32-bit, in order)
    until they run out; returns the next ``i`` (0: done)."""
    used = 0
    while i > 0:
        n = i + 1
        k = 0
        while (n >> k) > 0:  # n.bit_length()
            k += 1
        j = n
        while j >= n:
            if used == words.size:
                return i  # this swap starts again with the next words
            j = np.int64(words[used] >> np.uint64(32 - k))
            used += 1
        values[i], values[j] = values[j], values[i]
        i -= 1
    return i


class CompiledShuffle:
    """``random.Random(seed).shuffle``, on int64 arrays: successive calls give the
    permutations successive calls of CPython's ``shuffle`` give to lists of the same values.

    Parameters
    ----------
    seed : int
        The seed ``random.Random`` would be given (its state is copied; the Python generator
        is not used afterwards).
    """

    def __init__(self, seed: int) -> None:
        state = random.Random(seed).getstate()[1]  # 624 words and the position
        self._twister = np.random.MT19937()
        self._twister.state = {
            "bit_generator": "MT19937",
            "state": {"key": np.array(state[:624], dtype=np.uint32), "pos": state[624]},
        }

    def __call__(self, values: np.ndarray) -> None:
        """Shuffle ``values`` (1-D int64) in place, as ``random.Random.shuffle`` shuffles a list
        of the same values (lengths below 2**32)."""
        i = values.size - 1
        while i > 0:  # each swap left uses one word at least: never draw ahead
            i = _shuffle(values, i, self._twister.random_raw(i))
