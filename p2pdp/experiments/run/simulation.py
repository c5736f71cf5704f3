"""One-call API: :func:`simulate` one fold of a scenario and get a
:class:`~p2pdp.experiments.run.result.RunResult`.

:func:`simulate` checks the call, then runs one protocol family's steps, each timed as a
phase: the one-shot protocol (:mod:`p2pdp.experiments.run.oneshot`) or an iterative one
(:mod:`p2pdp.experiments.run.iterative`).

Randomness: every stream is derived by name from ``config.seed`` (plus fold and repetition)
through :mod:`p2pdp.core.rng`, so the same config, fold and repetition always give identical
results, and cells of a sweep that differ only in, e.g., the publication mode share folds,
shards, local models, group draws and noise streams (common random numbers).
"""

from __future__ import annotations

import dataclasses
import os
import tracemalloc
from collections.abc import Mapping, Sequence
from typing import Any

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.validation import IntAtLeast, OneOf
from p2pdp.experiments.run.iterative import simulate_iterative
from p2pdp.experiments.run.oneshot import _simulate_one_shot, _unscored_network_run
from p2pdp.experiments.run.result import RunResult
from p2pdp.experiments.scenarios.scenario import config_of, with_settings
from p2pdp.sim.waves import DRIVERS
from p2pdp.sim.world import WorldObserver
from p2pdp.tasks import (
    make_task,
)

#: Where a one-shot run happens: the SimPy world, or real processes over TCP (p2pdp.net).
RUNTIMES = ("simulation", "network")


def simulate(
    config: ScenarioConfig | str | os.PathLike[str] | Mapping[str, Any],
    *,
    fold: int = 0,
    repetition: int = 0,
    trained: Any = None,
    track_memory: bool = False,
    observers: tuple[WorldObserver, ...] = (),
    runtime: str = "simulation",
    driver: str = "auto",
    **settings: Any,
) -> RunResult:
    """Simulate fold ``fold`` of ``config`` (its ``sweep`` is ignored) and evaluate it.

    Parameters
    ----------
    config : ScenarioConfig, str, path or mapping
        The cell's settings; a shipped scenario's name, a scenario file or a mapping shaped
        like one is loaded (it must have one grid point: see
        :func:`p2pdp.experiments.scenarios.scenario.config_of`).
    fold : int
        Cross-validation fold in ``[0, evaluation.cv_folds)`` (0 for a fixed split).
    repetition : int
        Independent repetition index (>= 0): changes every random stream.
    trained : optional
        What the task's ``prepare`` returned for the same training key (e.g.
        :func:`p2pdp.tasks.pipeline.prepare_peers` for the logistic task), to share one training
        between cells. Refused if it was prepared for another key (say, another lambda:
        its sensitivity would be wrong).
    track_memory : bool
        Measure peak Python/numpy memory with :mod:`tracemalloc` (slower; for benchmarks).
    observers : tuple of WorldObserver
        Extra observers of the world (a release log is always attached).
    runtime : "simulation" or "network"
        ``network``: the peers run as OS processes exchanging real messages over TCP
        (:mod:`p2pdp.net`; one-shot protocol, central sampler); the rows are the simulator's
        up to the timing columns (``sim_time`` is then wall seconds). With a hosts file's
        ``score = false`` this process opens no data (``trained`` is not used) and the
        scores are empty (:data:`UNSCORED`).
    driver : "auto", "reference" or "batched"
        How the simulator runs the protocol (the rows are the same): ``"auto"`` the fast
        path where it applies; ``"reference"`` the per-message SimPy world (one-shot) or one
        transport-free machine per peer (iterative protocols, :mod:`p2pdp.sim.iterative`);
        ``"batched"`` the arrays (:mod:`p2pdp.sim.waves` for one-shot, refused where they do
        not apply; the iterative protocols' default). Refused on the network runtime.
    **settings
        Settings applied over ``config``, as ``p2pdp run --set`` would: a section as a dict
        of its settings (``privacy={"epsilon": 1.0}``) or a top-level setting (``seed=3``).
        An unknown name is a ConfigError naming the closest valid one.
    """
    config = config_of(config)
    if settings:
        config = with_settings(config, settings, "simulate()")
    _check_call(
        config,
        fold=fold,
        repetition=repetition,
        observers=observers,
        runtime=runtime,
        driver=driver,
    )
    if track_memory:
        tracemalloc.start()
    task = make_task(config)
    if config.protocol.iterative:
        result = simulate_iterative(
            config,
            task,
            fold=fold,
            repetition=repetition,
            trained=trained,
            driver="reference" if driver == "reference" else "batched",
            runtime=runtime,
        )
    elif runtime == "network" and not _coordinator_scores(config):
        result = _unscored_network_run(
            config, task, fold=fold, repetition=repetition, observers=observers
        )
    else:
        result = _simulate_one_shot(
            config,
            task,
            fold=fold,
            repetition=repetition,
            trained=trained,
            observers=observers,
            runtime=runtime,
            driver=driver,
        )
    if track_memory:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        result = dataclasses.replace(result, peak_memory_mb=peak)
    return result


def _check_call(
    config: ScenarioConfig,
    *,
    fold: int,
    repetition: int,
    observers: tuple[WorldObserver, ...],
    runtime: str,
    driver: str,
) -> None:
    """ConfigError, before anything runs, for arguments of :func:`simulate` that cannot run
    ``config`` (an iterative protocol included); the network runtime's settings are checked
    here too (:func:`~p2pdp.experiments.network.launch.check_network_settings`)."""
    OneOf(RUNTIMES).check("runtime", runtime)
    OneOf(DRIVERS).check("driver", driver)
    if driver != "auto" and runtime == "network":
        raise ConfigError(
            f"driver = {driver!r} chooses how the simulator runs a protocol; this run is on "
            "the network runtime"
        )
    if config.network.seeded_noise and runtime != "network":
        raise ConfigError(
            "network.seeded_noise = true is read only with runtime = 'network': the simulator "
            "always draws its noise from the scenario's seeded streams"
        )
    IntAtLeast(0).check("fold", fold)
    IntAtLeast(0).check("repetition", repetition)
    if isinstance(observers, WorldObserver) or not isinstance(observers, Sequence):
        raise ConfigError(
            f"observers must be a tuple of WorldObserver (p2pdp.sim.world), got {observers!r}; "
            "pass observers=(mine,) for one"
        )
    if observers and config.protocol.iterative:
        raise ConfigError(
            f"observers watch the one-shot protocol's groups and releases; protocol.name = "
            f"{config.protocol.name!r} is iterative and would never call them: drop observers="
        )
    if config.evaluation.split == "cv" and fold >= config.evaluation.cv_folds:
        raise ConfigError(f"fold must be in [0, {config.evaluation.cv_folds}), got {fold}")
    if config.evaluation.split == "fixed" and fold != 0:
        raise ConfigError(f"fold must be 0 with evaluation.split = 'fixed' (one split), got {fold}")
    if runtime == "network":
        from p2pdp.experiments.network.launch import check_network_settings

        check_network_settings(config)


def _coordinator_scores(config: ScenarioConfig) -> bool:
    """Whether this process, the coordinator of a network run, scores it (holds the data)."""
    from p2pdp.experiments.network.hosts_file import coordinator_scores

    return coordinator_scores(config.partition.n_peers)
