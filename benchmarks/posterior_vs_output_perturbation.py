"""Spambase, P = 100 IID peers, g = 1: each peer's private model alone, posterior sampling vs
output perturbation at the same epsilon.

Posterior sampling: :func:`p2pdp.privacy.posterior_sampling.posterior.private_logistic_peers` (all
peers in one batch,
``tau`` fixed a priori, :data:`p2pdp.privacy.posterior_sampling.posterior.PEER_SETTINGS`); the
released model is the mean
of the peer's private mean-field posterior. Output perturbation: the peer's exact model plus
vector Laplace noise at L2 sensitivity ``2 / (n_j lambda)``. Both are epsilon-DP per record of
the peer's shard (posterior sampling: for exact sampling only; the chain approximates it).
Reference lines: local-only (exact, non-private) and centralised (all training rows).
One fold of the project's 10-fold split (fold 0); lambda = 2^-7; preprocessing as configured by
``ScenarioConfig`` defaults (log1p, min-max, bias, projection onto the unit ball).

Usage: ``python benchmarks/posterior_vs_output_perturbation.py [--taus 1] [--fold 0]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.rng import generator
from p2pdp.data.settings import PartitionConfig
from p2pdp.learning.settings import TrainingConfig
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.posterior_sampling.posterior import (
    GUARANTEE_LABEL,
    PEER_SETTINGS,
    private_logistic_peers,
)
from p2pdp.tasks.pipeline import prepare_peers

LAM = 2.0**-7
EPSILONS = (0.1, 1.0, 10.0)


def errors(X_test: np.ndarray, y_test: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Test error of every model (rows of ``weights``), ties (margin 0) predicted +1."""
    predictions = np.where(X_test @ weights.T >= 0, 1, -1)
    return (predictions != y_test[:, None]).mean(axis=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--taus", type=float, nargs="+", default=[1.0])
    parser.add_argument("--fold", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = ScenarioConfig(
        name="posterior_vs_output_perturbation",
        seed=args.seed,
        partition=PartitionConfig(n_peers=100),
        training=TrainingConfig(lam=LAM),
    )
    trained = prepare_peers(config, fold=args.fold)
    fold = trained.fold
    Xs = [fold.X_train[shard] for shard in trained.shards]
    ys = [fold.y_train[shard] for shard in trained.shards]
    sizes = trained.models.shard_sizes
    local = errors(fold.X_test, fold.y_test, trained.models.weights)
    central = errors(fold.X_test, fold.y_test, trained.centralized[None])[0]
    print(f"spambase fold {args.fold}, P = {len(sizes)}, n_j = {sizes.min()}-{sizes.max()}, "
          f"lambda = 2^-7, d = {fold.X_train.shape[1]}")  # fmt: skip
    print(f"local-only (non-private) mean error {local.mean():.3f}; centralised {central:.3f}")
    header = (
        f"{'epsilon':>7} {'tau':>5} {'posterior':>9} {'(sd)':>6} {'output-pert':>11} {'(sd)':>6}"
        f" {'Rhat mu med':>11} {'ESS mu med':>10} {'h_end':>6} {'seconds':>7}"
    )
    print(header)
    print("-" * len(header))
    total = 0.0
    for tau in args.taus:
        for epsilon in EPSILONS:
            started = time.perf_counter()
            samples = private_logistic_peers(
                Xs, ys, lam=LAM, epsilon=epsilon, tau=tau, settings=PEER_SETTINGS,
                rng=generator(args.seed, "posterior-peers", args.fold, epsilon, tau),
            )  # fmt: skip
            seconds = time.perf_counter() - started
            total += seconds
            posterior = errors(fold.X_test, fold.y_test, np.asarray(samples.means))
            mechanism = make_mechanism("vector-laplace", epsilon=epsilon)
            noise_rng = generator(args.seed, "output-perturbation", args.fold, epsilon)
            unit = mechanism.sample(1.0, fold.X_train.shape[1], rng=noise_rng, size=len(sizes))
            perturbed = trained.models.weights + unit * (2.0 / (sizes * LAM))[:, None]
            output = errors(fold.X_test, fold.y_test, perturbed)
            d = samples.means.shape[1]
            print(
                f"{epsilon:>7g} {tau:>5g} {posterior.mean():>9.3f} {posterior.std():>6.3f} "
                f"{output.mean():>11.3f} {output.std():>6.3f} "
                f"{np.nanmedian(samples.rhat[:, :d]):>11.3f} "
                f"{np.nanmedian(samples.ess[:, :d]):>10.1f} {samples.final_step_size:>6.3g} "
                f"{seconds:>7.1f}"
            )
    print(f"posterior sampling for all peers: {total:.1f} s in total; guarantee: {GUARANTEE_LABEL}")


if __name__ == "__main__":
    main()
