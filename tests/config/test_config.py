"""Config dataclasses: validation names the key and the value."""

from __future__ import annotations

import dataclasses
import math

import pytest

from p2pdp.config import NetworkConfig, ScenarioConfig, flat_settings, with_value
from p2pdp.core.errors import ConfigError
from p2pdp.data.settings import DataConfig, PartitionConfig
from p2pdp.learning.settings import EvaluationConfig, TrainingConfig
from p2pdp.privacy.settings import PrivacyConfig
from p2pdp.protocols.settings import GroupsConfig, PublicationConfig


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (PrivacyConfig, {"epsilon": -1.0}, "privacy.epsilon must be > 0 and finite, got -1.0"),
        (PrivacyConfig, {"epsilon": math.nan}, "privacy.epsilon"),
        (PrivacyConfig, {"epsilon": math.inf}, "privacy.epsilon"),
        (
            PrivacyConfig,
            {"epsilon": 1.0, "epsilon_per_aggregation": 2.0},
            "epsilon_per_aggregation",
        ),
        (PrivacyConfig, {"mechanism": "laplace"}, "privacy.mechanism must be one of"),
        (PrivacyConfig, {"mechanism": "gaussian", "delta": 0.0}, "privacy.delta"),
        (
            PrivacyConfig,
            {"mechanism": "gaussian", "delta": 1e-5, "delta_per_aggregation": 1e-4},
            "delta_per_aggregation",
        ),
        (PrivacyConfig, {"accountant": "rdp"}, "needs privacy.mechanism = 'gaussian'"),
        # the mechanism is the real reason, named before the missing delta_per_aggregation
        (
            PrivacyConfig,
            {"mechanism": "vector-laplace", "noise_multiplier": 1.0},
            "noise_multiplier calibrates the one-shot protocol's Gaussian releases",
        ),
        # ... and an iterative run's user learns which noise multiplier they meant
        (
            PrivacyConfig,
            {"mechanism": "gaussian", "delta": 1e-5, "noise_multiplier": 1.0},
            "iterative protocols take protocol.noise_multiplier",
        ),
        (PrivacyConfig, {"sensitivity": "max"}, "privacy.sensitivity"),
        (GroupsConfig, {"group_size": 0}, "groups.group_size must be an integer >= 1, got 0"),
        (GroupsConfig, {"sampler": "oracle"}, "groups.sampler"),
        (PublicationConfig, {"mode": "some"}, "publication.mode must be one of group, full"),
        (EvaluationConfig, {"vote": "plurality"}, "evaluation.vote"),
        (EvaluationConfig, {"cv_folds": 1}, "evaluation.cv_folds"),
        (EvaluationConfig, {"folds": (10,)}, "evaluation.folds"),
        (NetworkConfig, {"loss": 1.0}, "network.loss"),
        (NetworkConfig, {"latency": "fast"}, "network.latency"),
        (NetworkConfig, {"bandwidth": 0.0}, "network.bandwidth"),
        (PartitionConfig, {"n_peers": 0}, "partition.n_peers"),
        (PartitionConfig, {"scheme": "random"}, "partition.scheme"),
        (TrainingConfig, {"lam": 0.0}, "training.lambda must be > 0"),
        (DataConfig, {"dataset": "mnist"}, "data.dataset must be one of"),
        (DataConfig, {"transform": ("minmax", "whiten")}, "data.transform"),
    ],
)
def test_bad_values_name_key_and_value(factory, kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        factory(**kwargs)


def test_group_larger_than_peers_is_rejected():
    with pytest.raises(ConfigError, match=r"groups.group_size must be <= partition.n_peers \(5\)"):
        ScenarioConfig(partition=PartitionConfig(n_peers=5), groups=GroupsConfig(group_size=6))


def test_fixed_split_needs_a_test_set():
    with pytest.raises(ConfigError, match="evaluation.split"):
        ScenarioConfig(evaluation=EvaluationConfig(split="fixed"))


def test_with_value_revalidates_and_rejects_unknown_keys():
    config = ScenarioConfig()
    assert with_value(config, "groups.group_size", 20).groups.group_size == 20
    assert with_value(config, "seed", 7).seed == 7
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        with_value(config, "privacy.epsilon", 0.0)
    with pytest.raises(ConfigError, match="unknown setting 'groups.size'"):
        with_value(config, "groups.size", 3)
    with pytest.raises(ConfigError, match="unknown setting"):
        with_value(config, "privacy", 3)


def test_a_config_has_no_sweep_the_scenario_owns_it():
    with pytest.raises(TypeError, match="sweep"):
        ScenarioConfig(sweep=(("groups.group_size", (1, 2)),))


def test_every_field_constraint_is_declared_once_and_names_the_public_key():
    """Each validated field declares its constraint in its metadata; messages use public keys."""
    from dataclasses import fields

    from p2pdp.config import SECTIONS
    from p2pdp.learning.settings import TrainingConfig

    declared = {
        f"{section}.{f.name}"
        for section, cls in SECTIONS.items()
        for f in fields(cls)
        if "constraint" in f.metadata
    }
    assert {"privacy.epsilon", "groups.group_size", "gossip.view_size", "task.name"} <= declared
    with pytest.raises(ConfigError, match=r"^training.lambda must be > 0 and finite, got -1.0$"):
        TrainingConfig(lam=-1.0)


def test_configs_are_frozen_and_flatten():
    config = ScenarioConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 3  # type: ignore[misc]
    row = flat_settings(config)
    assert row["groups.group_size"] == 10
    assert row["data.transform"] == "log1p+minmax+bias+project_unit_ball"
    assert EvaluationConfig(folds=(2, 3)).fold_indices() == (2, 3)
    assert EvaluationConfig(split="fixed").fold_indices() == (0,)


def readme_budget_table() -> list[tuple[float, float, float, float]]:
    """(epsilon, epsilon_A, delta, delta_A) rows of the documentation's budget table."""
    from tests.docs_pages import all_text

    text = all_text()
    table = text.split("| epsilon | epsilon_A | delta | delta_A |")[1].split("\n\n")[0]
    rows = [line.strip("| ").split(" | ") for line in table.splitlines()[2:]]
    return [tuple(float(cell) for cell in row[:4]) for row in rows]


def test_delta_per_aggregation_defaults_to_the_readme_rule():
    table = readme_budget_table()
    assert len(table) >= 5
    for epsilon, per_aggregation, delta, delta_per_aggregation in table:
        privacy = PrivacyConfig(
            epsilon=epsilon,
            epsilon_per_aggregation=per_aggregation,
            delta=delta,
            mechanism="gaussian",
        )
        assert privacy.delta_per_aggregation == pytest.approx(delta_per_aggregation, rel=1e-12)
    assert PrivacyConfig().delta_per_aggregation == 0.0  # no delta, nothing to split


def test_a_derived_delta_follows_epsilon_but_a_given_one_is_kept():
    derived = PrivacyConfig(
        epsilon=1.0, epsilon_per_aggregation=0.1, delta=1e-5, mechanism="gaussian"
    )
    assert dataclasses.replace(derived, epsilon=2.0).delta_per_aggregation == pytest.approx(5e-7)
    assert dataclasses.replace(derived, delta=1e-6).delta_per_aggregation == pytest.approx(1e-7)
    given = dataclasses.replace(derived, delta_per_aggregation=3e-7)
    assert dataclasses.replace(given, epsilon=2.0).delta_per_aggregation == 3e-7
    with pytest.raises(ConfigError, match=r"privacy.delta must be in \(0, 1\).*got 0.0"):
        PrivacyConfig(mechanism="gaussian")  # delta missing: the derived value cannot help


def test_lambda_is_spelled_training_lambda_in_rows_and_with_value():
    row = flat_settings(ScenarioConfig(training=TrainingConfig(lam=0.5)))
    assert row["training.lambda"] == 0.5 and row["training.lambda_source"] == ""
    assert not [key for key in row if key.startswith("training.lam") and "lambda" not in key]
    assert with_value(ScenarioConfig(), "training.lambda", 0.25).training.lam == 0.25
    with pytest.raises(ConfigError, match=r"training.lambda must be > 0 and finite, got -1"):
        TrainingConfig(lam=-1)


# --- what a new user types, refused with the setting's name ------------------------------------
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"privacy": {"epsilon": 1e308}}, "must be <= 1e+06 (aggregations per peer)"),
        ({"privacy": {"epsilon_per_aggregation": 1e-300}}, "must be <= 1e+06"),
        ({"partition": {"n_peers": 10**20}}, "partition.n_peers must be an integer in [1, 2^53]"),
        ({"name": "../../evil"}, "name must be a plain file name"),
        ({"name": "a/b"}, "name must be a plain file name"),
        ({"name": ".."}, "name must be a plain file name"),
        ({"privacy": {"epsilom": 1.0}}, "privacy.epsilom is not a setting of [privacy]"),
        ({"privacy": 3}, "privacy must be a PrivacyConfig or a dict of its settings, got int"),
        ({"data": {"transform": "minmax"}}, "data.transform must be a list such as ['minmax']"),
        ({"evaluation": {"folds": 0}}, "evaluation.folds must be a list such as [0]"),
        ({"evaluation": {"folds": [0, 0]}}, "evaluation.folds must not repeat a fold"),
        ({"evaluation": {"folds": [True]}}, "evaluation.folds must be fold indices"),
        ({"privacy": {"delta": 1e-5}}, "privacy.delta must be 0 for privacy.mechanism = 'vector"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(settings, message):
    with pytest.raises(ConfigError) as caught:
        ScenarioConfig(**settings)
    assert message in str(caught.value)


def test_sections_may_be_given_as_dicts_of_their_settings():
    config = ScenarioConfig(
        privacy={"epsilon": 2.0}, data={"transform": ["minmax", "bias", "project_unit_ball"]}
    )
    assert config.privacy == ScenarioConfig().privacy.__class__(epsilon=2.0)
    assert config.data.transform == ("minmax", "bias", "project_unit_ball")
    hash(config)  # lists become tuples: a config stays hashable


def test_every_shipped_scenario_is_valid_and_silent():
    import warnings

    from p2pdp.experiments.scenarios.scenario import load_scenario, shipped_scenarios_dir

    for path in sorted(shipped_scenarios_dir().glob("*.toml")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert load_scenario(path).points, path.name


# --- the unit-ball projection: required only where a release's sensitivity needs it ------------
UNBOUNDED = DataConfig(dataset="synthetic", transform=("standardize", "bias"))


@pytest.mark.parametrize(
    ("privacy", "groups"),
    [
        ({}, {}),  # vector-laplace
        ({"mechanism": "coordinate-laplace"}, {}),
        ({"mechanism": "gaussian", "delta": 1e-5}, {}),
        ({"mechanism": "seed-laplace"}, {}),
        ({"mechanism": "posterior-sampling"}, {"group_size": 1}),
    ],
)
def test_a_private_one_shot_release_needs_a_norm_step(privacy, groups):
    with pytest.raises(ConfigError) as caught:
        ScenarioConfig(data=UNBOUNDED, privacy=privacy, groups=groups)
    message = str(caught.value)
    assert message.startswith(
        "data.transform = ['standardize', 'bias'] leaves row norms unbounded, but "
        f"privacy.mechanism = {PrivacyConfig(**privacy).mechanism!r} releases one-shot models"
    )
    assert "project_unit_ball, scale_sqrt_d" in message
    for norm_step in ("project_unit_ball", "scale_sqrt_d"):
        transform = ("minmax", "bias", norm_step)
        data = dataclasses.replace(UNBOUNDED, transform=transform)
        ScenarioConfig(data=data, privacy=privacy, groups=groups)


@pytest.mark.parametrize(
    "settings",
    [
        {"privacy": {"mechanism": "none"}},  # not private: no sensitivity to bound
        # clipped gradients: the sensitivity is the clip norm, whatever the rows
        {"protocol": {"name": "dpsgd"}, "privacy": {"mechanism": "gaussian", "delta": 1e-5}},
        {"protocol": {"name": "muffliato"}, "privacy": {"mechanism": "gaussian", "delta": 1e-5}},
        {"protocol": {"name": "gossip-learning"}, "privacy": {"mechanism": "none"}},
    ],
)
def test_runs_whose_privacy_does_not_depend_on_row_norms_need_no_norm_step(settings):
    assert ScenarioConfig(data=UNBOUNDED, **settings).data.transform == ("standardize", "bias")


def test_standardize_takes_no_manifest_bounds():
    with pytest.raises(ConfigError, match="data.bounds = 'manifest' gives the bounds of the"):
        DataConfig(dataset="adult", bounds="manifest", transform=("standardize", "bias"))


TINY_DPSGD = """
name = "tiny"
[data]
dataset = "synthetic"
synthetic_rows = 240
synthetic_test_rows = 60
synthetic_features = 4
transform = ["standardize", "bias"]
[partition]
n_peers = 12
[protocol]
name = "dpsgd"
rounds = 5
[privacy]
mechanism = "gaussian"
epsilon = 1.0
delta = 1e-5
[evaluation]
cv_folds = 3
folds = [0]
"""


def test_private_dpsgd_without_projection_spends_what_it_would_with_it(tmp_path):
    """The D-PSGD accounting depends on the clip norm, not on the rows: leaving the projection
    out changes the model, not the epsilon a peer spends (<= privacy.epsilon)."""
    from p2pdp.experiments.results.files import read_results
    from p2pdp.experiments.run.runner import run_experiment
    from p2pdp.experiments.scenarios.scenario import parse_scenario

    spent = {}
    for name, transform in (
        ("free", '["standardize", "bias"]'),
        ("ball", '["standardize", "bias", "project_unit_ball"]'),
    ):
        scenario = parse_scenario(TINY_DPSGD, overrides=[f"data.transform={transform}"])
        run_experiment(scenario, tmp_path / name, jobs=1)
        (row,) = read_results(tmp_path / name)
        spent[name] = float(row["max_epsilon_spent"])
        assert float(row["min_steps_per_peer"]) == 5
    assert 0 < spent["free"] == spent["ball"] <= 1.0
