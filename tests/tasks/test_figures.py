"""The workloads' figures (``p2pdp.tasks.<workload>.figures``): every figure is drawn from small
rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer

from p2pdp.core import figures
from p2pdp.core.rng import generator
from p2pdp.tasks.pooled_testing import figures as pooled_figures
from p2pdp.tasks.pooled_testing import pooling
from p2pdp.tasks.prevalence import estimators as prevalence
from p2pdp.tasks.prevalence import figures as prevalence_figures


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
        module = (
            pooled_figures
            if name in ("epsilon", "variance_ratio", "privacy_utility")
            else prevalence_figures
        )
        path = getattr(module, f"{name}_figure")(data, tmp_path / f"{name}.png")
        assert path.stat().st_size > 10_000


# --- the report figures of the prevalence tasks, as a reader sees them -----------------------
@pytest.fixture
def captured(monkeypatch):
    """Figures as the tasks' report hooks save them, by file stem (kept open)."""
    import matplotlib.pyplot as plt

    drawn = {}

    def keep(figure, path, **options):
        figure.canvas.draw()  # lay out (constrained layout) before anything is measured
        drawn[Path(path).stem] = figure
        return Path(path)

    monkeypatch.setattr(figures, "write_figure", keep)  # every workload figure is saved by it
    yield drawn
    plt.close("all")


def _report_of(case: str, tmp_path: Path) -> None:
    from p2pdp.experiments.report.write import write_report
    from p2pdp.experiments.run.runner import run_experiment
    from p2pdp.experiments.scenarios.scenario import parse_scenario
    from tests.tasks.test_prevalence_tasks import CASES

    text, settings, _ = CASES[case]
    run_experiment(parse_scenario(text, overrides=settings), tmp_path, jobs=1)
    write_report(tmp_path)


def _data_axes(figure):
    return [axis for axis in figure.axes if axis.axison]


def _assert_legends_clear_of_data(figure, name):
    """Every legend lies outside every panel: it covers no data."""
    legends = [*figure.legends, *(a.get_legend() for a in figure.axes if a.get_legend())]
    assert legends, f"{name}: no legend"
    for legend in legends:
        box = legend.get_window_extent()
        for axis in _data_axes(figure):
            assert not box.overlaps(axis.get_window_extent()), f"{name}: legend over a panel"


def test_prevalence_figures_keep_legends_off_the_data_and_show_coverage_uncertainty(
    tmp_path, captured
):
    _report_of("rr-vs-central", tmp_path)
    assert {"prevalence_error", "prevalence_privacy_error", "prevalence_coverage"} <= set(captured)
    for name in ("prevalence_error", "prevalence_privacy_error", "prevalence_coverage"):
        _assert_legends_clear_of_data(captured[name], name)
    coverage = _data_axes(captured["prevalence_coverage"])[0]
    bars = [c for c in coverage.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 6  # 2 tasks x (naive, exact, non-private), each with its interval
    segments = bars[0].lines[2][0].get_segments()
    assert all(low[1] <= high[1] for low, high in segments)
    assert any(high[1] - low[1] > 0.05 for low, high in segments)  # 2 repetitions: wide


def test_pooled_figures_have_integer_pool_size_ticks_and_explain_every_line(tmp_path, captured):
    _report_of("pooled-testing", tmp_path)
    for name in ("pooled_mse", "pooled_epsilon", "pooled_variance_ratio_0"):
        _assert_legends_clear_of_data(captured[name], name)
    top = _data_axes(captured["pooled_mse"])[0]
    assert list(top.get_xticks()) == [1, 5]
    assert [t.get_text() for t in top.get_xticklabels()] == ["1", "5"]
    for axis in _data_axes(captured["pooled_variance_ratio_0"]):
        assert all(float(tick).is_integer() for tick in axis.get_xticks())
    epsilon = captured["pooled_epsilon"]
    labels = [t.get_text() for legend in epsilon.legends for t in legend.get_texts()]
    assert any("dotted" in label for label in labels)  # the crossover lines are explained
    axis = _data_axes(epsilon)[0]
    worst = next(line for line in axis.get_lines() if line.get_label().startswith("worst"))
    single = next(line for line in axis.get_lines() if line.get_label() == "c = 1")
    assert single.get_zorder() > worst.get_zorder()  # c = 1 equals the worst case: on top


def test_wilson_interval_holds_the_proportion_and_matches_scipy():
    from scipy.stats import binomtest

    from p2pdp.core.figures import wilson_interval

    p = np.array([0.0, 0.2, 0.95, 1.0, 1.0])
    n = [20, 30, 20, 20, 7]
    low, high = wilson_interval(p, n)
    assert (low <= p).all() and (p <= high).all()  # exactly, also at 0 and 1
    for pi, ni, lo, hi in zip(p, n, low, high, strict=True):
        expected = binomtest(round(pi * ni), ni).proportion_ci(method="wilson")
        assert (lo, hi) == pytest.approx((expected.low, expected.high), abs=1e-12)
