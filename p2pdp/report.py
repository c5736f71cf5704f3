"""Figures and ``report.md`` from a results folder (``p2pdp report DIR``).

Every accuracy figure shows the mean test error of the peers' ensembles (fraction of
misclassified test rows, averaged over peers, folds and repetitions) with a band of +/- one
standard deviation over peers and folds, plus two reference lines: the centralized
non-private model (all training rows pooled) and the local-only models (each peer alone, no
aggregation, no noise), and, when the results carry it (``evaluation.best_lambda_reference``), the
centralized model at its own cross-validated λ. A figure whose x axis was not swept is skipped,
and report.md says so.

Swept settings are found from the results themselves (columns with more than one value), so
a report needs only ``results.csv`` (``roc.csv`` and ``manifest.json`` add the ROC figure and
the run's provenance).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from p2pdp.errors import ConfigError
from p2pdp.results import (
    MANIFEST_FILE,
    RESULTS_FILE,
    ROC_FPR,
    FolderLock,
    read_manifest,
    read_results,
    read_roc,
    repair,
    write_atomic,
)

REPORT_FILE = "report.md"

#: Axis labels with units, and short names for legends and tables.
_LABELS = {
    "groups.group_size": ("group size g (peers per aggregation)", "g"),
    "privacy.epsilon": ("privacy budget ε per peer (total)", "ε"),
    "privacy.epsilon_per_aggregation": ("ε per aggregation", "ε per aggregation"),
    "partition.n_peers": ("number of peers P", "P"),
    "training.lam": ("regularisation λ", "λ"),
    "publication.mode": ("publication", "publication"),
    "evaluation.vote": ("ensemble rule", "rule"),
    "privacy.mechanism": ("mechanism", "mechanism"),
}
_ERROR_LABEL = "test error (fraction misclassified)"
#: Settings that name figure lines first when several swept settings are tied together.
_LINE_KEYS = ("privacy.mechanism", "evaluation.vote", "publication.mode")
#: (file stem, title, x axis, panel axis): one accuracy figure each, drawn if x is swept.
_ERROR_FIGURES = (
    ("error_vs_group_size", "Error vs group size", "groups.group_size", "privacy.epsilon"),
    ("error_vs_epsilon", "Error vs privacy budget", "privacy.epsilon", "groups.group_size"),
    ("error_vs_peers", "Error vs number of peers", "partition.n_peers", "privacy.epsilon"),
    ("error_vs_lambda", "Error vs regularisation", "training.lam", "privacy.epsilon"),
)
_FIXED_SHOWN = (
    "data.dataset",
    "data.transform",
    "partition.n_peers",
    "partition.scheme",
    "training.lam",
    "privacy.epsilon",
    "privacy.epsilon_per_aggregation",
    "privacy.mechanism",
    "privacy.sensitivity",
    "groups.sampler",
    "groups.group_size",
    "publication.mode",
    "evaluation.split",
    "evaluation.vote",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PointSummary:
    """One grid point, pooled over its cells (folds x repetitions).

    Errors are fractions in [0, 1]; ``std_error`` is the standard deviation of the per-peer
    errors pooled over peers and cells; ``roc_tpr`` is the best peer's TPR at
    :data:`p2pdp.results.ROC_FPR`, averaged over cells (None without ``roc.csv``).
    """

    settings: dict[str, Any]
    cells: int
    mean_error: float
    std_error: float
    best_peer_error: float
    auc: float
    aggregations: float
    centralized_error: float
    local_only_error: float
    centralized_best_lambda_error: float
    messages_per_peer: float
    wall_cell_s: float
    roc_tpr: np.ndarray | None


#: Columns of results.csv the report reads (a file without them is refused).
REQUIRED_COLUMNS = (
    "cell_id",
    "name",
    "mean_error",
    "std_error",
    "min_error",
    "best_peer_auc",
    "aggregations",
    "centralized_error",
    "local_only_error",
    "messages_sent",
    "partition.n_peers",
)


_CLASSIFICATION = frozenset(
    (
        "mean_error",
        "std_error",
        "min_error",
        "best_peer_auc",
        "centralized_error",
        "local_only_error",
    )
)


def write_report(directory: str | Path) -> Path:
    """Write the figures (PNG) and ``report.md`` into ``directory``; return report.md's path.

    Runs under the folder's lock (refused while a run writes the folder), after
    :func:`p2pdp.results.repair` (which drops a line cut short by a crash, as ``--resume``
    does). Every file is written atomically: a crash leaves the old file or the new one.

    Raises
    ------
    ConfigError
        If ``directory`` is not a results folder, cannot be written, is in use, or its files
        are damaged (the message names the file).
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} is a file, not a results folder")
    if not (directory / RESULTS_FILE).exists():
        raise ConfigError(
            f"{directory / RESULTS_FILE} not found: run `p2pdp run` with --out {directory} first"
        )
    with FolderLock(directory, purpose="p2pdp report"):
        repair(directory)
        _check_results(directory)
        return _write_report(directory)


def _check_results(directory: Path) -> None:
    """Raise ConfigError unless results.csv has the columns and numbers the report reads."""
    path = directory / RESULTS_FILE
    rows = read_results(directory)
    if not rows:
        return
    # The logistic task's rows (and rows written before tasks existed) carry classification
    # metrics; another task's rows carry the engine's columns and its own.
    required = [
        column
        for column in REQUIRED_COLUMNS
        if rows[0].get("task.name", "logistic") == "logistic" or column not in _CLASSIFICATION
    ]
    missing = [column for column in required if column not in rows[0]]
    if missing:
        raise ConfigError(f"{path} lacks the columns {missing}: damaged, or not from p2pdp run")
    for number, row in enumerate(rows, start=2):
        for column in required[2:]:
            if isinstance(_parse(row[column]), str):
                raise ConfigError(
                    f"{path}, line {number}: {column} = {row[column]!r} is not a number"
                )


def _write_report(directory: Path) -> Path:
    rows = [{key: _parse(value) for key, value in row.items()} for row in read_results(directory)]
    if not rows:
        raise ConfigError(f"{directory / RESULTS_FILE} has no rows")
    manifest = read_manifest(directory) if (directory / MANIFEST_FILE).exists() else {}
    settings = [c for c in rows[0] if c in ("name", "seed") or "." in c]
    swept = [c for c in settings if len({row[c] for row in rows}) > 1]
    if "mean_error" not in rows[0]:  # a task that does not classify: its own columns, no figures
        report = directory / REPORT_FILE
        report.write_text(_task_markdown(rows, manifest, settings, swept), "utf-8")
        return report
    summaries = _summarise(rows, swept, read_roc(directory))

    peers = "partition.n_peers"
    specs = [  # (file stem, title, why skipped or None, draw(path), caption)
        *(
            (
                stem,
                title,
                None if x in swept else f"`{x}` is not swept",
                partial(_error_figure, summaries, swept, x, panel),
                _caption(x, panel, swept),
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
            "roc_best_peer",
            "ROC of the best peer",
            None if all(s.roc_tpr is not None for s in summaries) else "no roc.csv for every cell",
            partial(_roc_figure, summaries, swept),
            "For each publication mode, the grid point with the lowest mean error; the best "
            "peer's ROC averaged over folds.",
        ),
    ]
    figures = []  # (title, file or "", caption or why skipped)
    for stem, title, skipped, draw, caption in specs:
        path = directory / f"{stem}.png"
        path.unlink(missing_ok=True)  # no stale figure from an earlier report
        if skipped:
            figures.append((title, "", skipped))
        else:
            draw(path)
            figures.append((title, path.name, caption))

    report = directory / REPORT_FILE
    write_atomic(report, _markdown(rows, manifest, settings, swept, summaries, figures))
    return report


def _task_markdown(
    rows: Sequence[dict[str, Any]],
    manifest: dict[str, Any],
    settings: Sequence[str],
    swept: Sequence[str],
) -> str:
    """report.md for a task without classification errors: every numeric column per point."""
    skip = {"point", "fold", "repetition", *settings}
    metrics = [
        c
        for c in rows[0]
        if c not in skip
        and not c.startswith("wall_")
        and all(isinstance(row[c], (int, float)) and not isinstance(row[c], bool) for row in rows)
    ]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[c] for c in swept), []).append(row)
    lines = [
        f"# {manifest.get('scenario', rows[0].get('name', 'results'))}",
        "",
        f"Task `{rows[0].get('task.name')}`: {len(rows)} cells; means over folds and "
        "repetitions. No figures: the accuracy figures need a classification task.",
        "",
        "| " + " | ".join([*swept, "cells", *metrics]) + " |",
        "|" + "---|" * (len(swept) + 1 + len(metrics)),
    ]
    for key, cells in groups.items():
        values = [_number(_column_mean(cells, c)) for c in metrics]
        lines.append("| " + " | ".join([*map(str, key), str(len(cells)), *values]) + " |")
    return "\n".join(lines) + "\n"


# --- data -------------------------------------------------------------------------------------
def _parse(text: str) -> Any:
    """A CSV cell back to int, float, bool, None or str."""
    if text in ("True", "False"):
        return text == "True"
    if text in ("", "None"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def _summarise(
    rows: Sequence[dict[str, Any]], swept: Sequence[str], roc: dict[str, np.ndarray]
) -> list[PointSummary]:
    """One summary per distinct combination of swept values, in order of first appearance."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[c] for c in swept), []).append(row)
    summaries = []
    for key, cells in groups.items():
        mean = partial(_column_mean, cells)
        means = np.array([row["mean_error"] for row in cells])
        stds = np.array([row["std_error"] for row in cells])
        curves = [roc.get(str(row.get("cell_id"))) for row in cells]
        summaries.append(
            PointSummary(
                settings=dict(zip(swept, key, strict=True)),
                cells=len(cells),
                mean_error=float(means.mean()),
                std_error=math.sqrt(max(float(np.mean(stds**2 + means**2) - means.mean() ** 2), 0)),
                best_peer_error=mean("min_error"),
                auc=mean("best_peer_auc"),
                aggregations=mean("aggregations"),
                centralized_error=mean("centralized_error"),
                local_only_error=mean("local_only_error"),
                centralized_best_lambda_error=_optional_mean(
                    cells, "centralized_best_lambda_error"
                ),
                messages_per_peer=float(
                    np.mean([row["messages_sent"] / row["partition.n_peers"] for row in cells])
                ),
                wall_cell_s=mean("wall_cell_s") if "wall_cell_s" in cells[0] else math.nan,
                roc_tpr=None if any(c is None for c in curves) else np.mean(curves, axis=0),
            )
        )
    return summaries


def _column_mean(cells: Sequence[dict[str, Any]], column: str) -> float:
    return float(np.mean([row[column] for row in cells]))


def _optional_mean(cells: Sequence[dict[str, Any]], column: str) -> float:
    """Mean of a column some rows may lack (NaN if any cell lacks it)."""
    values = [row.get(column) for row in cells]
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values):
        return math.nan
    return float(np.mean(values))


def _tied(a: str, b: str, summaries: Sequence[PointSummary]) -> bool:
    """True when settings ``a`` and ``b`` determine each other (a zipped sweep axis)."""
    pairs = {(s.settings[a], s.settings[b]) for s in summaries}
    return len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def _split(
    summaries: Sequence[PointSummary], swept: Sequence[str], x: str, panel: str | None
) -> tuple[str | None, list[str]]:
    """The panel key (if swept and not tied to x) and the line keys of a figure."""
    if panel not in swept or panel == x or _tied(x, panel, summaries):
        panel = None
    # name lines by the settings a reader compares (rule, mechanism) before tied ones (delta)
    ordered = sorted(
        swept, key=lambda k: _LINE_KEYS.index(k) if k in _LINE_KEYS else len(_LINE_KEYS)
    )
    return panel, _independent(ordered, summaries, [k for k in (x, panel) if k is not None])


def _independent(
    keys: Sequence[str], summaries: Sequence[PointSummary], given: Sequence[str]
) -> list[str]:
    """``keys`` minus ``given`` and minus keys tied to ``given`` or to an earlier kept key."""
    kept: list[str] = []
    for key in keys:
        if key not in given and not any(_tied(key, k, summaries) for k in [*given, *kept]):
            kept.append(key)
    return kept


def _by(summaries: Sequence[PointSummary], keys: Sequence[str]) -> dict[tuple, list[PointSummary]]:
    groups: dict[tuple, list[PointSummary]] = {}
    for s in summaries:
        groups.setdefault(tuple(s.settings[k] for k in keys), []).append(s)
    return dict(sorted(groups.items(), key=lambda item: tuple(map(_order, item[0]))))


def _order(value: Any) -> tuple[int, Any]:
    """Sort key: numbers numerically, before anything else (as text)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


# --- figures ----------------------------------------------------------------------------------
def _axis_label(key: str) -> str:
    return _LABELS.get(key, (key, key))[0]


def _short(key: str) -> str:
    return _LABELS.get(key, (key, key.rpartition(".")[2]))[1]


def _label(key: str, value: Any) -> str:
    """Legend text for one setting, e.g. ``g = 5`` or ``full publication``."""
    if key == "publication.mode":
        return f"{value} publication"
    return f"{_short(key)} = {_number(value)}"


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _panels(count: int, *, sharey: bool = True) -> tuple[plt.Figure, list[plt.Axes]]:
    """A figure of ``count`` panels, at most 4 (2 for 4, 3 for 5-6) wide."""
    columns = count if count <= 3 else 2 if count == 4 else 3 if count <= 6 else 4
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
        extra.set_visible(False)
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
    """One legend below the panels with every distinct label."""
    entries: dict[str, Any] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    width_columns = max(1, int(figure.get_figwidth() // 3.6))  # legend stays within the figure
    figure.legend(
        entries.values(),
        entries.keys(),
        loc="outside lower center",
        ncols=min(len(entries), 4, width_columns),
    )


def _error_figure(
    summaries: Sequence[PointSummary], swept: Sequence[str], x: str, panel: str | None, path: Path
) -> None:
    panel, lines = _split(summaries, swept, x, panel)
    panels = _by(summaries, [panel] if panel else [])
    figure, axes = _panels(len(panels))
    for axis, (panel_value, members) in zip(axes, panels.items(), strict=True):
        for line_value, points in _by(members, lines).items():
            points = sorted(points, key=lambda s: s.settings[x])
            xs = np.array([s.settings[x] for s in points], dtype=float)
            mean = np.array([s.mean_error for s in points])
            std = np.array([s.std_error for s in points])
            name = ", ".join(_label(k, v) for k, v in zip(lines, line_value, strict=True))
            (drawn,) = axis.plot(xs, mean, marker="o", label=name or "mean error")
            axis.fill_between(xs, mean - std, mean + std, color=drawn.get_color(), alpha=0.15)
        _references(axis, members, x)
        _x_axis(axis, x, [s.settings[x] for s in members])
        axis.set_title(_label(panel, panel_value[0]) if panel else "")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    for axis in axes:
        if axis.get_subplotspec().is_first_col():
            axis.set_ylabel(_ERROR_LABEL)
    _legend(figure, axes)
    _save(figure, path)


def _references(axis: plt.Axes, members: Sequence[PointSummary], x: str) -> None:
    """Centralized non-private and local-only errors at each x (flat when x is not P or λ).

    With ``evaluation.best_lambda_reference`` also the centralized model at its own
    cross-validated λ (the real ceiling).
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
        axis.plot(xs, values, style, linewidth=1.2, label=name)


def _cost_figure(summaries: Sequence[PointSummary], swept: Sequence[str], path: Path) -> None:
    x = "partition.n_peers"
    _, lines = _split(summaries, swept, x, None)
    figure, axes = _panels(2, sharey=False)
    for line_value, points in _by(summaries, lines).items():
        points = sorted(points, key=lambda s: s.settings[x])
        xs = [s.settings[x] for s in points]
        name = ", ".join(_label(k, v) for k, v in zip(lines, line_value, strict=True))
        axes[0].plot(xs, [s.messages_per_peer for s in points], marker="o", label=name or "all")
        axes[1].plot(xs, [s.wall_cell_s for s in points], marker="o", label=name or "all")
    for axis, title in zip(
        axes, ("messages sent per peer", "wall time per cell (s, one core)"), strict=True
    ):
        _x_axis(axis, x, [s.settings[x] for s in summaries])
        axis.set_title(title)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    _legend(figure, axes)
    _save(figure, path)


def _roc_figure(summaries: Sequence[PointSummary], swept: Sequence[str], path: Path) -> None:
    modes = ["publication.mode"] if "publication.mode" in swept else []
    shown = _independent(swept, summaries, modes)
    figure, axis = plt.subplots(figsize=(6.4, 4.8), layout="constrained")
    for members in _by(summaries, modes).values():
        best = min(members, key=lambda s: s.mean_error)
        assert best.roc_tpr is not None
        name = ", ".join(_label(k, best.settings[k]) for k in modes + shown)
        axis.plot(ROC_FPR, best.roc_tpr, label=f"{name or 'all cells'} (AUC {best.auc:.3f})")
    axis.plot([0, 1], [0, 1], color="grey", linestyle=":", label="chance")
    axis.set_xlabel("false positive rate")
    axis.set_ylabel("true positive rate")
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1.01)
    axis.set_title("ROC of the best peer (mean over folds)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize="small", loc="lower right")
    _save(figure, path)


def _save(figure: plt.Figure, path: Path) -> None:
    """Save as PNG atomically (a temporary file in the same folder, then a rename)."""
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=110)
    finally:
        plt.close(figure)
    write_atomic(path, buffer.getvalue())


# --- markdown ---------------------------------------------------------------------------------
def _caption(x: str, panel: str | None, swept: Sequence[str]) -> str:
    per_panel = f" One panel per {_axis_label(panel)}." if panel in swept and panel != x else ""
    return (
        f"Mean test error of the peers' ensembles vs {_axis_label(x)}; band: +/- one standard "
        f"deviation over peers and folds. Dashed: centralized non-private model; dotted: "
        f"local-only models.{per_panel}"
    )


def _markdown(
    rows: Sequence[dict[str, Any]],
    manifest: dict[str, Any],
    settings: Sequence[str],
    swept: Sequence[str],
    summaries: Sequence[PointSummary],
    figures: Sequence[tuple[str, str, str]],
) -> str:
    name = rows[0]["name"]
    lines = [f"# {name}: results", ""]
    if manifest:
        versions = ", ".join(f"{k} {v}" for k, v in manifest["versions"].items() if v)
        lines += [
            f"Scenario `{manifest['scenario_source']}`"
            + (f" with `--set {' '.join(manifest['overrides'])}`" if manifest["overrides"] else "")
            + f", hash `{manifest['scenario_hash'][:12]}`; started {manifest['started']}, "
            f"finished {manifest.get('finished') or '(not finished)'}; git commit "
            f"`{manifest.get('git_commit') or 'unknown'}`; {versions}; Python "
            f"{manifest['python']}.",
            "",
        ]
    fixed = [k for k in _FIXED_SHOWN if k in settings and k not in swept]
    lines += [
        f"{len(rows)} cells: {len(summaries)} grid points x folds x repetitions. Errors are "
        "fractions of misclassified test rows, averaged over every peer's ensemble and over "
        "folds; +/- is one standard deviation over peers and folds.",
        "",
        "Swept: " + (", ".join(f"`{k}`" for k in swept) or "nothing") + ".",
        "Fixed: " + ", ".join(f"`{k}` = {_number(rows[0][k])}" for k in fixed) + ".",
        "",
        "## Figures",
        "",
    ]
    skipped = []
    for title, file, text in figures:
        if file:
            lines += [f"### {title}", "", f"![{title}]({file})", "", text, ""]
        else:
            skipped.append(f"- {title}: skipped, {text}.")
    if skipped:
        lines += ["Not drawn:", "", *skipped, ""]
    lines += ["## Main results", "", *_table(swept, summaries), ""]
    notes = []
    if any(row.get("data_dependent_bounds") for row in rows):
        notes.append(
            "- The min-max feature bounds were fitted on the pooled training rows of each fold "
            '(`data.bounds = "data"`): a global, non-private step, as in the seed experiment.'
        )
    if "training.lam" in swept:
        notes.append(
            "- Choosing λ from these results uses the test folds and every peer's data: it is "
            "itself a non-private step (the seed tunes a global λ the same way)."
        )
    if notes:
        lines += ["## Non-private steps", "", *notes, ""]
    return "\n".join(lines)


def _table(swept: Sequence[str], summaries: Sequence[PointSummary]) -> list[str]:
    header = [
        *(_short(k) for k in swept),
        "cells",
        "mean error ± std",
        "best peer error",
        "best peer AUC",
        "aggregations",
        "centralized",
        "local only",
    ]
    best = not any(math.isnan(s.centralized_best_lambda_error) for s in summaries)
    if best:
        header.insert(-1, "centralized, own best λ")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries:
        cells = [
            *(_number(s.settings[k]) for k in swept),
            str(s.cells),
            f"{s.mean_error:.3f} ± {s.std_error:.3f}",
            f"{s.best_peer_error:.3f}",
            f"{s.auc:.3f}",
            f"{s.aggregations:.0f}",
            f"{s.centralized_error:.3f}",
            f"{s.local_only_error:.3f}",
        ]
        if best:
            cells.insert(-1, f"{s.centralized_best_lambda_error:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines
