"""Exception and warning types of p2pdp.

Every error message names the offending field and value, e.g.
``ConfigError("privacy.epsilon must be > 0, got -1")``.
"""

from __future__ import annotations


class P2PDPError(Exception):
    """Base class of every error raised on purpose by p2pdp."""


class ConfigError(P2PDPError, ValueError):
    """A configuration value or function argument is invalid.

    Subclasses ``ValueError`` so generic callers can catch it as such.
    """


class DataError(P2PDPError):
    """A data file is missing, corrupted or does not match its manifest."""


class ComponentError(P2PDPError):
    """A component (built-in or a user's plug-in) broke its protocol: it raised, or returned
    something the engine cannot use (NaN, the wrong shape or type). The message names the
    component by import string, the method and what was wrong (:mod:`p2pdp.core.boundary`).
    """


class NetworkRunError(P2PDPError, RuntimeError):
    """A run of the network runtime cannot go on: a host process exited or never connected
    while it started. The message names each host and the command that started it."""


class ClusterLostError(P2PDPError):
    """The Dask scheduler of a run (``--scheduler``) went away mid-run: the cells that
    finished are kept, ``p2pdp run ... --resume`` runs the others."""


class BudgetExhaustedError(P2PDPError):
    """A peer was asked to spend more privacy budget than it has left."""


class PrivacyWarning(UserWarning):
    """A mechanism is used in a way whose guarantee is weaker than it looks.

    Example: the seed's per-coordinate Laplace calibrated on an L2 sensitivity is only
    ``sqrt(d) * epsilon``-DP.
    """
