"""A results folder's rows, summarised per grid point for the report
(:mod:`p2pdp.experiments.report.write`).

A grid point is one combination of the swept settings; its :class:`PointSummary` pools the
point's cells (folds x repetitions). The helpers here group points into a figure's panels and
lines (settings tied together by a zipped sweep are one axis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

#: Settings that name figure lines first when several swept settings are tied together.
_LINE_KEYS = ("privacy.mechanism", "evaluation.vote", "publication.mode")


@dataclass(frozen=True, slots=True, kw_only=True)
class PointSummary:
    """One grid point, pooled over its cells (folds x repetitions).

    Errors are fractions in [0, 1]; ``std_error`` is the standard deviation of the per-peer
    errors pooled over peers and cells; ``roc_tpr`` is the best peer's TPR at
    :data:`p2pdp.experiments.results.files.ROC_FPR`, averaged over cells (None without ``roc.csv``).
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
