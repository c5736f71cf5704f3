"""Wiring: config -> noise actually released -> budget actually charged, on real simulated groups.

These tests read what the world released (the published vectors minus the exact mean of the
members' models) and compare it with what the mechanism promises at the sensitivity computed
here, independently, from each group's members. A world whose noise ignored the sensitivity,
a curator that hard-coded the sensitivity mode, or a ledger built with another accountant
fails them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from p2pdp.core.errors import ConfigError
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.models import GRADIENT_TOLERANCE
from p2pdp.privacy.accounting import affordable_aggregations
from p2pdp.privacy.gdp import gdp_mu
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.sim.world import WorldObserver
from tests.conftest import tiny_config

LAM = 0.05
GROUP = 4


class Capture(WorldObserver):
    """Every release with the members it came from."""

    def __init__(self) -> None:
        self.members: list[np.ndarray] = []
        self.records: list = []
        self.world = None

    def released(self, world, group, record) -> None:
        self.world = world
        self.members.append(group.members.copy())
        self.records.append(record)


def _config(mechanism: str, mode: str, secure: bool, accountant: str = "basic", **privacy):
    gaussian = mechanism == "gaussian"
    return tiny_config(
        seed=11,
        data={"synthetic_rows": 900, "synthetic_test_rows": 100, "synthetic_features": 6},
        partition={"n_peers": 40},
        training={"lam": LAM},
        privacy={
            "mechanism": mechanism,
            "sensitivity": mode,
            "secure_aggregation": secure,
            "accountant": accountant,
            "epsilon": 2.0,
            "epsilon_per_aggregation": 0.1,
            **({"delta": 1e-5, "delta_per_aggregation": 1e-7} if gaussian else {}),
            **privacy,
        },
        groups={"group_size": GROUP},
        evaluation={"cv_folds": 5, "folds": (0,)},
    )


def _released_noise(config):
    capture = Capture()
    result = simulate(config, observers=(capture,))
    world = capture.world
    published = np.array(world.published)
    exact = np.array([world.statistics[m].mean(axis=0) for m in capture.members])
    sizes = [world.shard_sizes[m] for m in capture.members]
    # The sensitivity of each group, computed here from its members' shard sizes.
    pathak = np.array([2.0 * (1.0 / s.min() + GRADIENT_TOLERANCE) / LAM for s in sizes])
    expected = pathak if config.privacy.sensitivity == "pathak" else pathak / GROUP
    return result, capture, published - exact, expected


CASES = [
    (mechanism, mode, secure)
    for mechanism in ("vector-laplace", "coordinate-laplace", "gaussian", "seed-laplace")
    for mode in ("group-mean", "pathak")
    for secure in (False, True)
    if not (secure and mechanism == "vector-laplace")
]


@pytest.mark.parametrize(("mechanism", "mode", "secure"), CASES)
def test_released_noise_has_the_promised_scale_at_the_groups_sensitivity(mechanism, mode, secure):
    config = _config(mechanism, mode, secure)
    _, capture, noise, sensitivity = _released_noise(config)
    n, dim = noise.shape
    assert n >= 150  # enough releases for the statistics below
    recorded = np.array([record.sensitivity for record in capture.records])
    np.testing.assert_allclose(recorded, sensitivity, rtol=1e-12)
    privacy = config.privacy
    delta = privacy.delta_per_aggregation if mechanism == "gaussian" else None
    mech = make_mechanism(mechanism, epsilon=privacy.epsilon_per_aggregation, delta=delta)
    scale = np.array([mech.noise_scale(s, dim) for s in sensitivity])[:, None]
    std = np.array([mech.noise_std(s, dim) for s in sensitivity])[:, None]
    if secure:
        # a sum of K shares of a (K-1)-way split: variance K/(K-1) times the mechanism's
        ratio = float(np.mean((noise / std) ** 2))
        assert ratio == pytest.approx(GROUP / (GROUP - 1), rel=0.25)
        recorded_std = np.array([record.noise_std for record in capture.records])
        np.testing.assert_allclose(recorded_std, std[:, 0] * math.sqrt(GROUP / (GROUP - 1)))
        return
    if mechanism == "vector-laplace":  # ||eta|| ~ Gamma(d, Delta/eps), direction uniform
        norms = np.linalg.norm(noise, axis=1) / scale[:, 0]
        assert stats.kstest(norms, stats.gamma(dim).cdf).pvalue > 1e-3
        assert np.mean(norms) == pytest.approx(dim, rel=0.1)  # mean d * Delta / eps
    elif mechanism == "gaussian":
        assert stats.kstest((noise / scale).ravel(), stats.norm.cdf).pvalue > 1e-3
    else:  # coordinate and seed Laplace: iid Laplace(scale) per coordinate
        assert stats.kstest((noise / scale).ravel(), stats.laplace.cdf).pvalue > 1e-3
    recorded_norm = np.array([record.noise_norm for record in capture.records])
    np.testing.assert_allclose(recorded_norm, np.linalg.norm(noise, axis=1), rtol=1e-9)


def test_every_release_row_states_the_group_sensitivity_and_the_guarantee():
    config = _config("vector-laplace", "group-mean", False)
    result = simulate(config)
    assert len(result.releases) == result.aggregations > 0
    for row in result.releases:
        bound = 2 * (1 / row["n_min"] + GRADIENT_TOLERANCE) / (row["group_size"] * LAM)
        assert row["sensitivity"] == pytest.approx(bound, rel=1e-12)
        assert row["epsilon"] == 0.1 and row["delta"] == 0.0
        assert row["noise_scale"] == pytest.approx(row["sensitivity"] / 0.1)


def test_gdp_ledger_affords_more_than_rdp_than_basic_in_the_world():
    common = {"epsilon": 1.0, "epsilon_per_aggregation": 0.1}
    gaussian = {"delta": 1e-5, "delta_per_aggregation": 1e-6}
    counts, rows = {}, {}
    for accountant in ("basic", "rdp", "gdp", "auto"):
        config = _config("gaussian", "group-mean", False, accountant, **common, **gaussian)
        result = simulate(config)
        counts[accountant] = int(result.aggregations_per_peer.max())
        rows[accountant] = result.row()
        assert float(result.epsilon_spent.max()) <= 1.0 + 1e-9
    rdp = affordable_aggregations(1.0, 0.1, 1e-5, 1e-6, "rdp")
    assert counts["basic"] == 10
    assert counts["rdp"] == rdp > 2 * counts["basic"]
    # exact composition: k releases at noise multiplier z are sqrt(k)/z-GDP
    z = make_mechanism("gaussian", epsilon=0.1, delta=1e-6).noise_multiplier
    mu_budget = gdp_mu(1.0, 1e-5)
    assert counts["gdp"] == math.floor((mu_budget * z) ** 2) > counts["rdp"]
    # the default for gaussian is gdp, and rows record the resolved accountant
    assert counts["auto"] == counts["gdp"]
    assert rows["auto"]["privacy.accountant"] == "gdp"
    assert rows["basic"]["privacy.accountant"] == "basic"
    assert rows["gdp"]["affordable_aggregations"] == counts["gdp"]


def test_noise_multiplier_fixes_the_noise_and_the_budget_gives_the_count():
    z = 20.0
    config = _config(
        "gaussian", "group-mean", False, "auto",
        epsilon=1.0, epsilon_per_aggregation=None, noise_multiplier=z,
        delta=1e-5, delta_per_aggregation=1e-6,
    )  # fmt: skip
    capture = Capture()
    result = simulate(config, observers=(capture,))
    # every release carries sigma = z * its sensitivity
    for record in capture.records:
        assert record.noise_std == pytest.approx(z * record.sensitivity, rel=1e-9)
    expected = math.floor((gdp_mu(1.0, 1e-5) * z) ** 2)
    assert result.row()["affordable_aggregations"] == expected
    assert int(result.aggregations_per_peer.max()) == expected
    assert float(result.epsilon_spent.max()) <= 1.0 + 1e-9


def test_vector_laplace_defaults_to_basic_and_refuses_gdp():
    result = simulate(_config("vector-laplace", "group-mean", False, "auto", epsilon=1.0))
    assert result.row()["privacy.accountant"] == "basic"
    assert int(result.aggregations_per_peer.max()) == 10
    with pytest.raises(ConfigError, match="gdp"):
        _config("vector-laplace", "group-mean", False, "gdp")
    with pytest.raises(ConfigError, match="noise_multiplier"):
        _config("vector-laplace", "group-mean", False, noise_multiplier=3.0)


def test_seed_laplace_and_none_report_their_real_guarantee():
    seed = simulate(_config("seed-laplace", "group-mean", False))
    dim = 7  # six features and the bias
    assert seed.guarantee_per_aggregation[0] == pytest.approx(math.sqrt(dim) * 0.1)
    spent = seed.epsilon_spent.max()
    assert spent == pytest.approx(2.0)  # the nominal schedule: 20 aggregations of 0.1
    assert seed.guaranteed_epsilon.max() == pytest.approx(math.sqrt(dim) * spent)
    none = simulate(_config("none", "group-mean", False))
    assert none.guarantee_per_aggregation[0] == math.inf
    assert math.isinf(none.guaranteed_epsilon.max())
    assert none.row()["max_guaranteed_epsilon"] == math.inf
