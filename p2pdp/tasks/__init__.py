"""Tasks: what peers compute, how a group aggregates it, and how a run is scored.

The world (:mod:`p2pdp.sim.world`) is task-agnostic: it forms groups, collects each member's
*statistic* (a vector), releases the group's aggregate through the mechanism at the task's
sensitivity, charges budgets and publishes. A task supplies everything else:

========================  ==========================================================
``prepare``               the costly, shareable part (data, local training) of one fold;
                          it must pickle (local workers share it through a file)
``training_key``          what ``prepare`` depends on: cells with equal keys share it
``statistics``            each peer's statistic, (P, d), and shard sizes, (P,)
``aggregate``             "mean", "sum" (also under secure aggregation) or a callable
``sensitivity``           L2 sensitivity of a group's aggregate, from its members' sizes
``evaluate``              score what peers received: an object with ``summary()``
``score_columns``         optional: the names ``summary()`` fills (left empty
                          by a network run nobody scores: ``score = false``)
========================  ==========================================================

Build the task a config names with :func:`make_task` (``task.name``: a registered name or an
import string ``package.module:Class``; the class is called with the ScenarioConfig).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.boundary import (
    calling,
    check_methods,
    check_number,
    check_numbers,
    is_builtin,
    problem,
)
from p2pdp.core.errors import ConfigError, PrivacyWarning
from p2pdp.core.rng import derive_seed, generator
from p2pdp.privacy.mechanisms import checked, make_mechanism, mechanism_class
from p2pdp.privacy.release import Aggregate, Releaser, ReleaseRecord

__all__ = [
    "Evaluation",
    "Outcome",
    "Task",
    "check_min_shard_size",
    "make_task",
    "received_releases",
    "release_path",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What a simulated run leaves for the task to score.

    Attributes
    ----------
    published : (K, d) array
        Every released aggregate, in release order.
    shared : (K,) bool array
        True where the release reached every peer (full publication, nobody offline).
    receipt_peers, receipt_models : (R,) int arrays
        The other receipts: peer ``receipt_peers[i]`` received release ``receipt_models[i]``.
    releases : sequence of ReleaseRecord
        Each release's public record (sensitivity, noise scale, ...), in release order (a
        simulated run's is a :class:`~p2pdp.privacy.release.ReleaseTable`: read a column of
        every record with :func:`~p2pdp.privacy.release.record_column`).
    members : sequence of (K_i,) int arrays
        The peers whose statistics each release aggregates, in release order (group
        membership is public: a receiver needs it to know which records a release covers,
        e.g. not to count the same records twice); a simulated run's is a
        :class:`~p2pdp.core.columns.Ragged` (its rows are views of one array).
    """

    published: np.ndarray
    shared: np.ndarray
    receipt_peers: np.ndarray
    receipt_models: np.ndarray
    releases: Sequence[ReleaseRecord]
    members: Sequence[np.ndarray] = ()


@runtime_checkable
class Evaluation(Protocol):
    """A task's scores of one run."""

    def summary(self) -> dict[str, Any]:
        """Scalar columns for the run's results row."""
        ...

    def peer_columns(self) -> dict[str, np.ndarray]:
        """Per-peer columns, each of shape (P,), for the ``peers`` table."""
        ...


class Task(Protocol):
    """What a workload must provide to run on the engine (see the module docstring).

    A task class is constructed with the run's :class:`~p2pdp.config.ScenarioConfig`.

    Privacy contract: :meth:`sensitivity` must bound, in L2 norm, how much the group's
    aggregate of :meth:`statistics` can change under the task's neighbouring relation
    (state it in the class docstring, e.g. "replace one record of one peer's shard"); the
    mechanism's guarantee holds only under that bound. :meth:`evaluate` may read anything
    (it models what peers do with what they received, and the experimenter's scoring);
    label any use of data other than a peer's own and what it received as non-private.
    """

    name: ClassVar[str]

    @property
    def aggregate(self) -> Aggregate:
        """``"mean"``, ``"sum"`` or a callable (K, d) -> (d,). A callable class attribute must
        be a ``staticmethod``: a plain function would be bound as a method of the task."""
        ...

    def training_key(self, *, fold: int, repetition: int) -> tuple: ...

    def prepare(self, *, fold: int, repetition: int) -> Any: ...

    def statistics(self, prepared: Any) -> tuple[np.ndarray, np.ndarray]: ...

    def sensitivity(self, sizes: list[int]) -> float: ...

    def evaluate(self, prepared: Any, outcome: Outcome) -> Evaluation: ...


def make_task(config: ScenarioConfig) -> Task:
    """The task ``config.task.name`` names, built for ``config``."""
    from p2pdp.core.components import resolve

    cls = resolve("task", config.task.name, key="task.name")
    with calling("task", cls, "__init__"):
        task = cls(config)
    check_methods(task, "task", TASK_METHODS, "p2pdp.tasks.Task")
    aggregate = getattr(task, "aggregate", None)
    if aggregate not in ("mean", "sum") and not callable(aggregate):
        raise problem("task", task, "aggregate", "must be 'mean', 'sum' or a function")
    return task


#: What the engine calls on a task (see :class:`Task`).
TASK_METHODS = ("training_key", "prepare", "statistics", "sensitivity", "evaluate")


def prepared(task: Task, *, fold: int, repetition: int) -> Any:
    """``task.prepare``, with an exception inside it named as the task's."""
    with calling("task", task, "prepare"):
        return task.prepare(fold=fold, repetition=repetition)


def check_own_rows(task: Task) -> None:
    """ConfigError naming ``task.name`` if the task cannot prepare a host's peers from their
    own rows only (it has no ``prepare_own``): it cannot run from per-host shard files."""
    if not callable(getattr(task, "prepare_own", None)):
        raise ConfigError(
            f"task.name = {task.name!r} cannot run from per-host shard files (p2pdp split, a "
            "hosts file's data): the task has no prepare_own(X, y, shards, ...) method"
        )


def prepared_own(
    task: Task,
    X: np.ndarray,
    y: np.ndarray,
    shards: tuple[np.ndarray, ...],
    *,
    data_dependent_bounds: bool,
    fold: int,
    repetition: int,
) -> Any:
    """What ``task.prepare`` gives, for one host's peers from their own rows only (a
    per-host shard file): ``task.prepare_own``, which a task that can run from per-host data
    provides; ConfigError naming ``task.name`` for one that does not (:func:`check_own_rows`)."""
    check_own_rows(task)
    with calling("task", task, "prepare_own"):
        return task.prepare_own(  # type: ignore[attr-defined]
            X,
            y,
            shards,
            data_dependent_bounds=data_dependent_bounds,
            fold=fold,
            repetition=repetition,
        )


def task_statistics(task: Task, prepared: Any, n_peers: int) -> tuple[np.ndarray, np.ndarray]:
    """``task.statistics``, checked: finite numbers (P, d) or (P, R, d), sizes (P,) >= 1."""
    with calling("task", task, "statistics"):
        statistics, sizes = task.statistics(prepared)
    statistics = check_numbers(statistics, "task", task, "statistics")
    if statistics.ndim not in (2, 3) or statistics.shape[0] != n_peers:
        raise problem(
            "task",
            task,
            "statistics",
            f"returned statistics of shape {statistics.shape}, expected ({n_peers}, d) or "
            f"({n_peers}, releases, d)",
        )
    sizes = check_numbers(sizes, "task", task, "statistics (sizes)", shape=(n_peers,))
    if (sizes < 1).any():
        raise problem("task", task, "statistics (sizes)", "returned a shard size < 1")
    return statistics, sizes


def sensitivity_of(task: Task, min_shard_size: int | None = None) -> Callable[[list[int]], float]:
    """``task.sensitivity`` as the world calls it per group, checked (a plug-in's): a number
    > 0, finite.

    ``min_shard_size`` (``privacy.min_shard_size``): the sensitivity of a group of that many
    members each holding exactly that many records, whatever sizes they claim; a claim below
    it raises ConfigError (a curator refuses such a member).
    """
    if is_builtin(task):
        checked = task.sensitivity
    else:

        def checked(sizes: list[int]) -> float:
            with calling("task", task, "sensitivity"):
                value = task.sensitivity(sizes)
            value = check_number(value, "task", task, "sensitivity")
            if value == 0:
                raise problem("task", task, "sensitivity", "returned 0: no noise would be added")
            return value

    if min_shard_size is None:
        return checked
    minimum = min_shard_size

    def public(sizes: list[int]) -> float:
        if min(sizes) < minimum:
            raise ConfigError(
                f"a group member holds {min(sizes)} records, below privacy.min_shard_size = "
                f"{minimum}"
            )
        return checked([minimum] * len(sizes))

    return public


def check_min_shard_size(sizes: np.ndarray, min_shard_size: int | None) -> None:
    """ConfigError naming the first peer whose shard is below ``privacy.min_shard_size``."""
    if min_shard_size is None:
        return
    small = np.flatnonzero(np.asarray(sizes) < min_shard_size)
    if small.size:
        peer = int(small[0])
        raise ConfigError(
            f"privacy.min_shard_size = {min_shard_size}, but peer {peer} holds "
            f"{int(sizes[peer])} records ({small.size} peers hold fewer): lower the bound or "
            "give every peer more records"
        )


def evaluated(task: Task, prepared: Any, outcome: Outcome) -> Evaluation:
    """``task.evaluate``, checked to return an :class:`Evaluation`."""
    with calling("task", task, "evaluate"):
        evaluation = task.evaluate(prepared, outcome)
    check_methods(evaluation, "task", ("summary", "peer_columns"), "p2pdp.tasks.Evaluation")
    return evaluation


def received_releases(outcome: Outcome, n_peers: int) -> tuple[list[int], list[tuple[int, ...]]]:
    """Releases every peer received (broadcasts) and, per peer, the others it received.

    Returns ``(shared, extra)``: indices of the releases that reached everyone, and for each
    peer a sorted tuple of the other releases it received (group publication).
    """
    shared = np.flatnonzero(outcome.shared).tolist()
    extra: list[list[int]] = [[] for _ in range(n_peers)]
    for peer, index in zip(
        outcome.receipt_peers.tolist(), outcome.receipt_models.tolist(), strict=True
    ):
        extra[peer].append(index)
    return shared, [tuple(sorted(set(indices))) for indices in extra]


def release_path(
    config: ScenarioConfig, task: Any, dim: int, *, fold: int, repetition: int
) -> tuple[Any, Releaser, dict[str, np.random.Generator]]:
    """The run's mechanism (calibrated, checked), its Releaser and its named random streams
    (``protocol``, ``network``, ``noise``, ``shares``): the same for the simulator and for
    every process of the network runtime."""
    privacy = config.privacy
    with warnings.catch_warnings():
        if privacy.mechanism in ("none", "seed-laplace"):  # chosen explicitly in the config
            warnings.simplefilter("ignore", PrivacyWarning)
        mechanism_cls = mechanism_class(privacy.mechanism)
        if hasattr(mechanism_cls, "from_config"):  # calibrated by settings beyond [privacy]
            with calling("mechanism", mechanism_cls, "from_config"):
                mechanism = mechanism_cls.from_config(config)
        else:
            mechanism = make_mechanism(
                privacy.mechanism,
                epsilon=privacy.step_epsilon,
                delta=privacy.delta_per_aggregation if privacy.approximate else None,
            )
    if getattr(mechanism, "local", False) and not getattr(task, "locally_private", False):
        raise ConfigError(
            f"privacy.mechanism = {privacy.mechanism!r} declares privacy applied locally, but "
            f"task {config.task.name!r} shares exact statistics (it does not declare "
            "locally_private): the claim would be false"
        )
    mechanism = checked(mechanism, dim)
    rngs = {
        name: generator(config.seed, name, fold, repetition)
        for name in ("protocol", "network", "noise", "shares")
    }
    releaser = Releaser(
        mechanism,
        dim,
        aggregate=task.aggregate,
        secure=privacy.secure_aggregation,
        noise_rng=rngs["noise"],
        share_rng=rngs["shares"],
        member_seed=derive_seed(config.seed, "member noise", fold, repetition),
    )
    return mechanism, releaser, rngs
