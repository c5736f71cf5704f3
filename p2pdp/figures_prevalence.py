"""Figures of prevalence and pooled testing, drawn from the rows of the maths modules.

Every function takes the list of row dicts produced by :mod:`p2pdp.pooling` or
:mod:`p2pdp.prevalence` (``epsilon_rows``, ``variance_ratio_rows``, ``privacy_utility_rows``,
``scaling_rows``, ``coverage_rows``, ``policy_rows``) and writes one PNG; no maths here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from p2pdp.results import write_figure

Rows = Sequence[dict[str, Any]]
_DPI = 110
_THREAT_MODEL = "adversary knows p, not the other members' statuses (not worst-case DP)"


def legend_below(figure: plt.Figure, axes: Any, *, ncols: int = 3, extra: Sequence = ()) -> None:
    """One legend under the panels (never over the data): every distinct label of ``axes``,
    then the ``extra`` handles (proxies for unlabelled marks such as dotted guide lines)."""
    entries: dict[str, Any] = {}
    for axis in np.ravel(axes):
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    for handle in extra:
        entries.setdefault(handle.get_label(), handle)
    figure.legend(
        entries.values(),
        entries.keys(),
        loc="outside lower center",
        ncols=max(1, min(ncols, len(entries))),
        fontsize=8,
    )


def integer_ticks(axis: plt.Axes, values: Sequence[int]) -> None:
    """x ticks at exactly ``values`` (pool sizes), as integers, on a log or linear axis."""
    axis.set_xticks(list(values), [str(int(v)) for v in values])
    axis.xaxis.set_minor_locator(NullLocator())


def _values(rows: Rows, key: str) -> list:
    return sorted({row[key] for row in rows})


def _select(rows: Rows, **match: Any) -> list[dict[str, Any]]:
    return [row for row in rows if all(row[key] == value for key, value in match.items())]


def _colours(count: int) -> list:
    return [plt.get_cmap("viridis")(x) for x in np.linspace(0.0, 0.9, max(count, 1))]


# --- pooled testing -----------------------------------------------------------------------------
def epsilon_figure(rows: Rows, path: str | Path) -> Path:
    """Epsilon vs prevalence per pool size, one panel per ``(Se, Sp)`` (``epsilon_rows``)."""
    accuracies = sorted({(row["sensitivity"], row["specificity"]) for row in rows})
    figure, axes = plt.subplots(
        1, len(accuracies), figsize=(5.2 * len(accuracies), 4.2), sharey=True, layout="constrained"
    )
    axes = np.atleast_1d(axes)
    for axis, (se, sp) in zip(axes, accuracies, strict=True):
        panel = _select(rows, sensitivity=se, specificity=sp)
        sizes = _values(panel, "pool_size")
        # drawn first, wide and pale: c = 1 (which equals it: no other members) stays visible
        axis.axhline(
            panel[0]["worst_case_epsilon"],
            color="grey",
            lw=4,
            alpha=0.4,
            zorder=1,
            label="worst case (others' statuses known)",
        )
        for colour, c in zip(_colours(len(sizes)), sizes, strict=True):
            line = sorted(_select(panel, pool_size=c), key=lambda row: row["prevalence"])
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
    legend_below(figure, axes, ncols=4, extra=[dotted])
    figure.suptitle(f"Privacy of pooling; {_THREAT_MODEL}", fontsize=9)
    return write_figure(figure, path, dpi=_DPI)


def variance_ratio_figure(rows: Rows, path: str | Path) -> Path:
    """Variance ratio vs pool size per prevalence, with ``p_max(c)`` (``variance_ratio_rows``).

    One column per ``hold``; top: ``sigma^2(p, c) / sigma^2(p, 1)`` (below 1: pooling wins);
    bottom: ``p_max(c)`` with each prevalence as a dotted line, so pooling wins where the
    dotted line lies under the curve.
    """
    holds = _values(rows, "hold")
    figure, axes = plt.subplots(
        2, len(holds), figsize=(5.2 * len(holds), 6.4), squeeze=False, layout="constrained"
    )
    for column, hold in enumerate(holds):
        panel = _select(rows, hold=hold)
        prevalences = _values(panel, "prevalence")
        top, bottom = axes[0, column], axes[1, column]
        for colour, p in zip(_colours(len(prevalences)), prevalences, strict=True):
            line = sorted(_select(panel, prevalence=p), key=lambda row: row["pool_size"])
            sizes = [row["pool_size"] for row in line]
            ratio = [row["variance_ratio"] for row in line]
            top.plot(sizes, ratio, marker="o", ms=3, color=colour, label=f"p = {p:g}")
            better = [c for c, row in zip(sizes, line, strict=True) if row["pooling_better"]]
            if better:
                top.plot(max(better), ratio[sizes.index(max(better))], "k|", ms=12, mew=2)
            bottom.axhline(p, color=colour, ls=":", lw=1)
            integer_ticks(top, sizes)
        pooled = sorted(
            {(row["pool_size"], row["max_prevalence"]) for row in panel if row["pool_size"] > 1}
        )
        bottom.plot(*zip(*pooled, strict=True), color="black", marker="o", ms=3, label="p_max(c)")
        integer_ticks(bottom, [c for c, _ in pooled])
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
    legend_below(figure, axes, ncols=3, extra=extra)
    se, sp = rows[0]["sensitivity"], rows[0]["specificity"]
    figure.suptitle(
        f"Variance of the pooled MLE relative to individual testing (Se = {se:g}, Sp = {sp:g})",
        fontsize=10,
    )
    return write_figure(figure, path, dpi=_DPI)


def privacy_utility_figure(rows: Rows, path: str | Path) -> Path:
    """Epsilon vs RMSE of ``p_hat`` per pool size, along randomized-response strength.

    Uses the simulated ``mse`` when present, else the asymptotic variance; the dashed curve
    joins the ``keep_probability = 1`` (no randomized response) points across ``c``.
    """
    figure, axis = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    sizes = _values(rows, "pool_size")
    key = "mse" if "mse" in rows[0] else "asymptotic_variance"
    plain = []
    for colour, c in zip(_colours(len(sizes)), sizes, strict=True):
        line = sorted(_select(rows, pool_size=c), key=lambda row: -row["keep_probability"])
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
    return write_figure(figure, path, dpi=_DPI)


# --- noisy counts and randomized response ---------------------------------------------------------
def scaling_figure(rows: Rows, path: str | Path) -> Path:
    """RMSE vs records per group: central (Laplace count) vs local (RR) (``scaling_rows``)."""
    figure, axes = plt.subplots(1, 2, figsize=(10.4, 4.2), layout="constrained")
    epsilons = [e for e in _values([r for r in rows if r["model"] != "non-private"], "epsilon")]
    styles = {"central": "-", "local": "--"}
    for colour, eps in zip(_colours(len(epsilons)), epsilons, strict=True):
        for model, style in styles.items():
            line = sorted(_select(rows, model=model, epsilon=eps), key=lambda row: row["n"])
            n = [row["n"] for row in line]
            label = f"{model}, ε = {eps:g}"
            axes[0].plot(
                n, [row["rmse"] for row in line], style, marker="o", ms=3, color=colour, label=label
            )
            axes[1].plot(
                n, [row["predicted_privacy_rmse"] for row in line], style, color=colour, label=label
            )
            axes[1].plot(n, [row["privacy_rmse"] for row in line], "o", ms=3, color=colour)
    reference = sorted(_select(rows, model="non-private"), key=lambda row: row["n"])
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
    return write_figure(figure, path, dpi=_DPI)


def coverage_figure(rows: Rows, path: str | Path) -> Path:
    """Coverage and width of 95% credible intervals vs epsilon per method (``coverage_rows``)."""
    figure, axes = plt.subplots(1, 2, figsize=(10.4, 4.2), layout="constrained")
    methods = [m for m in ("naive", "widened", "exact") if _select(rows, method=m)]
    for colour, method in zip(_colours(len(methods)), methods, strict=True):
        line = sorted(_select(rows, method=method), key=lambda row: row["epsilon"])
        eps = [row["epsilon"] for row in line]
        axes[0].plot(eps, [row["coverage"] for row in line], marker="o", color=colour, label=method)
        axes[1].plot(
            eps, [row["mean_width"] for row in line], marker="o", color=colour, label=method
        )
    reference = _select(rows, method="non-private")
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
    return write_figure(figure, path, dpi=_DPI)


def policy_figure(rows: Rows, path: str | Path) -> Path:
    """RMSE and coverage after each batch for the seed's two policies (``policy_rows``)."""
    figure, axes = plt.subplots(1, 2, figsize=(10.4, 4.2), layout="constrained")
    styles = {"naive": "--", "exact": "-"}
    colours = dict(zip(("accumulate", "requery"), _colours(2), strict=True))
    for policy, colour in colours.items():
        for method, style in styles.items():
            line = sorted(_select(rows, policy=policy, method=method), key=lambda r: r["batch"])
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
    return write_figure(figure, path, dpi=_DPI)
