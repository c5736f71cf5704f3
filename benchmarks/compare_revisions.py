"""Run one benchmark under two git revisions, interleaved, and print the ratios.

A refactor must not slow the simulator down; measuring "before" and "after" minutes apart on
a shared machine mostly measures the load. This script checks both revisions out into
temporary worktrees and runs the same benchmark command under each, alternating
(base, head, head, base, ...) so that both see the same load, then prints the median of every
numeric field of the benchmark's JSON lines for each revision and the ratio head / base.

Usage::

    python benchmarks/compare_revisions.py --base b61418c --rounds 3 -- \\
        benchmarks/bench_simulation.py --dataset synthetic --peers 10000 --json

The benchmark must print one JSON object per line (``--json``); lines are matched by their
position. Both revisions run with ``PYTHONPATH`` pointing at their worktree and the same
interpreter and packages.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _worktree(revision: str, where: Path) -> Path:
    path = where / revision.replace("/", "_")
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), revision],
        check=True,
        capture_output=True,
    )
    return path


def _run(tree: Path, command: list[str]) -> list[dict]:
    env = os.environ | {"PYTHONPATH": str(tree)}
    script, *args = command
    result = subprocess.run(
        [sys.executable, str(tree / script), *args],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the baseline revision (e.g. main)")
    parser.add_argument("--head", default="HEAD", help="the revision to compare (default HEAD)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each revision")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = parser.parse_args()
    command = [c for c in args.command if c != "--"]
    if not command:
        parser.error("give the benchmark after --, e.g. -- benchmarks/bench_sweep.py --json")
    with tempfile.TemporaryDirectory() as scratch:
        trees = {
            name: _worktree(rev, Path(scratch))
            for name, rev in (("base", args.base), ("head", args.head))
        }
        try:
            runs: dict[str, list[list[dict]]] = {"base": [], "head": []}
            for round_ in range(args.rounds):
                order = ("base", "head") if round_ % 2 == 0 else ("head", "base")
                for name in order:
                    runs[name].append(_run(trees[name], command))
                    print(f"round {round_ + 1}: {name} done", file=sys.stderr, flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                    capture_output=True,
                )
    print(f"base {args.base} vs head {args.head}, median of {args.rounds} interleaved runs")
    for line, base_line in enumerate(runs["base"][0]):
        label = {k: v for k, v in base_line.items() if not isinstance(v, (int, float))}
        print(f"\n[{line}] {label}")
        print(f"{'field':<28}{'base':>14}{'head':>14}{'head/base':>11}")
        for field, value in base_line.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            base = statistics.median(run[line][field] for run in runs["base"])
            head = statistics.median(run[line][field] for run in runs["head"])
            ratio = head / base if base else float("nan")
            print(f"{field:<28}{base:>14.4g}{head:>14.4g}{ratio:>11.3f}")


if __name__ == "__main__":
    main()
