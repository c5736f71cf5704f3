"""The text of ``report.md`` (:mod:`p2pdp.experiments.report.write`): the run's provenance,
its warnings (cells missing, faults on the network), the non-private steps, the figures'
captions and the main table; and the whole report of a task without classification errors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2pdp.experiments.report.figures import NO_SCORES, _number, _short
from p2pdp.experiments.report.summary import PointSummary, _column_mean
from p2pdp.experiments.results.files import TABLE_ROWS
from p2pdp.experiments.results.manifest import resume_command
from p2pdp.experiments.scenarios.disclosure import LAMBDA_SWEPT

#: Text columns of a task's rows that are bookkeeping, not declarations (the non-private steps
#: have their own section).
_NOT_DECLARATIONS = ("cell_id", "stop_reason", "non_private_steps", TABLE_ROWS)


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


def _runtime(manifest: dict[str, Any]) -> str:
    """Which runtime made the rows, for the report's header: a network run's timing columns
    (``sim_time`` among them) are wall seconds between real processes."""
    if manifest.get("runtime", "simulation") != "network":
        return "simulated; "
    hosts = f"{manifest['hosts']} hosts; " if manifest.get("hosts") else ""
    return f"run on the network runtime ({hosts}its times, `sim_time` included, are wall seconds); "


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
            + f", hash `{manifest['scenario_hash'][:12]}`; "
            + _runtime(manifest)
            + f"started {manifest['started']}, "
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
