"""Exact Gaussian composition (mu-GDP): closed forms, independent integrals, the README table."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate
from scipy.optimize import brentq
from scipy.special import ndtri
from scipy.stats import norm

from p2pdp.core.errors import ConfigError
from p2pdp.privacy.accounting import BUDGET_TABLE_SETTINGS, affordable_aggregations
from p2pdp.privacy.calibration import analytic_gaussian_sigma
from p2pdp.privacy.gdp import (
    MAX_MU,
    _log_delta,
    affordable_aggregations_gdp,
    composed_epsilon_gdp,
    gaussian_mu,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    noise_multiplier_for_gdp,
)


def hockey_stick(epsilon: float, mu: float) -> float:
    """delta(epsilon) between N(mu, 1) and N(0, 1) by numerical integration (no closed form)."""

    def gap(x: float) -> float:
        return max(0.0, norm.pdf(x, loc=mu) - math.exp(epsilon) * norm.pdf(x))

    # the integrand is positive exactly where x > epsilon/mu + mu/2
    start = epsilon / mu + mu / 2
    value, _ = integrate.quad(gap, start, start + 40 + 10 * mu, epsabs=1e-15, epsrel=1e-12)
    return value


@pytest.mark.parametrize(("epsilon", "mu"), [(0.0, 0.5), (0.3, 0.2), (1.0, 1.0), (4.0, 2.5)])
def test_delta_matches_the_hockey_stick_integral(epsilon: float, mu: float) -> None:
    assert gdp_delta(epsilon, mu) == pytest.approx(hockey_stick(epsilon, mu), rel=1e-7, abs=1e-14)


def test_delta_at_zero_epsilon_is_total_variation() -> None:
    mu = np.array([0.01, 0.5, 3.0])
    np.testing.assert_allclose(gdp_delta(0.0, mu), 2 * norm.cdf(mu / 2) - 1, rtol=1e-12)


def test_delta_stays_accurate_in_the_far_tail() -> None:
    # direct evaluation cancels to 0 here; log space keeps the value (Phi(-a) ~ pdf(a)/a)
    value = float(gdp_delta(60.0, 1.0))
    assert 0 < value < 1e-300 or value == 0.0
    assert float(gdp_delta(20.0, 1.0)) > 0
    assert float(gdp_delta(20.0, 1.0)) == pytest.approx(hockey_stick(20.0, 1.0), rel=1e-6)


def test_one_release_is_the_analytic_gaussian_calibration() -> None:
    """gdp_epsilon(1/z) inverts Balle & Wang's calibration (an independent root finder)."""
    for epsilon, delta in [(0.1, 1e-6), (1.0, 1e-5), (5.0, 1e-8), (20.0, 1e-3)]:
        z = analytic_gaussian_sigma(epsilon, delta, 1.0)
        assert float(gdp_epsilon(1 / z, delta)) == pytest.approx(epsilon, rel=1e-8)
        assert gdp_mu(epsilon, delta) == pytest.approx(1 / z, rel=1e-8)


def test_the_calibrated_mu_reports_at_most_its_budget() -> None:
    """gdp_mu steps down until gdp_epsilon's own check (with its rounding margin) holds, so
    the epsilon a run reports for the calibrated noise never reads above the budget."""
    for epsilon in np.geomspace(0.01, 50.0, 17):
        for delta in (1e-3, 1e-5, 1e-9):
            mu = gdp_mu(float(epsilon), delta)
            assert float(gdp_epsilon(mu, delta)) <= epsilon
            assert float(gdp_epsilon(mu * (1 + 1e-9), delta)) > epsilon  # and it is tight


def test_k_releases_compose_like_one_release_with_sqrt_k_less_noise() -> None:
    z, delta = 7.0, 1e-5
    counts = np.array([1, 4, 25, 100])
    composed = composed_epsilon_gdp(counts, noise_multiplier=z, delta_total=delta)
    single = np.array([float(gdp_epsilon(1 / (z / math.sqrt(k)), delta)) for k in counts])
    np.testing.assert_allclose(composed, single, rtol=1e-12)
    np.testing.assert_allclose(gaussian_mu(counts, z), np.sqrt(counts) / z)
    assert np.all(np.diff(composed) > 0)


def test_epsilon_solves_the_delta_equation_and_is_never_below_the_root() -> None:
    mus = np.array([0.05, 0.3, 1.0, 2.0, 10.0])
    for delta in (1e-3, 1e-5, 1e-10):
        eps = gdp_epsilon(mus, delta)
        assert eps.shape == mus.shape
        achieved = gdp_delta(eps, mus)
        assert np.all(achieved <= delta * (1 + 1e-12))
        np.testing.assert_allclose(achieved, delta, rtol=1e-6)


def test_epsilon_within_the_zcdp_bound_and_zero_when_delta_covers_everything() -> None:
    mus = np.geomspace(0.01, 20, 30)
    delta = 1e-5
    eps = gdp_epsilon(mus, delta)
    # mu-GDP is (mu^2/2)-zCDP, and rho-zCDP gives eps <= rho + 2 sqrt(rho ln(1/delta))
    rho = mus**2 / 2
    assert np.all(eps <= rho + 2 * np.sqrt(rho * math.log(1 / delta)))
    assert float(gdp_epsilon(1e-6, delta)) == 0.0  # TV distance 4e-7 < delta
    np.testing.assert_array_equal(gdp_epsilon(np.zeros((2, 3)), delta), np.zeros((2, 3)))


@pytest.mark.parametrize(
    ("setting", "rdp_count", "gdp_count"),
    [
        (BUDGET_TABLE_SETTINGS[0], 20, 24),
        (BUDGET_TABLE_SETTINGS[1], 80, 94),
        (BUDGET_TABLE_SETTINGS[4], 78, 90),
        (BUDGET_TABLE_SETTINGS[5], 63, 71),
    ],
)
def test_readme_budget_table_under_exact_composition(setting, rdp_count, gdp_count) -> None:
    """The issue's numbers (checked there against dp-accounting's PLD accountant)."""
    eps_total, eps_step, delta_total, delta_step = setting
    z = analytic_gaussian_sigma(eps_step, delta_step, 1.0)
    assert affordable_aggregations(eps_total, eps_step, delta_total, delta_step, "rdp") == rdp_count
    k = affordable_aggregations_gdp(eps_total, delta_total, z)
    assert k == gdp_count
    spent = composed_epsilon_gdp(np.array([k, k + 1]), noise_multiplier=z, delta_total=delta_total)
    assert spent[0] <= eps_total < spent[1]


def test_gdp_never_affords_fewer_than_rdp_or_basic() -> None:
    for eps_total, eps_step, delta_total, delta_step in BUDGET_TABLE_SETTINGS:
        z = analytic_gaussian_sigma(eps_step, delta_step, 1.0)
        k = affordable_aggregations_gdp(eps_total, delta_total, z)
        rdp = affordable_aggregations(eps_total, eps_step, delta_total, delta_step, "rdp")
        assert k >= rdp >= math.floor(eps_total / eps_step + 1e-9)


def test_noise_multiplier_and_count_are_inverse() -> None:
    for eps_total, delta_total, k in [(1.0, 1e-5, 10), (0.1, 1e-6, 3), (8.0, 1e-5, 500)]:
        z = noise_multiplier_for_gdp(eps_total, delta_total, k)
        assert affordable_aggregations_gdp(eps_total, delta_total, z) == k
        spent = float(composed_epsilon_gdp(k, noise_multiplier=z, delta_total=delta_total))
        assert spent == pytest.approx(eps_total, rel=1e-8)
        assert spent <= eps_total * (1 + 1e-9)
        # a little less noise must not afford the same count
        assert affordable_aggregations_gdp(eps_total, delta_total, 0.999 * z) < k


def test_too_much_noise_needed_gives_zero() -> None:
    z = analytic_gaussian_sigma(1.0, 1e-6, 1.0)
    assert affordable_aggregations_gdp(0.5, 1e-6, z) == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: gdp_epsilon(1.0, 0.0),
        lambda: gdp_epsilon(-1.0, 1e-5),
        lambda: gdp_mu(0.0, 1e-5),
        lambda: gaussian_mu(np.array([1.5]), 1.0),
        lambda: gaussian_mu(3, 0.0),
        lambda: affordable_aggregations_gdp(1.0, 1.0, 2.0),
        lambda: noise_multiplier_for_gdp(1.0, 1e-5, 0),
        lambda: gdp_delta(1.0, 0.0),
    ],
)
def test_bad_inputs_raise_config_error(call) -> None:
    with pytest.raises(ConfigError):
        call()


def test_agrees_with_dp_accounting_pld() -> None:
    """Cross-check with Google's PLD accountant (optional extra ``dp``)."""
    dp_accounting = pytest.importorskip(
        "dp_accounting",
        reason="optional cross-check: install the 'dp' extra (pip install -e .[dp])",
    )
    from dp_accounting.pld import pld_privacy_accountant

    cases = [(36.30469042619556, 94, 1e-5), (4.224678889327428, 71, 1e-5), (2.0, 5, 1e-6)]
    for z, k, delta in cases:
        accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        accountant.compose(dp_accounting.GaussianDpEvent(z), count=k)
        pld_epsilon = accountant.get_epsilon(delta)
        ours = float(composed_epsilon_gdp(k, noise_multiplier=z, delta_total=delta))
        # the PLD accountant discretises pessimistically: it may only be slightly above the exact
        assert ours <= pld_epsilon + 1e-6
        assert pld_epsilon == pytest.approx(ours, abs=1e-4)


def brentq_epsilon(mu: float, delta: float) -> float:
    """The conversion before the vectorised solve: one ``brentq`` on ``log delta`` for one
    ``mu``, stepped up until the log-space constraint holds (the reference it must match)."""
    log_delta = math.log(delta)
    if mu == 0 or _log_delta(np.float64(0.0), np.float64(mu)) <= log_delta:
        return 0.0

    def excess(epsilon: float) -> float:
        return float(_log_delta(np.float64(epsilon), np.float64(mu))) - log_delta

    high = max(mu * mu / 2.0 - mu * float(ndtri(delta)), 1e-12)
    while excess(high) > 0:
        high *= 2.0
    root = brentq(excess, 0.0, high, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    while excess(root) > 0:
        root += 1e-14 * max(1.0, root)
    return root


#: Deltas of the grids below, from nearly no guarantee to far beyond any used.
GRID_DELTAS = (0.9, 0.5, 1e-2, 1e-5, 1e-10, 1e-30, 1e-100)


@pytest.mark.parametrize("delta", GRID_DELTAS)
def test_vectorised_epsilon_agrees_with_brentq_on_a_random_grid(delta: float) -> None:
    """1e-9 relative from mu = 1e-3 (network DP's pairs), 1e-5 from 1e-7 (where the log-space
    delta's rounding dominates and the rounding margin puts the value above brentq's, itself
    below the exact root there: the mpmath test); never below brentq's beyond its own absolute
    step (1e-14); extremes: 0 stays 0, tiny and the largest mu stay finite upper bounds."""
    rng = np.random.default_rng(7)
    mu = np.concatenate([np.exp(rng.uniform(math.log(1e-7), math.log(1e6), 1500)), [MAX_MU]])
    ours = gdp_epsilon(mu, delta)
    reference = np.array([brentq_epsilon(float(m), delta) for m in mu])
    np.testing.assert_array_equal(ours == 0, reference == 0)
    assert np.all(ours >= reference * (1 - 1e-12) - 2e-14)
    moderate = mu >= 1e-3
    np.testing.assert_allclose(ours[moderate], reference[moderate], rtol=1e-9, atol=2e-14)
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=2e-14)
    assert np.all(gdp_delta(ours, mu) <= delta)  # the constraint at every value returned
    extremes = np.array([0.0, 5e-324, 1e-300, 1e-12])
    tiny = gdp_epsilon(extremes, delta)
    assert tiny[0] == 0.0 and np.all(np.isfinite(tiny)) and np.all(tiny < 1e-8)
    assert np.all(gdp_delta(np.maximum(tiny, 1e-300), np.maximum(extremes, 1e-300)) <= delta)


def mp_delta(epsilon: float, mu: float, mp) -> object:
    """delta(epsilon) of mu-GDP in 60-digit arithmetic (the closed form, no cancellation)."""
    epsilon, mu = mp.mpf(epsilon), mp.mpf(mu)
    a = -epsilon / mu + mu / 2
    return mp.ncdf(a) - mp.exp(epsilon) * mp.ncdf(a - mu)


@pytest.mark.parametrize(
    ("mu", "delta", "tightness"),
    [
        (1e-7, 1e-50, 1e-5),  # log-space rounding: brentq's value is 2e-9 below the root here
        (1e-7, 1e-20, 1e-5),
        (3.16e-5, 1e-5, 1e-7),  # just above the total-variation threshold
        (2.58e-5, 1e-5, 1e-7),
        (0.0056, 1e-3, 1e-9),
        (0.05, 1e-5, 1e-9),
        (0.7, 1e-5, 1e-9),
        (1.0, 1e-10, 1e-9),
        (30.0, 1e-5, 1e-9),
        (1e3, 1e-8, 1e-9),
        (1e5, 1e-5, 1e-9),
    ],
)
def test_epsilon_is_an_upper_bound_on_the_exact_root(mu: float, delta: float, tightness) -> None:
    """Independent check in high precision (mpmath): delta(epsilon) <= delta at the value
    returned (it is not below the exact root), and delta(epsilon (1 - tightness)) > delta."""
    import mpmath  # installed with dp-accounting, a dependency: never skipped

    with mpmath.workdps(60):
        epsilon = float(gdp_epsilon(mu, delta))
        assert mp_delta(epsilon, mu, mpmath) <= delta
        assert mp_delta(epsilon * (1 - tightness), mu, mpmath) > delta


def test_epsilon_agrees_with_dp_accounting_gaussian_privacy_loss() -> None:
    """Google's dp-accounting (optional extra ``dp``) evaluates the Gaussian's delta(epsilon)
    its own way (N(0, 1/mu^2) against N(1, 1/mu^2)): our epsilon satisfies it, and 1e-6 less
    does not."""
    pytest.importorskip(
        "dp_accounting",
        reason="optional cross-check: install the 'dp' extra (pip install -e .[dp])",
    )
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    for delta in (1e-3, 1e-5, 1e-8):
        for mu in (0.01, 0.1, 0.5, 1.0, 3.0, 20.0):
            loss = GaussianPrivacyLoss(standard_deviation=1 / mu, sensitivity=1.0)
            epsilon = float(gdp_epsilon(mu, delta))
            assert loss.get_delta_for_epsilon(epsilon) <= delta * (1 + 1e-9), (mu, delta)
            assert loss.get_delta_for_epsilon(epsilon * (1 - 1e-6)) > delta, (mu, delta)
