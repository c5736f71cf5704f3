"""One-call API: :func:`simulate` one fold of a scenario and get a :class:`RunResult`.

Randomness: every stream is derived by name from ``config.seed`` (plus fold and repetition)
through :mod:`p2pdp.core.rng`, so the same config, fold and repetition always give identical
results, and cells of a sweep that differ only in, e.g., the publication mode share folds,
shards, local models, group draws and noise streams (common random numbers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
import os
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig, flat_settings, settings_read
from p2pdp.core.columns import Rows
from p2pdp.core.errors import ConfigError
from p2pdp.core.progress import set_phase
from p2pdp.core.rng import generator
from p2pdp.core.validation import IntAtLeast, OneOf
from p2pdp.experiments.results.tables import ColumnTable, RowSequence
from p2pdp.experiments.scenarios.scenario import config_of, with_settings
from p2pdp.privacy.accounting import composed, make_accountant, supports
from p2pdp.privacy.mechanisms import NoNoise
from p2pdp.privacy.release import ReleaseRecord, ReleaseTable
from p2pdp.protocols import ITERATIVE_COLUMNS
from p2pdp.sim.waves import DRIVERS
from p2pdp.sim.world import World, WorldObserver
from p2pdp.tasks import (
    Evaluation,
    Outcome,
    check_min_shard_size,
    evaluated,
    make_task,
    prepared,
    release_path,
    sensitivity_of,
    task_statistics,
)

#: The phases of every row's ``wall_<phase>_s`` columns, in order (NaN where a run has none).
WALL_PHASES = ("training", "simulation", "evaluation", "network_dp")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """Outcome of one simulated run (one fold, one repetition).

    ``evaluation`` is the task's scores (for the logistic task:
    :class:`~p2pdp.tasks.logistic.task.LogisticEvaluation`, errors as fractions of misclassified
    test rows). Times are seconds (``sim_time`` simulated, until the last group finished;
    ``wall_times`` real per phase: training, simulation, evaluation, and for an iterative run
    ``network_dp``, the views of its network DP and correlated-noise columns; the row's
    ``wall_<phase>_s`` columns are those of :data:`WALL_PHASES` in order, NaN where a run has
    no such phase).

    Privacy, per peer: ``epsilon_spent`` is what the budget ledger charged under the
    configured accountant (the nominal schedule); ``guaranteed_epsilon`` is what the
    releases really guarantee, composed by the same accountant from the mechanism's declared
    event: equal for every honest mechanism, ``sqrt(d)`` times larger for ``seed-laplace``,
    ``inf`` for ``none`` or a mechanism that declares no guarantee.
    ``guarantee_per_aggregation`` is one release's real ``(epsilon, delta)``; ``guarantee``
    (a column of every row and release) qualifies it: ``"exact"`` when the epsilon holds as
    stated, ``"none"`` for a mechanism without a guarantee, and a mechanism's own label when
    it holds only under a condition the run does not meet (``posterior-sampling``:
    ``"approximate: exact only for exact sampling"``).
    ``neighbouring_relation`` (a column of every row) is the relation all those epsilons are
    stated for (:data:`p2pdp.privacy.events.RELATIONS`, ``"none"`` without a guarantee):
    ``"replace-one"`` for the one-shot mechanisms and full or fixed sampling, ``"add-remove"``
    for Poisson sampling. Epsilons of rows with different relations are not comparable.
    ``releases`` has one row per release (:mod:`p2pdp.privacy.release` records, plus cell time).
    ``messages_lost``: messages the transport model lost (or, for iterative protocols, that
    came late); on the network runtime, the run's frames that were undeliverable or late (a
    member's first contribution reaching its curator after the group ended:
    :class:`~p2pdp.protocols.oneshot.Late`), as the parties that reported counted them (see
    :mod:`p2pdp.net.coordinator`), and the publications of released groups refused because
    a forged copy came first, with ``hosts_lost`` the host
    processes lost during the run (their peers left it; 0 in simulation).
    ``messages_refused`` (network runtime; 0 in simulation): the messages the parties refused
    as outside the protocol (replayed, forged, malformed, from a party the protocol's state
    does not entitle to send them, or for a group unknown to the receiver), as every party
    that reported counted them.
    ``score_note`` is empty for a scored run; a network run whose coordinator holds no data
    (a hosts file's ``score = false``) says there why its scores (the task's summary columns,
    the peers' scores and shard sizes, a release's ``noise_norm`` unless its curator reported
    it: seeded noise without secure aggregation) are empty
    (:data:`UNSCORED`): what the protocol produced (releases, charges, epsilons, messages,
    bytes, hosts lost, guarantees) is filled as in a scored run.
    ``affordable_aggregations`` is how many aggregations the ledger lets every peer join
    (the accountant's answer for the budget; with ``privacy.noise_multiplier``, the count
    that noise buys).

    Iterative protocols (``protocol.name`` not ``one-shot``, :func:`simulate_iterative`): a
    peer's "aggregations" are its private local steps (each one a release to its neighbours),
    ``epsilon_spent`` their local DP; ``protocol_columns`` (:data:`ITERATIVE_COLUMNS
    <p2pdp.protocols.ITERATIVE_COLUMNS>`, NaN for one-shot runs) add the steps, the noise used,
    the overlay's spectral gap, the final consensus distance and, for ``muffliato``, the
    pairwise network DP bound (NOT local DP: see :mod:`p2pdp.protocols.network_dp`);
    ``rounds`` has one record per evaluated round and ``network_dp`` one per graph distance.
    """

    config: ScenarioConfig
    fold: int
    repetition: int
    evaluation: Evaluation
    aggregations: int
    aborted_groups: int
    aggregations_per_peer: np.ndarray
    epsilon_spent: np.ndarray
    guaranteed_epsilon: np.ndarray
    shard_sizes: np.ndarray
    sim_time: float
    messages_sent: int
    bytes_sent: int
    messages_lost: int
    stop_reason: str
    data_dependent_bounds: bool
    guarantee_per_aggregation: tuple[float, float]
    guarantee: str = "exact"
    neighbouring_relation: str = "replace-one"
    releases: Sequence[dict[str, Any]] = field(default_factory=list)
    wall_times: dict[str, float] = field(default_factory=dict)
    peak_memory_mb: float = float("nan")
    affordable_aggregations: int = -1
    protocol_columns: dict[str, Any] = field(default_factory=lambda: dict(ITERATIVE_COLUMNS))
    rounds: list[dict[str, Any]] = field(default_factory=list)
    network_dp: list[dict[str, Any]] = field(default_factory=list)
    wire: list[dict[str, Any]] = field(default_factory=list)
    runtime: str = "simulation"
    hosts_lost: int = 0
    score_note: str = ""
    messages_refused: int = 0

    def row(self) -> dict[str, Any]:
        """Flat results row: every config setting (empty where the run read none), the
        seed, and the scalar metrics."""
        row = flat_settings(self.config, settings_read(self.config, self.runtime))
        row.update(fold=self.fold, repetition=self.repetition)
        row.update(self.evaluation.summary())
        row.update(
            score_note=self.score_note,
            aggregations=self.aggregations,
            aborted_groups=self.aborted_groups,
            affordable_aggregations=self.affordable_aggregations,
            mean_aggregations_per_peer=float(self.aggregations_per_peer.mean()),
            max_epsilon_spent=float(self.epsilon_spent.max()),
            max_guaranteed_epsilon=float(self.guaranteed_epsilon.max()),
            sim_time=self.sim_time,
            messages_sent=self.messages_sent,
            bytes_sent=self.bytes_sent,
            messages_lost=self.messages_lost,
            messages_refused=self.messages_refused,
            hosts_lost=self.hosts_lost,
            stop_reason=self.stop_reason,
            data_dependent_bounds=self.data_dependent_bounds,
            guaranteed_epsilon_per_aggregation=self.guarantee_per_aggregation[0],
            guaranteed_delta_per_aggregation=self.guarantee_per_aggregation[1],
            guarantee=self.guarantee,
            neighbouring_relation=self.neighbouring_relation,
        )
        row.update(self.protocol_columns)
        walls = dict.fromkeys(WALL_PHASES, math.nan)  # every row the same columns, in order
        walls.update(self.wall_times)
        row.update({f"wall_{phase}_s": seconds for phase, seconds in walls.items()})
        return row

    def round_rows(self) -> list[dict[str, Any]]:
        """The ``rounds`` table of this run (iterative protocols; empty otherwise).

        Columns: ``fold``, ``repetition``, ``protocol``, ``round``, ``time`` (simulated s),
        ``mean_error`` and ``worst_error`` of the peers' models on the test rows (NaN on rounds
        not evaluated, see ``protocol.eval_every``), ``consensus_distance`` (mean squared
        distance of the models to their average), ``bytes_sent`` and ``messages_lost`` (lost
        or late) so far, ``mean_steps`` and ``epsilon_spent`` (largest local DP epsilon of any
        peer so far).
        """
        head = {
            "fold": self.fold,
            "repetition": self.repetition,
            "protocol": self.config.protocol.name,
        }
        return [{**head, **row} for row in self.rounds]

    def network_dp_rows(self) -> list[dict[str, Any]]:
        """The ``network_dp`` table (``dpsgd``, ``muffliato``): per graph distance between two
        peers, the pairs and the mean and max pairwise network DP epsilon at ``privacy.delta``."""
        return [
            {"fold": self.fold, "repetition": self.repetition, **row} for row in self.network_dp
        ]

    def wire_rows(self) -> list[dict[str, Any]]:
        """The ``wire`` table (network runtime; empty for simulated runs): per message kind,
        the ``frames`` sent and their ``wire_bytes`` (measured, framing included); the kind
        ``refused`` counts frames and connections the receivers refused (malformed, oversize,
        out of protocol)."""
        return [{"fold": self.fold, "repetition": self.repetition, **row} for row in self.wire]

    def release_rows(self) -> ColumnTable:
        """The ``releases`` table of this run: one row per release, in release order.

        Columns: ``fold``, ``repetition``, ``time`` (simulated s), ``group``, ``curator``,
        ``group_size``, ``n_min``, ``lambda``, ``sensitivity``, ``mechanism``, ``epsilon``,
        ``delta``, ``noise_scale``, ``noise_std`` (public), ``noise_norm`` (FOR ANALYSIS ONLY:
        the norm of the noise actually drawn, which no party of the protocol learns) and
        ``secure``, ``guarantee`` (see :meth:`row`).
        """
        n = len(self.releases)
        columns: dict[str, Any]
        if isinstance(self.releases, ReleaseRows):
            columns = self.releases.columns()
        else:
            keys = self.releases[0] if n else {}
            columns = {key: [row[key] for row in self.releases] for key in keys}
        return ColumnTable(
            {
                "fold": [self.fold] * n,
                "repetition": [self.repetition] * n,
                **columns,
                "lambda": [self.config.training.lam] * n,
                "guarantee": [self.guarantee] * n,
            }
        )

    def peer_table(self) -> ColumnTable:
        """The ``peers`` table of this run: one row per peer.

        Columns: ``fold``, ``repetition``, ``peer``, ``shard_size``, ``aggregations`` joined,
        ``epsilon_spent`` (charged), ``guaranteed_epsilon`` (real), then the task's per-peer
        columns (logistic: ``error``, ``local_only_error``, ``ensemble_size``).
        """
        columns = {
            "peer": np.arange(self.shard_sizes.size),
            "shard_size": self.shard_sizes,
            "aggregations": self.aggregations_per_peer,
            "epsilon_spent": self.epsilon_spent,
            "guaranteed_epsilon": self.guaranteed_epsilon,
            **self.evaluation.peer_columns(),
        }
        n = self.shard_sizes.size
        arrays = {name: np.asarray(values) for name, values in columns.items()}
        return ColumnTable({"fold": [self.fold] * n, "repetition": [self.repetition] * n, **arrays})


class ReleaseRows(RowSequence):
    """One row per release, ``{"time", "group", "curator", **record.as_row()}``, built when
    read: it holds each release's time, group and curator as one row of numbers and its
    record in a :class:`~p2pdp.privacy.release.ReleaseTable` (91 bytes a release; ~380 as
    a tuple and a named tuple each, 3.8 GB at ten million releases)."""

    __slots__ = ("_records", "_where")

    _WHERE = np.dtype([("time", "f8"), ("group", "i8"), ("curator", "i8")])

    def __init__(self) -> None:
        self._where = Rows((), self._WHERE)
        self._records = ReleaseTable()

    def append(self, time: float, group: int, curator: int, record: ReleaseRecord) -> None:
        self._where.append((time, group, curator))
        self._records.append(record)

    def extend(
        self,
        times: list[float],
        groups: list[int],
        curators: list[int],
        records: list[ReleaseRecord],
    ) -> None:
        """:meth:`append` each release, in order."""
        where = np.empty(len(records), self._WHERE)
        where["time"], where["group"], where["curator"] = times, groups, curators
        self._where.extend(where)
        self._records.extend(records)

    def columns(self) -> dict[str, np.ndarray]:
        """The rows as columns, ``{column: (n,) array}`` (none without rows): views of what
        it holds, the mechanism's names an object array."""
        if not len(self):
            return {}
        where = self._where.array
        return {
            **{name: where[name] for name in ("time", "group", "curator")},
            **{name: self._records.column(name) for name in ReleaseRecord._fields},
        }

    def __len__(self) -> int:
        return len(self._where)

    def _row(self, index: int) -> dict[str, Any]:
        time, group, curator = self._where[index].tolist()
        return {"time": time, "group": group, "curator": curator, **self._records[index].as_row()}


class ReleaseLog(WorldObserver):
    """Observer that records one row per release: the public record plus the time."""

    def __init__(self) -> None:
        self.rows = ReleaseRows()

    def released(self, world, group, record) -> None:
        self.rows.append(float(world.env.now), group.group_id, group.curator, record)

    def released_many(self, world, times, group_ids, curators, records) -> None:
        self.rows.extend(times, group_ids, curators, records)


#: Where a one-shot run happens: the SimPy world, or real processes over TCP (p2pdp.net).
RUNTIMES = ("simulation", "network")

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
    from p2pdp.experiments.network.launch import coordinator_scores

    return coordinator_scores(config.partition.n_peers)


class _Phases:
    """The wall seconds of a run's phases (:attr:`RunResult.wall_times`, by phase name), each
    phase also shown to the progress report (:func:`p2pdp.core.progress.set_phase`) as it
    starts: the steps of both protocol families are timed alike."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(
        self, name: str, shown: str | None = None, counter: Callable[[], str] | None = None
    ) -> Iterator[None]:
        """Time the block as phase ``name``, shown as ``shown`` (default ``name``) with the
        progress ``counter``."""
        start = time.perf_counter()
        set_phase(name if shown is None else shown, counter)
        yield
        self.seconds[name] = time.perf_counter() - start


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


def _trained(task: Any, trained: Any, *, fold: int, repetition: int) -> Any:
    """What ``task.prepare`` gives for the fold: ``trained`` if given (refused if it was
    prepared for another training key), else prepared now."""
    key = task.training_key(fold=fold, repetition=repetition)
    if trained is None:
        return prepared(task, fold=fold, repetition=repetition)
    if getattr(trained, "key", None) is not None and trained.key != key:
        raise ConfigError(
            "trained was prepared for another training key (data, fold, repetition, "
            "partition, lambda or model differ): its sensitivity would not match this config; "
            f"expected {key!r}, got {trained.key!r}"
        )
    return trained


def check_budget(config: ScenarioConfig) -> None:
    """ConfigError if no peer's budget affords one private step of an iterative protocol
    at the given ``protocol.noise_multiplier`` (a calibrated one always affords
    ``protocol.rounds``); one-shot budgets are checked by the config itself."""
    settings = config.protocol
    if settings.iterative and settings.noise_multiplier is not None:
        from p2pdp.protocols.iterative import step_privacy

        step_privacy(config)


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


def simulate_iterative(
    config: ScenarioConfig,
    task: Any,
    *,
    fold: int,
    repetition: int,
    trained: Any = None,
    driver: str = "batched",
    runtime: str = "simulation",
) -> RunResult:
    """One fold of an iterative protocol (``protocol.name`` not ``one-shot``): see
    :func:`simulate` for the arguments, :mod:`p2pdp.protocols` for the protocols, and
    :mod:`p2pdp.sim.iterative` for ``driver`` (``"batched"`` arrays or the per-peer
    ``"reference"`` machines: the same rows). On the network runtime the rounds run between
    host processes (:func:`p2pdp.experiments.network.iterative.run_on_network`), everything
    else as here.

    Streams (by name, from the seed, fold and repetition): ``overlay`` (the graph, shared by
    cells that differ only in the protocol's settings), ``network`` (delays, losses, phases),
    ``noise`` (the steps' Gaussian noise), ``sampling`` (records per step), ``gossip``
    (gossip learning's targets): each the root of one stream per peer
    (:class:`~p2pdp.protocols.iterative_peer.StreamSeeds`); ``churn`` (sessions and
    downtimes, with ``gossip.churn``), ``pairs`` (D-PSGD's pair secrets, one stream per
    edge),
    ``central`` (the trusted-curator reference's sampling and noise).
    """
    cls = _iterative_protocol_class(config, task)
    phases = _Phases()
    with phases.phase("training"):
        trained, data, problem = _local_problem(
            config, task, trained, fold=fold, repetition=repetition
        )
    rounds_done = [0]  # the round recorded last, read by the progress report
    with phases.phase(
        "simulation", counter=lambda: f"round {rounds_done[0]} of {config.protocol.rounds}"
    ):
        fold_run = _iterative_setup(config, cls, problem, fold=fold, repetition=repetition)
        run, network, trace = _run_rounds(
            config,
            fold_run,
            data,
            fold=fold,
            repetition=repetition,
            on_round=functools.partial(operator.setitem, rounds_done, 0),
            driver=driver,
            runtime=runtime,
        )
    with phases.phase("evaluation"):
        evaluation = task.evaluate_models(trained, run.models)
        columns = _iterative_columns(config, fold_run, run, data, fold=fold, repetition=repetition)
    with phases.phase("network_dp", "network DP"):  # the views of the run
        views, distances = _privacy_views(config, fold_run, trace, network)
        columns.update(views)
    return _iterative_result(
        config,
        fold_run,
        run,
        network,
        fold=fold,
        repetition=repetition,
        evaluation=evaluation,
        data_dependent_bounds=bool(data.data_dependent_bounds),
        protocol_columns=columns,
        network_dp=distances,
        wall_times=phases.seconds,
        runtime=runtime,
    )


def _iterative_result(
    config: ScenarioConfig,
    fold_run: _IterativeFold,
    run: Any,
    network: Any,
    *,
    runtime: str,
    **fields: Any,
) -> RunResult:
    """The RunResult of an iterative run (``network``: the network run, or None in
    simulation): each private step is one aggregation, charged as its local DP;
    ``fields``: the rest of RunResult's."""
    steps = run.steps
    transport = run.transport
    privacy = fold_run.privacy
    spent = privacy.epsilon(steps)
    one_step = privacy.epsilon(np.array([1]))[0]
    return RunResult(
        config=config,
        aggregations=int(steps.sum()),
        aborted_groups=0,
        aggregations_per_peer=steps,
        epsilon_spent=spent,
        guaranteed_epsilon=spent,
        shard_sizes=fold_run.problem.sizes,
        sim_time=run.end_time,
        messages_sent=int(transport.messages_sent.sum()),
        bytes_sent=int(transport.bytes_sent.sum()),
        messages_lost=run.messages_lost,
        stop_reason="rounds",
        guarantee_per_aggregation=(float(one_step), privacy.delta_total),
        guarantee=guarantee_label(privacy.event),
        neighbouring_relation=privacy.event.relation,
        affordable_aggregations=-1 if privacy.max_steps is None else privacy.max_steps,
        rounds=run.rounds,
        runtime=runtime,
        **fields,
        **(
            {}
            if network is None
            else {
                "wire": network.wire,
                "hosts_lost": network.hosts_lost,
                "messages_refused": network.transport.messages_refused,
            }
        ),
    )


def _iterative_protocol_class(config: ScenarioConfig, task: Any) -> type:
    """The :class:`~p2pdp.protocols.iterative.IterativeProtocol` that ``protocol.name`` names;
    ConfigError if it names something else, or the model or task is not logistic (the
    iterative protocols take logistic-loss steps themselves)."""
    from p2pdp.core.components import resolve
    from p2pdp.protocols.iterative import IterativeProtocol

    if config.training.model != "logistic":
        raise ConfigError(
            f"protocol.name = {config.protocol.name!r} takes logistic-loss steps itself: "
            f"training.model must be 'logistic', got {config.training.model!r}"
        )
    if not callable(getattr(task, "evaluate_models", None)):
        raise ConfigError(
            f"protocol.name = {config.protocol.name!r} learns logistic models: task.name must "
            f"be 'logistic' (a task with evaluate_models), got {config.task.name!r}"
        )
    cls = resolve("protocol", config.protocol.name, key="protocol.name")
    if not (isinstance(cls, type) and issubclass(cls, IterativeProtocol)):
        raise ConfigError(
            f"protocol.name = {config.protocol.name!r} must name a subclass of "
            "p2pdp.protocols.iterative.IterativeProtocol"
        )
    return cls


def _local_problem(
    config: ScenarioConfig, task: Any, trained: Any, *, fold: int, repetition: int
) -> tuple[Any, Any, Any]:
    """``(trained, data, problem)``: what the task prepared for the fold, its training and
    test rows, and every peer's local logistic problem
    (:class:`~p2pdp.learning.local_problem.LocalProblem`, one shard per peer). ConfigError if a
    shard is below ``privacy.min_shard_size`` or, with fixed-size sampling, smaller than
    ``protocol.batch_size``."""
    from p2pdp.learning.local_problem import LocalProblem

    trained = _trained(task, trained, fold=fold, repetition=repetition)
    data, shards = trained.training_rows()  # loaded again if drawn in blocks
    problem = LocalProblem.from_shards(data.X_train, data.y_train, shards, config.training.lam)
    check_min_shard_size(problem.sizes, config.privacy.min_shard_size)
    settings = config.protocol
    if settings.sampling == "fixed" and settings.batch_size > problem.sizes.min():
        peer = int(np.argmin(problem.sizes))
        raise ConfigError(
            f"protocol.batch_size = {settings.batch_size} is more than the "
            f"{int(problem.sizes[peer])} records peer {peer} holds (fold {fold}): a step would "
            "take its whole shard, not the batch the row records; lower protocol.batch_size"
        )
    return trained, data, problem


@dataclass(frozen=True, slots=True)
class _IterativeFold:
    """What one fold of an iterative protocol runs: every peer's local ``problem``, the
    overlay's ``mixing`` matrix, ``local`` (one step's local DP at ``privacy.epsilon``, also
    the central reference's budget), ``privacy`` (a step's privacy against the configured
    threat model), the named ``rngs`` and the ``protocol`` built from them."""

    problem: Any
    mixing: Any
    local: Any
    privacy: Any
    rngs: dict[str, np.random.Generator]
    protocol: Any


def _iterative_setup(
    config: ScenarioConfig, cls: type, problem: Any, *, fold: int, repetition: int
) -> _IterativeFold:
    """The overlay (stream ``overlay``), its Metropolis-Hastings mixing, the privacy of a step
    and the protocol, with its streams (``network``, ``noise``, ``sampling``, ``gossip``,
    ``churn``, ``pairs``), for fold ``fold`` and repetition ``repetition``."""
    from p2pdp.protocols.iterative import step_privacy, threat_model_privacy
    from p2pdp.protocols.mixing import Mixing
    from p2pdp.sim.overlay import build_overlay

    overlay = build_overlay(
        config.gossip, problem.n_peers, rng=generator(config.seed, "overlay", fold, repetition)
    )
    mixing = Mixing.metropolis_hastings(overlay.indptr, overlay.indices)
    local = step_privacy(config)  # local DP at privacy.epsilon (the central reference's too)
    privacy = threat_model_privacy(config, local, mixing, problem.sizes)
    rngs = {
        name: generator(config.seed, name, fold, repetition)
        for name in ("network", "noise", "sampling", "gossip", "churn", "pairs")
    }
    protocol = cls(config.protocol, problem, mixing, privacy, rngs=rngs)
    return _IterativeFold(problem, mixing, local, privacy, rngs, protocol)


def _run_rounds(
    config: ScenarioConfig,
    fold_run: _IterativeFold,
    data: Any,
    *,
    fold: int,
    repetition: int,
    on_round: Callable[[int], None],
    driver: str,
    runtime: str,
) -> tuple[Any, Any, Any]:
    """Run the protocol's rounds: ``(run, network, trace)``, ``network`` the network run (also
    ``run``) or None, ``trace`` the views of the run
    (:class:`~p2pdp.protocols.network_dp.ViewTrace`) where a bound needs them, else None."""
    from p2pdp.learning.evaluation import linear_error
    from p2pdp.protocols import network_dp
    from p2pdp.sim.iterative import run_iterative

    protocol = fold_run.protocol
    needs_trace = protocol.network_dp or protocol.pair_noise_multiplier > 0
    trace = network_dp.ViewTrace() if needs_trace else None

    def errors(models: np.ndarray) -> np.ndarray:
        return linear_error(models, data.X_test, data.y_test)

    if runtime == "network":
        from p2pdp.experiments.network.iterative import run_on_network
        from p2pdp.experiments.network.launch import network_session

        set_phase("network run")
        network = run_on_network(
            config,
            fold_run.mixing,
            fold_run.privacy,
            session=network_session(config, fold=fold, repetition=repetition),
            dim=fold_run.problem.X.shape[1],
            errors=errors,
        )
        return network, network, network.trace if needs_trace else None
    run = run_iterative(
        config,
        protocol,
        errors=errors,
        rng=fold_run.rngs["network"],
        churn_rng=fold_run.rngs["churn"],
        on_round=on_round,
        trace=trace,
        driver=driver,
    )
    return run, None, trace


def _iterative_columns(
    config: ScenarioConfig,
    fold_run: _IterativeFold,
    run: Any,
    data: Any,
    *,
    fold: int,
    repetition: int,
) -> dict[str, Any]:
    """The :data:`~p2pdp.protocols.ITERATIVE_COLUMNS` a run fills when scored: steps, noise
    used, spectral gap, consensus distance and, for a private mechanism, the error and
    epsilon of the trusted-curator reference at the same budget (stream ``central``)."""
    from p2pdp.learning.evaluation import linear_error
    from p2pdp.protocols.iterative import central_dp_reference
    from p2pdp.sim.iterative import consensus_distance

    steps = run.steps
    mechanism = fold_run.privacy.mechanism
    columns = dict(ITERATIVE_COLUMNS)
    columns.update(
        mean_steps_per_peer=float(steps.mean()),
        min_steps_per_peer=float(steps.min()),
        noise_multiplier_used=mechanism.noise_multiplier,
        pairwise_noise_multiplier_used=fold_run.protocol.pair_noise_multiplier,
        spectral_gap=fold_run.mixing.spectral_gap(),
        consensus_distance=consensus_distance(run.models),
    )
    if mechanism.private:  # where a trusted curator would be, at the same budget
        central, central_epsilon = central_dp_reference(
            fold_run.problem,
            config.protocol,
            fold_run.local,
            rng=generator(config.seed, "central", fold, repetition),
        )
        columns.update(
            central_dp_error=float(linear_error(central[None, :], data.X_test, data.y_test)[0]),
            central_dp_epsilon=central_epsilon,
        )
    return columns


def _privacy_views(
    config: ScenarioConfig, fold_run: _IterativeFold, trace: Any, network: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(columns, distances)`` from the views of the run as it happened: the correlated-noise
    columns (with pairwise noise), the network DP summary and its ``network_dp`` rows per
    graph distance (protocols that model it), or ``network_dp_note`` saying why there are
    none."""
    from p2pdp.protocols import network_dp

    columns: dict[str, Any] = {}
    if fold_run.protocol.pair_noise_multiplier > 0:  # every threat model's view of the run
        columns.update(_correlated_columns(config, fold_run, trace, network))
    if trace is None or not fold_run.protocol.network_dp:
        columns["network_dp_note"] = network_dp.not_modelled(config.protocol.name)
        return columns, []
    if network is not None and network.hosts_lost > 0:
        columns["network_dp_note"] = (  # what its peers read in their last round is unknown
            "not computed: a host was lost (what its peers received before it died is not "
            "recorded, so their views cannot be bounded)"
        )
        return columns, []
    scales, decay = _view_scales(config, fold_run)
    summary, distances = network_dp.report(  # the view of every peer as it happened
        trace,
        fold_run.mixing,
        fold_run.privacy.mechanism,
        scales=scales,
        decay=decay,
        delta=config.privacy.delta,
    )
    columns.update(summary)
    return columns, distances


def _correlated_columns(
    config: ScenarioConfig,
    fold_run: _IterativeFold,
    trace: Any,
    network: Any,
) -> dict[str, Any]:
    """The correlated-noise columns (:func:`p2pdp.protocols.correlated_dp.report`) of a run
    with pairwise noise. ConfigError if a threat model other than ``local`` calibrated the
    noise on a loss-free run and this one lost or delayed a message."""
    from p2pdp.protocols import correlated_dp

    assert trace is not None
    settings = config.protocol
    if settings.threat_model != "local" and not _same_trace(
        trace, correlated_dp.loss_free_trace(fold_run.mixing, settings.rounds)
    ):
        raise ConfigError(
            f"protocol.threat_model = {settings.threat_model!r}: the noise was "
            "calibrated on a run in which every message arrives in time, and this one lost "
            "or delayed some (network.latency_mean, bandwidth vs protocol.round_period): "
            "its epsilon against that threat model would exceed privacy.epsilon"
        )
    scales, decay = _view_scales(config, fold_run)
    return correlated_dp.report(
        trace,
        fold_run.mixing,
        fold_run.privacy.mechanism,
        scales=scales,
        decay=decay,
        pair_noise_multiplier=fold_run.protocol.pair_noise_multiplier,
        delta=config.privacy.delta,
        churn=config.gossip.churn or bool(network and network.hosts_lost),
        ratio=(  # the calibration's own, so its views are found, not recomputed
            None if settings.threat_model == "local" else settings.pairwise_noise_multiplier
        ),
    )


def _view_scales(config: ScenarioConfig, fold_run: _IterativeFold) -> tuple[np.ndarray, float]:
    """``(scales, decay)`` of the views of a run (network DP, correlated noise): per peer, the
    step size over its step's denominator (how far one record moves an update), and
    ``1 - step_size * lam`` (how much of a model survives a step)."""
    step_size = config.protocol.step_size
    denominators = fold_run.privacy.mechanism.denominators(fold_run.problem.sizes)
    return step_size / denominators, 1.0 - step_size * fold_run.problem.lam


def _same_trace(trace: Any, expected: Any) -> bool:
    """Whether two :class:`~p2pdp.protocols.network_dp.ViewTrace` recorded the same events."""
    if len(trace.events) != len(expected.events):
        return False
    for got, want in zip(trace.events, expected.events, strict=True):
        if isinstance(want, np.ndarray):
            if not (isinstance(got, np.ndarray) and np.array_equal(got, want)):
                return False
        elif isinstance(got, np.ndarray) or not all(
            np.array_equal(a, b) for a, b in zip(got, want, strict=True)
        ):
            return False
    return True


def guarantee_label(event: Any) -> str:
    """``"none"`` (no guarantee), the event's own ``label`` if it has one, else ``"exact"``.

    ``event``: a :class:`~p2pdp.privacy.events.PrivacyEvent` (a mechanism's :meth:`event`).
    """
    if not event.private:
        return "none"
    return str(getattr(event, "label", "exact"))


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
