"""Smoke tests of p2pdp.figures_prevalence: every figure is drawn from small rows."""

from __future__ import annotations

import pytest

from p2pdp import figures_prevalence as figures
from p2pdp import pooling, prevalence
from p2pdp.rng import generator


@pytest.mark.slow  # about 5 s of matplotlib; benchmarks/prevalence_figures.py draws them too
def test_every_figure_is_written(tmp_path):
    rng = generator(0, "figures")
    rows = {
        "epsilon": (
            pooling.epsilon_rows([0.01, 0.1, 0.5], [1, 5], 0.85, 0.75)
            + pooling.epsilon_rows([0.01, 0.1, 0.5], [1, 5], 0.75, 0.85)
        ),
        "variance_ratio": [
            row
            for hold in pooling.HOLDS
            for row in pooling.variance_ratio_rows([1, 2, 5], [0.01, 0.2], 0.85, 0.75, hold=hold)
        ],
        "privacy_utility": pooling.privacy_utility_rows([1, 5], 0.05, 200, 0.85, 0.75, (1.0, 0.8)),
        "scaling": prevalence.scaling_rows([20, 80], [1.0], 0.2, n_repetitions=20, rng=rng),
        "coverage": prevalence.coverage_rows(10, [0.5, 2.0], n_repetitions=20, rng=rng),
        "policy": prevalence.policy_rows(0.2, 2, 10, 1.0, n_repetitions=10, rng=rng),
    }
    for name, data in rows.items():
        path = getattr(figures, f"{name}_figure")(data, tmp_path / f"{name}.png")
        assert path.stat().st_size > 10_000
