"""Cost of secure aggregation against plaintext averaging, per group aggregation.

Plaintext: the curator draws the coordinate-Laplace noise and adds it to the mean of the K
models it received in the clear. Secure: every member draws its noise share
(:func:`p2pdp.privacy.secure_aggregation.draw_noise_shares`) and the group runs additive secret
sharing
(:func:`p2pdp.privacy.secure_aggregation.secure_noisy_mean`, fast path, no transcript). Both run in
this
process; the table gives the median wall time per aggregation over ``--repeats`` repetitions
and the bytes each member sends (the busiest member for the secure protocol).

Usage::

    python benchmarks/bench_secure_aggregation.py                      # full grid, table
    python benchmarks/bench_secure_aggregation.py --group-size 100 --dim 124 --json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

from p2pdp.core.rng import generator
from p2pdp.privacy.calibration import group_sensitivity
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.secure_aggregation import draw_noise_shares, protocol_cost, secure_noisy_mean

GROUP_SIZES = (10, 50, 100)
DIMS = (58, 124)
SHARD_SIZE = 41  # Spambase, 100 peers
LAMBDA = 1e-3
FLOAT_BYTES = 8  # plaintext: each member sends its float64 model once


def _median_ms(step: Callable[[], object], repeats: int) -> float:
    step()  # warm-up
    times = np.empty(repeats)
    for k in range(repeats):
        start = time.perf_counter()
        step()
        times[k] = time.perf_counter() - start
    return float(np.median(times) * 1e3)


def measure(group_size: int, dim: int, *, repeats: int, seed: int) -> dict[str, float | int]:
    """Median wall time (ms) of one plaintext and one secure aggregation, and bytes per member."""
    rng = generator(seed, "bench_secure_aggregation", group_size, dim)
    mechanism = make_mechanism("coordinate-laplace", epsilon=1.0)
    sensitivity = group_sensitivity([SHARD_SIZE] * group_size, LAMBDA)
    models = rng.normal(size=(group_size, dim))
    models *= np.sqrt(2 * np.log(2) / LAMBDA) / np.linalg.norm(models, axis=1, keepdims=True)

    def plaintext() -> np.ndarray:
        return models.mean(axis=0) + mechanism.sample(sensitivity, dim, rng=rng)

    def secure() -> np.ndarray:
        noise = draw_noise_shares(
            mechanism, sensitivity=sensitivity, n_members=group_size, dim=dim, rng=rng
        )
        return secure_noisy_mean(models, noise, curator=0, rng=rng).total

    plaintext_ms = _median_ms(plaintext, repeats)
    secure_ms = _median_ms(secure, repeats)
    return {
        "group_size": group_size,
        "dim": dim,
        "plaintext_ms": plaintext_ms,
        "secure_ms": secure_ms,
        "overhead_ms": secure_ms - plaintext_ms,
        "bytes_per_member": protocol_cost(group_size, dim).bytes_per_member,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group-size", type=int, help=f"one group size (default {GROUP_SIZES})")
    parser.add_argument("--dim", type=int, help=f"one model dimension (default {DIMS})")
    parser.add_argument("--repeats", type=int, default=200, help="repetitions per timing")
    parser.add_argument("--seed", type=int, default=0, help="root seed of the random streams")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    group_sizes = GROUP_SIZES if args.group_size is None else (args.group_size,)
    dims = DIMS if args.dim is None else (args.dim,)

    if not args.json:
        print(
            f"{'group':>5} {'dim':>4} {'plain ms':>9} {'secure ms':>10} {'overhead ms':>12} "
            f"{'bytes/member':>13} {'plain bytes':>12}"
        )
    for group_size in group_sizes:
        for dim in dims:
            row = measure(group_size, dim, repeats=args.repeats, seed=args.seed)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(
                    f"{group_size:>5} {dim:>4} {row['plaintext_ms']:>9.3f} "
                    f"{row['secure_ms']:>10.3f} {row['overhead_ms']:>12.3f} "
                    f"{row['bytes_per_member']:>13} {FLOAT_BYTES * dim:>12}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
