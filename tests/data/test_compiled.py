"""The compiled min-max transform of logged rows (p2pdp.data.compiled) gives numpy's rows:
every step plan with minmax, rows of each width class of numpy's pairwise summation (wider
rows: numpy's steps), a constant feature, test rows outside the training range, and rows
written into a kept slice."""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.data import compiled
from p2pdp.data.compiled import _pairwise
from p2pdp.data.preprocess import Preprocessor

PLANS = [
    ("log1p", "minmax", "bias", "project_unit_ball"),
    ("log1p", "minmax", "bias", "scale_sqrt_d"),
    ("log1p", "minmax", "project_unit_ball"),
    ("log1p", "minmax", "bias"),
    ("log1p", "minmax"),
]


def rows(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.lognormal(size=(n, d)) * rng.choice([1e-3, 1.0, 1e3], size=d)
    X[:, 0] = 2.0  # a constant feature: 0 after minmax
    return X


@pytest.mark.parametrize("steps", PLANS)
@pytest.mark.parametrize("d", [3, 8, 57, 127, 200])  # 200: numpy's steps
def test_logged_rows_are_transformed_as_numpy_transforms_the_raw_rows(steps, d) -> None:
    X = rows(600, d, seed=d)
    fitted = Preprocessor(steps=steps).fit(X[:400])  # the last rows outside its bounds too
    mine = fitted.transform_logged(np.log1p(X))
    np.testing.assert_allclose(mine, fitted.transform(X), rtol=1e-15, atol=1e-16)
    assert np.all(mine[:, 0] == 0.0) and np.all((mine >= 0) & (mine <= 1))
    if "project_unit_ball" in steps:  # rows longer than 1 shrunk onto the sphere
        assert np.linalg.norm(mine, axis=1).max() == pytest.approx(1.0, abs=1e-15)


def test_the_kernel_runs_and_writes_into_the_kept_slice(monkeypatch) -> None:
    X = rows(300, 57, seed=1)
    fitted = Preprocessor().fit(X)
    kept = np.full((500, 58), np.nan)
    calls = []
    real = compiled.minmax_rows
    monkeypatch.setattr(compiled, "minmax_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = fitted.transform_logged(np.log1p(X), out=kept[100:400])
    assert calls == [1] and np.shares_memory(out, kept)
    assert np.isnan(kept[:100]).all() and np.isnan(kept[400:]).all()
    np.testing.assert_allclose(kept[100:400], fitted.transform(X), rtol=1e-15, atol=1e-16)
    strided = np.empty((300, 116))[:, ::2]  # not C-contiguous: numpy's steps
    fitted.transform_logged(np.log1p(X), out=strided)
    assert calls == [1]
    np.testing.assert_allclose(strided, kept[100:400], rtol=1e-15, atol=1e-16)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 57, 58, 127, 128])
def test_the_sum_is_numpy_s_pairwise_sum(n) -> None:
    """Terms of 1e16 and units: each order of the sum loses other units, so only numpy's
    order gives numpy's sum (a plain loop would not, from 32 terms on, here)."""
    values = np.random.default_rng(n).choice([1e16, -1e16, 1.0, 3.0], size=n + 3)
    ours = _pairwise(values, 3, n)
    assert ours == pytest.approx(np.add.reduce(values[3:]), rel=1e-12, abs=1e-12)
    if n >= 32:
        assert abs(ours - sum(values[3:].tolist())) >= 1.0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_logged_entry_is_refused_on_either_path(bad) -> None:
    X = rows(50, 57, seed=2)
    logged = np.log1p(X)
    logged[31, 40] = bad
    fitted = Preprocessor().fit(X)
    for out in (None, np.empty((50, 116))[:, ::2]):  # compiled, then numpy's steps
        with pytest.raises(ConfigError, match="logged must contain only finite values"):
            fitted.transform_logged(logged, out=out)
