"""Markers mean what they say: `slow` selects the long tests, `integration` the data-hungry ones.

Each test starts a separate pytest on a small tree, with this suite's conftest, so that the
collection hooks run as they do for a user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

USES_DATA = """
def test_reads_the_data(real_data_home):
    assert (real_data_home / "spambase.data").is_file()

def test_needs_nothing():
    assert True
"""


def run_pytest(directory: Path, *args: str, **env: str | None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "P2PDP_DATA_HOME"}
    environment.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
        cwd=directory,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def small_suite(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True)
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers\nmarkers =\n    slow: long\n    integration: data\n"
    )
    (tmp_path / "test_data.py").write_text(USES_DATA)
    return tmp_path


def test_without_data_integration_tests_skip_with_one_reason(tmp_path):
    suite = small_suite(tmp_path / "suite")
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    result = run_pytest(suite, XDG_CACHE_HOME=str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 skipped" in result.stdout
    (skipped,) = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped.startswith("SKIPPED [1] test_data.py")
    assert "real data sets not found: set P2PDP_DATA_HOME to a folder holding" in skipped
    assert list(cache.iterdir()) == []  # nothing downloaded


def test_a_test_using_the_data_is_marked_integration(request, real_data_home):
    assert request.node.get_closest_marker("integration") is not None


def test_a_broken_data_home_stops_the_run_with_one_message(tmp_path):
    suite = small_suite(tmp_path / "suite")
    result = run_pytest(suite, P2PDP_DATA_HOME=str(tmp_path))
    assert result.returncode != 0
    assert f"$P2PDP_DATA_HOME={tmp_path} lacks a9a" in result.stderr


def test_slow_marks_the_full_scenario_runs_and_is_off_by_default():
    from tests.project import test_headlines

    marks = {m.name for m in test_headlines.test_headline_numbers_from_a_full_run.pytestmark}
    assert {"slow", "integration"} <= marks
    assert len(test_headlines.HEADLINES) == len(list((TESTS.parent / "scenarios").glob("*.toml")))
    pyproject = (TESTS.parent / "pyproject.toml").read_text()
    assert "-m 'not slow'" in pyproject.split("addopts = ")[1].splitlines()[0]
