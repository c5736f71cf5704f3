"""Tests of p2pdp.tasks.prevalence.estimators: noisy counts into Beta posteriors, honest intervals,
RR, policies."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.experiments.audit.table import audit_mechanism
from p2pdp.privacy.counting import RandomizedResponse, beta_bernoulli_update, noisy_count
from p2pdp.tasks.prevalence.estimators import (
    BetaMixture,
    accumulate_policy,
    beta_posterior,
    central_error_variance,
    channel_posterior,
    combine_log_likelihoods,
    coverage_rows,
    credible_interval,
    laplace_count_log_likelihood,
    laplace_posterior,
    local_error_variance,
    noisy_counts,
    policy_noise_variance,
    posterior_interval,
    requery_policy,
    rr_count_log_likelihood,
    rr_debiased_posterior,
    scaling_rows,
    two_coin_response,
    two_coin_theta1,
)

GRID = np.linspace(0.0, 1.0, 20_001)[1:-1]  # theta grid of the brute-force posteriors


# The brute-force checks use a Beta(2, 3) prior, whose density vanishes at 0 and 1, so a
# Riemann sum on GRID is accurate to ~1e-9 (with Jeffreys' singular density it is off by ~1e-3).
BRUTE_PRIOR = (2.0, 3.0)


def grid_posterior_mean(log_likelihood_of_theta: np.ndarray, prior=BRUTE_PRIOR) -> float:
    """Posterior mean on GRID, computed directly in theta (independent of the mixture)."""
    log_post = log_likelihood_of_theta + stats.beta.logpdf(GRID, *prior)
    weights = np.exp(log_post - log_post.max())
    return float(np.sum(weights * GRID) / np.sum(weights))


def laplace_likelihood_of_theta(released: float, n: int, epsilon: float) -> np.ndarray:
    """P(released | theta) = sum_k Binomial(k; n, theta) f(released | k), by brute force."""
    k = np.arange(n + 1)
    if 0 < released < n:
        noise = stats.laplace.pdf(released - k, scale=1 / epsilon)
    elif released <= 0:
        noise = stats.laplace.cdf(-k, scale=1 / epsilon)
    else:
        noise = stats.laplace.sf(n - k, scale=1 / epsilon)
    return np.log(stats.binom.pmf(k[None, :], n, GRID[:, None]) @ noise)


# --- central release ------------------------------------------------------------------------------
def test_noisy_counts_are_noisy_count_vectorised():
    rng = generator(0, "records")
    records = rng.random((6, 25)) < 0.3
    one_by_one = [noisy_count(row, 0.5, rng=generator(1, "noise")) for row in records[:1]]
    shared = generator(1, "noise")
    one_by_one = [noisy_count(row, 0.5, rng=shared) for row in records]
    vectorised = noisy_counts(records.sum(axis=1), 25, 0.5, rng=generator(1, "noise"))
    np.testing.assert_array_equal(vectorised, one_by_one)
    assert np.all((vectorised >= 0) & (vectorised <= 25))


def test_beta_posterior_is_beta_bernoulli_update_vectorised():
    counts, n = np.array([0.0, 3.5, 10.0]), np.array([10, 10, 10])
    a, b = beta_posterior(counts, n, prior=(2.0, 3.0))
    expected = [beta_bernoulli_update(2.0, 3.0, float(c), 10) for c in counts]
    np.testing.assert_allclose(np.column_stack([a, b]), expected)
    with pytest.raises(ConfigError, match="counts must be in"):
        beta_posterior([11.0], 10)


@pytest.mark.parametrize("k", [0, 3, 8])
def test_laplace_count_likelihood_is_a_probability_law(k):
    # the atoms at 0 and n plus the density in between integrate to 1 for each true count
    n, epsilon = 8, 0.7
    atoms = np.exp(laplace_count_log_likelihood([0.0, float(n)], n, epsilon)[:, k]).sum()
    density, _ = integrate.quad(
        lambda c: math.exp(laplace_count_log_likelihood(c, n, epsilon)[k]),
        0,
        n,
        points=list(range(1, n)),
    )
    assert atoms + density == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("released", [0.0, 2.3, 11.7, 20.0])
def test_exact_posterior_matches_a_brute_force_grid(released):
    n, epsilon = 20, 0.4
    posterior = laplace_posterior(released, n, epsilon, prior=BRUTE_PRIOR)
    expected = grid_posterior_mean(laplace_likelihood_of_theta(released, n, epsilon))
    assert float(posterior.mean()) == pytest.approx(expected, abs=1e-8)
    assert np.isclose(posterior.weights.sum(), 1.0)


def test_combined_releases_match_a_brute_force_grid():
    # two releases over disjoint records: the likelihood is the product of the marginals
    parts = [(3.4, 10, 0.5), (0.0, 15, 1.0), (12.2, 15, 0.3)]
    log_likelihood = combine_log_likelihoods(
        [laplace_count_log_likelihood(c, n, e) for c, n, e in parts]
    )
    posterior = channel_posterior(log_likelihood, 40, prior=BRUTE_PRIOR)
    brute = sum(laplace_likelihood_of_theta(c, n, e) for c, n, e in parts)
    assert float(posterior.mean()) == pytest.approx(grid_posterior_mean(brute), abs=1e-8)


def test_mixture_quantiles_are_exact():
    # a one-component mixture is a Beta: its quantiles are scipy's, including Jeffreys tails
    for n, k in ((1, 1), (30, 7), (100, 0), (10_000, 0), (10_000, 10_000)):
        log_weights = np.full(n + 1, -np.inf)
        log_weights[k] = 0.0
        mixture = BetaMixture(a=0.5, b=0.5, n=n, log_weights=log_weights)
        for probability in (0.025, 0.5, 0.975):
            assert mixture.quantile(probability) == pytest.approx(
                stats.beta.ppf(probability, 0.5 + k, 0.5 + n - k), rel=1e-9, abs=1e-15
            )
    posterior = laplace_posterior([1.0, 13.5, 30.0], 30, 0.2)
    low, high = posterior.interval(0.9)
    np.testing.assert_allclose(posterior.cdf(low), 0.05, atol=1e-9)
    np.testing.assert_allclose(posterior.cdf(high), 0.95, atol=1e-9)


# Coverage: with the prevalence drawn from the prior, exact posterior intervals cover with
# probability exactly `level`; 1,500 repetitions give a standard error of 0.56%, and the tests
# allow 4 of them. At epsilon = 0.1 with n = 30 the noise (sd 14 counts) dwarfs the binomial
# spread, and the naive intervals cover about half the time (measured 0.46 at n = 50).
def test_noise_makes_naive_intervals_lie_and_the_exact_posterior_is_honest():
    rows = coverage_rows(30, [0.1, 3.0], n_repetitions=1500, rng=generator(5, "coverage"))
    coverage = {(row["method"], row["epsilon"]): row["coverage"] for row in rows}
    tolerance = 4 * math.sqrt(0.95 * 0.05 / 1500)
    assert abs(coverage[("exact", 0.1)] - 0.95) < tolerance
    assert abs(coverage[("exact", 3.0)] - 0.95) < tolerance
    nonprivate = [value for (method, _), value in coverage.items() if method == "non-private"]
    assert abs(nonprivate[0] - 0.95) < tolerance
    assert coverage[("naive", 0.1)] < 0.75  # noise makes the naive intervals lie
    assert coverage[("widened", 0.1)] > coverage[("naive", 0.1)] + 0.1  # better, not exact
    assert coverage[("naive", 3.0)] > 0.9  # little noise: naive is nearly right


def test_interval_methods_are_validated():
    with pytest.raises(ConfigError, match="method must be one of"):
        posterior_interval([3.0], 10, 1.0, method="bayes")
    low, high = posterior_interval([3.0], 10, 1.0, method="naive")
    expected = credible_interval(3.5, 7.5)
    np.testing.assert_allclose([low[0], high[0]], expected)


# --- the seed's two policies ----------------------------------------------------------------------
def test_policy_noise_variances_match_simulation():
    # counts far from the clamps: the released noise is plain Laplace
    reps, q, m, epsilon = 4000, 4, 1000, 0.5
    counts = np.full((reps, q), m // 2)
    accumulate = accumulate_policy(counts, m, epsilon, rng=generator(6, "acc"), method="naive")
    requery = requery_policy(counts, m, epsilon, rng=generator(6, "req"), method="naive")
    accumulated_noise = np.cumsum(accumulate.released - counts, axis=1)
    requery_noise = requery.released - np.cumsum(counts, axis=1)
    for noise, policy in ((accumulated_noise, "accumulate"), (requery_noise, "requery")):
        # sample variance of Laplace sums: relative standard error below 5% here
        np.testing.assert_allclose(
            noise.var(axis=0), policy_noise_variance(q, epsilon, policy), rtol=0.2
        )
    # accumulation has less noise at every step, not only early on
    assert np.all(
        policy_noise_variance(q, epsilon, "accumulate")
        < policy_noise_variance(q, epsilon, "requery")
    )


@pytest.mark.parametrize("policy", [accumulate_policy, requery_policy])
def test_a_naive_policy_takes_the_released_counts_so_far_as_true_ones(policy):
    """accumulate: the Beta of the released counts summed so far; requery: of the latest
    cumulative release; both of the records seen so far. A method other than naive or exact
    is refused by name."""
    counts = generator(8, "batches").binomial(20, 0.3, (5, 3))
    trace = policy(counts, 20, 1.0, rng=generator(8, "naive"), method="naive")
    seen = 20 * np.arange(1, 4)
    so_far = np.cumsum(trace.released, axis=1) if policy is accumulate_policy else trace.released
    a, b = beta_posterior(so_far, seen)
    np.testing.assert_allclose(trace.mean, a / (a + b), rtol=1e-12)
    low, high = credible_interval(a, b, 0.95)
    np.testing.assert_allclose(trace.low, low, rtol=1e-12)
    np.testing.assert_allclose(trace.high, high, rtol=1e-12)
    with pytest.raises(ConfigError, match="method must be 'naive' or 'exact', got 'mean'"):
        policy(counts, 20, 1.0, rng=generator(8, "naive"), method="mean")


def test_accumulated_exact_posterior_beats_requery_and_covers():
    theta, reps, q, m, epsilon = 0.2, 200, 3, 30, 0.5
    counts = generator(7, "batches").binomial(m, theta, (reps, q))
    accumulate = accumulate_policy(counts, m, epsilon, rng=generator(7, "acc"))
    requery = requery_policy(counts, m, epsilon, rng=generator(7, "req"))
    accumulate_rmse = np.sqrt(np.mean((accumulate.mean - theta) ** 2, axis=0))
    requery_rmse = np.sqrt(np.mean((requery.mean - theta) ** 2, axis=0))
    assert np.all(accumulate_rmse < requery_rmse)
    coverage = np.mean((accumulate.low <= theta) & (theta <= accumulate.high), axis=0)
    assert np.all(coverage > 0.89)  # 4 sd of a 200-repetition coverage estimate below 0.95


# --- local model ----------------------------------------------------------------------------------
@settings(max_examples=50)
@given(epsilon=st.floats(0.01, 8.0), theta2=st.floats(0.01, 0.99))
def test_two_coin_calibration_is_exact(epsilon, theta2):
    response = two_coin_response(epsilon, theta2)
    assert response.epsilon == pytest.approx(epsilon, rel=1e-9)
    theta1 = two_coin_theta1(epsilon, theta2)
    assert response.p_yes_given_no == pytest.approx((1 - theta1) * theta2)


def test_two_coin_with_a_fair_second_coin_is_the_keep_form():
    theta1 = two_coin_theta1(1.3, 0.5)
    keep = RandomizedResponse.keep((1 + theta1) / 2)
    np.testing.assert_allclose(
        two_coin_response(1.3, 0.5).output_probabilities(), keep.output_probabilities()
    )
    result = audit_mechanism("randomized-response-two-coin", n_samples=8, rng=generator(0))
    assert result.passed and result.eps_lb == pytest.approx(result.epsilon)


def test_rr_count_likelihood_is_the_convolution_of_two_binomials():
    response = two_coin_response(0.8, 0.3)
    n = 12
    for k in (0, 5, 12):
        law = np.convolve(
            stats.binom.pmf(np.arange(k + 1), k, response.p_yes_given_yes),
            stats.binom.pmf(np.arange(n - k + 1), n - k, response.p_yes_given_no),
        )
        for yes in (0, 4, 12):
            assert math.exp(rr_count_log_likelihood(yes, n, response)[k]) == pytest.approx(
                law[yes], rel=1e-10
            )


def test_rr_exact_posterior_covers_and_debiased_pseudo_counts_do_not():
    theta, n, reps = 0.2, 60, 400
    response = two_coin_response(1.0, 0.3)
    rng = generator(8, "rr")
    yes = response.sample(rng.random((reps, n)) < theta, rng=rng).sum(axis=1)
    exact = channel_posterior(
        np.stack([rr_count_log_likelihood(int(count), n, response) for count in yes]), n
    )
    low, high = exact.interval()
    covered = np.mean((low <= theta) & (theta <= high))
    assert covered > 0.95 - 4 * math.sqrt(0.05 * 0.95 / reps)
    low, high = credible_interval(*rr_debiased_posterior(yes, n, response))
    assert np.mean((low <= theta) & (theta <= high)) < 0.7  # measured 0.45


# --- error scalings -------------------------------------------------------------------------------
def test_error_formulas_match_simulation_and_scale_as_claimed():
    rows = scaling_rows([100, 1600], [0.5], 0.2, n_repetitions=3000, rng=generator(9, "scale"))
    for row in rows:  # rmse of 3,000 repetitions: relative standard error about 1.3%
        assert row["rmse"] == pytest.approx(row["predicted_rmse"], rel=0.08)
    p, eps = 0.2, 0.5
    # privacy cost beyond the sampling variance: central ~ 1/n^2, local ~ 1/n
    sampling = np.array([p * (1 - p) / 100, p * (1 - p) / 1600])
    central = central_error_variance(p, np.array([100, 1600]), eps) - sampling
    local = local_error_variance(p, np.array([100, 1600]), eps) - sampling
    assert central[0] / central[1] == pytest.approx(16**2)
    assert local[0] / local[1] == pytest.approx(16)
    # and for small epsilon the local excess is about 1 / (epsilon^2 n)
    small = 0.01
    assert local_error_variance(p, 1000, small) - p * (1 - p) / 1000 == pytest.approx(
        1 / (small**2 * 1000), rel=1e-3
    )
