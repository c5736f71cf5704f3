"""Write the figures (PNG) and their data (CSV) of the prevalence tasks (issue 13).

    python benchmarks/prevalence_figures.py [--out results/prevalence_figures] [--seed 0]

Pooled testing: epsilon vs p per c for (Se, Sp) = (0.85, 0.75) and the reverse,
the variance ratio vs c with p_max, and privacy vs utility. Noisy counts and randomized
response: local vs central error scaling, credible-interval coverage with and
without the noise correction, and the seed's two policies. About 30 s on one core.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from p2pdp.core.rng import generator
from p2pdp.tasks.pooled_testing import pooling
from p2pdp.tasks.prevalence import estimators as prevalence
from p2pdp.tasks.prevalence import figures as figures

POOL_SIZES = (1, 2, 5, 10, 20)
PREVALENCES = (0.01, 0.05, 0.1, 0.2)
ACCURACIES = ((0.85, 0.75), (0.75, 0.85))


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/prevalence_figures")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    grid = [p / 1000 for p in range(1, 1000)]  # fine p axis for the epsilon curves
    epsilon = [
        row for se, sp in ACCURACIES for row in pooling.epsilon_rows(grid, POOL_SIZES, se, sp)
    ]
    ratio = [
        row
        for hold in pooling.HOLDS
        for row in pooling.variance_ratio_rows(range(1, 41), PREVALENCES, 0.85, 0.75, hold=hold)
    ]
    utility = pooling.privacy_utility_rows(
        POOL_SIZES,
        0.05,
        2000,
        0.85,
        0.75,
        n_repetitions=4000,
        rng=generator(args.seed, "figures", "privacy-utility"),
    )
    scaling = prevalence.scaling_rows(
        [30, 100, 300, 1000, 3000],
        [0.5, 2.0],
        0.1,
        n_repetitions=2000,
        rng=generator(args.seed, "figures", "scaling"),
    )
    coverage = prevalence.coverage_rows(
        50,
        [0.03, 0.1, 0.3, 1.0, 3.0],
        n_repetitions=1000,
        rng=generator(args.seed, "figures", "coverage"),
    )
    policies = prevalence.policy_rows(
        0.1, 8, 50, 0.5, n_repetitions=300, rng=generator(args.seed, "figures", "policies")
    )
    outputs = {
        "pooling_epsilon": (epsilon, figures.epsilon_figure),
        "pooling_variance_ratio": (ratio, figures.variance_ratio_figure),
        "pooling_privacy_utility": (utility, figures.privacy_utility_figure),
        "prevalence_scaling": (scaling, figures.scaling_figure),
        "prevalence_coverage": (coverage, figures.coverage_figure),
        "prevalence_policies": (policies, figures.policy_figure),
    }
    for stem, (rows, draw) in outputs.items():
        write_csv(rows, out / f"{stem}.csv")
        print(draw(rows, out / f"{stem}.png"))
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
