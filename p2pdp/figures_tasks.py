"""Report figures of the prevalence tasks, drawn from a results folder's rows.

Called by :func:`p2pdp.report.write_report` through a task class's ``figures(rows,
directory)`` hook (rows: one dict per cell, values parsed back to numbers). Each function
returns ``[(title, file name, caption)]`` for report.md; cells of one grid point are averaged
over folds and repetitions (so a ``covered_*`` mean is a coverage). No maths here beyond
averaging: analytic curves come from :mod:`p2pdp.pooling`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter
from scipy import stats

from p2pdp import pooling
from p2pdp.figures_prevalence import (
    epsilon_figure,
    integer_ticks,
    legend_below,
    variance_ratio_figure,
)
from p2pdp.results import write_figure

Rows = Sequence[dict[str, Any]]
Figure = tuple[str, str, str]
_DPI = 110
_METHODS = {
    "naive": "naive Beta (noise ignored)",
    "exact": "noise-aware (exact)",
    "plain": "non-private",
}
_STYLES = {"naive": ":", "exact": "-", "plain": "--"}


def wilson_interval(
    proportions: np.ndarray, counts: Sequence[int], level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of binomial proportions ``proportions`` out of ``counts`` trials."""
    z = float(stats.norm.ppf(0.5 + level / 2))
    n = np.asarray(counts, dtype=float)
    p = np.asarray(proportions, dtype=float)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # it always holds p: say so exactly where rounding would put an end a hair inside it
    return np.clip(np.minimum(centre - half, p), 0, 1), np.clip(np.maximum(centre + half, p), 0, 1)


def _swept(rows: Rows) -> list[str]:
    return [key for key in rows[0] if "." in key and len({row[key] for row in rows}) > 1]


def _mean(rows: Rows, column: str) -> float:
    values = [float(row[column]) for row in rows if row.get(column) is not None]
    return float(np.nanmean(values)) if values else float("nan")


def _groups(rows: Rows, keys: Sequence[str]) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[key] for key in keys), []).append(row)
    return dict(sorted(groups.items(), key=lambda item: tuple(map(_order, item[0]))))


def _order(value: Any) -> tuple[int, Any]:
    """Numbers first, in numeric order, then everything else by its text."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value) if number else (1, str(value))


def _colours(count: int) -> list:
    return [plt.get_cmap("viridis")(x) for x in np.linspace(0.0, 0.85, max(count, 1))]


def _panels(count: int, rows: int = 1) -> tuple[plt.Figure, np.ndarray]:
    figure, axes = plt.subplots(
        rows, count, figsize=(4.6 * count, 3.8 * rows), squeeze=False, layout="constrained"
    )
    return figure, axes


def _save(figure: plt.Figure, directory: Path, stem: str) -> str:
    return write_figure(figure, Path(directory) / f"{stem}.png", dpi=_DPI).name


# --- prevalence-counts and randomized-response ----------------------------------------------------
def prevalence_figures(rows: Rows, directory: Path) -> list[Figure]:
    """Error, privacy error and coverage vs epsilon (x: ``privacy.epsilon``).

    Colour: the task (when ``task.name`` is swept) or the policy; panels: the first other swept
    setting (e.g. ``prevalence.records_per_peer``).
    """
    swept = _swept(rows)
    x = "privacy.epsilon"
    if x not in swept:
        return []
    others = [
        key
        for key in swept
        if key not in (x, "task.name", "privacy.mechanism", "privacy.epsilon_per_aggregation")
    ]
    panel = others[0] if others else None
    line_key = "task.name" if "task.name" in swept else "policy"
    panels = _groups(rows, [panel]) if panel else {(): list(rows)}
    lines = sorted({row[line_key] for row in rows}, key=_order)
    colours = dict(zip(lines, _colours(len(lines)), strict=True))
    level = rows[0].get("prevalence.level", 0.95)
    ticks = sorted({float(row[x]) for row in rows})
    figures = []

    figure, axes = _panels(len(panels))
    for axis, (value, members) in zip(axes[0], panels.items(), strict=True):
        for line in lines:
            points = _groups([r for r in members if r[line_key] == line], [x])
            eps = [key[0] for key in points]
            for method in ("naive", "exact", "plain"):
                axis.plot(
                    eps,
                    [_mean(cells, f"error_{method}") for cells in points.values()],
                    ls=_STYLES[method],
                    marker="o",
                    ms=3,
                    color=colours[line],
                    label=f"{line}: {_METHODS[method]}",
                )
        _epsilon_axis(axis, panel, value, "|posterior mean - truth|", ticks)
    legend_below(figure, axes)
    figure.suptitle("Posterior-mean error per peer, mean over peers and repetitions", fontsize=9)
    figures.append(
        (
            "Posterior-mean error vs epsilon",
            _save(figure, directory, "prevalence_error"),
            "Absolute error of each peer's posterior mean against the true prevalence, for the "
            "naive Beta (noisy count used as the true one), the noise-aware exact posterior and "
            "the non-private posterior of the same records (dashed: the sampling error floor).",
        )
    )

    figure, axes = _panels(len(panels))
    for axis, (value, members) in zip(axes[0], panels.items(), strict=True):
        for line in lines:
            points = _groups([r for r in members if r[line_key] == line], [x])
            axis.plot(
                [key[0] for key in points],
                [_mean(cells, "privacy_error") for cells in points.values()],
                marker="o",
                color=colours[line],
                label=str(line),
            )
        _epsilon_axis(axis, panel, value, "|private - non-private posterior mean|", ticks)
    legend_below(figure, axes)
    figure.suptitle("What privacy costs: distance to the non-private posterior mean", fontsize=9)
    figures.append(
        (
            "Privacy error vs epsilon",
            _save(figure, directory, "prevalence_privacy_error"),
            "Mean distance between the noise-aware posterior mean and the non-private one on the "
            "same records: the error the privacy mechanism adds (log-log; central Laplace "
            "counts ~ 1/(eps N), local randomized response ~ 1/(eps sqrt N)).",
        )
    )

    figure, axes = _panels(len(panels), rows=2)
    for column, (value, members) in enumerate(panels.items()):
        for line in lines:
            points = _groups([r for r in members if r[line_key] == line], [x])
            eps = [key[0] for key in points]
            for method in ("naive", "exact", "plain"):
                style = dict(ls=_STYLES[method], marker="o", ms=3, color=colours[line])
                label = f"{line}: {_METHODS[method]}"
                coverage = np.array(
                    [_mean(cells, f"covered_{method}") for cells in points.values()]
                )
                low, high = wilson_interval(coverage, [len(c) for c in points.values()])
                width = [_mean(cells, f"width_{method}") for cells in points.values()]
                series = lines.index(line) * 3 + ("naive", "exact", "plain").index(method)
                dodge = np.exp(0.025 * (series - 1.5 * len(lines) + 0.5))  # bars side by side
                axes[0, column].errorbar(
                    np.asarray(eps) * dodge,
                    coverage,
                    yerr=[coverage - low, high - coverage],
                    capsize=2,
                    label=label,
                    **style,
                )
                axes[1, column].plot(eps, width, **style)
        axes[0, column].axhline(level, color="black", lw=0.8)
        _epsilon_axis(axes[0, column], panel, value, f"coverage of the {level:g} interval", ticks)
        axes[0, column].set_yscale("linear")
        axes[0, column].set_ylim(-0.02, 1.02)
        _epsilon_axis(axes[1, column], None, None, "interval width", ticks)
    legend_below(figure, axes)
    figure.suptitle(
        "Do the credible intervals cover the truth? (black: nominal; bars: Wilson 95% interval "
        "over the repetitions)",
        fontsize=9,
    )
    figures.append(
        (
            "Credible-interval coverage vs epsilon",
            _save(figure, directory, "prevalence_coverage"),
            "Fraction of repetitions (and peers) whose credible interval contains the true "
            "prevalence, with a Wilson 95% interval that counts each repetition once (the "
            "peers of one repetition share releases), and the mean interval width. The naive "
            "interval ignores the noise.",
        )
    )
    return figures


def _epsilon_axis(
    axis: plt.Axes, panel: str | None, value: Any, ylabel: str, ticks: Sequence[float]
) -> None:
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xticks(ticks, [f"{x:g}" for x in ticks])
    axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_xlabel("ε per peer")
    axis.set_ylabel(ylabel)
    if panel:
        axis.set_title(f"{panel.split('.')[-1]} = {value[0]}", fontsize=9)
    axis.grid(alpha=0.3, which="both")


# --- pooled-testing -------------------------------------------------------------------------
def pooled_figures(rows: Rows, directory: Path) -> list[Figure]:
    """The seed's figures, with the simulated MSE of the runs next to the asymptotic variance."""
    accuracies = sorted(
        {(row["pooling.test_sensitivity"], row["pooling.test_specificity"]) for row in rows}
    )
    sizes = sorted({int(row["groups.group_size"]) for row in rows})
    prevalences = sorted({float(row["pooling.prevalence"]) for row in rows})
    figures = []

    grid = np.geomspace(min(prevalences) / 2, 0.5, 60)
    analytic = [row for se, sp in accuracies for row in pooling.epsilon_rows(grid, sizes, se, sp)]
    epsilon_figure(analytic, Path(directory) / "pooled_epsilon.png")
    figures.append(
        (
            "One person's ε per pooled test vs prevalence",
            "pooled_epsilon.png",
            "The source's 'maximum differential privacy bound' (corrected): the distributional "
            "ε of one person per pooled test (the adversary knows p, not the other members), "
            "per pool size; pale band: the worst case (others known), which is plain DP and "
            "equals c = 1; dotted: each pool size's crossover prevalence "
            "(pooling.crossover_prevalence), where the worst-case likelihood ratio switches "
            "from one test outcome to the other.",
        )
    )

    for index, (se, sp) in enumerate(accuracies):
        stem = f"pooled_variance_ratio_{index}"
        ratio_rows = pooling.variance_ratio_rows(sizes, prevalences, se, sp, hold="pools")
        ratio_rows += pooling.variance_ratio_rows(sizes, prevalences, se, sp, hold="individuals")
        variance_ratio_figure(ratio_rows, Path(directory) / f"{stem}.png")
        figures.append(
            (
                f"Variance ratio vs pool size, Se = {se:g}, Sp = {sp:g}",
                f"{stem}.png",
                "Asymptotic variance of the pooled MLE over that of testing individually, "
                "at equal pools or equal people, with p_max(c) below which pooling wins.",
            )
        )

    figure, axes = _panels(len(accuracies), rows=2)
    colours = _colours(len(prevalences))
    for column, (se, sp) in enumerate(accuracies):
        panel = [
            r
            for r in rows
            if (r["pooling.test_sensitivity"], r["pooling.test_specificity"]) == (se, sp)
        ]
        for colour, p in zip(colours, prevalences, strict=True):
            points = _groups(
                [r for r in panel if r["pooling.prevalence"] == p], ["groups.group_size"]
            )
            c = [key[0] for key in points]
            mse = [_mean(cells, "squared_error") for cells in points.values()]
            asym = [_mean(cells, "asymptotic_variance") for cells in points.values()]
            eps = [_mean(cells, "epsilon_per_pool") for cells in points.values()]
            axes[0, column].plot(c, mse, "o", color=colour, label=f"p = {p:g}")
            axes[0, column].plot(c, asym, "-", color=colour, lw=1)
            axes[1, column].plot(eps, mse, "o-", color=colour)
            if p == prevalences[0]:  # pool sizes named along one line only: no collisions
                for ci, ei, mi in zip(c, eps, mse, strict=True):
                    axes[1, column].annotate(
                        f"c={ci}", (ei, mi), xytext=(3, 3), textcoords="offset points", fontsize=7
                    )
        axes[0, column].set_xscale("log")
        integer_ticks(axes[0, column], sizes)
        axes[0, column].set_yscale("log")
        axes[0, column].set_xlabel("pool size c")
        axes[0, column].set_ylabel("MSE of p_hat (dots) / asymptotic variance (lines)")
        axes[0, column].set_title(f"Se = {se:g}, Sp = {sp:g}", fontsize=9)
        axes[1, column].set_yscale("log")
        axes[1, column].set_xlabel("declared ε per person (one pool each)")
        axes[1, column].set_ylabel("MSE of p_hat")
        for axis in axes[:, column]:
            axis.grid(alpha=0.3, which="both")
    legend_below(figure, axes, ncols=len(prevalences))
    threat = rows[0].get("threat_model", "")
    figure.suptitle(f"Pooled testing on the engine; ε: {threat}", fontsize=9)
    figures.append(
        (
            "Simulated MSE vs pool size, and privacy vs utility",
            _save(figure, directory, "pooled_mse"),
            "Top: mean squared error of the receivers' pooled MLE over repetitions (dots) and "
            "the seed's asymptotic variance (lines), N people fixed. Bottom: the declared ε per "
            "person against that MSE, one point per pool size (named along the lowest "
            "prevalence's line).",
        )
    )
    return figures
