"""Figures and ``report.md`` from a results folder (``p2pdp report DIR``).

The report checks the folder, summarises its rows per grid point
(:mod:`p2pdp.experiments.report.summary`), draws the figures
(:mod:`p2pdp.experiments.report.figures`, and :mod:`p2pdp.experiments.report.protocols` when
protocols are compared) and writes ``report.md`` last (:mod:`p2pdp.experiments.report.markdown`).

Swept settings are found from the results themselves (columns with more than one value), so
a report needs only ``results.csv`` (``roc.csv`` and ``manifest.json`` add the ROC figure and
the run's provenance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from p2pdp.config import public_key
from p2pdp.core.errors import ConfigError
from p2pdp.core.files import write_atomic
from p2pdp.experiments.report.figures import NO_SCORES, _draw_figures, _figure_specs
from p2pdp.experiments.report.markdown import _markdown, _task_markdown, _unscored, _with_status
from p2pdp.experiments.report.summary import _parse, _summarise
from p2pdp.experiments.results.files import (
    CELL_SELECTION,
    MANIFEST_FILE,
    RESULTS_FILE,
    incomplete_cells,
    read_manifest,
    read_results,
    read_roc,
    repair,
)
from p2pdp.experiments.results.lock import FolderLock
from p2pdp.experiments.results.manifest import resume_command

REPORT_FILE = "report.md"


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
    :func:`p2pdp.experiments.results.files.repair` (which drops a line cut short by a crash, as
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
