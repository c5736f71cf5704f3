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
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LogNorm, Normalize
from matplotlib.ticker import NullFormatter

from p2pdp.config import public_key
from p2pdp.core.errors import ConfigError
from p2pdp.core.figures import write_figure
from p2pdp.core.files import write_atomic
from p2pdp.experiments.results.store import (
    CELL_SELECTION,
    MANIFEST_FILE,
    RESULTS_FILE,
    ROC_FPR,
    TABLE_ROWS,
    FolderLock,
    incomplete_cells,
    read_manifest,
    read_results,
    read_roc,
    repair,
    resume_command,
)
from p2pdp.experiments.scenarios.disclosure import LAMBDA_SWEPT

REPORT_FILE = "report.md"
#: Text columns of a task's rows that are bookkeeping, not declarations (the non-private steps
#: have their own section).
_NOT_DECLARATIONS = ("cell_id", "stop_reason", "non_private_steps", TABLE_ROWS)

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
#: Settings that name figure lines first when several swept settings are tied together.
_LINE_KEYS = ("privacy.mechanism", "evaluation.vote", "publication.mode")
#: (file stem, title, x axis, panel axis): one accuracy figure each, drawn if x is swept.
_ERROR_FIGURES = (
    ("error_vs_group_size", "Error vs group size", "groups.group_size", "privacy.epsilon"),
    ("error_vs_epsilon", "Error vs privacy budget", "privacy.epsilon", "groups.group_size"),
    ("error_vs_peers", "Error vs number of peers", "partition.n_peers", "privacy.epsilon"),
    ("error_vs_lambda", "Error vs regularisation", "training.lambda", "privacy.epsilon"),
)
_FIXED_SHOWN = (
    "data.dataset",
    "data.transform",
    "partition.n_peers",
    "partition.scheme",
    "training.lambda",
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
    :data:`p2pdp.experiments.results.store.ROC_FPR`, averaged over cells (None without ``roc.csv``).
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
    :func:`p2pdp.experiments.results.store.repair` (which drops a line cut short by a crash, as
    ``--resume``
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
    if not (directory / RESULTS_FILE).exists() and (directory / MANIFEST_FILE).exists():
        raise ConfigError(  # a run stopped (Ctrl-C, kill) before its first cell finished
            f"{directory} holds no finished cell yet (the run was stopped before its first); "
            f"finish with: {resume_command(directory, read_manifest(directory))}"
        )
    if not (directory / RESULTS_FILE).exists():
        raise ConfigError(
            f"{directory / RESULTS_FILE} not found: run `p2pdp run` with --out {directory} first"
        )
    with FolderLock(directory, purpose="p2pdp report"):
        repair(directory)
        _check_results(directory)
        return _write_report(directory)


def _check_results(directory: Path) -> None:
    """Raise ConfigError unless the folder's rows are whole and of its grid, with the columns
    and numbers the report reads."""
    path = directory / RESULTS_FILE
    rows = read_results(directory)
    if not rows:
        return
    manifest = read_manifest(directory) if (directory / MANIFEST_FILE).exists() else {}
    if manifest.get("cell_ids") is not None:
        grid = set(manifest["cell_ids"])
        for number, row in enumerate(rows, start=2):
            if row["cell_id"] not in grid:
                raise ConfigError(
                    f"{path}, line {number}: cell {row['cell_id']} is not in the scenario's "
                    f"grid ({len(grid)} cells): the file was edited or mixed with another run's"
                )
    broken = incomplete_cells(directory)
    if broken:
        files = sorted({name for names in broken.values() for name in names})
        raise ConfigError(
            f"{directory}: {', '.join(files)} lack(s) the rows of {len(broken)} cell(s) "
            f"(first: {min(broken)}): deleted or cut short; rebuild them with "
            f"`{resume_command(directory, manifest)}`"
        )
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
    rows = [  # public names; results of older versions said training.lam; not which folds
        {public_key(key): _parse(value) for key, value in row.items() if key != CELL_SELECTION}
        for row in read_results(directory)
    ]
    if not rows:
        raise ConfigError(f"{directory / RESULTS_FILE} has no rows")
    manifest = read_manifest(directory) if (directory / MANIFEST_FILE).exists() else {}
    settings = [c for c in rows[0] if c in ("name", "seed") or "." in c]
    # swept: several values among the cells that read it (an unread setting is empty)
    swept = [c for c in settings if len({row[c] for row in rows} - {None}) > 1]
    if "mean_error" not in rows[0]:  # a task that does not classify: its own columns and figures
        report = directory / REPORT_FILE
        figures = _task_figures(rows, directory)
        text = _task_markdown(rows, manifest, settings, swept, figures)
        write_atomic(report, _with_status(text, directory, manifest, rows))
        return report
    summaries = _summarise(rows, swept, read_roc(directory))
    protocols = _protocol_comparison(directory, rows, swept)
    unscored = _unscored(rows)
    no_scores = NO_SCORES if unscored else None

    specs = _figure_specs(summaries, swept, no_scores, protocols.specs)
    # Each figure replaces its old file atomically and report.md is written last, so a kill at
    # any moment leaves every figure the report on disk links; a figure this report no longer
    # draws is deleted only once the new report.md (which does not link it) is in place.
    figures = _draw_figures(directory, specs)

    report = directory / REPORT_FILE
    text = _markdown(rows, manifest, settings, swept, summaries, figures, unscored)
    text += protocols.text
    write_atomic(report, _with_status(text, directory, manifest, rows))
    for stem, _, skipped, _, _ in specs:
        if skipped:
            (directory / f"{stem}.png").unlink(missing_ok=True)
    return report


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


def _unscored(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The report's "Not scored" section: why the rows' error columns are empty (their
    ``score_note``, once each, with its count of cells); empty if every row was scored."""
    notes: dict[str, int] = {}
    for row in rows:
        if row.get("score_note"):
            notes[str(row["score_note"])] = notes.get(str(row["score_note"]), 0) + 1
    if not notes:
        return []
    return [
        "## Not scored",
        "",
        *(f"- {note} ({count} of {len(rows)} cells)." for note, count in notes.items()),
        "",
        "Their error, AUC, centralized and local-only columns are empty (nan): no figure is "
        "drawn from them, and the table's are nan. What the protocol produced (aggregations, "
        "epsilons, messages, bytes, guarantees) is filled.",
        "",
    ]


def _error_figure_skipped(x: str, swept: Sequence[str]) -> str | None:
    """Why an error figure with x axis ``x`` is not drawn, or None."""
    if x not in swept:
        return f"`{x}` is not swept"
    if "protocol.name" in swept:  # every protocol's every tuning would be a line
        return "`protocol.name` is swept: see the protocols compared at their tuned settings"
    return None


@dataclass(frozen=True, slots=True)
class _Protocols:
    """The protocol comparison's figure specs and report section (empty unless swept)."""

    specs: list[tuple[str, str, str | None, Any, str]]
    text: str


def _protocol_comparison(
    directory: Path, rows: Sequence[dict[str, Any]], swept: Sequence[str]
) -> _Protocols:
    """Figures and a table comparing protocols at their tuned settings
    (:mod:`p2pdp.experiments.report.protocols`), when ``protocol.name`` is swept."""
    from p2pdp.experiments.report import protocols as pr

    if not pr.compares(rows, swept):
        return _Protocols([], "")
    rounds_path = directory / "rounds.csv"
    keys, table = pr.tuned_comparison(rows, swept)
    folds = len({row["fold"] for row in rows})
    why = "tuning needs two folds or more" if pr.tunes(table) and folds < 2 else None
    rounds = None
    if why is None and rounds_path.exists():
        import pandas as pd

        rounds = pd.read_csv(rounds_path)
    no_rounds = why or (None if rounds is not None else "no rounds.csv (no iterative protocol)")
    no_epsilon = why or (None if "privacy.epsilon" in swept else "`privacy.epsilon` is not swept")
    specs = [
        (
            "protocols_vs_epsilon",
            "Protocols at their tuned settings vs privacy budget",
            no_epsilon,
            partial(pr.comparison_figure, table),
            "Test error of each protocol at its tuned settings (leave-one-fold-out, a "
            "non-private tuning step), mean over folds, band +/- one standard deviation over "
            "folds; dotted: local-only models; dashed: centralized non-private model. ε is each "
            "peer's local DP budget (iterative protocols) or its one-shot budget (both: "
            "neighbouring shards differ in one record).",
        ),
        *(
            (
                f"{column}_vs_round",
                title,
                no_rounds,
                partial(pr.rounds_figure, rounds, rows, table, column),
                f"{title} for each iterative protocol at its most chosen tuning, mean over "
                "folds; a panel per partition and budget.",
            )
            for column, title in (
                ("mean_error", "Error vs round"),
                ("consensus_distance", "Consensus distance vs round"),
            )
        ),
    ]
    if why is not None:
        return _Protocols(specs, "")
    text = "\n".join(
        [
            "",
            (
                "## Protocols compared at their tuned settings"
                if len(names := {row.get("protocol.name") for row in rows}) > 1
                else f"## {names.pop()} at its tuned settings"
            ),
            "",
            (
                f"Non-private tuning step: {pr.TUNING_STEP}. "
                if pr.tunes(table)
                else "Nothing is tuned (no compared setting has several candidates). "
            )
            + "ε spent is local DP (what any one "
            "neighbour learns); the network DP column is Muffliato's pairwise guarantee "
            "computed from a peer's whole view (every message it received, its own state), "
            "valid only against one peer that sees nothing else: never read it as local DP.",
            "",
            *pr.markdown(keys, table),
            "",
        ]
    )
    return _Protocols(specs, text)


def _task_figures(rows: Sequence[dict[str, Any]], directory: Path) -> list[tuple[str, str, str]]:
    """The task's own figures: ``figures(rows, directory) -> [(title, file, caption)]``.

    A task class may provide this classmethod (hook); the task of the first row draws them
    (with ``task.name`` swept, the tasks compared must share their figures).
    """
    from p2pdp.core import components

    try:
        task = components.resolve("task", rows[0].get("task.name"), key="task.name")
    except ConfigError:
        return []
    draw = getattr(task, "figures", None)
    return list(draw(list(rows), directory)) if callable(draw) else []


def _task_markdown(
    rows: Sequence[dict[str, Any]],
    manifest: dict[str, Any],
    settings: Sequence[str],
    swept: Sequence[str],
    figures: Sequence[tuple[str, str, str]] = (),
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
    tasks = ", ".join(sorted({f"`{row.get('task.name')}`" for row in rows}))
    lines = [
        f"# {manifest.get('scenario', rows[0].get('name', 'results'))}",
        "",
        f"Task {tasks}: {len(rows)} cells; means over folds and "
        "repetitions."
        + ("" if figures else " No figures: the task draws none (no `figures` hook)."),
        "",
    ]
    labels = sorted(
        {
            f"`{c}` = {row[c]}"
            for row in rows
            for c in rows[0]
            if c not in skip and isinstance(row[c], str) and c not in _NOT_DECLARATIONS
        }
    )
    if labels:
        lines += ["Declared: " + "; ".join(labels) + ".", ""]
    lines += ["## Non-private steps", "", *_non_private_section(rows, swept), ""]
    for title, file, caption in figures:
        lines += [f"## {title}", "", f"![{title}]({file})", "", caption, ""]
    lines += [
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
        tprs = [curve for curve in curves if curve is not None]
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
                roc_tpr=np.mean(tprs, axis=0) if len(tprs) == len(curves) else None,
            )
        )
    return summaries


def _column_mean(cells: Sequence[dict[str, Any]], column: str) -> float:
    return float(np.mean([row[column] for row in cells]))


def _optional_mean(cells: Sequence[dict[str, Any]], column: str) -> float:
    """Mean of a column some rows may lack (NaN if any cell lacks it)."""
    values = [row.get(column) for row in cells]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return float(np.mean(numbers)) if len(numbers) == len(values) else math.nan


def _tied(a: str, b: str, summaries: Sequence[PointSummary]) -> bool:
    """True when settings ``a`` and ``b`` determine each other (a zipped sweep axis)."""
    pairs = {(s.settings[a], s.settings[b]) for s in summaries}
    return len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def _split(
    summaries: Sequence[PointSummary], swept: Sequence[str], x: str, panel: str | None
) -> tuple[str | None, list[str]]:
    """The panel key (if swept and not tied to x) and the line keys of a figure."""
    if panel is None or panel not in swept or panel == x or _tied(x, panel, summaries):
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


# --- markdown ---------------------------------------------------------------------------------
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


def _with_status(
    text: str, directory: Path, manifest: dict[str, Any], rows: Sequence[dict[str, Any]]
) -> str:
    """``text`` with, under its title, a warning if the run did not finish every cell, and
    one if hosts or frames were lost on the network (:func:`_network_faults`)."""
    warnings = [] if (faults := _network_faults(rows, manifest)) is None else [faults]
    total, n_rows = manifest.get("cells"), len(rows)
    if manifest and not (manifest.get("status") == "complete" and n_rows == total):
        status = manifest.get("status", "unknown")
        missing = f"{total - n_rows} of {total} cells missing" if total else "cells may be missing"
        why = f" ({manifest['error']})" if manifest.get("error") else ""
        if status == "complete":  # every cell ran, but a row is gone (a crash, a full disk)
            status = "incomplete: its manifest says complete, but results.csv lacks rows"
        elif status == "running":  # the report holds the folder's lock: no run is left
            status = (
                "interrupted: the process that ran it ended without finishing (killed, or "
                "its machine stopped)"
            )
        warnings.insert(
            0,
            f"**Incomplete results: {missing}; the run is {status}{why}.** Every number below "
            f"is over the {n_rows} cells done. Finish it with "
            f"`{resume_command(directory, manifest)}`.",
        )
    if not warnings:
        return text
    title, _, rest = text.partition("\n\n")
    return "\n\n".join([title, *warnings, rest])


def _network_faults(rows: Sequence[dict[str, Any]], manifest: dict[str, Any]) -> str | None:
    """A network run's lost host processes and lost frames (columns ``hosts_lost`` and
    ``messages_lost``), or None if there were none (or the run was simulated: there a
    lost message is the ``network.loss`` model's, a setting)."""
    if manifest.get("runtime") != "network":
        return None
    hosts = sum(int(row.get("hosts_lost") or 0) for row in rows)
    frames = sum(int(row.get("messages_lost") or 0) for row in rows)
    hit = sum(1 for row in rows if row.get("hosts_lost") or row.get("messages_lost"))
    if not hit:
        return None
    return (
        f"**Faults on the network: {hosts} host process(es) lost and {frames:,} frames lost "
        f"(undeliverable, or past their group's timer), in {hit} of {len(rows)} cells** "
        "(columns `hosts_lost` and `messages_lost`; `wire.csv` counts them with the frames "
        "refused as outside the protocol). A lost host's peers took no further part "
        "in that cell's run, yet its error columns still score them (with every full "
        "publication, or under group publication with their own model only)."
    )


def _markdown(
    rows: Sequence[dict[str, Any]],
    manifest: dict[str, Any],
    settings: Sequence[str],
    swept: Sequence[str],
    summaries: Sequence[PointSummary],
    figures: Sequence[tuple[str, str, str]],
    unscored: Sequence[str] = (),
) -> str:
    name = rows[0]["name"]
    lines = [f"# {name}: results", ""]
    if manifest:
        versions = ", ".join(f"{k} {v}" for k, v in manifest["versions"].items() if v)
        unset = manifest.get("unset", [])
        lines += [
            f"Scenario `{manifest['scenario_source']}`"
            + (f" with `--unset {' '.join(unset)}`" if unset else "")
            + (
                f" {'and' if unset else 'with'} `--set {' '.join(manifest['overrides'])}`"
                if manifest["overrides"]
                else ""
            )
            + f", hash `{manifest['scenario_hash'][:12]}`; started {manifest['started']}, "
            + (f"finished {manifest['finished']}; " if manifest.get("finished") else "")
            + "git commit "
            f"`{manifest.get('git_commit') or 'unknown'}`; {versions}; Python "
            f"{manifest['python']}.",
            "",
        ]
    # a setting no cell read is blank in every row: nothing to show
    fixed = {
        k: next((row[k] for row in rows if row.get(k) is not None), None)
        for k in _FIXED_SHOWN
        if k in settings and k not in swept
    }
    lines += [
        f"{len(rows)} cells: {len(summaries)} grid points x folds x repetitions. Errors are "
        "fractions of misclassified test rows, averaged over every peer's ensemble and over "
        "folds; +/- is one standard deviation over peers and folds.",
        "",
        "Swept: " + (", ".join(f"`{k}`" for k in swept) or "nothing") + ".",
        "Fixed: "
        + ", ".join(f"`{k}` = {_number(v)}" for k, v in fixed.items() if v is not None)
        + ".",
        "",
        "## Non-private steps",
        "",
        *_non_private_section(rows, swept),
        "",
        *unscored,
        "## Figures",
        "",
    ]
    skipped, unscored_figures = [], []
    for title, file, text in figures:
        if file:
            lines += [f"### {title}", "", f"![{title}]({file})", "", text, ""]
        elif text == NO_SCORES:
            unscored_figures.append(title)
        else:
            skipped.append(f"- {title}: skipped, {text}.")
    if unscored_figures:  # one line for them all: the section above says why
        skipped.insert(0, f"- {', '.join(unscored_figures)}: skipped, {NO_SCORES}.")
    if skipped:
        lines += ["Not drawn:", "", *skipped, ""]
    lines += ["## Main results", "", *_table(swept, summaries), ""]
    return "\n".join(lines)


def non_private_steps_of(
    rows: Sequence[dict[str, Any]], swept: Sequence[str]
) -> list[tuple[str, int]]:
    """Distinct non-private steps of the rows, with the number of cells each applies to.

    Read from the ``non_private_steps`` column
    (:mod:`p2pdp.experiments.scenarios.disclosure`); results written
    before that column existed fall back to ``data_dependent_bounds`` and the mechanism. A
    swept lambda is a step of the whole results set even if the rows do not say so.
    """
    counts: dict[str, int] = {}
    for row in rows:
        if "non_private_steps" in row:
            steps = [p for p in str(row["non_private_steps"] or "").split("; ") if p]
        else:
            steps = []
            if row.get("data_dependent_bounds"):
                steps.append("min-max bounds fitted on the pooled training rows of each fold")
            mechanism = row.get("privacy.mechanism")
            if mechanism in ("none", "seed-laplace"):
                steps.append(
                    f"privacy.mechanism = {mechanism}: each release guarantees only epsilon = "
                    f"{_number(row.get('guaranteed_epsilon_per_aggregation'))}"
                )
        for step in steps:
            counts[step] = counts.get(step, 0) + 1
    if "training.lambda" in swept and not any(step.startswith("lambda") for step in counts):
        counts[f"lambda: {LAMBDA_SWEPT}"] = len(rows)
    if all("fold" in row for row in rows):
        from p2pdp.experiments.report import protocols as pr

        if pr.tuning_step_applies(rows, swept):
            counts[pr.TUNING_STEP] = len(rows)
    return list(counts.items())


def _non_private_section(rows: Sequence[dict[str, Any]], swept: Sequence[str]) -> list[str]:
    steps = non_private_steps_of(rows, swept)
    if not steps:
        return [
            "None: the only access to the peers' data is the mechanism's noisy releases, each "
            "within the privacy budget charged."
        ]
    return [
        "Steps outside the differential-privacy guarantee (the guarantee covers the noisy "
        "releases given these choices):",
        "",
        *(
            f"- {step}" + ("" if count == len(rows) else f" ({count} of {len(rows)} cells)")
            for step, count in steps
        ),
    ]


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
