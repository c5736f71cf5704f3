"""How the evaluation of ensembles and local models cuts its work into blocks.

:func:`p2pdp.learning.evaluation.evaluate_ensembles` and
:func:`~p2pdp.learning.evaluation.linear_error` score test rows against models in blocks
whose sizes bound their memory and keep their arrays in cache. The sizes change how the work
is cut, never what it counts: the error counts are integers, equal for any tiles (the tests
check it); sums of margins are added in block order, so scores may differ in their last bits.

A run uses :class:`EvaluationTiles`'s defaults; :func:`evaluation_tiles` sets others for the
calls inside a block (as :func:`p2pdp.core.parallel.local_workers` sets the workers), and the
two functions also take ``tiles=`` directly.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, fields

from p2pdp.core.errors import ConfigError
from p2pdp.core.scoped import scoped

__all__ = ["EvaluationTiles", "current_tiles", "evaluation_tiles"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluationTiles:
    """Block sizes of the evaluation (counts, each an integer >= 1).

    Attributes
    ----------
    chunk_elements
        Test rows x (models + peers) per block of rows: bounds a block's margins to about
        100 MB (8-byte floats) by default.
    min_chunk_rows
        Fewest test rows per block, however many models: every block reads every model, so
        blocks of a few rows made the reads grow as P^2 (a million peers: 2 rows a block,
        930 GB read). Above 250,000 peers and models this lets a block's memory grow with P.
    peer_tile, row_tile
        Peers and test rows of one tile scored against the published models' sums: its
        (peers, rows) arrays stay 1 MB, in cache, while each peer's model is read once per
        tile of rows. Tiles of 512 x 512 (2 MB arrays) took 2.5x the time of 256 x 512 or
        256 x 256 at 10^5 peers. Their product is also the number of margins a block of
        published models computes at a time.

    Raises
    ------
    ConfigError
        A size that is not an integer >= 1, naming the field and the value.
    """

    chunk_elements: int = 4_000_000
    min_chunk_rows: int = 16
    peer_tile: int = 256
    row_tile: int = 512

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"EvaluationTiles.{field.name} must be an integer >= 1, got {value!r}"
                )

    def row_blocks(self, n_rows: int, width: int) -> list[slice]:
        """Slices of ``n_rows`` rows such that a block times ``width`` columns stays under
        :attr:`chunk_elements`, or of :attr:`min_chunk_rows` rows."""
        block = max(self.min_chunk_rows, self.chunk_elements // (width + 1))
        return [slice(start, start + block) for start in range(0, n_rows, block)]


_DEFAULT = EvaluationTiles()
_TILES: contextvars.ContextVar[EvaluationTiles | None] = contextvars.ContextVar(
    "evaluation_tiles", default=None
)


def current_tiles() -> EvaluationTiles:
    """The tiles of the evaluations run here: the defaults, or those of the innermost
    :func:`evaluation_tiles` block."""
    return _TILES.get() or _DEFAULT


def evaluation_tiles(tiles: EvaluationTiles) -> contextlib.AbstractContextManager[None]:
    """Evaluations inside the block (a whole run's too) cut their work by ``tiles``."""
    return scoped(_TILES, tiles)
