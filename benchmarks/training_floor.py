"""The floor of a synthetic training drawn in blocks: CPU per block and per step, and what it
leaves of the issue's 0.5x (issue 43).

A large synthetic run's training (:mod:`p2pdp.tasks.streamed`) draws its rows block by block
(65,536 rows of 57 features) and keeps none of most: a pass over the bounds, a pass that
draws, transforms and fits every block, and the centralised reference's later passes, which
draw again every block beyond the kept ones. Any engine that gives the same rows draws each
row at least once (numpy's lognormal, then the labels' ``log1p`` and logits), transforms it
and fits its shard: that one pass is the *floor*; the current plan adds the bounds' pass
and the reference's passes (sums over every block, draws again over the blocks not kept).

Three measurements, in the same run:

1. **per block** (one process, one BLAS thread, ``time.process_time``): each step's CPU on
   the first ``--sample`` blocks of the ``--at`` peers' stream (seed 2026, 20 rows a peer,
   bench_simulation's configuration): the bounds' draw, the draw (lognormal, of which the
   normals; then ``log1p`` and labels), the transform, the block's local fits, the
   reference's sums at ``w = 0`` and at a model ``w != 0``;
2. **the training at ``--peers``** (:func:`~p2pdp.tasks.streamed.train_in_blocks`, one
   process): each pass's CPU, measured, and the same passes predicted from (1);
3. **at ``--at`` peers**, extrapolated from (1) (the per-block means times the blocks; the
   reference's later passes as counted in (2)); with ``--train-at``, also measured: the
   training at ``--at`` with ``--workers`` workers, each pass's CPU, children's included
   (the reference's passes, in a background process from 2 workers on, waited for at the
   end: :data:`~p2pdp.tasks.streamed.BACKGROUND_MAX_PEERS`); the floor's CPU and its wall
   on ``--workers`` cores, against 0.5x of the wall of ``bench_simulation.py --peers AT
   --workers W`` at ``--base REV`` (run here, in a temporary worktree, when ``--base`` is
   given: a ratio measured in this run).

Usage::

    python benchmarks/training_floor.py --peers 100000 --at 1000000 --sample 8
    python benchmarks/training_floor.py --at 1000000 --train-at --base 1836a54 --json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

ROWS_PER_PEER, TEST_ROWS, FEATURES, SEED = 20, 2000, 57, 2026

#: Per-block steps, in the order they run; ``lognormal`` and ``normals`` are parts of
#: ``draw`` (the normals of the lognormal), timed on their own; ``features`` is the draw
#: without the labels (the reference's later passes, which keep them).
STEPS = (
    "bounds",
    "draw",
    "lognormal",
    "normals",
    "features",
    "transform",
    "fits",
    "sums_zero",
    "sums",
)


def scenario(peers: int) -> Any:
    """bench_simulation's synthetic configuration at ``peers`` peers (its training only)."""
    from p2pdp.config import ScenarioConfig
    from p2pdp.data.settings import DataConfig, PartitionConfig
    from p2pdp.learning.settings import EvaluationConfig

    return ScenarioConfig(
        seed=SEED,
        data=DataConfig(
            dataset="synthetic",
            synthetic_rows=ROWS_PER_PEER * peers,
            synthetic_test_rows=TEST_ROWS,
            synthetic_features=FEATURES,
        ),
        partition=PartitionConfig(n_peers=peers, scheme="contiguous"),
        evaluation=EvaluationConfig(split="fixed"),
    )


def cpu() -> float:
    """CPU seconds of this process and of its finished children (the forked workers)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


def per_block(peers: int, sample: int) -> dict[str, float]:
    """Each step's mean CPU seconds per block (:data:`STEPS`) over the first ``sample``
    training blocks of ``peers`` peers' stream."""
    from p2pdp.data.partition import contiguous_starts
    from p2pdp.data.preprocess import Preprocessor
    from p2pdp.data.synthetic import (
        SYNTHETIC_BLOCK_ROWS,
        synthetic_block_bounds,
        synthetic_block_features,
        synthetic_block_logged,
        synthetic_seed,
    )
    from p2pdp.learning.compiled import compile_fits, fit_consecutive_shards
    from p2pdp.learning.models import MAX_NEWTON_STEPS, LogisticModel, one_blas_thread
    from p2pdp.learning.newton import block_hessian, block_sums
    from p2pdp.tasks.streamed import block_stream

    config = scenario(peers)
    seed_seq, n_total, d, n = block_stream(config, fold=0)
    blocks = range(min(sample, n // SYNTHETIC_BLOCK_ROWS))
    bounds = [synthetic_block_bounds(seed_seq, b, n_total=n_total, n_features=d, n_rows=n)
              for b in blocks]  # fmt: skip
    # the bounds of the sampled blocks only: the same work per block as the run's bounds
    low = np.minimum.reduce([b[0] for b in bounds if b is not None])
    high = np.maximum.reduce([b[1] for b in bounds if b is not None])
    fitted = Preprocessor(steps=tuple(config.data.transform)).fit(np.vstack([low, high]))
    starts = contiguous_starts(n, config.partition.n_peers)
    compile_fits()
    totals = dict.fromkeys(STEPS, 0.0)

    counting = [0.0]  # the first block once untimed (imports, caches), then the others

    @contextmanager
    def timed(step: str) -> Iterator[None]:
        start = time.process_time()
        yield
        totals[step] += (time.process_time() - start) * counting[0]

    with one_blas_thread():
        for index, block in enumerate([0, *blocks]):
            counting[0] = float(index > 0)
            with timed("bounds"):
                synthetic_block_bounds(seed_seq, block, n_total=n_total, n_features=d, n_rows=n)
            seed = synthetic_seed(seed_seq, 1 + block)
            shape = (SYNTHETIC_BLOCK_ROWS, d)
            with timed("normals"):
                np.random.default_rng(seed).standard_normal(size=shape)
            with timed("lognormal"):
                np.random.default_rng(seed).lognormal(mean=0.0, sigma=1.0, size=shape)
            with timed("features"):
                synthetic_block_features(seed_seq, block, n_total=n_total, n_features=d)
            with timed("draw"):
                _, logged, labels = synthetic_block_logged(
                    seed_seq, block, n_total=n_total, n_features=d
                )
            with timed("transform"):
                X = fitted.transform_logged(logged)
            y = labels.astype(np.float64)
            begin = block * SYNTHETIC_BLOCK_ROWS
            first = int(np.searchsorted(starts, begin))
            last = int(np.searchsorted(starts, begin + len(y), side="right")) - 1
            cuts = starts[first : last + 1] - begin
            with timed("fits"):
                fit_consecutive_shards(
                    X, y, cuts, config.training.lam, LogisticModel.gradient_tolerance,
                    MAX_NEWTON_STEPS, first_peer=first,
                )  # fmt: skip
            zero = np.zeros(X.shape[1])
            with timed("sums_zero"):
                block_sums(X, y, zero), block_hessian(X, zero)
            w = np.full(X.shape[1], 0.1)
            with timed("sums"):
                block_sums(X, y, w), block_hessian(X, w)
    return {step: total / len(blocks) for step, total in totals.items()}


def passes_of_training(peers: int, workers: int) -> tuple[list[tuple[str, float, float]], float]:
    """:func:`~p2pdp.tasks.streamed.train_in_blocks` at ``peers`` peers on ``workers`` local
    workers: each pass's ``(phase, CPU s, wall s)``, CPU including the workers', and the
    total wall seconds."""
    from p2pdp.core.parallel import local_workers
    from p2pdp.tasks import streamed

    marks: list[tuple[str, float, float]] = []
    named = streamed.set_phase

    def phase(name: str, counter: Callable[[], str] | None = None) -> None:
        marks.append((name, cpu(), time.perf_counter()))
        named(name, counter)

    streamed.set_phase = phase
    try:
        with local_workers(workers):
            start = time.perf_counter()
            trained = streamed.train_in_blocks(scenario(peers), fold=0)
            if not isinstance(trained.centralized, np.ndarray):  # its passes, waited for here
                phase("training: centralised reference, in the background")
                trained.centralized.result()
            marks.append(("end", cpu(), time.perf_counter()))
    finally:
        streamed.set_phase = named
    passes = [
        (name, later_cpu - cpu_s, later_wall - wall)
        for (name, cpu_s, wall), (_, later_cpu, later_wall) in itertools.pairwise(marks)
    ]
    return passes, marks[-1][2] - start


def predicted(steps: dict[str, float], peers: int, reference_passes: int) -> dict[str, float]:
    """CPU seconds of each pass of the training at ``peers`` peers predicted from the
    per-block ``steps``: the bounds' pass, the fits' pass (its draw, transform, fits and the
    reference's sums at ``w = 0``), ``reference_passes`` later passes (sums over every block,
    a draw of its features and a transform for each block not kept), and the floor (draw,
    transform, fits once)."""
    from p2pdp.data.synthetic import SYNTHETIC_BLOCK_ROWS
    from p2pdp.tasks.streamed import KEPT_ROWS_BYTES

    rows = ROWS_PER_PEER * peers
    blocks = math.ceil(rows / SYNTHETIC_BLOCK_ROWS)
    kept_bytes = KEPT_ROWS_BYTES - rows  # every label, a byte each (streamed._Kept)
    kept = min(blocks, max(kept_bytes, 0) // (8 * (FEATURES + 1) * SYNTHETIC_BLOCK_ROWS))
    once = steps["draw"] + steps["transform"]
    again = steps["features"] + steps["transform"]
    return {
        "blocks": blocks,
        "kept_blocks": kept,
        "bounds": blocks * steps["bounds"],
        "fits_pass": blocks * (once + steps["fits"] + steps["sums_zero"]),
        "reference": reference_passes * (blocks * steps["sums"] + (blocks - kept) * again),
        "redraws": reference_passes * (blocks - kept) * again,
        "floor": blocks * (once + steps["fits"]),
    }


def base_wall(revision: str, peers: int, workers: int) -> dict[str, Any]:
    """``bench_simulation.py --dataset synthetic --peers PEERS --workers W --json`` at
    ``revision``, in a temporary worktree (compare_revisions' helpers): its JSON row."""
    from compare_revisions import _run, _worktree

    command = ["benchmarks/bench_simulation.py", "--dataset", "synthetic", "--peers",
               str(peers), "--workers", str(workers), "--json"]  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        tree = _worktree(revision, Path(scratch))
        try:
            return _run(tree, command)[0]
        finally:
            import subprocess

            root = Path(__file__).resolve().parents[1]
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=100_000, help="the training measured")
    parser.add_argument("--at", type=int, default=1_000_000, help="peers extrapolated to")
    parser.add_argument("--sample", type=int, default=8, help="blocks timed step by step")
    parser.add_argument("--workers", type=int, default=2, help="cores of the floor's wall")
    parser.add_argument("--train-at", action="store_true", help="also train at --at (timed)")
    parser.add_argument("--base", help="revision whose bench_simulation wall at --at is 1x")
    parser.add_argument("--json", action="store_true", help="one JSON object at the end")
    args = parser.parse_args(argv)

    steps = per_block(args.at, args.sample)
    print(f"CPU per block of {args.sample} blocks (ms): "
          + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in steps.items()), flush=True)  # fmt: skip
    measured, wall = passes_of_training(args.peers, 1)
    later = sum(name.startswith("training: centralised reference") for name, _, _ in measured)
    model = predicted(steps, args.peers, later)
    print(f"training at {args.peers} peers, one process, {wall:.1f} s wall:", flush=True)
    for name, cpu_s, _ in measured:
        print(f"  {name}: {cpu_s:.2f} s CPU")
    print("  predicted from the blocks: "
          + ", ".join(f"{k} {v:.2f}" for k, v in model.items()), flush=True)  # fmt: skip
    row: dict[str, Any] = {"steps_ms": {k: v * 1e3 for k, v in steps.items()},
                           "measured_peers": args.peers, "measured_cpu_s": sum(
                               cpu_s for _, cpu_s, _ in measured), "measured_passes": measured,
                           "predicted_peers": model}  # fmt: skip
    at_passes = later
    if args.train_at:
        passes, at_wall = passes_of_training(args.at, args.workers)
        print(f"training at {args.at} peers, {args.workers} workers, {at_wall:.1f} s wall:")
        for name, cpu_s, wall_s in passes:
            print(f"  {name}: {cpu_s:.2f} s CPU, {wall_s:.2f} s wall")
        row |= {"at_passes": passes, "at_wall_s": at_wall}
    at = predicted(steps, args.at, at_passes)
    floor_wall = at["floor"] / args.workers
    cpus = ", ".join(f"{k} {v:.1f} s CPU" for k, v in at.items() if "blocks" not in k)
    print(
        f"at {args.at} peers ({at['blocks']} blocks, {at['kept_blocks']} kept, {at_passes} "
        f"later reference passes), extrapolated per block: {cpus}; the floor on "
        f"{args.workers} cores {floor_wall:.1f} s",
        flush=True,
    )
    row |= {"at_peers": args.at, "at_predicted": at, "floor_wall_s": floor_wall}
    if args.base:
        base = base_wall(args.base, args.at, args.workers)
        half = 0.5 * base["wall_s"]
        print(f"{args.base}: bench_simulation at {args.at} peers: wall {base['wall_s']:.1f} s "
              f"(training {base['training_s']:.1f}, simulation {base['simulation_s']:.1f}, "
              f"evaluation {base['evaluation_s']:.1f}); 0.5x = {half:.1f} s; the floor is "
              f"{floor_wall / half:.2f} of that, leaving {half - floor_wall:.1f} s for the "
              "simulation and the evaluation (the floor is CPU over idle cores: a ratio for a "
              "quiet machine)")  # fmt: skip
        row |= {"base": base, "floor_to_half_base": floor_wall / half}
    if args.json:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
