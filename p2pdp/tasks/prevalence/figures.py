"""Figures of the prevalence workload: the study's figures and the report's.

The study figures (:func:`scaling_figure`, :func:`coverage_figure`, :func:`policy_figure`) take
the rows of :mod:`p2pdp.tasks.prevalence.estimators` (``scaling_rows``, ``coverage_rows``,
``policy_rows``) and write one PNG each (``benchmarks/prevalence_figures.py``). The report
figures (:func:`prevalence_figures`) are drawn from a results folder's rows through the task's
``figures(rows, directory)`` hook: cells of one grid point are averaged over folds and
repetitions (so a ``covered_*`` mean is a coverage). No maths here beyond averaging.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from p2pdp.core import figures as fig


# --- noisy counts and randomized response ---------------------------------------------------------
def scaling_figure(rows: fig.Rows, path: str | Path) -> Path:
    """RMSE vs records per group: central (Laplace count) vs local (RR) (``scaling_rows``)."""
    figure, axes = plt.subplots(1, 2, figsize=(10.4, 4.2), layout="constrained")
    epsilons = [e for e in fig.values([r for r in rows if r["model"] != "non-private"], "epsilon")]
    styles = {"central": "-", "local": "--"}
    for colour, eps in zip(fig.colours(len(epsilons)), epsilons, strict=True):
        for model, style in styles.items():
            line = sorted(fig.select(rows, model=model, epsilon=eps), key=lambda row: row["n"])
            n = [row["n"] for row in line]
            label = f"{model}, ε = {eps:g}"
            axes[0].plot(
                n, [row["rmse"] for row in line], style, marker="o", ms=3, color=colour, label=label
            )
            axes[1].plot(
                n, [row["predicted_privacy_rmse"] for row in line], style, color=colour, label=label
            )
            axes[1].plot(n, [row["privacy_rmse"] for row in line], "o", ms=3, color=colour)
    reference = sorted(fig.select(rows, model="non-private"), key=lambda row: row["n"])
    axes[0].plot(
        [r["n"] for r in reference],
        [r["rmse"] for r in reference],
        color="black",
        lw=1,
        label="non-private",
    )
    axes[0].set_ylabel("RMSE of the estimated prevalence")
    axes[1].set_ylabel("RMS distance to the non-private k/n\nlines: formula, dots: simulation")
    for axis in axes:
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("records n")
        axis.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    axes[1].set_title("central ~ 1/(ε n), local ~ 1/(ε √n)", fontsize=9)
    return fig.write_figure(figure, path)


def coverage_figure(rows: fig.Rows, path: str | Path) -> Path:
    """Coverage and width of 95% credible intervals vs epsilon per method (``coverage_rows``)."""
    figure, axes = plt.subplots(1, 2, figsize=(10.4, 4.2), layout="constrained")
    methods = [m for m in ("naive", "widened", "exact") if fig.select(rows, method=m)]
    for colour, method in zip(fig.colours(len(methods)), methods, strict=True):
        line = sorted(fig.select(rows, method=method), key=lambda row: row["epsilon"])
        eps = [row["epsilon"] for row in line]
        axes[0].plot(eps, [row["coverage"] for row in line], marker="o", color=colour, label=method)
        axes[1].plot(
            eps, [row["mean_width"] for row in line], marker="o", color=colour, label=method
        )
    reference = fig.select(rows, method="non-private")
    if reference:
        axes[0].axhline(reference[0]["coverage"], color="black", lw=1, label="non-private")
        axes[1].axhline(reference[0]["mean_width"], color="black", lw=1, label="non-private")
    axes[0].axhline(0.95, color="grey", ls=":", lw=1)
    axes[0].set_ylabel("coverage of the 95% credible interval")
    axes[1].set_ylabel("mean interval width")
    for axis in axes:
        axis.set_xscale("log")
        axis.set_xlabel("ε of the noisy count")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Does Laplace noise make Beta credible intervals lie?", fontsize=10)
    return fig.write_figure(figure, path)


def policy_figure(rows: fig.Rows, path: str | Path) -> Path:
    """RMSE and coverage after each batch for the seed's two policies (``policy_rows``)."""
    figure, axes = plt.subplots(1, 2, figsize=(10.4, 4.2), layout="constrained")
    styles = {"naive": "--", "exact": "-"}
    colours = dict(zip(("accumulate", "requery"), fig.colours(2), strict=True))
    for policy, colour in colours.items():
        for method, style in styles.items():
            line = sorted(fig.select(rows, policy=policy, method=method), key=lambda r: r["batch"])
            batches = [row["batch"] for row in line]
            label = f"{policy}, {method}"
            axes[0].plot(
                batches,
                [row["rmse"] for row in line],
                style,
                marker="o",
                ms=3,
                color=colour,
                label=label,
            )
            axes[1].plot(
                batches,
                [row["coverage"] for row in line],
                style,
                marker="o",
                ms=3,
                color=colour,
                label=label,
            )
    axes[1].axhline(0.95, color="grey", ls=":", lw=1)
    axes[0].set_ylabel("RMSE of the posterior mean")
    axes[1].set_ylabel("coverage of the 95% interval")
    for axis in axes:
        axis.set_xlabel("batch")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(
        f"Accumulate (ε per new batch) vs re-query (ε/Q on all data), ε = {rows[0]['epsilon']:g}",
        fontsize=10,
    )
    return fig.write_figure(figure, path)


# --- report figures of prevalence-counts and randomized-response ------------------------------
_METHODS = {
    "naive": "naive Beta (noise ignored)",
    "exact": "noise-aware (exact)",
    "plain": "non-private",
}


_STYLES = {"naive": ":", "exact": "-", "plain": "--"}


# --- prevalence-counts and randomized-response ----------------------------------------------------
def prevalence_figures(rows: fig.Rows, directory: Path) -> list[fig.Figure]:
    """Error, privacy error and coverage vs epsilon (x: ``privacy.epsilon``).

    Colour: the task (when ``task.name`` is swept) or the policy; panels: the first other swept
    setting (e.g. ``prevalence.records_per_peer``).
    """
    swept = fig.swept(rows)
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
    panels = fig.grouped(rows, [panel]) if panel else {(): list(rows)}
    lines = sorted({row[line_key] for row in rows}, key=fig.order)
    colours = dict(zip(lines, fig.colours(len(lines), stop=0.85), strict=True))
    level = rows[0].get("prevalence.level", 0.95)
    ticks = sorted({float(row[x]) for row in rows})
    figures = []

    figure, axes = fig.panels(len(panels))
    for axis, (value, members) in zip(axes[0], panels.items(), strict=True):
        for line in lines:
            points = fig.grouped([r for r in members if r[line_key] == line], [x])
            eps = [key[0] for key in points]
            for method in ("naive", "exact", "plain"):
                axis.plot(
                    eps,
                    [fig.mean(cells, f"error_{method}") for cells in points.values()],
                    ls=_STYLES[method],
                    marker="o",
                    ms=3,
                    color=colours[line],
                    label=f"{line}: {_METHODS[method]}",
                )
        fig.epsilon_axis(axis, panel, value, "|posterior mean - truth|", ticks)
    fig.legend_below(figure, axes)
    figure.suptitle("Posterior-mean error per peer, mean over peers and repetitions", fontsize=9)
    figures.append(
        (
            "Posterior-mean error vs epsilon",
            fig.save(figure, directory, "prevalence_error"),
            "Absolute error of each peer's posterior mean against the true prevalence, for the "
            "naive Beta (noisy count used as the true one), the noise-aware exact posterior and "
            "the non-private posterior of the same records (dashed: the sampling error floor).",
        )
    )

    figure, axes = fig.panels(len(panels))
    for axis, (value, members) in zip(axes[0], panels.items(), strict=True):
        for line in lines:
            points = fig.grouped([r for r in members if r[line_key] == line], [x])
            axis.plot(
                [key[0] for key in points],
                [fig.mean(cells, "privacy_error") for cells in points.values()],
                marker="o",
                color=colours[line],
                label=str(line),
            )
        fig.epsilon_axis(axis, panel, value, "|private - non-private posterior mean|", ticks)
    fig.legend_below(figure, axes)
    figure.suptitle("What privacy costs: distance to the non-private posterior mean", fontsize=9)
    figures.append(
        (
            "Privacy error vs epsilon",
            fig.save(figure, directory, "prevalence_privacy_error"),
            "Mean distance between the noise-aware posterior mean and the non-private one on the "
            "same records: the error the privacy mechanism adds (log-log; central Laplace "
            "counts ~ 1/(eps N), local randomized response ~ 1/(eps sqrt N)).",
        )
    )

    figure, axes = fig.panels(len(panels), rows=2)
    for column, (value, members) in enumerate(panels.items()):
        for line in lines:
            points = fig.grouped([r for r in members if r[line_key] == line], [x])
            eps = [key[0] for key in points]
            for method in ("naive", "exact", "plain"):
                style = dict(ls=_STYLES[method], marker="o", ms=3, color=colours[line])
                label = f"{line}: {_METHODS[method]}"
                coverage = np.array(
                    [fig.mean(cells, f"covered_{method}") for cells in points.values()]
                )
                low, high = fig.wilson_interval(coverage, [len(c) for c in points.values()])
                width = [fig.mean(cells, f"width_{method}") for cells in points.values()]
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
        fig.epsilon_axis(
            axes[0, column], panel, value, f"coverage of the {level:g} interval", ticks
        )
        axes[0, column].set_yscale("linear")
        axes[0, column].set_ylim(-0.02, 1.02)
        fig.epsilon_axis(axes[1, column], None, None, "interval width", ticks)
    fig.legend_below(figure, axes)
    figure.suptitle(
        "Do the credible intervals cover the truth? (black: nominal; bars: Wilson 95% interval "
        "over the repetitions)",
        fontsize=9,
    )
    figures.append(
        (
            "Credible-interval coverage vs epsilon",
            fig.save(figure, directory, "prevalence_coverage"),
            "Fraction of repetitions (and peers) whose credible interval contains the true "
            "prevalence, with a Wilson 95% interval that counts each repetition once (the "
            "peers of one repetition share releases), and the mean interval width. The naive "
            "interval ignores the noise.",
        )
    )
    return figures
