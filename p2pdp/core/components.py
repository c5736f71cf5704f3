"""Components by kind: built-ins by name, anything else by import string or entry point.

p2pdp's engine is assembled from components of eight kinds (:data:`KINDS`). Wherever a
scenario names a component (``privacy.mechanism``, ``privacy.accountant``, ``groups.sampler``,
``evaluation.vote``, ``task.name``, ``training.model``, ``data.dataset``, ``protocol.name``)
it accepts

* the name of a registered component (``"vector-laplace"``), or
* an import string ``"package.module:Name"`` (as Hydra's ``_target_`` and Flower's app
  strings), so the TOML stays declarative and a user's own code needs no change to p2pdp.

Installed packages can register components through the entry-point group
``p2pdp.components``: the entry point's name is ``"<kind>.<name>"`` and its value the
object, e.g. in a plug-in's ``pyproject.toml``::

    [project.entry-points."p2pdp.components"]
    "mechanism.my-noise" = "my_package.noise:MyNoise"

What each kind must provide is documented on its protocol:

==========  ====================================================  ======================
kind        protocol                                              config key
==========  ====================================================  ======================
dataset     :class:`p2pdp.data.loaders.DatasetLoader`             ``data.dataset``
model       :class:`p2pdp.learning.models.LocalModel`             ``training.model``
mechanism   :class:`p2pdp.privacy.mechanisms.Mechanism`           ``privacy.mechanism``
accountant  :class:`p2pdp.privacy.accountants.Accountant`         ``privacy.accountant``
sampler     :class:`p2pdp.sim.sampler.GroupSampler`               ``groups.sampler``
ensemble    :class:`p2pdp.learning.rules.EnsembleRule`            ``evaluation.vote``
task        :class:`p2pdp.tasks.Task`                             ``task.name``
protocol    :class:`p2pdp.protocols.iterative.IterativeProtocol`  ``protocol.name``
==========  ====================================================  ======================

Built-ins are listed here as import strings, so naming one in a config imports nothing;
resolving it (to read what it declares it reads, :mod:`p2pdp.core.reads`) imports its module.
"""

from __future__ import annotations

import difflib
import importlib
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from p2pdp.core.errors import ConfigError

#: Every kind of component, with a one-line description.
KINDS: dict[str, str] = {
    "dataset": "where the rows come from: a loader returning (X, y) or (X, y, X_test, y_test)",
    "model": "the local learner every peer trains on its own shard",
    "mechanism": "the noise a group's release gets, calibrated to the release's sensitivity",
    "accountant": "how a peer's releases compose into the (epsilon, delta) it has spent",
    "sampler": "how groups form (who aggregates with whom, and who curates)",
    "ensemble": "the rule a peer classifies with, from its own and the published models",
    "task": "what peers compute, how groups aggregate it, and how results are scored",
    "protocol": "how peers learn from what they receive: one-shot groups or iterative rounds",
}

#: Entry-point group through which installed packages register components.
ENTRY_POINT_GROUP = "p2pdp.components"

_IMPORT_STRING = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True, slots=True)
class Component:
    """A registered component: ``kind``, ``name``, the import string of its object, a summary."""

    kind: str
    name: str
    target: str
    description: str
    origin: str = "built-in"


_BUILTINS: tuple[Component, ...] = tuple(
    Component(kind, name, target, description)
    for kind, name, target, description in (
        (
            "dataset",
            "spambase",
            "p2pdp.data.benchmarks:spambase",
            "UCI Spambase, 4,601 e-mails x 57",
        ),
        (
            "dataset",
            "australian",
            "p2pdp.data.benchmarks:australian",
            "Statlog Australian credit, 690 x 14",
        ),
        (
            "dataset",
            "adult",
            "p2pdp.data.benchmarks:adult",
            "Adult as LIBSVM a9a/a9a.t, 32,561 + 16,281 x 123",
        ),
        (
            "dataset",
            "synthetic",
            "p2pdp.data.synthetic:synthetic",
            "logistic model with lognormal features, sized by data.synthetic_*",
        ),
        (
            "dataset",
            "csv",
            "p2pdp.data.own_files:csv_file",
            "your own CSV file at data.path (label last)",
        ),
        (
            "dataset",
            "libsvm",
            "p2pdp.data.own_files:libsvm_file",
            "your own LIBSVM file at data.path",
        ),
        (
            "dataset",
            "numpy",
            "p2pdp.data.own_files:numpy_file",
            "your own .npz (arrays X, y) or .npy (label last) file at data.path",
        ),
        (
            "model",
            "logistic",
            "p2pdp.learning.models:LogisticModel",
            "L2-regularised logistic regression solved exactly (batched Newton)",
        ),
        (
            "mechanism",
            "vector-laplace",
            "p2pdp.privacy.mechanisms:VectorLaplace",
            "epsilon-DP, density ~ exp(-eps ||eta||_2 / Delta_2) (Gamma norm)",
        ),
        (
            "mechanism",
            "coordinate-laplace",
            "p2pdp.privacy.mechanisms:CoordinateLaplace",
            "epsilon-DP, iid Laplace(sqrt(d) Delta_2 / eps); splittable",
        ),
        (
            "mechanism",
            "gaussian",
            "p2pdp.privacy.mechanisms:Gaussian",
            "(epsilon, delta)-DP, analytic Gaussian calibration; splittable",
        ),
        (
            "mechanism",
            "seed-laplace",
            "p2pdp.privacy.mechanisms:SeedLaplace",
            "the seed's Laplace(Delta_2 / eps) per coordinate: only sqrt(d)*epsilon-DP",
        ),
        (
            "mechanism",
            "none",
            "p2pdp.privacy.mechanisms:NoNoise",
            "no noise: NOT private (tests only)",
        ),
        (
            "mechanism",
            "local",
            "p2pdp.privacy.mechanisms:LocalRandomization",
            "privacy applied by each peer before sharing (local DP tasks); adds nothing",
        ),
        (
            "mechanism",
            "pooled-test",
            "p2pdp.tasks.pooled_testing.task:PooledTest",
            "pooled testing: the pool's imperfect test result (Se, Sp), optional RR",
        ),
        (
            "accountant",
            "basic",
            "p2pdp.privacy.accountants:BasicAccountant",
            "sequential composition: k releases cost k epsilon and k delta",
        ),
        (
            "accountant",
            "rdp",
            "p2pdp.privacy.accountants:RdpAccountant",
            "Renyi DP of the Gaussian mechanism, converted to (epsilon, delta)",
        ),
        (
            "accountant",
            "gdp",
            "p2pdp.privacy.accountants:GdpAccountant",
            "exact Gaussian composition (mu = sqrt(k)/z GDP); default for gaussian",
        ),
        (
            "accountant",
            "pld",
            "p2pdp.privacy.pld:PldAccountant",
            "privacy loss distributions (dp-accounting); default for Poisson-sampled steps",
        ),
        (
            "mechanism",
            "posterior-sampling",
            "p2pdp.privacy.posterior_sampling.mechanism:PosteriorSampling",
            "a peer's private posterior sample (logistic, g = 1); epsilon-DP for exact sampling",
        ),
        (
            "sampler",
            "central",
            "p2pdp.sim.central:CentralSampler",
            "the seed's GroupAgent: uniform disjoint groups of idle solvent peers",
        ),
        (
            "sampler",
            "gossip",
            "p2pdp.sim.gossip:GossipSampler",
            "Newscast views over an overlay, invite/lock, commit-reveal curator election",
        ),
        (
            "ensemble",
            "majority",
            "p2pdp.learning.rules:MajorityVote",
            "majority of the signs of every model held (the seed's rule)",
        ),
        (
            "ensemble",
            "mean-margin",
            "p2pdp.learning.rules:MeanMargin",
            "sign of the mean margin of every model held",
        ),
        (
            "ensemble",
            "majority-own",
            "p2pdp.learning.rules:MajorityOwnTie",
            "majority of the signs of every model held, a tied vote goes to the own model",
        ),
        (
            "ensemble",
            "average",
            "p2pdp.learning.rules:AverageRule",
            "inverse-noise-variance average of the received models, shrunk to the own model",
        ),
        (
            "ensemble",
            "local-validated",
            "p2pdp.learning.rules:LocalValidatedRule",
            "own model mixed with the received average, the mix validated on the own shard",
        ),
        (
            "task",
            "logistic",
            "p2pdp.tasks.logistic.task:LogisticEnsembles",
            "core workload: local logistic models averaged with noise, ensembles per peer",
        ),
        (
            "task",
            "prevalence-counts",
            "p2pdp.tasks.prevalence.task:PrevalenceCounts",
            "central DP: Laplace counts of binary records per group, Beta posteriors per peer",
        ),
        (
            "task",
            "randomized-response",
            "p2pdp.tasks.prevalence.task:RandomizedResponseCounts",
            "local DP: records answered by randomized response, yes counts summed",
        ),
        (
            "task",
            "pooled-testing",
            "p2pdp.tasks.pooled_testing.task:PooledTesting",
            "pooled testing: each peer one person, groups are pools, prevalence by the pooled MLE",
        ),
        (
            "protocol",
            "one-shot",
            "p2pdp.protocols:OneShot",
            "the seed's protocol: each peer trains once, groups publish noisy averages",
        ),
        (
            "protocol",
            "dpsgd",
            "p2pdp.protocols.iterative:DecentralizedSGD",
            "D-PSGD: a private local step, then one Metropolis-Hastings averaging, per round",
        ),
        (
            "protocol",
            "muffliato",
            "p2pdp.protocols.iterative:Muffliato",
            "noise-then-gossip: a private step, then protocol.gossip_steps averagings",
        ),
        (
            "protocol",
            "gossip-learning",
            "p2pdp.protocols.iterative:GossipLearning",
            "models random-walk the overlay: merge what arrives, then a private step",
        ),
    )
)

_registry: dict[str, dict[str, Component]] = {kind: {} for kind in KINDS}
for _component in _BUILTINS:
    _registry[_component.kind][_component.name] = _component
_entry_points_loaded = False


def load(target: str, *, key: str) -> Any:
    """The object the import string ``target`` names (imported once); ConfigError naming
    ``key`` if it cannot be imported."""
    return _import(target, "", key)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ConfigError(f"component kind must be one of {', '.join(KINDS)}; got {kind!r}")


def is_import_string(value: object) -> bool:
    """True for ``"package.module:Name"`` (a dotted module path, a colon, an attribute path)."""
    return isinstance(value, str) and bool(_IMPORT_STRING.match(value))


def register(kind: str, name: str, target: Any, description: str = "") -> None:
    """Register ``target`` (an object or an import string) as component ``name`` of ``kind``.

    A name registered twice replaces the first (so a test or notebook can re-register).
    ``description`` defaults to the first line of the object's docstring.
    """
    _check_kind(kind)
    if not isinstance(name, str) or not name or ":" in name:
        raise ConfigError(f"component name must be a non-empty string without ':', got {name!r}")
    if isinstance(target, str):
        if not is_import_string(target):
            raise ConfigError(f"component target must be 'package.module:Name', got {target!r}")
        text = target
    else:
        module = getattr(target, "__module__", None)
        qualname = getattr(target, "__qualname__", None)
        if module is None or qualname is None:
            raise ConfigError(f"cannot register {target!r}: it has no module-level name")
        text = f"{module}:{qualname}"
        _imported[text] = target
    summary = description or _first_line(None if isinstance(target, str) else target)
    _registry[kind][name] = Component(kind, name, text, summary, origin="registered")


_imported: dict[str, Any] = {}


def _first_line(obj: Any) -> str:
    doc = getattr(obj, "__doc__", None) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _import(target: str, kind: str, key: str) -> Any:
    if target in _imported:
        return _imported[target]
    module_name, _, attribute = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{key} = {target!r}: cannot import module {module_name!r} ({exc})"
        ) from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"{key} = {target!r}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    _imported[target] = obj
    return obj


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        kind, dot, name = entry.name.partition(".")
        if not dot or kind not in KINDS or not name:
            raise ConfigError(
                f"entry point {entry.name!r} = {entry.value!r} in group {ENTRY_POINT_GROUP!r} "
                f"must be named '<kind>.<name>' with kind one of {', '.join(KINDS)}"
            )
        if name not in _registry[kind]:
            origin = f"entry point ({entry.dist.name})" if entry.dist else "entry point"
            _registry[kind][name] = Component(kind, name, entry.value, "", origin=origin)


def names(kind: str) -> tuple[str, ...]:
    """Registered names of ``kind``, built-ins first."""
    _check_kind(kind)
    _load_entry_points()
    return tuple(_registry[kind])


def is_builtin(kind: str, value: object) -> bool:
    """Whether ``value`` names one of p2pdp's own components of ``kind``."""
    _check_kind(kind)
    return isinstance(value, str) and any(c.name == value for c in _BUILTINS if c.kind == kind)


def check(kind: str, value: object, key: str) -> None:
    """Validate a config value naming a component: a registered name or an importable string.

    A registered name is accepted without importing its module (configs are built often);
    an import string is imported, so a typo fails when the config is built, not mid-run.

    Raises
    ------
    ConfigError
        Naming ``key``, the value, the registered names and the closest one.
    """
    _check_kind(kind)
    _load_entry_points()
    if not (isinstance(value, str) and value in _registry[kind]):
        resolve(kind, value, key=key)


def resolve(kind: str, value: object, *, key: str | None = None) -> Any:
    """The object a config value names: a registered component of ``kind`` or an import string.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    value : str
        A registered name (``"gaussian"``) or ``"package.module:Name"``.
    key : str, optional
        The config key, for error messages (default: the kind).
    """
    _check_kind(kind)
    key = key or kind
    _load_entry_points()
    if isinstance(value, str) and value in _registry[kind]:
        return _import(_registry[kind][value].target, kind, key)
    if is_import_string(value):
        return _import(str(value), kind, key)
    registered = tuple(_registry[kind])
    close = difflib.get_close_matches(str(value), registered, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(
        f"{key} must be one of {', '.join(registered)} or an import string "
        f"'package.module:Name'; got {value!r}{hint}"
    )


def listing(kind: str | None = None) -> list[dict[str, str]]:
    """Every registered component (of ``kind``), as dicts ``kind, name, target, description,
    origin, reads``.

    ``reads`` lists the settings the component declares it reads (:mod:`p2pdp.core.reads`),
    which imports it; descriptions of entry points are read from their docstrings.
    """
    from p2pdp.core.reads import declared_reads, describe

    kinds = [kind] if kind is not None else list(KINDS)
    for k in kinds:
        _check_kind(k)
    _load_entry_points()
    rows = []
    for k in kinds:
        for component in _registry[k].values():
            description = component.description
            try:
                obj = _import(component.target, k, f"{k}.{component.name}")
                description = description or _first_line(obj)
                reads = describe(declared_reads(obj))
            except ConfigError as exc:
                description = description or f"(cannot import: {exc})"
                reads = "(cannot import it to read its declaration)"
            rows.append(
                {
                    "kind": k,
                    "name": component.name,
                    "target": component.target,
                    "description": description,
                    "origin": component.origin,
                    "reads": reads,
                }
            )
    return rows


def format_listing(rows: list[dict[str, str]]) -> str:
    """Plain-text table of :func:`listing` rows, grouped by kind."""
    lines: list[str] = []
    width = max((len(row["name"]) for row in rows), default=4)
    current = None
    for row in rows:
        if row["kind"] != current:
            current = row["kind"]
            if lines:
                lines.append("")
            lines.append(f"{current}: {KINDS[current]}")
        lines.append(f"  {row['name']:<{width}}  {row['description']}")
        if "reads" in row:
            lines.append(f"  {'':<{width}}  settings read: {row['reads']}")
    return "\n".join(lines)
