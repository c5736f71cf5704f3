"""The central-DP reference: a trusted curator's DP-SGD on the pooled rows at the run's budget.

The curator's steps are recomputed here by a plain loop (clip, sum, Gaussian noise, pooled
divisor), and its epsilon by the Gaussian mechanism's closed form, independently of
:func:`p2pdp.protocols.iterative.central_dp_reference`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from p2pdp.config import ScenarioConfig
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.local_problem import LocalProblem
from p2pdp.privacy.gdp import gdp_epsilon
from p2pdp.protocols.iterative import central_dp_reference, step_privacy
from tests.conftest import tiny_config


def _config(min_shard_size: int | None = None, **protocol) -> ScenarioConfig:
    settings = {"name": "dpsgd", "rounds": 4, "step_size": 0.7}
    return tiny_config(
        partition={"n_peers": 14, "scheme": "quantity_skew"},
        training={"lam": 0.01},
        privacy={
            "mechanism": "gaussian",
            "epsilon": 3.0,
            "delta": 1e-5,
            "min_shard_size": min_shard_size,
        },
        gossip={"degree": 3},
        evaluation={"cv_folds": 2},
        protocol={**settings, **protocol},
    )


def _loop(X, y, *, lam, eta, steps, z, C, sampling, q, divisor, seed) -> np.ndarray:
    """DP-SGD written out: per-record logistic gradients clipped to C, summed over the
    sampled rows, plus N(0, (z C)^2), over the pooled divisor."""
    rng = np.random.default_rng(seed)
    w = np.zeros(X.shape[1])
    for _ in range(steps):
        chosen = rng.random(len(y)) < q if sampling == "poisson" else np.ones(len(y), bool)
        grads = (-y / (1.0 + np.exp(y * (X @ w))))[:, None] * X
        norms = np.linalg.norm(grads, axis=1)
        grads *= np.minimum(1.0, C / np.maximum(norms, 1e-300))[:, None]
        noisy = grads[chosen].sum(axis=0) + rng.normal(0.0, z * C, size=X.shape[1])
        w = w - eta * (noisy / divisor + lam * w)
    return w


@pytest.mark.parametrize("sampling", ["full", "poisson"])
def test_the_curator_runs_dp_sgd_on_the_pooled_rows_with_the_peers_mechanism(sampling) -> None:
    extra = {"sampling": "poisson", "sampling_rate": 0.5} if sampling == "poisson" else {}
    config = _config(min_shard_size=2 if extra else None, **extra)
    privacy = step_privacy(config)
    rng = np.random.default_rng(3)
    sizes = np.array([5, 3, 7, 4])
    X = rng.normal(size=(sizes.sum(), 4)) / 2
    y = np.where(rng.random(sizes.sum()) < 0.5, -1.0, 1.0)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    shards = tuple(np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes)))
    problem = LocalProblem.from_shards(X, y, shards, lam=0.01)
    model, epsilon = central_dp_reference(
        problem, config.protocol, privacy, rng=np.random.default_rng(11)
    )
    mechanism = privacy.mechanism
    # the pooled divisor: N for full sampling; q * P * min_shard_size under add/remove
    divisor = len(y) if sampling == "full" else 0.5 * len(sizes) * 2
    expected = _loop(
        problem.X, problem.y, lam=0.01, eta=0.7, steps=4, z=mechanism.noise_multiplier,
        C=mechanism.clip_norm, sampling=sampling, q=0.5, divisor=divisor, seed=11,
    )  # fmt: skip
    np.testing.assert_allclose(model, expected, rtol=1e-10, atol=1e-12)
    assert epsilon == pytest.approx(float(privacy.epsilon(np.array([4]))[0]), rel=1e-12)
    assert epsilon <= 3.0 + 1e-9


def test_rows_report_the_curators_error_at_the_runs_epsilon_and_relation() -> None:
    """Config -> run -> columns: the curator's epsilon is the Gaussian mechanism's over the
    run's rounds (replace-one, sensitivity 2 C) at the noise the row reports, and equals the
    peers' local DP; its error is a test error; non-private steps leave the columns NaN."""
    row = simulate(_config(noise_multiplier=6.0)).row()
    mu = math.sqrt(4) * 2.0 / row["noise_multiplier_used"]
    assert row["neighbouring_relation"] == "replace-one"
    assert row["central_dp_epsilon"] == pytest.approx(float(gdp_epsilon(mu, 1e-5)), rel=1e-9)
    assert row["central_dp_epsilon"] == pytest.approx(row["max_epsilon_spent"], rel=1e-12)
    assert row["mean_steps_per_peer"] == 4 and 0.0 <= row["central_dp_error"] <= 1.0
    # a noisier curator (same seed, so the same draws, scaled) ends elsewhere
    noisier = simulate(_config(noise_multiplier=300.0)).row()
    assert noisier["central_dp_epsilon"] < row["central_dp_epsilon"] / 50
    calibrated = simulate(_config()).row()
    assert calibrated["central_dp_epsilon"] == pytest.approx(3.0, rel=1e-4)
    assert calibrated["central_dp_epsilon"] <= 3.0 + 1e-9
    base = _config()
    plain = dataclasses.replace(
        base, privacy=dataclasses.replace(base.privacy, mechanism="none", delta=0.0)
    )
    none = simulate(plain).row()
    assert math.isnan(none["central_dp_error"]) and math.isnan(none["central_dp_epsilon"])


def test_the_comparison_figure_draws_the_curator_where_iterative_rows_have_it(
    monkeypatch, tmp_path
) -> None:
    from p2pdp.experiments.report import protocols as protocol_report

    base = {"mean_error": 0.3, "local_only_error": 0.4, "centralized_error": 0.1, "fold": 0}
    rows = [
        {**base, "protocol.name": name, "privacy.epsilon": eps, "central_dp_error": central}
        for name, eps, central in (
            ("dpsgd", 1.0, 0.2), ("dpsgd", 2.0, 0.15),
            ("one-shot", 1.0, math.nan), ("one-shot", 2.0, math.nan),
        )
    ]  # fmt: skip
    _, table = protocol_report.tuned_comparison(rows, ["privacy.epsilon", "protocol.name"])
    drawn = {}
    monkeypatch.setattr(protocol_report, "write_figure", lambda f, p: drawn.setdefault("f", f))
    protocol_report.comparison_figure(table, tmp_path / "f.png")
    (line,) = [
        line for line in drawn["f"].axes[0].get_lines() if line.get_label().startswith("central DP")
    ]
    np.testing.assert_allclose(line.get_xdata(), [1.0, 2.0])
    np.testing.assert_allclose(line.get_ydata(), [0.2, 0.15])


def test_the_comparison_draws_one_line_per_compared_protocol_setting(monkeypatch, tmp_path):
    """Two D-PSGD variants (local DP, calibrated to a curious peer) are two lines, each
    through its own errors, not one line through both."""
    from p2pdp.experiments.report import protocols as protocol_report

    rows = [
        {"protocol.name": "dpsgd", "protocol.threat_model": threat, "privacy.epsilon": eps,
         "mean_error": error, "fold": 0, "central_dp_error": 0.1}
        for threat, eps, error in (
            ("local", 1.0, 0.3), ("local", 2.0, 0.25),
            ("curious-peer", 1.0, 0.2), ("curious-peer", 2.0, 0.15),
        )
    ]  # fmt: skip
    swept = ["privacy.epsilon", "protocol.name", "protocol.threat_model"]
    _, table = protocol_report.tuned_comparison(rows, swept)
    drawn = {}
    monkeypatch.setattr(protocol_report, "write_figure", lambda f, p: drawn.setdefault("f", f))
    protocol_report.comparison_figure(table, tmp_path / "f.png")
    lines = {line.get_label(): line for line in drawn["f"].axes[0].get_lines()}
    np.testing.assert_allclose(lines["dpsgd, threat_model = local"].get_ydata(), [0.3, 0.25])
    np.testing.assert_allclose(lines["dpsgd, threat_model = curious-peer"].get_ydata(), [0.2, 0.15])
