"""Wiring of the noise-aware ensemble rules and the best-lambda reference into the engine.

Each rule selected with ``evaluation.vote`` is run through
:func:`p2pdp.experiments.run.simulation.simulate`;
the per-peer errors it reports must equal those of :func:`p2pdp.learning.ensembles.apply_rule`
applied here, independently, to the releases the world actually published (read by an
observer) and the public noise scale the mechanism states for each release's sensitivity.
A task that passed the wrong noise scales, the wrong shards or lambda, or scored the seed's
rule instead, fails them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from p2pdp.core.errors import ConfigError
from p2pdp.core.rng import generator
from p2pdp.experiments.run.simulation import simulate
from p2pdp.learning.ensembles import OwnShards, PublicView, apply_rule, cross_validate_own_models
from p2pdp.learning.evaluation import evaluate_ensembles
from p2pdp.learning.references import centralised_best_lambda
from p2pdp.learning.rules import LocalValidatedRule, build_ensembles
from p2pdp.privacy.mechanisms import make_mechanism
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GroupsConfig
from p2pdp.sim.world import WorldObserver
from p2pdp.tasks.pipeline import prepare_peers
from tests.conftest import tiny_config

LAM = 0.05


class Capture(WorldObserver):
    def __init__(self) -> None:
        self.records: list = []
        self.world = None

    def released(self, world, group, record) -> None:
        self.world = world
        self.records.append(record)


def _config(vote: str, mode: str = "full", mechanism: str = "gaussian", **evaluation):
    gaussian = mechanism == "gaussian"
    return tiny_config(
        seed=5,
        data={"synthetic_rows": 700, "synthetic_test_rows": 300, "synthetic_features": 6},
        partition={"n_peers": 30},
        training={"lam": LAM},
        privacy={
            "mechanism": mechanism,
            "epsilon": 5.0,
            "epsilon_per_aggregation": 1.0,
            **({"delta": 1e-5, "delta_per_aggregation": 1e-6} if gaussian else {}),
        },
        groups={"group_size": 5},
        publication={"mode": mode},
        evaluation={"cv_folds": 5, "folds": (0,), "vote": vote, **evaluation},
    )


def _run(config):
    trained = prepare_peers(config, fold=0, repetition=0)
    capture = Capture()
    result = simulate(config, trained=trained, observers=(capture,))
    return result, capture, trained


def _view_from_world(capture, trained, config) -> PublicView:
    world = capture.world
    privacy = config.privacy
    delta = privacy.delta_per_aggregation if privacy.mechanism == "gaussian" else None
    mech = make_mechanism(privacy.mechanism, epsilon=privacy.step_epsilon, delta=delta)
    dim = trained.models.weights.shape[1]
    noise_std = np.array([mech.noise_std(r.sensitivity, dim) for r in capture.records])
    pairs = np.array(world.receipts, dtype=np.int64).reshape(-1, 2)
    n_peers, n_models = trained.models.weights.shape[0], len(world.published)
    receipts = sp.csr_matrix(
        (np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n_peers, n_models)
    )
    return PublicView(
        own_weights=trained.models.weights,
        published=np.array(world.published),
        noise_std=noise_std,
        shared=np.array(world.shared, dtype=bool),
        receipts=receipts,
    )


def _naive_errors(predictors, X, y) -> np.ndarray:
    scores = predictors.scores(X)
    return (np.where(scores >= 0, 1, -1) != y[:, None]).mean(axis=0)


#: engine name -> the name in p2pdp.learning.ensembles (the engine's "majority" is the seed's rule)
RULES = {"average": "average", "local-validated": "local-validated", "majority-own": "majority"}


@pytest.mark.parametrize("mode", ["full", "group"])
@pytest.mark.parametrize("vote", sorted(RULES))
def test_each_wired_rule_equals_apply_rule_on_the_same_releases(vote, mode):
    config = _config(vote, mode)
    result, capture, trained = _run(config)
    assert result.aggregations > 5
    view = _view_from_world(capture, trained, config)
    fold = trained.fold
    own = OwnShards(X=fold.X_train, y=fold.y_train, shards=trained.shards, lam=LAM)
    cv = None
    if vote == "local-validated":
        cv = cross_validate_own_models(own, rng=generator(config.seed, "own-cv", 0, 0))
    expected = _naive_errors(apply_rule(RULES[vote], view, own, cv=cv), fold.X_test, fold.y_test)
    errors = result.evaluation.metrics.errors
    np.testing.assert_allclose(errors, expected, atol=1.5 / len(fold.y_test))
    assert np.mean(errors != expected) <= 0.05  # at most a rounding flip on a few peers
    assert result.row()["evaluation.vote"] == vote


def test_noise_aware_rules_differ_from_the_seed_rule_on_noisy_releases():
    # sanity of the comparison above: the rules are not all the same predictor
    errors = {}
    for vote in ("majority", "average", "local-validated"):
        config = dataclasses.replace(
            _config(vote, mechanism="vector-laplace"),
            privacy=PrivacyConfig(epsilon=1.0, epsilon_per_aggregation=0.2),
        )
        errors[vote] = simulate(config).evaluation.metrics.errors
    assert not np.array_equal(errors["majority"], errors["average"])
    local = simulate(_config("majority", mechanism="vector-laplace")).evaluation.local_only_errors
    # never hurts (in the mean) on this small case: within 0.02 of the own models
    assert errors["local-validated"].mean() <= local.mean() + 0.02


def test_local_validated_refits_once_per_training_key():
    config = _config("local-validated")
    trained = prepare_peers(config, fold=0, repetition=0)
    simulate(config, trained=trained)
    first = trained.cache["peer_data"]
    other = dataclasses.replace(config, groups=GroupsConfig(group_size=10))
    simulate(other, trained=trained)
    assert trained.cache["peer_data"] is first  # reused, not refitted


def test_local_validated_without_own_data_is_refused():
    config = _config("local-validated")
    trained = prepare_peers(config, fold=0, repetition=0)
    empty = np.zeros((0, trained.models.weights.shape[1]))
    ensembles = build_ensembles(
        trained.models.weights, empty, np.zeros(0, bool), np.zeros(0, int), np.zeros(0, int)
    )
    with pytest.raises(ConfigError, match="own shard"):
        evaluate_ensembles(
            ensembles, trained.fold.X_test, trained.fold.y_test, vote="local-validated"
        )
    assert LocalValidatedRule.needs_own_data


def test_best_lambda_reference_is_opt_in_and_uses_the_training_fold_only():
    plain = simulate(_config("majority")).row()
    assert "centralized_best_lambda_error" not in plain
    config = _config("majority", best_lambda_reference=True)
    result, _, trained = _run(config)
    row = result.row()
    fold = trained.fold
    reference = centralised_best_lambda(
        fold.X_train, fold.y_train, cv_folds=5, rng=generator(config.seed, "best-lambda", 0, 0)
    )
    test_error = np.mean(np.where(fold.X_test @ reference.weights >= 0, 1, -1) != fold.y_test)
    assert row["centralized_best_lambda"] == reference.lam
    assert row["centralized_best_lambda_error"] == pytest.approx(test_error)
    assert row["centralized_error"] == plain["centralized_error"]


def test_privacy_config_takes_one_of_epsilon_per_aggregation_and_noise_multiplier():
    gaussian = {"mechanism": "gaussian", "delta": 1e-5, "delta_per_aggregation": 1e-6}
    with pytest.raises(ConfigError, match="only one of"):
        PrivacyConfig(epsilon_per_aggregation=0.1, noise_multiplier=5.0, **gaussian)
    with pytest.raises(ConfigError, match="noise_multiplier must be > 0"):
        PrivacyConfig(noise_multiplier=-1.0, **gaussian)
    assert PrivacyConfig().step_epsilon == 0.1  # neither: the old default
    fixed = PrivacyConfig(noise_multiplier=5.0, **gaussian)
    z = make_mechanism("gaussian", epsilon=fixed.step_epsilon, delta=1e-6).noise_multiplier
    assert z == pytest.approx(5.0, rel=1e-9)  # the recorded epsilon_A calibrates back to z
    assert fixed.resolved_accountant == "gdp" and PrivacyConfig().resolved_accountant == "basic"
    assert PrivacyConfig(accountant="rdp", **gaussian).resolved_accountant == "rdp"
