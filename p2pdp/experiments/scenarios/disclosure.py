"""The non-private steps of a scenario: what the DP guarantee does *not* cover.

The guarantee of :mod:`p2pdp.privacy.mechanisms` covers what the curators release, for one record of
one peer's shard (replace-one neighbours), *given* the preprocessing and lambda. Several steps a
scenario may take fall outside it, and are listed here so that every results row (column
``non_private_steps``) and every ``report.md`` names them:

* lambda chosen by looking at the data (``training.lambda_source``), or swept so that a reader
  picks the best value from the results (reads every peer's data and the test folds);
* min-max feature bounds fitted on the pooled training rows (``data.bounds = "data"`` with a
  ``minmax`` step), or the means and standard deviations of a ``standardize`` step: every
  peer's data shape the preprocessing of all;
* ``privacy.mechanism = "none"``: releases carry no noise;
* ``privacy.mechanism = "seed-laplace"``: the seed's per-coordinate noise is only
  ``sqrt(d) * epsilon``-DP per release, not ``epsilon``;
* a mechanism whose guarantee is distributional (pooled testing with one pool per person):
  it holds against an adversary who knows the prevalence, not worst-case neighbours;
* a mechanism that declares no guarantee (a plug-in, say): recorded as epsilon = inf.

Everything here is a pure function of the configuration (the model dimension ``d`` comes from
the data set's manifest, never from the data).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from p2pdp.config import ScenarioConfig
from p2pdp.privacy.events import DistributionalEvent, PrivacyEvent

#: ``training.lambda_source`` of the points of a scenario that sweeps lambda (set by
#: :class:`p2pdp.experiments.scenarios.scenario.Scenario` unless the file gives its own).
LAMBDA_SWEPT = (
    "training.lambda is swept by this scenario, and choosing lambda from its results reads "
    "every peer's data and the test folds"
)


def model_dimension(config: ScenarioConfig) -> int | None:
    """Coordinates of a released model: features (+1 with a ``bias`` step); None if unknown."""
    data = config.data
    if data.dataset == "synthetic":
        features = data.synthetic_features
    else:
        try:
            from p2pdp.data.manifests import load_manifest

            features = load_manifest(data.dataset).n_features
        except Exception:  # no manifest: the guarantee is stated with a symbolic d
            return None
    return features + (1 if "bias" in data.transform else 0)


def seed_laplace_guarantee(config: ScenarioConfig) -> str:
    """``"sqrt(58) x 0.1 = 0.76"``-style text of seed-laplace's real epsilon per release/total."""
    d = model_dimension(config)
    per, total = config.privacy.step_epsilon, config.privacy.epsilon
    if d is None:
        return f"sqrt(d) x {per:g} per release, up to sqrt(d) x {total:g} per peer"
    root = math.sqrt(d)
    return (
        f"sqrt({d}) x {per:g} = {root * per:.4g} per release, up to sqrt({d}) x {total:g} = "
        f"{root * total:.4g} per peer"
    )


def non_private_steps(
    config: ScenarioConfig, swept: Iterable[str] = (), *, runtime: str = "simulation"
) -> tuple[str, ...]:
    """The steps of ``config`` outside the DP guarantee, one sentence each, in a fixed order.

    Parameters
    ----------
    config : ScenarioConfig
        One grid point (or the base config) of a scenario.
    swept : iterable of str
        The scenario's swept settings (public names, ``"training.lambda"``): a swept lambda is
        a non-private step even when ``training.lambda_source`` is empty.
    runtime : "simulation" or "network"
        On the network runtime with ``network.seeded_noise``, the noise comes from the
        seeded streams: listed.

    Returns
    -------
    tuple of str
        Empty when the only data access is the mechanism's noisy release.
    """
    steps = []
    features = _reads_features(config)
    source = config.training.lambda_source
    if features and ("training.lambda" in set(swept) or source == LAMBDA_SWEPT):
        steps.append(f"lambda: {LAMBDA_SWEPT}")
    elif features and source:
        steps.append(f"lambda = {config.training.lam:g} {source}")
    data = config.data
    if features and data.bounds == "data" and "minmax" in data.transform:
        steps.append(
            'min-max bounds fitted on the pooled training rows of each fold (data.bounds = "data")'
        )
    if features and "standardize" in data.transform:
        steps.append(
            "standardize: feature means and standard deviations fitted on the pooled training "
            "rows of each fold"
        )
    if config.protocol.iterative and not config.protocol.private(config.privacy):
        steps.append(
            f"privacy.mechanism = 'none': the {config.protocol.name} steps add no noise, so "
            "no privacy at all (privacy.epsilon is not used)"
        )
    if runtime == "network" and config.network.seeded_noise:
        steps.append(NETWORK_NOISE)
    if config.protocol.iterative:  # privacy.mechanism is not used: the steps are Gaussian
        return tuple(steps)
    mechanism = config.privacy.mechanism
    if mechanism == "none":
        steps.append("privacy.mechanism = none: releases carry no noise, so no privacy at all")
    elif mechanism == "seed-laplace":
        steps.append(
            "privacy.mechanism = seed-laplace: the seed's per-coordinate Laplace is only "
            f"sqrt(d) x epsilon-DP ({seed_laplace_guarantee(config)}), not the epsilon charged"
        )
    elif mechanism == "posterior-sampling":
        steps.append(
            "privacy.mechanism = posterior-sampling: the epsilon holds for an exact draw from "
            "the exponential mechanism; finite Langevin chains only approximate it "
            "(approximate: exact only for exact sampling)"
        )
    else:
        event = _event(config)
        if event is not None and not event.private:
            steps.append(_undeclared(mechanism))
        elif isinstance(event, DistributionalEvent):
            steps.append(
                f"privacy.mechanism = {mechanism}: its epsilon is not worst-case DP, it holds "
                f"only in the threat model {event.threat_model!r}"
            )
    return tuple(steps)


def _reads_features(config: ScenarioConfig) -> bool:
    """Whether the task trains on preprocessed features (lambda and min-max bounds matter).

    A task says it does not with ``reads_features = False`` (the prevalence tasks count
    binary records); an unknown task is assumed to.
    """
    from p2pdp.core.components import resolve

    task = resolve("task", config.task.name, key="task.name")
    return bool(getattr(task, "reads_features", True))


def _event(config: ScenarioConfig) -> PrivacyEvent | None:
    """The privacy event of one release of the configured mechanism; None for the built-in
    additive mechanisms (exact DP, or handled by name above)."""
    from p2pdp.privacy.mechanisms import MECHANISMS, make_mechanism, mechanism_class

    privacy = config.privacy
    if privacy.mechanism in MECHANISMS:
        return None
    cls = mechanism_class(privacy.mechanism)
    if hasattr(cls, "from_config"):  # calibrated by settings beyond [privacy] (pooled-test)
        mechanism = cls.from_config(config)
    else:
        delta = privacy.delta_per_aggregation if privacy.approximate else None
        mechanism = make_mechanism(privacy.mechanism, epsilon=privacy.step_epsilon, delta=delta)
    return mechanism.event(model_dimension(config) or 1)


def _declares_nothing(config: ScenarioConfig) -> bool:
    """Whether the configured mechanism (a plug-in, say) declares no privacy guarantee."""
    event = _event(config)
    return event is not None and not event.private


def _undeclared(mechanism: str) -> str:
    return (
        f"privacy.mechanism = {mechanism} declares no privacy guarantee: its releases are "
        "recorded as non-private (epsilon = inf)"
    )


def non_private_column(
    config: ScenarioConfig, swept: Iterable[str] = (), *, runtime: str = "simulation"
) -> str:
    """:func:`non_private_steps` joined by ``"; "`` for the results column (empty if none)."""
    return "; ".join(non_private_steps(config, swept, runtime=runtime))


#: The network runtime's reproducible noise (p2pdp.net.host), as the disclosure states it.
NETWORK_NOISE = (  # no "; " inside: the column joins steps with it
    "network.seeded_noise = true: the noise (each curator's, or with secure aggregation each "
    "member's share) is drawn from the scenario's seeded streams (to release what the "
    "simulator releases), and anyone who knows the seed can remove it, so these releases are "
    "NOT private"
)


def mechanism_warnings(configs: Iterable[ScenarioConfig]) -> list[str]:
    """One warning line per distinct non-private mechanism among ``configs`` (for the CLI)."""
    warned: dict[str, str] = {}
    for config in configs:
        mechanism = config.privacy.mechanism
        if mechanism == "none" and mechanism not in warned:
            warned[mechanism] = (
                "privacy.mechanism = none adds no noise: the released models are not private"
            )
        elif mechanism == "seed-laplace" and mechanism not in warned:
            warned[mechanism] = (
                "privacy.mechanism = seed-laplace is not epsilon-DP: its per-coordinate Laplace "
                f"guarantees only {seed_laplace_guarantee(config)}"
            )
        elif mechanism not in warned and _declares_nothing(config):
            warned[mechanism] = _undeclared(mechanism)
    return list(warned.values())
