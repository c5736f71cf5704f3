"""The SimPy world: budget arithmetic, publication, determinism, faults, bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pdp.config import NetworkConfig, ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.settings import EvaluationConfig, TrainingConfig
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GroupsConfig, PublicationConfig
from p2pdp.sim import world as world_module
from p2pdp.sim.world import WorldObserver
from p2pdp.tasks.pipeline import prepare_peers


def synthetic(
    *,
    n_peers=20,
    group_size=5,
    epsilon=1.0,
    epsilon_per_aggregation=0.25,
    mode="full",
    rows=400,
    mechanism="vector-laplace",
    secure_aggregation=False,
    seed=1,
    **sections,
) -> ScenarioConfig:
    return ScenarioConfig(
        seed=seed,
        data=DataConfig(dataset="synthetic", synthetic_rows=rows, synthetic_test_rows=200),
        partition=PartitionConfig(n_peers=n_peers),
        privacy=PrivacyConfig(
            epsilon=epsilon,
            epsilon_per_aggregation=epsilon_per_aggregation,
            mechanism=mechanism,
            secure_aggregation=secure_aggregation,
        ),
        groups=sections.pop("groups", GroupsConfig(group_size=group_size)),
        publication=PublicationConfig(mode=mode),
        evaluation=EvaluationConfig(split="fixed"),
        **sections,
    )


class KeepWorld(WorldObserver):
    """Keeps the world it observes (to read what it published once it has run)."""

    world: world_module.World

    def group_started(self, world, group) -> None:
        self.world = world


def test_seed_budget_arithmetic_100_peers():
    """P = 100, g = 10, epsilon / epsilon_A = 10: between 91 and 100 aggregations."""
    config = synthetic(
        n_peers=100, group_size=10, epsilon=1.0, epsilon_per_aggregation=0.1, rows=2000
    )
    result = simulate(config)
    assert 91 <= result.aggregations <= 100
    assert result.aggregations_per_peer.max() <= 10
    assert result.aggregations_per_peer.sum() == 10 * result.aggregations
    np.testing.assert_allclose(result.epsilon_spent, result.aggregations_per_peer * 0.1)
    # the run ends only when fewer than g peers can afford another aggregation
    assert np.count_nonzero(result.aggregations_per_peer < 10) < 10
    assert "fewer than 10 peers" in result.stop_reason


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_peers=st.integers(2, 30),
    group_fraction=st.floats(0.05, 1.0),
    ratio=st.floats(1.0, 6.0),
    concurrent=st.integers(1, 4),
    loss=st.sampled_from([0.0, 0.0, 0.2]),
    mode=st.sampled_from(["group", "full"]),
    seed=st.integers(0, 1000),
)
def test_no_peer_ever_overspends(n_peers, group_fraction, ratio, concurrent, loss, mode, seed):
    group_size = max(1, round(group_fraction * n_peers))
    config = synthetic(
        n_peers=n_peers,
        group_size=group_size,
        epsilon=1.0,
        epsilon_per_aggregation=1.0 / ratio,
        mode=mode,
        rows=max(200, 10 * n_peers),
        seed=seed,
        groups=GroupsConfig(
            group_size=group_size, max_concurrent_groups=concurrent, max_failed_attempts=20
        ),
        network=NetworkConfig(loss=loss, latency="exponential"),
    )
    result = simulate(config)
    assert np.all(result.epsilon_spent <= 1.0 + 1e-9)
    assert result.aggregations_per_peer.max(initial=0) <= int(np.floor(ratio + 1e-9))
    # charged exactly once per published aggregation joined, never for an aborted group
    assert result.aggregations_per_peer.sum() == group_size * result.aggregations


def test_peer_never_in_two_groups_at_once(monkeypatch):
    busy: set[int] = set()
    original_start, original_finish = (
        world_module.World.start_group,
        world_module.World.finish_group,
    )

    def start(self, members, curator, **kwargs):
        assert busy.isdisjoint(members.tolist())
        busy.update(members.tolist())
        return original_start(self, members, curator, **kwargs)

    def finish(self, group, *, published):
        busy.difference_update(group.members.tolist())
        return original_finish(self, group, published=published)

    monkeypatch.setattr(world_module.World, "start_group", start)
    monkeypatch.setattr(world_module.World, "finish_group", finish)
    config = synthetic(
        n_peers=40, groups=GroupsConfig(group_size=4, max_concurrent_groups=5),
        network=NetworkConfig(latency="exponential"),
    )  # fmt: skip
    result = simulate(config)
    assert result.aggregations >= 36


def test_noise_free_full_group_reproduces_the_plain_average():
    config = synthetic(
        n_peers=12, group_size=12, epsilon=1.0, epsilon_per_aggregation=1.0, mechanism="none"
    )
    trained = prepare_peers(config, fold=0)
    for driver in ("reference", "batched"):
        world = KeepWorld()
        result = simulate(config, trained=trained, observers=(world,), driver=driver)
        assert result.aggregations == 1
        average = trained.models.weights.mean(axis=0)
        np.testing.assert_allclose(world.world.published[0], average, atol=1e-12)
        assert np.all(result.evaluation.ensemble_sizes == 2)


def test_group_size_one_publishes_single_noisy_models():
    config = synthetic(
        n_peers=10, group_size=1, epsilon=1.0, epsilon_per_aggregation=0.5, mode="group"
    )
    result = simulate(config)
    assert result.aggregations == 20
    assert np.all(result.aggregations_per_peer == 2)
    assert np.all(result.evaluation.ensemble_sizes == 3)  # own model + its own two noisy releases


def test_group_vs_full_ensembles_and_determinism():
    group = simulate(synthetic(mode="group"))
    full = simulate(synthetic(mode="full"))
    assert group.aggregations == full.aggregations  # same streams: same groups
    np.testing.assert_array_equal(group.evaluation.ensemble_sizes, 1 + group.aggregations_per_peer)
    assert np.all(full.evaluation.ensemble_sizes == 1 + full.aggregations)
    again = simulate(synthetic(mode="group"))
    np.testing.assert_array_equal(group.evaluation.metrics.errors, again.evaluation.metrics.errors)
    assert group.sim_time == again.sim_time and group.bytes_sent == again.bytes_sent
    other_seed = simulate(synthetic(mode="group", seed=2))
    assert not np.array_equal(group.evaluation.metrics.errors, other_seed.evaluation.metrics.errors)


def test_lost_messages_abort_groups_without_charging():
    config = synthetic(
        n_peers=20,
        groups=GroupsConfig(group_size=4, max_failed_attempts=1000),
        network=NetworkConfig(loss=0.2),
    )
    result = simulate(config)
    assert result.messages_lost > 0 and result.aborted_groups > 0
    assert result.aggregations_per_peer.sum() == 4 * result.aggregations


def test_result_row_and_reference_errors():
    result = simulate(synthetic())
    row = result.row()
    for key in ("mean_error", "centralized_error", "local_only_error", "aggregations",
                "groups.group_size", "wall_simulation_s", "seed", "fold"):  # fmt: skip
        assert key in row
    assert 0.0 <= result.evaluation.centralized_error <= 0.5
    assert result.evaluation.centralized_error <= result.evaluation.local_only_error + 0.05
    assert set(result.wall_times) == {"training", "simulation", "evaluation"}


def test_simulated_training_time_delays_groups():
    fast = simulate(synthetic())
    slow = simulate(synthetic(training=TrainingConfig(seconds_per_row=0.5)))
    assert slow.aggregations == fast.aggregations
    assert slow.sim_time > fast.sim_time + 5.0


def test_bad_inputs_fail_before_work():
    with pytest.raises(ConfigError, match="groups.group_size"):
        synthetic(n_peers=5, group_size=6)
    with pytest.raises(ConfigError, match="epsilon_per_aggregation"):
        synthetic(epsilon=0.1, epsilon_per_aggregation=0.2)
    with pytest.raises(ConfigError, match="fold"):
        simulate(dataclasses.replace(synthetic(), evaluation=EvaluationConfig()), fold=10)
    with pytest.raises(ConfigError):
        simulate(synthetic(n_peers=300, group_size=5, rows=100))


@pytest.mark.integration
@pytest.mark.parametrize(
    ("dataset", "n_peers", "split"),
    [("spambase", 100, "cv"), ("australian", 10, "cv"), ("adult", 200, "fixed")],
)
def test_seed_experiment_one_fold_on_real_data(real_data_home, dataset, n_peers, split):
    config = ScenarioConfig(
        data=DataConfig(dataset=dataset),
        partition=PartitionConfig(n_peers=n_peers),
        privacy=PrivacyConfig(epsilon=1.0, epsilon_per_aggregation=0.1),
        groups=GroupsConfig(group_size=min(10, n_peers)),
        evaluation=EvaluationConfig(split=split),
    )
    result = simulate(config)
    assert result.aggregations > 0
    assert result.evaluation.metrics.errors.mean() < 0.5
    assert result.evaluation.centralized_error < 0.25


def test_secure_aggregation_matches_plaintext_and_counts_its_messages():
    published: dict[bool, list[np.ndarray]] = {}
    results = {}
    for secure in (False, True):
        config = synthetic(
            n_peers=12,
            group_size=4,
            epsilon=1.0,
            epsilon_per_aggregation=0.5,
            mechanism="none",
            secure_aggregation=secure,
        )
        world = KeepWorld()
        results[secure] = simulate(config, observers=(world,))
        published[secure] = world.world.published
    plain, secure = results[False], results[True]
    assert plain.aggregations == secure.aggregations == 6
    for a, b in zip(published[False], published[True], strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9 * np.abs(a).max())
    # plaintext: 3 submissions per group; secure: 4*3 shares + 3 partial sums per group
    extra = secure.messages_sent - plain.messages_sent
    assert extra == plain.aggregations * (4 * 3 + 3 - 3)
    assert secure.sim_time > plain.sim_time  # one more message round per aggregation


def test_secure_aggregation_rejects_unsplittable_noise():
    with pytest.raises(ConfigError, match="coordinate-laplace, gaussian"):
        PrivacyConfig(mechanism="vector-laplace", secure_aggregation=True)


def test_secure_aggregation_under_loss_never_overcharges():
    config = synthetic(
        n_peers=20,
        epsilon=1.0,
        epsilon_per_aggregation=0.25,
        mechanism="coordinate-laplace",
        secure_aggregation=True,
        groups=GroupsConfig(group_size=4, max_failed_attempts=1000),
        network=NetworkConfig(loss=0.05),
    )
    result = simulate(config)
    assert result.aborted_groups > 0 and result.aggregations > 0
    assert result.aggregations_per_peer.sum() == 4 * result.aggregations
    assert np.all(result.epsilon_spent <= 1.0 + 1e-9)


# --- the Python API takes what a user would pass, and says clearly what it cannot ---------------
SMALL = {"data": {"dataset": "synthetic", "synthetic_rows": 300}, "partition": {"n_peers": 10}}


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        (None, {}, "config must be a ScenarioConfig, a scenario name or file, or a mapping"),
        ("quickstart", {}, "sweeps 8 grid points and one config runs one"),
        (SMALL, {"fold": "0"}, "fold must be an integer >= 0, got '0'"),
        (SMALL, {"fold": 1.5}, "fold must be an integer >= 0, got 1.5"),
        (SMALL, {"repetition": -1}, "repetition must be an integer >= 0, got -1"),
        (SMALL, {"fold": 10}, "fold must be in [0, 10), got 10"),
    ],
)
def test_simulate_refuses_what_it_cannot_run_in_one_line(config, options, message):
    with pytest.raises(ConfigError) as caught:
        simulate(config, **options)
    assert message in str(caught.value)


def test_simulate_takes_a_mapping_or_a_one_point_scenario_file(tmp_path):
    from p2pdp.config import ScenarioConfig

    expected = simulate(ScenarioConfig(**SMALL)).row()
    assert simulate(SMALL).row()["mean_error"] == expected["mean_error"]
    path = tmp_path / "one.toml"
    path.write_text(
        '[data]\ndataset = "synthetic"\nsynthetic_rows = 300\n[partition]\nn_peers = 10\n'
    )
    assert simulate(path).row()["mean_error"] == expected["mean_error"]


def test_errors_of_the_fixed_models_are_scored_once_per_training_key(monkeypatch):
    """The centralised and local-only errors depend on the training key only: every run of
    the key reports them, scored once, and they are those models' errors on the test rows."""
    from p2pdp.learning import evaluation
    from p2pdp.tasks.logistic import task as logistic

    config = synthetic()
    trained = prepare_peers(config, fold=0)
    scored, counted = [], []
    monkeypatch.setattr(
        logistic,
        "linear_error",
        lambda w, X, y: scored.append(np.ndim(w)) or evaluation.linear_error(w, X, y),
    )

    def counting(*args, own_errors, **kwargs):
        counted.append(own_errors)
        return evaluation.evaluate_ensembles(*args, own_errors=own_errors, **kwargs)

    monkeypatch.setattr(logistic, "evaluate_ensembles", counting)
    runs = [
        simulate(
            dataclasses.replace(config, publication=PublicationConfig(mode=mode)), trained=trained
        )
        for mode in ("full", "group", "full")
    ]
    # the centralised model once; the local models' errors counted once, from the first
    # run's scoring margins
    assert scored == [1] and counted == [True, False, False]
    X, y = trained.fold.X_test, trained.fold.y_test
    local = evaluation.linear_error(trained.models.weights, X, y)
    for run in runs:
        row = run.row()
        assert row["local_only_error"] == pytest.approx(local.mean())
        assert row["centralized_error"] == evaluation.linear_error(trained.centralized, X, y)[0]
        assert [r["local_only_error"] for r in run.peer_table()] == local.tolist()
