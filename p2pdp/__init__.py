"""p2pdp: simulator for decentralized peer-to-peer federated learning with differential privacy.

The one-call API is :func:`p2pdp.simulate` (one fold of a scenario); sweeps of scenario files
are run by :mod:`p2pdp.experiments.run.runner` and the ``p2pdp`` command.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.3.0.dev0"
__all__ = ["__version__", "simulate"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `p2pdp --version` and `p2pdp datasets` stay fast.
    if name == "simulate":
        from p2pdp.experiments.run.simulation import simulate

        return simulate
    raise AttributeError(f"module 'p2pdp' has no attribute {name!r}")
