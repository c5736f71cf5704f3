"""Network DP's per-pair conversion alone: ``gdp_epsilon`` over many distinct ``mu`` (seconds).

Draws ``--pairs`` values of ``mu`` log-uniformly in ``[1e-3, 30]`` (seed 0: the range of the
pairs of a run, distant pairs to neighbours of a few steps) and times
:func:`p2pdp.privacy.gdp.gdp_epsilon` at delta 1e-5 in this process (what
:func:`p2pdp.protocols.network_dp.pairwise_epsilon` does with every pair's coefficient). Prints
one JSON line (``wall_s``, ``cpu_s``, the sum of the epsilons as a check that both revisions
compute the same thing), for ``benchmarks/compare_revisions.py``. Usage:
``python benchmarks/gdp_conversion.py --pairs 1000000``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from p2pdp.privacy.gdp import gdp_epsilon


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    args = parser.parse_args()
    mu = np.exp(np.random.default_rng(0).uniform(np.log(1e-3), np.log(30.0), args.pairs))
    start, wall = os.times(), time.perf_counter()
    epsilon = gdp_epsilon(mu, 1e-5)
    wall, end = time.perf_counter() - wall, os.times()
    row = {
        "pairs": args.pairs,
        "wall_s": wall,
        "cpu_s": sum(end[:2]) - sum(start[:2]),
        "sum_epsilon": float(epsilon.sum()),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
