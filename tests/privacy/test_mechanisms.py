"""Tests of p2pdp.privacy.mechanisms: noise scales, distributions, shares, calibration, RR,
counts."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from p2pdp.core.errors import ConfigError, PrivacyWarning
from p2pdp.privacy.calibration import analytic_gaussian_sigma, group_sensitivity
from p2pdp.privacy.counting import RandomizedResponse, beta_bernoulli_update, noisy_count
from p2pdp.privacy.mechanisms import (
    MECHANISMS,
    gaussian_noise_shares,
    laplace_noise_shares,
    make_mechanism,
)
from p2pdp.privacy.release import NoiseStream

EPSILON, DELTA, SENSITIVITY = 0.7, 1e-5, 0.3


def build(name: str, epsilon: float = EPSILON):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PrivacyWarning)
        return make_mechanism(name, epsilon=epsilon, delta=DELTA if name == "gaussian" else None)


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """The exact Gaussian privacy profile, written directly with scipy.stats.norm."""
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    return stats.norm.cdf(a - b) - math.exp(epsilon) * stats.norm.cdf(-a - b)


# --- noise scales ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "expected_variance"),
    [
        # per-coordinate variance: vector E||eta||^2 / d = (d+1) b^2 with b = Delta/eps
        ("vector-laplace", lambda d: (d + 1) * (SENSITIVITY / EPSILON) ** 2),
        ("coordinate-laplace", lambda d: 2 * (math.sqrt(d) * SENSITIVITY / EPSILON) ** 2),
        ("seed-laplace", lambda d: 2 * (SENSITIVITY / EPSILON) ** 2),
        ("gaussian", lambda d: analytic_gaussian_sigma(EPSILON, DELTA, SENSITIVITY) ** 2),
    ],
)
def test_empirical_variance_matches_formula(name, expected_variance):
    dim, n = 12, 40_000
    mechanism = build(name)
    noise = mechanism.sample(SENSITIVITY, dim, rng=np.random.default_rng(1), size=n)
    assert noise.shape == (n, dim)
    squared = (noise**2).mean(axis=1)  # one unbiased variance estimate per draw
    standard_error = squared.std() / math.sqrt(n)
    assert abs(squared.mean() - expected_variance(dim)) < 5 * standard_error
    assert mechanism.noise_std(SENSITIVITY, dim) == pytest.approx(math.sqrt(expected_variance(dim)))
    assert np.abs(noise.mean(axis=0)).max() < 5 * math.sqrt(expected_variance(dim) / n)


def test_vector_laplace_squared_norm_is_d_times_d_plus_1_b_squared():
    dim, n = 7, 40_000
    noise = build("vector-laplace").sample(SENSITIVITY, dim, rng=np.random.default_rng(2), size=n)
    squared_norm = (noise**2).sum(axis=1)
    expected = dim * (dim + 1) * (SENSITIVITY / EPSILON) ** 2
    assert abs(squared_norm.mean() - expected) < 5 * squared_norm.std() / math.sqrt(n)


def test_vector_laplace_norm_is_gamma_d_not_exponential():
    dim, n = 58, 20_000
    noise = build("vector-laplace").sample(SENSITIVITY, dim, rng=np.random.default_rng(3), size=n)
    norms = np.linalg.norm(noise, axis=1)
    scale = SENSITIVITY / EPSILON
    assert stats.kstest(norms, stats.gamma(dim, scale=scale).cdf).pvalue > 0.01
    assert stats.kstest(norms, stats.expon(scale=scale).cdf).pvalue < 1e-6  # the known bug


def test_vector_laplace_direction_is_uniform_on_the_sphere():
    dim, n = 10, 20_000
    noise = build("vector-laplace").sample(1.0, dim, rng=np.random.default_rng(4), size=n)
    directions = noise / np.linalg.norm(noise, axis=1, keepdims=True)
    # the first coordinate of a uniform point on S^{d-1}: (x + 1)/2 ~ Beta((d-1)/2, (d-1)/2)
    half = (dim - 1) / 2
    for coordinate in (0, dim - 1):
        projected = (directions[:, coordinate] + 1) / 2
        assert stats.kstest(projected, stats.beta(half, half).cdf).pvalue > 0.01
    # isotropic second moment: E[u u^T] = I / d
    second_moment = directions.T @ directions / n
    assert np.abs(second_moment - np.eye(dim) / dim).max() < 0.01


@pytest.mark.parametrize("name", ["vector-laplace", "coordinate-laplace", "gaussian"])
def test_sample_shapes_and_reproducibility(name):
    mechanism = build(name)
    one = mechanism.sample(SENSITIVITY, 5, rng=np.random.default_rng(9))
    again = mechanism.sample(SENSITIVITY, 5, rng=np.random.default_rng(9))
    assert one.shape == (5,)
    np.testing.assert_array_equal(one, again)
    assert np.all(one != 0)


def test_noise_scales_linearly_with_sensitivity_and_inversely_with_epsilon():
    for name in ("vector-laplace", "coordinate-laplace", "gaussian", "seed-laplace"):
        base = build(name).noise_std(1.0, 9)
        assert build(name).noise_std(3.0, 9) == pytest.approx(3 * base)
        if name != "gaussian":  # analytic sigma is not exactly 1/epsilon
            assert build(name, epsilon=2 * EPSILON).noise_std(1.0, 9) == pytest.approx(base / 2)


# --- guarantees and warnings ----------------------------------------------------------------------
def test_seed_laplace_warns_and_reports_sqrt_d_epsilon():
    with pytest.warns(PrivacyWarning, match="sqrt"):
        mechanism = make_mechanism("seed-laplace", epsilon=0.5)
    assert mechanism.guarantee(58) == (pytest.approx(0.5 * math.sqrt(58)), 0.0)
    assert mechanism.epsilon == 0.5


def test_none_warns_adds_nothing_and_reports_infinite_epsilon():
    with pytest.warns(PrivacyWarning, match="no noise"):
        mechanism = make_mechanism("none", epsilon=1.0)
    assert mechanism.guarantee(3) == (math.inf, 0.0)
    noise = mechanism.sample(1.0, 3, rng=np.random.default_rng(0), size=4)
    np.testing.assert_array_equal(noise, np.zeros((4, 3)))


@pytest.mark.parametrize("name", ["vector-laplace", "coordinate-laplace", "gaussian"])
def test_dp_mechanisms_guarantee_their_nominal_parameters_without_warning(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrivacyWarning)
        mechanism = make_mechanism(name, epsilon=0.3, delta=DELTA if name == "gaussian" else None)
    assert mechanism.guarantee(58) == (0.3, DELTA if name == "gaussian" else 0.0)
    assert mechanism.name == name


def test_mechanism_names_are_all_buildable():
    assert {build(name).name for name in MECHANISMS} == set(MECHANISMS)


# --- analytic Gaussian ----------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    epsilon=st.floats(0.01, 30.0),
    log10_delta=st.floats(-12.0, -0.5),
    sensitivity=st.floats(0.01, 10.0),
)
def test_analytic_sigma_satisfies_the_exact_condition_tightly(epsilon, log10_delta, sensitivity):
    delta = 10.0**log10_delta
    sigma = analytic_gaussian_sigma(epsilon, delta, sensitivity)
    assert gaussian_delta(sigma, epsilon, sensitivity) <= delta * (1 + 1e-6)
    assert gaussian_delta(sigma * (1 - 1e-3), epsilon, sensitivity) > delta


@settings(max_examples=40, deadline=None)
@given(epsilon=st.floats(0.01, 0.99), log10_delta=st.floats(-12.0, -2.0))
def test_analytic_sigma_beats_the_classic_formula_below_epsilon_one(epsilon, log10_delta):
    delta = 10.0**log10_delta
    classic = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    assert analytic_gaussian_sigma(epsilon, delta, 1.0) < classic


def test_analytic_sigma_is_linear_in_sensitivity():
    assert analytic_gaussian_sigma(0.5, 1e-6, 4.0) == pytest.approx(
        4 * analytic_gaussian_sigma(0.5, 1e-6, 1.0), rel=1e-10
    )


# --- noise shares ---------------------------------------------------------------------------------
def test_laplace_shares_sum_to_laplace_and_a_wrong_split_is_caught():
    scale, n_shares, n = 0.8, 5, 100_000
    rng = np.random.default_rng(5)
    shares = laplace_noise_shares(scale, n_shares, n, rng=rng)
    assert shares.shape == (n_shares, n)
    target = stats.laplace(scale=scale).cdf
    assert stats.kstest(shares.sum(axis=0), target).pvalue > 0.01
    wrong = rng.gamma(1.0, scale, (n_shares, n)) - rng.gamma(1.0, scale, (n_shares, n))
    assert stats.kstest(wrong.sum(axis=0), target).pvalue < 1e-6


def test_gaussian_shares_sum_to_gaussian_and_a_wrong_split_is_caught():
    sigma, n_shares, n = 1.3, 7, 100_000
    rng = np.random.default_rng(6)
    shares = gaussian_noise_shares(sigma, n_shares, n, rng=rng)
    assert shares.shape == (n_shares, n)
    assert np.std(shares) == pytest.approx(sigma / math.sqrt(n_shares), rel=0.01)
    target = stats.norm(scale=sigma).cdf
    assert stats.kstest(shares.sum(axis=0), target).pvalue > 0.01
    wrong = rng.normal(0.0, sigma, (n_shares, n))  # variance sigma^2 per share
    assert stats.kstest(wrong.sum(axis=0), target).pvalue < 1e-6


@pytest.mark.parametrize("name", ["coordinate-laplace", "seed-laplace", "gaussian"])
def test_mechanism_shares_sum_has_the_mechanism_distribution(name):
    mechanism, dim = build(name), 50_000
    shares = mechanism.noise_shares(SENSITIVITY, dim, 4, rng=np.random.default_rng(7))
    direct = mechanism.sample(SENSITIVITY, dim, rng=np.random.default_rng(8))
    assert shares.shape == (4, dim)
    assert stats.ks_2samp(shares.sum(axis=0), direct).pvalue > 0.01
    assert np.std(shares.sum(axis=0)) == pytest.approx(mechanism.noise_std(SENSITIVITY, dim), 0.02)


@pytest.mark.parametrize("name", MECHANISMS)
def test_splittable_flag_matches_noise_shares(name):
    mechanism = build(name)
    assert mechanism.splittable == (name != "vector-laplace")
    if mechanism.splittable:
        shares = mechanism.noise_shares(1.0, 3, 2, rng=np.random.default_rng(0))
        assert shares.shape == (2, 3)
    else:
        with pytest.raises(ConfigError, match="'vector-laplace' has no per-member noise split"):
            mechanism.noise_shares(1.0, 3, 2, rng=np.random.default_rng(0))


def test_none_splits_into_zeros():
    zeros = build("none").noise_shares(1.0, 3, 2, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(zeros, np.zeros((2, 3)))


# --- sensitivity ----------------------------------------------------------------------------------
def test_group_sensitivity_modes():
    assert group_sensitivity([10, 20, 30], 0.1) == pytest.approx(2 / (3 * 10 * 0.1))
    assert group_sensitivity([10, 20, 30], 0.1, mode="pathak") == pytest.approx(2 / (10 * 0.1))
    assert group_sensitivity(np.array([41]), 1e-3) == pytest.approx(2 / (41 * 1e-3))


@given(
    sizes=st.lists(st.integers(1, 10_000), min_size=1, max_size=50),
    lam=st.floats(1e-6, 10.0),
)
def test_pathak_is_group_size_times_group_mean(sizes, lam):
    group_mean = group_sensitivity(sizes, lam)
    assert group_sensitivity(sizes, lam, mode="pathak") == pytest.approx(len(sizes) * group_mean)
    assert group_mean == pytest.approx(2 / (len(sizes) * min(sizes) * lam))


# --- randomized response --------------------------------------------------------------------------
@given(p=st.floats(0.501, 0.999))
def test_keep_response_epsilon_is_log_odds(p):
    assert RandomizedResponse.keep(p).epsilon == pytest.approx(math.log(p / (1 - p)))


@given(theta1=st.floats(0.01, 0.99), theta2=st.floats(0.01, 0.99))
def test_forced_response_epsilon_closed_form(theta1, theta2):
    expected = math.log(1 + theta1 / ((1 - theta1) * min(theta2, 1 - theta2)))
    assert RandomizedResponse.forced(theta1, theta2).epsilon == pytest.approx(expected)


@given(epsilon=st.floats(0.01, 10.0))
def test_randomized_response_from_epsilon_is_calibrated(epsilon):
    assert RandomizedResponse.from_epsilon(epsilon).epsilon == pytest.approx(epsilon)


def test_randomized_response_without_privacy_has_infinite_epsilon():
    assert RandomizedResponse.keep(1.0).epsilon == math.inf
    assert RandomizedResponse.forced(0.5, 0.0).epsilon == math.inf  # a "yes" reveals the truth
    assert RandomizedResponse.forced(0.5, 1.0).epsilon == math.inf  # a "no" reveals the truth


def test_forced_response_with_half_is_keep_response():
    forced = RandomizedResponse.forced(0.4, 0.5)
    np.testing.assert_allclose(
        forced.output_probabilities(), RandomizedResponse.keep(0.7).output_probabilities()
    )


@pytest.mark.parametrize(
    "mechanism", [RandomizedResponse.keep(0.8), RandomizedResponse.forced(0.5, 0.3)]
)
def test_randomized_response_sampler_follows_its_output_probabilities(mechanism):
    n = 50_000
    bits = np.repeat([0, 1], n)
    answers = mechanism.sample(bits, rng=np.random.default_rng(10))
    assert answers.dtype == bool and answers.shape == bits.shape
    expected = mechanism.output_probabilities()[:, 1]
    observed = np.array([answers[:n].mean(), answers[n:].mean()])
    assert np.all(np.abs(observed - expected) < 5 * np.sqrt(expected * (1 - expected) / n))


@pytest.mark.parametrize(
    "mechanism", [RandomizedResponse.keep(0.75), RandomizedResponse.forced(0.5, 0.5)]
)
def test_proportion_estimator_is_unbiased_with_the_stated_variance(mechanism):
    proportion, n, repeats = 0.3, 400, 4000
    rng = np.random.default_rng(11)
    bits = rng.random((repeats, n)) < proportion
    answers = mechanism.sample(bits, rng=rng)
    estimates = np.array([mechanism.estimate_proportion(row) for row in answers])
    # the bits are drawn iid Bernoulli(proportion), so the answers are iid Bernoulli(q)
    variance = mechanism.estimator_variance(proportion, n)
    assert abs(estimates.mean() - proportion) < 4 * math.sqrt(variance / repeats)
    assert estimates.var() == pytest.approx(variance, rel=0.1)


# --- noisy count ----------------------------------------------------------------------------------
def test_noisy_count_is_clamped_with_the_right_atom():
    rng = np.random.default_rng(12)
    records = np.zeros(5, dtype=int)
    draws = np.array([noisy_count(records, 0.5, rng=rng) for _ in range(4000)])
    assert draws.min() == 0.0 and draws.max() <= 5.0
    # count 0: P(output = 0) = P(Laplace <= 0) = 1/2; P(output = 5) = P(Laplace >= 5)
    assert abs((draws == 0).mean() - 0.5) < 4 * math.sqrt(0.25 / 4000)
    top = stats.laplace(scale=2.0).sf(5)
    assert abs((draws == 5).mean() - top) < 4 * math.sqrt(top * (1 - top) / 4000)


def test_noisy_count_noise_is_laplace_one_over_epsilon():
    rng = np.random.default_rng(13)
    records = np.r_[np.ones(500, dtype=bool), np.zeros(500, dtype=bool)]
    noise = np.array([noisy_count(records, 2.0, rng=rng) for _ in range(5000)]) - 500
    assert stats.kstest(noise, stats.laplace(scale=0.5).cdf).pvalue > 0.01


def test_beta_bernoulli_update():
    assert beta_bernoulli_update(1.0, 2.0, 3.5, 10) == (4.5, 8.5)


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("epsilon", [0, -1.0, math.nan, math.inf])
@pytest.mark.parametrize("name", MECHANISMS)
def test_bad_epsilon_is_rejected(name, epsilon):
    with pytest.raises(ConfigError, match=rf"epsilon must be > 0 and finite, got {epsilon}"):
        make_mechanism(name, epsilon=epsilon, delta=DELTA if name == "gaussian" else None)


@pytest.mark.parametrize("delta", [None, 0.0, 1.0, -0.1, math.nan])
def test_bad_gaussian_delta_is_rejected(delta):
    with pytest.raises(ConfigError, match=f"delta .*got {delta}"):
        make_mechanism("gaussian", epsilon=1.0, delta=delta)


def test_delta_for_a_pure_mechanism_and_unknown_names_are_rejected():
    with pytest.raises(ConfigError, match="delta must be 0 .*got 1e-05"):
        make_mechanism("vector-laplace", epsilon=1.0, delta=1e-5)
    with pytest.raises(ConfigError, match="mechanism must be one of .*got 'laplace'"):
        make_mechanism("laplace", epsilon=1.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, rng: m.sample(0.0, 3, rng=rng), "sensitivity must be > 0 and finite, got 0.0"),
        (lambda m, rng: m.sample(math.inf, 3, rng=rng), "sensitivity .*got inf"),
        (lambda m, rng: m.sample(-1.0, 3, rng=rng), "sensitivity .*got -1.0"),
        (lambda m, rng: m.sample(1.0, 0, rng=rng), "dim must be an integer >= 1, got 0"),
        (lambda m, rng: m.sample(1.0, 2.5, rng=rng), "dim .*got 2.5"),
        (lambda m, rng: m.sample(1.0, 3, rng=rng, size=0), "size .*got 0"),
        (lambda m, rng: m.noise_shares(math.nan, 3, 2, rng=rng), "sensitivity .*got nan"),
        (lambda m, rng: m.noise_shares(1.0, 3, 0, rng=rng), "n_shares .*got 0"),
        (lambda m, rng: m.guarantee(0), "dim .*got 0"),
    ],
)
def test_bad_sample_arguments_are_rejected(call, message):
    with pytest.raises(ConfigError, match=message):
        call(build("coordinate-laplace"), np.random.default_rng(0))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: laplace_noise_shares(0.0, 2, 3, rng=None), "scale .*got 0.0"),
        (lambda: gaussian_noise_shares(-1.0, 2, 3, rng=None), "sigma .*got -1.0"),
        (lambda: gaussian_noise_shares(1.0, 0, 3, rng=None), "n_shares .*got 0"),
        (lambda: analytic_gaussian_sigma(0.0, 1e-5, 1.0), "epsilon .*got 0.0"),
        (lambda: analytic_gaussian_sigma(1.0, 1.5, 1.0), r"delta must be in \(0, 1\), got 1.5"),
        (lambda: analytic_gaussian_sigma(1.0, 1e-5, math.nan), "sensitivity .*got nan"),
        (lambda: group_sensitivity([10, 20], 0.0), "lam must be > 0 and finite, got 0.0"),
        (lambda: group_sensitivity([10, 20], -1.0), "lam .*got -1.0"),
        (lambda: group_sensitivity([], 0.1), r"shard_sizes .*non-empty.*got \[\]"),
        (lambda: group_sensitivity([10, 0], 0.1), r"shard_sizes .*>= 1, got \[10, 0\]"),
        (lambda: group_sensitivity([10, -3], 0.1), r"shard_sizes .*got \[10, -3\]"),
        (lambda: group_sensitivity([10, 2.5], 0.1), r"shard_sizes .*got \[10, 2.5\]"),
        (lambda: group_sensitivity([10], 0.1, mode="max"), "mode must be one of .*got 'max'"),
        (lambda: RandomizedResponse.keep(0.5), r"p must be in \(0.5, 1\], got 0.5"),
        (lambda: RandomizedResponse.keep(0.2), r"p must be in \(0.5, 1\], got 0.2"),
        (lambda: RandomizedResponse.keep(1.2), "p must be .*got 1.2"),
        (lambda: RandomizedResponse.forced(0.0, 0.5), r"theta1 must be in \(0, 1\], got 0.0"),
        (lambda: RandomizedResponse.forced(1.1, 0.5), "theta1 .*got 1.1"),
        (lambda: RandomizedResponse.forced(0.5, -0.1), r"theta2 must be in \[0, 1\], got -0.1"),
        (lambda: RandomizedResponse.forced(0.5, math.nan), "theta2 .*got nan"),
        (lambda: RandomizedResponse.from_epsilon(-1.0), "epsilon .*got -1.0"),
        (
            lambda: RandomizedResponse(p_yes_given_yes=0.3, p_yes_given_no=0.6),
            "p_yes_given_yes must exceed p_yes_given_no.*0.3",
        ),
        (
            lambda: RandomizedResponse.keep(0.8).sample([0, 2], rng=None),
            r"bits must contain only 0/1 .*\[0 2\]",
        ),
        (lambda: RandomizedResponse.keep(0.8).estimate_proportion([]), "answers .*got 0"),
        (lambda: RandomizedResponse.keep(0.8).estimator_variance(1.5, 10), "proportion .*1.5"),
        (lambda: RandomizedResponse.keep(0.8).estimator_variance(0.5, 0), "n .*got 0"),
        (lambda: noisy_count([0, 1], 0.0, rng=None), "epsilon .*got 0.0"),
        (lambda: noisy_count([0.5, 1], 1.0, rng=None), "records must contain only 0/1"),
        (lambda: beta_bernoulli_update(0.0, 1.0, 1.0, 2), "a must be > 0 .*got 0.0"),
        (lambda: beta_bernoulli_update(1.0, 1.0, 3.0, 2), r"count must be in \[0, 2\], got 3.0"),
        (lambda: beta_bernoulli_update(1.0, 1.0, -1.0, 2), "count .*got -1.0"),
        (lambda: beta_bernoulli_update(1.0, 1.0, 0.0, -2), "n must be an integer >= 0, got -2"),
    ],
)
def test_bad_arguments_name_parameter_and_value(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_group_sensitivity_adds_the_solver_tolerance():
    from p2pdp.privacy.calibration import group_sensitivity

    exact = group_sensitivity([40, 50], 0.01)
    assert exact == pytest.approx(2 / (2 * 40 * 0.01))
    slack = group_sensitivity([40, 50], 0.01, gradient_tolerance=1e-3)
    assert slack == pytest.approx(2 * (1 / 40 + 1e-3) / (2 * 0.01))
    with pytest.raises(ConfigError, match="gradient_tolerance"):
        group_sensitivity([40], 0.01, gradient_tolerance=-1.0)


@pytest.mark.parametrize("name", ["vector-laplace", "coordinate-laplace", "gaussian"])
def test_noise_drawn_many_at_a_time_is_the_noise_drawn_one_by_one(name):
    """NoiseStream.draw_many: the same vectors as draw, in order, across batch boundaries,
    and the stream left at the same point (the next draws agree too)."""
    mechanism = build(name)
    assert mechanism.scale_family
    one, many = (NoiseStream(mechanism, 3, rng=np.random.default_rng(4)) for _ in "ab")
    for n in (5, 0, 300, 1, 251, 256, 700):  # within a batch, to its end, over several
        scales = (np.arange(n) % 7 * 0.5 + 0.25).tolist()
        expected = np.array([one.draw(scale) for scale in scales]).reshape(n, 3)
        np.testing.assert_array_equal(many.draw_many(scales), expected)
    np.testing.assert_array_equal(many.draw(2.0), one.draw(2.0))
