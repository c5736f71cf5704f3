"""Scenario files: parsing, type checks, error messages, sweeps (zipped axes), --set overrides."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from p2pdp.config import SECTIONS, ScenarioConfig, field_key
from p2pdp.core.errors import ConfigError
from p2pdp.experiments.scenarios.document import Axis
from p2pdp.experiments.scenarios.scenario import (
    Scenario,
    find_scenario,
    load_scenario,
    parse_scenario,
    shipped_scenarios_dir,
    with_values,
)

SHIPPED = sorted(shipped_scenarios_dir().glob("*.toml"))

BASE = """
name = "t"
seed = 3

[partition]
n_peers = 20

[training]
lambda = 1

[sweep]
"groups.group_size" = [1, 5, 20]
"privacy.epsilon,privacy.epsilon_per_aggregation" = [[1, 0.1], [10, 2]]
"publication.mode" = ["group", "full"]
"""


def test_every_shipped_scenario_loads_and_validates():
    names = {path.stem for path in SHIPPED}
    assert {
        "quickstart",
        "spambase_group_vs_full",
        "australian_group_vs_full",
        "adult_group_vs_full",
        "lambda_grid",
        "peer_count",
    } <= names
    for path in SHIPPED:
        scenario = load_scenario(path)
        assert scenario.points, path
        for point in scenario.points:  # every point's config carries the swept values
            for key, value in point.settings.items():
                section, _, name = field_key(key).partition(".")
                assert getattr(getattr(point.config, section), name) == value


def test_seed_experiment_grid():
    scenario = load_scenario("spambase_group_vs_full")
    assert len(scenario.points) == 7 * 4 * 2
    assert scenario.config.partition.n_peers == 100
    assert scenario.config.evaluation.fold_indices() == tuple(range(10))
    ratios = [
        p.config.privacy.epsilon / p.config.privacy.epsilon_per_aggregation for p in scenario.points
    ]
    assert ratios == pytest.approx([10.0] * len(ratios))  # zipped: varied together, not a product
    assert {p.config.privacy.epsilon for p in scenario.points} == {0.01, 0.1, 1.0, 10.0}


def test_parse_types_and_grid_order():
    scenario = parse_scenario(BASE, source="base.toml")
    assert scenario.config.training.lam == 1.0 and isinstance(scenario.config.training.lam, float)
    assert len(scenario.points) == 3 * 2 * 2
    first, second = scenario.points[0].settings, scenario.points[1].settings
    assert first == {
        "groups.group_size": 1,
        "privacy.epsilon": 1.0,
        "privacy.epsilon_per_aggregation": 0.1,
        "publication.mode": "group",
    }
    assert second["publication.mode"] == "full"  # last axis varies fastest
    assert [p.index for p in scenario.points] == list(range(12))


def test_lists_become_tuples():
    scenario = parse_scenario(
        '[data]\ntransform = ["minmax", "bias", "project_unit_ball"]\n'
        "[evaluation]\nfolds = [0, 2]\n"
    )
    assert scenario.config.data.transform == ("minmax", "bias", "project_unit_ball")
    assert scenario.config.evaluation.folds == (0, 2)


def test_loader_reads_every_field_of_every_section():
    """Sections come from config.SECTIONS: writing every default back gives the default config."""

    def toml(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float) and math.isinf(value):
            return "inf"
        if isinstance(value, tuple):
            return "[" + ", ".join(toml(v) for v in value) + "]"
        return json.dumps(value)

    default = ScenarioConfig()
    lines = []
    for section in SECTIONS:
        lines.append(f"[{section}]")
        for field in dataclasses.fields(getattr(default, section)):
            value = getattr(getattr(default, section), field.name)
            if value is not None:
                key = "lambda" if (section, field.name) == ("training", "lam") else field.name
                lines.append(f"{key} = {toml(value)}")
    assert parse_scenario("\n".join(lines)).config == default


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[groups]\ngrop_size = 3", ["bad.toml", "'groups.grop_size'", "3", "'groups.group_size'"]),
        ("seeed = 1", ["bad.toml", "'seeed'", "did you mean 'seed'"]),
        ("[grups]\ngroup_size = 3", ["'grups'", "did you mean 'groups'"]),
        ('[sweep]\n"groups.grop_size" = [1]', ["'groups.grop_size'", "'groups.group_size'"]),
        ('[sweep]\n"training.lam" = [1]', ["'training.lam'", "did you mean 'training.lambda'"]),
        ('[groups]\ngroup_size = "3"', ["bad.toml", "groups.group_size must be an integer", "'3'"]),
        ("[groups]\ngroup_size = true", ["groups.group_size must be an integer", "True"]),
        ("[groups]\ngroup_size = 2.0", ["groups.group_size must be an integer", "2.0"]),
        ('[privacy]\nepsilon = "1"', ["privacy.epsilon must be a number", "'1'"]),
        ("[privacy]\nsecure_aggregation = 1", ["privacy.secure_aggregation must be true or false"]),
        ('[data]\ntransform = "minmax"', ["data.transform must be a list"]),
        ("[privacy]\nepsilon = -1", ["bad.toml", "privacy.epsilon must be > 0", "-1"]),
        ("groups = 3", ["groups must be a table"]),
        ("[groups.extra]\nx = 1", ["unknown key 'groups.extra'"]),
        ('[sweep]\n"groups.group_size" = []', ['sweep."groups.group_size"', "zero cells"]),
        ('[sweep]\n"groups.group_size" = 3', ["must be a list of values", "3"]),
        (
            '[sweep]\n"privacy.epsilon,privacy.epsilon_per_aggregation" = [[1, 0.1], [2]]',
            ["tuples of 2 values", "[2]"],
        ),
        ('[groups]\ngroup_size = 2\n[sweep]\n"groups.group_size" = [1]', ["set both"]),
        ('[sweep]\n"privacy.epsilon" = [0.01]', ["privacy.epsilon_per_aggregation must be <="]),
        ('[sweep]\n"groups.group_size" = [1, 500]', ["sweep point", "group_size", "500"]),
    ],
)
def test_errors_name_file_key_and_value(text, expected):
    with pytest.raises(ConfigError) as caught:
        parse_scenario(text, source="bad.toml")
    for fragment in expected:
        assert fragment in str(caught.value)


def test_malformed_toml_reports_line_and_column():
    with pytest.raises(ConfigError, match=r"^bad\.toml:3:8: invalid TOML"):
        parse_scenario('name = "x"\n[groups]\nsize = = 3\n', source="bad.toml")
    with pytest.raises(ConfigError, match=r"^bad\.toml:2:\d+: invalid TOML"):
        parse_scenario("a = [1,\n", source="bad.toml")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found.*shipped scenarios: .*quickstart"):
        load_scenario(tmp_path / "absent.toml")


def test_shipped_scenarios_found_by_name():
    assert find_scenario("quickstart") == shipped_scenarios_dir() / "quickstart.toml"
    assert find_scenario("quickstart.toml") == find_scenario("quickstart")


def test_set_overrides_a_setting_and_removes_it_from_the_sweep():
    scenario = parse_scenario(BASE, overrides=["groups.group_size=20", "publication.mode=group"])
    assert scenario.swept_keys() == ("privacy.epsilon", "privacy.epsilon_per_aggregation")
    assert {p.config.groups.group_size for p in scenario.points} == {20}
    assert {p.config.publication.mode for p in scenario.points} == {"group"}
    assert len(scenario.points) == 2


def test_set_one_key_of_a_zipped_axis_keeps_the_other_varying():
    scenario = parse_scenario(BASE, overrides=["privacy.epsilon=10"])
    assert ("privacy.epsilon_per_aggregation",) in [axis.keys for axis in scenario.axes]
    assert {p.config.privacy.epsilon_per_aggregation for p in scenario.points} == {0.1, 2.0}


def test_set_sweep_replaces_an_axis():
    scenario = parse_scenario(
        BASE, overrides=['sweep."groups.group_size"=[2, 4]', "training.lambda=1e-3"]
    )
    assert {p.config.groups.group_size for p in scenario.points} == {2, 4}
    assert scenario.config.training.lam == 1e-3
    with pytest.raises(ConfigError, match="zero cells"):
        parse_scenario(BASE, overrides=['sweep."groups.group_size"=[]'])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("groups.group_size=x", r"--set groups.group_size=x: groups.group_size must be an integer"),
        ("groups.grop_size=3", r"did you mean 'groups.group_size'"),
        ("groups.group_size", r"expected key.path=value"),
        ("a b=3", r"not a valid dotted key"),
    ],
)
def test_bad_overrides(override, message):
    with pytest.raises(ConfigError, match=message):
        parse_scenario(BASE, overrides=[override])


def test_digest_ignores_formatting_but_not_values():
    reformatted = "# a comment\n" + BASE.replace("lambda = 1", "lambda = 1.0   # same value")
    assert parse_scenario(reformatted).digest == parse_scenario(BASE).digest
    assert parse_scenario(BASE, overrides=["seed=4"]).digest != parse_scenario(BASE).digest


def test_base_value_made_valid_only_by_the_sweep():
    """Default group_size 10 > n_peers 5, but every swept group size fits: accepted."""
    scenario = parse_scenario('[partition]\nn_peers = 5\n[sweep]\n"groups.group_size" = [1, 5]')
    assert [p.config.groups.group_size for p in scenario.points] == [1, 5]


def test_scenario_from_a_config_and_axes():
    axes = (
        Axis(("groups.group_size",), ((2,), (4,))),
        Axis(("publication.mode",), (("group",),)),
        Axis(("training.lam",), ((0.1,), (1.0,))),
    )
    scenario = Scenario(config=ScenarioConfig(), axes=axes)
    assert scenario.swept_keys() == ("groups.group_size", "publication.mode", "training.lambda")
    assert len(scenario.points) == 4
    with pytest.raises(ConfigError, match="appears on two axes"):
        Scenario(config=ScenarioConfig(), axes=(*axes, Axis(("groups.group_size",), ((3,),))))
    with pytest.raises(ConfigError, match="not a section setting"):
        Scenario(config=ScenarioConfig(), axes=(Axis(("groups.bogus",), ((1,),)),))
    with pytest.raises(ConfigError, match="has no values"):
        Scenario(config=ScenarioConfig(), axes=(Axis(("groups.group_size",), ()),))
    with pytest.raises(ConfigError, match="'groups.grop_size' is not a section setting"):
        Scenario(config=ScenarioConfig(), axes=(Axis(("groups.grop_size",), ((3,),)),))
    with pytest.raises(ConfigError, match="must be a tuple of 2 values"):
        Scenario(config=ScenarioConfig(), axes=(Axis(("groups.group_size", "seed"), ((3,),)),))


def test_with_values_validates_only_the_final_combination():
    config = ScenarioConfig()
    changed = with_values(config, {"partition.n_peers": 5, "groups.group_size": 5})
    assert (changed.partition.n_peers, changed.groups.group_size) == (5, 5)
    with pytest.raises(ConfigError, match="group_size must be <="):
        with_values(config, {"partition.n_peers": 5})


def test_lambda_has_one_spelling_in_files_set_and_sweeps():
    scenario = parse_scenario(BASE, overrides=['sweep."training.lambda"=[0.5, 1]'])
    assert "training.lambda" in scenario.swept_keys()
    assert {p.settings["training.lambda"] for p in scenario.points} == {0.5, 1.0}
    assert parse_scenario(BASE, overrides=["training.lambda=0.25"]).config.training.lam == 0.25
    for override in ("training.lam=0.25", 'sweep."training.lam"=[1]'):
        with pytest.raises(ConfigError, match=r"did you mean 'training.lambda'\?"):
            parse_scenario(BASE, overrides=[override])


@pytest.mark.parametrize(
    ("overrides", "blamed", "mentions"),
    [
        (["privacy.epsilon=-1"], "--set privacy.epsilon=-1: ", "privacy.epsilon must be > 0"),
        (
            ["partition.n_peers=3"],  # valid alone, but the file's sweep has g = 5, 20
            "--set partition.n_peers=3: ",
            "groups.group_size must be <= partition.n_peers (3)",
        ),
        (
            ["publication.mode=group", 'sweep."privacy.epsilon"=[0.05]'],
            '--set sweep."privacy.epsilon"=[0.05]: ',
            "privacy.epsilon_per_aggregation is no longer swept because --set "
            'sweep."privacy.epsilon"=[0.05] replaced the sweep axis it shared',
        ),
        (
            ["privacy.epsilon=0.5"],  # epsilon_per_aggregation stays swept over 0.1 and 2
            "--set privacy.epsilon=0.5: ",
            "privacy.epsilon_per_aggregation is still swept on its own because --set "
            "privacy.epsilon=0.5 fixed",
        ),
    ],
)
def test_set_value_errors_name_the_set_argument_not_the_file(overrides, blamed, mentions):
    with pytest.raises(ConfigError) as error:
        parse_scenario(BASE, source="scenario.toml", overrides=overrides)
    message = str(error.value)
    assert message.startswith(blamed), message
    assert mentions in message
    assert "scenario.toml" not in message


def test_an_invalid_file_is_still_blamed_on_the_file():
    bad = BASE.replace("n_peers = 20", "n_peers = 2")
    with pytest.raises(ConfigError, match=r"^scenario.toml: .*groups.group_size must be <="):
        parse_scenario(bad, source="scenario.toml", overrides=["publication.mode=group"])


def test_a_file_setting_in_the_way_of_a_set_is_named():
    text = BASE.replace(
        "lambda = 1", "lambda = 1\n\n[privacy]\nmechanism = 'gaussian'\ndelta = 1e-5"
    )
    parse_scenario(text)  # the file alone is fine, with delta_per_aggregation derived
    with pytest.raises(ConfigError) as error:
        parse_scenario(text, source="s.toml", overrides=["privacy.delta_per_aggregation=1e-3"])
    message = str(error.value)
    assert message.startswith("--set privacy.delta_per_aggregation=1e-3: privacy.delta_per_")
    assert message.endswith("(privacy.delta = 1e-05 comes from s.toml)")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_set_sweep_epsilon_replaces_the_zipped_axis_on_every_shipped_scenario(path):
    """The README's example: the partner key falls back to its base value."""
    base = load_scenario(path)
    scenario = load_scenario(path, ['sweep."privacy.epsilon"=[0.1,1]'])
    assert "privacy.epsilon_per_aggregation" not in scenario.swept_keys()
    if "privacy.epsilon" in scenario.unread_axes:  # not private: no budget, one cell
        assert len({p.config.privacy.epsilon for p in scenario.points}) == 1
    else:
        assert {p.config.privacy.epsilon for p in scenario.points} == {0.1, 1.0}
    assert {p.config.privacy.epsilon_per_aggregation for p in scenario.points} == {0.1}
    others = [k for k in base.swept_keys() if not k.startswith("privacy.epsilon")]
    assert [k for k in scenario.swept_keys() if k != "privacy.epsilon"] == others


def test_a_misspelled_shipped_scenario_is_named():
    with pytest.raises(ConfigError, match=r"'quickstrt' not found \(did you mean 'quickstart'\?"):
        load_scenario("quickstrt")
