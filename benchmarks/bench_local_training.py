"""Batched exact local training against a per-peer scikit-learn loop, in the same run.

For each configuration (number of peers P, rows per peer) every peer's exact L2-regularised
logistic regression model is computed three ways:

* ``batched``: :func:`p2pdp.learning.models.fit_local_models` with ``method="batched"``;
* ``per_peer``: the same Newton code one peer at a time (``method="per_peer"``);
* ``sklearn``: :func:`p2pdp.learning.models.fit_local_models_sklearn` (Newton-Cholesky, tol 1e-12).

Data: P <= 1,150 (so P = 100 and 1,000) use equal random shards of the 4,601 Spambase rows
(min-max scaled, bias column appended, rows projected onto the unit ball: d = 58; loaded
with ``p2pdp.data.benchmarks``, so set ``P2PDP_DATA_HOME``); larger P, any ``--rows-per-peer``, or
a missing data file, use synthetic rows of the same shape (sparse non-negative features,
bias, unit ball, labels from a noisy linear model). When more than ``--max-reference-peers`` peers
are asked for, ``per_peer`` and ``sklearn`` are timed on that many peers and scaled up
linearly; the output says so (``sklearn_extrapolated: true``) and ``max_coef_diff`` is then
over the timed peers.

Usage::

    python benchmarks/bench_local_training.py                 # P = 100, 1,000, 10,000
    python benchmarks/bench_local_training.py --peers 100000 --json
    python benchmarks/bench_local_training.py --peers 200 --rows-per-peer 2000   # crossover

Keys of ``--json`` lines: peers, rows_per_peer, d, data, lam, batched_s, per_peer_s,
sklearn_s, speedup (sklearn_s / batched_s), per_peer_speedup (per_peer_s / batched_s),
max_coef_diff, max_grad_norm, iterations, sklearn_extrapolated, input_mib (size of X) and,
with ``--memory``, batched_peak_mib (peak memory allocated by the batched solver, measured
with tracemalloc in an extra untimed run; it includes the (P, d) output). Times are wall
seconds, the fastest of ``--repeat`` runs. All three solvers run BLAS single-threaded.

Measured on a 2-core machine shared with other jobs (load 1.5-3), lam = 1e-3, ``--repeat 3``
(``*``: extrapolated from 1,000 peers; P = 100,000 with ``--repeat 1 --memory``)::

      peers  rows/peer  data       batched s  per-peer s  sklearn s  speedup  max|dw|
        100       46    spambase       0.021       0.075       0.32      15x  2.2e-07
      1,000      4.6    spambase       0.019        0.71        3.8     196x  1.9e-07
      1,000       40    synthetic       0.21        1.23        4.1      20x  1.1e-07
     10,000       40    synthetic       1.20        7.6*        35*      29x  1.6e-07
    100,000       40    synthetic       14.2        118*       535*      38x  1.6e-07

Every peer reached ||grad|| <= 1e-9 in 6-8 Newton iterations. P = 100,000: input X is
1,770 MiB; the solver's own peak is 55 MiB (of which 44 MiB is the output). Runs vary by
about +-30% with the machine's load; at P = 1,000 x 40 rows the speedup was 20-30x.

Crossover (``--rows-per-peer R``, 400,000 rows in all, at most 2,000 peers)::

    rows/peer      10     40    100    300   1,000   2,000   4,000   8,000   16,000
    batched s   0.055  0.234  0.872  1.114   0.953   1.010   0.942   0.801    0.895
    per-peer s  1.498  1.487  2.041  2.160   1.174   0.806   0.822   0.758    0.812
    sklearn s    7.56   7.49   6.96   5.34    2.39    1.74    1.40    1.11     1.24

hence ``method="auto"`` batches shards below ``PER_PEER_MIN_ROWS = 2048`` rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence

import numpy as np

from p2pdp.core.errors import DataError
from p2pdp.data.benchmarks import load_dataset
from p2pdp.learning.models import LocalModels, fit_local_models, fit_local_models_sklearn

DEFAULT_PEERS = (100, 1_000, 10_000)
N_FEATURES = 57  # Spambase; plus the bias column: d = 58
SYNTHETIC_ROWS_PER_PEER = 40
MIN_REAL_ROWS_PER_PEER = 4  # Spambase's 4,601 rows serve up to 1,150 peers


def _unit_ball_with_bias(X: np.ndarray) -> np.ndarray:
    """Append a bias column of ones, then divide rows of L2 norm > 1 by their norm."""
    X = np.hstack([X, np.ones((X.shape[0], 1))])
    return X / np.maximum(np.linalg.norm(X, axis=1), 1.0)[:, None]


def spambase() -> tuple[np.ndarray, np.ndarray] | None:
    """Spambase rows, min-max scaled, with bias, in the unit ball; None if not available."""
    try:
        dataset = load_dataset("spambase", download=False)
    except DataError as exc:
        print(f"# spambase not available ({exc}); using synthetic rows", file=sys.stderr)
        return None
    low, high = dataset.X.min(axis=0), dataset.X.max(axis=0)
    X = (dataset.X - low) / np.where(high > low, high - low, 1.0)
    return _unit_ball_with_bias(X), dataset.y.astype(np.float64)


def synthetic(n_rows: int, *, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Spambase-shaped rows: sparse features in [0, 1], bias, unit ball; noisy linear labels."""
    X = rng.random((n_rows, N_FEATURES)) * (rng.random((n_rows, N_FEATURES)) < 0.3)
    X = _unit_ball_with_bias(X)
    scores = X @ rng.normal(scale=3.0, size=X.shape[1]) + rng.logistic(size=n_rows)
    return X, np.where(scores > 0, 1.0, -1.0)


def _timed(solve: Callable[[], LocalModels], repeat: int) -> tuple[LocalModels, float]:
    """Result of ``solve`` and its fastest wall time in seconds over ``repeat`` calls."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        models = solve()
        times.append(time.perf_counter() - start)
    return models, min(times)


def run(
    peers: int,
    *,
    real: tuple[np.ndarray, np.ndarray] | None,
    rows_per_peer: int | None,
    lam: float,
    max_reference_peers: int,
    repeat: int,
    memory: bool,
    rng: np.random.Generator,
) -> dict[str, object]:
    """Time the three solvers on one configuration; returns one result row.

    ``real`` (Spambase rows, or None) is used when it has enough rows and ``rows_per_peer`` is
    not given; otherwise synthetic rows are drawn from ``rng``.
    """
    if (
        real is not None
        and rows_per_peer is None
        and len(real[1]) >= MIN_REAL_ROWS_PER_PEER * peers
    ):
        X, y = real
        source = "spambase"
    else:
        X, y = synthetic(peers * (rows_per_peer or SYNTHETIC_ROWS_PER_PEER), rng=rng)
        source = "synthetic"
    shards = np.array_split(rng.permutation(X.shape[0]), peers)
    reference = shards[:max_reference_peers]
    scale = peers / len(reference)

    batched, batched_s = _timed(
        lambda: fit_local_models(X, y, shards, lam, method="batched"), repeat
    )
    _, per_peer_s = _timed(
        lambda: fit_local_models(X, y, reference, lam, method="per_peer"), repeat
    )
    sklearn, sklearn_s = _timed(lambda: fit_local_models_sklearn(X, y, reference, lam), repeat)
    peak_mib = None
    if memory:  # separate run: tracemalloc slows the solver down by about half
        tracemalloc.start()
        fit_local_models(X, y, shards, lam, method="batched")
        peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return {
        "peers": peers,
        "rows_per_peer": round(X.shape[0] / peers, 1),
        "d": X.shape[1],
        "data": source,
        "lam": lam,
        "batched_s": batched_s,
        "per_peer_s": per_peer_s * scale,
        "sklearn_s": sklearn_s * scale,
        "speedup": sklearn_s * scale / batched_s,
        "per_peer_speedup": per_peer_s * scale / batched_s,
        "max_coef_diff": float(np.abs(batched.weights[: len(reference)] - sklearn.weights).max()),
        "max_grad_norm": float(batched.grad_norms.max()),
        "iterations": batched.iterations,
        "sklearn_extrapolated": scale > 1,
        "input_mib": X.nbytes / 2**20,
        "batched_peak_mib": peak_mib,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, help="one configuration with this many peers")
    parser.add_argument("--rows-per-peer", type=int, help="synthetic rows per peer")
    parser.add_argument("--lam", type=float, default=1e-3, help="regularisation (default 1e-3)")
    parser.add_argument(
        "--max-reference-peers",
        type=int,
        default=1_000,
        help="time per-peer and sklearn on at most this many peers, then scale (default 1000)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="report the fastest of N runs")
    parser.add_argument(
        "--memory", action="store_true", help="also measure the batched solver's peak memory"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    fit_local_models(*synthetic(200, rng=rng), np.array_split(np.arange(200), 5), 1.0)  # warm-up
    header = (
        f"{'peers':>7} {'rows':>6} {'data':>9} {'batched s':>10} {'per-peer s':>11} "
        f"{'sklearn s':>10} {'speedup':>8} {'max|dw|':>9} {'max|grad|':>9} {'iter':>4}"
    )
    if not args.json:
        print(header)
    real = spambase() if args.rows_per_peer is None else None
    for peers in [args.peers] if args.peers else DEFAULT_PEERS:
        row = run(
            peers,
            real=real,
            rows_per_peer=args.rows_per_peer,
            lam=args.lam,
            max_reference_peers=args.max_reference_peers,
            repeat=args.repeat,
            memory=args.memory,
            rng=rng,
        )
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            mark = "*" if row["sklearn_extrapolated"] else " "
            print(
                f"{row['peers']:>7} {row['rows_per_peer']:>6} {row['data']:>9} "
                f"{row['batched_s']:>10.3f} {row['per_peer_s']:>10.3f}{mark} "
                f"{row['sklearn_s']:>9.3f}{mark} {row['speedup']:>7.1f}x "
                f"{row['max_coef_diff']:>9.1e} {row['max_grad_norm']:>9.1e} "
                f"{row['iterations']:>4}",
                flush=True,
            )
    if not args.json:
        print("* timed on --max-reference-peers peers and scaled up (sklearn_extrapolated)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
