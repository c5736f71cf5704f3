"""Non-private steps: listed per config, carried by every results row and every report.md."""

from __future__ import annotations

import math

import pytest

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.data.settings import DataConfig
from p2pdp.experiments.cli import main
from p2pdp.experiments.report.write import write_report
from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.run.runner import run_experiment
from p2pdp.experiments.scenarios.disclosure import (
    LAMBDA_SWEPT,
    mechanism_warnings,
    model_dimension,
    non_private_column,
    non_private_steps,
)
from p2pdp.experiments.scenarios.scenario import (
    load_scenario,
    parse_scenario,
    shipped_scenarios_dir,
)
from p2pdp.learning.settings import TrainingConfig
from p2pdp.privacy.settings import PrivacyConfig

TINY = """
name = "tiny"
seed = 7

[data]
dataset = "synthetic"
synthetic_rows = 200
synthetic_test_rows = 60
synthetic_features = 4

[partition]
n_peers = 8

[evaluation]
cv_folds = 2
folds = [0]

[sweep]
"groups.group_size" = [2, 4]
"""


def adult(**privacy) -> ScenarioConfig:
    """Adult with manifest bounds: no data-dependent preprocessing."""
    return ScenarioConfig(
        data=DataConfig(
            dataset="adult", transform=("minmax", "bias", "project_unit_ball"), bounds="manifest"
        ),
        privacy=PrivacyConfig(**privacy),
    )


def test_a_fully_private_config_has_no_steps():
    assert non_private_steps(adult()) == ()
    assert non_private_column(adult()) == ""


def test_each_kind_of_step_is_listed():
    bounds = non_private_steps(ScenarioConfig())  # spambase, data-dependent min-max
    assert len(bounds) == 1 and 'data.bounds = "data"' in bounds[0]
    no_minmax = ScenarioConfig(data=DataConfig(transform=("log1p", "bias", "project_unit_ball")))
    assert non_private_steps(no_minmax) == ()  # "data" bounds without min-max fit nothing
    standardized = ScenarioConfig(
        data=DataConfig(transform=("standardize", "bias", "project_unit_ball"))
    )
    (step,) = non_private_steps(standardized)
    assert step.startswith("standardize: feature means and standard deviations fitted")

    chosen = adult().__class__(
        data=adult().data, training=TrainingConfig(lam=0.25, lambda_source="picked on a9a.t")
    )
    (step,) = non_private_steps(chosen)
    assert step == "lambda = 0.25 picked on a9a.t"
    (step,) = non_private_steps(adult(), swept=["training.lambda"])
    assert step == f"lambda: {LAMBDA_SWEPT}"

    (step,) = non_private_steps(adult(mechanism="none"))
    assert "no noise" in step

    (step,) = non_private_steps(
        adult(epsilon=2.0, epsilon_per_aggregation=0.5, mechanism="seed-laplace")
    )
    d = 124  # 123 features + bias
    assert model_dimension(adult()) == d
    assert f"sqrt({d}) x 0.5 = {math.sqrt(d) * 0.5:.4g} per release" in step
    assert f"up to sqrt({d}) x 2 = {math.sqrt(d) * 2:.4g} per peer" in step


def test_lambda_source_must_not_break_the_joined_column():
    with pytest.raises(ConfigError, match="training.lambda_source must be a string without ';'"):
        TrainingConfig(lambda_source="a; b")


def test_cli_warns_for_seed_laplace_and_none_only():
    base = ScenarioConfig()
    assert mechanism_warnings([base, adult(mechanism="gaussian", delta=1e-5)]) == []
    warnings = mechanism_warnings(
        [adult(mechanism="none"), adult(mechanism="seed-laplace"), adult(mechanism="none")]
    )
    assert len(warnings) == 2
    assert "not the" not in warnings[0] and "not private" in warnings[0]
    assert "not epsilon-DP" in warnings[1] and "sqrt(124)" in warnings[1]


def test_rows_and_report_carry_the_steps(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(
        [
            "run",
            str(write(tmp_path, TINY)),
            "--out",
            str(out),
            "--jobs",
            "1",
            "--set",
            "privacy.mechanism=seed-laplace",
            "--set",
            "training.lambda_source=guessed from the test set",
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "p2pdp: warning: privacy.mechanism = seed-laplace is not epsilon-DP" in err
    rows = read_results(out)
    assert len(rows) == 2
    for row in rows:
        steps = row["non_private_steps"].split("; ")
        assert steps[0] == "lambda = 0.01 guessed from the test set"
        assert "min-max bounds" in steps[1]
        assert steps[2].startswith("privacy.mechanism = seed-laplace") and "sqrt(5)" in steps[2]
        assert row["training.lambda"] == "0.01" and "training.lam" not in row
    report = (out / "report.md").read_text()
    section = report.split("## Non-private steps")[1].split("##")[0]
    for step in rows[0]["non_private_steps"].split("; "):
        assert f"- {step}\n" in section


def test_a_private_run_says_so_in_the_report(tmp_path):
    scenario = parse_scenario(
        TINY, overrides=['data.transform=["log1p", "bias", "project_unit_ball"]']
    )
    run_experiment(scenario, tmp_path, jobs=1)
    assert {row["non_private_steps"] for row in read_results(tmp_path)} == {""}
    report = write_report(tmp_path).read_text()
    assert "## Non-private steps\n\nNone: the only access to the peers' data" in report


def test_a_swept_lambda_is_labelled_in_rows_and_report(tmp_path):
    scenario = parse_scenario(TINY, overrides=['sweep."training.lambda"=[0.01, 0.1]'])
    assert {p.config.training.lambda_source for p in scenario.points} == {LAMBDA_SWEPT}
    run_experiment(scenario, tmp_path, jobs=1)
    for row in read_results(tmp_path):
        assert row["non_private_steps"].startswith(f"lambda: {LAMBDA_SWEPT}; min-max")
    assert f"- lambda: {LAMBDA_SWEPT}\n" in write_report(tmp_path).read_text()


@pytest.mark.parametrize(
    "path", sorted(shipped_scenarios_dir().glob("*.toml")), ids=lambda p: p.stem
)
def test_every_shipped_scenario_declares_where_lambda_came_from(path):
    """Every Spambase scenario uses the lambda that lambda_grid chose; adult's was tuned."""
    scenario = load_scenario(path)
    for point in scenario.points:
        steps = non_private_steps(point.config, scenario.swept_keys())
        lam = [s for s in steps if s.startswith("lambda")]
        if scenario.name in (
            "australian_group_vs_full",
            "gossip_vs_central",
            "peer_count_1m",
            "peer_count_10m",
        ):
            assert lam == []  # lambda not chosen on this scenario's data (see the files)
        elif point.config.task.name == "pooled-testing":  # one pool per person
            assert len(steps) == 1 and "not worst-case DP" in steps[0]
        elif point.config.task.name != "logistic":
            assert steps == ()  # the prevalence tasks count records: only the mechanism reads
        elif scenario.name == "lambda_grid":
            assert lam == [f"lambda: {LAMBDA_SWEPT}"]
        elif scenario.name == "adult_group_vs_full":
            assert lam and "a9a.t" in lam[0] and "never the test split" in lam[0]
            assert steps == tuple(lam)  # manifest bounds: nothing else
        else:
            assert lam and "lambda_grid" in lam[0]


def write(directory, text):
    path = directory / "tiny.toml"
    path.write_text(text)
    return path
