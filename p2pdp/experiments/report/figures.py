"""The report's figures of a classification task (:mod:`p2pdp.experiments.report.write`).

Every accuracy figure shows the mean test error of the peers' ensembles (fraction of
misclassified test rows, averaged over peers, folds and repetitions) with a band of +/- one
standard deviation over peers and folds, plus two reference lines: the centralized
non-private model (all training rows pooled) and the local-only models (each peer alone, no
aggregation, no noise), and, when the results carry it (``evaluation.best_lambda_reference``), the
centralized model at its own cross-validated λ. A figure whose x axis was not swept is skipped,
and report.md says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LogNorm, Normalize
from matplotlib.ticker import NullFormatter

from p2pdp.core.figures import write_figure
from p2pdp.experiments.report.summary import (
    PointSummary,
    _by,
    _independent,
    _order,
    _split,
)
from p2pdp.experiments.results.files import ROC_FPR

#: Axis labels with units, and short names for legends and tables.
_LABELS = {
    "groups.group_size": ("group size g (peers per aggregation)", "g"),
    "privacy.epsilon": ("privacy budget ε per peer (total)", "ε"),
    "privacy.epsilon_per_aggregation": ("ε per aggregation", "ε per aggregation"),
    "partition.n_peers": ("number of peers P", "P"),
    "training.lambda": ("regularisation λ", "λ"),
    "publication.mode": ("publication", "publication"),
    "network.loss": ("message loss probability", "loss"),
    "groups.sampler": ("group sampler", "sampler"),
    "evaluation.vote": ("ensemble rule", "rule"),
    "privacy.mechanism": ("mechanism", "mechanism"),
    "protocol.name": ("protocol", "protocol"),
}


#: A numeric line key with more values than this is drawn as a colour scale with a colour bar.
MAX_LEGEND_LINES = 6


_LINESTYLES = ("-", "--", "-.", ":")


_MARKERS = ("o", "s", "^", "D", "v", "P")


_ERROR_LABEL = "test error (fraction misclassified)"


#: (file stem, title, x axis, panel axis): one accuracy figure each, drawn if x is swept.
_ERROR_FIGURES = (
    ("error_vs_group_size", "Error vs group size", "groups.group_size", "privacy.epsilon"),
    ("error_vs_epsilon", "Error vs privacy budget", "privacy.epsilon", "groups.group_size"),
    ("error_vs_peers", "Error vs number of peers", "partition.n_peers", "privacy.epsilon"),
    ("error_vs_lambda", "Error vs regularisation", "training.lambda", "privacy.epsilon"),
)


def _figure_specs(
    summaries: Sequence[PointSummary],
    swept: Sequence[str],
    no_scores: str | None,
    protocol_specs: Sequence[tuple],
) -> list[tuple]:
    """The report's figures of a classification task, in order: ``(file stem, title, why
    skipped or None, draw(path), caption)``; ``no_scores`` skips those drawn from the error
    columns (rows nobody scored), ``protocol_specs`` are the protocol comparisons'."""
    peers = "partition.n_peers"
    return [  # (file stem, title, why skipped or None, draw(path), caption)
        *(
            (
                stem,
                title,
                no_scores or _error_figure_skipped(x, swept),
                partial(_error_figure, summaries, swept, x, panel),
                _caption(summaries, swept, x, panel),
            )
            for stem, title, x, panel in _ERROR_FIGURES
        ),
        (
            "cost_vs_peers",
            "Cost vs number of peers",
            None if peers in swept else f"`{peers}` is not swept",
            partial(_cost_figure, summaries, swept),
            "Messages sent per peer, and wall-clock seconds per cell (simulation and "
            "evaluation, one core).",
        ),
        (
            "error_vs_loss",
            "Aggregations and error vs message loss",
            no_scores or (None if "network.loss" in swept else "`network.loss` is not swept"),
            partial(_loss_figure, summaries, swept),
            "Left: aggregations completed per run; right: mean test error of the peers' "
            "ensembles (band: +/- one standard deviation over peers and folds; dashed: "
            "centralized non-private model; dotted: local-only models), against the probability "
            "that a message is lost.",
        ),
        (
            "roc_best_peer",
            "ROC of the best peer",
            no_scores
            or (
                None
                if all(s.roc_tpr is not None for s in summaries)
                else "no roc.csv for every cell"
            ),
            partial(_roc_figure, summaries, swept),
            "For each publication mode, the grid point with the lowest mean error; the best "
            "peer's ROC averaged over folds.",
        ),
        *protocol_specs,
    ]


def _draw_figures(directory: Path, specs: Sequence[tuple]) -> list[tuple[str, str, str]]:
    """Draw each figure of ``specs`` (:func:`_figure_specs`) not skipped into ``directory``:
    ``(title, file or "", caption or why skipped)`` per figure, in order."""
    figures = []  # (title, file or "", caption or why skipped)
    for stem, title, skipped, draw, caption in specs:
        path = directory / f"{stem}.png"
        if skipped:
            figures.append((title, "", skipped))
        else:
            draw(path)
            figures.append((title, path.name, caption))

    return figures


#: Why the report draws no figure from the error columns of rows nobody scored.
NO_SCORES = "the rows hold no test-set scores (see Not scored)"


def _error_figure_skipped(x: str, swept: Sequence[str]) -> str | None:
    """Why an error figure with x axis ``x`` is not drawn, or None."""
    if x not in swept:
        return f"`{x}` is not swept"
    if "protocol.name" in swept:  # every protocol's every tuning would be a line
        return "`protocol.name` is swept: see the protocols compared at their tuned settings"
    return None


def _axis_label(key: str) -> str:
    return _LABELS.get(key, (key, key))[0]


def _short(key: str) -> str:
    return _LABELS.get(key, (key, key.rpartition(".")[2]))[1]


def _label(key: str, value: Any) -> str:
    """Legend text for one setting, e.g. ``g = 5`` or ``full publication``."""
    if key == "publication.mode":
        return f"{value} publication"
    if key == "privacy.secure_aggregation":
        return f"secure aggregation {'on' if value else 'off'}"
    return f"{_short(key)} = {_number(value)}"


def _name(keys: Sequence[str], values: Sequence[Any]) -> str:
    """Legend text for several settings; a setting the cells did not read (empty) is left out."""
    return ", ".join(_label(k, v) for k, v in zip(keys, values, strict=True) if v is not None)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _panels(count: int, *, sharey: bool = True) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of ``count`` panels, at most 3 wide (2 for 4); the slots a last row leaves
    empty are removed (:func:`_legend` puts the legend in the first of them)."""
    columns = count if count <= 3 else 2 if count == 4 else 3
    rows = -(-count // columns)
    figure, axes = plt.subplots(
        rows,
        columns,
        figsize=(4.6 * columns, 3.4 * rows + 0.8),
        sharey=sharey,
        squeeze=False,
        layout="constrained",
    )
    for extra in axes.flat[count:]:
        figure.delaxes(extra)
    return figure, list(axes.flat[:count])


def _x_axis(axis: plt.Axes, key: str, values: Sequence[float]) -> None:
    """Label the x axis; log scale for positive values spanning >= 20x; ticks at the values."""
    values = sorted(set(values))
    if min(values) > 0 and max(values) / min(values) >= 20:
        axis.set_xscale("log")
        axis.xaxis.set_minor_formatter(NullFormatter())
    if len(values) <= 10:
        axis.set_xticks(values, [_number(v) for v in values])
    axis.set_xlabel(_axis_label(key))


def _legend(figure: plt.Figure, axes: Sequence[plt.Axes]) -> None:
    """One legend with every distinct label: in the panel grid's first empty slot if it has
    one, else below the panels (2 columns under one panel)."""
    entries: dict[str, Any] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    specs = [spec for axis in axes if (spec := axis.get_subplotspec()) is not None]
    if len(specs) > 1:
        grid = specs[0].get_gridspec()
        used = sum(1 for spec in specs if spec.rowspan.start == grid.nrows - 1)
        free = grid.ncols - used if grid.nrows > 1 else 0
        if free:
            holder = figure.add_subplot(grid[grid.nrows - 1, used:])
            holder.axis("off")
            holder.legend(entries.values(), entries.keys(), loc="center", ncols=1 + (free > 1))
            return
    columns = 2 if len(axes) == 1 else 4
    width_columns = max(1, int(figure.get_figwidth() // 3.6))  # legend stays within the figure
    figure.legend(
        entries.values(),
        entries.keys(),
        loc="outside lower center",
        ncols=max(1, min(len(entries), columns, width_columns)),
    )


def _colour_scale(
    summaries: Sequence[PointSummary], lines: Sequence[str]
) -> tuple[str, Normalize] | None:
    """(key, norm) of the numeric line key to draw as a colour scale, or None.

    A numeric key with more than :data:`MAX_LEGEND_LINES` values, or with more than 3 when
    all lines together are more than that.
    """
    many = len(_by(summaries, lines)) > MAX_LEGEND_LINES
    for key in lines:
        values = {s.settings[key] for s in summaries}
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and (len(values) > MAX_LEGEND_LINES or (many and len(values) > 3)):
            low, high = min(values), max(values)
            log = low > 0 and high / low >= 20
            return key, LogNorm(low, high) if log else Normalize(low, high)
    return None


def _line_styles(summaries: Sequence[PointSummary], lines: Sequence[str]) -> tuple[list[str], Any]:
    """Legend keys and a function ``style(line_value) -> plot kwargs``.

    Few lines: default colour cycle, every line key in the legend. Many values of a numeric
    key: that key is a colour scale (with a colour bar) and the other keys get line styles.
    """
    scale = _colour_scale(summaries, lines)
    if scale is None:  # lines that coincide (group = full publication at g = P) stay visible:
        # each line its own dash pattern and marker, later ones hollow and larger
        values = sorted(_by(summaries, lines), key=lambda v: tuple(map(_order, v)))

        def distinct(value: tuple) -> dict[str, Any]:
            i = values.index(value)
            return {
                "linestyle": _LINESTYLES[i % 3],
                "marker": _MARKERS[i % len(_MARKERS)],
                "markersize": 5 + 2 * min(i, 2),
                "markerfacecolor": "none" if i else None,
            }

        return list(lines), distinct
    key, norm = scale
    index = lines.index(key)
    others = [k for k in lines if k != key]
    combos = sorted(
        {
            tuple(v for k, v in zip(lines, value, strict=True) if k != key)
            for value in _by(summaries, lines)
        },
        key=lambda c: tuple(map(_order, c)),
    )
    cmap = plt.get_cmap("viridis")

    def style(value: tuple) -> dict[str, Any]:
        rest = tuple(v for i, v in enumerate(value) if i != index)
        return {
            "color": cmap(norm(value[index])),
            "linestyle": _LINESTYLES[combos.index(rest) % len(_LINESTYLES)],
            "markersize": 3,
        }

    return others, style


def _colour_bar(figure: plt.Figure, axes: Sequence[plt.Axes], scale: tuple[str, Normalize] | None):
    if scale is not None:
        key, norm = scale
        mappable = ScalarMappable(norm=norm, cmap=plt.get_cmap("viridis"))
        figure.colorbar(mappable, ax=list(axes), label=_axis_label(key), shrink=0.9)


def _error_layout(
    summaries: Sequence[PointSummary], swept: Sequence[str], x: str, panel: str | None
) -> tuple[str | None, list[str], tuple[str, Normalize] | None]:
    """Panel key, line keys and colour scale of an error figure."""
    panel, lines = _split(summaries, swept, x, panel)
    if panel is None and len(lines) > 1 and len(_by(summaries, lines)) > MAX_LEGEND_LINES:
        # too many lines for one panel: one panel per value of the line key with fewest values
        panel = min(lines, key=lambda k: len({s.settings[k] for s in summaries}))
        lines = [k for k in lines if k != panel]
    return panel, lines, _colour_scale(summaries, lines)


def _error_figure(
    summaries: Sequence[PointSummary], swept: Sequence[str], x: str, panel: str | None, path: Path
) -> None:
    panel, lines, scale = _error_layout(summaries, swept, x, panel)
    panels = _by(summaries, [panel] if panel else [])
    shown, style = _line_styles(summaries, lines)
    figure, axes = _panels(len(panels))
    top = 0.0
    for axis, (panel_value, members) in zip(axes, panels.items(), strict=True):
        alpha = 0.15 if len(_by(members, lines)) <= 3 else 0.07  # many bands: lighter
        for line_value, points in _by(members, lines).items():
            points = sorted(points, key=lambda s: s.settings[x])
            xs = np.array([s.settings[x] for s in points], dtype=float)
            mean = np.array([s.mean_error for s in points])
            std = np.array([s.std_error for s in points])
            name = _name(shown, [line_value[lines.index(k)] for k in shown])
            label = name or ("_nolegend_" if scale else "mean error")
            (drawn,) = axis.plot(xs, mean, label=label, **{"marker": "o", **style(line_value)})
            top = max(top, float(np.max(mean + (0 if scale else std))))
            if scale is None:  # bands only while the lines are few enough to tell apart
                axis.fill_between(xs, mean - std, mean + std, color=drawn.get_color(), alpha=alpha)
        _references(axis, members, x, lines)
        _x_axis(axis, x, [s.settings[x] for s in members])
        axis.set_title(_label(panel, panel_value[0]) if panel else "")
        axis.grid(alpha=0.3)
    for axis in axes:  # shared y: one limit that shows every band (errors are <= 1)
        highest = max([top, *(float(np.max(line.get_ydata())) for line in axis.get_lines())])
        axis.set_ylim(0, min(1.0, 1.05 * highest))
        if (spec := axis.get_subplotspec()) is not None and spec.is_first_col():
            axis.set_ylabel(_ERROR_LABEL)
    _colour_bar(figure, axes, scale)
    _legend(figure, axes)
    write_figure(figure, path)


def _references(
    axis: plt.Axes, members: Sequence[PointSummary], x: str, lines: Sequence[str] = ()
) -> None:
    """Centralized non-private and local-only errors at each x (flat when x is not P or λ).

    They are averaged over the lines at each x; when a line setting changes them (λ, P), the
    legend says so ("mean over λ"). With ``evaluation.best_lambda_reference`` also the
    centralized model at its own cross-validated λ (the real ceiling).
    """
    xs = sorted({s.settings[x] for s in members})
    for attribute, style, name in (
        ("centralized_error", "k--", "centralized, non-private"),
        ("centralized_best_lambda_error", "k-.", "centralized, non-private, own best λ"),
        ("local_only_error", "k:", "local only, no aggregation"),
    ):
        if any(math.isnan(getattr(s, attribute)) for s in members):
            continue
        values = [
            np.mean([getattr(s, attribute) for s in members if s.settings[x] == value])
            for value in xs
        ]
        varying = [
            key
            for key in lines
            if any(
                np.ptp([getattr(s, attribute) for s in members if s.settings[x] == value]) > 1e-9
                and len({s.settings[key] for s in members if s.settings[x] == value}) > 1
                for value in xs
            )
        ]
        if varying:
            name += f" (mean over {', '.join(_short(k) for k in varying)})"
        axis.plot(xs, values, style, linewidth=1.2, label=name)


def _cost_figure(summaries: Sequence[PointSummary], swept: Sequence[str], path: Path) -> None:
    """Messages per peer and wall time vs P; lines with equal message counts are merged.

    Settings that do not change the protocol's messages (epsilon at a fixed number of
    aggregations per peer, say) would draw lines exactly on top of each other: such lines are
    drawn once, labelled with every merged value, and their wall times averaged.
    """
    x = "partition.n_peers"
    _, lines = _split(summaries, swept, x, None)
    merged: dict[tuple, list[tuple[tuple, list[PointSummary]]]] = {}
    for line_value, points in _by(summaries, lines).items():
        points = sorted(points, key=lambda s: s.settings[x])
        signature = tuple((s.settings[x], round(s.messages_per_peer, 9)) for s in points)
        merged.setdefault(signature, []).append((line_value, points))
    figure, axes = _panels(2, sharey=False)
    for group in merged.values():
        points = group[0][1]
        xs = [s.settings[x] for s in points]
        name = _merged_label(lines, [value for value, _ in group]) or "all"
        walls = np.mean([[s.wall_cell_s for s in member] for _, member in group], axis=0)
        axes[0].plot(xs, [s.messages_per_peer for s in points], marker="o", label=name)
        axes[1].plot(xs, walls, marker="o", label=name)
    for axis, title in zip(
        axes, ("messages sent per peer", "wall time per cell (s, one core)"), strict=True
    ):
        _x_axis(axis, x, [s.settings[x] for s in summaries])
        axis.set_title(title)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    _legend(figure, axes)
    write_figure(figure, path)


def _merged_label(keys: Sequence[str], values: Sequence[tuple]) -> str:
    """``"group publication, ε = 1, 10"``: keys whose value is shared once, the rest listed."""
    parts = []
    for i, key in enumerate(keys):
        distinct = sorted({v[i] for v in values}, key=_order)
        if distinct == [None]:
            continue  # not read by these cells
        if len(distinct) == 1:
            parts.append(_label(key, distinct[0]))
        else:
            parts.append(f"{_short(key)} = " + ", ".join(_number(v) for v in distinct))
    several = any(len({v[i] for v in values}) > 1 for i in range(len(keys)))
    return ("; " if several else ", ").join(parts)


def _loss_figure(summaries: Sequence[PointSummary], swept: Sequence[str], path: Path) -> None:
    """Aggregations completed and mean error vs ``network.loss``, one line per other setting."""
    x = "network.loss"
    _, lines = _split(summaries, swept, x, None)
    figure, axes = _panels(2, sharey=False)
    for line_value, points in _by(summaries, lines).items():
        points = sorted(points, key=lambda s: s.settings[x])
        xs = np.array([s.settings[x] for s in points], dtype=float)
        name = _name(lines, line_value) or "all"
        axes[0].plot(xs, [s.aggregations for s in points], marker="o", label=name)
        mean = np.array([s.mean_error for s in points])
        std = np.array([s.std_error for s in points])
        (drawn,) = axes[1].plot(xs, mean, marker="o", label=name)
        axes[1].fill_between(xs, mean - std, mean + std, color=drawn.get_color(), alpha=0.15)
    _references(axes[1], summaries, x)
    for axis, label in zip(axes, ("aggregations completed per run", _ERROR_LABEL), strict=True):
        _x_axis(axis, x, [s.settings[x] for s in summaries])
        axis.set_ylabel(label)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    _legend(figure, axes)
    write_figure(figure, path)


def _roc_figure(summaries: Sequence[PointSummary], swept: Sequence[str], path: Path) -> None:
    modes = ["publication.mode"] if "publication.mode" in swept else []
    curves = [
        min(members, key=lambda s: s.mean_error) for members in _by(summaries, modes).values()
    ]
    # a curve is named by the settings that tell the curves drawn apart: those with several
    # values among the curves that read them (a setting a curve's cells did not read is empty)
    shown = [
        k for k in swept if k not in modes and len({s.settings[k] for s in curves} - {None}) > 1
    ]
    figure, axis = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    for best in curves:
        assert best.roc_tpr is not None
        name = _name(modes + shown, [best.settings[k] for k in modes + shown])
        if not name:  # one curve: say which grid point it is
            keys = _independent(swept, summaries, [])  # tied settings (delta_A) once
            name = "best: " + _name(keys, [best.settings[k] for k in keys]) if keys else ""
        axis.plot(ROC_FPR, best.roc_tpr, label=f"{name or 'all cells'} (AUC {best.auc:.3f})")
    axis.plot([0, 1], [0, 1], color="grey", linestyle=":", label="chance")
    axis.set_xlabel("false positive rate")
    axis.set_ylabel("true positive rate")
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1.01)
    axis.set_title("ROC of the best peer (mean over folds)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small", loc="lower right")
    write_figure(figure, path)


def _caption(
    summaries: Sequence[PointSummary], swept: Sequence[str], x: str, panel: str | None
) -> str:
    if x not in swept:
        return ""
    panel, _, scale = _error_layout(summaries, swept, x, panel)
    per_panel = f" One panel per {_axis_label(panel)}." if panel else ""
    spread = (
        f" Colour: {_axis_label(scale[0])} (colour bar); no bands, to keep the lines apart."
        if scale
        else "; band: +/- one standard deviation over peers and folds."
    )
    return (
        f"Mean test error of the peers' ensembles vs {_axis_label(x)}{spread.rstrip('.')}"
        f". Dashed: centralized non-private model; dotted: local-only models.{per_panel}"
    )
