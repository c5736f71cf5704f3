"""Ensemble rules that use public noise scales, measured on Spambase (issue 12's targets).

    python benchmarks/utility_rules.py                       # every target cell, 10 folds
    python benchmarks/utility_rules.py --folds 2 --cells frontier
    python benchmarks/utility_rules.py --json out.jsonl      # one JSON row per (cell, fold)

The simulator cannot call the new rules yet (issue 10 is making the engine open), so this
script rebuilds a run's releases the way
:func:`p2pdp.experiments.run.simulation.simulate` does (same seed,
same named random streams, so the same published models) and applies every rule of
:mod:`p2pdp.learning.ensembles` to them. Each release's noise scale is exact: the script records the
group's shard sizes at publication (a wrapper around ``World.publish``) and evaluates
``mechanism.noise_std(group_sensitivity(sizes, ...), d)``.

Gaussian cells use exact (GDP) composition: the ledger's count is replaced by
:func:`p2pdp.privacy.gdp.affordable_aggregations_gdp` at the mechanism's noise multiplier before the
world runs (what ``accountant = "gdp"`` will do once wired in).

Prints the mean test error over folds (mean over peers within a fold) per rule and cell and
the evaluation cost of each rule.

Measured (10 folds, P = 100, lambda = 2^-7, full publication; local-only 0.129, centralised at
the peers' lambda 0.109, at its own CV lambda 0.061):

* never hurts: ``local-validated`` within +0.0015 of local-only in all 32 cells with epsilon
  in {0.1, 1}, g in {10, 20, 50, 100}, epsilon_A in {epsilon/10, epsilon}, vector Laplace and
  Gaussian (the seed's majority: 0.12-0.50);
* epsilon = 10, g = 10: Gaussian 0.116 (epsilon_A = 1, 70 aggregations per peer under exact
  composition) and 0.114 (epsilon_A = 10); vector Laplace 0.117 (epsilon_A = 10) but 0.126
  (epsilon_A = 1; seed rule 0.148);
* epsilon = 1, g = 100, epsilon_A = 1 (one release), paired against the seed's majority:
  vector Laplace -0.005 (0.127 vs 0.132), Gaussian +0.0000 (0.121 vs 0.121);
* cost on spambase_group_vs_full's 56 cells (``--cost``): ``local-validated`` adds x1.17 to
  a cell's simulate() if computed next to the majority, x0.79 if instead of it.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from p2pdp.core.errors import PrivacyWarning
from p2pdp.core.rng import generator
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import load_scenario, with_values
from p2pdp.learning.ensembles import (
    OwnShards,
    PublicView,
    average_rule,
    cross_validate_own_models,
    local_validated_rule,
    majority_rule,
    mean_margin_rule,
    personalised_refit_rule,
)
from p2pdp.learning.evaluation import evaluate_ensembles, linear_error
from p2pdp.learning.models import GRADIENT_TOLERANCE
from p2pdp.learning.references import centralised_best_lambda
from p2pdp.learning.rules import build_ensembles
from p2pdp.privacy.calibration import group_sensitivity
from p2pdp.privacy.gdp import affordable_aggregations_gdp
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.sim.world import World
from p2pdp.tasks.pipeline import prepare_peers

DELTA = 1e-5


@dataclass(frozen=True)
class Cell:
    epsilon: float
    epsilon_per_aggregation: float
    group_size: int
    mechanism: str

    def label(self) -> str:
        mech = "VL" if self.mechanism == "vector-laplace" else "G"
        return (
            f"eps={self.epsilon:g} epsA={self.epsilon_per_aggregation:g} g={self.group_size} {mech}"
        )


def target_cells() -> list[Cell]:
    cells = [
        Cell(eps, eps_a, g, mech)
        for mech in ("vector-laplace", "gaussian")
        for eps in (0.1, 1.0)
        for eps_a in (eps / 10, eps)
        for g in (10, 20, 50, 100)
    ]
    cells += [Cell(10.0, e, 10, m) for m in ("vector-laplace", "gaussian") for e in (1.0, 10.0)]
    return cells


def frontier_cells() -> list[Cell]:
    return [
        Cell(eps, eps / 10, g, mech)
        for mech in ("vector-laplace", "gaussian")
        for eps in (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
        for g in (10, 20, 50, 100)
    ]


def refit_cells() -> list[Cell]:
    """A few cells for the (slow) personalised refit: noisy, moderate and good releases."""
    return [
        Cell(0.1, 0.01, 20, "gaussian"),
        Cell(1.0, 0.1, 20, "vector-laplace"),
        Cell(1.0, 1.0, 100, "vector-laplace"),
        Cell(1.0, 1.0, 100, "gaussian"),
        Cell(1.0, 0.1, 100, "gaussian"),
        Cell(10.0, 1.0, 10, "vector-laplace"),
        Cell(10.0, 1.0, 10, "gaussian"),
    ]


def cell_config(base, cell: Cell):
    settings = {
        "privacy.epsilon": cell.epsilon,
        "privacy.epsilon_per_aggregation": cell.epsilon_per_aggregation,
        "privacy.mechanism": cell.mechanism,
        "groups.group_size": cell.group_size,
        "publication.mode": "full",
    }
    if cell.mechanism == "gaussian":
        settings["privacy.delta"] = DELTA
        settings["privacy.delta_per_aggregation"] = (
            DELTA * cell.epsilon_per_aggregation / cell.epsilon
        )
    return with_values(base, settings)


def run_world(config, trained, fold: int):
    """The releases of ``simulate(config, fold=fold)``, with each release's noise std."""
    privacy = config.privacy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        mechanism = make_mechanism(
            privacy.mechanism,
            epsilon=privacy.epsilon_per_aggregation,
            delta=privacy.delta_per_aggregation if privacy.mechanism == "gaussian" else None,
        )
    rngs = {
        name: generator(config.seed, name, fold, 0)
        for name in ("protocol", "network", "noise", "shares")
    }
    weights = trained.models.weights
    world = World(config, weights, trained.models.shard_sizes, mechanism, rngs=rngs)
    if privacy.mechanism == "gaussian":  # exact composition instead of the configured count
        world.ledger.max_aggregations = affordable_aggregations_gdp(
            privacy.epsilon, privacy.delta, mechanism.noise_multiplier
        )
    sensitivities: list[float] = []
    publish = world.publish

    def recording_publish(group, model):
        sensitivities.append(
            group_sensitivity(
                group.sizes,
                config.training.lam,
                mode=privacy.sensitivity,
                gradient_tolerance=GRADIENT_TOLERANCE,
            )
        )
        publish(group, model)

    world.publish = recording_publish
    start = time.perf_counter()
    world.run()
    sim_seconds = time.perf_counter() - start
    dim = weights.shape[1]
    published = np.array(world.published).reshape(len(world.published), dim)
    noise_std = np.array([mechanism.noise_std(s, dim) for s in sensitivities])
    pairs = np.array(world.receipts, dtype=np.int64).reshape(-1, 2)
    shared = np.array(world.shared, dtype=bool)
    receipts = sp.csr_matrix(
        (np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(weights.shape[0], len(published))
    )
    view = PublicView(
        own_weights=weights,
        published=published,
        noise_std=noise_std,
        shared=shared,
        receipts=receipts,
    )
    ensembles = build_ensembles(weights, published, shared, pairs[:, 0], pairs[:, 1])
    return view, ensembles, sim_seconds, int(world.ledger.aggregations().mean())


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=10)
    parser.add_argument("--cells", choices=("targets", "frontier", "refit"), default="targets")
    parser.add_argument("--json", help="append one JSON row per (cell, fold) to this file")
    parser.add_argument("--refit", action="store_true", help="also personalised-refit (slow)")
    parser.add_argument(
        "--cost",
        action="store_true",
        help="time the rules against simulate() on one fold of spambase_group_vs_full's grid",
    )
    args = parser.parse_args(argv)
    if args.cost:
        return measure_cost()

    base = load_scenario("spambase_group_vs_full").config
    cells = {"targets": target_cells, "frontier": frontier_cells, "refit": refit_cells}[
        args.cells
    ]()
    rows = []
    out = open(args.json, "a") if args.json else None
    for fold in range(args.folds):
        trained = prepare_peers(base, fold=fold)
        data = trained.fold
        own = OwnShards(
            X=data.X_train, y=data.y_train, shards=trained.shards, lam=base.training.lam
        )
        cv, cv_seconds = timed(
            lambda own=own, fold=fold: cross_validate_own_models(
                own, rng=generator(base.seed, "ensemble-cv", fold)
            )
        )
        reference, ref_seconds = timed(
            lambda data=data, fold=fold: centralised_best_lambda(
                data.X_train, data.y_train, rng=generator(base.seed, "reference", fold)
            )
        )
        local = float(linear_error(trained.models.weights, data.X_test, data.y_test).mean())
        central = float(linear_error(trained.centralized, data.X_test, data.y_test)[0])
        best = float(linear_error(reference.weights, data.X_test, data.y_test)[0])
        print(
            f"fold {fold}: local {local:.4f} central@peers {central:.4f} "
            f"central@best(lambda=2^{np.log2(reference.lam):.0f}) {best:.4f}; "
            f"cv refits {cv_seconds:.2f} s, reference {ref_seconds:.2f} s",
            flush=True,
        )
        for cell in cells:
            config = cell_config(base, cell)
            view, ensembles, sim_seconds, per_peer = run_world(config, trained, fold)
            row = {
                "cell": cell.label(),
                "fold": fold,
                "aggregations_per_peer": per_peer,
                "releases": int(view.published.shape[0]),
                "local": local,
                "central_peers_lambda": central,
                "central_best_lambda": best,
                "best_lambda": reference.lam,
                "sim_s": sim_seconds,
                "cv_s": cv_seconds,
            }
            metrics, seconds = timed(
                lambda ensembles=ensembles, data=data: evaluate_ensembles(
                    ensembles, data.X_test, data.y_test, vote="majority"
                )
            )
            row["seed-majority"], row["seed-majority_s"] = float(metrics.errors.mean()), seconds
            rules = {
                "majority": lambda v: majority_rule(v),
                "mean-margin": lambda v: mean_margin_rule(v),
                "average": lambda v: average_rule(v),
                "local-validated": lambda v, own=own, cv=cv: local_validated_rule(v, own, cv=cv),
            }
            if args.refit:
                rules["personalised-refit"] = lambda v, own=own, cv=cv: personalised_refit_rule(
                    v, own, cv=cv
                )
            for name, rule in rules.items():
                start = time.perf_counter()
                predictors = rule(view)
                scores = predictors.scores(data.X_test)
                errors = (np.where(scores >= 0, 1, -1) != data.y_test[:, None]).mean(axis=0)
                row[name], row[f"{name}_s"] = float(errors.mean()), time.perf_counter() - start
            rows.append(row)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            print(
                f"  {cell.label():32s} k={per_peer:3d} seed {row['seed-majority']:.4f} "
                f"maj {row['majority']:.4f} avg {row['average']:.4f} "
                f"lv {row['local-validated']:.4f} "
                + (f"refit {row['personalised-refit']:.4f}" if args.refit else ""),
                flush=True,
            )
    if out:
        out.close()
    summarise(rows)
    return 0


def measure_cost(fold: int = 0) -> int:
    """Seconds per cell of ``simulate`` (training shared) against the new rules' evaluation.

    The rules would replace or join the seed's majority evaluation inside ``simulate``; the
    k-fold refits of ``local-validated`` depend only on the fold's training, so they are
    shared by the fold's cells like the local training.
    """
    scenario = load_scenario("spambase_group_vs_full")
    points = scenario.points
    trained = prepare_peers(points[0].config, fold=fold)
    data = trained.fold
    own = OwnShards(
        X=data.X_train, y=data.y_train, shards=trained.shards, lam=points[0].config.training.lam
    )
    cv, cv_seconds = timed(
        lambda: cross_validate_own_models(own, rng=generator(scenario.config.seed, "cv", fold))
    )
    totals = {
        "simulate": 0.0,
        "majority (in simulate)": 0.0,
        "average": 0.0,
        "local-validated": 0.0,
    }
    for point in points:
        result = simulate(point.config, fold=fold, trained=trained)
        totals["simulate"] += result.wall_times["simulation"] + result.wall_times["evaluation"]
        totals["majority (in simulate)"] += result.wall_times["evaluation"]
        view, *_ = run_world(point.config, trained, fold)
        for name, rule in (
            ("average", lambda v: average_rule(v)),
            ("local-validated", lambda v: local_validated_rule(v, own, cv=cv)),
        ):
            start = time.perf_counter()
            weights = rule(view).weights
            linear_error(weights, data.X_test, data.y_test)
            totals[name] += time.perf_counter() - start
    n = len(points)
    per_cell = {k: v / n for k, v in totals.items()}
    cv_share = cv_seconds / n
    base = per_cell["simulate"]
    print(f"{n} cells of spambase_group_vs_full, fold {fold}; seconds per cell:")
    for name, seconds in per_cell.items():
        print(f"  {name:24s} {seconds:.4f}")
    print(f"  cv refits {cv_seconds:.3f} s per fold = {cv_share:.4f} per cell")
    for name in ("average", "local-validated"):
        extra = per_cell[name] + (cv_share if name == "local-validated" else 0.0)
        print(
            f"  {name}: in addition to majority x{(base + extra) / base:.3f}, "
            f"instead of it x{(base - per_cell['majority (in simulate)'] + extra) / base:.3f}"
        )
    return 0


def summarise(rows: list[dict]) -> None:
    names = [
        "seed-majority",
        "majority",
        "mean-margin",
        "average",
        "local-validated",
        "personalised-refit",
    ]
    names = [n for n in names if n in rows[0]]
    print("\nmean test error over folds (mean over peers); delta = rule - local-only")
    header = f"{'cell':34s} {'local':>6s} " + " ".join(f"{n[:10]:>10s}" for n in names)
    print(header)
    for label in dict.fromkeys(r["cell"] for r in rows):
        mine = [r for r in rows if r["cell"] == label]
        local = np.mean([r["local"] for r in mine])
        values = " ".join(f"{np.mean([r[n] for r in mine]):10.4f}" for n in names)
        print(f"{label:34s} {local:6.4f} {values}")
    means = {key: np.mean([r[key] for r in rows]) for key in rows[0] if key not in ("cell",)}
    print(
        f"\nreferences: local-only {means['local']:.4f}, centralised at the peers' lambda "
        f"{means['central_peers_lambda']:.4f}, centralised at its own CV lambda "
        f"{means['central_best_lambda']:.4f}"
    )
    costs = ", ".join(f"{n} {means[n + '_s']:.4f}" for n in names[1:])
    print(
        f"\nseconds per cell (mean): simulation {means['sim_s']:.4f}, seed majority "
        f"evaluation {means['seed-majority_s']:.4f}, {costs}"
    )
    print(f"cv refits per fold (shared by the fold's cells): {means['cv_s']:.3f} s")


if __name__ == "__main__":
    raise SystemExit(main())
