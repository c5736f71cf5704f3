"""Wiring of ``privacy.mechanism = "posterior-sampling"`` (issue 14): a peer (a group of one)
publishes a private sample of its own logistic posterior in place of an output-perturbed model.

The published vectors are compared with samples drawn here directly from
:func:`p2pdp.privacy.posterior_sampling.posterior.private_logistic_peers` on each peer's raw shard,
so a release path that
added noise to the exact model, a world that reused a peer's first sample for its second
release, or a task that drew the samples on other streams fails. The sampler runs a short
schedule (:data:`SHORT`, patched into the task) to keep the suite fast: these tests check the
wiring, ``tests/privacy/test_posterior_sampling.py`` the sampler.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.experiments.run.cells import make_cells, run_task
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import parse_scenario
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.posterior_sampling.langevin import SamplerSettings
from p2pdp.privacy.posterior_sampling.posterior import GUARANTEE_LABEL, private_logistic_peers
from p2pdp.privacy.release import Releaser
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GroupsConfig
from p2pdp.sim.world import World, WorldObserver
from p2pdp.tasks import make_task
from p2pdp.tasks.logistic import task as logistic
from p2pdp.tasks.logistic.task import POSTERIOR_COLUMNS

SHORT = SamplerSettings(
    n_optimise=10, n_burnin=30, n_samples=40, trace_points=8, continuation_stages=1
)

SCENARIO = """
name = "posterior_small"
seed = 5

[data]
dataset = "synthetic"
synthetic_rows = 200
synthetic_test_rows = 100
synthetic_features = 4

[partition]
n_peers = 6

[training]
lambda = 0.05

[privacy]
epsilon = 2.0
epsilon_per_aggregation = 1.0
tau = 1.5

[groups]
group_size = 1

[publication]
mode = "full"

[evaluation]
cv_folds = 5
folds = [0]

[sweep]
"privacy.mechanism" = ["posterior-sampling", "vector-laplace"]
"""


class Capture(WorldObserver):
    """Every release with its members and the count of releases each member had joined."""

    def __init__(self) -> None:
        self.members: list[int] = []
        self.rounds: list[int] = []
        self.world = None

    def group_started(self, world, group) -> None:
        self.world = world

    def released(self, world, group, record) -> None:
        (member,) = group.members.tolist()
        self.members.append(member)
        # released before the ledger spends: this is the member's count before the release
        self.rounds.append(int(world.ledger.aggregations()[member]) - 1)


@pytest.fixture(scope="module", autouse=True)
def short_chains():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logistic, "PEER_SETTINGS", SHORT)
        yield


@pytest.fixture(scope="module")
def scenario():
    return parse_scenario(SCENARIO, source="posterior_small")


@pytest.fixture(scope="module")
def records(scenario):
    cells = make_cells(scenario)
    return {
        cell.config.privacy.mechanism: run for cell, run in zip(cells, run_task(cells), strict=True)
    }


@pytest.fixture(scope="module")
def posterior_config(scenario):
    (cell,) = [c for c in make_cells(scenario) if c.config.privacy.mechanism != "vector-laplace"]
    return cell.config


def test_scenario_rows_and_releases_carry_the_approximation_label(records):
    assert GUARANTEE_LABEL == "approximate: exact only for exact sampling"
    posterior, laplace = records["posterior-sampling"], records["vector-laplace"]
    assert posterior.row["guarantee"] == GUARANTEE_LABEL
    assert laplace.row["guarantee"] == "exact"
    releases = posterior.tables["releases"]
    assert len(releases) == 6 * 2  # two releases per peer (epsilon 2, 1 per release)
    assert {row["guarantee"] for row in releases} == {GUARANTEE_LABEL}
    assert {row["mechanism"] for row in releases} == {"posterior-sampling"}
    # budgets unchanged: basic composition of the declared epsilon per release
    assert posterior.row["max_epsilon_spent"] == pytest.approx(2.0)
    assert posterior.row["max_guaranteed_epsilon"] == pytest.approx(2.0)
    assert posterior.row["guaranteed_epsilon_per_aggregation"] == pytest.approx(1.0)
    # chain diagnostics in the row (for the other mechanism: the same columns, nan)
    assert all(np.isfinite(posterior.row[name]) for name in POSTERIOR_COLUMNS)
    assert posterior.row["posterior_max_rhat"] >= 1.0
    assert posterior.row["posterior_final_step_size"] == SHORT.step_final
    assert all(np.isnan(laplace.row[name]) for name in POSTERIOR_COLUMNS)
    assert set(posterior.row) == set(laplace.row)  # one results table for both


def test_published_vectors_are_the_peers_posterior_samples(posterior_config):
    trained = make_task(posterior_config).prepare(fold=0, repetition=0)
    capture, again = Capture(), Capture()
    simulate(posterior_config, trained=trained, observers=(capture,))
    simulate(posterior_config, trained=trained, observers=(again,))  # same seed, same releases
    world = capture.world
    np.testing.assert_array_equal(np.array(world.published), np.array(again.world.published))
    X, y = trained.fold.X_train, trained.fold.y_train
    Xs = [X[shard] for shard in trained.shards]
    ys = [y[shard] for shard in trained.shards]
    expected = [
        np.asarray(
            private_logistic_peers(
                Xs, ys, lam=0.05, epsilon=1.0, tau=1.5, settings=SHORT,
                rng=generator(5, "posterior-sampling", 0, 0, r),
            ).means
        )
        for r in range(2)
    ]  # fmt: skip
    published = np.array(world.published)
    assert sorted(zip(capture.members, capture.rounds, strict=True)) == [
        (peer, r) for peer in range(6) for r in range(2)
    ]
    for k, (peer, r) in enumerate(zip(capture.members, capture.rounds, strict=True)):
        np.testing.assert_array_equal(published[k], expected[r][peer])
    # a fresh draw per release, and not the exact model plus noise
    assert not np.allclose(expected[0], expected[1])
    exact = trained.models.weights[capture.members]
    assert np.all(np.linalg.norm(published - exact, axis=1) > 1e-3)
    assert all(record.noise_norm == 0.0 for record in world.releases)


def test_first_release_does_not_depend_on_the_budget(posterior_config):
    task = make_task(posterior_config)
    trained = task.prepare(fold=0, repetition=0)
    two, _ = task.statistics(trained)
    one_release = dataclasses.replace(
        posterior_config,
        privacy=dataclasses.replace(posterior_config.privacy, epsilon=1.0),
    )
    one, _ = make_task(one_release).statistics(trained)
    assert two.shape[:2] == (6, 2) and one.shape[:2] == (6, 1)
    np.testing.assert_array_equal(one[:, 0], two[:, 0])


def test_groups_of_more_than_one_and_secure_aggregation_are_refused(posterior_config):
    with pytest.raises(ConfigError, match=r"groups\.group_size must be 1 .*posterior-sampling"):
        dataclasses.replace(posterior_config, groups=GroupsConfig(group_size=2))
    with pytest.raises(ConfigError, match=r"groups\.group_size must be 1"):
        parse_scenario(SCENARIO.replace("group_size = 1", "group_size = 3"), source="bad")
    with pytest.raises(ConfigError, match=r"secure_aggregation = true cannot be used"):
        PrivacyConfig(mechanism="posterior-sampling", secure_aggregation=True)
    with pytest.raises(ConfigError, match=r"privacy\.tau must be > 0"):
        PrivacyConfig(mechanism="posterior-sampling", tau=0.0)


def test_world_refuses_a_record_mechanism_on_plain_statistics(posterior_config):
    mechanism = make_mechanism("posterior-sampling", epsilon=1.0)
    releaser = Releaser(
        mechanism, 3, aggregate="mean", secure=False,
        noise_rng=generator(0, "n"), share_rng=generator(0, "s"),
    )  # fmt: skip
    rngs = {name: generator(0, name) for name in ("protocol", "network")}
    with pytest.raises(ConfigError, match="needs a fresh statistic per peer and release"):
        World(
            posterior_config, np.zeros((6, 3)), np.full(6, 10), releaser=releaser,
            sensitivity=lambda sizes: 1.0, rngs=rngs,
        )  # fmt: skip


def test_p2pdp_audit_runs_the_posterior_audits(capsys, monkeypatch):
    from p2pdp.experiments.audit import table as audit
    from p2pdp.experiments.cli import main
    from p2pdp.privacy.posterior_sampling import audit as posterior_audit

    assert main(["audit", "--mechanism", "posterior-logistic-exact"]) == 0
    printed = capsys.readouterr().out
    assert "posterior-logistic-exact" in printed and "pass" in printed
    with pytest.raises(ConfigError, match="posterior audits are"):
        posterior_audit.run_posterior_audit(["posterior-nonsense"])
    # without --mechanism: every posterior audit after the others, one at a time (recorded,
    # not run: ~1 min), each announced on stderr before it runs
    from p2pdp.experiments.audit import correlated as correlated_audit
    from p2pdp.experiments.audit import iterative as iterative_audit

    asked = []

    def record(names, **kw):
        asked.extend((name, capsys.readouterr().err) for name in names)
        return []

    monkeypatch.setattr(audit, "run_audit", record)
    monkeypatch.setattr(posterior_audit, "run_posterior_audit", record)
    monkeypatch.setattr(iterative_audit, "run_iterative_audit", record)
    monkeypatch.setattr(correlated_audit, "run_correlated_audit", record)
    capsys.readouterr()
    assert main(["audit"]) == 0
    every = [
        *audit.AUDIT_NAMES,
        *posterior_audit.POSTERIOR_AUDIT_NAMES,
        *iterative_audit.ITERATIVE_AUDIT_NAMES,
        *correlated_audit.CORRELATED_AUDIT_NAMES,
    ]
    assert [name for name, _ in asked] == every
    announced = [f"p2pdp audit: [{i}/{len(every)}] {name}\n" for i, name in enumerate(every, 1)]
    assert [printed for _, printed in asked] == announced
