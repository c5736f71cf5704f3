"""The simulation phase and what it keeps per release, at up to ten million peers, without the
training: time and memory of the one-shot run, its outcome and its releases table.

    python benchmarks/bench_releases.py --peers 10000000 --workers 2 --json

The world is ``bench_simulation.py``'s synthetic workload (d = 58 with the bias, g = 10,
epsilon = 1, epsilon_A = 0.1: 10 aggregations per peer, full publication, central sampler,
the batched driver) with stand-in local models: (P, 58) float64 drawn from a seeded normal,
every shard 20 rows, so the groups, the releases and every array the simulation keeps have
the real run's shapes, and the minutes of training of ``peer_count_10m`` are skipped (the
models' values change the published numbers, not their count or size). Phases, each with its
wall time and the process's resident memory at its end and peak (``ru_maxrss``) by then:

- ``models``: the stand-in models (P x 58 x 8 bytes: 4.6 GB at 10^7);
- ``simulation``: ``World.run`` (:func:`p2pdp.sim.waves.run_waves`);
- ``outcome``: what the task is handed (:func:`p2pdp.experiments.run.oneshot._outcome`);
- ``table``: the ``releases`` table's CSV text, made block by block as the results store
  writes it (its bytes counted, not written).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np


def _memory() -> tuple[float, float]:
    """(resident now, peak so far) of this process, GiB."""
    with open("/proc/self/statm") as file:
        resident = int(file.read().split()[1]) * resource.getpagesize()
    return resident / 2**30, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def run(peers: int, workers: int) -> dict:
    from bench_simulation import config_of

    from p2pdp.core.parallel import local_workers
    from p2pdp.experiments.results.tables import ColumnTable
    from p2pdp.experiments.run.oneshot import _outcome
    from p2pdp.experiments.run.result import ReleaseLog
    from p2pdp.sim.world import World
    from p2pdp.tasks import make_task, release_path, sensitivity_of

    config = config_of("synthetic", peers)  # bench_simulation's synthetic workload
    row: dict = {"peers": peers, "workers": workers}

    def phase(name: str, start: float) -> None:
        row[f"{name}_s"] = time.perf_counter() - start
        row[f"{name}_rss_gib"], row[f"{name}_peak_gib"] = _memory()

    task = make_task(config)
    start = time.perf_counter()
    models = np.random.default_rng(0).standard_normal((peers, 58))
    sizes = np.full(peers, 20, dtype=np.int64)
    phase("models", start)
    with local_workers(workers):
        start = time.perf_counter()
        _, releaser, rngs = release_path(config, task, 58, fold=0, repetition=0)
        log = ReleaseLog()
        world = World(
            config,
            models,
            sizes,
            releaser=releaser,
            sensitivity=sensitivity_of(task, config.privacy.min_shard_size),
            rngs=rngs,
            observers=(log,),
        )
        world.run()
        phase("simulation", start)
    row["releases"] = len(world.releases)
    start = time.perf_counter()
    outcome = _outcome(world, 58)
    phase("outcome", start)
    row["published_gib"] = outcome.published.nbytes / 2**30
    start = time.perf_counter()
    n = len(log.rows)
    table = ColumnTable({"fold": [0] * n, **log.rows.columns()})
    row["table_bytes"] = sum(len(text) for text in table.csv_blocks("p0-f0-r0"))
    phase("table", start)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    row = run(args.peers, args.workers)
    if args.json:
        print(json.dumps(row), flush=True)
    else:
        for name in ("models", "simulation", "outcome", "table"):
            print(
                f"P={args.peers:>9} {name:>10}: {row[f'{name}_s']:8.1f} s, resident "
                f"{row[f'{name}_rss_gib']:5.2f} GiB, peak {row[f'{name}_peak_gib']:5.2f} GiB",
                flush=True,
            )
        print(f"{row['releases']} releases, releases table {row['table_bytes'] / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
