"""How wall time and memory grow with the number of peers, for the central and gossip samplers.

    python benchmarks/bench_scale.py                                # P = 10^3, 10^4, 10^5
    python benchmarks/bench_scale.py --peers 1000 10000 --samplers central
    python benchmarks/bench_scale.py --out docs/scale             # table + figure for the guide
    python benchmarks/bench_scale.py --peers 100000 --samplers central --workers 1 2

Each configuration is the synthetic workload of ``bench_simulation.py`` (20 training rows per
peer, d = 58 with the bias, g = 10, epsilon = 1, epsilon_A = 0.1, full publication, one fold),
run in a fresh process so its peak resident memory is its own. Prints one line per run (with
the memory budget of each phase: the peak by the end of training, of the simulation and of
the run, and the largest worker's) and the
fitted growth exponent of each phase's wall time in P (least squares on log-log; 1 is linear).
With ``--out``, writes ``<out>.csv`` and ``<out>.png``: wall time per phase and peak memory by
the end of each phase against P on log-log axes, one line per sampler and phase, the
exponents in the legend.

A P whose peak memory, extrapolated from the two largest runs, would exceed ``--memory-limit``
(default: 90% of this machine's RAM) is skipped with a message instead of being killed by the
kernel half-way.

``--workers 1 2 ...`` runs every configuration with each number of local worker processes
(for the data, training, reference and evaluation phases) and prints, for each P, every
phase's parallel efficiency ``t1 / (w * tw)`` against the first count given (1.0: ``w``
workers take ``1 / w`` of the time; ``1 / w``: no faster) and the wall time as a ratio of
its. Ratios are measured in one run, as the machine's speed varies between days.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import threading
from pathlib import Path

import numpy as np
from bench_simulation import growth_exponent, run_isolated

PHASES = ("training_s", "simulation_s", "evaluation_s", "wall_s")
#: The memory budget of each phase (the process's peak by its end) and its line's colour.
MEMORY = {"peak_mb_after_training": "tab:blue", "peak_mb_after_simulation": "tab:orange",
          "peak_mb": "black"}  # fmt: skip
MEMORY_PHASES = {
    "peak_mb_after_training": "training",
    "peak_mb_after_simulation": "simulation",
    "peak_mb": "the run",
}


def machine_memory_mb() -> float:
    """Physical memory of this machine in MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


def predicted_peak_mb(rows: list[dict], peers: int) -> float | None:
    """Peak memory at ``peers`` extrapolated from the last two runs (None: fewer than 2).

    The local log-log slope, at least 1: memory that grows with P grows linearly once the
    fixed cost (the interpreter, the libraries) no longer dominates.
    """
    if len(rows) < 2:
        return None
    (p1, m1), (p2, m2) = ((r["peers"], r["peak_mb"]) for r in rows[-2:])
    slope = max(1.0, float(np.log(m2 / m1) / np.log(p2 / p1)))
    return float(m2 * (peers / p2) ** slope)


def parallel_efficiency(first: dict, row: dict) -> dict[str, float]:
    """Each phase's ``t1 / (w * tw)``: ``first`` with ``w1`` workers, ``row`` with ``w``.

    Relative to ``first``: ``(w1 * t1) / (w * tw)``, which is ``t1 / (w * tw)`` for ``w1 = 1``.
    """
    scale = first["workers"] / row["workers"]
    return {phase[:-2]: scale * first[phase] / row[phase] for phase in PHASES}


def write_figure(rows: list[dict], path: Path) -> None:
    """Log-log panels: wall time per phase, and peak memory, against P for each sampler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from p2pdp.core.figures import legend_below, write_figure

    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    styles = {"central": "-", "gossip": "--"}
    colours = dict(zip(PHASES, plt.get_cmap("viridis")(np.linspace(0, 0.85, 4)), strict=True))
    for sampler, workers in sorted({(r["sampler"], r["workers"]) for r in rows}):
        runs = sorted(
            (r for r in rows if (r["sampler"], r["workers"]) == (sampler, workers)),
            key=lambda r: r["peers"],
        )
        peers = [r["peers"] for r in runs]
        name = sampler if workers == 1 else f"{sampler}, {workers} workers"
        marker = "o" if workers == 1 else "s"
        quiet = [r for r in runs if not busy(r)]  # a busy machine's times bend the fit
        for phase in PHASES:
            seconds = [r[phase] for r in runs]
            fitted = ([r["peers"] for r in quiet], [r[phase] for r in quiet])
            exponent = growth_exponent(*fitted) if len(quiet) > 1 else float("nan")
            time_axis.plot(
                peers,
                seconds,
                styles.get(sampler, ":"),
                marker=marker,
                color=colours[phase],
                label=f"{name}: {phase[:-2]} (P^{exponent:.2f})",
            )
        for r in runs:  # a busy machine's times say more about the load than the engine
            if busy(r):
                time_axis.annotate(
                    f"load {r['load_mean']:.0f}", (r["peers"], r["wall_s"]), fontsize=7,
                    textcoords="offset points", xytext=(-48, -3),
                )  # fmt: skip
        for column, colour in MEMORY.items():
            memory = [r[column] / 1024 for r in runs]
            exponent = growth_exponent(peers, memory) if len(runs) > 1 else float("nan")
            memory_axis.plot(
                peers,
                memory,
                styles.get(sampler, ":"),
                marker=marker,
                color=colour,
                label=f"{name}: peak by the end of {MEMORY_PHASES[column]} (P^{exponent:.2f})",
            )
    time_axis.set(xscale="log", yscale="log", xlabel="peers P", ylabel="wall time (s)")
    memory_axis.set(xscale="log", yscale="log", xlabel="peers P", ylabel="peak memory (GiB)")
    for axis in (time_axis, memory_axis):
        axis.grid(alpha=0.3, which="both")
    loaded = (
        " (annotated: timed at a mean load above the cores, left out of the time exponents)"
        if any(map(busy, rows))
        else ""
    )
    figure.suptitle(
        "Synthetic workload, 20 rows per peer, g = 10, full publication (one fold)" + loaded,
        fontsize=9,
    )
    legend_below(figure, [time_axis, memory_axis], ncols=3)
    write_figure(figure, path)


def added_rows(path: Path) -> list[dict]:
    """The rows of an earlier ``--out`` table, numbers as numbers (``--add``)."""
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    if not rows:
        raise SystemExit(f"--add {path}: no rows")
    missing = [name for name in (*PHASES, "peers", "sampler", *MEMORY) if name not in rows[0]]
    if missing:
        raise SystemExit(f"--add {path}: not a bench_scale table, no column {missing}")
    for row in rows:
        for key, value in row.items():
            try:
                row[key] = float(value) if "." in value or "e" in value else int(value)
            except ValueError:
                pass
    return rows


class LoadSampler:
    """The machine's mean 1-minute load average over a block (sampled every ``period``
    seconds, the run's own processes included: about its worker count on an idle machine),
    so a row says how busy the machine was when it was timed."""

    def __init__(self, period: float = 5.0) -> None:
        self.period = period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.period):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    @property
    def mean(self) -> float:
        """The mean of the samples (at least the first and the last)."""
        return float(np.mean(self.samples))


def busy(row: dict) -> bool:
    """Whether a row was timed on a busy machine: a mean load above the machine's cores plus
    one (its times are then longer than the engine's own; rows without a load are taken as
    timed on an idle machine)."""
    return float(row.get("load_mean") or 0.0) > (os.cpu_count() or 1) + 1


def scale_run(sampler: str, peers: int, workers: int, done: list[dict], limit: float) -> None:
    """Run P = ``peers`` in a fresh process and append its row to ``done`` (the runs of this
    sampler and worker count), unless its peak memory predicted from ``done`` exceeds
    ``limit`` MiB; print a line either way."""
    predicted = predicted_peak_mb(done, peers)
    if predicted is not None and predicted > limit:
        print(
            f"{sampler:>7} P={peers:>8}: skipped, predicted peak {predicted / 1024:.1f} "
            f"GiB > limit {limit / 1024:.1f} GiB",
            flush=True,
        )
        return
    with LoadSampler() as load:
        row = run_isolated("synthetic", peers, 10, "full", sampler, workers)
    row["load_mean"] = load.mean
    done.append(row)
    print(
        f"{sampler:>7} P={peers:>8} workers {workers}: training {row['training_s']:7.2f} s  "
        f"simulation {row['simulation_s']:7.2f} s  evaluation {row['evaluation_s']:6.2f} s  "
        f"total {row['wall_s']:7.2f} s  peak {row['peak_mb'] / 1024:5.2f} GiB (by the end of "
        f"training {row['peak_mb_after_training'] / 1024:5.2f}, simulation "
        f"{row['peak_mb_after_simulation'] / 1024:5.2f}; largest worker "
        f"{row['peak_worker_mb'] / 1024:5.2f})  aggregations {row['aggregations']}  load "
        f"{row['load_mean']:.1f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peers", type=int, nargs="*", default=[1000, 10_000, 100_000],
        help="peer counts to run (none: only join the --add tables into --out)",
    )  # fmt: skip
    parser.add_argument(
        "--samplers", nargs="+", choices=("central", "gossip"), default=["central", "gossip"]
    )
    parser.add_argument("--memory-limit", type=float, default=0.9 * machine_memory_mb(),
                        help="MiB; a P predicted to need more is skipped")  # fmt: skip
    parser.add_argument("--out", type=Path, help="write <out>.csv and <out>.png")
    parser.add_argument(
        "--add", type=Path, nargs="+", default=[],
        help="CSV tables written by an earlier --out whose rows join this run's table and "
        "figure (a long run, such as 10^7 peers, measured on its own)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1],
        help="local processes for the data, training and evaluation phases; with several "
        "counts, each phase's parallel efficiency against the first",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if min(args.workers) < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    if not args.peers and not (args.add and args.out):
        parser.error("--peers with no value runs nothing: it needs --add and --out (tables joined)")

    rows: list[dict] = []
    for sampler in args.samplers:
        done: dict[int, list[dict]] = {workers: [] for workers in args.workers}
        for peers in sorted(args.peers):  # worker counts interleaved: ratios in one period
            for workers in args.workers:
                scale_run(sampler, peers, workers, done[workers], args.memory_limit)
            runs = [r for w in args.workers for r in done[w] if r["peers"] == peers]
            for row in runs[1:]:  # against the first worker count given
                efficiency = parallel_efficiency(runs[0], row)
                text = ", ".join(f"{phase} {value:.2f}" for phase, value in efficiency.items())
                print(
                    f"{sampler:>7} P={peers:>8}: parallel efficiency t1 / (w tw) of "
                    f"{row['workers']} workers against {runs[0]['workers']}: {text}; wall "
                    f"{row['wall_s'] / runs[0]['wall_s']:.2f}x",
                    flush=True,
                )
        for workers, runs in done.items():
            if len(runs) >= 2:
                peers_run = [r["peers"] for r in runs]
                text = ", ".join(
                    f"{phase[:-2]} {growth_exponent(peers_run, [r[phase] for r in runs]):.2f}"
                    for phase in PHASES
                )
                on = f" ({workers} workers)" if len(args.workers) > 1 else ""
                print(f"{sampler:>7} growth exponent of wall time in P{on}: {text}", flush=True)
            rows.extend(runs)
    for path in args.add:
        rows.extend(added_rows(path))
    if args.out and rows:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.with_suffix(".csv").open("w", newline="") as file:
            columns = list(dict.fromkeys(key for row in rows for key in row))  # every table's
            writer = csv.DictWriter(file, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        write_figure(rows, args.out.with_suffix(".png"))
        print(f"wrote {args.out.with_suffix('.csv')} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
