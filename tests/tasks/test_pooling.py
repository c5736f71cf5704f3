"""Tests of p2pdp.tasks.pooled_testing.pooling: pooled-testing estimation, optimality and one
person's privacy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.experiments.audit.table import AUDIT_POOL, audit_mechanism
from p2pdp.privacy.counting import RandomizedResponse
from p2pdp.tasks.pooled_testing.audit import exact_pooled_test_epsilon
from p2pdp.tasks.pooled_testing.pooling import (
    crossover_prevalence,
    effective_accuracy,
    enumerated_outcome_probabilities,
    epsilon_rows,
    individual_epsilon,
    individual_epsilon_enumerated,
    max_prevalence,
    outcome_probabilities,
    piecewise_epsilon,
    pool_status,
    pooled_mle,
    pooled_test_outcomes,
    pooled_variance,
    positive_probability,
    privacy_utility_rows,
    repeated_pool_epsilon,
    simulate_pooled_mle,
    variance_ratio,
    variance_ratio_rows,
    worst_case_epsilon,
)

SEED_ACCURACY = [(0.85, 0.75), (0.75, 0.85)]  # the seed's figures
ACCURACIES = [*SEED_ACCURACY, (0.99, 0.6), (0.45, 0.9), (0.7, 0.7), (0.999, 0.999)]
PREVALENCES = [0.0, 1e-4, 0.01, 0.05, 0.1, 0.2, 0.5, 0.9, 1.0]

accuracy = st.tuples(st.floats(0.02, 0.999), st.floats(0.02, 0.999)).filter(
    lambda pair: pair[0] + pair[1] > 1.01
)


# --- privacy: closed form, enumeration, the seed's piecewise theorem ------------------------------
@pytest.mark.parametrize(("se", "sp"), ACCURACIES)
def test_closed_form_equals_enumeration_for_pools_up_to_12(se, sp):
    for c in range(1, 13):
        closed = individual_epsilon(PREVALENCES, c, se, sp)
        enumerated = [individual_epsilon_enumerated(p, c, se, sp) for p in PREVALENCES]
        np.testing.assert_allclose(closed, enumerated, rtol=0, atol=1e-12)


@settings(max_examples=50)
@given(p=st.floats(0.0, 1.0), c=st.integers(1, 12), pair=accuracy)
def test_closed_form_equals_enumeration_anywhere(p, c, pair):
    se, sp = pair
    closed = individual_epsilon(p, c, se, sp)
    assert closed == pytest.approx(individual_epsilon_enumerated(p, c, se, sp), abs=1e-12)
    assert closed == pytest.approx(float(piecewise_epsilon(p, c, se, sp)), abs=1e-12)


def test_closed_form_law_equals_enumerated_law():
    for c in (1, 3, 8):
        for p in (0.0, 0.07, 0.6):
            np.testing.assert_allclose(
                outcome_probabilities(p, c, 0.85, 0.75),
                enumerated_outcome_probabilities(p, c, 0.85, 0.75),
                atol=1e-14,
            )


@pytest.mark.parametrize(("se", "sp"), ACCURACIES)
def test_unpooled_epsilon_is_the_issue_formula(se, sp):
    # the issue's c = 1 formula is right whenever Se + Sp > 1 (both logs are then >= 0 ...)
    expected = max(math.log(se / (1 - sp)), math.log(sp / (1 - se)))
    for p in PREVALENCES:
        assert individual_epsilon(p, 1, se, sp) == pytest.approx(expected, rel=1e-13)
    assert worst_case_epsilon(se, sp) == pytest.approx(expected, rel=1e-13)


def test_worst_case_needs_absolute_values_for_uninformative_tests():
    # ... but for Se + Sp < 1 both logs of the issue's formula are negative: the loss is the
    # larger absolute value
    se, sp = 0.3, 0.4
    issue = max(math.log(se / (1 - sp)), math.log(sp / (1 - se)))
    assert issue < 0
    assert worst_case_epsilon(se, sp) == pytest.approx(
        max(abs(math.log(se / (1 - sp))), abs(math.log(sp / (1 - se))))
    )


@pytest.mark.parametrize(("se", "sp"), SEED_ACCURACY)
def test_piecewise_theorem_switches_at_the_crossover(se, sp):
    for c in (2, 5, 10, 20):
        p_crit = crossover_prevalence(c, se, sp)
        q = (1 - p_crit) ** (c - 1)
        r = se + sp - 1
        if sp > se:  # Z = 1 is the worst outcome below p_crit, Z = 0 above, equal at p_crit
            assert 0 < p_crit < 1
            assert se / (se - q * r) == pytest.approx((1 - se + q * r) / (1 - se), rel=1e-10)
            below, above = p_crit * 0.9, p_crit + 0.1 * (1 - p_crit)
            for p, outcome in ((below, 1), (above, 0)):
                law = outcome_probabilities(p, c, se, sp)
                ratios = np.abs(np.log(law[1] / law[0]))
                assert np.argmax(ratios) == outcome
        else:
            assert p_crit == 0.0


def test_pooling_is_strictly_more_private_and_monotone():
    for se, sp in ACCURACIES:
        eps = individual_epsilon(np.array([1e-3, 0.01, 0.1, 0.5])[:, None], [2, 5, 10, 20], se, sp)
        assert np.all(eps < worst_case_epsilon(se, sp))  # the seed's "DP optimality"
        assert np.all(np.diff(eps, axis=0) < 0) and np.all(np.diff(eps, axis=1) < 0)
    assert individual_epsilon(1.0, 5, 0.85, 0.75) == 0.0
    assert individual_epsilon(0.0, 5, 0.85, 0.75) == pytest.approx(worst_case_epsilon(0.85, 0.75))


def test_repeated_tests_of_one_pool_do_not_compose_by_addition():
    se, sp = 0.85, 0.75
    assert repeated_pool_epsilon(0.05, 5, 1, se, sp) == pytest.approx(
        individual_epsilon(0.05, 5, se, sp), rel=1e-12
    )
    # the same unknown partner in both tests: more than twice the one-test loss
    twice = repeated_pool_epsilon(0.05, 2, 2, se, sp)
    assert twice > 2 * individual_epsilon(0.05, 2, se, sp) + 0.02
    # brute force over the partner's status and the two results
    law = np.zeros((2, 4))
    for partner, weight in ((0, 0.95), (1, 0.05)):
        for x in (0, 1):
            yes = se if (x or partner) else 1 - sp
            law[x] += weight * np.outer([1 - yes, yes], [1 - yes, yes]).ravel()
    assert twice == pytest.approx(np.abs(np.log(law[1] / law[0])).max(), rel=1e-12)
    for tests in (1, 3, 6):
        assert repeated_pool_epsilon(0.05, 5, tests, se, sp) <= tests * worst_case_epsilon(se, sp)


def test_perfect_sensitivity_has_no_bound():
    # a negative pooled result then proves the person negative
    assert individual_epsilon(0.05, 5, 1.0, 0.9) == math.inf
    assert individual_epsilon_enumerated(0.05, 5, 1.0, 0.9) == math.inf


# --- audit rows --------------------------------------------------------------------------------
def test_audit_pooled_rows_pass_in_the_threat_model_and_fail_against_known_others():
    for name in ("pooled-test", "pooled-test-rr"):
        result = audit_mechanism(name, n_samples=8, rng=generator(0, name))
        assert result.passed and result.as_expected
        assert result.eps_lb == pytest.approx(result.epsilon, rel=1e-12)
    control = audit_mechanism("pooled-test-known-others", n_samples=8, rng=generator(0, "k"))
    assert not control.passed and control.as_expected
    assert control.eps_lb == pytest.approx(worst_case_epsilon(0.85, 0.75))


def test_randomized_response_on_the_result_is_the_effective_test():
    response = RandomizedResponse.keep(0.8)
    se, sp = effective_accuracy(0.85, 0.75, response)
    assert se == pytest.approx(0.8 * 0.85 + 0.2 * 0.15)
    assert sp == pytest.approx(0.8 * 0.75 + 0.2 * 0.25)
    assert se + sp - 1 == pytest.approx((0.85 + 0.75 - 1) * (2 * 0.8 - 1))
    setting = dict(AUDIT_POOL)
    exact = exact_pooled_test_epsilon(
        setting["prevalence"], setting["pool_size"], 0.85, 0.75, response=response
    )
    assert exact == pytest.approx(individual_epsilon(0.05, 5, se, sp), abs=1e-12)
    assert worst_case_epsilon(se, sp) <= response.epsilon  # a true DP bound after RR


# --- simulator -----------------------------------------------------------------------------------
@pytest.mark.parametrize("response", [None, RandomizedResponse.keep(0.8)])
def test_simulated_member_law_matches_the_enumeration(response):
    # member 0 of each pool has status x, the others ~ Bernoulli(p): P(Z=1 | x) as enumerated
    c, p, se, sp, pools = 4, 0.1, 0.85, 0.75, 200_000
    rng = generator(1, "law", str(response))
    law = enumerated_outcome_probabilities(p, c, se, sp)
    if response is not None:
        law = law @ response.output_probabilities()
    for x in (0, 1):
        statuses = rng.random((pools, c)) < p
        statuses[:, 0] = bool(x)
        outcomes = pooled_test_outcomes(statuses.reshape(-1), c, se, sp, rng=rng, response=response)
        assert outcomes.shape == (pools,)
        standard_error = math.sqrt(law[x, 1] * (1 - law[x, 1]) / pools)
        assert abs(outcomes.mean() - law[x, 1]) < 4.5 * standard_error


def test_pool_status_uses_consecutive_blocks():
    statuses = np.array([[0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 1]])
    np.testing.assert_array_equal(pool_status(statuses, 3), [[True, False], [True, True]])
    with pytest.raises(ConfigError, match="multiple of pool_size=4"):
        pool_status(statuses, 4)


# --- estimation ----------------------------------------------------------------------------------
@settings(max_examples=50)
@given(p=st.floats(0.0, 0.99), c=st.integers(1, 30), pair=accuracy)
def test_mle_inverts_the_positive_probability(p, c, pair):
    se, sp = pair
    pi = positive_probability(p, c, se, sp)
    estimate = pooled_mle(pi, c, se, sp)
    assert positive_probability(estimate, c, se, sp) == pytest.approx(pi, abs=1e-12)
    if (1 - p) ** c > 1e-3:  # elsewhere p is ill-conditioned in pi (d pi / dp ~ (1-p)^(c-1))
        assert estimate == pytest.approx(p, abs=1e-9)


def test_mle_is_clipped_to_the_unit_interval():
    assert pooled_mle([0.0, 0.25, 0.85, 1.0], 5, 0.85, 0.75).tolist() == [0.0, 0.0, 1.0, 1.0]


def test_variance_is_the_delta_method():
    # pi (1 - pi) / (J (d pi/dp)^2), the derivative by central differences
    p, c, j, se, sp, h = 0.07, 6, 500, 0.9, 0.8, 1e-6
    slope = (positive_probability(p + h, c, se, sp) - positive_probability(p - h, c, se, sp)) / (
        2 * h
    )
    pi = positive_probability(p, c, se, sp)
    assert pooled_variance(p, c, j, se, sp) == pytest.approx(
        pi * (1 - pi) / (j * slope**2), rel=1e-7
    )


# Variance over R repetitions: the sample variance of R (nearly normal) MLEs has relative
# standard error sqrt(2 / (R - 1)) = 1.0% at R = 20,000, so the issue's 10% is 10 standard
# errors; the mean is tested to within 5% of one MLE's standard deviation (7 standard errors
# of the mean). Measured: ratios 0.98-1.02, |bias| / sd < 0.02.
@pytest.mark.parametrize(
    ("p", "c", "se", "sp"),
    [(0.05, 1, 0.85, 0.75), (0.05, 5, 0.85, 0.75), (0.1, 5, 0.75, 0.85), (0.02, 10, 0.85, 0.75)],
)
def test_mle_unbiased_and_variance_matches_for_2000_pools(p, c, se, sp):
    estimates = simulate_pooled_mle(
        p, c, 2000, se, sp, n_repetitions=20_000, rng=generator(2, "mle", c, p)
    )
    variance = pooled_variance(p, c, 2000, se, sp)
    assert estimates.var(ddof=1) == pytest.approx(variance, rel=0.10)
    assert abs(estimates.mean() - p) < 0.05 * math.sqrt(variance)


def test_mle_from_simulated_people_end_to_end():
    # R = 1,000 repetitions of 2,000 pools of 5 real people each: variance to 20% (4.4 standard
    # errors at sqrt(2/999) = 4.5%), mean to 4 standard errors of the mean
    p, c, j, se, sp, reps = 0.05, 5, 2000, 0.85, 0.75, 1000
    rng = generator(3, "people")
    fractions = np.concatenate(
        [
            pooled_test_outcomes(rng.random((200, c * j)) < p, c, se, sp, rng=rng).mean(axis=1)
            for _ in range(reps // 200)
        ]
    )
    estimates = pooled_mle(fractions, c, se, sp)
    variance = pooled_variance(p, c, j, se, sp)
    assert estimates.var(ddof=1) == pytest.approx(variance, rel=0.20)
    assert abs(estimates.mean() - p) < 4 * math.sqrt(variance / reps)


# --- optimality -----------------------------------------------------------------------------------
@pytest.mark.parametrize("hold", ["pools", "individuals"])
@pytest.mark.parametrize(("se", "sp"), SEED_ACCURACY)
def test_max_prevalence_separates_better_from_worse(hold, se, sp):
    sizes = [2, 5, 10, 20]
    p_max = max_prevalence(sizes, se, sp, hold=hold)
    assert np.all(np.diff(p_max) < 0) and np.all((p_max > 0) & (p_max < 1))
    for c, limit in zip(sizes, p_max, strict=True):
        assert variance_ratio(limit, c, se, sp, hold=hold) == pytest.approx(1.0, abs=1e-9)
        assert variance_ratio(0.5 * limit, c, se, sp, hold=hold) < 1
        assert variance_ratio(limit + 0.5 * (1 - limit), c, se, sp, hold=hold) > 1
        # the ratio compares the seed's variances directly
        n_pools = 1000
        pooled = pooled_variance(
            0.5 * limit, c, n_pools if hold == "pools" else n_pools / c, se, sp
        )
        assert pooled < pooled_variance(0.5 * limit, 1, n_pools, se, sp)


def test_max_prevalence_edge_cases():
    assert math.isnan(max_prevalence(1, 0.85, 0.75))
    assert max_prevalence(5, 0.85, 0.75, hold="individuals") < max_prevalence(5, 0.85, 0.75)
    with pytest.raises(ConfigError, match="hold must be one of"):
        max_prevalence(5, 0.85, 0.75, hold="people")


# --- validation and figure rows -------------------------------------------------------------------
def test_invalid_arguments_name_the_field():
    with pytest.raises(ConfigError, match="sensitivity \\+ specificity must be > 1"):
        individual_epsilon(0.1, 5, 0.4, 0.5)
    with pytest.raises(ConfigError, match="pool_size must be integers >= 1"):
        pooled_mle(0.3, 0, 0.85, 0.75)
    with pytest.raises(ConfigError, match="prevalence must be in"):
        individual_epsilon(1.5, 5, 0.85, 0.75)
    with pytest.raises(ConfigError, match="pool_size must be <= 21"):
        individual_epsilon_enumerated(0.1, 30, 0.85, 0.75)


def test_figure_rows():
    rows = epsilon_rows([0.01, 0.05], [1, 5], 0.85, 0.75)
    assert [(row["pool_size"], row["prevalence"]) for row in rows] == [
        (1, 0.01),
        (1, 0.05),
        (5, 0.01),
        (5, 0.05),
    ]
    assert rows[3]["epsilon"] == individual_epsilon(0.05, 5, 0.85, 0.75)
    ratios = variance_ratio_rows([2, 10], [0.01, 0.2], 0.85, 0.75)
    assert all(
        row["pooling_better"] == (row["prevalence"] < row["max_prevalence"]) for row in ratios
    )
    utility = privacy_utility_rows(
        [2, 10], 0.05, 2000, 0.85, 0.75, (1.0, 0.9, 0.7), n_repetitions=200, rng=generator(4)
    )
    for c in (2, 10):
        curve = [row for row in utility if row["pool_size"] == c]
        assert curve[0]["epsilon"] == individual_epsilon(0.05, c, 0.85, 0.75)
        # stronger randomized response: more private, noisier
        assert all(np.diff([row["epsilon"] for row in curve]) < 0)
        assert all(np.diff([row["asymptotic_variance"] for row in curve]) > 0)
        assert all(row["mse"] > 0 for row in curve)
