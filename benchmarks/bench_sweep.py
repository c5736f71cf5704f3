"""Wall time of a whole sweep with 1, 2, ... local workers, end to end (pool start-up included).

    python benchmarks/bench_sweep.py                      # spambase_group_vs_full, 560 cells
    python benchmarks/bench_sweep.py --folds 2 --jobs 1 2 --json
    python benchmarks/bench_sweep.py --profile            # where one cell's time goes
    python benchmarks/bench_sweep.py --folds 1 --jobs 1 --set evaluation.vote=average

Prints, per worker count: cells, seconds, cells per second and the speed-up over the first
worker count; checks that every worker count wrote identical results rows (up to the
``wall_*`` timing columns). ``cpu_seconds`` (this process plus its workers) is the work done,
a number that other load on the machine does not inflate much, unlike the wall time. Needs
the data files (``P2PDP_DATA_HOME``).

Against an earlier revision (say the dispatch of one task per training key, before cells
became the unit of work), interleaved in one run so both see the same load::

    python benchmarks/compare_revisions.py --base REV -- benchmarks/bench_sweep.py --jobs 1 2 --json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

# The workload and the libraries its modules import only where first used (so that a typo is
# refused before they load) are imported before any timer starts: it times the sweep, not them.
import scipy.optimize
import scipy.special  # noqa: F401
import sklearn.linear_model
import sklearn.metrics
import sklearn.model_selection  # noqa: F401
from threadpoolctl import threadpool_limits

import p2pdp.tasks.logistic.task  # noqa: F401
from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.run.cells import make_cells
from p2pdp.experiments.run.runner import run_experiment
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import load_scenario
from p2pdp.tasks.pipeline import prepare_peers


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its reaped worker processes."""
    own, workers = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


def _rows_without_timing(directory: Path) -> list[dict[str, str]]:
    return [
        {k: v for k, v in row.items() if not k.startswith("wall_")}
        for row in read_results(directory)
    ]


def _profile_one_cell(scenario_name: str, overrides: list[str]) -> None:
    """cProfile the middle cell of the grid (training shared, so profiled separately)."""
    scenario = load_scenario(scenario_name, overrides)
    cells = make_cells(scenario)
    cell = cells[len(cells) // 2]
    print(f"profiling cell {cell.cell_id}: {scenario.points[cell.point].settings}")
    with threadpool_limits(limits=1):
        start = time.perf_counter()
        trained = prepare_peers(cell.config, fold=cell.fold, repetition=cell.repetition)
        print(f"prepare_peers (shared by the fold's cells): {time.perf_counter() - start:.3f} s")
        simulate(cell.config, fold=cell.fold, trained=trained)  # warm-up
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        result = simulate(cell.config, fold=cell.fold, trained=trained)
        profiler.disable()
        print(f"simulate: {time.perf_counter() - start:.3f} s; phases {result.wall_times}")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    print(text.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="spambase_group_vs_full")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="worker counts")
    parser.add_argument("--folds", type=int, help="run only the first N folds")
    parser.add_argument("--json", action="store_true", help="one JSON object per worker count")
    parser.add_argument("--profile", action="store_true", help="cProfile one cell and exit")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting"
    )
    args = parser.parse_args(argv)
    overrides = [f"evaluation.folds={list(range(args.folds))}"] if args.folds else []
    overrides += args.set
    if args.profile:
        _profile_one_cell(args.scenario, overrides)
        return 0
    scenario = load_scenario(args.scenario, overrides)
    baseline_seconds = None
    baseline_rows = None
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in args.jobs:
            out = Path(tmp) / f"jobs{jobs}"
            cpu_before = _cpu_seconds()
            summary = run_experiment(scenario, out, jobs=jobs, force=True)
            cpu = _cpu_seconds() - cpu_before
            rows = _rows_without_timing(out)
            baseline_seconds = baseline_seconds or summary.seconds
            baseline_rows = baseline_rows or rows
            record = {
                "scenario": scenario.name,
                "jobs": jobs,
                "cells": summary.cells,
                "seconds": round(summary.seconds, 2),
                "cells_per_second": round(summary.cells / summary.seconds, 2),
                "speedup": round(baseline_seconds / summary.seconds, 2),
                "cpu_seconds": round(cpu, 2),
                "rows_identical_to_first": rows == baseline_rows,
            }
            if args.json:
                print(json.dumps(record))
            else:
                print(
                    f"{record['scenario']}: jobs={jobs:<3} {record['cells']} cells in "
                    f"{record['seconds']:7.2f} s  {record['cells_per_second']:6.2f} cells/s  "
                    f"speed-up x{record['speedup']:.2f}  CPU {record['cpu_seconds']:.1f} s  "
                    "identical rows: "
                    f"{record['rows_identical_to_first']}"
                )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
