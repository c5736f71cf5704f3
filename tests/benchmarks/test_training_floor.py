"""benchmarks/training_floor.py end to end on a small stream: its per-block steps, the
measured passes of a training in blocks, and the prediction built from the steps."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_floor_is_the_blocks_times_one_draw_transform_and_fit_measured_in_the_run():
    done = subprocess.run(
        [sys.executable, "training_floor.py", "--peers", "10000", "--at", "40000",
         "--sample", "1", "--workers", "2", "--json"],
        cwd=BENCHMARKS, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout.splitlines()[-1])
    steps = row["steps_ms"]
    assert all(steps[step] > 0 for step in ("bounds", "draw", "transform", "fits", "sums"))
    assert steps["normals"] < steps["lognormal"] < steps["draw"]  # parts of the draw
    names = [name for name, _, _ in row["measured_passes"]]
    assert names == [
        "training: bounds of the rows, pass 1 over the rows",
        "training: local models, pass 2 over the rows",
        "training: centralised reference, pass 3 over the rows",
    ]
    assert row["measured_cpu_s"] > 0
    at = row["at_predicted"]
    assert at["blocks"] == math.ceil(40000 * 20 / 65536) == 13
    per_block = (steps["draw"] + steps["transform"] + steps["fits"]) / 1e3
    assert abs(at["floor"] - at["blocks"] * per_block) <= 1e-9 * at["floor"]
    assert abs(row["floor_wall_s"] - at["floor"] / 2) <= 1e-12 * at["floor"]
    # every block kept at 40,000 peers: the reference's later pass draws nothing again
    assert at["kept_blocks"] == at["blocks"] and at["redraws"] == 0
