"""Every example of the guide's "Extending p2pdp" pages runs as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from p2pdp.experiments.cli import main
from p2pdp.experiments.results.files import read_results
from tests.docs_pages import page

BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)


def _section() -> str:
    """The guide's "Extending p2pdp" pages: the shared scenario, then one page per kind."""
    names = ["index", "mechanism", "accountant", "ensemble", "sampler", "model", "task", "protocol"]
    return "\n\n".join(page(f"extending/{name}") for name in names)


def _blocks() -> list[tuple[str, str]]:
    return [(kind, body) for kind, body in BLOCK.findall(_section())]


def _files() -> dict[str, str]:
    """Code blocks whose first line names a file (``# my_noise.py``)."""
    files = {}
    for kind, body in _blocks():
        first = body.splitlines()[0]
        if kind in ("python", "toml") and re.fullmatch(r"# [\w.]+\.(py|toml)", first):
            files[first[2:]] = body
    return files


COMMANDS = [body.strip() for kind, body in _blocks() if kind == "bash"]


def test_the_section_has_an_example_for_every_kind():
    text = _section()
    for key in (
        "privacy.mechanism",
        "privacy.accountant",
        "evaluation.vote",
        "groups.sampler",
        "training.model",
        "task.name",
        "data.dataset",
        "protocol.name",
    ):
        assert key in text
    assert len(COMMANDS) >= 6 and "my_scenario.toml" in _files()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: re.findall(r"--out (\S+)", c)[0])
def test_readme_extension_example_runs(command, tmp_path, monkeypatch):
    for name, body in _files().items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = shlex.split(command)
    assert args[0] == "PYTHONPATH=."  # the modules sit next to the scenario
    args = args[1:]
    assert args[0] == "p2pdp"
    assert main([*args[1:], "--jobs", "1"]) == 0
    out = Path(args[args.index("--out") + 1])
    rows = read_results(out)
    assert rows and int(rows[0]["aggregations"]) > 0
    for key, value in re.findall(r"--set '?([\w.]+)=\"?([^\"' ]+)", command):
        # every row that read the setting has it (a protocol sweep leaves it empty elsewhere)
        values = [row[key] for row in rows if row[key] != ""]
        assert values and all(v == value or float(v) == float(value) for v in values), key
