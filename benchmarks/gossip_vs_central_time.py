"""The simulation phase of gossip formation against the central sampler's, in one process.

    python benchmarks/gossip_vs_central_time.py --peers 100000 --workers 2 --repeats 3

The workload of ``bench_scale.py`` (synthetic, 20 rows per peer, d = 58, g = 10, epsilon = 1,
epsilon_A = 0.1, full publication, one fold) is trained once; then each repeat simulates it
with the central sampler and with gossip, alternately (the order flips at each repeat, so a
change of the machine's load weighs on both), each in a process forked for it (as
``bench_scale.py`` runs each in a fresh process: gossip pays numba's import there), and
prints each run's simulation phase (``RunResult.wall_times["simulation"]``, wall seconds,
and the CPU seconds of the driver's own process in that phase, not its forked workers': on
a machine shared with other work, the CPU is the steadier measure of the critical path),
the gossip / central ratios of each pair and their medians, the load average and each run's
row (``mean_error``, ``aggregations``, ``messages``, ``sim_time``, printed with ``repr``:
equal to the last digit across revisions and worker counts). The first pair warms the
numba caches and is not counted unless ``--repeats 1``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import statistics
import sys
import time
from queue import Empty
from typing import Any

import bench_simulation

from p2pdp.core.parallel import local_workers
from p2pdp.experiments.run import phases
from p2pdp.experiments.run.simulation import simulate
from p2pdp.tasks.pipeline import prepare_peers


def config_of(peers: int, sampler: str) -> Any:
    """``bench_scale.py``'s configuration (``bench_simulation.py``'s synthetic workload) at
    ``peers`` peers with ``sampler``."""
    return bench_simulation.config_of("synthetic", peers, sampler=sampler)


def _simulated(config: Any, trained: Any, queue: Any) -> None:
    """Simulate ``config`` (one fold, ``trained``); put its simulation phase's wall and CPU
    seconds and its row on ``queue``."""
    cpu: dict[str, float] = {}
    timed = phases._Phases.phase

    @contextlib.contextmanager
    def phase(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        with timed(self, name, *args, **kwargs):
            yield
        cpu[name] = time.process_time() - start

    phases._Phases.phase = phase  # type: ignore[method-assign]
    result = simulate(config, fold=0, trained=trained)
    row = {
        "mean_error": result.evaluation.metrics.summary()["mean_error"],
        "aggregations": result.aggregations,
        "messages": result.messages_sent,
        "sim_time": result.sim_time,
    }
    queue.put((result.wall_times["simulation"], cpu["simulation"], row))


def _answer(child: Any, queue: Any) -> Any:
    """What ``child`` put on ``queue``; an error if it died without an answer."""
    while True:
        try:
            answer = queue.get(timeout=1.0)
        except Empty:
            if not child.is_alive():
                raise RuntimeError(f"the run died (exit code {child.exitcode})") from None
        else:
            child.join()
            return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2, help="local worker processes")
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs after the warm-up")
    args = parser.parse_args(argv)
    if args.peers < 10 or args.workers < 1 or args.repeats < 1:
        parser.error("--peers >= 10, --workers >= 1 and --repeats >= 1")
    configs = {name: config_of(args.peers, name) for name in ("central", "gossip")}
    walls, cpus = [], []
    context = multiprocessing.get_context("fork")
    with local_workers(args.workers):
        trained = prepare_peers(configs["central"], fold=0)
        assert trained.centralized is not None  # read here, not in each forked run
        for repeat in range(args.repeats + 1):
            order = ("central", "gossip") if repeat % 2 == 0 else ("gossip", "central")
            seconds, cpu = {}, {}
            for name in order:
                queue = context.Queue()
                child = context.Process(target=_simulated, args=(configs[name], trained, queue))
                child.start()
                seconds[name], cpu[name], row = _answer(child, queue)
                print(
                    f"  {name:>7}: simulation {seconds[name]:7.2f} s wall "
                    f"{cpu[name]:7.2f} s CPU  {row!r}",
                    flush=True,
                )
            wall = seconds["gossip"] / seconds["central"]
            used = cpu["gossip"] / cpu["central"]
            warm = "" if repeat or args.repeats == 1 else " (warm-up, not counted)"
            if not warm:
                walls.append(wall)
                cpus.append(used)
            load = os.getloadavg()[0]
            print(
                f"pair {repeat}: gossip / central wall {wall:.2f} CPU {used:.2f}  "
                f"load {load:.1f}{warm}",
                flush=True,
            )
    for what, ratios in (("wall", walls), ("CPU", cpus)):
        print(
            f"P = {args.peers}, {args.workers} workers: gossip / central simulation {what} "
            f"median {statistics.median(ratios):.2f} over {len(ratios)} pairs "
            f"(each: {', '.join(f'{r:.2f}' for r in ratios)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
