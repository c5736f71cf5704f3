"""Private Bayesian linear regression (Nguyễn's example) at every (epsilon, tau) of the grid.

Writes ``posterior_linear_regression.csv``, ``posterior_bounded_loglik.png`` and
``posterior_estimates_vs_epsilon.png`` into ``--out`` (default: the current directory) and
prints the table. Usage: ``python benchmarks/posterior_linear_regression.py [--out DIR]``.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

from p2pdp.privacy.posterior_sampling.example import (
    format_rows,
    plot_bounded_log_likelihood,
    plot_estimates_vs_epsilon,
    posterior_rows,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = posterior_rows(seed=args.seed)
    with open(out / "posterior_linear_regression.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot_bounded_log_likelihood(str(out / "posterior_bounded_loglik.png"), taus=(0.5, 2.0, 8.0))
    plot_estimates_vs_epsilon(rows, str(out / "posterior_estimates_vs_epsilon.png"))
    print(format_rows(rows))
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
