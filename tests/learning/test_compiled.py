"""The compiled fits of consecutive small shards (issue 43): the batched Newton's models,
each certified to the tolerance on its own."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from p2pdp.core.errors import P2PDPError
from p2pdp.learning.compiled import fit_consecutive_shards
from p2pdp.learning.models import LocalModels, fit_local_models
from tests.learning.test_models import TOL, gradient_norms, spambase_like_rows


def consecutive(n_rows: int, most: int, rng: np.random.Generator) -> np.ndarray:
    """Row numbers ``starts`` (k + 1,) of consecutive shards of 1 to ``most`` rows."""
    cuts = np.concatenate([[0], np.cumsum(rng.integers(1, most + 1, size=n_rows))])
    return cuts[cuts <= n_rows]


@pytest.mark.parametrize(("scale", "lam"), [(0.0, 1e-2), (0.0, 1e-5), (3.0, 1e-2), (3.0, 1e-6)])
def test_the_compiled_fits_are_the_batched_newton_s_models(scale, lam) -> None:
    """Shards of 1 to d - 1 rows (the dual form) on rows in the unit ball and on rows of
    norm up to 10^scale (where the line search backtracks): the same models as
    fit_local_models to 1e-12 relative, the same Newton steps, and every gradient norm,
    computed again directly, the one reported (to 1e-12) and at most the tolerance."""
    rng = np.random.default_rng(21)
    X, y = spambase_like_rows(1000, 30, rng)
    X = X * 10 ** rng.uniform(-scale, scale, size=(len(X), 1))
    starts = consecutive(len(X), 29, rng)
    shards = [np.arange(a, b) for a, b in itertools.pairwise(starts)]
    batched = fit_local_models(X, y, shards, lam)
    weights, norms, steps = fit_consecutive_shards(X, y, starts, lam, TOL, 50)
    scale_of = np.abs(batched.weights).max(axis=1, keepdims=True)
    np.testing.assert_allclose(weights / scale_of, batched.weights / scale_of, rtol=0, atol=1e-12)
    assert steps == batched.iterations
    compiled = LocalModels(
        weights=weights, grad_norms=norms, iterations=steps, shard_sizes=batched.shard_sizes
    )
    direct = gradient_norms(compiled, X, y, shards, lam)
    np.testing.assert_allclose(norms, direct, rtol=0, atol=1e-12)
    assert max(norms.max(), direct.max()) <= TOL


def test_a_shard_that_does_not_converge_is_named() -> None:
    rng = np.random.default_rng(22)
    X, y = spambase_like_rows(200, 30, rng)
    starts = np.array([0, 10, 25, 40])
    with pytest.raises(P2PDPError, match="worst peer 107"):
        fit_consecutive_shards(X, y, starts, 1e-2, TOL, 1, first_peer=107)
    with pytest.raises(ValueError, match="1 to 29 rows"):
        fit_consecutive_shards(X, y, np.array([0, 30]), 1e-2, TOL, 50)
