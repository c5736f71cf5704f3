"""What one simulated run returns (:class:`RunResult`, from
:func:`p2pdp.experiments.run.simulation.simulate`), its rows and tables, and the log of its
releases (:class:`ReleaseLog`), shared by the one-shot
(:mod:`~p2pdp.experiments.run.oneshot`) and iterative
(:mod:`~p2pdp.experiments.run.iterative`) assembly of a run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig, flat_settings, settings_read
from p2pdp.core.columns import Rows
from p2pdp.experiments.results.tables import ColumnTable, RowSequence
from p2pdp.privacy.release import ReleaseRecord, ReleaseTable
from p2pdp.protocols import ITERATIVE_COLUMNS
from p2pdp.sim.world import WorldObserver
from p2pdp.tasks import Evaluation

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


def guarantee_label(event: Any) -> str:
    """``"none"`` (no guarantee), the event's own ``label`` if it has one, else ``"exact"``.

    ``event``: a :class:`~p2pdp.privacy.events.PrivacyEvent` (a mechanism's :meth:`event`).
    """
    if not event.private:
        return "none"
    return str(getattr(event, "label", "exact"))
