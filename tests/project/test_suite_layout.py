"""The test suite's own layout: tests mirror the packages, and one factory builds tiny configs.

A test file lives in the folder of what it tests (``tests/<package>/`` for each package of
``p2pdp``, ``tests/project/`` for the README, guide and layout, ``tests/benchmarks/`` for the
scripts in ``benchmarks/``); only the shared files stay at the top. Every folder is a package,
so equal file names in two folders cannot clash.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pdp.core.errors import ConfigError
from tests.conftest import TINY_SCENARIO, tiny_config

TESTS = Path(__file__).resolve().parents[1]
PACKAGE = TESTS.parent / "p2pdp"
#: Folders of tests/ that mirror no package of p2pdp, and what they check.
OTHER_FOLDERS = {"project": "README, guide, layout, markers", "benchmarks": "benchmarks/"}
#: Files at the top of tests/: the shared ones.
TOP = {"__init__.py", "conftest.py", "docs_pages.py"}


def _packages() -> set[str]:
    return {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


def test_every_test_file_is_in_the_folder_of_a_package_or_of_the_project():
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert folders <= _packages() | set(OTHER_FOLDERS), folders - _packages()
    assert {p.name for p in TESTS.glob("*.py")} == TOP
    assert _packages() <= folders, f"no tests for {_packages() - folders}"


def test_every_folder_of_tests_is_a_package():
    folders = {p.parent for p in TESTS.glob("*/test_*.py")} | {TESTS}
    assert not [f.name for f in folders if not (f / "__init__.py").is_file()]


def test_tiny_config_changes_the_keys_it_is_given_and_keeps_the_others():
    config = tiny_config(seed=3, data={"synthetic_test_rows": 50}, partition={"n_peers": 12})
    assert config.seed == 3 and config.partition.n_peers == 12
    assert config.data.synthetic_test_rows == 50
    assert config.data.synthetic_rows == TINY_SCENARIO["data"]["synthetic_rows"]
    assert config.data.dataset == "synthetic"
    # untouched sections are the tiny scenario's; a section object replaces the whole section
    assert tiny_config().data == tiny_config(data={}).data
    whole = tiny_config(data=type(config.data)(dataset="synthetic", synthetic_rows=300))
    assert whole.data.synthetic_rows == 300 and whole.data.synthetic_test_rows != 50


def test_tiny_config_is_validated_as_any_config():
    with pytest.raises(ConfigError, match="n_peers"):
        tiny_config(partition={"n_peers": 0})
