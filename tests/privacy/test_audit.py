"""Tests of p2pdp.privacy.audit and ``p2pdp audit``: DP mechanisms pass, mis-calibrated ones are
caught."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.experiments.audit.table import (
    AUDIT_NAMES,
    EXPECTED_TO_FAIL,
    audit_mechanism,
    format_audit_table,
    run_audit,
)
from p2pdp.experiments.cli import main
from p2pdp.privacy.audit import (
    audit_additive_noise,
    clopper_pearson_upper,
    exact_noisy_count_epsilon,
    threshold_test,
)

N_SAMPLES = 40_000  # per side; enough power for the negative controls, fast enough for CI


@pytest.fixture(scope="module")
def audit_results():
    return {result.mechanism: result for result in run_audit(n_samples=N_SAMPLES, seed=1)}


@pytest.mark.parametrize("name", [name for name in AUDIT_NAMES if name not in EXPECTED_TO_FAIL])
def test_dp_mechanisms_pass(audit_results, name):
    result = audit_results[name]
    assert result.passed and result.as_expected
    assert 0.0 <= result.eps_lb <= result.epsilon * (1 + 1e-9)


def test_seed_laplace_is_flagged_well_above_its_nominal_epsilon(audit_results):
    result = audit_results["seed-laplace"]
    assert not result.passed and result.as_expected
    assert result.eps_lb > 1.5 * result.epsilon
    assert result.eps_lb <= result.guarantee_epsilon  # the true epsilon is sqrt(58) * eps
    assert result.guarantee_epsilon == pytest.approx(math.sqrt(58) * result.epsilon)


def test_exponential_norm_vector_laplace_is_flagged(audit_results):
    result = audit_results["vector-laplace-exponential-norm"]
    assert not result.passed and result.eps_lb > 4 * result.epsilon


def test_l2_calibrated_coordinate_laplace_in_50_dimensions_fails():
    result = audit_mechanism("seed-laplace", n_samples=N_SAMPLES, rng=generator(2, "d50"), dim=50)
    assert result.eps_lb > 1.5 * result.epsilon and not result.passed


def test_secure_aggregation_k_way_shares_are_caught(audit_results):
    """End to end through the secret sharing: the curator that subtracts its own share of a
    K-way split (K = 2) keeps half the noise (true epsilon 1.47 against the claimed 1); the
    honest (K - 1)-way shares pass (test_dp_mechanisms_pass) within their guarantee."""
    honest = audit_results["secure-aggregation"]
    assert honest.method == "gdp-threshold-test" and honest.eps_lb <= honest.epsilon
    control = audit_results["secure-aggregation-k-way-shares"]
    assert not control.passed and control.as_expected
    assert control.epsilon < control.eps_lb <= control.guarantee_epsilon
    assert control.guarantee_epsilon == pytest.approx(1.465, abs=1e-3)


def test_the_gdp_threshold_test_is_a_valid_lower_bound_on_mu():
    """mu-GDP Gaussian samples (N(0, 1) against N(mu, 1)): the bound exceeds mu in at most
    ~5% of 60 repetitions, and comes close to it (the (epsilon, delta) test needs the tails)."""
    from p2pdp.privacy.audit import gdp_threshold_test

    rng = np.random.default_rng(8)
    bounds = np.array(
        [
            gdp_threshold_test(rng.normal(size=20_000), rng.normal(0.5, size=20_000))[0]
            for _ in range(60)
        ]
    )
    assert np.mean(bounds > 0.5) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 60)
    assert np.median(bounds) > 0.4


@pytest.mark.parametrize("epsilon", [0.3, 2.0])
def test_dp_mechanisms_pass_at_other_epsilons(epsilon):
    for name in ("vector-laplace", "coordinate-laplace", "gaussian"):
        result = audit_mechanism(name, n_samples=10_000, rng=generator(3, name), epsilon=epsilon)
        assert result.passed, result


def test_threshold_test_is_a_valid_lower_bound_when_nothing_differs():
    # identical output laws have epsilon = 0: eps_lb > 0 may happen in at most ~5% of runs
    rng = np.random.default_rng(4)
    bounds = [
        threshold_test(rng.laplace(size=(2000, 3)), rng.laplace(size=(2000, 3)), delta=0.0).eps_lb
        for _ in range(40)
    ]
    assert sum(bound > 0 for bound in bounds) <= 5


def test_threshold_test_finds_a_large_gap():
    rng = np.random.default_rng(5)
    result = threshold_test(rng.normal(size=20_000), rng.normal(4.0, size=20_000), delta=0.0)
    assert result.eps_lb > 3.0 and result.statistic == 0
    assert min(result.fpr_upper, result.fnr_upper) < 0.01


def test_audit_is_exact_for_one_dimensional_laplace_at_its_epsilon():
    # 1-D Laplace(1/eps) is exactly eps-DP: the audit gets close to eps but not above it
    def laplace(*, size, rng):
        return rng.laplace(0.0, 1.0, (size, 1))

    test = audit_additive_noise(
        laplace, sensitivity=1.0, dim=1, delta=0.0, n_samples=100_000, rng=generator(6, "1d")
    )
    assert 0.7 < test.eps_lb <= 1.0


def test_clopper_pearson_upper_bounds():
    level, trials = 0.975, 1000
    # zero successes: closed form 1 - (1 - level)^(1/n)
    assert clopper_pearson_upper(np.array([0]), trials, level)[0] == pytest.approx(
        1 - (1 - level) ** (1 / trials)
    )
    bounds = clopper_pearson_upper(np.array([0, 10, 500, 999, 1000]), trials, level)
    assert np.all(np.diff(bounds) > 0) and bounds[-1] == 1.0
    assert np.all(bounds[:-1] > np.array([0, 10, 500, 999]) / trials)


@given(epsilon=st.floats(0.01, 10.0), n=st.integers(1, 30))
def test_exact_noisy_count_epsilon_equals_epsilon(epsilon, n):
    assert exact_noisy_count_epsilon(epsilon, n) == pytest.approx(epsilon, rel=1e-9)


def test_exact_audits(audit_results):
    for name in ("randomized-response", "noisy-count"):
        result = audit_results[name]
        assert result.method == "exact" and result.eps_lb == pytest.approx(result.epsilon)


def test_results_serialise_to_strict_json_and_format(audit_results):
    results = list(audit_results.values())
    rows = json.loads(json.dumps([r.as_dict() for r in results], allow_nan=False))
    assert [row["mechanism"] for row in rows] == list(AUDIT_NAMES)
    assert {"mechanism", "epsilon", "delta", "eps_lb", "passed"} <= set(rows[0])
    table = format_audit_table(results)
    assert "expected: fail (sqrt(d)*eps-DP)" in table
    assert "UNEXPECTED" not in table


# --- CLI ------------------------------------------------------------------------------------------
def test_cli_json(capsys):
    assert main(["audit", "--json", "--mechanism", "gaussian", "--samples", "20000"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["mechanism"] == "gaussian" and row["passed"] is True and row["delta"] == 1e-5


def test_cli_exits_zero_when_seed_laplace_is_flagged(capsys):
    code = main(["audit", "--mechanism", "seed-laplace", "--samples", str(N_SAMPLES)])
    assert code == 0
    assert "FAIL, expected: fail (sqrt(d)*eps-DP)" in capsys.readouterr().out


def test_cli_exits_nonzero_when_a_negative_control_is_not_caught(capsys):
    # 50 samples are too few for any power: the control "passes", which is unexpected
    assert main(["audit", "--mechanism", "seed-laplace", "--samples", "50"]) == 1
    assert "UNEXPECTED" in capsys.readouterr().out


def test_cli_rejects_bad_arguments(capsys):
    assert main(["audit", "--mechanism", "laplace"]) == 2
    assert "got 'laplace'" in capsys.readouterr().err
    assert main(["audit", "--samples", "3"]) == 2
    assert "--samples must be an integer >= 8, got 3" in capsys.readouterr().err


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: audit_mechanism("laplace", n_samples=100, rng=None), "got 'laplace'"),
        (lambda: audit_mechanism("gaussian", n_samples=100, rng=None, epsilon=0), "epsilon .*0"),
        (lambda: threshold_test(np.ones(10), np.ones(10), delta=1.0), r"delta .*\[0, 1\).*1.0"),
        (lambda: threshold_test(np.ones(3), np.ones(10), delta=0.0), "len.null. .*got 3"),
        (
            lambda: threshold_test(np.ones((10, 2)), np.ones((10, 3)), delta=0.0),
            r"same statistics, got shapes \(10, 2\) and \(10, 3\)",
        ),
        (
            lambda: threshold_test(np.ones(10), np.ones(10), delta=0.0, confidence=1.0),
            r"confidence must be in \(0, 1\), got 1.0",
        ),
        (lambda: exact_noisy_count_epsilon(1.0, 0), "n must be an integer >= 1, got 0"),
        (lambda: exact_noisy_count_epsilon(math.inf, 3), "epsilon .*got inf"),
    ],
)
def test_bad_audit_arguments_are_rejected(call, message):
    with pytest.raises(ConfigError, match=message):
        call()
