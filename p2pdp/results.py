"""Read a results folder: ``p2pdp.results.load(folder)`` and friends (a stable entry point).

What a folder holds, and the code that writes and repairs it, is
:mod:`p2pdp.experiments.results`; this module re-exports the functions that read one, under the
path users have written since p2pdp 0.1.
"""

from __future__ import annotations

import importlib
from typing import Any

from p2pdp.experiments.results import (
    incomplete_cells,
    load,
    read_manifest,
    read_results,
    read_roc,
)

__all__ = ["incomplete_cells", "load", "read_manifest", "read_results", "read_roc"]


def __getattr__(name: str) -> Any:
    """The rest of the 0.1 module (``ResultsStore``, ``write_figure``, ...), with a warning."""
    from p2pdp._moved import SPLIT, _warn

    for home in SPLIT["p2pdp.results"]:
        module = importlib.import_module(home)
        if hasattr(module, name):
            _warn(f"p2pdp.results.{name}", f"{home}.{name}")
            return getattr(module, name)
    raise AttributeError(f"module 'p2pdp.results' has no attribute {name!r}")
