"""Command-line ergonomics (issue 40): ``--unset KEY``, switching ``protocol.name`` with
``--set`` on a file with one-shot settings, and ``--resume`` adding folds to a finished run.

Each test gives ``p2pdp run`` a command line and checks what it did (rows, manifest) or the
one-line error it printed.
"""

from __future__ import annotations

import json
import re

import pytest

from p2pdp.core.errors import ConfigError
from p2pdp.experiments.cli import main
from p2pdp.experiments.results.files import read_results
from p2pdp.experiments.results.manifest import resume_command
from p2pdp.experiments.scenarios.scenario import load_scenario, parse_scenario
from tests.experiments.test_results import TINY as RESULTS_TINY

#: test_results' two cells per fold (under a second each, one-shot settings in the base), with
#: room for the default group size, on fold 0.
TINY = RESULTS_TINY.replace("n_peers = 8", "n_peers = 10").replace(
    "cv_folds = 4", "cv_folds = 4\nfolds = [0]"
)
assert "n_peers = 10" in TINY and "folds = [0]" in TINY

#: What D-PSGD needs on TINY besides the protocol's name.
DPSGD = [
    "privacy.mechanism=gaussian",
    "privacy.delta=1e-5",
    "protocol.rounds=3",
    "gossip.degree=4",
]


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """TINY as ``tiny.toml`` in the current (temporary) folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.toml").write_text(TINY)
    return "tiny.toml"


def run(*argv: str) -> int:
    return main(["run", *argv, "--jobs", "1"])


def sets(*overrides: str) -> list[str]:
    return [word for override in overrides for word in ("--set", override)]


def error_line(capsys) -> str:
    """The one line ``p2pdp: error: ...`` the command printed (and nothing else on stderr)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("p2pdp: error: ")
    return lines[0]


# --- --unset ----------------------------------------------------------------------------------
def test_unset_gives_the_default_and_resumes_with_the_same_command(tiny, capsys):
    assert run(tiny, "--out", "out", "--unset", "groups.group_size") == 0
    assert {row["groups.group_size"] for row in read_results("out")} == {"10"}  # the default
    manifest = json.loads(open("out/manifest.json").read())
    assert manifest["unset"] == ["groups.group_size"]
    again = resume_command("out", manifest)
    assert "--unset groups.group_size" in again
    capsys.readouterr()
    assert run(tiny, "--out", "out", "--unset", "groups.group_size", "--resume") == 0
    assert "0 run, 2 already done" in capsys.readouterr().out  # the same scenario
    assert run(tiny, "--out", "out", "--resume") == 2  # without --unset: another one
    assert "groups.group_size 10 -> 4" in error_line(capsys)


def test_unset_an_unknown_key_is_refused_naming_it(tiny, capsys):
    assert run(tiny, "--out", "out", "--unset", "groups.group_siz") == 2
    assert error_line(capsys) == (
        "p2pdp: error: --unset groups.group_siz: unknown key 'groups.group_siz'; did you mean "
        "'groups.group_size'?"
    )


def test_split_takes_unset_too(tiny, capsys):
    assert main(["split", tiny, "--hosts", "2", "--out", "shards", "--unset", "seed"]) == 0
    assert main(["split", tiny, "--hosts", "2", "--out", "shards", "--unset", "sed"]) == 2
    assert "--unset sed: unknown key 'sed'; did you mean 'seed'?" in error_line(capsys)


def test_unset_a_key_the_file_does_not_set_is_refused(tiny, capsys):
    assert run(tiny, "--out", "out", "--unset", "privacy.epsilon") == 2
    line = error_line(capsys)
    assert "--unset privacy.epsilon: tiny.toml does not set privacy.epsilon" in line
    assert "already has its default (1.0)" in line


def test_unset_a_swept_key_takes_it_out_of_the_sweep_at_its_default():
    scenario = parse_scenario(TINY, unset=["publication.mode"])
    assert scenario.axes == ()
    assert [p.config.publication.mode for p in scenario.points] == ["full"]  # the default
    zipped = TINY.replace(
        '"publication.mode" = ["group", "full"]',
        '"privacy.epsilon,privacy.epsilon_per_aggregation" = [[1, 0.5], [10, 5]]',
    )
    scenario = parse_scenario(zipped, unset=["privacy.epsilon_per_aggregation"])
    # its zipped partner stays swept, as with a plain --set
    assert [a.keys for a in scenario.axes] == [("privacy.epsilon",)]
    assert {p.config.privacy.step_epsilon for p in scenario.points} == {0.1}
    with pytest.raises(ConfigError, match=r"^--unset privacy.epsilon: .*still swept on its own"):
        parse_scenario(zipped, unset=["privacy.epsilon"])  # 5 > the default epsilon 1


def test_unset_a_top_level_setting():
    assert parse_scenario(TINY, unset=["seed"]).config.seed == 0  # the default
    with pytest.raises(ConfigError, match=r"does not set repetitions, .* default \(1\)"):
        parse_scenario(TINY, unset=["repetitions"])


def test_set_applies_after_unset():
    scenario = parse_scenario(TINY, unset=["groups.group_size"], overrides=["groups.group_size=2"])
    assert scenario.config.groups.group_size == 2


# --- switching protocol.name ------------------------------------------------------------------
def test_switching_protocol_drops_the_file_settings_it_does_not_read_with_a_note(tiny, capsys):
    assert run(tiny, "--out", "out", *sets("protocol.name=dpsgd", *DPSGD)) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert (
        "p2pdp: note: groups.group_size = 4 is read only with protocol.name = 'one-shot' (here "
        "'dpsgd'): dropped, its default applies (--unset groups.group_size drops it without this "
        "note)"
    ) in notes
    (row,) = read_results("out")  # publication.mode, swept, is noted and collapses too
    assert row["protocol.name"] == "dpsgd" and row["groups.group_size"] == ""
    dropped = load_scenario(tiny, ["protocol.name=dpsgd", *DPSGD])
    unset = load_scenario(tiny, ["protocol.name=dpsgd", *DPSGD], ["groups.group_size"])
    assert dropped.digest == unset.digest and unset.dropped == ()  # the same scenario
    assert dropped.dropped and dropped.config.groups.group_size == 10


def test_a_set_setting_the_new_protocol_does_not_read_is_still_refused(tiny, capsys):
    argv = sets("protocol.name=dpsgd", *DPSGD, "groups.group_size=3")
    assert run(tiny, "--out", "out", *argv) == 2
    line = error_line(capsys)
    assert "--set groups.group_size=3: groups.group_size = 3 is read only with" in line


def test_a_file_setting_its_own_cells_do_not_read_is_still_refused(tiny, capsys):
    text = TINY.replace("n_peers = 10", "n_peers = 10\nalpha = 0.01")  # iid: alpha unread
    with pytest.raises(ConfigError, match=r"^tiny.toml: partition.alpha = 0.01 is read only"):
        parse_scenario(text, source="tiny.toml", overrides=["seed=3"])


# --- --resume with more folds -----------------------------------------------------------------
def without_timing(rows, *also):
    return [
        {k: v for k, v in r.items() if not k.startswith("wall_") and k not in also} for r in rows
    ]


def test_resume_adds_folds_keeping_the_old_rows_and_recording_the_change(tiny, capsys):
    assert run(tiny, "--out", "out") == 0
    before = open("out/results.csv").read().splitlines()
    old_hash = json.loads(open("out/manifest.json").read())["scenario_hash"]
    capsys.readouterr()
    assert run(tiny, "--out", "out", *sets("evaluation.folds=[0,2]"), "--resume") == 0
    assert "2 run, 2 already done" in capsys.readouterr().out
    after = open("out/results.csv").read().splitlines()
    assert set(before) <= set(after) and len(after) == len(before) + 2  # byte-identical rows
    manifest = json.loads(open("out/manifest.json").read())
    assert manifest["cell_ids"] == ["p0-f0-r0", "p0-f2-r0", "p1-f0-r0", "p1-f2-r0"]
    assert manifest["overrides"] == ["evaluation.folds=[0,2]"]
    (change,) = manifest["changes"]
    assert change["change"] == "evaluation.folds [0] -> [0, 2]"
    assert change["scenario_hash"] == old_hash and change["session"] == 1
    # the new cells are those a run of both folds makes, the report one point per mode
    assert run(tiny, "--out", "both", *sets("evaluation.folds=[0,2]")) == 0
    folds = "evaluation.folds"
    assert without_timing(read_results("out"), folds) == without_timing(read_results("both"), folds)
    assert open("out/roc.csv").read() == open("both/roc.csv").read()
    assert "Swept: `publication.mode`." in open("out/report.md").read()
    capsys.readouterr()
    assert run(tiny, "--out", "out", *sets("evaluation.folds=[0,2]"), "--resume") == 0
    assert "0 run, 4 already done" in capsys.readouterr().out  # the folder's scenario now


@pytest.mark.parametrize(
    ("overrides", "resume", "message"),
    [
        (
            ["evaluation.folds=[0,2]"],
            False,
            re.escape(
                "--out out already holds results of this scenario with fewer folds "
                "(evaluation.folds [0] -> [0, 2]); use --resume to run the new folds' cells, or "
                "--force to discard them"
            ),
        ),
        (
            ["evaluation.folds=[0,2]", "seed=3"],
            True,
            "'tiny' from tiny.toml, hash .*: seed 11 -> 3; evaluation.folds \\[0\\] -> \\[0, 2\\]; "
            "--resume can only add folds \\(evaluation.folds\\); use another --out, or --force",
        ),
        (
            ['sweep."publication.mode"=["full","group"]'],
            True,
            "sweep order|sweep.\"publication.mode\" \\['group', 'full'\\] -> \\['full', 'group'\\]",
        ),
        (
            ["evaluation.folds=[2]"],
            True,
            "evaluation.folds \\[0\\] -> \\[2\\]: the folder holds cells of folds \\[0\\] that it "
            "leaves out; --resume can only add folds",
        ),
        (
            ["evaluation.cv_folds=12", "evaluation.folds=[0,11]"],
            True,
            "evaluation.cv_folds 4 -> 12",
        ),
    ],
    ids=["no-resume", "seed", "sweep-order", "fewer-folds", "cv-folds"],
)
def test_resume_refuses_any_other_change_saying_what_changed(
    tiny, capsys, overrides, resume, message
):
    assert run(tiny, "--out", "out") == 0
    results = open("out/results.csv").read()
    capsys.readouterr()
    assert run(tiny, "--out", "out", *sets(*overrides), *(["--resume"] * resume)) == 2
    line = error_line(capsys)
    assert re.search(message, line), line
    assert open("out/results.csv").read() == results


def test_adding_folds_that_rename_the_cells_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.toml").write_text(TINY.replace("cv_folds = 4", "cv_folds = 12"))
    assert run("t.toml", "--out", "out") == 0
    capsys.readouterr()
    assert run("t.toml", "--out", "out", *sets("evaluation.folds=[0,11]"), "--resume") == 2
    assert "first old one missing: p0-f0-r0: a fold number with more digits" in error_line(capsys)
