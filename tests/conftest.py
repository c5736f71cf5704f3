"""Shared pytest fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def real_data_home() -> Iterator[Path]:
    """Directory of the real data files, also exported as ``P2PDP_DATA_HOME`` while in use.

    ``$P2PDP_DATA_HOME`` if set (as in CI), else ``<work>/shared/datasets`` next to the repo.
    """
    env = os.environ.get("P2PDP_DATA_HOME")
    home = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"
    assert home.is_dir(), f"real data sets not found: set P2PDP_DATA_HOME (tried {home})"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("P2PDP_DATA_HOME", str(home))
        yield home
