"""A user's own component of every kind, from a module outside the package, run through a
TOML scenario by import string (``tests/core/plugins/user_components.py``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from p2pdp.core import components
from p2pdp.core.errors import ComponentError, ConfigError
from p2pdp.experiments.cli import main
from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.run.runner import run_experiment
from p2pdp.experiments.scenarios.scenario import parse_scenario

PLUGINS = Path(__file__).parent / "plugins"
ROOT = Path(__file__).resolve().parents[2]

BASE = """
name = "plugin"
seed = 5

[data]
dataset = "synthetic"
synthetic_rows = 600
synthetic_test_rows = 200
synthetic_features = 6

[partition]
n_peers = 20

[training]
lambda = 0.05

[privacy]
epsilon = 1.0
epsilon_per_aggregation = 0.1

[groups]
group_size = 4

[evaluation]
cv_folds = 2
folds = [0]
"""


@pytest.fixture(autouse=True)
def _plugins_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))


def _run(tmp_path: Path, *settings: str) -> list[dict[str, str]]:
    scenario = parse_scenario(BASE, overrides=settings)
    run_experiment(scenario, tmp_path / "out", jobs=1)
    return read_results(tmp_path / "out")


def _baseline(tmp_path: Path) -> dict[str, str]:
    return _run(tmp_path / "baseline")[0]


def test_model_plugin_trains_the_peers(tmp_path):
    import user_components

    user_components.MODEL_CALLS.clear()
    row = _run(tmp_path, 'training.model="user_components:CountingLogistic"')[0]
    assert user_components.MODEL_CALLS[0] == 20  # every peer's shard, then the centralised fit
    assert row["training.model"] == "user_components:CountingLogistic"
    assert row["mean_error"] == _baseline(tmp_path)["mean_error"]  # same learner underneath


def test_mechanism_plugin_without_a_declaration_is_recorded_as_non_private(tmp_path):
    row = _run(tmp_path, 'privacy.mechanism="user_components:UndeclaredGaussian"')[0]
    assert float(row["guaranteed_epsilon_per_aggregation"]) == math.inf
    assert float(row["max_guaranteed_epsilon"]) == math.inf
    assert float(row["max_epsilon_spent"]) == pytest.approx(1.0)  # the nominal schedule
    assert "declares no privacy guarantee" in row["non_private_steps"]
    assert int(row["aggregations"]) > 0


def test_accountant_plugin_decides_how_many_aggregations_a_peer_affords(tmp_path):
    row = _run(tmp_path, 'privacy.accountant="user_components:DoubleCharging"')[0]
    baseline = _baseline(tmp_path)
    assert float(baseline["mean_aggregations_per_peer"]) > 5  # basic: up to 10 each
    assert float(row["mean_aggregations_per_peer"]) <= 5  # charged twice: at most 5 each


def test_sampler_plugin_forms_the_groups(tmp_path):
    from p2pdp.experiments.run.simulation import simulate

    scenario = parse_scenario(
        BASE, overrides=['groups.sampler="user_components:ConsecutiveSampler"']
    )
    result = simulate(scenario.config)
    first = result.releases[0]
    assert first["curator"] == 0 and first["group_size"] == 4
    # consecutive groups: peers 0-3, 4-7, ... each joins its 10 aggregations
    np.testing.assert_array_equal(result.aggregations_per_peer, 10)
    assert result.aggregations == 10 * 20 // 4


def test_ensemble_plugin_is_the_rule_peers_classify_with(tmp_path):
    row = _run(tmp_path, 'evaluation.vote="user_components:OwnModelOnly"')[0]
    assert float(row["mean_error"]) == pytest.approx(float(row["local_only_error"]), abs=1e-12)
    assert float(_baseline(tmp_path)["mean_error"]) != float(row["mean_error"])


def test_task_plugin_runs_on_the_engine(tmp_path):
    row = _run(tmp_path, 'task.name="user_components:MeanEstimate"')[0]
    assert float(row["releases"]) == int(row["aggregations"]) > 0
    # noise of scale ~ 1/(eps_A K n_min) = 1/(0.1 * 4 * 5) = 0.5 per release
    assert 0.0 < float(row["mean_abs_error"]) < 2.0


def test_unknown_component_names_the_key_the_options_and_the_closest(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"privacy.mechanism must be one of .*gaussian.*"
        r"did you mean 'gaussian'",
    ):
        parse_scenario(BASE, overrides=['privacy.mechanism="gausian"'])
    with pytest.raises(ConfigError, match=r"groups.sampler = 'user_components:Nope'.*no attribute"):
        parse_scenario(BASE, overrides=['groups.sampler="user_components:Nope"'])


def test_components_command_lists_the_eight_kinds_with_their_builtins(capsys):
    assert main(["components", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    kinds = {row["kind"] for row in rows}
    assert kinds == set(components.KINDS) and len(kinds) == 8
    names = {(row["kind"], row["name"]) for row in rows}
    for kind in components.KINDS:
        for name in components.names(kind):
            assert (kind, name) in names
    assert ("mechanism", "vector-laplace") in names and ("task", "logistic") in names
    assert all(row["description"] for row in rows)


def test_registered_components_resolve_to_objects_that_follow_their_protocols():
    from p2pdp.learning.rules import EnsembleRule
    from p2pdp.privacy.accountants import Accountant
    from p2pdp.privacy.mechanisms import Mechanism

    for name in components.names("mechanism"):
        assert issubclass(components.resolve("mechanism", name), Mechanism)
    for name in components.names("accountant"):
        assert issubclass(components.resolve("accountant", name), Accountant)
    for name in components.names("sampler"):
        assert callable(components.resolve("sampler", name))
    for name in components.names("dataset"):
        assert callable(components.resolve("dataset", name))
    for name in components.names("task"):
        assert callable(components.resolve("task", name))
    for name in components.names("ensemble"):
        assert issubclass(components.resolve("ensemble", name), EnsembleRule)
    model = components.resolve("model", "logistic")()
    assert model.lipschitz == 1.0 and model.gradient_tolerance > 0


def test_a_registered_name_works_in_a_scenario_like_a_builtin(tmp_path, monkeypatch):
    """``components.register`` (a notebook's plug-in point) makes a short name valid config."""
    import user_components

    from p2pdp.core.components import _registry

    monkeypatch.setitem(_registry["ensemble"], "own-only", _registry["ensemble"]["majority"])
    components.register("ensemble", "own-only", user_components.OwnModelOnly)
    assert "own-only" in components.names("ensemble")
    assert components.resolve("ensemble", "own-only") is user_components.OwnModelOnly
    row = _run(tmp_path, "evaluation.vote=own-only")[0]
    assert float(row["mean_error"]) == pytest.approx(float(row["local_only_error"]), abs=1e-12)
    with pytest.raises(ConfigError, match="component name must be"):
        components.register("ensemble", "a:b", user_components.OwnModelOnly)


# --- bad output is stopped where the engine receives it -----------------------------------------
BAD = [
    ("privacy.mechanism", "NaNNoise", "mechanism", "sample", "NaN/inf values"),
    ("privacy.mechanism", "WrongShapeNoise", "mechanism", "sample", "shape (256, 8), expected"),
    ("privacy.mechanism", "TextNoise", "mechanism", "sample", "not numbers"),
    ("privacy.mechanism", "NoEvent", "mechanism", "event", "returned None, not a PrivacyEvent"),
    (
        "privacy.mechanism",
        "NotAMechanism",
        "mechanism",
        "",
        "does not follow the mechanism protocol: it lacks sample",
    ),
    ("training.model", "NaNWeights", "model", "fit (weights)", "NaN/inf values"),
    (
        "training.model",
        "TooFewColumns",
        "model",
        "fit (weights)",
        "shape (20, 6), expected (20, 7)",
    ),
    ("evaluation.vote", "NaNScores", "ensemble", "scores", "NaN/inf values"),
    ("evaluation.vote", "RaisingRule", "ensemble", "scores", "raised RuntimeError: my rule"),
    ("data.dataset", "raising_loader", "dataset", "__call__", "raised RuntimeError: cannot reach"),
    ("privacy.accountant", "NaNAccountant", "accountant", "composed_epsilon", "NaN or a negative"),
    ("privacy.accountant", "FreeAccountant", "accountant", "composed_epsilon", "must grow"),
    ("groups.sampler", "RepeatingSampler", "sampler", "start_group", "[0, 0, 1] with curator 0"),
    ("task.name", "NaNSensitivity", "task", "sensitivity", "returned nan"),
    ("task.name", "ShortStatistics", "task", "statistics", "shape (19, 1), expected (20, d)"),
]


@pytest.mark.parametrize(("key", "name", "kind", "method", "what"), BAD, ids=[b[1] for b in BAD])
def test_bad_plugin_output_is_one_error_naming_the_component_and_method(
    tmp_path, key, name, kind, method, what
):
    with pytest.raises(ComponentError) as caught:
        _run(tmp_path, f'{key}="bad_components:{name}"')
    message = str(caught.value)
    assert "\n" not in message
    head = f"{kind} 'bad_components:{name}'" + (f".{method} " if method else " ")
    assert message.startswith(head), message
    assert what in message


def test_the_command_line_shows_bad_plugin_output_as_one_line(tmp_path):
    scenario = tmp_path / "bad.toml"
    scenario.write_text(BASE.replace('name = "plugin"', 'name = "bad"'))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(ROOT)])}
    command = [sys.executable, "-m", "p2pdp.experiments.cli", "run", str(scenario)]
    command += ["--out", str(tmp_path / "out"), "--jobs", "1"]
    command += ["--set", 'privacy.mechanism="bad_components:NaNNoise"']
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2
    # "p2pdp:" lines only: a slow machine may also print the progress line ("p2pdp run: ...")
    errors = [line for line in done.stderr.splitlines() if line.startswith("p2pdp:")]
    assert errors == [
        "p2pdp: error: mechanism 'bad_components:NaNNoise'.sample returned 1792 NaN/inf values "
        "in an array of shape (256, 7)"
    ], done.stderr
    assert "Traceback" not in done.stderr
