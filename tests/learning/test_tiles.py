"""The evaluation's tiles: validated sizes, and the block that sets them for a whole run."""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.learning import evaluation
from p2pdp.learning.evaluation import linear_error
from p2pdp.learning.tiles import EvaluationTiles, current_tiles, evaluation_tiles


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "8"])
@pytest.mark.parametrize("name", ["chunk_elements", "min_chunk_rows", "peer_tile", "row_tile"])
def test_a_size_that_is_not_a_positive_integer_is_refused_by_name(name, value):
    with pytest.raises(ConfigError, match=rf"EvaluationTiles\.{name} must be an integer >= 1, got"):
        EvaluationTiles(**{name: value})


def test_row_blocks_cover_the_rows_once_within_the_element_budget():
    tiles = EvaluationTiles(chunk_elements=30, min_chunk_rows=2)
    blocks = tiles.row_blocks(23, width=4)  # 30 // 5 = 6 rows a block, a short last
    assert [len(range(23)[b]) for b in blocks] == [6, 6, 6, 5]
    assert np.array_equal(np.concatenate([np.arange(23)[b] for b in blocks]), np.arange(23))
    assert [len(range(5)[b]) for b in tiles.row_blocks(5, width=100)] == [2, 2, 1]  # the floor


def test_a_block_sets_the_tiles_of_the_evaluations_inside_it(monkeypatch):
    """``evaluation_tiles`` reaches an evaluation that is not given ``tiles`` (as a run's),
    is undone on leaving, and a ``tiles=`` argument wins over it."""
    rng = np.random.default_rng(2)
    weights, X = rng.normal(size=(9, 3)), rng.normal(size=(5, 3))
    y = np.where(rng.random(5) < 0.5, 1, -1)
    pieces: list[int] = []
    split = evaluation.forked_map

    def recording(function, shared, items, *, workers):
        pieces.append(sum(len(range(9)[block]) > 0 for item in items for block in item))
        return split(function, shared, items, workers=workers)

    monkeypatch.setattr(evaluation, "forked_map", recording)
    small = EvaluationTiles(chunk_elements=12, min_chunk_rows=1)  # 2 models a block
    whole = linear_error(weights, X, y)
    with evaluation_tiles(small):
        assert current_tiles() == small
        np.testing.assert_array_equal(linear_error(weights, X, y), whole)
        linear_error(weights, X, y, tiles=EvaluationTiles())
    assert current_tiles() == EvaluationTiles()
    assert pieces == [1, 5, 1]
