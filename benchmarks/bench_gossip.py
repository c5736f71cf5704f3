"""Benchmark decentralised group formation (``groups.sampler = "gossip"``) at scale.

For each size P the whole pipeline runs (synthetic data, ``ROWS_PER_PEER`` rows per peer,
d = 58 with the bias; local training; the SimPy world with gossip group formation, g = 10,
epsilon / epsilon_A = 2 aggregations per peer, full publication; evaluation) in a fresh child
process, so its peak resident memory (ru_maxrss) is its own. Reported per size: aggregations,
wall time per phase, simulated time to the last aggregation, SimPy events (counted by
wrapping ``Environment.schedule``) and events per second of simulation wall time, peak
memory, and messages per aggregation of the sampler (formation protocol and view gossip,
which runs whatever the number of aggregations; the members' submissions and the
publication are the same for every sampler and are not included).

With two sizes or more, the per-peer memory (slope of peak memory in P) extrapolates the
largest P that fits in ``--memory-gib`` GiB.

``--overlays`` instead measures building each overlay kind (default parameters) at P peers:
wall time, peak Python memory while building (the networkx graph dominates; tracemalloc),
the size of the CSR arrays that are kept, and the number of components (Erdős–Rényi with
mean degree 10 leaves about P e^-10 isolated peers: disconnected at P = 100,000).

Usage::

    python benchmarks/bench_gossip.py                        # P = 10,000 and 100,000
    python benchmarks/bench_gossip.py --peers 100000 --json
    python benchmarks/bench_gossip.py --overlays --peers 100000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor

import numpy as np

ROWS_PER_PEER = 10
GROUP_SIZE = 10
AGGREGATIONS_PER_PEER = 2
DEFAULT_SIZES = (10_000, 100_000)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def scenario(peers: int, formation: str = "auto"):
    """The benchmarked scenario at ``peers`` peers (``gossip.formation = formation``)."""
    from p2pdp.config import NetworkConfig, ScenarioConfig
    from p2pdp.data.settings import DataConfig, PartitionConfig
    from p2pdp.learning.settings import EvaluationConfig
    from p2pdp.privacy.settings import PrivacyConfig
    from p2pdp.protocols.settings import GossipConfig, GroupsConfig

    return ScenarioConfig(
        name=f"bench_gossip_{peers}",
        seed=2026,
        data=DataConfig(
            dataset="synthetic",
            synthetic_rows=ROWS_PER_PEER * peers,
            synthetic_test_rows=1000,
            synthetic_features=57,
        ),
        partition=PartitionConfig(n_peers=peers),
        privacy=PrivacyConfig(epsilon=1.0, epsilon_per_aggregation=1.0 / AGGREGATIONS_PER_PEER),
        groups=GroupsConfig(sampler="gossip", group_size=GROUP_SIZE),
        gossip=GossipConfig(formation=formation),
        network=NetworkConfig(latency="exponential"),
        evaluation=EvaluationConfig(split="fixed"),
    )


def run_one(peers: int, formation: str = "auto") -> dict:
    """One size, in the current process."""
    import simpy

    from p2pdp.experiments.run.simulation import simulate
    from p2pdp.sim.world import World

    events = 0
    schedule = simpy.Environment.schedule

    def counting_schedule(self, event, priority=1, delay=0):
        nonlocal events
        events += 1
        schedule(self, event, priority, delay)

    worlds = []
    run = World.run

    def capturing_run(self):
        worlds.append(self)
        run(self)

    simpy.Environment.schedule = counting_schedule
    World.run = capturing_run
    try:
        start = time.perf_counter()
        result = simulate(scenario(peers, formation))
        wall = time.perf_counter() - start
    finally:
        simpy.Environment.schedule = schedule
        World.run = run
    world = worlds[0]
    sampler = world.sampler
    aggregations = max(result.aggregations, 1)
    simulation_s = result.wall_times["simulation"]
    return {
        "peers": peers,
        "formation": type(sampler.formation).__name__,  # which driver ran (auto picks one)
        "aggregations": result.aggregations,
        "aborted_groups": result.aborted_groups,
        "stop_reason": result.stop_reason,
        "mean_error": float(result.evaluation.metrics.errors.mean()),
        "wall_s": wall,
        "training_s": result.wall_times["training"],
        "simulation_s": simulation_s,
        "evaluation_s": result.wall_times["evaluation"],
        "sim_time_s": world.monitor.end_time,
        "events": events,
        "events_per_s": events / simulation_s,
        "events_per_aggregation": events / aggregations,
        "peak_mb": _peak_mb(),
        "attempts": sampler.attempts_started,
        "failed_attempts": sampler.attempts_failed,
        "messages_per_aggregation": (sampler.formation_messages + sampler.gossip_messages)
        / aggregations,
        "formation_messages_per_aggregation": sampler.formation_messages / aggregations,
        "gossip_messages_per_aggregation": sampler.gossip_messages / aggregations,
    }


def overlay_costs(peers: int) -> list[dict]:
    """Build every overlay kind at ``peers`` peers: time, peak traced memory, CSR size."""
    from p2pdp.protocols.settings import OVERLAYS, GossipConfig
    from p2pdp.sim.overlay import build_overlay

    rows = []
    for kind in OVERLAYS:
        config = GossipConfig(overlay=kind, allow_disconnected=True)
        start = time.perf_counter()
        overlay = build_overlay(config, peers, rng=np.random.default_rng(0))
        seconds = time.perf_counter() - start
        tracemalloc.start()  # a second, traced build: tracing slows allocation down
        build_overlay(config, peers, rng=np.random.default_rng(0))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        csr_bytes = overlay.indptr.nbytes + overlay.indices.nbytes
        rows.append(
            {
                "overlay": kind,
                "peers": peers,
                "edges": int(overlay.indices.size // 2),
                "build_s": seconds,
                "peak_build_mb": peak / 2**20,
                "csr_mb": csr_bytes / 2**20,
                "components": overlay.n_components,
            }
        )
    return rows


def run_isolated(function, *arguments):
    """``function(*arguments)`` in a fresh process, so its peak memory is its own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(function, *arguments).result()


def largest_peers(rows: list[dict], memory_gib: float) -> tuple[float, int]:
    """Per-peer memory (MB, slope of peak memory in P) and the P that fits ``memory_gib``."""
    peers = np.array([r["peers"] for r in rows], dtype=float)
    peak = np.array([r["peak_mb"] for r in rows])
    slope, intercept = np.polyfit(peers, peak, 1)
    return float(slope), int((memory_gib * 1024 - intercept) / slope)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=None, help="run only this number of peers")
    parser.add_argument("--json", action="store_true", help="one JSON object per size")
    parser.add_argument("--overlays", action="store_true", help="measure overlay building")
    parser.add_argument(
        "--formation",
        choices=("auto", "messages", "rounds"),
        default="auto",
        help="gossip.formation (auto: rounds from 10,000 peers)",
    )
    parser.add_argument("--memory-gib", type=float, default=24.0, help="memory to extrapolate to")
    args = parser.parse_args(argv)
    sizes = (args.peers,) if args.peers else DEFAULT_SIZES

    if args.overlays:
        for peers in sizes:
            for row in run_isolated(overlay_costs, peers):
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print(
                        f"{row['overlay']:>15} P={row['peers']:>7} edges={row['edges']:>8}: "
                        f"build {row['build_s']:6.2f} s, peak while building "
                        f"{row['peak_build_mb']:7.1f} MB (networkx graph), "
                        f"CSR kept {row['csr_mb']:5.1f} MB, {row['components']} component(s)",
                        flush=True,
                    )
        return 0

    rows = []
    for peers in sizes:
        row = run_isolated(run_one, peers, args.formation)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print(
                f"P={row['peers']:>7} {row['formation']}: aggregations={row['aggregations']:>6} "
                f"(attempts {row['attempts']}, {row['failed_attempts']} did not form) "
                f"wall={row['wall_s']:.1f}s (training {row['training_s']:.1f}, simulation "
                f"{row['simulation_s']:.1f}, evaluation {row['evaluation_s']:.1f}) "
                f"sim time={row['sim_time_s']:.1f}s events={row['events']} "
                f"({row['events_per_aggregation']:.0f} per aggregation) "
                f"({row['events_per_s']:.0f}/s) peak={row['peak_mb']:.0f} MB "
                f"messages/aggregation={row['messages_per_aggregation']:.0f} "
                f"(formation {row['formation_messages_per_aggregation']:.0f}, "
                f"gossip {row['gossip_messages_per_aggregation']:.0f})",
                flush=True,
            )
    if len(rows) >= 2 and not args.json:
        per_peer_mb, fits = largest_peers(rows, args.memory_gib)
        print(
            f"memory per peer {per_peer_mb * 1024:.1f} KiB: about {fits:,} peers fit in "
            f"{args.memory_gib:g} GiB (linear extrapolation, not run)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
