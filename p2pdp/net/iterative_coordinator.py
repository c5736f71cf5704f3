"""The coordinator of an iterative run (D-PSGD, Muffliato) on the real network.

:class:`IterativeNetworkWorld` starts the host processes, enrolls them and sends the
directory as the one-shot coordinator does (:class:`~p2pdp.net.coordinator.NetworkWorld`,
whose session it reuses), then, instead of forming groups: it sends every host a ``START``
(round 1 begins ``START_DELAY`` seconds after it arrives, on each host's own clock), and
collects every host's ``ROUND`` report of every round (:mod:`p2pdp.net.iterative_host`):
the peers that stepped, the models delivered in time per exchange, the models sent, the late
ones, and the peers' models. From them it builds what the simulator's driver
(:func:`p2pdp.sim.iterative.run_iterative`) leaves: one ``rounds`` record per round (the
test errors it measures on the peers' models, the simulator's omniscient measurement, not a
release of the protocol), the message counters, and the
:class:`~p2pdp.protocols.views.ViewTrace` the privacy columns are computed from. It
never sees a step's noise: the hosts do not report it.

Faults. A host whose control connection closes before its final report (killed, crashed) is
lost: its peers are churned out for the rest of the run (they step no more, send nothing;
models to them are lost, as to an offline peer in the simulator), their last reported models
stay in the measurements, and the row counts ``hosts_lost``. A host whose report of a round
has not come ``timeout`` seconds after the round's end is killed and lost the same way, so a
silent host never stalls the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.net.control import count_field
from p2pdp.net.coordinator import NetworkWorld
from p2pdp.net.hosts import FINISH, STATS
from p2pdp.net.iterative_host import KEYED, LATE, ROUND, START, UNREACHABLE, IterativeSettings
from p2pdp.net.tls import host_name
from p2pdp.net.wire import ProtocolError, encode, frame_bytes, unpack_vector
from p2pdp.protocols.groups import model_bytes
from p2pdp.protocols.iterative_ledger import IterativeLedger
from p2pdp.protocols.iterative_peer import Stepped
from p2pdp.protocols.mixing import Mixing
from p2pdp.protocols.views import ViewTrace

__all__ = [
    "NETWORK_PROTOCOLS",
    "START_DELAY",
    "IterativeNetworkWorld",
    "IterativeTransport",
    "check_iterative",
]

log = logging.getLogger(__name__)

#: The iterative protocols the network runtime runs.
NETWORK_PROTOCOLS = ("dpsgd", "muffliato", "gossip-learning")
#: Refusal reasons (the hosts' and their machines') of models outside the protocol: the row's
#: ``messages_refused`` (a refused connection is not a message; honest drops, a model too far
#: ahead or older than its receiver remembers, are lost messages).
REFUSALS = ("model", "unknown", "duplicate", "not a neighbour", "no such exchange", "bad payload")
#: Seconds between the coordinator's START and round 1: time for the frame to reach every
#: host (their rounds then begin within its transit time of each other).
START_DELAY = 0.5


def check_iterative(config: ScenarioConfig) -> None:
    """ConfigError naming the first setting of an iterative ``config`` the network runtime
    does not run yet."""
    settings = config.protocol
    refusals = [
        (
            settings.name not in NETWORK_PROTOCOLS,
            "protocol.name",
            settings.name,
            f"{', '.join(map(repr, NETWORK_PROTOCOLS))} and 'one-shot'",
        ),
        (
            settings.threat_model != "local",
            "protocol.threat_model",
            settings.threat_model,
            "'local' (a threat model's calibration needs every peer's step denominator, "
            "which a host does not hold; set protocol.pairwise_noise_multiplier instead)",
        ),
        (
            config.gossip.churn,
            "gossip.churn",
            config.gossip.churn,
            "false (on the network, churn is a host lost: the simulated sessions are not played)",
        ),
    ]
    for refused, key, value, supported in refusals:
        if refused:
            raise ConfigError(
                f"{key} = {json.dumps(value)} is not supported by the network runtime yet; it "
                f"runs {supported}"
            )


@dataclass
class IterativeTransport:
    """The message counters of a network run, named as the simulator's Transport names
    them: models sent (per peer) and their simulated bytes (``64 + 8 d`` each), lost
    (undelivered and not late: a receiver gone, or never arrived) and late (arrived past
    their exchange's deadline, not averaged; gossip learning merges a late model, so none)."""

    messages_sent: np.ndarray
    bytes_sent: np.ndarray
    messages_lost: int = 0
    messages_late: int = 0
    messages_refused: int = 0


class IterativeNetworkWorld(NetworkWorld):
    """One iterative run between host processes (see the module docstring).

    Parameters
    ----------
    mixing : Mixing
        The overlay's Metropolis-Hastings weights (the hosts build the same from the seed).
    iterative : IterativeSettings
    record : callable
        ``record(round, now, world) -> dict``: the ``rounds`` table's record after ``round``
        (0: before the first), ``now`` wall seconds since round 1 began, from the world's
        :attr:`models`, :attr:`records` and :meth:`counts` (the simulator's record, built by
        the experiment).
    **session
        The session's arguments, as :class:`~p2pdp.net.coordinator.NetworkWorld`'s
        (``launch``, ``hosts``, ``settings``, ``authority``, ``bind``).

    Attributes
    ----------
    models : (P, d) array
        Every peer's model as its host last reported it (for rounds recorded so far).
    records : IterativeLedger
        The run's steps, averaged and late messages and view trace, from the hosts'
        reports of their machines' records (the simulator's ledger, filled the same way).
    """

    def __init__(
        self,
        config: Any,
        *,
        mixing: Mixing,
        iterative: IterativeSettings,
        record: Callable[[int, float, IterativeNetworkWorld], dict[str, Any]],
        **session: Any,
    ) -> None:
        n_peers = iterative.n_peers
        super().__init__(
            config,
            n_peers=n_peers,
            dim=iterative.dim,
            ledger=lambda dim: None,  # type: ignore[arg-type,return-value]  # no budget ledger
            rngs={"protocol": np.random.default_rng(0)},  # no groups are drawn
            **session,
        )
        self.mixing = mixing
        self.iterative = iterative
        self.record = record
        self.models = np.zeros((n_peers, iterative.dim))
        self.records = IterativeLedger(mixing, exchanges=iterative.exchanges, trace=True)
        self._reported_sent = np.zeros(n_peers, dtype=np.int64)  # by the rounds recorded
        self._arrived = np.zeros((iterative.rounds, n_peers), dtype=np.int64)  # by sender
        self._degree = np.diff(mixing.indptr)
        self.rounds: list[dict[str, Any]] = []
        self.end_time = 0.0
        self.transport_counts = IterativeTransport(
            messages_sent=np.zeros(n_peers, dtype=np.int64),
            bytes_sent=np.zeros(n_peers, dtype=np.int64),
        )
        #: round -> host -> its checked report, until the round is recorded
        self._pending: dict[int, dict[int, dict[str, Any]]] = {}
        self._lost = 0  # models the hosts could not deliver, in the rounds recorded
        self.gossip = config.protocol.name == "gossip-learning"
        self._reported = np.zeros(self.n_hosts, dtype=np.int64)  # per host: its last round
        self._progress = asyncio.Event()
        self._own = [np.flatnonzero(self.host_of == h) for h in range(self.n_hosts)]
        receivers = mixing.receivers
        self._into = [np.flatnonzero(self.host_of[receivers] == h) for h in range(self.n_hosts)]
        self._keyed: set[int] = set()  # hosts whose peers hold every pair secret
        self._all_keyed = asyncio.Event()

    def _accounting(self, dim: int) -> None:
        self.dim = dim  # an iterative run books no releases: its budget is in the steps

    @property
    def control_bytes(self) -> int:
        """The largest control frame a host sends: a round's report (its peers' models, the
        edges into them per exchange, its late ones of two rounds) or its final report."""
        peers, edges = self.n_peers, len(self.mixing.indices)
        exchanges = self.iterative.exchanges
        return (
            frame_bytes(self.iterative.dim * peers, peers)
            + 10 * edges * (3 * exchanges + 2)
            + 64 * peers
            + 4096
        )

    # -- control frames ----------------------------------------------------------------------
    def _on_control(
        self,
        message: dict[str, Any],
        who: str | None,
        writer: asyncio.StreamWriter,
        host: int | None,
    ) -> int | None:
        kind = message["kind"]
        if kind == KEYED:
            if host is None or not self.iterative.pair_keys or host in self._keyed:
                raise ProtocolError(f"{who!r} says keyed out of turn")
            self._keyed.add(host)
            if len(self._keyed) == self.n_hosts:
                self._all_keyed.set()
            return host
        if kind == ROUND:
            claimed = count_field(message["host"], "host", self.n_hosts)
            if who != host_name(claimed) or host != claimed:
                raise ProtocolError(f"{who!r} reports a round of host {claimed}")
            self._round_report(claimed, message)
            return host
        if kind == STATS:
            claimed = count_field(message["host"], "host", self.n_hosts)
            late = self._late(claimed, message.get("late", []))
            host = super()._on_control(message, who, writer, host)
            self._read_late(late)
            return host
        return super()._on_control(message, who, writer, host)

    def _late(self, host: int, value: Any) -> np.ndarray:
        """A report's late models ``[[slot, edge], ...]``, checked: edges into the host's own
        peers, exchanges already over; (n, 2) int array."""
        into = set(self._into[host].tolist())
        late = [
            (
                count_field(slot, "late slot", self.iterative.slots),
                count_field(edge, "late edge", 2**31),
            )
            for slot, edge in value
        ]
        if any(edge not in into for _, edge in late):
            raise ProtocolError(f"host {host} reports late models to another host's peers")
        return np.array(late, dtype=np.int64).reshape(-1, 2)

    def _round_report(self, host: int, message: dict[str, Any]) -> None:
        """Host ``host``'s report of its next round, every field checked before anything
        counts (a bad report raises and changes nothing)."""
        settings = self.iterative
        round_ = count_field(message["round"], "round", settings.rounds + 1)
        if round_ != self._reported[host] + 1:
            raise ProtocolError(f"host {host} reports round {round_} after {self._reported[host]}")
        own = self._own[host]
        stepped = np.array(
            [count_field(p, "stepped", self.n_peers) for p in message["stepped"]], int
        )
        once = self.gossip or len(set(stepped.tolist())) == len(stepped)  # gossip: per merge
        if not np.isin(stepped, own).all() or not once:
            raise ProtocolError(f"host {host} says another host's peers stepped")
        into = self._into[host]
        delivered = message["delivered"]
        if len(delivered) != settings.exchanges:
            raise ProtocolError(f"host {host} reports {len(delivered)} exchanges")
        edges = [
            np.array([count_field(e, "edge", 2**31) for e in ex], dtype=np.int64)
            for ex in delivered
        ]
        for ex in edges:
            once = self.gossip or len(set(ex.tolist())) == len(ex)  # gossip: per merge
            if not np.isin(ex, into).all() or not once:
                raise ProtocolError(f"host {host} reports deliveries to another host's peers")
        sent = np.array([count_field(n, "sent", 2**31) for n in message["sent"]], dtype=np.int64)
        if len(sent) != len(own) or (sent > self._degree[own] * settings.exchanges).any():
            raise ProtocolError(f"host {host} reports {sent.tolist()[:8]} models sent")
        late = self._late(host, message["late"])
        lost = count_field(message["lost"], "lost", 2**31)
        models = unpack_vector(message["models"], shape=(len(own), settings.dim))
        # every field is good: count it (the round's part when the round is recorded)
        self._read_late(late)
        self._pending.setdefault(round_, {})[host] = {
            "stepped": stepped,
            "delivered": edges,
            "sent": sent,
            "lost": lost,
            "models": models,
        }
        self._reported[host] = round_
        self._progress.set()

    def _read_late(self, late: np.ndarray) -> None:
        """Late models ``(slot, edge)`` into the ledger (a model read late is in its
        receiver's view: network DP counts it)."""
        exchanges = self.iterative.exchanges
        for slot, edge in late.tolist():
            mask = np.zeros(len(self.mixing.indices), dtype=bool)
            mask[edge] = True
            round_, exchange = slot // exchanges + 1, slot % exchanges
            self.records.exchanged(round_, exchange, np.zeros_like(mask), mask)
            self._arrived[round_ - 1, self.mixing.indices[edge]] += 1

    def _apply(self, round_: int) -> None:
        """Round ``round_``'s reports into the ledger, the counts and the models."""
        for host, report in self._pending.pop(round_, {}).items():
            self._lost += report["lost"]
            if self.gossip:  # a step per merge: a peer may step several times a round
                self.records.take(Stepped(int(p), round_, 0) for p in report["stepped"])
                (edges,) = report["delivered"]
                np.add.at(self._arrived[round_ - 1], self.mixing.indices[edges], 1)
                self._reported_sent[self._own[host]] += report["sent"]
                self.models[self._own[host]] = report["models"]
                continue
            self.records.stepped(round_, report["stepped"])
            for exchange, edges in enumerate(report["delivered"]):
                delivered = np.zeros(len(self.mixing.indices), dtype=bool)
                delivered[edges] = True
                self.records.exchanged(round_, exchange, delivered, np.zeros_like(delivered))
                np.add.at(self._arrived[round_ - 1], self.mixing.indices[edges], 1)
            self._reported_sent[self._own[host]] += report["sent"]
            self.models[self._own[host]] = report["models"]

    def _host_lost(self, host: int, why: str) -> None:
        super()._host_lost(host, why)
        self._progress.set()

    # -- the rounds --------------------------------------------------------------------------
    def sent(self, through: int) -> np.ndarray:
        """(P,) models each peer sent in rounds 1 .. ``through``: as its host reported them;
        for a lost host's peers after its last report, those that arrived (averaged or
        late: they were sent; what never arrived is lost with the host's counts)."""
        sent = self._reported_sent.copy()
        for host in self.lost_hosts:
            own = self._own[host]
            sent[own] += self._arrived[self._reported[host] : through, own].sum(axis=0)
        return sent

    def counts(self, round_: int) -> tuple[int, int]:
        """Models sent in rounds 1 .. ``round_`` (recorded), and of them those not averaged
        (lost or late), as the simulator's record counts them (gossip learning: those whose
        receiver's host could not be reached; a model in flight at the end is not lost)."""
        sent = int(self.sent(round_).sum())
        if self.gossip:
            return sent, self._lost
        return sent, sent - self.records.averaged

    def _record(self, round_: int, now: float) -> None:
        self._apply(round_)
        self.rounds.append(self.record(round_, now, self))

    async def _groups(self) -> None:
        """The run's rounds: START, then every round's reports as they come (a host silent
        past a round's end and ``timeout`` is killed and lost)."""
        settings = self.iterative
        loop = asyncio.get_running_loop()
        if settings.pair_keys:  # every pair's secret agreed before any step
            await self._wait(self._all_keyed, 3 * self.settings.timeout, "every host's pair keys")
        start = encode({"kind": START, "delay": START_DELAY})
        for host in list(self._hosts):
            self._tell(host, start, START)
        began = loop.time() + START_DELAY
        self._record(0, 0.0)
        for round_ in range(1, settings.rounds + 1):
            until = began + round_ * settings.period + self.settings.timeout
            while True:
                waiting = [
                    h
                    for h in range(self.n_hosts)
                    if h not in self.lost_hosts and self._reported[h] < round_
                ]
                if not waiting or loop.time() > until:
                    break
                self._progress.clear()
                try:
                    await asyncio.wait_for(self._progress.wait(), until - loop.time())
                except TimeoutError:
                    pass
            for h in waiting:
                self._host_lost(h, f"no report of round {round_} in time")
                self.processes[h].kill()
            self._record(round_, loop.time() - began)
        self.end_time = loop.time() - began
        self.monitor.stop_reason = "rounds"

    async def _finish(self) -> None:
        """Tell every host the run is over; gather what each sent and refused."""
        finish = encode({"kind": FINISH, "publications": 0, "released": []})
        await self._gather_final_reports(lambda host: finish)
        for round_ in sorted(self._pending):  # a lost host's last reports, if unrecorded
            self._apply(round_)
        self._count_messages()

    def _count_messages(self) -> None:
        """The run's message counters (:class:`IterativeTransport`) from the hosts' reports."""
        counts = self.transport_counts
        counts.messages_sent = self.sent(self.iterative.rounds)
        counts.bytes_sent = counts.messages_sent * model_bytes(self.iterative.dim)
        counts.messages_late = self.records.late
        counts.messages_lost = int(counts.messages_sent.sum()) - self.records.averaged
        counts.messages_lost -= self.records.late
        if self.gossip:  # merged on arrival, a late model too (the wire table's "late"):
            # lost only if undeliverable, and none left unmerged for being late
            counts.messages_lost, counts.messages_late = self.wire.refused[UNREACHABLE], 0
        counts.messages_refused = sum(
            count for reason, count in self.wire.refused.items() if reason in REFUSALS
        )
        self.wire.frames[LATE] = self.records.late

    def trace(self) -> ViewTrace:
        """The run as it happened, for the privacy columns: every round's steps, then each of
        its exchanges' averaged and late models (:meth:`IterativeLedger.trace
        <p2pdp.protocols.iterative_ledger.IterativeLedger.trace>`)."""
        return self.records.trace(self.iterative.rounds)
