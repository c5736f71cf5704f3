"""The report's comparison of protocols (results whose ``protocol.name`` is swept).

**Tuning, and why it is labelled non-private.** Each protocol is compared at its own best
tuning settings (:data:`TUNED_KEYS` that the sweep varies: the step size and number of rounds
of an iterative protocol, the ensemble rule and group size of the one-shot protocol). The
choice is made per fold, leave-one-fold-out: fold ``k``'s error is that of the setting with the
lowest mean error on the *other* folds. Their test rows are fold ``k``'s training rows, so no
fold's test rows choose its own setting, but the choice reads data beyond any peer's shard:
a non-private tuning step, said so in the report (a deployment would tune on public data or
spend budget on it).

Figures: the tuned error against epsilon per protocol (a panel per partition), and from the
``rounds`` table, the mean test error and the consensus distance against the round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from p2pdp.core.figures import legend_below, write_figure

#: Settings a comparison tunes over (when swept), rather than compares.
TUNED_KEYS = (
    "protocol.step_size",
    "protocol.rounds",
    "protocol.gossip_steps",
    "evaluation.vote",
    "groups.group_size",
    "privacy.epsilon_per_aggregation",
    "privacy.delta_per_aggregation",
)

#: What the report says of the tuning (listed with the non-private steps).
TUNING_STEP = (
    "protocol comparison: each protocol's tuning settings (step size, rounds, ensemble rule, "
    "group size) chosen per fold by the lowest mean test error on the other folds, which are "
    "that fold's training rows (reads data beyond any peer's shard)"
)

#: Marker and line style per protocol: lines that coincide stay visible.
_MARKERS = ("o", "s", "^", "D")
_STYLES = ("-", "--", "-.", ":")


def tuned_comparison(
    rows: Sequence[dict[str, Any]], swept: Sequence[str]
) -> tuple[list[str], list[dict[str, Any]]]:
    """One row per compared setting: the protocol's leave-one-fold-out tuned error.

    Parameters
    ----------
    rows : results rows (parsed values), with ``fold``.
    swept : the swept settings.

    Returns
    -------
    (keys, table): ``keys`` are the compared settings (``protocol.name`` first); each table
    row has them plus ``partition`` (a label), ``folds``, ``error`` (mean over folds of the
    tuned error), ``error_std`` (over folds), ``chosen`` (the setting chosen most often, as
    text), ``local_only_error``, ``centralized_error``, ``central_dp_error`` (the trusted
    curator's DP-SGD at the same budget, NaN for one-shot cells), ``epsilon_spent`` (largest
    local DP epsilon of a peer), ``network_dp_epsilon_mean`` (NaN unless computed for every
    cell), ``network_dp_notes`` (the cells' distinct reasons for not computing it) and
    ``network_dp_bound`` (whether some cell's value is a certified upper bound rather than
    exact: ``network_dp_method``).
    """
    tuned = [k for k in swept if k in TUNED_KEYS]
    keys = ["protocol.name", *(k for k in swept if k not in TUNED_KEYS and k != "protocol.name")]
    groups: dict[tuple, dict[tuple, dict[int, list[dict[str, Any]]]]] = {}
    for row in rows:
        group = tuple(row[k] for k in keys)
        candidate = tuple(row[k] for k in tuned)
        groups.setdefault(group, {}).setdefault(candidate, {}).setdefault(row["fold"], []).append(
            row
        )
    table = []
    for group, candidates in groups.items():
        folds = sorted(set.intersection(*(set(c) for c in candidates.values())))
        error = {
            c: {f: float(np.mean([r["mean_error"] for r in cells[f]])) for f in folds}
            for c, cells in candidates.items()
        }
        picks, errors = [], []
        for fold in folds:
            others = [f for f in folds if f != fold] or [fold]
            best = min(error, key=lambda c: (np.mean([error[c][f] for f in others]), str(c)))
            picks.append(best)
            errors.append(error[best][fold])
        chosen = max(set(picks), key=lambda c: (picks.count(c), str(c)))
        varied = [i for i in range(len(tuned)) if len({c[i] for c in candidates}) > 1]
        cells = [r for c in candidates.values() for f in folds for r in c[f]]
        table.append(
            {
                **dict(zip(keys, group, strict=True)),
                "folds": len(folds),
                "candidates": len(candidates),
                "error": float(np.mean(errors)),
                "error_std": float(np.std(errors)),
                "chosen": ", ".join(f"{tuned[i].rpartition('.')[2]} = {chosen[i]}" for i in varied)
                or "-",
                "local_only_error": _mean(cells, "local_only_error"),
                "centralized_error": _mean(cells, "centralized_error"),
                "central_dp_error": _mean(cells, "central_dp_error"),
                "epsilon_spent": _mean(cells, "max_epsilon_spent"),
                "network_dp_epsilon_mean": _mean(cells, "network_dp_epsilon_mean"),
                "network_dp_notes": sorted(
                    {str(c["network_dp_note"]) for c in cells if c.get("network_dp_note")}
                ),
                "network_dp_bound": any(c.get("network_dp_method") == "bound" for c in cells),
                "partition": _partition_label(cells[0]),
                "_chosen": dict(zip(tuned, chosen, strict=True)),
            }
        )
    return keys, table


def tunes(table: Sequence[dict[str, Any]]) -> bool:
    """Whether a comparison chose anything (some compared setting had several candidates)."""
    return any(row["candidates"] > 1 for row in table)


def compares(rows: Sequence[dict[str, Any]], swept: Sequence[str]) -> bool:
    """Whether the report has a protocol comparison: ``protocol.name`` swept, or an iterative
    protocol among the rows (its rounds are drawn there)."""
    return "protocol.name" in swept or any(
        row.get("protocol.name") not in (None, "", "one-shot") for row in rows
    )


def tuning_step_applies(rows: Sequence[dict[str, Any]], swept: Sequence[str]) -> bool:
    """Whether the report's comparison tunes (a non-private step): a comparison with a setting
    of several candidates, over two folds or more (with one fold it is not drawn)."""
    return (
        compares(rows, swept)
        and len({row.get("fold") for row in rows}) > 1
        and tunes(tuned_comparison(rows, swept)[1])
    )


def _mean(cells: Sequence[dict[str, Any]], column: str) -> float:
    values = [c.get(column) for c in cells]
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return float(np.mean(numbers)) if numbers else math.nan


def _partition_label(row: dict[str, Any]) -> str:
    scheme = row.get("partition.scheme")
    if scheme == "iid":
        return "IID shards"
    if scheme == "label_skew":
        return f"Dirichlet label skew α = {row.get('partition.alpha'):g}"
    return f"{scheme}, α = {row.get('partition.alpha')}"


def _line(row: dict[str, Any]) -> str:
    """A comparison row's line: its protocol, and the other protocol settings the sweep
    compares (e.g. ``dpsgd, threat_model = curious-peer``)."""
    compared = [
        f"{key.rpartition('.')[2]} = {value}"
        for key, value in row.items()
        if key.startswith("protocol.") and key != "protocol.name" and value is not None
    ]
    return ", ".join([str(row["protocol.name"]), *compared])


def comparison_figure(table: Sequence[dict[str, Any]], path: Path) -> None:
    """Tuned error vs epsilon, a line per protocol, a panel per partition."""
    panels = sorted({r["partition"] for r in table})
    figure, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels), 4.0), sharey=True, squeeze=False,
        layout="constrained",
    )  # fmt: skip
    for axis, panel in zip(axes[0], panels, strict=True):
        rows = [r for r in table if r["partition"] == panel]
        for number, protocol in enumerate(sorted({_line(r) for r in rows})):
            line = sorted(
                (r for r in rows if _line(r) == protocol),
                key=lambda r: r["privacy.epsilon"],
            )
            x = [r["privacy.epsilon"] for r in line]
            y = np.array([r["error"] for r in line])
            s = np.array([r["error_std"] for r in line])
            style = {"marker": _MARKERS[number % 4], "ls": _STYLES[number % 4]}
            (drawn,) = axis.plot(x, y, label=protocol, **style)
            axis.fill_between(x, y - s, y + s, color=drawn.get_color(), alpha=0.12)
        ordered = sorted(rows, key=lambda r: r["privacy.epsilon"])
        epsilons = [r["privacy.epsilon"] for r in ordered]
        axis.plot(epsilons, [r["local_only_error"] for r in ordered], "k:", label="local only")
        axis.plot(
            epsilons, [r["centralized_error"] for r in ordered], "k--",
            label="centralized (non-private)",
        )  # fmt: skip
        central = {}  # the curator's reference: mean over the iterative rows at each epsilon
        for epsilon in dict.fromkeys(epsilons):
            values = [r["central_dp_error"] for r in ordered if r["privacy.epsilon"] == epsilon]
            if np.isfinite(values).any():
                central[epsilon] = float(np.nanmean(values))
        if central:
            axis.plot(
                list(central), list(central.values()), "k-.",
                label="central DP (trusted curator)",
            )  # fmt: skip
        axis.set_xscale("log")
        threats = {r.get("protocol.threat_model") for r in rows} - {None, "local"}
        axis.set_xlabel(
            "privacy budget ε per peer (local DP; a threat_model line: against it)"
            if threats
            else "privacy budget ε per peer (local DP)"
        )
        axis.set_title(panel)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("test error, tuned (fraction misclassified)")
    legend_below(figure, axes[0], ncols=4)
    write_figure(figure, path)


def rounds_figure(
    rounds: Any, results: Sequence[dict[str, Any]], table: Sequence[dict[str, Any]],
    column: str, path: Path,
) -> None:  # fmt: skip
    """``column`` of the ``rounds`` table vs round, at each protocol's most chosen setting.

    A panel per (partition, epsilon); a line per protocol, averaged over folds; for the error,
    the centralized non-private model's error (dashed).
    """
    by_cell = {str(r["cell_id"]): r for r in results}
    keyed: dict[tuple[str, float | None], dict[str, dict[int, list[float]]]] = {}
    reference: dict[tuple[str, float | None], list[float]] = {}
    chosen = {
        (r["protocol.name"], r["partition"], r.get("privacy.epsilon")): r["_chosen"] for r in table
    }
    for cell_id, frame in rounds.groupby("cell_id"):
        row = by_cell.get(str(cell_id))
        if row is None:
            continue
        key = (row["protocol.name"], _partition_label(row), row["privacy.epsilon"])
        key = key if key in chosen else (*key[:2], None)  # epsilon not compared
        if key not in chosen or any(row[k] != v for k, v in chosen[key].items()):
            continue
        values = frame.dropna(subset=[column])
        if column == "consensus_distance":  # log axis: round 0 (identical models) is 0
            values = values[values[column] > 0]
        reference.setdefault((key[1], key[2]), []).append(float(row["centralized_error"]))
        panel = keyed.setdefault((key[1], key[2]), {}).setdefault(key[0], {})
        for round_, value in zip(values["round"], values[column], strict=True):
            panel.setdefault(int(round_), []).append(float(value))
    panels = sorted(keyed)
    if not panels:
        return
    columns = min(3, len(panels))
    rows_ = -(-len(panels) // columns)
    figure, axes = plt.subplots(
        rows_, columns, figsize=(4.6 * columns, 3.4 * rows_ + 0.8), sharey=True,
        squeeze=False, layout="constrained",
    )  # fmt: skip
    flat = list(axes.flat)
    for axis, (partition, epsilon) in zip(flat, panels, strict=False):
        for protocol, points in sorted(keyed[(partition, epsilon)].items()):
            x = sorted(points)
            axis.plot(x, [np.mean(points[r]) for r in x], label=protocol)
        if column == "mean_error":
            centralized = float(np.mean(reference[(partition, epsilon)]))
            axis.axhline(centralized, color="k", ls="--", label="centralized (non-private)")
        axis.set_title(partition + ("" if epsilon is None else f", ε = {epsilon:g}"), fontsize=9)
        axis.set_xlabel("round")
        axis.grid(alpha=0.3)
        if column == "consensus_distance":
            axis.set_yscale("log")
    for extra in flat[len(panels) :]:
        figure.delaxes(extra)
    label = {
        "mean_error": "mean test error of the peers' models",
        "consensus_distance": "consensus distance (mean ||w_i - w̄||²)",
    }[column]
    for axis in axes[:, 0]:
        axis.set_ylabel(label)
    legend_below(figure, flat[: len(panels)], ncols=4)
    write_figure(figure, path)


def markdown(keys: Sequence[str], table: Sequence[dict[str, Any]]) -> list[str]:
    """The comparison table as Markdown lines."""
    shown = [k for k in keys]
    header = [
        *(k.rpartition(".")[2] for k in shown),
        "folds",
        "tuned error ± std over folds",
        "chosen (most folds)",
        "local only",
        "centralized",
        "ε spent (local DP)",
        "network DP ε, mean over pairs",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in sorted(table, key=lambda r: tuple(str(r[k]) for k in reversed(shown))):
        lines.append(
            "| "
            + " | ".join(
                [
                    *(f"{row[k]:g}" if isinstance(row[k], float) else str(row[k]) for k in shown),
                    str(row["folds"]),
                    f"{row['error']:.3f} ± {row['error_std']:.3f}",
                    row["chosen"],
                    f"{row['local_only_error']:.3f}",
                    f"{row['centralized_error']:.3f}",
                    f"{row['epsilon_spent']:.3g}",
                    "-"
                    if math.isnan(row["network_dp_epsilon_mean"])
                    else f"{row['network_dp_epsilon_mean']:.3g}"
                    + (" (upper bound)" if row.get("network_dp_bound") else ""),
                ]
            )
            + " |"
        )
    notes = sorted(
        {(row["protocol.name"], note) for row in table for note in row.get("network_dp_notes", [])}
    )
    if notes:
        lines += ["", "Network DP left empty:"]
        lines += [f"- {protocol}: {note}" for protocol, note in notes]
    return lines
