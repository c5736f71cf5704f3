"""What every figure p2pdp draws shares: atomic PNG files, legends below, intervals, palettes.

The workloads' figure modules (``p2pdp.tasks.<workload>.figures``) and the report
(:mod:`p2pdp.experiments.report.write`) draw with these; no maths here beyond averaging and the
Wilson interval.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter, NullLocator

from p2pdp.core.files import write_atomic

#: Rows of a table: one dict per cell or per point.
Rows = Sequence[dict[str, Any]]
#: A report figure: ``(title, file name, caption)``.
Figure = tuple[str, str, str]
#: Resolution of every PNG p2pdp writes.
DPI = 110


def write_figure(figure: Any, path: str | Path, *, dpi: int = DPI) -> Path:
    """Save a matplotlib figure as PNG atomically (:func:`write_atomic`), then close it.

    ``bbox_inches="tight"``: nothing outside the axes (a legend) is clipped. A kill at any
    moment leaves the old image or the new one, so a report never links a half-written file.
    """
    import matplotlib.pyplot as plt

    path = Path(path)
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(figure)
    write_atomic(path, buffer.getvalue())
    return path


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


def wilson_interval(
    proportions: np.ndarray, counts: Sequence[int], level: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of binomial proportions ``proportions`` out of ``counts`` trials."""
    from scipy import stats  # only here: importing scipy.stats costs ~0.2 s

    z = float(stats.norm.ppf(0.5 + level / 2))
    n = np.asarray(counts, dtype=float)
    p = np.asarray(proportions, dtype=float)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # it always holds p: say so exactly where rounding would put an end a hair inside it
    return np.clip(np.minimum(centre - half, p), 0, 1), np.clip(np.maximum(centre + half, p), 0, 1)


def colours(count: int, *, stop: float = 0.9) -> list:
    """``count`` colours along viridis from 0 to ``stop`` (pale yellow past ~0.9 is hard to see)."""
    return [plt.get_cmap("viridis")(x) for x in np.linspace(0.0, stop, max(count, 1))]


def save(figure: plt.Figure, directory: Path, stem: str) -> str:
    """Write ``figure`` as ``directory/stem.png`` (:func:`write_figure`); its file name."""
    return write_figure(figure, Path(directory) / f"{stem}.png", dpi=DPI).name


def values(rows: Rows, key: str) -> list:
    return sorted({row[key] for row in rows})


def select(rows: Rows, **match: Any) -> list[dict[str, Any]]:
    return [row for row in rows if all(row[key] == value for key, value in match.items())]


def swept(rows: Rows) -> list[str]:
    return [key for key in rows[0] if "." in key and len({row[key] for row in rows}) > 1]


def mean(rows: Rows, column: str) -> float:
    values = [float(row[column]) for row in rows if row.get(column) is not None]
    return float(np.nanmean(values)) if values else float("nan")


def grouped(rows: Rows, keys: Sequence[str]) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[key] for key in keys), []).append(row)
    return dict(sorted(groups.items(), key=lambda item: tuple(map(order, item[0]))))


def order(value: Any) -> tuple[int, Any]:
    """Numbers first, in numeric order, then everything else by its text."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, value) if number else (1, str(value))


def panels(count: int, rows: int = 1) -> tuple[plt.Figure, np.ndarray]:
    figure, axes = plt.subplots(
        rows, count, figsize=(4.6 * count, 3.8 * rows), squeeze=False, layout="constrained"
    )
    return figure, axes


def epsilon_axis(
    axis: plt.Axes, panel: str | None, value: Any, ylabel: str, ticks: Sequence[float]
) -> None:
    """Log-log axes over epsilon per peer, ticks at ``ticks``, titled by the panel's value."""
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xticks(ticks, [f"{x:g}" for x in ticks])
    axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_xlabel("ε per peer")
    axis.set_ylabel(ylabel)
    if panel:
        axis.set_title(f"{panel.split('.')[-1]} = {value[0]}", fontsize=9)
    axis.grid(alpha=0.3, which="both")
