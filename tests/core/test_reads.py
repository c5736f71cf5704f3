"""Every setting either applies or is refused (issue 27).

Each component declares the settings it reads (:mod:`p2pdp.core.reads`); a scenario refuses a
setting no selected component reads, a sweep point keeps only what its components read (so
points that differ only in unread settings are one cell), and rows leave unread settings empty.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from p2pdp.config import (
    COMPONENT_SETTINGS,
    ENGINE_READS,
    OPTION_READS,
    RUNTIME_READS,
    SECTIONS,
    ScenarioConfig,
    public_key,
    settings_read,
)
from p2pdp.core import components
from p2pdp.core.errors import ConfigError
from p2pdp.core.reads import When, declared_reads
from p2pdp.experiments.cli import main
from p2pdp.experiments.report.write import write_report
from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.results.store import ResultsStore
from p2pdp.experiments.run.cells import make_cells
from p2pdp.experiments.run.runner import run_experiment
from p2pdp.experiments.run.simulation import simulate
from p2pdp.experiments.scenarios.scenario import (
    load_scenario,
    parse_scenario,
    scenario_from_mapping,
    shipped_scenarios_dir,
)

#: A small synthetic world: every cell runs in well under a second.
SMALL = """
name = "small"
seed = 3
[data]
dataset = "synthetic"
synthetic_rows = 400
synthetic_test_rows = 100
synthetic_features = 5
[partition]
n_peers = 10
[training]
lambda = 0.01
[privacy]
mechanism = "gaussian"
delta = 1e-5
[evaluation]
cv_folds = 2
folds = [0]
"""

_DPSGD = {
    "protocol": {"name": "dpsgd", "rounds": 3},
    "privacy": {"mechanism": "gaussian", "delta": 1e-5},
    "data": {"dataset": "synthetic", "synthetic_rows": 300, "synthetic_test_rows": 100},
    "partition": {"n_peers": 10},
    "gossip": {"degree": 4},
    "evaluation": {"cv_folds": 2},
}


def _with(base: dict, **sections: dict) -> dict:
    merged = {key: dict(value) for key, value in base.items()}
    for section, values in sections.items():
        merged.setdefault(section, {}).update(values)
    return merged


def _all_settings() -> set[str]:
    keys = {public_key(f"{s}.{f.name}") for s, c in SECTIONS.items() for f in dataclasses.fields(c)}
    return keys | {f"{s}.*" for s in SECTIONS}


def test_every_declared_read_names_a_real_setting():
    """A typo in a declaration would make a setting look unread (or read) silently."""
    valid = _all_settings() | {"name", "seed", "repetitions"}
    declared: list[str] = list(ENGINE_READS)
    for setting, kind in COMPONENT_SETTINGS.items():
        assert setting in valid
        for name in components.names(kind):
            for entry in declared_reads(components.resolve(kind, name)):
                if isinstance(entry, When):
                    assert entry.key in valid
                    declared += entry.keys
                else:
                    declared.append(entry)
    for setting, options in OPTION_READS.items():
        assert setting in valid
        declared += [key for keys in options.values() for key in keys]
    for keys in RUNTIME_READS.values():
        declared += keys
    unknown = sorted(set(declared) - valid)
    assert not unknown, unknown


@pytest.mark.parametrize(
    "path", sorted(shipped_scenarios_dir().glob("*.toml")), ids=lambda p: p.stem
)
def test_every_shipped_scenario_sets_only_what_its_cells_read(path):
    """Declarations missing a setting a shipped scenario sets would refuse it here."""
    scenario = load_scenario(path)
    assert scenario.unread_axes == ()
    for point in scenario.points:
        read = settings_read(point.config)
        assert set(point.settings) <= set(read)


@pytest.mark.parametrize(
    ("sections", "refused", "reader"),
    [
        ({"privacy": {"secure_aggregation": True}}, "privacy.secure_aggregation", "'one-shot'"),
        ({"groups": {"sampler": "gossip"}}, "groups.sampler", "'one-shot'"),
        ({"groups": {"max_concurrent_groups": 5}}, "groups.max_concurrent_groups", "'one-shot'"),
        ({"privacy": {"min_shard_size": 1000}}, "privacy.min_shard_size", "'one-shot'"),
        ({"groups": {"group_size": 5}}, "groups.group_size", "'one-shot'"),
        ({"publication": {"mode": "group"}}, "publication.mode", "'one-shot'"),
        ({"evaluation": {"vote": "average"}}, "evaluation.vote", "'one-shot'"),
        ({"partition": {"alpha": 0.01}}, "partition.alpha", "'label_skew'"),
        ({"protocol": {"batch_size": 8}}, "protocol.batch_size", "'fixed'"),
        ({"network": {"latency_sigma": 2.0}}, "network.latency_sigma", "'lognormal'"),
        ({"privacy": {"tau": 2.0}}, "privacy.tau", "'posterior-sampling'"),
    ],
)
def test_a_setting_dpsgd_never_reads_is_refused_naming_who_reads_it(sections, refused, reader):
    with pytest.raises(ConfigError) as caught:
        scenario_from_mapping(_with(_DPSGD, **sections))
    message = str(caught.value)
    assert f"{refused} = " in message and reader in message and "change nothing" in message


def test_unread_settings_are_refused_for_other_tasks_and_samplers_too():
    with pytest.raises(ConfigError, match=r"prevalence.records_per_peer = 5 is read only with"):
        scenario_from_mapping({"prevalence": {"records_per_peer": 5}})
    with pytest.raises(ConfigError, match=r"training.lambda = 0.5 is read only with task.name"):
        scenario_from_mapping({"task": {"name": "prevalence-counts"}, "training": {"lambda": 0.5}})
    with pytest.raises(ConfigError, match=r"gossip.view_size = 3 .*groups.sampler = 'gossip'"):
        scenario_from_mapping({"gossip": {"view_size": 3}})
    # the same settings where something reads them are accepted
    scenario_from_mapping({"partition": {"scheme": "label_skew", "alpha": 0.01}})
    scenario_from_mapping({"groups": {"sampler": "gossip"}, "gossip": {"view_size": 3}})


def test_a_config_given_directly_records_no_setting_it_did_not_read():
    """The Python API takes a config as built (scenarios refuse); its rows stay honest."""
    config = ScenarioConfig(**_with(_DPSGD, privacy={"secure_aggregation": True}))
    row = simulate(config).row()
    assert row["privacy.secure_aggregation"] is None and row["groups.group_size"] is None
    assert row["protocol.rounds"] == 3 and row["privacy.delta"] == 1e-5


def test_quickstart_as_dpsgd_runs_only_the_cells_dpsgd_tells_apart():
    overrides = ["protocol.name=dpsgd", "privacy.mechanism=gaussian", "privacy.delta=1e-5"]
    scenario = load_scenario("quickstart", overrides)
    assert set(scenario.unread_axes) == {
        "groups.group_size",
        "publication.mode",
        "privacy.epsilon_per_aggregation",
    }
    assert [point.settings for point in scenario.points] == [
        {"privacy.epsilon": 1.0},
        {"privacy.epsilon": 10.0},
    ]
    assert len(make_cells(scenario)) == 2 * 3  # epsilon x the 3 folds, not 24
    one_shot = load_scenario("quickstart")
    assert len(make_cells(one_shot)) == 24


def _mixed_sweep(tmp_path):
    text = SMALL + (
        '[protocol]\nrounds = 4\n[gossip]\ndegree = 4\n[sweep]\n"protocol.name" = ["one-shot", '
        '"dpsgd"]\n"groups.group_size" = [2, 5]\n"privacy.epsilon" = [1.0, 10.0]\n'
    )
    return parse_scenario(text, source="mixed")


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. a layout collapsed
def test_a_protocol_sweep_gives_one_row_per_cell_its_protocol_reads(tmp_path):
    scenario = _mixed_sweep(tmp_path)
    protocols = [
        (p.config.protocol.name, p.settings.get("groups.group_size")) for p in scenario.points
    ]
    assert protocols.count(("dpsgd", None)) == 2  # one per epsilon, not per group size
    assert sorted(g for name, g in protocols if name == "one-shot") == [2, 2, 5, 5]
    run_experiment(scenario, tmp_path / "out", jobs=1)
    rows = read_results(tmp_path / "out")
    assert len(rows) == 6
    for row in rows:
        if row["protocol.name"] == "dpsgd":  # never read: empty, not the default 10
            assert row["groups.group_size"] == "" and row["publication.mode"] == ""
            assert row["evaluation.vote"] == "" and row["privacy.epsilon_per_aggregation"] == ""
            assert row["protocol.rounds"] == "4"
        else:
            assert row["groups.group_size"] in ("2", "5") and row["protocol.rounds"] == ""
            assert row["partition.alpha"] == ""  # iid: alpha is read by no one
    report = write_report(tmp_path / "out").read_text()
    # group size varies only among one-shot cells; the comparison of protocols replaces it
    assert "error_vs_group_size.png" not in report


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. a layout collapsed
def test_a_report_draws_no_figure_for_an_axis_no_cell_read(tmp_path):
    text = (
        SMALL + '[sweep]\n"privacy.epsilon" = [1.0, 10.0]\n"publication.mode" = ["group", "full"]\n'
    )
    overrides = ["protocol.name=dpsgd", "protocol.rounds=4", "gossip.degree=4"]
    scenario = parse_scenario(text, source="s", overrides=overrides)
    assert scenario.unread_axes == ("publication.mode",)
    assert len(scenario.points) == 2
    run_experiment(scenario, tmp_path / "out", jobs=1)
    report = write_report(tmp_path / "out").read_text()
    assert "error_vs_epsilon.png" in report
    roc = report[report.index("ROC of the best peer") :]
    assert "publication" not in roc.split("\n\n")[0]


def test_non_private_means_mechanism_none_for_every_protocol():
    config = (
        scenario_from_mapping(_with(_DPSGD, privacy={"mechanism": "none", "delta": 0.0}))
        .points[0]
        .config
    )
    result = simulate(config)
    row = result.row()
    assert row["guarantee"] == "none" and math.isinf(row["max_epsilon_spent"])
    assert row["noise_multiplier_used"] == 0.0
    with pytest.raises(ConfigError, match="set privacy.mechanism = 'none'"):
        scenario_from_mapping(_with(_DPSGD, protocol={"noise_multiplier": 0.0}))
    with pytest.raises(ConfigError, match="protocol.noise_multiplier = 2.0 adds noise"):
        scenario_from_mapping(
            _with(
                _DPSGD,
                privacy={"mechanism": "none", "delta": 0.0},
                protocol={"noise_multiplier": 2.0},
            )
        )


def test_a_budget_that_affords_no_step_is_refused_before_the_folder(tmp_path):
    scenario = parse_scenario(
        SMALL,
        source="s",
        overrides=["protocol.name=dpsgd", "protocol.noise_multiplier=0.1", "gossip.degree=4"],
    )
    with pytest.raises(ConfigError, match=r"affords no step .* one step costs epsilon = \d"):
        run_experiment(scenario, tmp_path / "out", jobs=1)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["protocol.noise_multiplier", "privacy.noise_multiplier"])
def test_a_vanishing_noise_multiplier_is_a_clear_error_not_a_nan(key):
    overrides = [f"{key}=1e-12"]
    if key.startswith("protocol"):
        overrides.append("protocol.name=dpsgd")
    else:
        overrides.append("privacy.delta_per_aggregation=1e-6")
    with pytest.raises(ConfigError, match=rf"{key} must be >= .* got 1e-12"):
        parse_scenario(SMALL, source="s", overrides=overrides)


def test_rounds_are_bounded_and_a_diverging_step_size_is_named():
    with pytest.raises(ConfigError, match=r"protocol.rounds must be <= 1,000,000"):
        scenario_from_mapping(_with(_DPSGD, protocol={"rounds": 100_000_000_000}))
    config = scenario_from_mapping(_with(_DPSGD, protocol={"step_size": 1e308})).points[0].config
    with pytest.raises(
        ConfigError, match=r"protocol.step_size = 1e\+308: the dpsgd models diverged"
    ):
        with pytest.warns(RuntimeWarning):
            simulate(config)


def test_a_tiny_budget_with_dpsgd_does_not_blame_a_setting_it_never_reads():
    scenario = scenario_from_mapping(_with(_DPSGD, privacy={"epsilon": 1e-6}))
    assert scenario.points[0].config.privacy.epsilon == 1e-6
    with pytest.raises(ConfigError, match="privacy.epsilon_per_aggregation must be <="):
        scenario_from_mapping({"privacy": {"epsilon": 1e-6}})  # one-shot reads it


def test_an_interrupt_while_finishing_marks_the_folder_interrupted(tmp_path, monkeypatch):
    from p2pdp.experiments.results import store as results

    scenario = parse_scenario(SMALL, source="s")

    close_files = results.ResultsStore._close_files

    signals = ["SIGINT"]

    def interrupted(store):  # while finishing: the rows are written, the folder not complete
        close_files(store)
        if signals:  # once (failing closes the files again)
            raise KeyboardInterrupt(signals.pop())

    # (a run whose cells came in order no longer rewrites its CSV files when it finishes, so
    # the interrupt comes where every finish passes, not in a sorted file's write)
    monkeypatch.setattr(results.ResultsStore, "_close_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(scenario, tmp_path / "out", jobs=1)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    monkeypatch.undo()
    summary = run_experiment(scenario, tmp_path / "out", jobs=1, resume=True)
    assert summary.run == 0 and summary.skipped == 1
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["status"] == "complete"


def test_a_cut_row_is_reported_as_incomplete_with_the_command_that_completes_it(tmp_path):
    scenario = parse_scenario(SMALL + '[sweep]\n"privacy.epsilon" = [1.0, 10.0]\n', source="s.toml")
    run_experiment(scenario, tmp_path / "out", jobs=1)
    results_csv = tmp_path / "out" / "results.csv"
    results_csv.write_text(results_csv.read_text().rstrip("\n")[:-30])
    text = write_report(tmp_path / "out").read_text()
    assert "1 of 2 cells missing" in text and "is complete" not in text
    assert "--resume" in text
    assert ResultsStore  # the store marks what is missing; the command above completes it


def test_components_lists_what_each_component_reads(capsys):
    assert main(["components", "protocol"]) == 0
    out = capsys.readouterr().out
    assert "settings read: protocol.rounds" in out and "protocol.gossip_steps" in out
    assert main(["components"]) == 0
    out = capsys.readouterr().out
    assert "partition.scheme = 'label_skew': partition.alpha" in out
    assert "simulation  network.latency" in out


def _reads_table() -> str:
    """The guide's table of what each component reads, from the declarations themselves."""
    from p2pdp.core.reads import describe

    lines = ["| setting = value | reads |", "|---|---|"]
    lines.append("| (every run) | " + ", ".join(f"`{k}`" for k in ENGINE_READS) + " |")
    for runtime, keys in RUNTIME_READS.items():
        reads = describe(keys)
        lines.append(f"| `--runtime {runtime}` | {reads} |")
    for setting, kind in COMPONENT_SETTINGS.items():
        for name in components.names(kind):
            reads = declared_reads(components.resolve(kind, name))
            if reads:
                lines.append(f'| `{setting} = "{name}"` | {describe(reads)} |')
    for setting, options in OPTION_READS.items():
        for value, keys in options.items():
            if keys:
                shown = f'"{value}"' if isinstance(value, str) else str(value).lower()
                lines.append(f"| `{setting} = {shown}` | {', '.join(keys)} |")
    return "\n".join(lines)


def test_the_guide_lists_what_every_component_reads():
    from tests.docs_pages import page

    assert _reads_table() in page("scenarios")


def test_a_non_private_run_records_no_budget_and_spends_without_bound():
    none = {"privacy": {"mechanism": "none", "delta": 0.0}}
    with pytest.raises(ConfigError, match=r"privacy.epsilon = 3.0 is read only with .*anything"):
        scenario_from_mapping(
            _with(_DPSGD, privacy={"mechanism": "none", "delta": 0.0, "epsilon": 3.0})
        )
    row = simulate(scenario_from_mapping(_with(_DPSGD, **none)).points[0].config).row()
    assert row["privacy.epsilon"] is None and row["privacy.accountant"] is None
    one_shot = {"data": _DPSGD["data"], "partition": {"n_peers": 10}, "groups": {"group_size": 5}}
    result = simulate(scenario_from_mapping({**one_shot, **none}).points[0].config)
    assert result.row()["guarantee"] == "none" and math.isinf(result.row()["max_epsilon_spent"])


def test_a_budget_beyond_any_calibration_is_a_clear_error():
    config = scenario_from_mapping(_with(_DPSGD, privacy={"epsilon": 1e9})).points[0].config
    with pytest.raises(ConfigError, match=r"epsilon = 1e\+09 is beyond 1e\+06"):
        simulate(config)


def test_a_batch_larger_than_a_shard_is_refused_not_clamped():
    config = (
        scenario_from_mapping(_with(_DPSGD, protocol={"sampling": "fixed", "batch_size": 1000}))
        .points[0]
        .config
    )
    with pytest.raises(ConfigError, match=r"protocol.batch_size = 1000 is more than the \d+"):
        simulate(config)


def test_an_interrupt_before_the_run_starts_is_one_line(monkeypatch, capsys):
    from p2pdp.experiments.scenarios import scenario

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("SIGINT")

    monkeypatch.setattr(scenario, "load_scenario", interrupted)
    assert main(["run", "quickstart"]) == 130
    assert capsys.readouterr().err.strip() == "p2pdp: interrupted by SIGINT"


@pytest.mark.parametrize("epsilon", [2.0, 1e-6])
def test_a_calibrated_noise_multiplier_affords_every_round(epsilon):
    """At a tiny budget the calibration sits at the accountant's edge: it must still fit all
    protocol.rounds steps (it afforded one less), and never spend more than the budget."""
    config = scenario_from_mapping(_with(_DPSGD, privacy={"epsilon": epsilon})).points[0].config
    row = simulate(config).row()
    assert row["min_steps_per_peer"] == config.protocol.rounds
    assert row["max_epsilon_spent"] <= epsilon * (1 + 1e-9)


def test_a_very_noisy_step_is_a_run_not_an_accountant_error():
    """z = 1e9 affords far more steps than a run takes: counted up to the rounds."""
    config = (
        scenario_from_mapping(_with(_DPSGD, protocol={"noise_multiplier": 1e9})).points[0].config
    )
    row = simulate(config).row()
    assert row["min_steps_per_peer"] == row["affordable_aggregations"] == config.protocol.rounds
