"""Network DP: the filtered bound's cost as the peers grow (CPU seconds, one BLAS thread).

Per number of peers ``P`` (``--peers``), a random 10-regular overlay (seed 0, Metropolis-
Hastings weights) and a full-delivery trace of ``--rounds`` rounds of ``--exchanges``
exchanges (Muffliato's shape; ``--exchanges 1`` is D-PSGD's), unequal step scales, decay 0.97:
prints ``filter_work`` (the size ``MAX_FILTER_WORK`` limits), the wall and CPU seconds (its
``--workers`` processes' included) of
:func:`p2pdp.protocols.network_dp_filter.filtered_coefficients`, the mean coefficient and the
wall seconds of converting every pair's coefficient to its epsilon
(:func:`p2pdp.protocols.network_dp.pairwise_epsilon`, delta 1e-5, one process); ``--json``
prints one JSON line per ``P`` instead (for ``benchmarks/compare_revisions.py``). Run it
with one BLAS thread, as the runner does (``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1``): threads
spinning on a loaded machine multiply the CPU time. The guide's cost paragraph
(docs/guide/privacy.md) quotes it. Usage:
``python benchmarks/network_dp_cost.py --peers 100 200 300 --rounds 20 --exchanges 5``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import networkx as nx
import numpy as np
import scipy.sparse as sp

from p2pdp.protocols import network_dp, network_dp_filter, views
from p2pdp.protocols.mixing import Mixing


def overlay(peers: int, degree: int = 10) -> Mixing:
    """A random ``degree``-regular overlay of ``peers`` (seed 0) with its averaging weights."""
    graph = nx.random_regular_graph(degree, peers, seed=0)
    adjacency = sp.csr_array(nx.to_scipy_sparse_array(graph, nodelist=range(peers)))
    adjacency.sort_indices()
    return Mixing.metropolis_hastings(adjacency.indptr, adjacency.indices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[100, 200])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--exchanges", type=int, default=5, help="exchanges a round")
    parser.add_argument("--workers", type=int, default=1, help="processes of the filter")
    parser.add_argument(
        "--every-round", action="store_true",
        help="filter every round of a periodic run (steady=False), for comparison",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON line per number of peers")
    args = parser.parse_args()
    if not args.json:
        print(f"{'peers':>6s} {'work':>9s} {'wall s':>8s} {'cpu s':>8s} {'mean kappa':>11s} eps s")
    for peers in args.peers:
        mixing = overlay(peers)
        trace = views.full_delivery_trace(mixing, args.rounds, args.exchanges)
        scales = np.linspace(0.5, 1.5, peers)
        start, wall = os.times(), time.perf_counter()
        kappa = network_dp_filter.filtered_coefficients(
            trace, mixing, scales=scales, decay=0.97, workers=args.workers,
            steady=not args.every_round,
        )  # fmt: skip
        wall, end = time.perf_counter() - wall, os.times()
        cpu = sum(end[:4]) - sum(start[:4])  # this process's and its workers'
        work = network_dp_filter.filter_work(trace, mixing)
        convert = time.perf_counter()
        epsilon = network_dp.pairwise_epsilon(kappa, sensitivity_over_sigma=0.5, delta=1e-5)
        convert = time.perf_counter() - convert
        row = {
            "peers": peers,
            "filter_work": work,
            "filter_wall_s": wall,
            "filter_cpu_s": cpu,
            "mean_kappa": float(np.nanmean(kappa)),
            "epsilon_wall_s": convert,
            "max_epsilon": float(np.nanmax(epsilon)),
        }
        if args.json:
            print(json.dumps(row))
        else:
            print(
                f"{peers:6d} {work:9.2e} {wall:8.1f} {cpu:8.1f} {row['mean_kappa']:11.4f} "
                f"{convert:5.1f}"
            )


if __name__ == "__main__":
    main()
