"""benchmarks/bench_scale.py end to end on tiny P: its table, its figure, its memory guard."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_scale_benchmark_writes_its_table_and_figure_and_skips_what_would_not_fit(
    tmp_path,
):
    out = tmp_path / "scale"
    done = subprocess.run(
        [sys.executable, "bench_scale.py", "--peers", "40", "80", "1000000",
         "--samplers", "central", "--memory-limit", "4096", "--out", str(out),
         "--workers", "1", "2"],
        cwd=BENCHMARKS, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    runs = [(int(row["peers"]), int(row["workers"])) for row in rows]
    assert runs == [(40, 1), (80, 1), (40, 2), (80, 2)]
    assert all(int(row["aggregations"]) > 0 and float(row["peak_mb"]) > 0 for row in rows)
    assert all(float(row["load_mean"]) > 0 for row in rows)  # how busy the machine was
    for row in rows:  # each phase's memory budget: the peak by its end, which never falls
        budget = [
            float(row[f"peak_mb{phase}"]) for phase in ("_after_training", "_after_simulation", "")
        ]
        assert 0 < budget[0] <= budget[1] <= budget[2], budget
    assert "(by the end of training " in done.stdout
    assert "P= 1000000: skipped, predicted peak" in done.stdout  # not killed half-way
    assert "growth exponent of wall time in P (2 workers)" in done.stdout
    for peers in (40, 80):  # each phase's t1 / (w tw), printed, from the rows written
        one, two = (row for row in rows if int(row["peers"]) == peers)
        expected = float(one["training_s"]) / (2 * float(two["training_s"]))
        assert (
            f"P={peers:>8}: parallel efficiency t1 / (w tw) of 2 workers against 1: "
            f"training {expected:.2f}, simulation"
        ) in done.stdout
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_rows_of_an_earlier_table_join_the_new_table_and_figure(tmp_path):
    def scale(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "bench_scale.py", "--samplers", "central", *args],
            cwd=BENCHMARKS, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    earlier = tmp_path / "earlier"  # a long run measured on its own
    assert scale("--peers", "80", "--out", str(earlier)).returncode == 0
    out = tmp_path / "scale"
    done = scale("--peers", "40", "--add", str(earlier.with_suffix(".csv")), "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert [int(row["peers"]) for row in rows] == [40, 80]
    assert rows[1] == next(csv.DictReader(earlier.with_suffix(".csv").open()))

    busy = tmp_path / "busy.csv"  # a row timed on a busy machine, from an older table
    (line,) = list(csv.DictReader(earlier.with_suffix(".csv").open()))
    del line["load_mean"]
    with busy.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(line))
        writer.writeheader()
        writer.writerow(line)
    done = scale("--peers", "40", "--add", str(busy), "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert rows[1]["load_mean"] == "" and float(rows[0]["load_mean"]) > 0
    assert out.with_suffix(".png").stat().st_size > 10_000
    joined = tmp_path / "joined"  # no peers to run: the tables joined, nothing measured
    done = scale("--peers", "--add", str(earlier.with_suffix(".csv")), str(out.with_suffix(".csv")),
                 "--out", str(joined))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [row["peers"] for row in csv.DictReader(joined.with_suffix(".csv").open())] == [
        "80", "40", "80"]  # fmt: skip
    nothing = scale("--peers", "--out", str(joined))  # no peers and no table: refused
    assert nothing.returncode == 2 and "--peers with no value runs nothing" in nothing.stderr

    other = tmp_path / "other.csv"
    other.write_text("peers,wall_s\n100,1.5\n")
    refused = scale("--peers", "40", "--add", str(other))
    assert refused.returncode != 0
    assert "not a bench_scale table, no column ['training_s'" in refused.stderr
