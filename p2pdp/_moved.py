"""Import paths of the flat layout (p2pdp 0.1), kept for one release with a DeprecationWarning.

p2pdp 0.2 moved every module into a package per concept (see the user guide's "Code layout").
Scenario files and scripts written for 0.1 name modules such as ``p2pdp.mechanisms`` (in an
import string ``"p2pdp.mechanisms:VectorLaplace"``) or ``p2pdp.learning.LogisticModel``. They keep
working until 0.3: importing an old module path returns the module at its new home and warns
once, naming it; an old module whose path is now a package (``p2pdp.learning``,
``p2pdp.tasks.logistic``, ...) forwards its old names to the module that holds them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

#: Old module -> its new home (modules of 0.1 that no longer exist under their old name).
MOVED: dict[str, str] = {
    "p2pdp.errors": "p2pdp.core.errors",
    "p2pdp.rng": "p2pdp.core.rng",
    "p2pdp.validation": "p2pdp.core.validation",
    "p2pdp.boundary": "p2pdp.core.boundary",
    "p2pdp.components": "p2pdp.core.components",
    "p2pdp.mechanisms": "p2pdp.privacy.mechanisms",
    "p2pdp.events": "p2pdp.privacy.events",
    "p2pdp.accounting": "p2pdp.privacy.accounting",
    "p2pdp.gdp": "p2pdp.privacy.gdp",
    "p2pdp.secure_aggregation": "p2pdp.privacy.secure_aggregation",
    "p2pdp.release": "p2pdp.privacy.release",
    "p2pdp.posterior": "p2pdp.privacy.posterior_sampling.posterior",
    "p2pdp.posterior_mechanism": "p2pdp.privacy.posterior_sampling.mechanism",
    "p2pdp.posterior_audit": "p2pdp.privacy.posterior_sampling.audit",
    "p2pdp.posterior_example": "p2pdp.privacy.posterior_sampling.example",
    "p2pdp.datasets": "p2pdp.data.datasets",
    "p2pdp.preprocess": "p2pdp.data.preprocess",
    "p2pdp.partition": "p2pdp.data.partition",
    "p2pdp.ensembles": "p2pdp.learning.ensembles",
    "p2pdp.evaluation": "p2pdp.learning.evaluation",
    "p2pdp.references": "p2pdp.learning.references",
    "p2pdp.overlay": "p2pdp.sim.overlay",
    "p2pdp.pipeline": "p2pdp.tasks.pipeline",
    "p2pdp.prevalence": "p2pdp.tasks.prevalence.estimators",
    "p2pdp.pooling": "p2pdp.tasks.pooled_testing.pooling",
    "p2pdp.task_settings": "p2pdp.config",
    "p2pdp.scenario": "p2pdp.experiments.scenarios.scenario",
    "p2pdp.simulation": "p2pdp.experiments.run.simulation",
    "p2pdp.experiment": "p2pdp.experiments.run.runner",
    "p2pdp.report": "p2pdp.experiments.report.write",
    "p2pdp.disclosure": "p2pdp.experiments.scenarios.disclosure",
    "p2pdp.cli": "p2pdp.experiments.cli",
}

#: Old modules split between several new ones: their names are looked up in this order.
SPLIT: dict[str, tuple[str, ...]] = {
    "p2pdp.audit": (
        "p2pdp.experiments.audit.table",
        "p2pdp.privacy.audit",
        "p2pdp.tasks.prevalence.audit",
        "p2pdp.tasks.pooled_testing.audit",
    ),
    "p2pdp.figures_prevalence": (
        "p2pdp.tasks.pooled_testing.figures",
        "p2pdp.tasks.prevalence.figures",
        "p2pdp.core.figures",
    ),
    "p2pdp.figures_tasks": (
        "p2pdp.tasks.prevalence.figures",
        "p2pdp.tasks.pooled_testing.figures",
        "p2pdp.core.figures",
    ),
}

#: Old modules whose path still exists (a package now, or a slimmer module): the names they no
#: longer define are looked up in these, with a warning.
FORWARDED: dict[str, tuple[str, ...]] = {
    "p2pdp.learning": ("p2pdp.learning.models",),
    "p2pdp.tasks.logistic": ("p2pdp.tasks.logistic.task",),
    "p2pdp.tasks.prevalence": ("p2pdp.tasks.prevalence.task",),
    "p2pdp.tasks.pooled_testing": ("p2pdp.tasks.pooled_testing.task",),
    "p2pdp.results": ("p2pdp.experiments.results.store", "p2pdp.core.figures", "p2pdp.core.files"),
}


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new} in p2pdp 0.2; the old path works until 0.3",
        DeprecationWarning,
        stacklevel=3,
    )


class _Loader(importlib.abc.Loader):
    """Loads an old module path as the module at its new home (the same object)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn(spec.name, self.new)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


def _lookup(old: str, homes: tuple[str, ...], name: str) -> tuple[str, Any]:
    """``name`` of old module ``old`` in the first of its new ``homes`` that defines it."""
    for home in homes:
        value = getattr(importlib.import_module(home), name, _MISSING)
        if value is not _MISSING:
            return home, value
    raise AttributeError(f"module {old!r} has no attribute {name!r}")


_MISSING = object()


class _SplitLoader(importlib.abc.Loader):
    """Loads an old module that was split as a module whose names come from its new homes."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        homes = SPLIT[spec.name]
        _warn(spec.name, " and ".join(homes))
        module = ModuleType(spec.name, f"Moved in p2pdp 0.2 to {', '.join(homes)}.")
        module.__getattr__ = lambda name: _lookup(spec.name, homes, name)[1]  # type: ignore[method-assign]
        return module

    def exec_module(self, module: ModuleType) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of :data:`MOVED` and :data:`SPLIT` (and nothing else)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name in SPLIT:
            return importlib.util.spec_from_loader(name, _SplitLoader())
        new = MOVED.get(name)
        if new is None:
            return None
        return importlib.util.spec_from_loader(name, _Loader(new))


def install() -> None:
    """Make the old module paths importable (once per process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())


def forwarding(old: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old`` forwarding the 0.1 names it no longer defines."""
    homes = FORWARDED[old]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        module = sys.modules[old]
        if hasattr(module, "__path__") and importlib.util.find_spec(f"{old}.{name}"):
            return importlib.import_module(f"{old}.{name}")  # a module of the package
        home, value = _lookup(old, homes, name)
        _warn(f"{old}.{name}", f"{home}.{name}")
        return value

    return __getattr__
