"""Config dataclasses: validation names the key and the value."""

from __future__ import annotations

import dataclasses
import math

import pytest

from p2pdp.config import (
    DataConfig,
    EvaluationConfig,
    GroupsConfig,
    NetworkConfig,
    PartitionConfig,
    PrivacyConfig,
    PublicationConfig,
    ScenarioConfig,
    TrainingConfig,
    flat_settings,
    with_value,
)
from p2pdp.errors import ConfigError


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


def test_sweep_keys_are_checked():
    with pytest.raises(ConfigError, match="not a scenario setting"):
        ScenarioConfig(sweep=(("groups.bogus", (1, 2)),))
    with pytest.raises(ConfigError, match="at least one value"):
        ScenarioConfig(sweep=(("groups.group_size", ()),))


def test_configs_are_frozen_and_flatten():
    config = ScenarioConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 3  # type: ignore[misc]
    row = flat_settings(config)
    assert row["groups.group_size"] == 10
    assert row["data.transform"] == "log1p+minmax+bias+project_unit_ball"
    assert EvaluationConfig(folds=(2, 3)).fold_indices() == (2, 3)
    assert EvaluationConfig(split="fixed").fold_indices() == (0,)
