"""Exception and warning types of p2pdp.

Every error message names the offending field and value, e.g.
``ConfigError("privacy.epsilon must be > 0, got -1")``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from types import ModuleType
from typing import Any


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


def moved_into_modules(package: str) -> Callable[[str], Any]:
    """A package's module-level ``__getattr__`` for a module that became a package of that
    name (p2pdp 0.3: ``p2pdp.experiments.report``, ``.results``, ``.audit``, ``.network``).

    ``from package import name`` for a public ``name`` that one of its modules defines raises
    an ImportError naming that module (the package does not forward it: its old users are
    told where it went, once, instead of "cannot import name"), not one that only imports it
    from there; any other name is the usual AttributeError. Modules are imported only on
    this error path.
    """

    def __getattr__(name: str) -> Any:
        if not name.startswith("_"):
            parent = importlib.import_module(package)
            holders = [
                importlib.import_module(f"{package}.{found.name}")
                for found in pkgutil.iter_modules(parent.__path__)
                if found.name != "__main__"
            ]
            holders = [module for module in holders if name in vars(module)]
            if holders:
                home = next((m for m in holders if _defines(m, name)), holders[0])
                raise ImportError(
                    f"{package} has no {name!r}: since p2pdp 0.3 it is "
                    f"{home.__name__}.{name} (CHANGELOG.md lists the moves)",
                    name=package,
                )
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def _defines(module: ModuleType, name: str) -> bool:
    """Whether ``module`` defines ``name`` (a function or class made there, or a top-level
    ``def``, ``class`` or assignment in its source), rather than importing it."""
    value = vars(module)[name]
    if inspect.isfunction(value) or inspect.isclass(value):
        return value.__module__ == module.__name__
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):  # no source: take it as its home
        return True
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound = [node.name]
        elif isinstance(node, ast.Assign):  # a = ..., a, b = ...
            targets = [e for t in node.targets for e in getattr(t, "elts", [t])]
            bound = [t.id for t in targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound = [node.target.id]
        else:
            continue
        if name in bound:
            return True
    return False
