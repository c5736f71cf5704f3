"""Read a results folder: ``p2pdp.results.load(folder)`` and friends (a stable entry point).

What a folder holds, and the code that writes and repairs it, is
:mod:`p2pdp.experiments.results.store` (the readers: :mod:`p2pdp.experiments.results.files`);
this module re-exports the functions that read one,
under the path users have written since p2pdp 0.1 (the package's deliberate public API, not a
shim).
"""

from __future__ import annotations

from p2pdp.experiments.results.files import (
    incomplete_cells,
    load,
    read_manifest,
    read_results,
    read_roc,
)

__all__ = ["incomplete_cells", "load", "read_manifest", "read_results", "read_roc"]
