"""Every command the documentation shows parses with the real CLI, and the cheap ones run.

Commands come from the ```bash blocks of README.md and every guide page (``&&`` chains and
``# or: ...`` comments included) and from their inline ``--set`` examples, which must load on
every shipped scenario.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from p2pdp.config import setting_value, settings_read
from p2pdp.core.errors import ConfigError
from p2pdp.experiments.cli import build_parser, main
from p2pdp.experiments.scenarios.scenario import load_scenario, shipped_scenarios_dir
from tests.docs_pages import all_text, page

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
README = all_text()  # README.md and the user guide
SHIPPED = sorted(p.stem for p in shipped_scenarios_dir().glob("*.toml"))


def readme_commands() -> list[list[str]]:
    """Every shell command of the README's bash blocks, as argv lists."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("#"):
                continue
            code, _, comment = line.partition(" #")
            alternatives = re.findall(r"\bor: (p2pdp .*)", comment)
            for part in [*code.split("&&"), *alternatives]:
                if part.strip():
                    argv = shlex.split(part)
                    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # VAR=value prefix
                        argv = argv[1:]
                    commands.append(argv)
    return commands


#: Files the README itself defines in code blocks whose first line names them (``# mine.toml``);
#: the examples that use them are run by tests/project/test_readme_extending.py and
#: tests/data/test_own_data.py.
README_FILES = set(re.findall(r"```\w+\n# ([\w.]+\.(?:toml|py))\n", README))
COMMANDS = readme_commands()
P2PDP = [argv for argv in COMMANDS if argv[0] == "p2pdp"]


def _on_readme_file(argv: list[str]) -> bool:
    return len(argv) > 2 and argv[1] == "run" and argv[2] in README_FILES


def test_the_readme_shows_commands():
    assert len(P2PDP) >= 5
    assert {argv[1] for argv in P2PDP} >= {"run", "datasets"}


@pytest.mark.parametrize("argv", COMMANDS, ids=shlex.join)
def test_every_readme_command_parses(argv):
    if argv[0] == "p2pdp":
        args = build_parser().parse_args(argv[1:])  # SystemExit (a failure) if it does not
        if args.command == "run" and not _on_readme_file(argv):
            load_scenario(args.scenario, args.overrides, args.unset)
    elif argv[0] == "pip":
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]
        target = argv[-1]
        assert target.startswith("."), argv
        for extra in re.findall(r"\[(.*?)\]", target):
            assert set(extra.split(",")) <= set(extras), argv
    elif argv[0] == "python":
        if argv[1] == "-m":
            assert argv[2] == "pytest", argv
        else:
            assert (ROOT / argv[1]).is_file(), argv
    elif argv[0] == "export":
        assert argv[1].startswith("P2PDP_DATA_HOME="), argv
    elif argv[0] == "sphinx-build":
        assert (ROOT / argv[-2] / "conf.py").is_file(), argv  # the source folder
    elif argv[0] == "mypy":
        assert "mypy" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"], argv
    else:
        pytest.fail(f"README command of unknown kind: {shlex.join(argv)}")


INLINE_SETS = sorted(
    set(re.findall(r"`--set ('[^']+'|[^\s`]+)`", README)) - {"KEY=VALUE"}  # the placeholder
)


def test_the_readme_has_inline_set_examples():
    assert "'sweep.\"privacy.epsilon\"=[0.1,1]'" in INLINE_SETS


@pytest.mark.parametrize("scenario", SHIPPED)
@pytest.mark.parametrize("example", INLINE_SETS)
def test_inline_set_examples_load_on_every_shipped_scenario(example, scenario):
    (override,) = shlex.split(example)
    if scenario == "posterior_vs_output_perturbation" and override.startswith("groups.group_size"):
        # posterior sampling needs groups of one: a larger group is refused, not run
        with pytest.raises(ConfigError, match=r"groups\.group_size must be 1"):
            load_scenario(scenario, [override])
        return
    key = override.partition("=")[0]
    try:
        assert load_scenario(scenario, [override]).points
    except ConfigError as exc:  # refused only as a setting none of the scenario's cells reads
        assert not any(key in settings_read(p.config) for p in load_scenario(scenario).points)
        assert re.search(rf"{re.escape(key)} = .* is read only with", str(exc)), exc


def test_datasets_list_runs(capsys):
    assert main(["datasets", "list"]) == 0
    printed = capsys.readouterr().out
    for name in ("spambase", "australian", "adult"):
        assert name in printed


def _point_that_runs_alone(scenario):
    """The first grid point whose settings need no other point (a scenario comparing protocols
    sets some settings only the other protocols read: alone, one point would refuse them)."""
    for point in scenario.points:
        fixed = [
            f'sweep."{key}"=[{_toml(setting_value(point.config, key))}]'
            for key in scenario.swept_keys()
        ]
        try:
            load_scenario(scenario.source, [*scenario.overrides, *fixed])
        except ConfigError:
            continue
        return point
    raise AssertionError(f"no point of {scenario.source} runs alone")


def test_readme_run_commands_run_on_tiny_settings(real_data_home, tmp_path, capsys):
    """Each `p2pdp run` of the README, cut to one fold and one point of its grid."""
    runs = [argv for argv in P2PDP if argv[1] == "run" and not _on_readme_file(argv)]
    assert runs
    for index, argv in enumerate(runs):
        args = build_parser().parse_args(argv[1:])
        scenario = load_scenario(args.scenario, args.overrides, args.unset)
        point = _point_that_runs_alone(scenario)
        tiny = [
            "--out",
            str(tmp_path / str(index)),
            # the network runtime refuses --jobs: its host processes use the cores
            *(["--jobs", "1"] if args.runtime != "network" else ["--hosts", "2"]),
            "--set",
            "evaluation.folds=[0]",
            *(
                f'--set=sweep."{key}"=[{_toml(setting_value(point.config, key))}]'
                for key in scenario.swept_keys()
            ),
            # an iterative run on the network paces its rounds by the wall clock
            *(["--set", "protocol.rounds=3"] if point.config.protocol.iterative else []),
        ]
        without_out = [a for a in argv[1:] if a != "--out" and a != args.out]
        assert main([*without_out, *tiny]) == 0, argv
        assert "cells (1 run" in capsys.readouterr().out


def test_readme_datasets_info_runs(real_data_home, capsys):
    for argv in P2PDP:
        if argv[1] == "datasets" and argv[2] == "info":
            assert main(argv[1:]) == 0
            assert capsys.readouterr().out.strip()


def test_readme_python_example_runs(real_data_home):
    (code,) = re.findall(r"```python\n(.*?)```", page("python-api"), flags=re.DOTALL)
    exec(compile(code, "docs/guide/python-api.md", "exec"), {})


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)
