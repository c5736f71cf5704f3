"""Wall time of `p2pdp run NAME` for each shipped scenario, as a user runs it (README's column).

    python benchmarks/scenario_times.py                       # every shipped scenario, --jobs 2
    python benchmarks/scenario_times.py quickstart peer_count --jobs 1

Each scenario runs as a separate `p2pdp run` process (interpreter start-up, the sweep and the
report included) into a temporary folder. Prints one Markdown row per scenario: cells, wall
seconds, CPU seconds (the process and its workers: other load on the machine inflates the wall
time but hardly this), and the machine: CPU model, cores, and the 1-minute load average before
the run, so a number is never quoted without the machine that gave it. Needs the data files
(``P2PDP_DATA_HOME``).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.scenarios.scenario import shipped_scenarios_dir


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="scenarios (default: every shipped one)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv)
    command = shutil.which("p2pdp", path=str(Path(sys.executable).parent)) or "p2pdp"
    names = args.names or sorted(path.stem for path in shipped_scenarios_dir().glob("*.toml"))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("| scenario | cells | wall s | CPU s | load before |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as out:
            cpu = children_cpu_seconds()
            start = time.perf_counter()
            done = subprocess.run(
                [
                    command,
                    "run",
                    name,
                    "--out",
                    out,
                    "--jobs",
                    str(args.jobs),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            if done.returncode != 0:
                sys.exit(f"p2pdp run {name} failed:\n{done.stderr}")
            wall = time.perf_counter() - start
            cpu = children_cpu_seconds() - cpu
            cells = len(read_results(out))
        print(f"| `{name}` | {cells} | {wall:.1f} | {cpu:.1f} | {load:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
