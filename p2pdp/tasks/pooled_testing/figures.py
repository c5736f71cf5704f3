"""Figures of the pooled-testing workload: the study's figures and the report's.

The study figures (:func:`epsilon_figure`, :func:`variance_ratio_figure`,
:func:`privacy_utility_figure`) take the rows of :mod:`p2pdp.tasks.pooled_testing.pooling`
(``epsilon_rows``, ``variance_ratio_rows``, ``privacy_utility_rows``) and write one PNG each
(``benchmarks/prevalence_figures.py``). The report figures (:func:`pooled_figures`) are drawn from
a results folder's rows through the task's ``figures(rows, directory)`` hook; analytic curves
come from :mod:`p2pdp.tasks.pooled_testing.pooling`.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from p2pdp.core import figures as fig
from p2pdp.tasks.pooled_testing import pooling

# --- study figures ------------------------------------------------------------------------------
_THREAT_MODEL = "adversary knows p, not the other members' statuses (not worst-case DP)"


# --- pooled testing -----------------------------------------------------------------------------
def epsilon_figure(rows: fig.Rows, path: str | Path) -> Path:
    """Epsilon vs prevalence per pool size, one panel per ``(Se, Sp)`` (``epsilon_rows``)."""
    accuracies = sorted({(row["sensitivity"], row["specificity"]) for row in rows})
    figure, axes = plt.subplots(
        1, len(accuracies), figsize=(5.2 * len(accuracies), 4.2), sharey=True, layout="constrained"
    )
    axes = np.atleast_1d(axes)
    for axis, (se, sp) in zip(axes, accuracies, strict=True):
        panel = fig.select(rows, sensitivity=se, specificity=sp)
        sizes = fig.values(panel, "pool_size")
        # drawn first, wide and pale: c = 1 (which equals it: no other members) stays visible
        axis.axhline(
            panel[0]["worst_case_epsilon"],
            color="grey",
            lw=4,
            alpha=0.4,
            zorder=1,
            label="worst case (others' statuses known)",
        )
        for colour, c in zip(fig.colours(len(sizes)), sizes, strict=True):
            line = sorted(fig.select(panel, pool_size=c), key=lambda row: row["prevalence"])
            p = [row["prevalence"] for row in line]
            axis.plot(p, [row["epsilon"] for row in line], color=colour, label=f"c = {c}", zorder=3)
            crossover = line[0]["crossover_prevalence"]
            if c > 1 and 0 < crossover < 1 and p[0] <= crossover <= p[-1]:
                axis.axvline(crossover, color=colour, lw=0.8, ls=":", zorder=2)
        axis.set_xscale("log")
        axis.set_xlabel("prevalence p")
        axis.set_title(f"Se = {se:g}, Sp = {sp:g}")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("ε of one person per pooled test (nats)")
    dotted = Line2D(
        [], [], color="grey", lw=0.8, ls=":", label="dotted: crossover prevalence of that c"
    )
    fig.legend_below(figure, axes, ncols=4, extra=[dotted])
    figure.suptitle(f"Privacy of pooling; {_THREAT_MODEL}", fontsize=9)
    return fig.write_figure(figure, path)


def variance_ratio_figure(rows: fig.Rows, path: str | Path) -> Path:
    """Variance ratio vs pool size per prevalence, with ``p_max(c)`` (``variance_ratio_rows``).

    One column per ``hold``; top: ``sigma^2(p, c) / sigma^2(p, 1)`` (below 1: pooling wins);
    bottom: ``p_max(c)`` with each prevalence as a dotted line, so pooling wins where the
    dotted line lies under the curve.
    """
    holds = fig.values(rows, "hold")
    figure, axes = plt.subplots(
        2, len(holds), figsize=(5.2 * len(holds), 6.4), squeeze=False, layout="constrained"
    )
    for column, hold in enumerate(holds):
        panel = fig.select(rows, hold=hold)
        prevalences = fig.values(panel, "prevalence")
        top, bottom = axes[0, column], axes[1, column]
        for colour, p in zip(fig.colours(len(prevalences)), prevalences, strict=True):
            line = sorted(fig.select(panel, prevalence=p), key=lambda row: row["pool_size"])
            sizes = [row["pool_size"] for row in line]
            ratio = [row["variance_ratio"] for row in line]
            top.plot(sizes, ratio, marker="o", ms=3, color=colour, label=f"p = {p:g}")
            better = [c for c, row in zip(sizes, line, strict=True) if row["pooling_better"]]
            if better:
                top.plot(max(better), ratio[sizes.index(max(better))], "k|", ms=12, mew=2)
            bottom.axhline(p, color=colour, ls=":", lw=1)
            fig.integer_ticks(top, sizes)
        pooled = sorted(
            {(row["pool_size"], row["max_prevalence"]) for row in panel if row["pool_size"] > 1}
        )
        bottom.plot(*zip(*pooled, strict=True), color="black", marker="o", ms=3, label="p_max(c)")
        fig.integer_ticks(bottom, [c for c, _ in pooled])
        top.axhline(1.0, color="black", lw=1, ls="--")
        top.set_yscale("log")
        top.set_title(f"hold {hold} fixed")
        top.set_ylabel("σ²(p, c) / σ²(p, 1)")
        bottom.set_ylabel("p_max")
        bottom.set_yscale("log")
        for axis in (top, bottom):
            axis.set_xlabel("pool size c")
            axis.grid(alpha=0.3)
    extra = [
        Line2D(
            [],
            [],
            color="black",
            ls="",
            marker="|",
            ms=10,
            mew=2,
            label="top: largest c at which pooling still wins",
        ),
        Line2D(
            [],
            [],
            color="grey",
            ls=":",
            lw=1,
            label="bottom, dotted: each p (pooling wins where it is under p_max(c))",
        ),
    ]
    fig.legend_below(figure, axes, ncols=3, extra=extra)
    se, sp = rows[0]["sensitivity"], rows[0]["specificity"]
    figure.suptitle(
        f"Variance of the pooled MLE relative to individual testing (Se = {se:g}, Sp = {sp:g})",
        fontsize=10,
    )
    return fig.write_figure(figure, path)


def privacy_utility_figure(rows: fig.Rows, path: str | Path) -> Path:
    """Epsilon vs RMSE of ``p_hat`` per pool size, along randomized-response strength.

    Uses the simulated ``mse`` when present, else the asymptotic variance; the dashed curve
    joins the ``keep_probability = 1`` (no randomized response) points across ``c``.
    """
    figure, axis = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    sizes = fig.values(rows, "pool_size")
    key = "mse" if "mse" in rows[0] else "asymptotic_variance"
    plain = []
    for colour, c in zip(fig.colours(len(sizes)), sizes, strict=True):
        line = sorted(fig.select(rows, pool_size=c), key=lambda row: -row["keep_probability"])
        rmse = [math.sqrt(row[key]) for row in line]
        axis.plot(
            rmse, [row["epsilon"] for row in line], marker="o", ms=3, color=colour, label=f"c = {c}"
        )
        plain += [(rmse[0], line[0]["epsilon"])] if line[0]["keep_probability"] == 1 else []
    if len(plain) > 1:
        axis.plot(*zip(*plain, strict=True), color="grey", ls="--", lw=1, label="no RR, across c")
    axis.set_xscale("log")
    axis.set_xlabel("RMSE of p̂ (" + ("simulated" if key == "mse" else "asymptotic") + ")")
    axis.set_ylabel("ε of one person per pooled test (nats)")
    row = rows[0]
    axis.set_title(
        f"Privacy vs utility: p = {row['prevalence']:g}, N = {row['n_pools'] * row['pool_size']}"
        " people; points: RR keep probability 1 → lower",
        fontsize=9,
    )
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return fig.write_figure(figure, path)


# --- pooled-testing -------------------------------------------------------------------------
def pooled_figures(rows: fig.Rows, directory: Path) -> list[fig.Figure]:
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

    figure, axes = fig.panels(len(accuracies), rows=2)
    colours = fig.colours(len(prevalences), stop=0.85)
    for column, (se, sp) in enumerate(accuracies):
        panel = [
            r
            for r in rows
            if (r["pooling.test_sensitivity"], r["pooling.test_specificity"]) == (se, sp)
        ]
        for colour, p in zip(colours, prevalences, strict=True):
            points = fig.grouped(
                [r for r in panel if r["pooling.prevalence"] == p], ["groups.group_size"]
            )
            c = [key[0] for key in points]
            mse = [fig.mean(cells, "squared_error") for cells in points.values()]
            asym = [fig.mean(cells, "asymptotic_variance") for cells in points.values()]
            eps = [fig.mean(cells, "epsilon_per_pool") for cells in points.values()]
            axes[0, column].plot(c, mse, "o", color=colour, label=f"p = {p:g}")
            axes[0, column].plot(c, asym, "-", color=colour, lw=1)
            axes[1, column].plot(eps, mse, "o-", color=colour)
            if p == prevalences[0]:  # pool sizes named along one line only: no collisions
                for ci, ei, mi in zip(c, eps, mse, strict=True):
                    axes[1, column].annotate(
                        f"c={ci}", (ei, mi), xytext=(3, 3), textcoords="offset points", fontsize=7
                    )
        axes[0, column].set_xscale("log")
        fig.integer_ticks(axes[0, column], sizes)
        axes[0, column].set_yscale("log")
        axes[0, column].set_xlabel("pool size c")
        axes[0, column].set_ylabel("MSE of p_hat (dots) / asymptotic variance (lines)")
        axes[0, column].set_title(f"Se = {se:g}, Sp = {sp:g}", fontsize=9)
        axes[1, column].set_yscale("log")
        axes[1, column].set_xlabel("declared ε per person (one pool each)")
        axes[1, column].set_ylabel("MSE of p_hat")
        for axis in axes[:, column]:
            axis.grid(alpha=0.3, which="both")
    fig.legend_below(figure, axes, ncols=len(prevalences))
    threat = rows[0].get("threat_model", "")
    figure.suptitle(f"Pooled testing on the engine; ε: {threat}", fontsize=9)
    figures.append(
        (
            "Simulated MSE vs pool size, and privacy vs utility",
            fig.save(figure, directory, "pooled_mse"),
            "Top: mean squared error of the receivers' pooled MLE over repetitions (dots) and "
            "the seed's asymptotic variance (lines), N people fixed. Bottom: the declared ε per "
            "person against that MSE, one point per pool size (named along the lowest "
            "prevalence's line).",
        )
    )
    return figures
