"""The three prevalence tasks on the engine (issue 13): end to end, wiring, budgets, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from p2pdp.config import with_value
from p2pdp.core.errors import ConfigError
from p2pdp.experiments.report.write import write_report
from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.run.runner import run_experiment
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import parse_scenario
from p2pdp.privacy.counting import RandomizedResponse
from p2pdp.privacy.events import DistributionalEvent, EpsilonDeltaEvent
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.release import Releaser
from p2pdp.tasks.pooled_testing import pooling
from p2pdp.tasks.pooled_testing.task import DISTRIBUTIONAL, WORST_CASE, PooledTest
from p2pdp.tasks.prevalence.estimators import (
    channel_posterior,
    laplace_posterior,
    rr_count_log_likelihood,
)
from p2pdp.tasks.prevalence.task import disjoint_releases, mixture_interval, rr_grid_posterior

COUNTS = """
name = "counts"
seed = 11
[task]
name = "prevalence-counts"
[prevalence]
prevalence = 0.3
records_per_peer = 10
[partition]
n_peers = 40
[privacy]
mechanism = "coordinate-laplace"
epsilon = 1.0
epsilon_per_aggregation = 1.0
[groups]
group_size = 8
[evaluation]
cv_folds = 2
folds = [0]
"""

POOLED = """
name = "pooled"
seed = 11
[task]
name = "pooled-testing"
[partition]
n_peers = 200
[privacy]
mechanism = "pooled-test"
epsilon = 2.0
epsilon_per_aggregation = 2.0
[groups]
group_size = 5
max_concurrent_groups = 100
[pooling]
prevalence = 0.1
[evaluation]
cv_folds = 2
folds = [0]
"""


def _config(text: str, *settings: str):
    return parse_scenario(text, overrides=settings).config


def _rr(*settings: str):
    return _config(
        COUNTS, 'task.name="randomized-response"', 'privacy.mechanism="local"', *settings
    )


# --- end to end through TOML scenarios, with the report's figures ------------------------------
CASES = {
    "prevalence-counts": (
        COUNTS,
        ('sweep."privacy.epsilon,privacy.epsilon_per_aggregation"=[[0.5,0.5],[2,2]]',),
        "prevalence_coverage.png",
    ),
    "rr-vs-central": (
        COUNTS,
        (
            'sweep."task.name,privacy.mechanism"=[["prevalence-counts","coordinate-laplace"],'
            '["randomized-response","local"]]',
            'sweep."privacy.epsilon,privacy.epsilon_per_aggregation"=[[0.5,0.5],[2,2]]',
        ),
        "prevalence_privacy_error.png",
    ),
    "pooled-testing": (
        POOLED,
        ("partition.n_peers=60", 'sweep."groups.group_size"=[1,5]'),
        "pooled_mse.png",
    ),
}


def _end_to_end(tmp_path, case: str, *, report: bool) -> list[dict[str, str]]:
    text, settings, figure = CASES[case]
    run_experiment(parse_scenario(text, overrides=settings), tmp_path, jobs=1)
    rows = read_results(tmp_path)
    assert len(rows) == 2 * (1 + (case == "rr-vs-central"))
    for row in rows:
        assert row["task.name"] in ("prevalence-counts", "randomized-response", "pooled-testing")
        assert float(row["max_guaranteed_epsilon"]) <= float(row["privacy.epsilon"]) + 1e-9
    if report:  # matplotlib is slow on a shared machine: one case by default, all with -m slow
        write_report(tmp_path)
        assert (tmp_path / figure).stat().st_size > 10_000
        text = (tmp_path / "report.md").read_text()
        assert f"]({figure})" in text
        assert "## Non-private steps" in text
        assert "table_rows" not in text  # bookkeeping, not a declaration
    if case == "pooled-testing":  # one pool per person: a distributional epsilon, labelled so
        for row in rows:
            assert row["guarantee"] == "distributional"
            assert "not worst-case DP" in row["non_private_steps"]
    return rows


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_task_runs_end_to_end_through_a_scenario(tmp_path, case):
    _end_to_end(tmp_path, case, report=case in ("prevalence-counts", "pooled-testing"))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_task_report_draws_its_figures(tmp_path, case):
    _end_to_end(tmp_path, case, report=True)


# --- prevalence-counts ------------------------------------------------------------------------
def test_released_count_noise_is_laplace_of_scale_one_over_epsilon():
    """Each release's noise (released - exact sum) is Laplace(1/eps_A): sensitivity 1, d = 1."""
    config = _config(
        COUNTS,
        "partition.n_peers=200",
        "groups.group_size=2",
        "privacy.epsilon=1.0",
        "privacy.epsilon_per_aggregation=0.1",
    )
    result = simulate(config)
    rows = result.releases
    assert len(rows) >= 900
    assert {row["sensitivity"] for row in rows} == {1.0}
    assert np.allclose([row["noise_scale"] for row in rows], 10.0)
    magnitudes = np.array([row["noise_norm"] for row in rows])  # |Laplace(b)| ~ Exponential(b)
    assert stats.kstest(magnitudes, "expon", args=(0, 10.0)).pvalue > 1e-3
    assert stats.kstest(magnitudes, "expon", args=(0, 20.0)).pvalue < 1e-6  # the test has power


def test_secure_aggregation_splits_the_laplace_count():
    config = _config(COUNTS, "privacy.secure_aggregation=true")
    result = simulate(config)
    k = config.groups.group_size
    assert result.aggregations == 5
    assert all(row["secure"] for row in result.releases)
    expected = math.sqrt(2.0) * 1.0 * math.sqrt(k / (k - 1))
    assert np.allclose([row["noise_std"] for row in result.releases], expected)
    assert 0.0 < result.row()["posterior_mean_exact"] < 1.0


def test_receivers_never_multiply_overlapping_releases():
    """Re-query: peers join several groups; each peer's posterior uses disjoint releases only."""
    config = _config(COUNTS, "privacy.epsilon_per_aggregation=0.25")
    result = simulate(config)
    row = result.row()
    assert row["policy"] == "requery" and result.aggregations > 5
    # 40 peers in groups of 8: at most 5 disjoint releases, 400 records
    assert row["releases_used"] <= 5 and row["records_used"] <= 400
    members = (np.arange(0, 4), np.arange(2, 6), np.arange(6, 9), np.arange(4, 7))
    assert disjoint_releases([0, 1, 2, 3], members) == (0, 2)
    assert disjoint_releases([3, 1], members) == (1,)


@pytest.mark.slow
def test_noise_aware_intervals_cover_where_naive_ones_do_not():
    """One very noisy release per run (noise sd 14 against a binomial sd of 4.6 records)."""
    base = _config(
        COUNTS,
        "partition.n_peers=20",
        "groups.group_size=20",
        "prevalence.records_per_peer=5",
        "privacy.epsilon=0.1",
        "privacy.epsilon_per_aggregation=0.1",
    )
    covered = {"naive": [], "exact": [], "plain": []}
    for repetition in range(60):
        row = simulate(base, repetition=repetition).row()
        for name, values in covered.items():
            values.append(row[f"covered_{name}"])
    naive, exact = np.mean(covered["naive"]), np.mean(covered["exact"])
    assert exact >= 0.85 and naive <= 0.7 and exact - naive >= 0.2


def test_exact_posterior_helpers_agree_with_the_maths_module():
    mixture = laplace_posterior(37.0, 100, 0.3)
    expected = [float(value) for value in mixture.interval(0.95)]
    assert mixture_interval(mixture, 0.95) == pytest.approx(expected, abs=1e-7)
    response = RandomizedResponse.from_epsilon(0.7)
    exact = channel_posterior(rr_count_log_likelihood(83, 200, response), 200)
    mean, low, high = rr_grid_posterior(83, 200, response, (0.5, 0.5), 0.95)
    assert mean == pytest.approx(float(exact.mean()), abs=1e-6)
    assert (low, high) == pytest.approx(mixture_interval(exact, 0.95), abs=1e-6)


@pytest.mark.integration
def test_dataset_source_uses_the_binary_label_and_its_prevalence():
    config = _config(COUNTS, 'prevalence.source="dataset"', 'data.dataset="spambase"')
    row = simulate(config).row()
    assert row["truth"] == pytest.approx(1813 / 4601)  # spambase: 1,813 spam of 4,601 e-mails
    with pytest.raises(ConfigError, match="prevalence.records_per_peer"):
        simulate(with_value(config, "prevalence.records_per_peer", 200))


# --- randomized-response (local) -------------------------------------------------------------
def test_local_randomized_response_is_charged_once_and_adds_no_curator_noise():
    result = simulate(_rr("privacy.epsilon=0.5", "privacy.epsilon_per_aggregation=0.5"))
    assert set(result.aggregations_per_peer.tolist()) == {1}
    assert set(result.epsilon_spent.tolist()) == {0.5}
    assert set(result.guaranteed_epsilon.tolist()) == {0.5}
    assert {row["noise_norm"] for row in result.releases} == {0.0}
    assert result.row()["guaranteed_epsilon_per_aggregation"] == 0.5


def test_peers_share_randomized_answers_never_their_true_counts():
    from p2pdp.tasks import make_task

    config = _rr("privacy.epsilon=0.1", "privacy.epsilon_per_aggregation=0.1")
    task = make_task(config)
    population = task.prepare(fold=0, repetition=0)
    shared, _ = task.statistics(population)
    assert np.array_equal(shared[:, 0], population.answers.sum(axis=1))
    assert not np.array_equal(shared[:, 0], population.counts)
    flips = np.mean(population.answers != population.records)  # keep form at eps = 0.1
    assert flips == pytest.approx(1 / (1 + math.exp(0.1)), abs=0.05)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (('privacy.mechanism="coordinate-laplace"',), "privacy.mechanism must be 'local'"),
        (("privacy.epsilon_per_aggregation=0.5",), "epsilon_per_aggregation must equal"),
    ],
)
def test_randomized_response_refuses_other_budgets_or_curator_noise(settings, match):
    with pytest.raises(ConfigError, match=match):
        simulate(_rr(*settings))


def test_local_mechanism_is_refused_for_a_task_that_shares_exact_statistics():
    with pytest.raises(ConfigError, match="locally_private"):
        simulate(
            _config(
                COUNTS,
                'task.name="logistic"',
                'privacy.mechanism="local"',
                'data.dataset="synthetic"',
                "prevalence.records_per_peer=20",  # the default: [prevalence] is not logistic's
            )
        )
    with pytest.raises(ConfigError, match="privacy.mechanism must be one of"):
        simulate(_config(COUNTS, 'privacy.mechanism="local"'))


def test_pooled_test_mechanism_is_refused_for_other_tasks():
    with pytest.raises(ConfigError, match="task.name must be 'pooled-testing'"):
        PooledTest.from_config(_config(POOLED, 'task.name="logistic"', "pooling.prevalence=0.05"))


def test_two_coin_form_has_the_exact_epsilon():
    config = _rr('prevalence.response="two-coin"', "prevalence.theta2=0.3")
    from p2pdp.tasks.prevalence.task import response_for

    law = response_for(config).output_probabilities()
    assert pooling.epsilon_of_law(law) == pytest.approx(1.0)
    assert simulate(config).row()["max_guaranteed_epsilon"] == 1.0


# --- pooled-testing ---------------------------------------------------------------------------
def test_pooled_test_results_have_the_test_accuracy():
    config = _config(
        POOLED, "partition.n_peers=2000", "groups.group_size=2", "pooling.prevalence=0.3"
    )
    row = simulate(config).row()
    assert row["pools"] == 1000
    for observed, expected, share in (
        ("observed_sensitivity", 0.85, 1 - 0.7**2),
        ("observed_specificity", 0.75, 0.7**2),
    ):
        sd = math.sqrt(expected * (1 - expected) / (1000 * share))
        assert abs(row[observed] - expected) < 4 * sd


def test_randomized_response_on_the_result_lowers_the_effective_accuracy():
    config = _config(
        POOLED,
        "partition.n_peers=2000",
        "groups.group_size=2",
        "pooling.prevalence=0.3",
        "pooling.keep_probability=0.8",
    )
    row = simulate(config).row()
    se, sp = pooling.effective_accuracy(0.85, 0.75, RandomizedResponse.keep(0.8))
    assert (row["effective_sensitivity"], row["effective_specificity"]) == (se, sp)
    assert abs(row["observed_sensitivity"] - se) < 0.06
    assert abs(row["observed_specificity"] - sp) < 0.06
    assert se < 0.85 - 0.1 and sp < 0.75 - 0.05  # measurably lower than the raw test


def test_one_pool_per_person_declares_the_distributional_epsilon():
    config = _config(POOLED)
    result = simulate(config)
    eps = pooling.individual_epsilon(0.1, 5, 0.85, 0.75)
    assert set(result.aggregations_per_peer.tolist()) == {1}
    assert np.allclose(result.guaranteed_epsilon, eps)
    assert set(result.epsilon_spent.tolist()) == {2.0}  # the whole budget: nobody tested twice
    row = result.row()
    assert row["threat_model"] == DISTRIBUTIONAL
    assert row["epsilon_worst_case"] == pytest.approx(pooling.worst_case_epsilon(0.85, 0.75))
    event = PooledTest.from_config(config).event(1)
    assert isinstance(event, DistributionalEvent) and event.threat_model == DISTRIBUTIONAL


def test_several_pools_per_person_compose_the_worst_case_epsilon():
    config = _config(POOLED, "pooling.pools_per_person=2", "privacy.epsilon=4.0")
    result = simulate(config)
    worst = pooling.worst_case_epsilon(0.85, 0.75)
    assert result.row()["threat_model"] == WORST_CASE
    assert result.aggregations_per_peer.max() == 2
    event = PooledTest.from_config(config).event(1)
    assert type(event) is EpsilonDeltaEvent and event.epsilon == pytest.approx(worst)
    counts = result.aggregations_per_peer
    assert np.allclose(result.guaranteed_epsilon, counts * worst)
    with pytest.raises(ConfigError, match="privacy.epsilon must be >="):
        simulate(with_value(config, "privacy.epsilon", 3.0))


def test_pooled_release_is_defined_by_the_mechanism_and_not_secure():
    mechanism = PooledTest(epsilon=1.0, test_sensitivity=1.0, test_specificity=1.0)
    rng = np.random.default_rng(0)
    releaser = Releaser(
        mechanism, 1, aggregate=lambda s: s.max(axis=0), secure=False, noise_rng=rng, share_rng=rng
    )
    released, record = releaser.release(np.array([[0.0], [1.0], [0.0]]), [1, 1, 1], 1.0)
    assert released.tolist() == [1.0] and record.noise_norm == 0.0  # a perfect test
    released, _ = releaser.release(np.zeros((3, 1)), [1, 1, 1], 1.0)
    assert released.tolist() == [0.0]
    with pytest.raises(ConfigError, match="defines its own release"):
        Releaser(mechanism, 1, aggregate="sum", secure=True, noise_rng=rng, share_rng=rng)


@pytest.mark.slow
def test_pooled_mle_error_is_near_the_asymptotic_variance():
    config = _config(
        POOLED, "partition.n_peers=2000", "groups.group_size=10", "pooling.prevalence=0.05"
    )
    errors = [simulate(config, repetition=r).row()["squared_error"] for r in range(12)]
    variance = pooling.pooled_variance(0.05, 10, 200, 0.85, 0.75)
    assert variance / 3 < np.mean(errors) < 3 * variance


# --- configuration and determinism ------------------------------------------------------------
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("prevalence.prevalence=1.5", "prevalence.prevalence must be in (0, 1), got 1.5"),
        ('prevalence.response="coin"', "prevalence.response must be one of"),
        ("pooling.keep_probability=0.4", "pooling.keep_probability must be in (0.5, 1], got 0.4"),
        ("pooling.test_specificity=0.1", "pooling.test_sensitivity + pooling.test_specificity"),
        ("pooling.pools_per_person=0", "pooling.pools_per_person must be an integer >= 1"),
    ],
)
def test_new_sections_name_the_key_and_value(setting, message):
    with pytest.raises(ConfigError) as error:
        _config(COUNTS, setting)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "config",
    [_config(COUNTS), _rr(), _config(POOLED)],
    ids=["prevalence-counts", "randomized-response", "pooled-testing"],
)
def test_same_seed_gives_identical_rows(config):
    def row(config):
        return {k: v for k, v in simulate(config).row().items() if not k.startswith("wall_")}

    first = row(config)
    assert row(config) == first
    assert row(with_value(config, "seed", 12)) != first


def test_local_is_registered_and_declares_its_epsilon():
    mechanism = make_mechanism("local", epsilon=0.7)
    assert mechanism.guarantee(1) == (0.7, 0.0)
    assert mechanism.sample(1.0, 3, rng=np.random.default_rng(0)).tolist() == [0.0] * 3
