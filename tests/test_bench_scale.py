"""benchmarks/bench_scale.py end to end on tiny P: its table, its figure, its memory guard."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_scale_benchmark_writes_its_table_and_figure_and_skips_what_would_not_fit(
    tmp_path,
):
    out = tmp_path / "scale"
    done = subprocess.run(
        [sys.executable, "bench_scale.py", "--peers", "40", "80", "1000000",
         "--samplers", "central", "--memory-limit", "4096", "--out", str(out)],
        cwd=BENCHMARKS, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert [int(row["peers"]) for row in rows] == [40, 80]
    assert all(int(row["aggregations"]) > 0 and float(row["peak_mb"]) > 0 for row in rows)
    assert "P= 1000000: skipped, predicted peak" in done.stdout  # not killed half-way
    assert "growth exponent of wall time in P" in done.stdout
    assert out.with_suffix(".png").stat().st_size > 10_000
