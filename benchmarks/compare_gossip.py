"""Compare gossip group formation with the central sampler: uniformity, accuracy, cost, faults.

(a) Uniformity. P = 100, g = 10, epsilon / epsilon_A = 50 (500 groups): a chi-square test of
    how often each peer lands in the first half of the groups (before budgets bind), and, for
    P = 30, g = 5, epsilon / epsilon_A = 40, of how often each pair of peers shares a group
    (all groups). Group sizes are fixed and budgets cap memberships, so the counts are a bit
    less dispersed than the multinomial the test assumes: the central sampler, uniform by
    construction, is the calibration. Also tested: is the curator uniform among the members
    (chi-square of each peer's curator count against its memberships / g).
(b) Accuracy. The seed's experiment (Spambase by default, P = 100, g = 10, 10 aggregations
    per peer, full publication) at the seed's epsilon_A = 0.1 and at epsilon_A = 5, on every
    cross-validation fold, central and gossip: mean ensemble error and the paired difference
    with its 95% t interval.
(c) Cost, from the epsilon_A = 5 runs: messages per aggregation of the sampler (central: one
    ``ASSIGN`` per member; gossip: formation protocol + view gossip) and of the members'
    submissions, per peer, and simulated time to the last aggregation (central with one group
    at a time, the seed's loop, and with P / g groups in flight).
(d) Faults. Network loss 0 - 0.5 for the central sampler, gossip, and gossip with churn
    (lognormal sessions, median 60 s, downtime median 20 s) and crashes (5% curator, 5%
    member), epsilon_A = 5: aggregations completed and mean error, averaged over folds,
    drawn to ``--figure``. Slow (tens of minutes): a hopeless gossip run ends only when every
    peer has failed ``groups.max_failed_attempts`` times in a row.

Usage::

    P2PDP_DATA_HOME=../shared/datasets python benchmarks/compare_gossip.py --figure faults.png
    python benchmarks/compare_gossip.py --dataset synthetic --folds 3 --seeds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from contextlib import contextmanager

import numpy as np
from scipy import stats

from p2pdp.config import NetworkConfig, ScenarioConfig
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.settings import EvaluationConfig
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GroupsConfig, PublicationConfig
from p2pdp.sim.world import World

LOSSES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
#: The seed's epsilon_A (its noise makes every published model worse than a local one on
#: Spambase), and one where aggregation helps; (c) and (d) use the last.
EPSILONS_PER_AGGREGATION = (0.1, 5.0)
FAULTY = {"churn": True, "curator_crash_probability": 0.05, "member_crash_probability": 0.05}
OVERLAY_KINDS = ("random-regular", "watts-strogatz", "barabasi-albert")


@contextmanager
def observing():
    """Capture the next runs' worlds and every group started: (members, curator)."""
    worlds: list[World] = []
    groups: list[tuple[np.ndarray, int]] = []
    run, start_group = World.run, World.start_group

    def run_(self):
        worlds.append(self)
        run(self)

    def start_group_(self, members, curator, **kwargs):
        groups.append((members.copy(), curator))
        return start_group(self, members, curator, **kwargs)

    World.run, World.start_group = run_, start_group_
    try:
        yield worlds, groups
    finally:
        World.run, World.start_group = run, start_group


def synthetic_scenario(n_peers: int, group_size: int, ratio: int, seed: int) -> ScenarioConfig:
    return ScenarioConfig(
        seed=seed,
        data=DataConfig(dataset="synthetic", synthetic_rows=20 * n_peers, synthetic_test_rows=200),
        partition=PartitionConfig(n_peers=n_peers),
        privacy=PrivacyConfig(epsilon=1.0, epsilon_per_aggregation=1.0 / ratio),
        groups=GroupsConfig(group_size=group_size),
        evaluation=EvaluationConfig(split="fixed"),
    )


def with_sampler(config: ScenarioConfig, sampler: str, **gossip) -> ScenarioConfig:
    groups = dataclasses.replace(config.groups, sampler=sampler)
    return dataclasses.replace(
        config, groups=groups, gossip=dataclasses.replace(config.gossip, **gossip)
    )


def uniformity(seeds: int) -> None:
    print("(a) uniformity: chi-square p-values per seed (central is the calibration)")
    print("    (chi2/df: dispersion against the multinomial; < 1 is more even than random)")
    variants = [
        ("central", "central", {}, 1),
        ("central, P/g in flight", "central", {}, 10),
        *((f"gossip ({kind})", "gossip", {"overlay": kind}, 1) for kind in OVERLAY_KINDS),
    ]
    for label, sampler, gossip, in_flight in variants:
        tests: dict[str, list] = {"peer": [], "pair": [], "curator": []}
        for seed in range(seeds):
            for n_peers, group_size, ratio in ((100, 10, 50), (30, 5, 40)):
                config = with_sampler(
                    synthetic_scenario(n_peers, group_size, ratio, seed), sampler, **gossip
                )
                groups_config = dataclasses.replace(config.groups, max_concurrent_groups=in_flight)
                with observing() as (_, groups):
                    simulate(dataclasses.replace(config, groups=groups_config))
                members = np.array([m for m, _ in groups])
                if n_peers == 100:
                    first_half = members[: len(members) // 2].ravel()
                    tests["peer"].append(stats.chisquare(np.bincount(first_half, minlength=100)))
                    curators = np.bincount([c for _, c in groups], minlength=100)
                    expected = np.bincount(members.ravel(), minlength=100) / group_size
                    tests["curator"].append(stats.chisquare(curators, expected))
                else:
                    together = np.zeros((n_peers, n_peers))
                    for group in members:
                        together[np.ix_(group, group)] += 1
                    pairs = together[np.triu_indices(n_peers, 1)]
                    tests["pair"].append(stats.chisquare(pairs))
        for name, results in tests.items():
            p_values = np.array([r.pvalue for r in results])
            df = {"peer": 99, "pair": 30 * 29 // 2 - 1, "curator": 99}[name]
            dispersion = np.mean([r.statistic for r in results]) / df
            print(
                f"  {label:>26} {name:>7}: p = {' '.join(f'{v:.3f}' for v in p_values)}"
                f"  ({np.mean(p_values < 0.05):.0%} < 0.05; chi2/df {dispersion:.2f})"
            )


def seed_experiment(dataset: str, epsilon_per_aggregation: float) -> ScenarioConfig:
    """P = 100, g = 10, 10 aggregations per peer (epsilon = 10 epsilon_A), full publication."""
    data = DataConfig(dataset=dataset)
    if dataset == "synthetic":
        data = DataConfig(dataset="synthetic", synthetic_rows=4000, synthetic_test_rows=1000)
    return ScenarioConfig(
        seed=2026,
        data=data,
        partition=PartitionConfig(n_peers=100),
        privacy=PrivacyConfig(
            epsilon=10 * epsilon_per_aggregation, epsilon_per_aggregation=epsilon_per_aggregation
        ),
        groups=GroupsConfig(group_size=10),
        publication=PublicationConfig(mode="full"),
        evaluation=EvaluationConfig(),
    )


def run_cell(config: ScenarioConfig, fold: int) -> dict:
    """One run: error, aggregations, cost counters, time to the last aggregation."""
    with observing() as (worlds, _):
        result = simulate(config, fold=fold)
    world = worlds[0]
    sampler, transport = world.sampler, world.transport
    if config.groups.sampler == "gossip":
        formation, gossip = sampler.formation_messages, sampler.gossip_messages
        peer_to_peer = formation + gossip  # the central sampler's ASSIGNs are control messages
    else:
        formation, gossip, peer_to_peer = transport.control_messages, 0, 0
    # what the peers sent besides the sampler's messages: the members' submissions (the full
    # publication, one broadcast to the P - 1 others with everyone online, is left out)
    broadcast_copies = len(world.published) * (config.partition.n_peers - 1)
    submissions = int(transport.messages_sent.sum()) - broadcast_copies - peer_to_peer
    return {
        "error": float(result.evaluation.metrics.errors.mean()),
        "local_error": result.evaluation.local_only_error,
        "aggregations": result.aggregations,
        "aborted": result.aborted_groups,
        "sampler_messages": formation + gossip,
        "formation": formation,
        "gossip": gossip,
        "member_messages": submissions,
        "time_to_finish": world.monitor.end_time,
    }


def accuracy_and_cost(dataset: str, folds: int) -> None:
    for epsilon_per_aggregation in EPSILONS_PER_AGGREGATION:
        base = seed_experiment(dataset, epsilon_per_aggregation)
        cells = {
            "central": base,
            "central, P/g in flight": dataclasses.replace(
                base, groups=dataclasses.replace(base.groups, max_concurrent_groups=10)
            ),
            "gossip": with_sampler(base, "gossip"),
        }
        rows = {
            name: [run_cell(cell, fold) for fold in range(folds)] for name, cell in cells.items()
        }
        print(
            f"(b) accuracy on {dataset}, P = 100, g = 10, epsilon_A = {epsilon_per_aggregation:g}, "
            f"epsilon = {10 * epsilon_per_aggregation:g}, {folds} folds "
            f"(local models alone: {np.mean([r['local_error'] for r in rows['central']]):.4f})"
        )
        for name, runs in rows.items():
            errors = [r["error"] for r in runs]
            aggregations = np.mean([r["aggregations"] for r in runs])
            print(
                f"  {name:>24}: mean error {np.mean(errors):.4f} (sd over folds "
                f"{np.std(errors):.4f}), aggregations {aggregations:.1f}"
            )
        gossip_errors = np.array([r["error"] for r in rows["gossip"]])
        central_errors = np.array([r["error"] for r in rows["central"]])
        difference = gossip_errors - central_errors
        if folds >= 2:
            half_width = stats.t.ppf(0.975, folds - 1) * difference.std(ddof=1) / np.sqrt(folds)
            p_value = stats.ttest_rel(gossip_errors, central_errors).pvalue
            print(
                f"  gossip - central: {difference.mean():+.4f} +- {half_width:.4f} (95% t "
                f"interval, paired by fold; paired t-test p = {p_value:.3f})"
            )
    print("(c) cost per aggregation (last runs of (b)) and simulated time to the last aggregation")
    for name, runs in rows.items():
        aggregations = np.array([max(r["aggregations"], 1) for r in runs], dtype=float)

        def per(key, runs=runs, aggregations=aggregations):
            return float(np.mean(np.array([r[key] for r in runs]) / aggregations))

        sampler, members = per("sampler_messages"), per("member_messages")
        print(
            f"  {name:>24}: sampler {sampler:7.1f} msgs (formation {per('formation'):.1f}, "
            f"gossip {per('gossip'):.1f}), submissions {members:.1f}; per peer "
            f"{(sampler + members) / 100:.2f} msgs per aggregation; time to finish "
            f"{np.mean([r['time_to_finish'] for r in runs]):.1f} s"
        )


def faults(dataset: str, folds: int, figure: str | None) -> None:
    base = seed_experiment(dataset, EPSILONS_PER_AGGREGATION[-1])
    variants = {
        "central": base,
        "gossip": with_sampler(base, "gossip"),
        "gossip + churn + crashes": with_sampler(base, "gossip", **FAULTY),
    }
    print(f"(d) loss sweep on {dataset}: aggregations and mean error (mean over {folds} folds)")
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for name, config in variants.items():
        aggregations, errors = [], []
        for loss in LOSSES:
            cell = dataclasses.replace(config, network=NetworkConfig(loss=loss))
            runs = [run_cell(cell, fold) for fold in range(folds)]
            aggregations.append(float(np.mean([r["aggregations"] for r in runs])))
            errors.append(float(np.mean([r["error"] for r in runs])))
            print(
                f"  {name:>26} loss {loss:.1f}: aggregations {aggregations[-1]:6.1f}, "
                f"aborted {np.mean([r['aborted'] for r in runs]):6.1f}, error {errors[-1]:.4f}",
                flush=True,
            )
        curves[name] = (aggregations, errors)
    if figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for name, (aggregations, errors) in curves.items():
            left.plot(LOSSES, aggregations, marker="o", label=name)
            right.plot(LOSSES, errors, marker="o", label=name)
        left.set(xlabel="message loss probability", ylabel="aggregations completed")
        right.set(xlabel="message loss probability", ylabel="mean ensemble error")
        left.legend(loc="lower left")
        fig.suptitle(f"{dataset}, P = 100, g = 10, epsilon_A = {EPSILONS_PER_AGGREGATION[-1]:g}")
        fig.tight_layout()
        fig.savefig(figure, dpi=120)
        print(f"  figure written to {figure}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="spambase", help="data set of (b)-(d)")
    parser.add_argument("--folds", type=int, default=10, help="folds in (b) and (c)")
    parser.add_argument("--fault-folds", type=int, default=3, help="folds per point in (d)")
    parser.add_argument("--seeds", type=int, default=5, help="repetitions in (a)")
    parser.add_argument("--figure", default=None, help="PNG path for the loss sweep (d)")
    parser.add_argument("--parts", default="abcd", help="which parts to run, e.g. 'ad'")
    args = parser.parse_args(argv)
    if "a" in args.parts:
        uniformity(args.seeds)
    if "b" in args.parts or "c" in args.parts:
        accuracy_and_cost(args.dataset, args.folds)
    if "d" in args.parts:
        faults(args.dataset, args.fault_folds, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
