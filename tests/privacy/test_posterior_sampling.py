"""Tests of p2pdp.privacy.posterior_sampling.posterior (DP posterior sampling), its audit and the
seed's example."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from p2pdp.core.errors import ConfigError
from p2pdp.privacy.posterior_sampling.audit import (
    audit_exponential_mechanism,
    audit_langevin_stationarity,
)
from p2pdp.privacy.posterior_sampling.diagnostics import effective_sample_size, split_rhat
from p2pdp.privacy.posterior_sampling.example import PARAMETERS, TRUTH, posterior_rows
from p2pdp.privacy.posterior_sampling.langevin import SamplerSettings
from p2pdp.privacy.posterior_sampling.posterior import (
    GUARANTEE_LABEL,
    map_estimate,
    private_logistic_peers,
    private_peer_model,
    private_posterior,
)
from p2pdp.privacy.posterior_sampling.utility import (
    LinearRegression,
    LogisticRegression,
    _Batch,
    bounded_log_likelihood,
    common_random_numbers,
    elbo,
    utility_sensitivity,
)

FAST = SamplerSettings(n_optimise=100, n_burnin=200, n_samples=200, trace_points=50)


def _linear_data(n=30, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-0.5, 0.5, (n, 2))
    return X, X @ [2.0, -3.5] - 5 + 0.1 * rng.standard_normal(n)


def _logistic_data(n=25, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1, keepdims=True))
    return X, np.where(X @ np.arange(1.0, d + 1) + 0.2 * rng.standard_normal(n) > 0, 1.0, -1.0)


@pytest.mark.parametrize("kind", ["linear", "logistic"])
@pytest.mark.parametrize("tau", [0.7, math.inf])
def test_elbo_gradient_matches_finite_differences(kind, tau):
    if kind == "linear":
        X, y = _linear_data()
        model = LinearRegression()
        mu = np.array([1.5, -3.0, -4.8, -1.5])
    else:
        X, y = _logistic_data()
        model = LogisticRegression(lam=0.05)
        mu = np.array([0.5, -0.3, 1.2])
    p = len(mu)
    rng = np.random.default_rng(1)
    batch = _Batch.from_shards([X], [y])
    z = np.concatenate([mu, rng.uniform(-2.5, -0.5, p)])[None, None]
    noise = common_random_numbers(4, p, rng=rng)
    _, grad = elbo(z, noise, batch, model, tau)
    step = 1e-6
    numeric = np.empty(2 * p)
    for i in range(2 * p):
        shift = np.zeros(2 * p)
        shift[i] = step
        upper = elbo(z + shift, noise, batch, model, tau)[0]
        lower = elbo(z - shift, noise, batch, model, tau)[0]
        numeric[i] = (upper - lower)[0, 0] / (2 * step)
    np.testing.assert_allclose(grad[0, 0], numeric, rtol=1e-5, atol=1e-5)


@hypothesis_settings(max_examples=50, deadline=None)
@given(
    l=st.lists(st.floats(allow_nan=False, allow_infinity=True), min_size=1, max_size=20),
    tau=st.floats(min_value=1e-3, max_value=1e3),
)
def test_bounded_log_likelihood_stays_within_tau(l, tau):
    gamma, slope = bounded_log_likelihood(np.array(l), tau)
    assert np.all(np.abs(gamma) <= tau)
    assert np.all((slope >= 0) & (slope <= 1))
    finite = np.isfinite(l) & (np.abs(l) < 1e300)
    expected = tau * np.tanh(np.array(l)[finite] / tau)
    np.testing.assert_allclose(gamma[finite], expected, atol=1e-12 * tau)


def test_sensitivity_is_the_width_of_gammas_range():
    assert utility_sensitivity(LinearRegression(), 2.0) == 4.0
    assert utility_sensitivity(LogisticRegression(lam=0.1), 2.0) == 2.0  # l <= 0
    with pytest.raises(ConfigError, match="tau"):
        utility_sensitivity(LinearRegression(), -1.0)


def test_common_random_numbers_are_antithetic_and_moment_matched():
    noise = common_random_numbers(4, 3, rng=np.random.default_rng(0))
    np.testing.assert_allclose(noise.mean(axis=2), 0.0, atol=1e-12)
    np.testing.assert_allclose((noise**2).mean(axis=2), 1.0)
    with pytest.raises(ConfigError, match="even"):
        common_random_numbers(3, 3, rng=np.random.default_rng(0))


@pytest.mark.parametrize("name", ["posterior-linear-exact", "posterior-logistic-exact"])
def test_exact_audit_of_the_exponential_mechanism_passes(name):
    result = audit_exponential_mechanism(name)
    assert result.passed and result.as_expected and result.method == "exact"
    assert 0.0 < result.eps_lb <= result.epsilon


def test_exact_audit_flags_half_the_sensitivity():
    result = audit_exponential_mechanism("posterior-linear-half-sensitivity")
    assert not result.passed and result.as_expected
    assert result.eps_lb > 1.2 * result.epsilon


def test_langevin_stationary_law_matches_the_integrated_target():
    result = audit_langevin_stationarity()
    assert result.passed and result.threshold >= 0.01


def test_langevin_with_a_missing_noise_factor_is_rejected():
    result = audit_langevin_stationarity(noise_factor=1.0)
    assert not result.passed and result.as_expected and result.threshold < 1e-6


def test_split_rhat_and_ess_on_known_chains():
    rng = np.random.default_rng(0)
    iid = rng.standard_normal((4, 1000))
    assert split_rhat(iid) == pytest.approx(1.0, abs=0.01)
    assert effective_sample_size(iid) == pytest.approx(4000, rel=0.15)
    shifted = iid + np.array([0.0, 0.0, 0.0, 3.0])[:, None]
    assert split_rhat(shifted) > 1.3
    phi = 0.9  # AR(1): ESS / N = (1 - phi) / (1 + phi)
    ar = np.zeros((4, 4000))
    for t in range(1, 4000):
        ar[:, t] = phi * ar[:, t - 1] + rng.standard_normal(4)
    assert effective_sample_size(ar) == pytest.approx(16000 * (1 - phi) / (1 + phi), rel=0.3)


def test_private_posterior_is_deterministic_from_the_seed():
    X, y = _logistic_data(n=40)
    settings = SamplerSettings(n_optimise=20, n_burnin=50, n_samples=50)
    model = LogisticRegression(lam=0.05)

    def run(seed):
        return private_posterior(
            X, y, model=model, epsilon=1.0, tau=1.0, rng=np.random.default_rng(seed),
            chains=2, draws=2, settings=settings,
        )  # fmt: skip

    first, again, other = run(7), run(7), run(8)
    np.testing.assert_array_equal(first.released, again.released)
    np.testing.assert_array_equal(first.diagnostics.rhat, again.diagnostics.rhat)
    assert not np.array_equal(first.released, other.released)
    assert first.guarantee == GUARANTEE_LABEL and first.sensitivity == 1.0
    with pytest.raises(ValueError):
        first.means[0] = 0.0  # released arrays are read-only


def test_logistic_model_refuses_data_outside_its_assumptions():
    X, y = _logistic_data()
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="norm"):
        private_peer_model(2 * X + 1, y, lam=0.1, epsilon=1, tau=1, rng=rng)
    with pytest.raises(ConfigError, match="y must be"):
        private_peer_model(X, (y + 1) / 2, lam=0.1, epsilon=1, tau=1, rng=rng)
    with pytest.raises(ConfigError, match="epsilon"):
        private_peer_model(X, y, lam=0.1, epsilon=0, tau=1, rng=rng)


def test_batched_peers_equal_separate_draws_in_distribution_and_shape():
    shards = [_logistic_data(n=n, seed=n) for n in (20, 23, 31)]
    settings = SamplerSettings(n_optimise=50, n_burnin=100, n_samples=100)
    result = private_logistic_peers(
        [X for X, _ in shards], [y for _, y in shards], lam=0.05, epsilon=10.0, tau=1.0,
        rng=np.random.default_rng(0), settings=settings,
    )  # fmt: skip
    assert result.means.shape == (3, 3) and result.rhat.shape == (3, 6)
    # at epsilon = 10 each released model classifies its own shard better than chance
    for (X, y), w in zip(shards, result.means, strict=True):
        assert np.mean(np.sign(X @ w) == y) > 0.7


def test_map_matches_least_squares_on_the_seed_data():
    X, y = _linear_data(n=2000)
    theta = map_estimate(X, y, model=LinearRegression())
    design = np.column_stack([X, np.ones(len(X))])
    ols = np.linalg.lstsq(design, y, rcond=None)[0]
    np.testing.assert_allclose(theta[:3], ols, atol=1e-4)
    residual_sd = np.sqrt(np.mean((y - design @ ols) ** 2))
    assert math.exp(theta[3]) == pytest.approx(residual_sd, rel=0.01)


def _check_targets(row):
    for name in ("x1", "x2", "intercept"):
        assert abs(row[f"private_mean.{name}"] - TRUTH[name]) <= 0.25, name
        assert abs(row[f"map.{name}"] - TRUTH[name]) <= 0.02, name
    assert row["guarantee"] == GUARANTEE_LABEL


def test_seed_example_targets_at_epsilon_1_tau_2():
    (row,) = posterior_rows(epsilons=(1.0,), taus=(2.0,), chains=2, settings=FAST)
    _check_targets(row)
    assert set(PARAMETERS) == {"x1", "x2", "intercept", "sigma"}
    assert row["rhat_max.means"] < 1.5


@pytest.mark.slow
def test_seed_example_full_grid():
    rows = posterior_rows()
    assert len(rows) == 9
    _check_targets(next(r for r in rows if r["epsilon"] == 1.0 and r["tau"] == 2.0))
    for row in rows:
        assert all(np.isfinite(row[f"private_mean.{name}"]) for name in PARAMETERS)
