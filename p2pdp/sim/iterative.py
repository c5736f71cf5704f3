"""The SimPy drivers of the iterative protocols (:mod:`p2pdp.protocols.iterative`).

The same clock, transport model (latency, bandwidth, loss) and overlay as the one-shot world.
Two drivers run the same protocol, chosen by :func:`run_iterative`'s ``driver``:

* ``"batched"`` (the default, the fast path): the protocol object holds every peer's model
  and budget in arrays; one SimPy event per exchange.
* ``"reference"``: every peer is its own transport-free machine
  (:mod:`p2pdp.protocols.iterative_peer`, from :meth:`IterativeProtocol.peer
  <p2pdp.protocols.iterative.IterativeProtocol.peer>`): each message is its own SimPy event
  delivered to its receiver's ``on_message``, each deadline calls the machines'
  ``on_deadline``. The network's random draws are made in the same order as the batched
  driver's (an exchange's messages in the overlay's edge order), and each peer draws its
  noise and sampling from its own streams in both, so the two give the same rows and rounds
  table (to float rounding: the batched sums run in another order). One difference, under
  churn only: a late message that reaches a peer offline at its arrival is lost here, and
  read-late in the batched driver (which decides lateness when it is sent); both count it
  in ``messages_lost`` (lost or late).

Both drivers take a run's privacy from the protocol's records
(:class:`~p2pdp.protocols.iterative_ledger.IterativeLedger`), never on their own.

* **Synchronous** (``dpsgd``, ``muffliato``): a round lasts ``protocol.round_period``
  simulated seconds, split into ``gossip_steps`` exchanges. In each exchange every peer sends
  its model to each overlay neighbour; :meth:`Transport.exchange
  <p2pdp.sim.transport.Transport.exchange>` draws every message's delay and loss at once, and
  a message that is lost or arrives after the exchange's deadline is not averaged (its weight
  stays on the receiver's own model). One SimPy event per exchange, not per message: the
  messages of an exchange cannot interleave with anything.
* **Asynchronous** (``gossip-learning``): every peer wakes every ``round_period`` seconds
  (a uniform random phase in the first period) and sends its model with
  :meth:`Transport.send <p2pdp.sim.transport.Transport.send>`, one event per message; the
  receiver merges and steps when it arrives. Messages still in flight at the end are dropped.
  The reference driver runs the same events through the machines' ``on_wake`` and
  ``on_message``.

With ``gossip.churn`` peers alternate online sessions and offline downtimes as in gossip
group formation (:class:`~p2pdp.sim.gossip.faults.Faults`, switches applied at each round's
start): an offline peer takes no step and sends nothing, and a message to an offline peer is
lost. The crash probabilities of ``[gossip]`` belong to group formation and are not used here.

After every round (and before the first) the driver records one row of the ``rounds`` table:
consensus distance, bytes sent so far, messages lost or late so far (synchronous: messages
sent minus those averaged), steps, epsilon spent, and every ``eval_every`` rounds (and the
last) the mean and worst peer test error (NaN on the other rows).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import simpy

from p2pdp.config import ScenarioConfig
from p2pdp.core.errors import ConfigError
from p2pdp.protocols.groups import model_bytes
from p2pdp.protocols.iterative import IterativeProtocol
from p2pdp.protocols.iterative_ledger import IterativeLedger
from p2pdp.protocols.iterative_peer import (
    Deadline,
    GossipPeer,
    IterativePeer,
    RoundEnd,
    Send,
    SynchronousPeer,
)
from p2pdp.protocols.views import ViewTrace
from p2pdp.sim.transport import Transport

#: How :func:`run_iterative` drives the peers: ``"batched"`` (arrays, the default) or
#: ``"reference"`` (one machine per peer, one event per message).
ITERATIVE_DRIVERS = ("batched", "reference")


def consensus_distance(models: np.ndarray) -> float:
    """Mean squared distance of the peers' models to their average: ``mean_i ||w_i - w_bar||^2``."""
    return float(((models - models.mean(axis=0)) ** 2).sum(axis=1).mean())


class _Online:
    """Which peers are online, switched by :class:`~p2pdp.sim.gossip.faults.Faults`."""

    def __init__(self, env: simpy.Environment, n_peers: int) -> None:
        self.env = env
        self.online = np.ones(n_peers, dtype=bool)

    def set_online(self, peers: np.ndarray, online: bool) -> None:
        self.online[peers] = online


def _no_crash() -> float:
    return 1.0  # the crash draws of group formation: never used by the iterative driver


@dataclass(slots=True)
class IterativeRun:
    """What a driver leaves: the transport's counters, one record per round (0 included), the
    peers' final models (P, d), and the records (:class:`IterativeLedger`: steps, averaged)."""

    transport: Transport
    ledger: IterativeLedger
    models: np.ndarray
    rounds: list[dict[str, Any]] = field(default_factory=list)
    end_time: float = 0.0
    messages_lost: int = 0

    @property
    def steps(self) -> np.ndarray:
        """(P,) private steps each peer took (its local DP: ``privacy.epsilon(steps)``)."""
        return self.ledger.steps


def run_iterative(
    config: ScenarioConfig,
    protocol: IterativeProtocol,
    *,
    errors: Callable[[np.ndarray], np.ndarray],
    rng: np.random.Generator,
    churn_rng: np.random.Generator | None = None,
    on_round: Callable[[int], None] | None = None,
    trace: ViewTrace | None = None,
    driver: str = "batched",
) -> IterativeRun:
    """Run ``protocol`` for ``protocol.rounds`` rounds in a SimPy world.

    Parameters
    ----------
    config : ScenarioConfig
        ``[protocol]`` (rounds, period, eval_every) and ``[network]`` (the transport).
    protocol : IterativeProtocol
        Batched: its peers' state is updated in place. Reference: its :meth:`peer` machines
        run, and ``protocol`` itself is not stepped.
    errors : callable
        (P, d) models -> (P,) test error of each peer's model (for the ``rounds`` table).
    rng : numpy.random.Generator
        The network's stream (latencies, losses, wake-up phases).
    churn_rng : numpy.random.Generator, optional
        The churn's stream (sessions, downtimes; default ``rng``).
    on_round : callable, optional
        Called with each round's number once it is recorded (progress).
    trace : ViewTrace, optional
        Filled, for a synchronous protocol, from the records: the peers of every step and the
        delivered and late messages of every exchange (for
        :mod:`p2pdp.protocols.network_dp`).
    driver : "batched" or "reference"
        See the module docstring.

    Raises
    ------
    ConfigError
        Naming ``protocol.step_size`` when a model stops being finite (the steps diverge).
    """
    if driver not in ITERATIVE_DRIVERS:
        raise ConfigError(f"driver must be one of {ITERATIVE_DRIVERS}, got {driver!r}")
    world = _IterativeWorld(
        config,
        protocol,
        errors=errors,
        rng=rng,
        churn_rng=churn_rng,
        on_round=on_round,
        keep_trace=trace is not None,
        reference=driver == "reference",
    )
    return world.simulate(rng, trace)


class _IterativeWorld:
    """The SimPy world of one :func:`run_iterative` call, its steps named: the state both
    drivers share (clock, transport, records, who is online, the churn), the ``rounds`` row
    (:meth:`record`), the batched driver's rounds (:meth:`synchronous`), the reference
    driver's (:attr:`machines`; :meth:`per_peer`, :meth:`handle`) and the asynchronous
    protocol's wake-ups under either (:meth:`wake_ups`, :meth:`clock`)."""

    def __init__(
        self,
        config: ScenarioConfig,
        protocol: IterativeProtocol,
        *,
        errors: Callable[[np.ndarray], np.ndarray],
        rng: np.random.Generator,
        churn_rng: np.random.Generator | None,
        on_round: Callable[[int], None] | None,
        keep_trace: bool,
        reference: bool,
    ) -> None:
        self.protocol, self.settings = protocol, config.protocol
        self.errors, self.on_round = errors, on_round
        self.env = env = simpy.Environment()
        n_peers = protocol.problem.n_peers
        self.transport = Transport(env, config.network, n_peers, rng=rng)
        #: The reference driver's machines, one per peer (empty: the batched driver).
        self.machines: list[IterativePeer] = []
        if reference:
            self.machines = [protocol.peer(peer) for peer in range(n_peers)]
            self.ledger = IterativeLedger(
                protocol.mixing, exchanges=protocol.gossip_steps, trace=keep_trace
            )
        else:
            self.ledger = protocol.ledger
            self.ledger.keep = keep_trace
        self.run = IterativeRun(transport=self.transport, ledger=self.ledger, models=self.models())
        state = _Online(env, n_peers)
        self.online = state.online
        self.faults = None
        if config.gossip.churn:
            from p2pdp.sim.gossip.faults import Faults

            self.faults = Faults(state, config.gossip, uniform=_no_crash, rng=churn_rng or rng)
        self.n_bytes = model_bytes(protocol.problem.X.shape[1])
        self.epsilon = protocol.privacy.epsilon
        self.round_over: list[simpy.Event] = []  # the reference driver's round, while it runs

    def simulate(self, rng: np.random.Generator, trace: ViewTrace | None) -> IterativeRun:
        """Run every round, then the run's final models, losses and ``trace``."""
        protocol, settings, env, faults = self.protocol, self.settings, self.env, self.faults
        run = self.run
        self.record(0)
        if faults is not None and not protocol.synchronous:
            faults.apply_churn()
        if protocol.synchronous:
            env.process(self.per_peer() if self.machines else self.synchronous())
            env.run()
            if not self.machines:
                run.end_time = float(env.now)
        else:
            phases = rng.uniform(0.0, settings.round_period, size=protocol.problem.n_peers)
            for peer, phase in enumerate(phases.tolist()):
                env.process(self.wake_ups(peer, phase))
            env.process(self.clock())
            env.run(until=settings.rounds * settings.round_period + 1e-9)
            run.end_time = float(env.now)
        run.models = self.models()
        run.messages_lost = self.lost_so_far()
        if trace is not None and protocol.synchronous:
            trace.events.extend(self.ledger.trace(settings.rounds).events)
        return run

    # --- what both drivers share
    def models(self) -> np.ndarray:
        if self.machines:
            return np.stack([machine.model for machine in self.machines])
        return self.protocol.models

    def lost_so_far(self) -> int:
        if self.protocol.synchronous:  # every message sent was averaged, lost or late
            return int(self.transport.messages_sent.sum()) - self.ledger.averaged
        return self.transport.messages_lost

    def record(self, round_: int) -> None:
        """The ``rounds`` table's row of ``round_``."""
        settings, transport, ledger = self.settings, self.transport, self.ledger
        current = self.models()
        if not np.isfinite(current).all():
            raise ConfigError(
                f"protocol.step_size = {settings.step_size!r}: the {self.protocol.name} models "
                f"diverged by round {round_} (values no longer finite); lower the step size"
            )
        if self.on_round is not None:
            self.on_round(round_)
        evaluated = round_ % settings.eval_every == 0 or round_ == settings.rounds
        peer_errors = self.errors(current) if evaluated else None
        self.run.rounds.append(
            {
                "round": round_,
                "time": float(self.env.now),
                "mean_error": float(peer_errors.mean()) if peer_errors is not None else np.nan,
                "worst_error": float(peer_errors.max()) if peer_errors is not None else np.nan,
                "consensus_distance": consensus_distance(current),
                "bytes_sent": int(transport.bytes_sent.sum()),
                "messages_lost": self.lost_so_far(),
                "mean_steps": float(ledger.steps.mean()),
                "epsilon_spent": float(self.epsilon(ledger.steps).max()),
            }
        )

    def clock(self) -> Generator[simpy.Event, Any, None]:
        """The asynchronous protocol's rounds: a row, then the churn, every period."""
        for round_ in range(1, self.settings.rounds + 1):
            yield self.env.timeout(self.settings.round_period)
            self.record(round_)
            if self.faults is not None:
                self.faults.apply_churn()

    # --- the batched driver
    def exchange(
        self, senders: np.ndarray, receivers: np.ndarray, within: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """One message along every edge whose sender is online: which arrive in time, which
        late (read by the receiver, not averaged)."""
        transport, online = self.transport, self.online
        if self.faults is None:
            return transport.exchange(senders, self.n_bytes, within=within)
        sending = online[senders]
        delivered = np.zeros(senders.size, dtype=bool)
        late = np.zeros(senders.size, dtype=bool)
        delivered[sending], late[sending] = transport.exchange(
            senders[sending], self.n_bytes, within=within
        )
        missed = delivered & ~online[receivers]  # the receiver is offline: lost
        transport.lose(senders[missed])
        return delivered & ~missed, late

    def synchronous(self) -> Generator[simpy.Event, Any, None]:
        protocol, faults = self.protocol, self.faults
        exchanges = protocol.gossip_steps
        period = self.settings.round_period / exchanges
        senders, receivers = protocol.mixing.indices, protocol.mixing.receivers
        for round_ in range(1, self.settings.rounds + 1):
            if faults is None:
                protocol.step()
            else:
                faults.apply_churn()
                protocol.step(np.flatnonzero(self.online))
            for _ in range(exchanges):
                delivered, late = self.exchange(senders, receivers, period)
                yield self.env.timeout(period)
                protocol.average(delivered, late)
            self.record(round_)

    def wake_ups(self, peer: int, phase: float) -> Generator[simpy.Event, Any, None]:
        """Peer ``peer``'s wake-ups (asynchronous protocol, either driver)."""
        env, online, protocol = self.env, self.online, self.protocol
        yield env.timeout(phase)
        while True:
            if self.machines:
                if online[peer]:
                    for send in _gossip(self.machines[peer]).on_wake(env.now):
                        assert isinstance(send, Send)  # its only effect
                        self.transport.send(peer, self.deliver_machine, (peer, send), self.n_bytes)
            else:
                target = protocol.wake(peer) if online[peer] else None
                if target is not None:
                    message = (peer, target, protocol.models[peer].copy())
                    self.transport.send(peer, self.deliver, message, self.n_bytes)
            yield env.timeout(self.settings.round_period)

    def deliver(self, message: tuple[int, int, np.ndarray]) -> None:
        sender, target, model = message
        if self.online[target]:
            self.protocol.receive(target, model)
        else:
            self.transport.lose(sender)

    # --- the reference driver
    def dispatch(self, sends: list[tuple[int, Send]]) -> None:
        """Put an instant's messages on the wire, drawing their delays and losses in the
        overlay's edge order (the batched driver's order)."""
        if not sends:
            return
        sends.sort(key=lambda item: self.ledger.edge(item[1].to, item[0]))
        senders = np.array([sender for sender, _ in sends], dtype=np.int64)
        delays, lost = self.transport.transmit(senders, self.n_bytes)
        for (sender, send), delay, dropped in zip(
            sends, delays.tolist(), lost.tolist(), strict=True
        ):
            if not dropped:
                event = self.env.timeout(delay, value=(sender, send))
                event.callbacks.append(self.arrive)

    def arrive(self, event: simpy.Event) -> None:
        sender, send = cast(tuple[int, Send], event.value)
        if not self.online[send.to]:  # the receiver is offline: lost
            self.transport.lose(sender)
            return
        machine = _sync(self.machines[send.to])
        self.ledger.take(
            machine.on_message(self.env.now, sender, send.round, send.exchange, send.model)
        )

    def handle(self, effects: list[tuple[int, list[Any]]]) -> bool:
        """Record the machines' effects, send their messages, set their timers; whether a
        round ended."""
        sends: list[tuple[int, Send]] = []
        timers: dict[float, list[int]] = {}
        ended = False
        for peer, produced in effects:
            self.ledger.take(produced)
            for effect in produced:
                if isinstance(effect, Send):
                    sends.append((peer, effect))
                elif isinstance(effect, Deadline):
                    timers.setdefault(effect.at, []).append(peer)
                elif isinstance(effect, RoundEnd):
                    ended = True
        self.dispatch(sends)
        for at, peers in timers.items():  # after the messages: one arriving at a deadline
            event = self.env.timeout(at - self.env.now, value=peers)  # is on time, as batched
            event.callbacks.append(self.deadline)
        return ended

    def deadline(self, event: simpy.Event) -> None:
        peers = cast(list[int], event.value)
        now = self.env.now
        ended = self.handle([(peer, _sync(self.machines[peer]).on_deadline(now)) for peer in peers])
        if ended:
            self.round_over[0].succeed()

    def per_peer(self) -> Generator[simpy.Event, Any, None]:
        env, protocol = self.env, self.protocol
        period = self.settings.round_period / protocol.gossip_steps
        for round_ in range(1, self.settings.rounds + 1):
            if self.faults is not None:
                self.faults.apply_churn()
            peers = np.flatnonzero(self.online).tolist()
            self.round_over[:] = [env.event()]
            machines, now = self.machines, env.now
            self.handle([(peer, _sync(machines[peer]).on_round(now, round_)) for peer in peers])
            if peers:
                yield self.round_over[0]
            else:  # nobody online: the round's exchanges pass all the same
                for _ in range(protocol.gossip_steps):
                    yield env.timeout(period)
            self.record(round_)
        self.run.end_time = float(env.now)  # late messages still in flight are read after this

    def deliver_machine(self, message: tuple[int, Send]) -> None:
        sender, send = message
        if self.online[send.to]:
            machine = _gossip(self.machines[send.to])
            self.ledger.take(
                machine.on_message(self.env.now, sender, send.round, send.exchange, send.model)
            )
        else:
            self.transport.lose(sender)


def _sync(machine: IterativePeer) -> SynchronousPeer:
    assert isinstance(machine, SynchronousPeer)
    return machine


def _gossip(machine: IterativePeer) -> GossipPeer:
    assert isinstance(machine, GossipPeer)
    return machine
