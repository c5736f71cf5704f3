"""One fold of the one-shot protocol (:func:`p2pdp.experiments.run.simulation.simulate`): the
peers' statistics, the world that releases their group averages (simulated, or on the network
runtime), the task's scores, and the :class:`~.result.RunResult` they make.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.progress import set_phase
from p2pdp.core.rng import generator
from p2pdp.experiments.run.phases import _Phases, _trained
from p2pdp.experiments.run.result import ReleaseLog, RunResult, guarantee_label
from p2pdp.privacy.accountants import composed, supports
from p2pdp.privacy.accounting import make_accountant
from p2pdp.privacy.mechanisms import NoNoise
from p2pdp.sim.world import World, WorldObserver
from p2pdp.tasks import (
    Outcome,
    check_min_shard_size,
    evaluated,
    release_path,
    sensitivity_of,
    task_statistics,
)

#: ``score_note`` of a network run whose coordinator holds no data (a hosts file's ``score =
#: false``): why its scores are empty.
UNSCORED = (
    "not scored: the coordinator holds no data (hosts file score = false): no test-set "
    "scores, centralised reference or shard sizes, and no noise norm its curator did not report"
)


@dataclass(frozen=True, slots=True)
class Unscored:
    """The :class:`~p2pdp.tasks.Evaluation` of a run nobody scored: every column the task's
    summary fills (``columns``, the task's ``score_columns()``) is NaN; no per-peer scores."""

    columns: tuple[str, ...]

    def summary(self) -> dict[str, Any]:
        return dict.fromkeys(self.columns, math.nan)

    def peer_columns(self) -> dict[str, np.ndarray]:
        return {}


def _simulate_one_shot(
    config: ScenarioConfig,
    task: Any,
    *,
    fold: int,
    repetition: int,
    trained: Any,
    observers: tuple[WorldObserver, ...],
    runtime: str,
    driver: str,
) -> RunResult:
    """One fold of the one-shot protocol, scored by this process (see :func:`simulate`): the
    peers' statistics, the world that releases their group averages, the task's scores."""
    phases = _Phases()
    with phases.phase("training"):
        trained = _trained(task, trained, fold=fold, repetition=repetition)
        statistics, sizes = task_statistics(task, trained, config.partition.n_peers)
        check_min_shard_size(sizes, config.privacy.min_shard_size)
    with phases.phase("simulation", "network run" if runtime == "network" else None):
        dim = statistics.shape[-1]  # (P, d), or (P, R, d): a fresh statistic per release
        mechanism, releaser, rngs = release_path(
            config, task, dim, fold=fold, repetition=repetition
        )
        log = ReleaseLog()
        world = _one_shot_world(
            config,
            task,
            statistics,
            sizes,
            releaser=releaser,
            rngs=rngs,
            fold=fold,
            repetition=repetition,
            observers=(log, *observers),
            runtime=runtime,
            driver=driver,
        )
        world.run()
    with phases.phase("evaluation"):
        evaluation = evaluated(task, trained, _outcome(world, dim))
    return _result(
        config,
        world,
        mechanism,
        dim,
        fold=fold,
        repetition=repetition,
        evaluation=evaluation,
        shard_sizes=np.asarray(sizes),
        data_dependent_bounds=bool(
            getattr(getattr(trained, "fold", None), "data_dependent_bounds", False)
        ),
        releases=log.rows,
        wall_times=phases.seconds,
        runtime=runtime,
    )


def _one_shot_world(
    config: ScenarioConfig,
    task: Any,
    statistics: np.ndarray,
    sizes: Any,
    *,
    releaser: Any,
    rngs: dict[str, np.random.Generator],
    fold: int,
    repetition: int,
    observers: tuple[WorldObserver, ...],
    runtime: str,
    driver: str,
) -> Any:
    """The world that runs the one-shot protocol over the peers' ``statistics`` (shape (P, d)
    or (P, R, d)): the SimPy :class:`~p2pdp.sim.world.World`, or on the network runtime a
    :class:`~p2pdp.net.coordinator.NetworkWorld` over the run's host processes."""
    if runtime == "network":
        from p2pdp.experiments.network.launch import network_world

        return network_world(
            config,
            releaser,
            statistics,
            rngs=rngs,
            fold=fold,
            repetition=repetition,
            observers=observers,
        )
    world = World(
        config,
        statistics,
        sizes,
        releaser=releaser,
        sensitivity=sensitivity_of(task, config.privacy.min_shard_size),
        rngs=rngs,
        observers=observers,
        driver=driver,
    )
    set_phase("simulation", _aggregations_done(world))
    return world


def _outcome(world: Any, dim: int) -> Outcome:
    """What ``world`` (a World or NetworkWorld after its run) leaves for the task to score:
    the world's own arrays where it keeps them as such (a World: no copy of the published
    models, whose (K, d) array every receiver shares), arrays made of its lists otherwise."""
    pairs = np.asarray(world.receipts, dtype=np.int64).reshape(-1, 2)
    return Outcome(
        published=np.asarray(world.published, dtype=np.float64).reshape(len(world.published), dim),
        shared=np.asarray(world.shared, dtype=bool),
        receipt_peers=pairs[:, 0],
        receipt_models=pairs[:, 1],
        releases=world.releases,
        members=world.release_members,
    )


def _unscored_network_run(
    config: ScenarioConfig,
    task: Any,
    *,
    fold: int,
    repetition: int,
    observers: tuple[WorldObserver, ...],
) -> RunResult:
    """A network run whose coordinator (this process) holds no data (a hosts file's ``score
    = false``): it opens no data set and no shard file, learns the statistics' length from
    the hosts (:class:`~p2pdp.net.coordinator.NetworkWorld`), and leaves every score empty
    with the reason in ``score_note`` (:data:`UNSCORED`)."""
    from p2pdp.experiments.network.launch import network_world

    paths: dict[int, tuple[Any, Any, Any]] = {}

    def releaser(dim: int) -> Any:  # the run's, once the hosts said the statistics' length
        paths[dim] = release_path(config, task, dim, fold=fold, repetition=repetition)
        return paths[dim][1]

    start = time.perf_counter()
    set_phase("network run")
    log = ReleaseLog()
    world = network_world(
        config,
        releaser,
        None,
        rngs={"protocol": generator(config.seed, "protocol", fold, repetition)},  # release_path's
        fold=fold,
        repetition=repetition,
        observers=(log, *observers),
    )
    world.run()
    assert world.dim is not None  # the hosts said it before any group formed
    return _result(
        config,
        world,
        paths[world.dim][0],
        world.dim,
        fold=fold,
        repetition=repetition,
        evaluation=Unscored(tuple(task.score_columns())),
        shard_sizes=np.full(config.partition.n_peers, math.nan),
        data_dependent_bounds=world.data_dependent_bounds,
        releases=log.rows,
        wall_times={"training": 0.0, "simulation": time.perf_counter() - start, "evaluation": 0.0},
        peak_memory_mb=math.nan,
        runtime="network",
        score_note=UNSCORED,
    )


def _result(
    config: ScenarioConfig,
    world: Any,
    mechanism: Any,
    dim: int,
    *,
    runtime: str,
    **fields: Any,
) -> RunResult:
    """The RunResult of a one-shot run of ``world`` (after its run) releasing through
    ``mechanism`` statistics of length ``dim``; ``fields``: the rest of RunResult's."""
    transport = world.transport
    counts = world.ledger.aggregations()
    return RunResult(
        config=config,
        aggregations=world.monitor.aggregations,
        aborted_groups=world.monitor.aborted,
        aggregations_per_peer=counts,
        epsilon_spent=(  # a release without noise leaks without bound: NOT private
            np.where(counts > 0, np.inf, 0.0)
            if isinstance(mechanism, NoNoise)
            else world.ledger.spent_epsilon()
        ),
        guaranteed_epsilon=_guaranteed_epsilon(mechanism, dim, counts, config),
        sim_time=world.monitor.end_time,
        messages_sent=int(transport.messages_sent.sum() + transport.control_messages),
        bytes_sent=int(transport.bytes_sent.sum()),
        messages_lost=transport.messages_lost,
        stop_reason=world.monitor.stop_reason,
        guarantee_per_aggregation=mechanism.guarantee(dim),
        guarantee=guarantee_label(mechanism.event(dim)),
        neighbouring_relation=mechanism.event(dim).relation,
        affordable_aggregations=int(world.ledger.max_aggregations),
        wire=getattr(world, "wire_rows", list)(),
        runtime=runtime,
        hosts_lost=len(getattr(world, "lost_hosts", ())),
        messages_refused=getattr(transport, "messages_refused", 0),
        **fields,
    )


def _aggregations_done(world: World) -> Callable[[], str]:
    """The progress counter of a one-shot simulation: the aggregations ``world`` published so
    far (of at most every peer's affordable aggregations over the group size), the groups
    aborted and the simulated time (which moves on when lost messages abort every group);
    with a sampler that forms groups by messages (gossip), its failed formation attempts too,
    so a run whose invitations are lost says why no aggregation happens."""
    config = world.config
    most = config.partition.n_peers * int(world.ledger.max_aggregations)
    most //= config.groups.group_size
    monitor, env = world.monitor, world.env  # counted per group, wave or chunk of waves
    sampler: Any = world.sampler  # a plug-in sampler may count formation attempts too
    forms = hasattr(sampler, "attempts_started") and hasattr(sampler, "attempts_failed")

    def counter() -> str:
        attempts = (
            f"{sampler.attempts_failed} of {sampler.attempts_started} formation attempts failed, "
            if forms
            else ""
        )
        return (
            f"{monitor.aggregations} of at most {most} aggregations, {monitor.aborted} "
            f"aborted, {attempts}simulated time {env.now:.0f} s"
        )

    return counter


def _guaranteed_epsilon(
    mechanism: Any, dim: int, counts: np.ndarray, config: ScenarioConfig
) -> np.ndarray:
    """Per-peer epsilon the releases really guarantee (the accountant on the true event)."""
    event = mechanism.event(dim)
    if not event.private:
        return np.where(counts == 0, 0.0, math.inf)
    accountant = make_accountant(config.privacy.resolved_accountant)
    if not supports(accountant, event):  # e.g. rdp on a non-Gaussian true event
        accountant = make_accountant("basic")
    return composed(accountant, event, counts, delta_total=config.privacy.delta)
