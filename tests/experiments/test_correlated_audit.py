"""End-to-end audit of D-PSGD's correlated noise per threat model
(p2pdp.experiments.audit.correlated): the adversary's noise model against the real run's
messages, the claim against its target, and the rows' outcomes (controls caught)."""

from __future__ import annotations

import numpy as np
import pytest

from p2pdp.experiments.audit import correlated as ca
from p2pdp.privacy.gdp import gdp_epsilon
from p2pdp.protocols import correlated_dp


def _setup(name: str):
    """What :func:`ca.audit_correlated` builds before its runs, for ``name``."""
    threat, control = ca.parse_name(name)
    observers = ca.THREATS[threat]
    mixing = ca.line_mixing(ca.CORRELATED_PEERS, ring=True)
    sizes = np.full(ca.CORRELATED_PEERS, ca.AUDIT_RECORDS + ca.AUDIT_CANARIES)
    unit = ca._linear_map(1.0, ca.CORRELATED_PAIR_RATIO, sizes, mixing)
    z = correlated_dp.calibrated_noise_multiplier(
        float(unit.kappa(observers, np.array([0]))[0]),
        epsilon=ca.CORRELATED_TARGET_EPSILON, delta=1e-5, sensitivity_over_clip=2.0,
    )  # fmt: skip
    run = ca._linear_map(z, ca.CORRELATED_PAIR_RATIO, sizes, mixing)
    model = ca._adversary_model(run, observers, control, z, sizes, mixing)
    return control, observers, z, run, model


@pytest.mark.parametrize("name", ca.CORRELATED_AUDIT_NAMES)
def test_the_adversarys_noise_model_reproduces_the_real_runs_messages(name) -> None:
    """With every noise value recorded from the run's own draws, the adversary's model (the
    claimed one, or the control's real one: reused, weighted pair noise) leaves exactly the
    canaries' data term ``-S_k d``: the columns, their order and scale are those the code
    drew. A control whose flaw the code did not commit (or an honest run under a control's
    model) leaves noise behind."""
    control, observers, z, run, model = _setup(name)
    protocol = {**ca.CORRELATED_SCENARIO["protocol"], "noise_multiplier": z,
                "pairwise_noise_multiplier": ca.CORRELATED_PAIR_RATIO * z}  # fmt: skip
    config = ca.ScenarioConfig(**{**ca.CORRELATED_SCENARIO, "protocol": protocol})
    labels, observed, values = ca.correlated_run(
        config, run, observers, control=control, seed=5, name=name, run_index=0
    )
    expected = -np.outer(model.D.sum(axis=1), labels)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(observed - model.R @ values, expected, atol=1e-9 * scale)
    if control in ("reused-pairs", "weighted-pairs"):  # the honest run does not fit this model
        _, honest, honest_values = ca.correlated_run(
            config, run, observers, control=None, seed=5, name=name, run_index=0
        )
        claimed = run.view(observers)[0]
        assert np.abs(honest - claimed @ honest_values - expected).max() < 1e-9 * scale
        assert model.R.shape != claimed.shape or not np.allclose(model.R, claimed)


@pytest.mark.parametrize("name", ca.CORRELATED_AUDIT_NAMES)
def test_the_claim_is_the_target_and_a_constant_shift_is_its_worst_case(name) -> None:
    """The calibrated claim is the target epsilon (recomputed from kappa by the GDP formula);
    honest, the canaries' constant shift attains it (so the audit can come close); under each
    control the real guarantee against the same adversary is far above the claim."""
    control, _, _, _, model = _setup(name)
    A = model.R[:, ~model.known]
    d = model.D.sum(axis=1)
    constant = float(d @ np.linalg.pinv(A @ A.T, hermitian=True) @ d)
    real = float(gdp_epsilon(2.0 * np.sqrt(model.kappa), 1e-5))
    if control is None:
        assert real == pytest.approx(ca.CORRELATED_TARGET_EPSILON, rel=1e-6)
        assert real <= ca.CORRELATED_TARGET_EPSILON * (1 + 1e-9)
        assert constant == pytest.approx(model.kappa, rel=1e-4)
    else:
        assert float(gdp_epsilon(2.0 * np.sqrt(constant), 1e-5)) > 3 * ca.CORRELATED_TARGET_EPSILON


def test_an_honest_curious_row_passes_and_a_leaked_secret_is_caught() -> None:
    """Fast: 20 runs (10,000 canaries)."""
    honest = ca.audit_correlated("dpsgd-correlated-curious", seed=1, runs=20)
    leaked = ca.audit_correlated("dpsgd-correlated-curious-leaked-secret", seed=1, runs=20)
    assert honest.epsilon == pytest.approx(ca.CORRELATED_TARGET_EPSILON, rel=1e-6)
    assert honest.passed and honest.as_expected
    assert not leaked.passed and leaked.as_expected
    assert leaked.guarantee_epsilon > 3 * leaked.epsilon


@pytest.mark.slow
def test_every_correlated_audit_row_is_as_expected() -> None:
    results = ca.run_correlated_audit(seed=2)
    assert [r.mechanism for r in results] == list(ca.CORRELATED_AUDIT_NAMES)
    for result in results:
        assert result.as_expected, result
        assert 0 < result.eps_lb


def test_the_cli_runs_a_correlated_row_and_names_its_control(capsys) -> None:
    from p2pdp.experiments.cli import main

    assert main(["audit", "--mechanism", "dpsgd-correlated-curious-leaked-secret",
                 "--runs", "20"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "expected: fail (peer 0 leaks an edge secret to the curious peer)" in out
