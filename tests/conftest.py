"""Shared pytest fixtures, and the rule for tests that need the real data sets.

A test needs the real data sets if it uses the ``real_data_home`` fixture (it is then marked
``integration`` automatically) or is marked ``integration``. They are found where the loader
looks after an explicit path: ``$P2PDP_DATA_HOME``, then the user cache
(``$XDG_CACHE_HOME/p2pdp`` or ``~/.cache/p2pdp``). If no such folder holds every file, those
tests are skipped with one reason (nothing is downloaded); if ``$P2PDP_DATA_HOME`` is set but
lacks files, the run stops with an error instead, since that is a broken setup, not a machine
without data. Every other test runs as on a machine without the data: the data homes are hidden
and a download fails the test, so a test that needs the data but lacks the marker fails here
too, not only on a user's machine.

A test that needs a small scenario builds it with :func:`tiny_config`, stating only what it
changes, so the tiny scenario is written once (and a change of the config's shape is made once).
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from p2pdp.config import ScenarioConfig
from p2pdp.data.files import DATA_HOME_ENV, data_home_candidates
from p2pdp.data.manifests import available_datasets, load_manifest

#: Skip reason of every integration test when the data sets are not on this machine.
NO_DATA = (
    "real data sets not found: set P2PDP_DATA_HOME to a folder holding {files} "
    "(or run `p2pdp datasets fetch --all`) to run the integration tests"
)


#: The tiny scenario: synthetic rows (in memory, no data set needed), a few peers, every other
#: setting ScenarioConfig's default. Runs in seconds.
TINY_SCENARIO: dict[str, dict[str, object]] = {
    "data": {"dataset": "synthetic", "synthetic_rows": 600, "synthetic_test_rows": 200},
    "partition": {"n_peers": 20},
}


def tiny_config(**settings: object) -> ScenarioConfig:
    """A small synthetic :class:`~p2pdp.config.ScenarioConfig`: ``TINY_SCENARIO`` and ``settings``.

    A section given as a dict (``partition={"n_peers": 14}``) changes those keys of the tiny
    scenario's section and keeps its others; anything else (``seed=3``, a section object such as
    ``GroupsConfig(group_size=4)``) goes to ``ScenarioConfig`` as given, whose validation names a
    bad key or value.
    """
    sections = {
        name: {**TINY_SCENARIO.get(name, {}), **value} if isinstance(value, Mapping) else value
        for name, value in settings.items()
    }
    return ScenarioConfig(**{**TINY_SCENARIO, **sections})


def required_files() -> list[str]:
    """Every data file the manifests name (spambase.data, australian.dat, a9a, a9a.t)."""
    return [spec.name for name in available_datasets() for spec in load_manifest(name).files]


def find_data_home() -> Path | None:
    """The first of ``$P2PDP_DATA_HOME`` and the user cache that holds every data file."""
    for directory in data_home_candidates():
        if all((directory / name).is_file() for name in required_files()):
            return directory
    return None


@pytest.hookimpl(tryfirst=True)  # before `-m` selects, so `-m "not integration"` sees the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "real_data_home" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Skip (no data) or stop (broken $P2PDP_DATA_HOME) the selected integration tests."""
    needing = [item for item in session.items if item.get_closest_marker("integration")]
    if not needing or find_data_home() is not None:
        return
    env = os.environ.get(DATA_HOME_ENV)
    if env:
        missing = [name for name in required_files() if not (Path(env) / name).is_file()]
        raise pytest.UsageError(
            f"${DATA_HOME_ENV}={env} lacks {', '.join(missing)}; point it at the folder with "
            f"the data sets, or unset it to skip the {len(needing)} integration tests"
        )
    skip = pytest.mark.skip(reason=NO_DATA.format(files=", ".join(required_files())))
    for item in needing:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def _empty_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("no-data-cache")


def _no_download(url: object, *args: object, **kwargs: object) -> None:
    raise AssertionError(
        f"this test tried to download {url}: it needs the real data sets, so mark it "
        "`integration` (or use the real_data_home fixture)"
    )


@pytest.fixture(autouse=True)
def _without_data_unless_integration(
    request: pytest.FixtureRequest, _empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hide the data sets from tests not marked ``integration`` (see the module docstring)."""
    if request.node.get_closest_marker("integration") is not None:
        return
    monkeypatch.delenv(DATA_HOME_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(_empty_cache))
    monkeypatch.setattr(urllib.request, "urlopen", _no_download)


@pytest.fixture(scope="session")
def real_data_home() -> Iterator[Path]:
    """Directory of the real data files, also exported as ``P2PDP_DATA_HOME`` while in use."""
    home = find_data_home()
    assert home is not None, "integration tests run only with the data (see conftest.py)"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DATA_HOME_ENV, str(home))
        yield home
