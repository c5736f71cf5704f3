"""Benchmark the simulator: wall time and peak memory per phase, and growth with peers.

Each configuration runs in a fresh child process so its peak resident memory (ru_maxrss) is
its own. Phases: training (load, split, preprocess, partition, fit every local model and the
centralized reference), simulation (SimPy world), evaluation (ensembles on the test rows).
Each phase's memory is the process's peak by the end of it (``peak_mb_after_training``,
``peak_mb_after_simulation``, ``peak_mb``: the peak can only rise, so a phase that needs
more than the ones before it raises it); ``peak_worker_mb`` is the largest worker process's.

Usage::

    python benchmarks/bench_simulation.py                      # the default table
    python benchmarks/bench_simulation.py --dataset synthetic --peers 100000 --json

Default table: Spambase (P = 100, g = 10, epsilon = 1, epsilon_A = 0.1, full publication, one
fold), then synthetic data (d = 58 with the bias, 20 rows per peer, each peer holding
consecutive rows: ``partition.scheme = "contiguous"``, as ``peer_count_1m``) for P = 1,000,
10,000 and 100,000, and the fitted growth exponent of wall time in P (least squares on
log-log).

``--protocol NAME`` (repeatable) runs the same world with each protocol (iterative ones: 50
rounds, Gaussian steps calibrated to epsilon = 1, delta = 1e-5, random-regular overlay of
degree 10, the test error recorded every 10 rounds) and prints each one's wall time as a ratio
to the first protocol given, e.g. ``--protocol one-shot --protocol dpsgd``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
from queue import Empty
from typing import Any

import numpy as np

ROWS_PER_PEER = 20


def _peak_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident memory (MiB) of this process, or (RUSAGE_CHILDREN) of its largest
    finished worker, shared copy-on-write pages included."""
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB


def config_of(
    dataset: str,
    peers: int,
    group_size: int = 10,
    publication: str = "full",
    sampler: str = "central",
    protocol: str = "one-shot",
) -> Any:
    """The benchmark's configuration (a ``ScenarioConfig``): epsilon = 1, epsilon_A = 0.1, on
    ``dataset`` (``synthetic``: ``ROWS_PER_PEER`` rows per peer, d = 58 with the bias)."""
    from p2pdp.config import ScenarioConfig
    from p2pdp.data.settings import DataConfig, PartitionConfig
    from p2pdp.learning.settings import EvaluationConfig
    from p2pdp.privacy.settings import PrivacyConfig
    from p2pdp.protocols.settings import GroupsConfig, PublicationConfig

    if dataset == "synthetic":
        data = DataConfig(
            dataset="synthetic",
            synthetic_rows=ROWS_PER_PEER * peers,
            synthetic_test_rows=2000,
            synthetic_features=57,
        )
        evaluation = EvaluationConfig(split="fixed")
    else:
        data = DataConfig(dataset=dataset)
        evaluation = EvaluationConfig(split="fixed" if dataset == "adult" else "cv")
    iterative = protocol != "one-shot"
    return ScenarioConfig(
        seed=2026,
        data=data,
        # synthetic rows are iid draws: shards of consecutive rows are iid too, and let the
        # training draw, fit and drop the rows block by block (p2pdp.tasks.streamed)
        partition=PartitionConfig(
            n_peers=peers, scheme="contiguous" if dataset == "synthetic" else "iid"
        ),
        privacy=PrivacyConfig(
            epsilon=1.0,
            epsilon_per_aggregation=0.1,
            **({"mechanism": "gaussian", "delta": 1e-5} if iterative else {}),
        ),
        groups=GroupsConfig(group_size=group_size, sampler=sampler),
        publication=PublicationConfig(mode=publication),
        evaluation=evaluation,
        protocol={"name": protocol, **({"rounds": 50, "eval_every": 10} if iterative else {})},
    )


def run_one(
    dataset: str,
    peers: int,
    group_size: int,
    publication: str,
    sampler: str = "central",
    workers: int = 1,
    protocol: str = "one-shot",
) -> dict:
    """One configuration (:func:`config_of`), in the current process."""
    from p2pdp.core.parallel import local_workers
    from p2pdp.experiments.run import iterative as iterative_run
    from p2pdp.experiments.run import oneshot, phases
    from p2pdp.experiments.run.simulation import simulate
    from p2pdp.tasks.pipeline import prepare_peers

    config = config_of(dataset, peers, group_size, publication, sampler, protocol)
    peaks = {}  # peak memory (MiB) by the start of each phase simulate() names
    named = phases.set_phase

    def phase(name: str, counter: Any = None) -> None:
        peaks.setdefault(name, _peak_mb())
        named(name, counter)

    for module in (phases, oneshot, iterative_run):  # every module of a run that names a phase
        module.set_phase = phase
    with local_workers(workers):  # local processes for training and evaluation
        start = time.perf_counter()
        trained = prepare_peers(config, fold=0)
        training_s = time.perf_counter() - start
        peak_training = _peak_mb()
        result = simulate(config, fold=0, trained=trained)
    wall = dict(result.wall_times, training=training_s)
    return {
        "dataset": dataset,
        "peers": peers,
        "group_size": group_size,
        "publication": publication,
        "sampler": sampler,
        "workers": workers,
        "protocol": protocol,
        "aggregations": result.aggregations,
        "mean_error": result.evaluation.metrics.summary()["mean_error"],
        "centralized_error": result.evaluation.centralized_error,
        "training_s": wall["training"],
        "simulation_s": wall["simulation"],
        "evaluation_s": wall["evaluation"],
        "wall_s": sum(wall.values()),
        "sim_time_s": result.sim_time,
        "messages": result.messages_sent,
        # the memory budget of each phase: the peak by its end (ru_maxrss never falls)
        "peak_mb_after_training": peak_training,
        "peak_mb_after_simulation": peaks.get("evaluation", float("nan")),
        "peak_mb": _peak_mb(),
        "peak_worker_mb": _peak_mb(resource.RUSAGE_CHILDREN),
    }


def _child(args: tuple, queue: mp.Queue) -> None:
    queue.put(run_one(*args))


def run_isolated(*args: Any) -> dict:
    """:func:`run_one` (same arguments) in a fresh process, so peak memory is its own."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(args, queue))
    process.start()
    while True:  # a child killed by the kernel (out of memory) never answers: do not hang
        try:
            result = queue.get(timeout=1.0)
            break
        except Empty:
            if not process.is_alive():
                raise RuntimeError(
                    f"{args}: the benchmark process died (exit code "
                    f"{process.exitcode}; -9 is the kernel's out-of-memory kill)"
                ) from None
    process.join()
    return result


def growth_exponent(peers: list[int], seconds: list[float]) -> float:
    """Slope of log(wall time) against log(P): 1.0 means linear growth."""
    return float(np.polyfit(np.log(peers), np.log(seconds), 1)[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=None, help="spambase, australian, adult or synthetic")
    parser.add_argument("--peers", type=int, default=None, help="number of peers P")
    parser.add_argument("--group-size", type=int, default=10)
    parser.add_argument("--publication", choices=("group", "full"), default="full")
    parser.add_argument("--json", action="store_true", help="one JSON object per configuration")
    parser.add_argument(
        "--workers", type=int, default=1, help="local processes for training and evaluation"
    )
    parser.add_argument(
        "--protocol",
        action="append",
        default=None,
        help="protocol.name (repeatable; ratios are to the first one)",
    )
    args = parser.parse_args(argv)

    if args.dataset or args.peers or args.protocol:
        dataset = args.dataset or "synthetic"
        peers = args.peers or (100 if dataset != "synthetic" else 1000)
        configs = [
            (dataset, peers, args.group_size, args.publication, "central", args.workers, protocol)
            for protocol in args.protocol or ["one-shot"]
        ]
    else:
        configs = [("spambase", 100, 10, args.publication)] + [
            ("synthetic", p, args.group_size, args.publication) for p in (1000, 10_000, 100_000)
        ]
    rows = []
    for config in configs:
        row = run_isolated(*config)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            ratio = row["wall_s"] / rows[0]["wall_s"]
            print(
                f"{row['protocol']:>15} x{ratio:.2f} "
                f"{row['dataset']:>9} P={row['peers']:>7} g={row['group_size']:>3} "
                f"{row['publication']:>5}: aggregations={row['aggregations']:>6} "
                f"mean error={row['mean_error']:.3f}  training={row['training_s']:.2f}s "
                f"simulation={row['simulation_s']:.2f}s evaluation={row['evaluation_s']:.2f}s "
                f"total={row['wall_s']:.2f}s  peak={row['peak_mb']:.0f} MB",
                flush=True,
            )
    synthetic = [r for r in rows if r["dataset"] == "synthetic" and r["protocol"] == "one-shot"]
    if len(synthetic) >= 2 and not args.json:
        peers = [r["peers"] for r in synthetic]
        for phase in ("training_s", "simulation_s", "evaluation_s", "wall_s"):
            exponent = growth_exponent(peers, [r[phase] for r in synthetic])
            print(f"growth exponent of {phase[:-2]} time in P: {exponent:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
