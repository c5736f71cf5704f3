"""One fold of an iterative protocol (``protocol.name`` not ``one-shot``; D-PSGD, Muffliato,
gossip learning), :func:`simulate_iterative`: the peers' local problems, the overlay and the
protocol, its rounds (simulated, or between host processes), the scores and the privacy of
the views of the run, and the :class:`~.result.RunResult` they make.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.core.progress import set_phase
from p2pdp.core.rng import generator
from p2pdp.experiments.run.phases import _Phases, _trained
from p2pdp.experiments.run.result import RunResult, guarantee_label
from p2pdp.learning.local_problem import gradient_model
from p2pdp.protocols import ITERATIVE_COLUMNS
from p2pdp.tasks import check_min_shard_size


def check_budget(config: ScenarioConfig) -> None:
    """ConfigError if no peer's budget affords one private step of an iterative protocol
    at the given ``protocol.noise_multiplier`` (a calibrated one always affords
    ``protocol.rounds``); one-shot budgets are checked by the config itself."""
    settings = config.protocol
    if settings.iterative and settings.noise_multiplier is not None:
        from p2pdp.protocols.iterative import step_privacy

        step_privacy(config)


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
    (:class:`~p2pdp.protocols.peer_streams.StreamSeeds`); ``churn`` (sessions and
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
    ConfigError if it names something else or the task does not evaluate linear models."""
    from p2pdp.core.components import resolve
    from p2pdp.protocols.iterative import IterativeProtocol

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
    test rows, and every peer's local problem of ``training.model``'s loss
    (:class:`~p2pdp.learning.local_problem.LocalProblem`, one shard per peer). ConfigError if
    the model declares no per-record gradient (before any training), a shard is below
    ``privacy.min_shard_size`` or, with fixed-size sampling, smaller than
    ``protocol.batch_size``."""
    from p2pdp.learning.local_problem import LocalProblem

    model = gradient_model(config.training.model, config.protocol.name)  # before training
    trained = _trained(task, trained, fold=fold, repetition=repetition)
    data, shards = trained.training_rows()  # loaded again if drawn in blocks
    problem = LocalProblem.from_shards(
        data.X_train, data.y_train, shards, config.training.lam, model
    )
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
    (:class:`~p2pdp.protocols.views.ViewTrace`) where a bound needs them, else None."""
    from p2pdp.learning.evaluation import linear_error
    from p2pdp.protocols import views
    from p2pdp.sim.iterative import run_iterative

    protocol = fold_run.protocol
    needs_trace = protocol.network_dp or protocol.pair_noise_multiplier > 0
    trace = views.ViewTrace() if needs_trace else None

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
    """Whether two :class:`~p2pdp.protocols.views.ViewTrace` recorded the same events."""
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
