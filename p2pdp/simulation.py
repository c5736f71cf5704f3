"""One-call API: :func:`simulate` one fold of a scenario and get a :class:`RunResult`.

Randomness: every stream is derived by name from ``config.seed`` (plus fold and repetition)
through :mod:`p2pdp.rng`, so the same config, fold and repetition always give identical
results, and cells of a sweep that differ only in, e.g., the publication mode share folds,
shards, local models, group draws and noise streams (common random numbers).
"""

from __future__ import annotations

import time
import tracemalloc
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig, flat_settings
from p2pdp.errors import ConfigError, PrivacyWarning
from p2pdp.evaluation import Metrics, build_ensembles, evaluate_ensembles, linear_error
from p2pdp.learning import GRADIENT_TOLERANCE
from p2pdp.mechanisms import make_mechanism
from p2pdp.pipeline import TrainedPeers, prepare_peers
from p2pdp.rng import generator
from p2pdp.sim.world import World


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """Outcome of one simulated run (one fold, one repetition).

    Errors are fractions of misclassified test rows in [0, 1]; times are seconds (``sim_time``
    simulated, until the last group finished; ``wall_times`` real per phase: training,
    simulation, evaluation); epsilon is the per-peer budget charged under the configured
    accountant. ``guarantee_per_aggregation`` is the (epsilon, delta) one release actually
    guarantees: the charged epsilon for every mechanism except ``seed-laplace`` (sqrt(d)
    times it) and ``none`` (infinite).
    """

    config: ScenarioConfig
    fold: int
    repetition: int
    metrics: Metrics
    centralized_error: float
    local_only_error: float
    aggregations: int
    aborted_groups: int
    aggregations_per_peer: np.ndarray
    epsilon_spent: np.ndarray
    ensemble_sizes: np.ndarray
    sim_time: float
    messages_sent: int
    bytes_sent: int
    messages_lost: int
    stop_reason: str
    data_dependent_bounds: bool
    guarantee_per_aggregation: tuple[float, float]
    wall_times: dict[str, float] = field(default_factory=dict)
    peak_memory_mb: float = float("nan")

    def row(self) -> dict[str, Any]:
        """Flat results row: every config setting, the seed, and the scalar metrics."""
        row = flat_settings(self.config)
        row.update(fold=self.fold, repetition=self.repetition)
        row.update(self.metrics.summary())
        row.update(
            centralized_error=self.centralized_error,
            local_only_error=self.local_only_error,
            aggregations=self.aggregations,
            aborted_groups=self.aborted_groups,
            mean_aggregations_per_peer=float(self.aggregations_per_peer.mean()),
            max_epsilon_spent=float(self.epsilon_spent.max()),
            mean_ensemble_size=float(self.ensemble_sizes.mean()),
            sim_time=self.sim_time,
            messages_sent=self.messages_sent,
            bytes_sent=self.bytes_sent,
            messages_lost=self.messages_lost,
            stop_reason=self.stop_reason,
            data_dependent_bounds=self.data_dependent_bounds,
            guaranteed_epsilon_per_aggregation=self.guarantee_per_aggregation[0],
            guaranteed_delta_per_aggregation=self.guarantee_per_aggregation[1],
        )
        row.update({f"wall_{phase}_s": seconds for phase, seconds in self.wall_times.items()})
        return row


def simulate(
    config: ScenarioConfig,
    *,
    fold: int = 0,
    repetition: int = 0,
    trained: TrainedPeers | None = None,
    track_memory: bool = False,
) -> RunResult:
    """Simulate fold ``fold`` of ``config`` (its ``sweep`` is ignored) and evaluate it.

    Parameters
    ----------
    config : ScenarioConfig
    fold : int
        Cross-validation fold in ``[0, evaluation.cv_folds)`` (0 for a fixed split).
    repetition : int
        Independent repetition index (>= 0): changes every random stream.
    trained : TrainedPeers, optional
        Local models from :func:`p2pdp.pipeline.prepare_peers` for the same training key,
        to share one training between cells.
    track_memory : bool
        Measure peak Python/numpy memory with :mod:`tracemalloc` (slower; for benchmarks).
    """
    if fold < 0 or (config.evaluation.split == "cv" and fold >= config.evaluation.cv_folds):
        raise ConfigError(f"fold must be in [0, {config.evaluation.cv_folds}), got {fold}")
    if track_memory:
        tracemalloc.start()
    wall: dict[str, float] = {}
    start = time.perf_counter()
    if trained is None:
        trained = prepare_peers(config, fold=fold, repetition=repetition)
    wall["training"] = time.perf_counter() - start
    worst = float(trained.models.grad_norms.max())
    if worst > GRADIENT_TOLERANCE:  # the sensitivity bound assumes it
        raise ConfigError(
            f"local models must be solved to gradient norm <= {GRADIENT_TOLERANCE}, got {worst}"
        )

    start = time.perf_counter()
    privacy = config.privacy
    with warnings.catch_warnings():
        if privacy.mechanism in ("none", "seed-laplace"):  # chosen explicitly in the config
            warnings.simplefilter("ignore", PrivacyWarning)
        mechanism = make_mechanism(
            privacy.mechanism,
            epsilon=privacy.epsilon_per_aggregation,
            delta=privacy.delta_per_aggregation if privacy.mechanism == "gaussian" else None,
        )
    rngs = {
        name: generator(config.seed, name, fold, repetition)
        for name in ("protocol", "network", "noise", "shares")
    }
    world = World(config, trained.models.weights, trained.models.shard_sizes, mechanism, rngs=rngs)
    world.run()
    wall["simulation"] = time.perf_counter() - start

    start = time.perf_counter()
    data = trained.fold
    weights = trained.models.weights
    published = np.array(world.published).reshape(len(world.published), weights.shape[1])
    pairs = np.array(world.receipts, dtype=np.int64).reshape(-1, 2)
    ensembles = build_ensembles(
        weights, published, np.array(world.shared), pairs[:, 0], pairs[:, 1]
    )
    metrics = evaluate_ensembles(ensembles, data.X_test, data.y_test, vote=config.evaluation.vote)
    centralized_error = float(linear_error(trained.centralized, data.X_test, data.y_test)[0])
    local_only_error = float(linear_error(weights, data.X_test, data.y_test).mean())
    wall["evaluation"] = time.perf_counter() - start

    peak_mb = float("nan")
    if track_memory:
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    transport = world.transport
    return RunResult(
        config=config,
        fold=fold,
        repetition=repetition,
        metrics=metrics,
        centralized_error=centralized_error,
        local_only_error=local_only_error,
        aggregations=world.monitor.aggregations,
        aborted_groups=world.monitor.aborted,
        aggregations_per_peer=world.ledger.aggregations(),
        epsilon_spent=world.ledger.spent_epsilon(),
        ensemble_sizes=ensembles.sizes(),
        sim_time=world.monitor.end_time,
        messages_sent=int(transport.messages_sent.sum() + transport.control_messages),
        bytes_sent=int(transport.bytes_sent.sum()),
        messages_lost=transport.messages_lost,
        stop_reason=world.monitor.stop_reason,
        data_dependent_bounds=data.data_dependent_bounds,
        guarantee_per_aggregation=mechanism.guarantee(weights.shape[1]),
        wall_times=wall,
        peak_memory_mb=peak_mb,
    )
