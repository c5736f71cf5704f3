"""The README's headline numbers of each shipped scenario, checked against a full run.

``HEADLINES`` holds, per scenario, the numbers the README's scenario table (and quick start)
states, each with how to compute it from the results rows. A fast test checks that every one
appears in the README as written; the slow tests (``pytest -m slow``, several minutes in total,
adult about 3) run each scenario in full and recompute them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.run.runner import run_experiment
from p2pdp.experiments.scenarios.scenario import load_scenario

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
Rows = Sequence[dict[str, str]]


def mean(rows: Rows, column: str, **where: object) -> float:
    """Mean of ``column`` over the rows (folds, repetitions) matching ``where``."""
    keys = {k.replace("__", "."): str(v) for k, v in where.items()}
    chosen = [float(r[column]) for r in rows if all(r[k] == v for k, v in keys.items())]
    assert chosen, f"no rows with {keys}"
    return float(np.mean(chosen))


def pooled_std(rows: Rows, **where: object) -> float:
    """Std of per-peer errors pooled over the matching cells (as report.md computes it)."""
    keys = {k.replace("__", "."): str(v) for k, v in where.items()}
    chosen = [r for r in rows if all(r[k] == v for k, v in keys.items())]
    means = np.array([float(r["mean_error"]) for r in chosen])
    stds = np.array([float(r["std_error"]) for r in chosen])
    return float(np.sqrt(max(np.mean(stds**2 + means**2) - means.mean() ** 2, 0.0)))


def messages_per_peer(rows: Rows, **where: object) -> float:
    keys = {k.replace("__", "."): str(v) for k, v in where.items()}
    chosen = [r for r in rows if all(r[k] == v for k, v in keys.items())]
    return float(np.mean([int(r["messages_sent"]) / int(r["partition.n_peers"]) for r in chosen]))


def tuned(protocol: str, epsilon: float | None, scheme: str, column: str = "error"):
    """A protocol's leave-one-fold-out tuned error (the report's comparison table)."""
    from p2pdp.experiments.report.protocols import tuned_comparison
    from p2pdp.experiments.report.summary import _parse

    def compute(rows: Rows) -> float:
        parsed = [{k: _parse(v) for k, v in row.items()} for row in rows]
        swept = [c for c in parsed[0] if "." in c and len({r[c] for r in parsed}) > 1]
        _, table = tuned_comparison(parsed, swept)
        (row,) = [
            r
            for r in table
            if r["protocol.name"] == protocol
            and r.get("privacy.epsilon") == epsilon
            and r["partition"] == scheme
        ]
        return float(row[column])

    return compute


def error_at(**where: object) -> Callable[[Rows], float]:
    return lambda rows: mean(rows, "mean_error", **where)


def curious_at(epsilon: float, column: str = "mean_error") -> Callable[[Rows], float]:
    """``column`` of the D-PSGD rows calibrated against a curious neighbour (correlated_noise)."""
    where = {"protocol__threat_model": "curious-peer", "privacy__epsilon": epsilon}
    return lambda rows: mean(rows, column, **where)


Headline = tuple[str, Callable[[Rows], float], str]  # (what, compute, as the README writes it)
IID, SKEW_1, SKEW_01 = "IID shards", "Dirichlet label skew α = 1", "Dirichlet label skew α = 0.1"
E10 = {"privacy__epsilon": 10.0}


def _rr_ratio(records: int, epsilon: float) -> Callable[[Rows], float]:
    """Mean |privacy error| of randomized response over that of the central Laplace count."""

    def ratio(rows: Rows) -> float:
        def error(task: str) -> float:
            return float(
                np.mean(
                    [
                        abs(float(r["privacy_error"]))
                        for r in rows
                        if r["task.name"] == task
                        and float(r["privacy.epsilon"]) == epsilon
                        and int(r["prevalence.records_per_peer"]) * int(r["partition.n_peers"])
                        == records
                    ]
                )
            )

        return error("randomized-response") / error("prevalence-counts")

    return ratio


def _lambda_best(rows: Rows) -> float:
    lams = sorted({float(r["training.lambda"]) for r in rows})
    errors = [mean(rows, "mean_error", training__lambda=lam, **E10) for lam in lams]
    return float(np.log2(lams[int(np.argmin(errors))]))


HEADLINES: dict[str, list[Headline]] = {
    "quickstart": [
        ("centralized", lambda r: mean(r, "centralized_error"), "0.106"),
        ("local only", lambda r: mean(r, "local_only_error"), "0.114"),
        (
            "group publication, g = 5, epsilon = 10",
            error_at(groups__group_size=5, publication__mode="group", **E10),
            "0.23",
        ),
    ],
    "spambase_group_vs_full": [
        (
            "full, g = 10, epsilon = 10",
            error_at(groups__group_size=10, publication__mode="full", **E10),
            "0.148",
        ),
        (
            "group, g = 10, epsilon = 10",
            error_at(groups__group_size=10, publication__mode="group", **E10),
            "0.279",
        ),
        ("local only", lambda r: mean(r, "local_only_error"), "0.129"),
    ],
    "australian_group_vs_full": [
        (
            "full, g = 5, epsilon = 10",
            error_at(groups__group_size=5, publication__mode="full", **E10),
            "0.21",
        ),
        (
            "group, g = 5, epsilon = 10",
            error_at(groups__group_size=5, publication__mode="group", **E10),
            "0.27",
        ),
        (
            "full, g = 15, epsilon = 10",
            error_at(groups__group_size=15, publication__mode="full", **E10),
            "0.17",
        ),
    ],
    "adult_group_vs_full": [
        (
            "full, g = 50, epsilon = 10",
            error_at(groups__group_size=50, publication__mode="full", **E10),
            "0.179",
        ),
        ("centralized", lambda r: mean(r, "centralized_error"), "0.175"),
        ("local only", lambda r: mean(r, "local_only_error"), "0.206"),
    ],
    "lambda_grid": [
        ("log2 of the best lambda at epsilon = 10", _lambda_best, "-7"),
        (
            "error at lambda = 2^-7, epsilon = 10",
            error_at(training__lambda=2.0**-7, **E10),
            "0.148",
        ),
    ],
    "peer_count": [
        (
            "full, epsilon = 10, P = 10",
            error_at(partition__n_peers=10, publication__mode="full", **E10),
            "0.115",
        ),
        (
            "full, epsilon = 10, P = 400",
            error_at(partition__n_peers=400, publication__mode="full", **E10),
            "0.291",
        ),
        (
            "messages per peer, group publication, P = 400",
            lambda r: messages_per_peer(r, partition__n_peers=400, publication__mode="group"),
            "28",
        ),
    ],
    "spambase_secure_aggregation": [
        (
            "g = 50, off",
            error_at(groups__group_size=50, privacy__secure_aggregation=False),
            "0.129",
        ),
        (
            "g = 50, on",
            error_at(groups__group_size=50, privacy__secure_aggregation=True),
            "0.142",
        ),
        (
            "std g = 50, off",
            lambda r: pooled_std(r, groups__group_size=50, privacy__secure_aggregation=False),
            "0.028",
        ),
        (
            "std g = 50, on",
            lambda r: pooled_std(r, groups__group_size=50, privacy__secure_aggregation=True),
            "0.031",
        ),
    ],
    "posterior_vs_output_perturbation": [
        (
            "vector-laplace, epsilon = 10",
            error_at(privacy__mechanism="vector-laplace", **E10),
            "0.122",
        ),
        (
            "posterior-sampling, epsilon = 10",
            error_at(privacy__mechanism="posterior-sampling", **E10),
            "0.395",
        ),
        (
            "posterior-sampling, epsilon = 0.1",
            error_at(privacy__mechanism="posterior-sampling", privacy__epsilon=0.1),
            "0.469",
        ),
        (
            "vector-laplace, epsilon = 0.1",
            error_at(privacy__mechanism="vector-laplace", privacy__epsilon=0.1),
            "0.479",
        ),
        ("local only", lambda r: mean(r, "local_only_error"), "0.117"),
        ("centralized", lambda r: mean(r, "centralized_error"), "0.102"),
    ],
    "gossip_vs_central": [
        (
            "central, no loss",
            error_at(groups__sampler="central", network__loss=0.0),
            "0.109",
        ),
        (
            "gossip, no loss",
            error_at(groups__sampler="gossip", network__loss=0.0),
            "0.109",
        ),
        (
            "central aggregations at loss 0.2",
            lambda r: mean(r, "aggregations", groups__sampler="central", network__loss=0.2),
            "2",
        ),
        (
            "gossip aggregations at loss 0.2",
            lambda r: mean(r, "aggregations", groups__sampler="gossip", network__loss=0.2),
            "99",
        ),
        (
            "gossip error at loss 0.2",
            error_at(groups__sampler="gossip", network__loss=0.2),
            "0.108",
        ),
    ],
    "prevalence_counts": [
        (
            "naive 95% coverage, epsilon 0.1, 5 records, accumulate (%)",
            lambda r: (
                100
                * mean(
                    r,
                    "covered_naive",
                    privacy__epsilon=0.1,
                    privacy__epsilon_per_aggregation=0.1,
                    prevalence__records_per_peer=5,
                )
            ),
            "37",
        ),
        (
            "noise-aware 95% coverage, same cells (%)",
            lambda r: (
                100
                * mean(
                    r,
                    "covered_exact",
                    privacy__epsilon=0.1,
                    privacy__epsilon_per_aggregation=0.1,
                    prevalence__records_per_peer=5,
                )
            ),
            "93",
        ),
    ],
    "utility_frontier": [
        ("local-only error", lambda r: mean(r, "local_only_error"), "0.129"),
    ],
    "rr_vs_central": [
        (f"local / central privacy error, {n} records, epsilon {eps}", _rr_ratio(n, eps), written)
        for n, eps, written in [
            (1000, 1.0, "7"),
            (1000, 0.25, "10"),
            (1000, 4.0, "5"),
            (10000, 1.0, "21"),
            (10000, 0.25, "27"),
            (10000, 4.0, "16"),
        ]
    ],
    # No numbers in its table row (see the README's prevalence section): a full run must
    # complete every cell.
    "pooled_testing": [],
    "correlated_noise": [
        ("correlated D-PSGD, epsilon 1", curious_at(1.0), "0.283"),
        (
            "D-PSGD, local DP, epsilon 1",
            error_at(protocol__threat_model="local", privacy__epsilon=1.0),
            "0.316",
        ),
        ("one-shot, epsilon 1", error_at(protocol__name="one-shot", privacy__epsilon=1.0), "0.129"),
        ("central DP, epsilon 1", curious_at(1.0, "central_dp_error"), "0.127"),
        ("local-only", lambda rows: mean(rows, "local_only_error"), "0.129"),
        ("correlated D-PSGD, epsilon 10", curious_at(10.0), "0.129"),
        ("central DP, epsilon 10", curious_at(10.0, "central_dp_error"), "0.121"),
        ("correlated D-PSGD, epsilon 2", curious_at(2.0), "0.202"),
        ("central DP, epsilon 2", curious_at(2.0, "central_dp_error"), "0.124"),
    ],
    "iterative_vs_one_shot": [
        ("muffliato, epsilon 10, alpha 1", tuned("muffliato", 10.0, SKEW_1), "0.177"),
        ("dpsgd, epsilon 10, alpha 1", tuned("dpsgd", 10.0, SKEW_1), "0.182"),
        ("one-shot, epsilon 10, alpha 1", tuned("one-shot", 10.0, SKEW_1), "0.296"),
        ("local-only, alpha 1", tuned("one-shot", 10.0, SKEW_1, "local_only_error"), "0.333"),
        ("muffliato, epsilon 10, IID", tuned("muffliato", 10.0, IID), "0.116"),
        ("one-shot, epsilon 10, IID", tuned("one-shot", 10.0, IID), "0.118"),
        ("one-shot, epsilon 1, IID", tuned("one-shot", 1.0, IID), "0.122"),
        ("best iterative, epsilon 1, IID", tuned("muffliato", 1.0, IID), "0.207"),
    ],
    "peer_count_1m": [
        ("mean error", error_at(), "0.322"),
        ("centralised error", lambda r: mean(r, "centralized_error"), "0.229"),
        ("local-only error", lambda r: mean(r, "local_only_error"), "0.463"),
    ],
    # Not run in full yet (ten million peers: see the benchmarks guide); its row gives no
    # numbers, and a full run must complete its one cell.
    "peer_count_10m": [],
    "iterative_non_private": [
        ("dpsgd, IID", tuned("dpsgd", None, IID), "0.109"),
        ("gossip learning, IID", tuned("gossip-learning", None, IID), "0.110"),
        ("dpsgd, alpha 0.1", tuned("dpsgd", None, SKEW_01), "0.165"),
        ("gossip learning, alpha 0.1", tuned("gossip-learning", None, SKEW_01), "0.302"),
    ],
}


def as_written(value: float, written: str) -> str:
    """``value`` with as many decimals as the README's number has."""
    decimals = len(written.partition(".")[2])
    return f"{value:.{decimals}f}"


def readme_row(name: str) -> str:
    """The README's scenario table row of ``name`` (the quick start section for quickstart)."""
    if name == "quickstart":
        return README.split("## Quick start")[1].split("## Shipped scenarios")[0]
    (row,) = re.findall(rf"^\| `{name}` \|.*$", README, flags=re.MULTILINE)
    return row


@pytest.mark.parametrize("name", sorted(HEADLINES))
def test_headline_numbers_are_in_the_readme(name):
    row = readme_row(name)
    for what, _, written in HEADLINES[name]:
        if what.startswith("log2"):
            written = f"2^{written}"
        assert re.search(rf"(?<![\d.]){re.escape(written)}(?!\d)", row), (name, what, written)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(HEADLINES))
def test_headline_numbers_from_a_full_run(name, real_data_home, tmp_path):
    run_experiment(load_scenario(name), tmp_path, jobs=2)
    rows = read_results(tmp_path)
    assert len(rows) == len(load_scenario(name).points) * len(_cells_per_point(name))
    for what, compute, written in HEADLINES[name]:
        assert as_written(compute(rows), written) == written, (name, what)


def _cells_per_point(name: str) -> list[tuple[int, int]]:
    config = load_scenario(name).config
    return [
        (fold, rep)
        for fold in config.evaluation.fold_indices()
        for rep in range(config.repetitions)
    ]
